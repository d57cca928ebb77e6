"""Pack one shard: stream its documents in order, write the complete chunks it owns to one
file, and hand back the fragments at its edges for the driver to stitch. No Ray here.

``concat``: a shard owns every chunk that lies entirely inside its slice ``[token_offset,
token_offset + num_tokens)`` of the global stream. The tokens before its first chunk boundary
(its *head*) and after its last one (its *tail*) belong to chunks it shares with neighbours;
they are returned as :class:`~raypack.core.Fragment` s, each shorter than one chunk.

``best_fit``: windows never span shards, so a shard owns all of its chunks and has no edge
fragments; how many it has is known only after best-fit packing its windows, so the driver
first runs :func:`count_shard_chunks` on every shard (document lengths only) and hands each
shard its first chunk index.
"""

from __future__ import annotations

import resource
import time

import numpy as np
import pyarrow as pa

from raypack.best_fit import BestFitChunkCounter, BestFitPacker
from raypack.core import Chunks, StreamPacker, flatten_documents, iter_run_slices, split_document_mask
from raypack.errors import InputError
from raypack.formats import check_tokens_fit, iter_token_batches
from raypack.output import ChunkFileWriter, chunk_schema
from raypack.resume import identify_input, save_result
from raypack.tasks import PackSettings, ShardResult, ShardTask
from raypack.watchdog import ProgressWatchdog


def first_owned_chunk(token_offset: int, context_length: int) -> int:
    return -(-token_offset // context_length)


def pack_shard(task: ShardTask, settings: PackSettings) -> ShardResult:
    """Pack ``task``'s shard; its file appears (rename, or one upload) only when complete.

    The input's identity for the resume record is taken first, so a file that changes while it
    is packed is not recorded as the new version (cost: see raypack/resume.py).
    """
    started_at = time.time()
    reset_peak_rss()
    identity = identify_input(task, settings)
    dtype = np.dtype(settings.token_dtype)
    packer = make_shard_packer(task, settings)
    schema = chunk_schema(settings.context_length, pa.from_numpy_dtype(dtype), settings.pad_token)
    writer = ChunkFileWriter(settings.out_dir, packer.first_chunk, schema, settings.chunks_per_record_batch)
    watchdog = ProgressWatchdog(f"shard {task.path} (shard {task.shard_index})", settings.progress_timeout_s,
                                restart=settings.restart_stalled)
    try:
        with watchdog:
            counts = _stream_shard(task, settings, packer, writer, watchdog.beat)
        last = packer.finish()
        if last.num_chunks:
            writer.write(last)
        _check_counts(task, counts)
        packer.check_num_chunks(task, writer.num_chunks)
        written = writer.close() if writer.num_chunks else None
        if written is None:
            writer.abort()
    except BaseException:
        writer.abort()
        raise
    result = ShardResult(task.shard_index, written, packer.head, packer.tail, counts["docs"],
                         counts["nonempty"], counts["tokens"], counts["split"], peak_rss_bytes(),
                         started_at, time.time())
    save_result(task, settings, result, identity)
    return result


class ConcatShardPacker:
    """``concat``: the shard's slice of the global stream; edges kept as head/tail fragments."""

    def __init__(self, task: ShardTask, settings: PackSettings) -> None:
        c = settings.context_length
        self.context_length = c
        self.first_chunk = first_owned_chunk(task.token_offset, c)
        self._packer = StreamPacker(c, settings.pad_token, start_position=task.token_offset,
                                    dtype=np.dtype(settings.token_dtype))
        self.head = self.tail = None

    def push_runs_parts(self, tokens: np.ndarray, run_lengths: np.ndarray, first_doc_id: int) -> list[Chunks]:
        """Runs of documents from ``first_doc_id`` (the first may continue the last one pushed);
        full chunks as consecutive parts, the tokens never copied in bulk (StreamPacker.push_runs_parts)."""
        doc_ids = np.arange(first_doc_id, first_doc_id + run_lengths.size, dtype=np.int64)
        return self._packer.push_runs_parts(tokens, run_lengths, doc_ids)

    def count_split(self, lengths: np.ndarray) -> int:
        """Call before ``push_runs_parts``: documents of this batch that cross a chunk boundary."""
        return count_split_documents(lengths, self._packer.position, self.context_length)

    def finish(self) -> Chunks:
        last = self._packer.finish(pad=False)
        self.head, self.tail = self._packer.head, self._packer.tail
        return last

    def check_num_chunks(self, task: ShardTask, num_chunks: int) -> None:
        pass  # decided by token offsets alone


class BestFitShardPacker:
    """``best_fit``: windows of the shard's documents, its chunks from ``task.first_chunk``."""

    def __init__(self, task: ShardTask, settings: PackSettings) -> None:
        if task.first_chunk < 0:
            raise RuntimeError(f"internal error: best_fit shard {task.shard_index} has no first chunk")
        self.context_length = settings.context_length
        self.first_chunk = task.first_chunk
        self._packer = BestFitPacker(settings.context_length, settings.pad_token, window=settings.best_fit_window,
                                     first_doc_id=task.doc_offset, dtype=np.dtype(settings.token_dtype))
        self.head = self.tail = None

    def push_runs_parts(self, tokens: np.ndarray, run_lengths: np.ndarray, first_doc_id: int) -> list[Chunks]:
        """Runs of documents from ``first_doc_id`` (the first may continue the last one pushed)."""
        return self._packer.push_runs_parts(tokens, run_lengths, first_doc_id)

    def count_split(self, lengths: np.ndarray) -> int:
        return int(np.count_nonzero(lengths > self.context_length))

    def finish(self) -> Chunks:
        return self._packer.finish()

    def check_num_chunks(self, task: ShardTask, num_chunks: int) -> None:
        if num_chunks != task.num_chunks:
            raise InputError(f"shard {task.path}: counted {task.num_chunks} best_fit chunks but packed "
                             f"{num_chunks}; the file changed during the run (rerun on a stable copy)")


def make_shard_packer(task: ShardTask, settings: PackSettings) -> ConcatShardPacker | BestFitShardPacker:
    return BestFitShardPacker(task, settings) if settings.strategy == "best_fit" else ConcatShardPacker(task, settings)


def count_shard_chunks(task: ShardTask, settings: PackSettings) -> int:
    """best_fit: the chunks ``task``'s shard packs into, from its document lengths alone."""
    counter = BestFitChunkCounter(settings.context_length, window=settings.best_fit_window)
    batches = iter_token_batches(task.path, task.format, settings.token_column, read_batch_rows(task, settings),
                                 validate=False)
    for _, docs in batches:
        counter.push(np.diff(docs.offsets.to_numpy()))
    return counter.finish()


def _stream_shard(task: ShardTask, settings: PackSettings, packer: ConcatShardPacker | BestFitShardPacker,
                  writer: ChunkFileWriter, beat) -> dict[str, int]:
    """Read, count and pack the shard's documents in order; ``beat()`` after each slice packed."""
    counts = {"docs": 0, "nonempty": 0, "tokens": 0, "split": 0}
    batches = iter_token_batches(task.path, task.format, settings.token_column, read_batch_rows(task, settings))
    for first_row, docs in batches:
        beat()
        lengths = np.diff(docs.offsets.to_numpy())
        counts["docs"] += len(docs)
        counts["nonempty"] += int(np.count_nonzero(lengths))
        counts["tokens"] += int(lengths.sum())
        counts["split"] += packer.count_split(lengths)
        _check_not_past_plan(task, counts)
        tokens, lengths = flatten_documents(docs)
        try:
            _push_sliced(packer, writer, tokens, lengths, task.doc_offset + first_row, settings.read_batch_tokens, beat)
        except ValueError as e:  # a token that does not fit the output dtype: name its row
            check_tokens_fit(tokens, lengths, settings.token_dtype, path=task.path, first_row=first_row)
            raise InputError(f"shard {task.path} rows {first_row}..{first_row + len(docs) - 1}: {e}") from e
    return counts


def _push_sliced(packer: ConcatShardPacker | BestFitShardPacker, writer: ChunkFileWriter, tokens: np.ndarray,
                 lengths: np.ndarray, first_doc_id: int, max_tokens: int, beat=lambda: None) -> None:
    """Push a read batch in slices of at most ``max_tokens`` tokens (a long document across
    several), so that beyond the reader's batch the packer holds O(max_tokens) tokens."""
    for slice_tokens, run_lengths, slice_first_id in iter_run_slices(tokens, lengths, first_doc_id, max_tokens):
        for chunks in packer.push_runs_parts(slice_tokens, run_lengths, slice_first_id):
            if chunks.num_chunks:
                writer.write(chunks)
        beat()


def reset_peak_rss() -> None:
    """Start measuring a new peak: Linux resets VmHWM on ``5`` written to /proc/self/clear_refs.
    Elsewhere (or where that is refused) the peak stays the process's lifetime peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since :func:`reset_peak_rss` (else since it started)."""
    return _proc_status_bytes("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    """Resident set size of this process now (0 where /proc is not available)."""
    return _proc_status_bytes("VmRSS")


def _proc_status_bytes(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def read_batch_rows(task: ShardTask, settings: PackSettings) -> int:
    """Documents per read batch: the configured number, or enough for ~read_batch_tokens tokens."""
    if settings.read_batch_size:
        return settings.read_batch_size
    mean_len = task.num_tokens / task.num_docs if task.num_docs else 1.0
    return int(min(1 << 20, max(1, settings.read_batch_tokens / max(mean_len, 1.0))))


def count_split_documents(lengths: np.ndarray, start: int, context_length: int) -> int:
    """Documents (laid end to end from global position ``start``) that cross a chunk boundary."""
    return int(np.count_nonzero(split_document_mask(lengths, start, context_length)))


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


