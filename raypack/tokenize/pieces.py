"""A text task's documents, read and encoded in pieces, in order. No Ray.

A task's text batches (its format's ``iter_texts``) are cut into pieces of at most ``batch_bytes``
of text (:func:`task_pieces`), and each piece is encoded (:func:`encode_pieces`), several calls at
once where the tokenizer says they are worth overlapping. For a run that tokenizes its tasks one
after another in one place (``pack --tokenizer --local``), :class:`EncodeAhead` reads and encodes
across the tasks' edges, so the encoder is not idle while a task ends and the next one starts.
Whatever overlaps, pieces come out in order and an error is raised in its place in that order, as
reading and encoding one piece at a time would raise it.
"""

from __future__ import annotations

import collections
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Iterator, Sequence, TypeVar

import numpy as np
import pyarrow as pa

from raypack.errors import InputError
from raypack.inputs.registry import format_named
from raypack.io.prefetch import prefetched
from raypack.tokenize.tokenizers import FlatIds, TextTokenizer, encode_naming, text_offsets

if TYPE_CHECKING:
    from raypack.tokenize.tasks import TextTask, TokenizeSettings

__all__ = ["EncodeAhead", "ReadAhead", "document_name", "encode_across", "encode_pieces", "task_pieces"]

T = TypeVar("T")


def task_pieces(task: TextTask, settings: TokenizeSettings, batches: Iterator[tuple[int, pa.Array]] | None = None
                ) -> Iterator[tuple[int, pa.Array]]:
    """The task's texts in pieces of at most ``batch_bytes`` (:func:`_byte_pieces`), each with the
    index in the task of its first document; ``batches``: the task's text batches as
    :meth:`ReadAhead.texts` gives them (by default they are read here, a batch ahead)."""
    seen = 0
    for _, texts in _iter_texts(task, settings, batches):
        for piece in _byte_pieces(texts, settings.batch_bytes):
            yield seen, piece
            seen += len(piece)


def encode_pieces(task: TextTask, pieces: Iterator[tuple[int, pa.Array]], tokenizer: TextTokenizer
                  ) -> Iterator[tuple[pa.Array, FlatIds]]:
    """Each of ``task``'s pieces with its ids, in order (:func:`encode_across`, for one task)."""
    for _, piece, flat in encode_across(((task, first, piece) for first, piece in pieces), tokenizer):
        yield piece, flat


def encode_across(items: Iterator[tuple[TextTask, int, pa.Array | None]], tokenizer: TextTokenizer
                  ) -> Iterator[tuple[TextTask, pa.Array | None, FlatIds | None]]:
    """Each item's piece (its task, the index in the task of its first document, its texts) with its
    ids, in order; an item without a piece (a task's end) passes through in its place, with no ids.
    Where the tokenizer says its calls are worth overlapping (``calls_in_flight``: gigatoken on a pool
    of threads), that many are encoded at once, on threads, across the tasks' edges: while one call's
    last long documents run on one of the pool's threads, the next call's keep the others busy
    (BENCHMARKS.md, "stop 63": 8-10% faster with --local; "stop 64": across the edges). An error,
    of a call or of ``items`` (a read), is raised in its place in the order, as one call at a time
    would raise it; leaving early waits for the calls in flight (at most ``calls_in_flight`` pieces)
    and starts no other."""
    calls = int(getattr(tokenizer, "calls_in_flight", 1))
    if calls <= 1:
        for task, first, piece in items:
            yield task, piece, None if piece is None else encode_naming(tokenizer, piece, _named(task, first))
        return
    pool = ThreadPoolExecutor(max_workers=calls, thread_name_prefix="raypack-encode")
    in_flight: collections.deque[tuple[TextTask | None, pa.Array | None, Future | None]] = collections.deque()
    source: Iterator | None = iter(items)
    pending = 0  # pieces in flight
    try:
        while True:
            while source is not None and pending < calls:
                try:
                    task, first, piece = next(source)
                except StopIteration:
                    source = None
                    break
                except Exception as e:  # noqa: BLE001 - a read's error, raised in its place
                    in_flight.append((None, None, _failed(e)))
                    source = None
                    break
                if piece is not None:
                    in_flight.append((task, piece, pool.submit(encode_naming, tokenizer, piece, _named(task, first))))
                    pending += 1
                else:
                    in_flight.append((task, None, None))
                del piece
            if not in_flight:
                return
            task, piece, future = in_flight.popleft()
            if piece is not None:
                pending -= 1
            flat = None if future is None else future.result()  # a call's error, or a read's, raised here
            yield task, piece, flat
            del piece, flat
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        close = getattr(source, "close", None)  # a generator's reads end here, not when it is collected
        if close is not None:
            close()


def _named(task: TextTask, first: int) -> Callable[[int], str]:
    return lambda k: document_name(task, first + k)


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future


class ReadAhead:
    """The text batches of ``tasks``, read in their order on one thread a batch ahead of the caller,
    across the tasks' edges: a task's first batch is read while the task before it is still being
    encoded (read task by task, each task's first read left the encoder idle: BENCHMARKS.md, "stop
    64"). Take each task's batches with :meth:`texts`, in ``tasks``' order; :meth:`close` ends the
    thread. A task's batches may be read before its file's planned identity is checked: they are
    used only after it is (:func:`raypack.tokenize.onepass.tokenize_held`,
    :func:`raypack.tokenize.tasks.tokenize_task`), and the file is checked again after its last read
    (:func:`raypack.tokenize.tasks.tokenize_in_memory`). A read's error is raised where that task's
    batches are taken, in order. Memory: one batch of texts beyond the caller's."""

    def __init__(self, tasks: Sequence[TextTask], settings: TokenizeSettings) -> None:
        self._batches = prefetched(self._read(list(tasks), settings))

    @staticmethod
    def _read(tasks: list[TextTask], settings: TokenizeSettings) -> Iterator[tuple[int, tuple[int, pa.Array] | None]]:
        for task in tasks:
            for batch in _read_texts(task, settings):
                yield task.task_index, batch
            yield task.task_index, None  # the task's end

    def texts(self, task: TextTask) -> Iterator[tuple[int, pa.Array]]:
        """``task``'s batches: the next task's of ``tasks``, once the one before has been taken whole."""
        return _one_task(self._batches, task, "texts read ahead")

    def close(self) -> None:
        self._batches.close()


class EncodeAhead:
    """Every piece of ``tasks``, read (:class:`ReadAhead`) and encoded (:func:`encode_across`) in
    order across the tasks' edges: the next task's first pieces are encoded while this task's last one
    is, and while its end is checked and handed over (task by task, the encoder was idle at each
    task's end and start: BENCHMARKS.md, "stop 64"). Take each task's pieces with :meth:`encoded`, in
    ``tasks``' order; :meth:`close` ends the threads. Memory, as for one task: the read batch being cut
    into pieces, the next one read, and the ids of ``calls_in_flight`` pieces being encoded."""

    def __init__(self, tasks: Sequence[TextTask], settings: TokenizeSettings, tokenizer: TextTokenizer) -> None:
        self._out = encode_across(self._items(list(tasks), settings), tokenizer)
        self._pieces = ((task.task_index, None if piece is None else (piece, flat)) for task, piece, flat in self._out)

    @staticmethod
    def _items(tasks: list[TextTask], settings: TokenizeSettings) -> Iterator[tuple[TextTask, int, pa.Array | None]]:
        ahead = ReadAhead(tasks, settings)
        try:
            for task in tasks:
                for first, piece in task_pieces(task, settings, ahead.texts(task)):
                    yield task, first, piece
                yield task, 0, None  # the task's end
        finally:
            ahead.close()

    def encoded(self, task: TextTask) -> Iterator[tuple[pa.Array, FlatIds]]:
        """``task``'s pieces with their ids: the next task's, once the one before has been taken whole."""
        return _one_task(self._pieces, task, "pieces encoded ahead")

    def close(self) -> None:
        self._out.close()


def _one_task(stream: Iterator[tuple[int, T | None]], task: TextTask, what: str) -> Iterator[T]:
    """The values of ``stream`` (task index, value) up to ``task``'s end (its value None): the stream's
    next task must be ``task``."""
    for index, value in stream:
        if index != task.task_index:
            raise RuntimeError(f"internal error: text task {task.task_index} was given task {index}'s {what}")
        if value is None:
            return
        yield value
    raise RuntimeError(f"internal error: the {what} ended before text task {task.task_index}'s")


def _read_texts(task: TextTask, settings: TokenizeSettings) -> Iterator[tuple[int, pa.Array]]:
    return format_named(task.format).iter_texts(task.path, settings.text_column, task.start, task.end,
                                                settings.batch_rows, max_text_bytes=settings.max_document_bytes)


def _iter_texts(task: TextTask, settings: TokenizeSettings, batches: Iterator[tuple[int, pa.Array]] | None = None
                ) -> Iterator[tuple[int, pa.Array]]:
    """The task's text batches, each checked against ``max_document_bytes`` before it is encoded;
    ``batches`` as :meth:`ReadAhead.texts` gives them (by default they are read here, a batch ahead)."""
    seen = 0
    if batches is None:
        batches = prefetched(_read_texts(task, settings))  # the next batch is read while this one is encoded
    for first_row, texts in batches:
        lengths = np.diff(text_offsets(texts))
        if lengths.size and int(lengths.max()) > settings.max_document_bytes:
            k = int(np.argmax(lengths > settings.max_document_bytes))
            raise InputError(f"{document_name(task, seen + k)} holds {int(lengths[k]):,} bytes of text, more than "
                             f"max_document_bytes={settings.max_document_bytes:,} (a tokenizer's memory grows with "
                             "the document); raise --max-document-bytes if the workers have the memory "
                             "(BENCHMARKS.md: bytes per byte), or split the document upstream")
        seen += len(texts)
        yield first_row, texts


def _byte_pieces(texts: pa.Array, max_bytes: int) -> Iterator[pa.Array]:
    """Consecutive slices of ``texts`` of at most ``max_bytes`` bytes of text each (a longer
    text alone). Cost: O(texts) numpy on the offsets."""
    offsets = text_offsets(texts).astype(np.int64)  # into the buffer: each piece is searched from its own start
    start = 0
    while start < len(texts):
        end = int(np.searchsorted(offsets, offsets[start] + max_bytes, side="right")) - 1
        end = max(end, start + 1)
        yield texts.slice(start, end - start)
        start = end


def document_name(task: TextTask, k: int) -> str:
    """Document ``k`` (from 0, in order) of ``task`` by its place in the file ("row 157", "line
    20001"), for an error message."""
    try:
        where = format_named(task.format).text_row(task.path, task.start, task.end, k)
    except (InputError, OSError):  # the file is gone or damaged by now: the task's own terms
        where = f"document {k} of {format_named(task.format).text_task_unit} [{task.start}, {task.end})"
    return f"text file {task.path} {where}"
