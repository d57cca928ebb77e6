"""Durable per-shard results, so an interrupted run can be finished instead of restarted.

After a packer publishes a shard's chunk file it records the shard's result (counts, the
file's sha256, the edge fragments) in ``_results/shard-NNNNNN.arrow`` in the directory it
writes to (the staging directory; on an object store the output prefix itself), stamped with
a fingerprint of the task, the settings and the input file (size and modification time).
``--resume`` reuses a record only when the fingerprint still matches and the chunk file still
hashes to the recorded sha256; every other shard is packed again.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import asdict, replace

import pyarrow as pa

from raypack.output import write_whole
from raypack.tasks import PackSettings, ShardResult, ShardTask, result_to_table, table_to_results
from raypack.shards import resolve_filesystem

RESULTS_DIR = "_results"
_FINGERPRINT_KEY = b"raypack.fingerprint"


def record_name(shard_index: int) -> str:
    """The record's path relative to the directory the run writes to."""
    return f"{RESULTS_DIR}/shard-{shard_index:06d}.arrow"


def fingerprint(task: ShardTask, settings: PackSettings) -> str:
    """What a shard's output depends on: the task, the settings, the input file's identity."""
    fs, fs_path = resolve_filesystem(task.path)
    info = fs.get_file_info(fs_path)
    run = {k: v for k, v in asdict(settings).items() if k != "out_dir"}
    return json.dumps({"task": asdict(task), "settings": run, "input_size": info.size,
                       "input_mtime_ns": info.mtime_ns}, sort_keys=True)


def save_result(task: ShardTask, settings: PackSettings, result: ShardResult, token_type: pa.DataType) -> None:
    """Record ``result`` durably (written whole or not at all)."""
    table = result_to_table(result, token_type)
    table = table.replace_schema_metadata({_FINGERPRINT_KEY: fingerprint(task, settings).encode()})
    buffer = pa.BufferOutputStream()
    with pa.ipc.new_file(buffer, table.schema) as writer:
        writer.write_table(table)
    write_whole(settings.out_dir, record_name(task.shard_index), buffer.getvalue(), make_dirs=True)


def load_verified_result(task: ShardTask, settings: PackSettings) -> ShardResult | None:
    """The recorded result of ``task`` if it is still valid and its file intact, else None."""
    fs, base = resolve_filesystem(settings.out_dir)
    try:
        with fs.open_input_file(posixpath.join(base, record_name(task.shard_index))) as source:
            table = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid):
        return None
    recorded = (table.schema.metadata or {}).get(_FINGERPRINT_KEY, b"").decode()
    if recorded != fingerprint(task, settings):
        return None
    (result,) = table_to_results(table)
    if result.file is not None and not _file_intact(fs, posixpath.join(base, result.file.path), result.file.sha256):
        return None
    return replace(result, started_at=0.0, finished_at=0.0)  # not packed by this run


def _file_intact(fs, path: str, sha256: str) -> bool:
    digest = hashlib.sha256()
    try:
        with fs.open_input_stream(path) as f:
            while block := f.read(1 << 22):
                digest.update(block)
    except OSError:
        return False
    return digest.hexdigest() == sha256
