"""Pack one shard: stream its documents in order, write the complete chunks it owns to one
file, and hand back the fragments at its edges for the driver to stitch. No Ray here.

A shard owns every chunk that lies entirely inside its slice ``[token_offset,
token_offset + num_tokens)`` of the global stream. The tokens before its first chunk boundary
(its *head*) and after its last one (its *tail*) belong to chunks it shares with neighbours;
they are returned as :class:`~raypack.core.Fragment` s, each shorter than one chunk.
"""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from raypack.core import Chunks, Fragment, StreamPacker
from raypack.errors import InputError
from raypack.output import ChunkFileWriter, WrittenFile, chunk_schema
from raypack.readers import iter_token_batches


@dataclass(frozen=True)
class ShardTask:
    """What a packer needs to pack one shard; decided by the driver before any packing."""

    shard_index: int
    path: str
    format: str
    doc_offset: int
    token_offset: int
    num_docs: int
    num_tokens: int


@dataclass(frozen=True)
class PackSettings:
    """The run-wide settings every packer shares."""

    out_dir: str
    context_length: int
    pad_token: int
    token_dtype: str
    token_column: str
    read_batch_size: int
    chunks_per_record_batch: int


@dataclass(frozen=True)
class ShardResult:
    shard_index: int
    file: WrittenFile | None
    head: Fragment | None
    tail: Fragment | None
    num_docs: int
    num_nonempty_docs: int
    num_tokens: int
    num_split_docs: int
    """Documents that cross at least one chunk boundary."""
    peak_rss_bytes: int = 0
    """The packing process's peak resident memory after this shard (for benchmarks)."""


def first_owned_chunk(token_offset: int, context_length: int) -> int:
    return -(-token_offset // context_length)


def pack_shard(task: ShardTask, settings: PackSettings) -> ShardResult:
    """Pack ``task``'s shard; its file is published by rename only when complete."""
    c = settings.context_length
    dtype = np.dtype(settings.token_dtype)
    packer = StreamPacker(c, settings.pad_token, start_position=task.token_offset, dtype=dtype)
    schema = chunk_schema(c, pa.from_numpy_dtype(dtype), settings.pad_token)
    writer = ChunkFileWriter(settings.out_dir, first_owned_chunk(task.token_offset, c), schema,
                             settings.chunks_per_record_batch)
    try:
        counts = _stream_shard(task, settings, packer, writer)
        packer.finish(pad=False)
        _check_counts(task, counts)
        written = writer.close() if writer.num_chunks else None
        if written is None:
            writer.abort()
    except BaseException:
        writer.abort()
        raise
    return ShardResult(task.shard_index, written, packer.head, packer.tail, counts["docs"],
                       counts["nonempty"], counts["tokens"], counts["split"], peak_rss_bytes())


def _stream_shard(task: ShardTask, settings: PackSettings, packer: StreamPacker, writer: ChunkFileWriter) -> dict[str, int]:
    counts = {"docs": 0, "nonempty": 0, "tokens": 0, "split": 0}
    batches = iter_token_batches(task.path, task.format, settings.token_column, settings.read_batch_size)
    for first_row, docs in batches:
        lengths = np.diff(docs.offsets.to_numpy())
        counts["docs"] += len(docs)
        counts["nonempty"] += int(np.count_nonzero(lengths))
        counts["tokens"] += int(lengths.sum())
        counts["split"] += count_split_documents(lengths, packer.position, settings.context_length)
        _check_not_past_plan(task, counts)
        try:
            chunks = packer.push(docs, task.doc_offset + first_row)
        except ValueError as e:  # a token that does not fit the output dtype
            raise InputError(f"shard {task.path} rows {first_row}..{first_row + len(docs) - 1}: {e}") from e
        if chunks.num_chunks:
            writer.write(chunks)
    return counts


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def count_split_documents(lengths: np.ndarray, start: int, context_length: int) -> int:
    """Documents (laid end to end from global position ``start``) that cross a chunk boundary."""
    ends = start + np.cumsum(lengths)
    firsts = ends - lengths
    nonempty = lengths > 0
    return int(np.count_nonzero(nonempty & (firsts // context_length != (ends - 1) // context_length)))


def _check_not_past_plan(task: ShardTask, counts: dict[str, int]) -> None:
    if counts["docs"] > task.num_docs or counts["tokens"] > task.num_tokens:
        _raise_changed(task, counts)


def _check_counts(task: ShardTask, counts: dict[str, int]) -> None:
    if counts["docs"] != task.num_docs or counts["tokens"] != task.num_tokens:
        _raise_changed(task, counts)


def _raise_changed(task: ShardTask, counts: dict[str, int]) -> None:
    raise InputError(
        f"shard {task.path}: planned {task.num_docs} documents / {task.num_tokens} tokens but read "
        f"{counts['docs']} / {counts['tokens']} so far; the file changed during the run or its "
        f"metadata is wrong (rewrite it, or report the writer)"
    )


# ----------------------------------------------------------------------------- transport
# A result travels from a packer actor to the driver as one Arrow row.

_FRAGMENT_FIELDS = ("start", "input_ids", "segment_doc_ids", "segment_lengths")


def result_to_table(result: ShardResult, token_type: pa.DataType) -> pa.Table:
    row: dict[str, Any] = {
        "shard_index": [result.shard_index],
        "num_docs": [result.num_docs],
        "num_nonempty_docs": [result.num_nonempty_docs],
        "num_tokens": [result.num_tokens],
        "num_split_docs": [result.num_split_docs],
        "peak_rss_bytes": [result.peak_rss_bytes],
        "file": [asdict_file(result.file)],
    }
    for name, frag in (("head", result.head), ("tail", result.tail)):
        row[f"{name}_start"] = pa.array([None if frag is None else frag.start], pa.int64())
        for field, typ in (("input_ids", token_type), ("segment_doc_ids", pa.int64()), ("segment_lengths", pa.int32())):
            values = None if frag is None else pa.array(getattr(frag, field), typ)
            row[f"{name}_{field}"] = pa.array([values], pa.list_(typ)) if values is not None else pa.array([None], pa.list_(typ))
    return pa.table(row)


def asdict_file(file: WrittenFile | None) -> dict[str, Any] | None:
    return None if file is None else file._asdict()


def table_to_results(table: pa.Table) -> Iterator[ShardResult]:
    for row in range(table.num_rows):
        get = lambda name: table.column(name)[row]  # noqa: E731
        frags = {}
        for name in ("head", "tail"):
            start = get(f"{name}_start").as_py()
            frags[name] = None if start is None else Fragment(
                start,
                *(_list_scalar_to_numpy(get(f"{name}_{field}")) for field in _FRAGMENT_FIELDS[1:]),
            )
        file = get("file").as_py()
        yield ShardResult(
            shard_index=get("shard_index").as_py(),
            file=None if file is None else WrittenFile(**file),
            head=frags["head"],
            tail=frags["tail"],
            num_docs=get("num_docs").as_py(),
            num_nonempty_docs=get("num_nonempty_docs").as_py(),
            num_tokens=get("num_tokens").as_py(),
            num_split_docs=get("num_split_docs").as_py(),
            peak_rss_bytes=get("peak_rss_bytes").as_py(),
        )


def _list_scalar_to_numpy(scalar: pa.ListScalar) -> np.ndarray:
    return scalar.values.to_numpy(zero_copy_only=False)


def task_to_dict(task: ShardTask) -> dict[str, Any]:
    return asdict(task)
