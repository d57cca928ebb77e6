"""Pack one shard: stream its documents in order, write the complete chunks it owns to one
file, and hand back the fragments at its edges for the driver to stitch. No Ray here.

A shard owns every chunk that lies entirely inside its slice ``[token_offset,
token_offset + num_tokens)`` of the global stream. The tokens before its first chunk boundary
(its *head*) and after its last one (its *tail*) belong to chunks it shares with neighbours;
they are returned as :class:`~raypack.core.Fragment` s, each shorter than one chunk.
"""

from __future__ import annotations

import resource
import time

import numpy as np
import pyarrow as pa

from raypack.core import StreamPacker, flatten_documents
from raypack.errors import InputError
from raypack.output import ChunkFileWriter, chunk_schema
from raypack.readers import check_tokens_fit, iter_token_batches
from raypack.resume import save_result
from raypack.tasks import PackSettings, ShardResult, ShardTask


def first_owned_chunk(token_offset: int, context_length: int) -> int:
    return -(-token_offset // context_length)


def pack_shard(task: ShardTask, settings: PackSettings) -> ShardResult:
    """Pack ``task``'s shard; its file appears (rename, or one upload) only when complete."""
    started_at = time.time()
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
    result = ShardResult(task.shard_index, written, packer.head, packer.tail, counts["docs"],
                         counts["nonempty"], counts["tokens"], counts["split"], peak_rss_bytes(),
                         started_at, time.time())
    save_result(task, settings, result, schema.field("input_ids").type.value_type)
    return result


def _stream_shard(task: ShardTask, settings: PackSettings, packer: StreamPacker, writer: ChunkFileWriter) -> dict[str, int]:
    counts = {"docs": 0, "nonempty": 0, "tokens": 0, "split": 0}
    batches = iter_token_batches(task.path, task.format, settings.token_column, read_batch_rows(task, settings))
    for first_row, docs in batches:
        lengths = np.diff(docs.offsets.to_numpy())
        counts["docs"] += len(docs)
        counts["nonempty"] += int(np.count_nonzero(lengths))
        counts["tokens"] += int(lengths.sum())
        counts["split"] += count_split_documents(lengths, packer.position, settings.context_length)
        _check_not_past_plan(task, counts)
        try:
            parts = packer.push_parts(docs, task.doc_offset + first_row)
        except ValueError as e:  # a token that does not fit the output dtype: name its row
            tokens, lengths = flatten_documents(docs)
            check_tokens_fit(tokens, lengths, settings.token_dtype, path=task.path, first_row=first_row)
            raise InputError(f"shard {task.path} rows {first_row}..{first_row + len(docs) - 1}: {e}") from e
        for chunks in parts:
            if chunks.num_chunks:
                writer.write(chunks)
    return counts


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def read_batch_rows(task: ShardTask, settings: PackSettings) -> int:
    """Documents per read batch: the configured number, or enough for ~read_batch_tokens tokens."""
    if settings.read_batch_size:
        return settings.read_batch_size
    mean_len = task.num_tokens / task.num_docs if task.num_docs else 1.0
    return int(min(1 << 20, max(1, settings.read_batch_tokens / max(mean_len, 1.0))))


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


