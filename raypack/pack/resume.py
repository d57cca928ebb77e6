"""Durable per-task results, so an interrupted run can be finished instead of restarted.

After a packer publishes a task's chunk file (a task is a shard, or a range of a shard's row
groups or record batches: raypack.pack.plan) it records the task's result in
``_results/task-NNNNNN.json`` in the directory it writes to (the staging directory; on an
object store the output prefix itself). A record is one JSON object: a format version, the
task, the settings that decide the output, the input file's identity (taken *before* the
shard is packed), the counts, the chunk file's name and sha256 and the edge fragments (each
shorter than ``context_length`` tokens), plus ``record_sha256``, the sha256 of the canonical
JSON (sorted keys, no spaces) of everything else in the record.

``--resume`` reuses a record only when, in this order: it parses, its ``record_sha256``
matches and its version is this one; its task and settings equal this run's; the input file
still has the recorded identity; the chunk file still hashes to the recorded sha256. Anything
else packs the shard again, with one INFO line saying why (a missing record says nothing).

What identifies an input file, and what it costs per shard, when the run plans (the plan's
:func:`file_mark` of each file; every task checks its file still has it when it starts and when its
reads end: :func:`check_same_file`), when a packer records it and when ``--resume`` checks it:

- always: its size and the sha256 of its first and last MiB (the whole file when it is at most
  2 MiB) and, for Parquet, of its whole footer (the ``n`` bytes before the trailing
  ``<n:uint32 LE>PAR1``, however large). Cost: at most 2 MiB read (two ranged reads) plus the
  part of a Parquet footer that lies before the last MiB. Known limit: a change that keeps the
  size and touches only bytes outside those ranges (the middle of a JSONL or Arrow shard, a
  Parquet data page) is not seen. The modification time decides nothing, but a kept task whose
  input was modified after its record was written is named in one WARNING (a same-size edit in the
  middle of a file is the case the sampled identity misses).
- with ``verify_inputs`` (``--verify-inputs``): also the sha256 of all of its bytes. Cost: the
  whole file read once more by the packer and once more by ``--resume`` for each record it
  checks (4 MiB reads). A record written without it is not reused under ``--verify-inputs``.

A checksum guards against damage (a torn write, a flipped bit, a stale copy), not against
someone who rewrites a record on purpose and recomputes its checksum.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import posixpath
import shutil
import stat
from dataclasses import asdict, replace
from typing import Any, Callable, Iterable

import numpy as np
import pyarrow.fs as pafs

from raypack.errors import InputChanged
from raypack.inputs.registry import format_named
from raypack.io.fs import open_input_file, resolve_filesystem
from raypack.pack.tasks import PackSettings, ShardResult, ShardTask, asdict_file
from raypack.packed.writer import CHUNK_FILE_RE, WrittenFile, write_whole
from raypack.rules.content_digest import CONTENT_GROUP_CHUNKS, is_range_digests, range_layout
from raypack.rules.core import Fragment
from raypack.rules.side_columns import combine, opaque, split_fields

log = logging.getLogger(__name__)

RESULTS_DIR = "_results"
RECORD_VERSION = 4
"""1: the Arrow records (``shard-NNNNNN.arrow``) of earlier versions; 2: ``shard-NNNNNN.json``,
one per shard; 3: either per-shard records with the chunk file's range digests
(raypack.rules.content_digest) or per-task records without them. None is reused (the sweep removes them)."""
EDGE_BYTES = 1 << 20
"""Bytes hashed at each end of an input file for its identity."""
READ_BYTES = 1 << 22
"""Bytes per read when hashing a whole file."""
_NOT_OUTPUT_SETTINGS = ("out_dir", "verify_inputs", "progress_timeout_s", "restart_stalled")
"""Settings a record does not hold. ``max_document_tokens`` decides no byte but is held: a task kept from a
run with a higher limit held a document this run refuses (an operator's trial, for text's max_document_bytes)."""


class _Rejected(Exception):
    """A record that exists but must not be reused; the message says why."""


def record_name(task_index: int) -> str:
    """The record's path relative to the directory the run writes to (one per task: a shard, or a
    range of one; the task in the record says which)."""
    return f"{RESULTS_DIR}/task-{task_index:06d}.json"


def identify_input(task: ShardTask, settings: PackSettings) -> dict[str, Any]:
    """``{"size", "edges_sha256"}`` of ``task.path`` and, with ``verify_inputs``, ``"sha256"``.

    Cost: see the module docstring (at most 2 MiB plus a Parquet footer; the whole file when
    ``settings.verify_inputs``).
    """
    identity = sampled_identity(task.path, task.format)
    if settings.verify_inputs:
        identity["sha256"] = file_sha256(task.path)
    return identity


def sampled_identity(path: str, fmt: str) -> dict[str, Any]:
    """Size and sha256 of first MiB + last MiB (+ the format's trailing metadata before the last MiB:
    a Parquet footer; raypack.inputs.base.InputFormat.metadata_start)."""
    fs, fs_path = resolve_filesystem(path)
    digest = hashlib.sha256()
    with open_input_file(fs, fs_path, path) as f:  # gone or unreadable: one line naming it
        size = f.size()
        head_end = min(size, EDGE_BYTES)
        tail_start = max(size - EDGE_BYTES, head_end)
        digest.update(_read_range(f, 0, head_end))
        tail = _read_range(f, tail_start, size)
        digest.update(tail)
        metadata_start = format_named(fmt).metadata_start(size, tail)
        for start in range(max(metadata_start, head_end), tail_start, READ_BYTES):
            digest.update(_read_range(f, start, min(start + READ_BYTES, tail_start)))
    return {"size": size, "edges_sha256": digest.hexdigest()}


def task_record(task: ShardTask) -> dict[str, Any]:
    """``task`` as its record holds it: without ``planned``, which the input's identity in the record
    covers (a record is then made for the same task whatever run planned it)."""
    fields = asdict(task)
    del fields["planned"]
    return fields


def file_mark(identity: dict) -> str:
    """A file's sampled identity (:func:`sampled_identity`) as one string: size and edges."""
    return f"{identity['size']}:{identity['edges_sha256']}"


def check_same_file(what: str, path: str, planned: str, identity: dict) -> None:
    """InputChanged when ``path`` (``identity``: now) is not the file the run planned its tasks on
    (``planned``: its :func:`file_mark` then; "": not checked), so that no output mixes two versions of
    one file. ``what``: the file's kind in the line ("shard", "text file")."""
    if planned and planned != file_mark(identity):
        size = int(planned.split(":", 1)[0])
        change = (f"{size:,} bytes when the run listed its inputs, {identity['size']:,} now" if size != identity["size"]
                  else "its first or last MiB differ from when the run listed its inputs")
        raise InputChanged(f"{what} {path} changed during the run ({change}), so its tasks would mix two versions "
                           "of it; run again on a copy that does not change while it is read")


def _read_range(f, start: int, end: int) -> bytes:
    f.seek(start)
    data = f.read(end - start)
    if len(data) != end - start:
        raise OSError(f"short read: {len(data)} of {end - start} bytes at offset {start}")
    return data


def file_sha256(path: str) -> str:
    """sha256 of every byte of ``path`` (no decompression); reads the whole file in 4 MiB blocks."""
    fs, fs_path = resolve_filesystem(path)
    digest = hashlib.sha256()
    with open_input_file(fs, fs_path, path) as f:
        while block := f.read(READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


def save_result(task: ShardTask, settings: PackSettings, result: ShardResult, identity: dict[str, Any]) -> None:
    """Record ``result`` durably (written whole or not at all). ``identity``: from
    :func:`identify_input`, taken before the shard was read for packing."""
    body = {"version": RECORD_VERSION, "task": task_record(task), "settings": _output_settings(settings),
            "input": identity, "result": _result_to_dict(result, settings)}
    record = {**body, "record_sha256": hashlib.sha256(_canonical(body)).hexdigest()}
    write_whole(settings.out_dir, record_name(task.task_index), _canonical(record), make_dirs=True)


def load_verified_result(task: ShardTask, settings: PackSettings) -> ShardResult | None:
    """The recorded result of ``task`` if every check in the module docstring passes, else None.

    Cost: reads the record, the input's identity (whole input with ``verify_inputs``) and the
    whole chunk file.
    """
    fs, base = resolve_filesystem(settings.out_dir)
    record_path = posixpath.join(base, record_name(task.task_index))
    try:
        data = _read_record(fs, record_path)
        result = None if data is None else _check_record(data, task, settings, fs, base)
    except _Rejected as e:
        log.info("resume: %s is packed again: its record %s %s", task.describe(), record_name(task.task_index), e)
        return None
    if result is not None and not settings.verify_inputs:
        _say_if_modified_since(task.path, fs, record_path)
    return None if result is None else replace(result, started_at=0.0, finished_at=0.0)  # not packed by this run


_SAID_MODIFIED: set[tuple[str, str]] = set()
"""(record directory, input) pairs :func:`_say_if_modified_since` has named: a file of many tasks, once."""


def _say_if_modified_since(path: str, record_fs, record_path: str) -> None:
    """One WARNING where the input ``path`` of a kept task was modified after the task's record was written:
    its size and edges are the same (else the task would not be kept), but an edit in its middle that keeps
    the size would not show there (an operator's trial: a same-size edit between a crash and ``--resume``
    ended in the output as the old text). Cost: two stats. Says nothing where either time cannot be read."""
    key = (posixpath.dirname(record_path), path)
    if key in _SAID_MODIFIED:
        return
    try:
        fs, fs_path = resolve_filesystem(path)
        modified = fs.get_file_info(fs_path).mtime_ns
        recorded = record_fs.get_file_info(record_path).mtime_ns
    except (OSError, ValueError):
        return
    if modified is None or recorded is None or modified <= recorded:
        return
    _SAID_MODIFIED.add(key)
    log.warning("resume: %s was modified after its finished task was recorded; its size and first and last MiB "
                "are the same, so the task is kept. If its content changed, start over with --overwrite (or pass "
                "--verify-inputs to the run and its --resume, which compares every byte)", path)


def recorded_task(task_index: int, settings: PackSettings, also: Callable[[Any], str | None] | None = None
                  ) -> tuple[ShardTask, dict[str, Any]] | str | None:
    """The task and input identity recorded for task ``task_index``, when its record parses, checks
    and was made with these settings: what a run that learns a task's counts only by reading it
    (``pack --tokenizer``) compares before :func:`load_verified_result` checks the rest. None when
    there is no usable record; why, when it was made with other settings (naming what changed)."""
    fs, base = resolve_filesystem(settings.out_dir)
    try:
        data = _read_record(fs, posixpath.join(base, record_name(task_index)))
        body = None if data is None else _parse_record(data)
        if body is None:
            return None
        recorded, now = body.get("settings"), _output_settings(settings)
        if recorded != now:
            if not isinstance(recorded, dict):
                return "its record holds no packing settings"
            changed = [f"{k} {recorded.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(recorded) | set(now))
                       if recorded.get(k) != now.get(k)]
            more = also(body.get("input")) if also is not None else None  # a trial: only one change was named
            return f"its record was made with other packing settings ({', '.join(changed)})" + (
                f"; and {more}" if more else "")
        return ShardTask(**body["task"]), dict(body["input"])
    except (_Rejected, KeyError, TypeError, ValueError) as e:
        log.info("resume: task %d is packed again: its record %s %s", task_index, record_name(task_index), e)
        return None


def say_inputs_gone(out_dir: str, paths: Iterable[str]) -> None:
    """One INFO line where the records of the runs before name input files that are not among ``paths``
    (today's): a file deleted or moved between a crash and its ``--resume`` was left out without a word
    (a new user's trial). The output is what a run on today's inputs makes. Reads every record's task."""
    fs, base = resolve_filesystem(out_dir)
    selector = pafs.FileSelector(posixpath.join(base, RESULTS_DIR), allow_not_found=True)
    recorded: set[str] = set()
    for info in fs.get_file_info(selector):
        try:
            data = _read_record(fs, info.path)
            path = None if data is None else _parse_record(data)["task"]["path"]
        except (_Rejected, KeyError, TypeError, ValueError):
            continue
        if isinstance(path, str):
            recorded.add(path)
    gone = sorted(recorded - set(paths))
    if gone:
        log.info("resume: the run before read %d input file%s that %s not among today's inputs (%s%s); the output "
                 "holds today's inputs only", len(gone), "" if len(gone) == 1 else "s", "is" if len(gone) == 1 else
                 "are", gone[0], ", ..." if len(gone) > 1 else "")


def _read_record(fs, path: str) -> bytes | None:
    """The record's bytes; None when there is none (the shard never finished)."""
    if not _is_plain_file(fs, path):
        if not _exists(fs, path):
            return None
        remove_damaged_record(fs, path)  # the task's new record takes its name (a directory there: IsADirectoryError)
        raise _Rejected("is not a plain file (a FIFO, a link, a directory?)")
    try:
        with fs.open_input_stream(path, compression=None) as source:
            return source.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Rejected(f"cannot be read ({e})") from e


def _check_record(data: bytes, task: ShardTask, settings: PackSettings, fs, base: str) -> ShardResult:
    body = _parse_record(data)
    try:
        same_run = body["task"] == task_record(task) and body["settings"] == _output_settings(settings)
        recorded_input = dict(body["input"])
        result = _result_from_dict(body["result"], settings)
    except (KeyError, TypeError, ValueError, OverflowError) as e:
        raise _Rejected(f"is malformed ({e!r})") from e
    if not same_run:
        raise _Rejected("was made for another task or other settings")
    _check_input(recorded_input, task, settings)
    if result.file is not None and not CHUNK_FILE_RE.match(result.file.path):
        raise _Rejected(f"names {result.file.path!r}, which is not a chunk file name")
    if result.file is not None and not _digests_fit(result.file):
        raise _Rejected(f"holds range digests that do not fit chunks {result.file.first_chunk}.."
                        f"{result.file.first_chunk + result.file.num_chunks - 1}")
    if result.file is not None and not _file_intact(fs, posixpath.join(base, result.file.path), result.file.sha256):
        remove_damaged_record(fs, posixpath.join(base, result.file.path))  # a folder there: the new file's name
        raise _Rejected(f"names chunk file {result.file.path}, which is missing or no longer hashes to its sha256")
    return result


def remove_damaged_record(fs, path: str) -> None:
    """Remove what lies at a record's (or a chunk file's) ``path`` in a local staging directory when it is
    not a plain file (a
    directory, a FIFO, a link: damage, as raypack writes plain files there, and a new record could not take
    its name); nothing on an object store, where a new record replaces it."""
    if not isinstance(fs, pafs.LocalFileSystem) or not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.islink(path) or not os.path.isfile(path):
        with contextlib.suppress(OSError):
            os.remove(path)


def _parse_record(data: bytes) -> dict[str, Any]:
    """The record's body, once its checksum and version check."""
    try:
        record = json.loads(data)
        claimed = record.pop("record_sha256")
        actual = hashlib.sha256(_canonical(record)).hexdigest()
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:  # UnicodeDecodeError: a ValueError
        raise _Rejected(f"does not parse ({type(e).__name__})") from e
    if claimed != actual:
        raise _Rejected(f"fails its checksum (record_sha256 {str(claimed)[:16]}..., content {actual[:16]}...)")
    if record.get("version") != RECORD_VERSION:
        raise _Rejected(f"has version {record.get('version')!r}, not {RECORD_VERSION}")
    return record


def _check_input(recorded: dict[str, Any], task: ShardTask, settings: PackSettings) -> None:
    """Cheap identity first; the full sha256 only when asked for and the cheap one agrees."""
    sampled = sampled_identity(task.path, task.format)
    if {k: recorded.get(k) for k in sampled} != sampled:
        raise _Rejected(f"was made from another {task.path}: size or first/last MiB (or Parquet footer) differ")
    if not settings.verify_inputs:
        return
    if "sha256" not in recorded:
        raise _Rejected("holds no full input sha256 (recorded without --verify-inputs)")
    if recorded["sha256"] != file_sha256(task.path):
        raise _Rejected(f"was made from another {task.path}: its full sha256 differs (--verify-inputs)")


def _output_settings(settings: PackSettings) -> dict[str, Any]:
    """The settings that decide the output, as JSON values (side columns only when there are any,
    so tokens-only records keep their form); another ``extra_columns`` is another job."""
    out = {k: v for k, v in asdict(settings).items() if k not in _NOT_OUTPUT_SETTINGS}
    columns = out.pop("extra_columns")
    if columns:
        out["extra_columns"] = [list(c) for c in columns]
    return out


def _canonical(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _result_to_dict(result: ShardResult, settings: PackSettings) -> dict[str, Any]:
    return {"shard_index": result.shard_index, "task_index": result.task_index, "file": asdict_file(result.file),
            "head": _fragment_to_dict(result.head, settings), "tail": _fragment_to_dict(result.tail, settings),
            "num_docs": result.num_docs, "num_nonempty_docs": result.num_nonempty_docs,
            "num_tokens": result.num_tokens, "num_split_docs": result.num_split_docs,
            "peak_rss_bytes": result.peak_rss_bytes}


def _result_from_dict(d: dict[str, Any], settings: PackSettings) -> ShardResult:
    file = d["file"]
    return ShardResult(int(d["shard_index"]), None if file is None else WrittenFile(**file),
                       _fragment_from_dict(d["head"], settings), _fragment_from_dict(d["tail"], settings),
                       int(d["num_docs"]), int(d["num_nonempty_docs"]), int(d["num_tokens"]),
                       int(d["num_split_docs"]), int(d["peak_rss_bytes"]), task_index=int(d["task_index"]))


def _fragment_to_dict(frag: Fragment | None, settings: PackSettings) -> dict[str, Any] | None:
    """A fragment as JSON; with side columns their values go under ``"sides"`` by name."""
    if frag is None:
        return None
    tokens, sides = split_fields(frag.input_ids, settings.record_dtype)
    out = {"start": int(frag.start), "input_ids": tokens.tolist(),
           "segment_doc_ids": frag.segment_doc_ids.tolist(), "segment_lengths": frag.segment_lengths.tolist()}
    if sides:
        out["sides"] = {name: values.tolist() for name, values in zip(settings.record_dtype.names[1:], sides)}
    return out


def _fragment_from_dict(d: dict[str, Any] | None, settings: PackSettings) -> Fragment | None:
    if d is None:
        return None
    record = settings.record_dtype
    tokens = np.asarray(d["input_ids"], dtype=settings.token_dtype)
    if settings.extra_columns:
        sides = [np.asarray(d["sides"][name], dtype=record[name]) for name in record.names[1:]]
        tokens = opaque(combine(tokens, sides, record))
    return Fragment(int(d["start"]), tokens, np.asarray(d["segment_doc_ids"], dtype=np.int64),
                    np.asarray(d["segment_lengths"], dtype=np.int32))


def _digests_fit(file: WrittenFile) -> bool:
    """Whether the file's range digests have the shape its chunk range asks for (their values are
    vouched for by the record's checksum, like the rest of it)."""
    first, count = file.first_chunk, file.num_chunks
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (first, count)):
        return False
    return is_range_digests(file.digests, range_layout(first, first + count, CONTENT_GROUP_CHUNKS))


def _file_intact(fs, path: str, sha256: str) -> bool:
    if not _is_plain_file(fs, path):  # a FIFO would block the read
        return False
    digest = hashlib.sha256()
    try:
        with fs.open_input_stream(path, compression=None) as f:
            while block := f.read(READ_BYTES):
                digest.update(block)
    except OSError:
        return False
    return digest.hexdigest() == sha256


def _is_plain_file(fs, path: str) -> bool:
    """Whether ``path`` is a regular file, links not followed (local); a file (object store). No open."""
    if isinstance(fs, pafs.LocalFileSystem):
        try:
            return stat.S_ISREG(os.lstat(path).st_mode)
        except OSError:
            return False
    return fs.get_file_info(path).type == pafs.FileType.File


def _exists(fs, path: str) -> bool:
    if isinstance(fs, pafs.LocalFileSystem):
        return os.path.lexists(path)
    return fs.get_file_info(path).type != pafs.FileType.NotFound
