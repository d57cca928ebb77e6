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
  5. Segments (only with ``max_segments=K``, K >= 2). A chunk "holds" an item in rule 3 only if
     it then has at most K segments, counted as the collate counts them: its items plus one
     padding segment unless it is full. So every chunk fits ``cu_seqlens`` of ``max_segments=K``
     (raypack.rules.masks.pad_cu_seqlens). Without K (the default) rule 3 alone decides.
Consequences: a document of at most ``C`` tokens lies whole in one chunk; a document's pieces
appear in chunk order (its full pieces fill chunks opened before any shorter item is placed), so
its segments read in chunk order give back the document; doc ids and masks work unchanged
(padding is ``-1``; every chunk may end with padding).

Cost per window: O(items log C) Python-level bin bookkeeping (items longer than C/2 never share
a chunk, so only the shorter ones go through the loop), one copy of each item's tokens (none for
the full pieces of a document that arrive in one slice), and O(items + chunks) numpy index work.
Memory (:class:`BestFitPacker`): the window's short items, not its full pieces, so a document of
any length costs no more than the slices it is fed in.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heappop, heappush
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from raypack.rules.core import (
    Chunks,
    cast_tokens,
    concat_chunks,
    flatten_documents,
    validate_context_length,
    validate_pad_token,
)

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


def validate_max_segments(max_segments: Any) -> int | None:
    """``max_segments`` (None: no limit), else ValueError unless it is an integer >= 2 (a chunk
    holding one short document already has two segments: the document and its padding)."""
    if max_segments is None:
        return None
    if isinstance(max_segments, bool) or not isinstance(max_segments, (int, np.integer)) or max_segments < 2:
        raise ValueError(f"max_segments={max_segments!r} must be an integer >= 2 (a chunk of one short document "
                         "has two segments, the document and its padding) or None (no limit)")
    return int(max_segments)


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


def best_fit_decreasing(item_lengths: npt.NDArray[np.integer], capacity: int,
                        max_segments: int | None = None) -> tuple[npt.NDArray[np.int64], int]:
    """Bin of each item under best-fit decreasing (rule 3); returns ``(bins, num_bins)``.

    ``bins`` is (m,) int64 in the items' given order; bins are numbered in opening order.
    ``max_segments`` (rule 5): no bin ends with more segments, its padding segment included.
    """
    item_lengths = np.asarray(item_lengths, dtype=np.int64)
    order = np.argsort(-item_lengths, kind="stable")
    sorted_lengths = item_lengths[order]
    num_alone = int(np.count_nonzero(2 * sorted_lengths > capacity))  # never share: one bin each
    sorted_bins = np.empty(item_lengths.size, dtype=np.int64)
    sorted_bins[:num_alone] = np.arange(num_alone)
    rooms = capacity - sorted_lengths[:num_alone]
    short = sorted_lengths[num_alone:].tolist()
    if max_segments is None:
        sorted_bins[num_alone:] = _place_short_items(short, rooms, capacity)
    else:
        sorted_bins[num_alone:] = _place_short_items_limited(short, rooms, capacity, max_segments)
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


def _place_short_items_limited(lengths: list[int], rooms: npt.NDArray[np.int64], capacity: int,
                               max_segments: int) -> list[int]:
    """:func:`_place_short_items` where a bin ends with at most ``max_segments`` (K >= 2) segments,
    counted as the collate counts them (raypack.rules.masks.cu_seqlens): its items plus one padding
    segment unless it is full. A bin of d items and room r takes an item of L tokens only when
    ``L <= r`` and ``d + 1 + (L < r) <= K``; so bins of at most K - 2 items take any item that fits
    (kept by room as in :func:`_place_short_items`), bins of K - 1 items only one that fills them
    exactly (``exact[r]``: a heap of their ids), bins of K items none. The best fit is the least
    room among both kinds (ties: the smallest id). ``rooms``: bins open so far, one item each.
    """
    num_bins = int(rooms.size)
    open_by_room: dict[int, list[int]] = {}
    exact: dict[int, list[int]] = {}
    room_values: list[int] = []
    items_in = [1] * num_bins

    def keep(bin_id: int, room: int) -> None:
        if not room or items_in[bin_id] >= max_segments:
            return
        if items_in[bin_id] == max_segments - 1:
            heappush(exact.setdefault(room, []), bin_id)
            return
        heap = open_by_room.get(room)
        if heap is None:
            open_by_room[room] = [bin_id]
            insort(room_values, room)
        else:
            heappush(heap, bin_id)

    for bin_id, room in enumerate(rooms.tolist()):
        keep(bin_id, room)
    placed = []
    for length in lengths:
        i = bisect_left(room_values, length)
        best_open = (room_values[i], open_by_room[room_values[i]][0]) if i < len(room_values) else None
        best_exact = (length, exact[length][0]) if exact.get(length) else None
        if best_open is None and best_exact is None:
            bin_id, room = num_bins, capacity - length
            items_in.append(0)
            num_bins += 1
        elif best_exact is not None and (best_open is None or best_exact < best_open):
            bin_id, room = heappop(exact[length]), 0
        else:
            old_room = room_values[i]
            bin_id = heappop(open_by_room[old_room])
            if not open_by_room[old_room]:
                del room_values[i], open_by_room[old_room]
            room = old_room - length
        items_in[bin_id] += 1
        placed.append(bin_id)
        keep(bin_id, room)
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
    items = split_items(doc_lengths, context_length)
    return pack_items([tokens], np.zeros(items.starts.size, np.int64), items, first_doc_id, context_length,
                      pad_token)


def pack_items(sources: list[np.ndarray], item_sources: npt.NDArray[np.int64], items: Items, first_doc_id: int,
               context_length: int, pad_token: int, max_segments: int | None = None) -> Chunks:
    """Best-fit pack a window's items (rules 3-5); item ``k`` is ``sources[item_sources[k]]``'s
    tokens ``[items.starts[k], items.starts[k] + items.lengths[k])``. One slice copy per item."""
    c = context_length
    bins, num_bins = best_fit_decreasing(items.lengths, c, max_segments)
    order = np.argsort(bins, kind="stable")  # by chunk, then doc id (items are in stream order)
    lengths, bins_in_order = items.lengths[order], bins[order]
    fills = np.bincount(bins, weights=items.lengths, minlength=num_bins).astype(np.int64)
    starts_in_order = np.cumsum(lengths) - lengths
    bin_starts = starts_in_order[np.searchsorted(bins_in_order, np.arange(num_bins))]  # each bin has an item
    destinations = bins_in_order * c + starts_in_order - bin_starts[bins_in_order]
    input_ids = np.empty(num_bins * c, dtype=sources[0].dtype if sources else np.int64)
    for source, start, dest, length in zip(item_sources[order].tolist(), items.starts[order].tolist(),
                                           destinations.tolist(), lengths.tolist()):
        input_ids[dest:dest + length] = sources[source][start:start + length]
    _pad_ends(input_ids, fills, c, pad_token)
    return Chunks(input_ids.reshape(num_bins, c), *_segments(bins_in_order, items.doc_index[order] + first_doc_id,
                                                              lengths, fills, c))


def _gather(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The runs ``[starts[k], starts[k] + lengths[k])`` of ``tokens``, one after another (one slice copy each)."""
    out = np.empty(int(lengths.sum()), dtype=tokens.dtype)
    for start, dest, length in zip(starts.tolist(), (np.cumsum(lengths) - lengths).tolist(), lengths.tolist()):
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
    first_item_of_bin = np.cumsum(items_per_bin) - items_per_bin
    item_slots = np.arange(bins_in_order.size) + offsets[bins_in_order] - first_item_of_bin[bins_in_order]
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
                 dtype: npt.DTypeLike | None = None, max_segments: int | None = None) -> None:
        self.context_length = validate_context_length(context_length)
        if window < 0:
            raise ValueError(f"window={window} must be >= 0 documents (0: one window for the whole stream)")
        self.window = int(window)
        self.max_segments = validate_max_segments(max_segments)
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

    def push_runs_parts(self, tokens: np.ndarray, run_lengths: npt.NDArray[np.integer],
                        first_doc_id: int) -> list[Chunks]:
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
            also = f" or {self.next_doc_id - 1}" if self._open_tail is not None else ""
            raise ValueError(f"first_doc_id={first_doc_id}: documents must come in order; "
                             f"expected {self.next_doc_id}{also}")
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

    def _full_pieces(self, tokens: np.ndarray, full_lens: np.ndarray, short_lens: np.ndarray,
                     doc_ids: np.ndarray) -> Chunks:
        """The full C-token pieces of documents laid out as alternating (full, short) runs in
        ``tokens``: a view when one document has them, else one slice copy per such document."""
        c = self.context_length
        num_pieces = full_lens // c
        starts, lens = _full_runs(full_lens, short_lens)
        if starts.size == 1:
            full = tokens[starts[0]:starts[0] + lens[0]]
        else:
            full = _gather(tokens, starts, lens)
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
        sources, item_sources, items, num_docs = self._short.take()
        dtype = self.dtype or (sources[0].dtype if sources else np.dtype(np.int64))
        pad = validate_pad_token(self.pad_token, dtype)
        chunks = pack_items(sources, item_sources, items, self._window_first_id, self.context_length, pad,
                            self.max_segments)
        self._window_first_id += num_docs
        self._window_docs = 0
        return chunks

    def _to_dtype(self, tokens: np.ndarray) -> np.ndarray:
        if self.dtype is None:
            if tokens.size:
                self.dtype = tokens.dtype
            return tokens
        return cast_tokens(tokens, self.dtype)


def _full_runs(full_lens: np.ndarray, short_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the non-empty full runs of alternating (full, short) runs."""
    ends = np.cumsum(full_lens + short_lens)
    keep = full_lens > 0
    return (ends - full_lens - short_lens)[keep], full_lens[keep]


def _concat(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    out = np.empty(first.size + second.size, dtype=np.result_type(first, second))
    out[:first.size] = first
    out[first.size:] = second
    return out


class _ShortItems:
    """A window's short items (each < C tokens; at most one per document) as slices of the
    token arrays they came in (kept by reference: no copy until the window is packed), and per
    document its item's source array, start and length (0: no item)."""

    def __init__(self) -> None:
        self._sources: list[np.ndarray] = []
        self._per_doc: list[np.ndarray] = []  # (3, n) int64 blocks: source, start, length

    def add(self, tokens: np.ndarray, full_lens: np.ndarray, short_lens: np.ndarray, *,
            continues: bool = False) -> None:
        """Documents laid out as alternating (full, short) runs in ``tokens``: keep their short
        runs. ``continues``: the first belongs to the last document added (which was open)."""
        per_doc = np.empty((3, short_lens.size), np.int64)
        per_doc[0] = len(self._sources)
        per_doc[1] = np.cumsum(full_lens + short_lens) - short_lens
        per_doc[2] = short_lens
        if short_lens.any():
            self._sources.append(tokens)
        if continues:
            self._per_doc[-1][:, -1] = per_doc[:, 0]
            per_doc = per_doc[:, 1:]
        if per_doc.shape[1]:
            self._per_doc.append(per_doc)  # so self._per_doc[-1][:, -1] is always the last document

    def end_last(self, tail: np.ndarray) -> None:
        """Give the last document added (added with short length 0: still open) its short item."""
        if tail.size:
            self._per_doc[-1][:, -1] = (len(self._sources), 0, tail.size)
            self._sources.append(tail)

    def take(self) -> tuple[list[np.ndarray], np.ndarray, Items, int]:
        """``(sources, item_sources, items, num_docs)`` for :func:`pack_items`; then empty."""
        per_doc = np.concatenate(self._per_doc, axis=1) if self._per_doc else np.zeros((3, 0), np.int64)
        sources = self._sources
        self._sources, self._per_doc = [], []
        has_item = per_doc[2] > 0
        items = Items(np.flatnonzero(has_item).astype(np.int64), per_doc[1][has_item], per_doc[2][has_item])
        return sources, per_doc[0][has_item], items, per_doc.shape[1]


def pack_best_fit(
    examples: Any, context_length: int, pad_token: int, *, window: int = 0, max_segments: int | None = None
) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]]:
    """Best-fit pack documents in memory; returns ``(input_ids, doc_ids)``, both (n_chunks, C).

    The counterpart of :func:`raypack.rules.core.pack_sequences` for the ``best_fit`` strategy.
    """
    context_length = validate_context_length(context_length)
    tokens, lengths = flatten_documents(examples)
    validate_pad_token(pad_token, tokens.dtype)
    packer = BestFitPacker(context_length, pad_token, window=window, dtype=tokens.dtype, max_segments=max_segments)
    chunks = concat_chunks([packer.push_flat(tokens, lengths), packer.finish()], context_length, tokens.dtype)
    return chunks.input_ids, chunks.doc_ids()


# ----------------------------------------------------------------------------- statistics


class BestFitChunkCounter:
    """Counts the chunks :class:`BestFitPacker` would emit, from document lengths alone."""

    def __init__(self, context_length: int, *, window: int, max_segments: int | None = None) -> None:
        self.context_length = validate_context_length(context_length)
        self.window = int(window)
        self.max_segments = validate_max_segments(max_segments)
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
        self.num_chunks += best_fit_decreasing(items.lengths, self.context_length, self.max_segments)[1]



class BestFitStats(NamedTuple):
    """What packing a stream of document lengths gives, without moving a token."""

    num_docs: int
    num_tokens: int
    num_chunks: int
    padding_positions: int
    split_documents: int
    """Documents cut across chunks (for best_fit: exactly those longer than C)."""


def best_fit_stats(doc_lengths: npt.NDArray[np.integer], context_length: int, *, window: int = 0,
                   max_segments: int | None = None) -> BestFitStats:
    """Chunks, padding and split documents that ``best_fit`` gives for these lengths."""
    doc_lengths = np.asarray(doc_lengths, dtype=np.int64)
    counter = BestFitChunkCounter(context_length, window=window, max_segments=max_segments)
    counter.push(doc_lengths)
    num_chunks = counter.finish()
    tokens = int(doc_lengths.sum())
    return BestFitStats(int(doc_lengths.size), tokens, num_chunks, num_chunks * context_length - tokens,
                        int(np.count_nonzero(doc_lengths > context_length)))

