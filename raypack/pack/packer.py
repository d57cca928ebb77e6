"""Pack one task (a shard, or a range of its row groups / record batches): stream its documents
in order, write the complete chunks it owns to one file, and hand back the fragments at its edges
for the driver to stitch. No Ray here.

Which chunks a shard owns, and how its documents become chunks, is its strategy's
(``settings.packing``, raypack.strategies): ``concat`` owns the chunks inside its slice of the
global stream and returns edge fragments; a strategy with a counting pass (``best_fit``)
owns all of its chunks from ``task.first_chunk``, counted first by :func:`count_shard_chunks`.
"""

from __future__ import annotations

import ctypes
import functools
import resource
import threading
import time
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from raypack.errors import InputChanged, InputError
from raypack.inputs.base import DocumentBatch
from raypack.inputs.reading import iter_document_batches
from raypack.io.prefetch import prefetched
from raypack.pack.local import until_stopped
from raypack.pack.resume import check_same_file, identify_input, sampled_identity, save_result
from raypack.pack.tasks import PackSettings, ShardResult, ShardTask, TaskCounts, read_batch_rows
from raypack.pack.watchdog import ProgressWatchdog
from raypack.packed.writer import ChunkFileWriter, Committer, chunk_schema, publish_or_abort
from raypack.rules.arrays import numpy_values
from raypack.rules.core import cast_tokens, flatten_documents, iter_run_slices
from raypack.rules.long_docs import CutCounts, count_cut, keep_prefixes, kept_lengths
from raypack.rules.side_columns import combine, opaque
from raypack.rules.token_checks import check_tokens_fit
from raypack.strategies.base import ShardPacker


def pack_shard(task: ShardTask, settings: PackSettings, stop: threading.Event | None = None,
               committer: Committer | None = None) -> ShardResult:
    """Pack ``task``'s shard; its file appears (rename, or one upload) only when complete. ``stop``
    (the local engine's threads, raypack.pack.local): set, the task gives up before its next batch.
    ``committer``: see :func:`pack_documents`.

    The input's identity for the resume record is taken first, so a file that changes while it
    is packed is not recorded as the new version (cost: see raypack/pack/resume.py).
    """
    started_at = time.time()
    identity = identify_input(task, settings)
    check_same_file("shard", task.path, task.planned, identity)
    batches = iter_document_batches(task.path, task.format, settings.token_column, read_batch_rows(task, settings),
                                    extra_columns=tuple(c.name for c in settings.extra_columns),
                                    max_document_tokens=settings.max_document_tokens, **task.read_range())
    # the next batch is read (pyarrow, without the GIL) while this one is packed: one more batch held
    batches = _still_planned(task, until_stopped(prefetched(batches), stop, task.describe()))
    return pack_documents(task, settings, batches, identity, started_at, committer)


def _still_planned(task: ShardTask, batches: Iterable[DocumentBatch]) -> Iterator[DocumentBatch]:
    """``batches``, then the check that ``task``'s shard is still the file the run planned on, once its
    reads end and before its chunks are published (a file replaced under the read by one with the same
    counts would otherwise pass). Cost: one more sampled identity a task (at most 2 MiB read)."""
    yield from batches
    if task.planned:
        check_same_file("shard", task.path, task.planned, sampled_identity(task.path, task.format))


def pack_documents(task: ShardTask, settings: PackSettings, batches: Iterable[DocumentBatch],
                   identity: dict[str, Any], started_at: float, committer: Committer | None = None,
                   placed: Callable[[], ShardTask] | None = None) -> ShardResult:
    """Pack ``task`` from ``batches`` (its documents in order, rows counted from ``task.row_start``:
    read from its shard by :func:`pack_shard`, or held in memory by ``pack --tokenizer``'s one pass,
    raypack.tokenize.onepass) and record the result with the input's ``identity``.

    Publishing (the chunk file's fsync and rename, then the resume record) happens here, or, given
    a ``committer`` (the local engine's: raypack.pack.job), on its thread while the caller packs
    the next task; the caller then waits for it (``Committer.wait``) before it publishes the output.

    ``placed``: ``task`` is packed as it is tokenized (the one pass, ``--local``), so only its offsets are
    known as it starts (its counts are -1; a strategy without a counting pass needs no more). Called once
    ``batches`` end, it gives the task as placed from what was tokenized; the counts are checked against
    that, and the resume record names it."""
    dtype = np.dtype(settings.token_dtype)
    packer = settings.packing.make_shard_packer(task, settings)
    schema = chunk_schema(settings.context_length, pa.from_numpy_dtype(dtype), settings.pad_token,
                          settings.extra_columns)
    watchdog = ProgressWatchdog(task.describe(), settings.progress_timeout_s,
                                restart=settings.restart_stalled)
    # from the file's opening to its job's hand-over, anything that raises (a Ctrl-C too) aborts it: a stop
    # between them left .tmp chunk files in the staging directory (an operator's trial, 1 stop in 10)
    writer = ChunkFileWriter(settings.out_dir, packer.first_chunk, schema, settings.chunks_per_record_batch)
    try:
        with watchdog:
            counts, cut = _stream_shard(task, settings, packer, writer, batches, watchdog.beat,
                                        planned=placed is None)
        if placed is not None:
            task = placed()
        _check_cut(task, cut)
        last = packer.finish()
        if last.num_chunks:
            writer.write(last)
        _check_counts(task, counts)
        packer.check_num_chunks(task, writer.num_chunks)
        written = writer.finish() if writer.num_chunks else None
        if written is None:
            writer.abort()
        result = ShardResult(task.shard_index, written, packer.head, packer.tail, counts["docs"],
                             counts["nonempty"], counts["tokens"], counts["split"], peak_rss_bytes(),
                             started_at, time.time(), task.task_index)
    except BaseException:
        writer.abort()
        raise

    def publish() -> None:
        if written is not None:
            writer.publish()
        save_result(task, settings, result, identity)  # after its file: a record names a published file

    if committer is None:
        publish_or_abort(publish, writer.abort)
    else:
        committer.submit(publish, writer.abort)
    return result


def local_publisher(workers: int) -> Committer:
    """The local engine's :class:`Committer` for ``workers`` packer threads: each may have two
    finished tasks waiting to be published (an open file each) before it waits. Ray's actors
    publish each task before returning it (a driver's wait cannot reach another node's disk)."""
    return Committer(max_pending=2 * max(1, workers))


def count_shard_chunks(task: ShardTask, settings: PackSettings) -> int:
    """The first pass of a strategy that has one: ``task``'s shard's chunks, from document lengths."""
    return count_task(task, settings).num_chunks


def count_task(task: ShardTask, settings: PackSettings, stop: threading.Event | None = None) -> TaskCounts:
    """The first pass (raypack.pack.plan.Plan.needs_counting_pass): ``task``'s chunks, when its strategy
    counts them, and what ``long_docs`` leaves out, from document lengths alone (tokens are read
    but not validated). Cost: one read of the task's token column; O(documents) numpy work. ``stop``:
    as for :func:`pack_shard`."""
    batches = until_stopped(
        iter_document_batches(task.path, task.format, settings.token_column, read_batch_rows(task, settings),
                              validate=False, max_document_tokens=settings.max_document_tokens, **task.read_range()),
        stop, task.describe())
    return count_lengths((np.diff(numpy_values(batch.tokens.offsets)).astype(np.int64) for batch in batches), settings)


def count_lengths(length_batches: Iterable[np.ndarray], settings: PackSettings) -> TaskCounts:
    """:func:`count_task` over a task's document lengths (int64 arrays, in order)."""
    packing, c = settings.packing, settings.context_length
    counter = packing.make_chunk_counter(c) if packing.needs_counting_pass else None
    cut = CutCounts()
    for lengths in length_batches:
        cut += count_cut(lengths, settings.long_docs, c)
        if counter is not None:
            counter.push(kept_lengths(lengths, settings.long_docs, c))
    return TaskCounts(counter.finish() if counter is not None else -1, cut)


def _stream_shard(task: ShardTask, settings: PackSettings, packer: ShardPacker, writer: ChunkFileWriter,
                  batches: Iterable[DocumentBatch], beat, planned: bool = True) -> tuple[dict[str, int], CutCounts]:
    """Read, count and pack the shard's documents in order; ``beat()`` after each slice packed. The
    counts read and what ``long_docs`` left out; ``planned``: no read goes past ``task``'s counts (a
    task packed as it is tokenized has none yet: :func:`pack_documents`).

    A document arrives whole, in one read batch (a longer one than ``max_document_tokens`` is
    refused by the reader); the packer is fed slices of at most ``read_batch_tokens`` tokens
    (:func:`_push_sliced`). ``long_docs`` (raypack.rules.long_docs) is applied as the batches are
    read: the packer sees each document's kept prefix (empty when dropped) under its own id.
    """
    counts = {"docs": 0, "nonempty": 0, "tokens": 0, "split": 0}
    cut, c = CutCounts(), settings.context_length
    for batch in batches:
        beat()
        first_row = batch.first_row
        tokens, lengths = flatten_documents(batch.tokens)
        if batch.sides:  # records of token + side values, so that long_docs cuts every column alike
            tokens = _with_sides(tokens, lengths, batch.sides, task, settings, first_row)
        kept = kept_lengths(lengths, settings.long_docs, c)
        tokens = keep_prefixes(tokens, lengths, kept)
        counts["docs"] += lengths.size
        counts["nonempty"] += int(np.count_nonzero(kept))
        counts["tokens"] += int(lengths.sum())
        counts["split"] += packer.count_split(kept)
        cut += count_cut(lengths, settings.long_docs, c)
        if planned:
            _check_not_past_plan(task, counts)
        if kept.size:
            _push_checked(packer, writer, tokens, kept, task, settings, first_row, beat)
    return counts, cut


def _push_checked(packer: ShardPacker, writer: ChunkFileWriter, tokens: np.ndarray, lengths: np.ndarray,
                  task: ShardTask, settings: PackSettings, first_row: int, beat) -> None:
    """``_push_sliced`` the documents from shard row ``first_row``; a token that does not fit the
    output dtype raises InputError naming its row."""
    try:
        _push_sliced(packer, writer, tokens, lengths, task.doc_offset + first_row - task.row_start,
                     settings.read_batch_tokens, beat, align=settings.context_length * settings.chunks_per_record_batch)
    except ValueError as e:
        check_tokens_fit(tokens, lengths, settings.token_dtype, path=task.path, first_row=first_row)
        raise InputError(f"shard {task.path} rows {first_row}..{first_row + len(lengths) - 1}: {e}") from e


def _with_sides(tokens: np.ndarray, lengths: np.ndarray, sides: tuple[pa.Array, ...], task: ShardTask,
                settings: PackSettings, first_row: int) -> np.ndarray:
    """Tokens (checked to fit the token dtype, InputError naming the row otherwise) and the side
    columns' values as one array of the packed dtype (raypack.rules.side_columns). One copy of each."""
    try:
        values = [numpy_values(side.flatten()) for side in sides]
        return opaque(combine(cast_tokens(tokens, np.dtype(settings.token_dtype)), values, settings.record_dtype))
    except ValueError as e:
        check_tokens_fit(tokens, lengths, settings.token_dtype, path=task.path, first_row=first_row)
        raise InputError(f"shard {task.path} rows {first_row}..{first_row + len(lengths) - 1}: {e}; the file changed "
                         "during the run (rerun on a stable copy)") from e


def _push_sliced(packer: ShardPacker, writer: ChunkFileWriter, tokens: np.ndarray,
                 lengths: np.ndarray, first_doc_id: int, max_tokens: int, beat=lambda: None, align: int = 0) -> None:
    """Push a read batch in slices of at most ``max_tokens`` tokens (a long document across
    several), so that beyond the reader's batch the packer holds O(max_tokens) tokens.

    ``align`` (the tokens of one record batch): where the packer cuts chunks from the stream in
    order (``packer.stream_position``) and ``max_tokens >= align``, the slices end on global
    multiples of ``align``. A record batch inside one read batch is then one zero-copy part, which
    the writer takes as is instead of concatenating two slices' parts (the bytes are the same)."""
    first, position = None, packer.stream_position
    if position is not None and 0 < align <= max_tokens:
        max_tokens -= max_tokens % align
        first = max_tokens - position % align
    for slice_tokens, run_lengths, slice_first_id in iter_run_slices(tokens, lengths, first_doc_id, max_tokens,
                                                                     first):
        for chunks in packer.push_runs_parts(slice_tokens, run_lengths, slice_first_id):
            if chunks.num_chunks:
                writer.write(chunks)
        beat()


def reset_peak_rss() -> None:
    """Start measuring a new peak: Linux resets VmHWM on ``5`` written to /proc/self/clear_refs.
    Elsewhere (or where that is refused) the peak stays the process's lifetime peak. It resets the
    kernel's ``ru_maxrss`` too (what ``/usr/bin/time`` and ``getrusage`` report), so it is called once
    per local run (:func:`local_run_base`), never per task: tasks overlap on threads, and a reset at
    each task's start hid the peaks before it (tokenizing, earlier tasks) from the summary and from
    any outside measure."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since :func:`reset_peak_rss` (else since it started):
    read at a task's end, it covers everything the process did before, the task's tokenizing too."""
    return _proc_status_bytes("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def give_back_freed_memory() -> None:
    """Return to the system what this process has freed and its allocators keep: Arrow's pool's
    cached pages (``release_unused``) and, with glibc, the free pages of malloc's arenas
    (``malloc_trim``; skipped where there is none). Cost: about a millisecond, and the pages given
    back are faulted in again when next used (raypack.tokenize.onepass calls it only in tasks
    long enough to spill)."""
    pa.default_memory_pool().release_unused()
    trim_freed_heap()


def trim_freed_heap() -> None:
    """Return to the system the free pages of glibc malloc's arenas (``malloc_trim``: numpy's arrays and
    the tokenizer's buffers live there); nothing where there is no glibc. Cost: about a millisecond, plus
    faulting the pages in again when next used (raypack.tokenize.onepass: after each piece of a task packed
    as it is tokenized, past held_tokens ids, where freed pages otherwise grew with the task)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # the process's own symbols: glibc's, where it is glibc
    except (OSError, AttributeError, TypeError):  # no malloc_trim (musl, macOS), or no CDLL(None) (Windows)
        return None


def local_run_base() -> int:
    """A ``--local`` run's start: its peak measured from here (:func:`reset_peak_rss`, once), and the
    RSS it grows from (the process also holds whatever its caller holds). A task's ``peak_rss_bytes``
    minus this is what the process grew by, at its peak, from the run's start to the task's end.
    A Ray packer actor resets once, as it starts (raypack.engine.workers), and reports its peak whole."""
    reset_peak_rss()
    return current_rss_bytes()


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


def _check_not_past_plan(task: ShardTask, counts: dict[str, int]) -> None:
    if counts["docs"] > task.num_docs or counts["tokens"] > task.num_tokens:
        _raise_changed(task, counts)


def _check_cut(task: ShardTask, cut: CutCounts) -> None:
    """What ``long_docs`` left out must be what the counting pass found (the offsets follow from it)."""
    if cut != task.cut:
        raise InputChanged(f"{task.describe()}: the counting pass found {task.cut} but packing read {cut}; the "
                         "file changed during the run (rerun on a stable copy)")


def _check_counts(task: ShardTask, counts: dict[str, int]) -> None:
    if counts["docs"] != task.num_docs or counts["tokens"] != task.num_tokens:
        _raise_changed(task, counts)


def _raise_changed(task: ShardTask, counts: dict[str, int]) -> None:
    where = "" if task.is_whole_shard else f" rows {task.row_start}..{task.row_start + task.num_docs - 1}"
    raise InputError(
        f"shard {task.path}{where}: planned {task.num_docs} documents / {task.num_tokens} tokens but read "
        f"{counts['docs']} / {counts['tokens']} so far; the file changed during the run or its "
        f"metadata is wrong (rewrite it, or report the writer)"
    )


