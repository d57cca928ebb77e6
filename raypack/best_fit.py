"""Best-fit packing: documents that fit a chunk are never cut. Pure numpy/pyarrow, no Ray, no I/O.

The rules (exact; the manifest calls this strategy ``best_fit``):
  1. Windows. Documents are packed within windows of ``window`` consecutive documents (0: one
     window for the whole stream); windows are packed one after another into consecutive chunks.
  2. Items. A document of ``L`` tokens becomes ``L // C`` pieces of ``C`` tokens (tokens
     ``[j*C, (j+1)*C)``) plus, when ``L % C``, a remainder of its last ``L % C`` tokens. A document
     of ``L <= C`` tokens is one item; an empty document is no item (its id takes no position).
  3. Best-fit decreasing. Items are placed longest first (ties: in stream order), each into the
     open chunk with the least room that still holds it (ties: the chunk opened first), else into
     a new chunk. Chunks are emitted in the order they were opened.
  4. Layout. Inside a chunk, items are laid out in increasing doc id, then padding up to ``C``.
Consequences: a document of at most ``C`` tokens lies whole in one chunk; a document's pieces
appear in chunk order (its full pieces fill chunks opened before any shorter item is placed), so
its segments read in chunk order give back the document; doc ids and masks work unchanged
(padding is ``-1``; every chunk may end with padding).

Cost per window: O(items log C) Python-level bin bookkeeping (items longer than C/2 never share
a chunk, so only the shorter ones go through the loop), one copy of each item's tokens, and
O(items + chunks) numpy index work.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heappop, heappush
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from raypack.core import Chunks, cast_tokens, concat_chunks, flatten_documents, validate_context_length, validate_pad_token

__all__ = [
    "BestFitChunkCounter",
    "BestFitPacker",
    "BestFitStats",
    "best_fit_decreasing",
    "best_fit_stats",
    "pack_best_fit",
    "pack_window",
    "split_items",
]


class Items(NamedTuple):
    """A window's items in stream order (doc, then piece).

    doc_index: (m,) int64, the item's document, counted from the window's first document.
    starts:    (m,) int64, the item's first token in the window's flat token array.
    lengths:   (m,) int64, 1..C tokens.
    """

    doc_index: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]


def split_items(doc_lengths: npt.NDArray[np.integer], context_length: int) -> Items:
    """Cut documents into items: full pieces of C tokens, then the remainder (rule 2)."""
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    pieces = -(-doc_lengths // context_length)
    doc_index = np.repeat(np.arange(doc_lengths.size, dtype=np.int64), pieces)
    first_item = np.cumsum(pieces) - pieces
    piece = np.arange(doc_index.size, dtype=np.int64) - first_item[doc_index]
    doc_starts = np.cumsum(doc_lengths) - doc_lengths
    starts = doc_starts[doc_index] + piece * context_length
    lengths = np.minimum(context_length, doc_lengths[doc_index] - piece * context_length)
    return Items(doc_index, starts, lengths)


def best_fit_decreasing(item_lengths: npt.NDArray[np.integer], capacity: int) -> tuple[npt.NDArray[np.int64], int]:
    """Bin of each item under best-fit decreasing (rule 3); returns ``(bins, num_bins)``.

    ``bins`` is (m,) int64 in the items' given order; bins are numbered in opening order.
    """
    item_lengths = np.asarray(item_lengths, dtype=np.int64)
    order = np.argsort(-item_lengths, kind="stable")
    sorted_lengths = item_lengths[order]
    num_alone = int(np.count_nonzero(2 * sorted_lengths > capacity))  # never share: one bin each
    sorted_bins = np.empty(item_lengths.size, dtype=np.int64)
    sorted_bins[:num_alone] = np.arange(num_alone)
    rooms = capacity - sorted_lengths[:num_alone]
    sorted_bins[num_alone:] = _place_short_items(sorted_lengths[num_alone:].tolist(), rooms, capacity)
    bins = np.empty_like(sorted_bins)
    bins[order] = sorted_bins
    num_bins = int(sorted_bins.max()) + 1 if sorted_bins.size else 0
    return bins, num_bins


def _place_short_items(lengths: list[int], rooms: npt.NDArray[np.int64], capacity: int) -> list[int]:
    """The best-fit loop for items of at most C/2 tokens, given the rooms of the bins open so far.

    Open bins are kept by room: ``room_values`` is the sorted list of rooms some bin has, and
    ``bins_by_room[r]`` a heap of the ids of the bins with room r, so the best fit for an item of
    L tokens is the first room >= L (a bisection) and the smallest id in its heap.
    """
    num_bins = int(rooms.size)
    bins_by_room: dict[int, list[int]] = {}
    for room, bin_id in zip(rooms.tolist(), range(num_bins)):
        if room:
            bins_by_room.setdefault(room, []).append(bin_id)  # ids ascend: each list is a heap
    room_values = sorted(bins_by_room)
    placed = []
    for length in lengths:
        i = bisect_left(room_values, length)
        if i == len(room_values):
            bin_id, room = num_bins, capacity - length
            num_bins += 1
        else:
            old_room = room_values[i]
            heap = bins_by_room[old_room]
            bin_id = heappop(heap)
            if not heap:
                del room_values[i], bins_by_room[old_room]
            room = old_room - length
        placed.append(bin_id)
        if room:
            heap = bins_by_room.get(room)
            if heap is None:
                bins_by_room[room] = [bin_id]
                insort(room_values, room)
            else:
                heappush(heap, bin_id)
    return placed


def pack_window(
    tokens: npt.NDArray[np.integer],
    doc_lengths: npt.NDArray[np.integer],
    first_doc_id: int,
    context_length: int,
    pad_token: int,
) -> Chunks:
    """Best-fit pack one window: ``tokens`` flat, ``doc_lengths`` per document (rules 2-4).

    Returns the window's chunks, tokens in ``tokens``' dtype, segments per chunk (the items in
    doc id order, then one padding segment if the chunk is not full).
    """
    c = context_length
    items = split_items(doc_lengths, c)
    bins, num_bins = best_fit_decreasing(items.lengths, c)
    order = np.argsort(bins, kind="stable")  # by chunk, then doc id (items are in stream order)
    lengths, bins_in_order = items.lengths[order], bins[order]
    fills = np.bincount(bins, weights=items.lengths, minlength=num_bins).astype(np.int64)
    starts_in_order = np.cumsum(lengths) - lengths
    bin_starts = starts_in_order[np.searchsorted(bins_in_order, np.arange(num_bins))]  # each bin has an item
    destinations = bins_in_order * c + starts_in_order - bin_starts[bins_in_order]
    input_ids = _gather(tokens, items.starts[order], destinations, lengths, num_bins * c)
    _pad_ends(input_ids, fills, c, pad_token)
    return Chunks(input_ids.reshape(num_bins, c), *_segments(bins_in_order, items.doc_index[order] + first_doc_id,
                                                              lengths, fills, c))


def _gather(tokens: np.ndarray, starts: np.ndarray, destinations: np.ndarray, lengths: np.ndarray, size: int) -> np.ndarray:
    """Copy each item's tokens to its place in a flat output (one slice copy per item)."""
    out = np.empty(size, dtype=tokens.dtype)
    for start, dest, length in zip(starts.tolist(), destinations.tolist(), lengths.tolist()):
        out[dest:dest + length] = tokens[start:start + length]
    return out


def _pad_ends(flat: np.ndarray, fills: np.ndarray, context_length: int, pad_token: int) -> None:
    for chunk in np.flatnonzero(fills < context_length).tolist():
        flat[chunk * context_length + int(fills[chunk]):(chunk + 1) * context_length] = pad_token


def _segments(bins_in_order: np.ndarray, doc_ids: np.ndarray, lengths: np.ndarray, fills: np.ndarray,
              context_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per chunk: its items' segments, then a padding segment when it is not full."""
    num_bins = fills.size
    padded = fills < context_length
    items_per_bin = np.bincount(bins_in_order, minlength=num_bins)
    offsets = np.zeros(num_bins + 1, dtype=np.int64)
    np.cumsum(items_per_bin + padded, out=offsets[1:])
    item_slots = np.arange(bins_in_order.size) + offsets[bins_in_order] - (np.cumsum(items_per_bin) - items_per_bin)[bins_in_order]
    seg_doc_ids = np.full(offsets[-1], -1, dtype=np.int64)
    seg_lengths = np.empty(offsets[-1], dtype=np.int32)
    seg_doc_ids[item_slots] = doc_ids
    seg_lengths[item_slots] = lengths
    seg_lengths[offsets[1:][padded] - 1] = context_length - fills[padded]
    return offsets, seg_doc_ids, seg_lengths


# ----------------------------------------------------------------------------- streaming


class BestFitPacker:
    """Best-fit packs a stream of documents fed in batches, window by window (rule 1).

    ``push``/``push_flat`` take whole documents and return the chunks they complete;
    ``push_runs_parts`` also takes a document in slices (the same doc id continuing across
    calls); ``finish`` packs the last, partial window. Feeding the same documents split into
    batches or slices in any way gives identical output: windows are counted in documents.

    Streaming: a window's chunks are its full C-token pieces in stream order, then the
    best-fit chunks of its shorter items (rules 2-3: full pieces sort first and open their own
    chunks, which no other item joins). So full pieces leave as soon as they are read, as
    views of the caller's tokens, and the packer keeps only the window's short items (each
    < C tokens: a document's remainder, or a document shorter than C), copied once, plus the
    < C tokens after the last full piece of the document still being read. Memory: the short
    items of one window (at most ``window`` x C tokens), independent of document length.
    """

    def __init__(self, context_length: int, pad_token: int, *, window: int, first_doc_id: int = 0,
                 dtype: npt.DTypeLike | None = None) -> None:
        self.context_length = validate_context_length(context_length)
        if window < 0:
            raise ValueError(f"window={window} must be >= 0 documents (0: one window for the whole stream)")
        self.window = int(window)
        self.pad_token = pad_token
        self.dtype = None if dtype is None else np.dtype(dtype)
        if self.dtype is not None:
            validate_pad_token(pad_token, self.dtype)
        self.next_doc_id = int(first_doc_id)
        """The id the next new document gets (the open document, if any, is ``next_doc_id - 1``)."""
        self._window_first_id = int(first_doc_id)
        self._window_docs = 0  # documents begun in the current window, the open one included
        self._short = _ShortItems()
        self._open_tail: np.ndarray | None = None  # the open document's tokens after its last full piece

    def push(self, documents: Any) -> Chunks:
        """Add a batch of documents (any form :func:`flatten_documents` takes); return chunks."""
        return self.push_flat(*flatten_documents(documents))

    def push_flat(self, tokens: np.ndarray, doc_lengths: np.ndarray) -> Chunks:
        """Add whole documents given as flat tokens and one length per document; return chunks."""
        parts = self.push_runs_parts(tokens, doc_lengths, self.next_doc_id)
        parts += self._close_open()
        return concat_chunks(parts, self.context_length, self.dtype or np.int64)

    def push_runs_parts(self, tokens: np.ndarray, run_lengths: npt.NDArray[np.integer], first_doc_id: int) -> list[Chunks]:
        """Add runs of consecutive documents ``first_doc_id, first_doc_id + 1, ...``; return chunk parts.

        tokens: (T,) flat; run_lengths: (n,) summing to T. ``first_doc_id`` is either the next
        new document or the last document of the previous call, which this call continues (a
        document read in slices); the last run's document stays open until a later call starts
        another document or :meth:`finish`. Returns consecutive Chunks, full pieces as views of
        ``tokens`` where they lie in one document.
        """
        tokens = self._to_dtype(tokens)
        lengths = np.asarray(run_lengths, dtype=np.int64)
        if not lengths.size:
            return []
        continues = self._open_tail is not None and first_doc_id == self.next_doc_id - 1
        if not continues and first_doc_id != self.next_doc_id:
            raise ValueError(f"first_doc_id={first_doc_id}: documents must come in order; expected "
                             f"{self.next_doc_id}" + (f" or {self.next_doc_id - 1}" if self._open_tail is not None else ""))
        parts = [] if continues else self._close_open()
        if continues:
            tokens, lengths = _concat(self._open_tail, tokens), lengths.copy()
            lengths[0] += self._open_tail.size
            self._open_tail = None
        self.next_doc_id = first_doc_id + lengths.size
        return parts + self._add_runs(tokens, lengths, 1 if continues else 0)

    def finish(self) -> Chunks:
        parts = self._close_open()
        if self._window_docs:
            parts.append(self._pack_window())
        return concat_chunks(parts, self.context_length, self.dtype or np.int64)

    def _add_runs(self, tokens: np.ndarray, lengths: np.ndarray, num_old: int) -> list[Chunks]:
        """Window by window: emit full pieces, keep short items; the last run stays open.
        The first ``num_old`` runs continue a document already counted in the window."""
        ends = np.cumsum(lengths)
        doc_ids = np.arange(self.next_doc_id - lengths.size, self.next_doc_id, dtype=np.int64)
        parts, first = [], 0
        while True:
            room = self.window - self._window_docs if self.window else lengths.size
            end = min(lengths.size, max(first, num_old) + room)
            self._window_docs += end - max(first, num_old)
            start = int(ends[first] - lengths[first])
            parts.append(self._take_docs(tokens[start:int(ends[end - 1])], lengths[first:end], doc_ids[first:end],
                                         continues=first < num_old))
            if end == lengths.size:
                return parts
            parts += self._close_open()  # the window is full: this packs it
            first = end

    def _take_docs(self, tokens: np.ndarray, lengths: np.ndarray, doc_ids: np.ndarray, *, continues: bool) -> Chunks:
        """Whole documents but the last, which stays open: full pieces out as chunks, short
        items kept for the window, the last one's tokens after its last full piece kept open.
        ``continues``: the first document is the one left open before (already counted)."""
        full_lens = lengths // self.context_length * self.context_length
        short_lens = lengths - full_lens
        stop = tokens.size - int(short_lens[-1])
        self._open_tail = tokens[stop:].copy()
        short_lens[-1] = 0
        self._short.add(tokens[:stop], full_lens, short_lens, continues=continues)
        return self._full_pieces(tokens[:stop], full_lens, short_lens, doc_ids)

    def _full_pieces(self, tokens: np.ndarray, full_lens: np.ndarray, short_lens: np.ndarray, doc_ids: np.ndarray) -> Chunks:
        """The full C-token pieces of documents laid out as alternating (full, short) runs in ``tokens``."""
        c = self.context_length
        num_pieces = full_lens // c
        if np.count_nonzero(num_pieces) <= 1:  # one document's pieces: contiguous, no copy
            at = int(np.argmax(num_pieces))
            start = int(full_lens[:at].sum() + short_lens[:at].sum())
            full = tokens[start:start + int(full_lens[at])]
        else:
            full = tokens[_run_mask(full_lens, short_lens)]
        n = int(num_pieces.sum())
        return Chunks(full.reshape(n, c), np.arange(n + 1, dtype=np.int64), np.repeat(doc_ids, num_pieces),
                      np.full(n, c, dtype=np.int32))

    def _close_open(self) -> list[Chunks]:
        """End the open document: its tail becomes its short item; pack the window if it is full."""
        if self._open_tail is None:
            return []
        tail, self._open_tail = self._open_tail, None
        self._short.end_last(tail)
        if self.window and self._window_docs == self.window:
            return [self._pack_window()]
        return []

    def _pack_window(self) -> Chunks:
        tokens, lengths = self._short.take()
        pad = validate_pad_token(self.pad_token, self.dtype or tokens.dtype)
        chunks = pack_window(tokens, lengths, self._window_first_id, self.context_length, pad)
        self._window_first_id += lengths.size
        self._window_docs = 0
        return chunks

    def _to_dtype(self, tokens: np.ndarray) -> np.ndarray:
        if self.dtype is None:
            if tokens.size:
                self.dtype = tokens.dtype
            return tokens
        return cast_tokens(tokens, self.dtype)


def _run_mask(full_lens: np.ndarray, short_lens: np.ndarray) -> np.ndarray:
    """(sum of both,) bool: True on the full runs of alternating (full, short) runs."""
    runs = np.column_stack([full_lens, short_lens]).reshape(-1)
    return np.repeat(np.tile(np.array([True, False]), full_lens.size), runs)


def _concat(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    out = np.empty(first.size + second.size, dtype=np.result_type(first, second))
    out[:first.size] = first
    out[first.size:] = second
    return out


class _ShortItems:
    """A window's short items (each < C tokens; at most one per document), copied into one
    growing array, and one short length per document (0: none)."""

    def __init__(self) -> None:
        self._tokens: np.ndarray | None = None
        self._size = 0
        self._lengths: list[np.ndarray] = []

    def add(self, tokens: np.ndarray, full_lens: np.ndarray, short_lens: np.ndarray, *, continues: bool = False) -> None:
        """Keep the short runs of ``tokens`` (alternating full and short runs, one pair per
        document). ``continues``: the first pair belongs to the last document added (whose short
        length so far is 0: it was open)."""
        num_short = int(short_lens.sum())
        if num_short == tokens.size:
            self._reserve(num_short, tokens.dtype)[:] = tokens
        elif num_short:
            np.compress(~_run_mask(full_lens, short_lens), tokens, out=self._reserve(num_short, tokens.dtype))
        if continues:
            self._lengths[-1][-1] += short_lens[0]
            short_lens = short_lens[1:]
        if short_lens.size:
            self._lengths.append(short_lens)  # so self._lengths[-1][-1] is always the last document

    def end_last(self, tail: np.ndarray) -> None:
        """Give the last document added (added with short length 0: still open) its short item."""
        if tail.size:
            self._reserve(tail.size, tail.dtype)[:] = tail
            self._lengths[-1][-1] = tail.size

    def _reserve(self, size: int, dtype: np.dtype) -> np.ndarray:
        """A view of ``size`` new slots at the end (grown by doubling: amortised O(1) per token)."""
        if self._tokens is not None and self._tokens.dtype != dtype and not self._size:
            self._tokens = None  # the stream's dtype was decided after an empty start
        if self._tokens is None or self._tokens.size < self._size + size:
            capacity = max(self._size + size, 2 * (0 if self._tokens is None else self._tokens.size), 1 << 16)
            grown = np.empty(capacity, dtype=dtype)
            if self._tokens is not None:
                grown[:self._size] = self._tokens[:self._size]
            self._tokens = grown
        self._size += size
        return self._tokens[self._size - size:self._size]

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """All short tokens (a view, valid until the next ``add``) and per-document lengths; then empty."""
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        tokens = self._tokens[:self._size] if self._tokens is not None else np.zeros(0, np.int64)
        self._size, self._lengths = 0, []
        return tokens, lengths


def pack_best_fit(
    examples: Any, context_length: int, pad_token: int, *, window: int = 0
) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]]:
    """Best-fit pack documents in memory; returns ``(input_ids, doc_ids)``, both (n_chunks, C).

    The counterpart of :func:`raypack.core.pack_sequences` for the ``best_fit`` strategy.
    """
    context_length = validate_context_length(context_length)
    tokens, lengths = flatten_documents(examples)
    validate_pad_token(pad_token, tokens.dtype)
    packer = BestFitPacker(context_length, pad_token, window=window, dtype=tokens.dtype)
    chunks = concat_chunks([packer.push_flat(tokens, lengths), packer.finish()], context_length, tokens.dtype)
    return chunks.input_ids, chunks.doc_ids()


# ----------------------------------------------------------------------------- statistics


class BestFitChunkCounter:
    """Counts the chunks :class:`BestFitPacker` would emit, from document lengths alone."""

    def __init__(self, context_length: int, *, window: int) -> None:
        self.context_length = validate_context_length(context_length)
        self.window = int(window)
        self.num_chunks = 0
        self._lengths: list[np.ndarray] = []
        self._num_docs = 0

    def push(self, doc_lengths: npt.NDArray[np.integer]) -> None:
        self._lengths.append(np.asarray(doc_lengths, dtype=np.int64))
        self._num_docs += self._lengths[-1].size
        while self.window and self._num_docs >= self.window:
            lengths = np.concatenate(self._lengths)
            self._count(lengths[:self.window])
            self._lengths, self._num_docs = [lengths[self.window:]], lengths.size - self.window

    def finish(self) -> int:
        if self._num_docs:
            self._count(np.concatenate(self._lengths))
            self._lengths, self._num_docs = [], 0
        return self.num_chunks

    def _count(self, window_lengths: np.ndarray) -> None:
        items = split_items(window_lengths, self.context_length)
        self.num_chunks += best_fit_decreasing(items.lengths, self.context_length)[1]



class BestFitStats(NamedTuple):
    """What packing a stream of document lengths gives, without moving a token."""

    num_docs: int
    num_tokens: int
    num_chunks: int
    padding_positions: int
    split_documents: int
    """Documents cut across chunks (for best_fit: exactly those longer than C)."""


def best_fit_stats(doc_lengths: npt.NDArray[np.integer], context_length: int, *, window: int = 0) -> BestFitStats:
    """Chunks, padding and split documents that ``best_fit`` gives for these lengths."""
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    counter = BestFitChunkCounter(context_length, window=window)
    counter.push(doc_lengths)
    num_chunks = counter.finish()
    tokens = int(doc_lengths.sum())
    return BestFitStats(int(doc_lengths.size), tokens, num_chunks, num_chunks * context_length - tokens,
                        int(np.count_nonzero(doc_lengths > context_length)))

