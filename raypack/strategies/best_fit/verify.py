"""The best_fit structure check (manifest ``"strategy": "best_fit"``), after :mod:`raypack.strategies.best_fit.rules`.

``BestFitStructure(manifest, keep_tokens=...)``: ``manifest`` as loaded by
:func:`raypack.packed.manifest.load_manifest` (which also checked ``best_fit_window``, N >= 0, and the
shards' ``first_chunk``/``num_chunks``: ranges that tile the chunks in shard order). Checks:

  1. Per block: chunk indices and segment lengths as for every strategy; per chunk, documents first
     in strictly increasing doc id (so none twice), then at most one padding segment (-1, holding
     ``pad_token``), never a chunk of padding only; every doc id lies in the shard whose chunk
     range holds the chunk, and in one window (rows ``[w*N, (w+1)*N)`` of its shard; N=0: the
     whole shard) shared by all of the chunk's documents; windows never go back along the chunks,
     so each window's chunks are exactly the contiguous run of chunks holding its doc ids; with
     ``best_fit_max_segments`` K, at most K segments per chunk, padding included.
  2. Per window, once its last chunk is read: every document's segments, in chunk order, are
     full C-token chunks except the last (so a document of at most C tokens is one segment, a
     longer one its full pieces then its remainder); then the chunks are compared with the
     expected layout (:func:`raypack.strategies.best_fit.layout.expected_layout`, best-fit decreasing
     re-run on the window's document lengths, with K if set): the same number of chunks, the same fill per chunk
     and the same segments ("not best-fit" otherwise). At the end: the counts (split_documents =
     documents longer than C) and each shard's num_tokens.
  3. With inputs (``keep_tokens``): each window's segments are put back in doc id order (a
     document's segments in chunk order) and handed on as one piece, compared with the inputs.

Memory: the segments of one window plus one block (and, with ``keep_tokens``, that window's
tokens); windows never span shards, so ``best_fit_window=0`` holds a shard. Python loops run only
per window (best-fit decreasing), never per token or segment.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from raypack.packed.manifest import Manifest
from raypack.strategies.best_fit.layout import ExpectedLayout, expected_layout
from raypack.strategies.best_fit.windows import WindowMap
from raypack.verify.blocks import Block, Piece, SegmentPlaces, segment_places
from raypack.verify.report import VerifyError
from raypack.verify.structure import Structure

__all__ = ["BestFitStructure"]


class _Part(NamedTuple):
    """Consecutive chunks held back until their window is complete (copies, not file views).

    windows: (n,) global window id per chunk. tokens: (n, C), or None when inputs are not compared.
    """

    first_chunk: int
    windows: np.ndarray
    segment_counts: np.ndarray
    segment_doc_ids: np.ndarray
    segment_lengths: np.ndarray
    tokens: np.ndarray | None


class BestFitStructure(Structure):
    """best_fit: per-chunk checks on each block, per-window checks once a window's chunks are read.

    A window's chunks are held back (segments; tokens too when ``keep_tokens``) until a chunk of a
    later window, or the end, shows the window is complete; then its documents are checked and,
    put back in doc id order, handed on as one piece of the stream compared with the inputs.
    """

    def __init__(self, manifest: dict[str, Any], *, keep_tokens: bool = False) -> None:
        manifest = Manifest.of(manifest)
        super().__init__(manifest, keep_tokens=keep_tokens)
        self._map = WindowMap(manifest)
        self.window = self._map.window
        """Documents per window (0: a whole shard), as the manifest says."""
        self.max_segments = manifest.strategy.max_segments
        self._shard_tokens = np.zeros(len(manifest.shards), dtype=np.int64)
        self.last_window = -1
        self._pending: list[_Part] = []

    def report_note(self) -> str:
        return f"windows of {self.window:,} documents" if self.window else "windows of a whole shard"

    # --------------------------------------------------------------- per block

    def pieces(self, block: Block) -> Sequence[Piece]:
        self._check_chunk_indices(block)
        self._check_lengths(block)
        segs = segment_places(self.next_chunk, np.diff(block.segment_offsets), block.segment_lengths,
                              self.context_length)
        self._check_max_segments(block)
        real = self._check_chunk_padding(block, segs)
        self._check_chunk_documents(block, segs, real)
        windows = self._check_shards_and_windows(block, segs, real)
        num_pad = int(block.segment_lengths[~real].sum())
        self.num_tokens += block.input_ids.size - num_pad
        self.num_padding += num_pad
        self.num_segments += block.segment_doc_ids.size
        if real.any():
            self.last_doc_id = max(self.last_doc_id, int(block.segment_doc_ids[real].max()))
        self.next_chunk += block.chunk_indices.size
        return self._advance(block, windows)

    def _check_max_segments(self, block: Block) -> None:
        """With ``best_fit_max_segments`` K: no chunk holds more than K segments, padding included."""
        if self.max_segments is None:
            return
        per_chunk = np.diff(block.segment_offsets)
        if (per_chunk > self.max_segments).any():
            row = int(np.argmax(per_chunk > self.max_segments))
            raise VerifyError(f"{self._row_label(block, row)}: {int(per_chunk[row])} segments, more than "
                              f"best_fit_max_segments={self.max_segments}")

    def _check_chunk_padding(self, block: Block, segs: SegmentPlaces) -> np.ndarray:
        """Padding only as a chunk's last segment, never alone, holding pad_token; return the non-padding mask."""
        ids, c = block.segment_doc_ids, self.context_length
        if (ids < -1).any():
            k = int(np.argmax(ids < -1))
            raise VerifyError(f"{self._map.place(int(segs.chunks[k]), int(segs.starts[k]))}: doc id {int(ids[k])} is "
                              "negative; doc ids are >= 0 and -1 marks padding")
        pad = ids == -1
        inside = pad & ~segs.is_last
        if inside.any():
            k = int(np.argmax(inside))
            chunk, row = int(segs.chunks[k]), int(segs.rows[k])
            num = int(block.segment_offsets[row + 1] - block.segment_offsets[row])
            raise VerifyError(f"{self._map.place(chunk, int(segs.starts[k]))}: padding (doc id -1) in chunk {chunk} "
                              f"segment {k - int(block.segment_offsets[row])} of {num}, before "
                              f"{self._map.doc(int(ids[k + 1]))}; a best_fit chunk holds its documents first and "
                              "padding only as its last segment")
        alone = pad & segs.is_first
        if alone.any():
            k = int(np.argmax(alone))
            raise VerifyError(f"{self._map.place(int(segs.chunks[k]), 0)}: chunk {int(segs.chunks[k])} is all padding "
                              "(doc id -1); best_fit never emits a chunk without a document")
        if pad.any():
            wrong = np.repeat(pad, block.segment_lengths).reshape(-1, c) & (block.input_ids != self.pad_token)
            if wrong.any():
                row, position = divmod(int(np.argmax(wrong)), c)
                raise VerifyError(f"{self._map.place(self.next_chunk + row, position)}: doc id -1 (padding) holds "
                                  f"token "
                                  f"{block.input_ids[row, position].item()}, expected pad_token {self.pad_token}")
        return ~pad

    def _check_chunk_documents(self, block: Block, segs: SegmentPlaces, real: np.ndarray) -> None:
        """Inside each chunk: no doc id twice, doc ids increasing."""
        ids = block.segment_doc_ids
        index = np.flatnonzero(real)
        by_chunk = index[np.lexsort((ids[index], segs.rows[index]))]
        same = (segs.rows[by_chunk[1:]] == segs.rows[by_chunk[:-1]]) & (ids[by_chunk[1:]] == ids[by_chunk[:-1]])
        if same.any():
            j = int(np.argmax(same))
            a, b = sorted((int(by_chunk[j]), int(by_chunk[j + 1])))
            chunk = int(segs.chunks[b])
            raise VerifyError(f"{self._map.place(chunk, int(segs.starts[b]))}: {self._map.doc(int(ids[b]))} appears "
                              f"twice in "
                              f"chunk {chunk} (segments at positions {int(segs.starts[a])} and {int(segs.starts[b])}); "
                              "a best_fit chunk holds each document at most once")
        previous = np.concatenate([[-1], ids[:-1]])
        bad = real & ~segs.is_first & (ids < previous)
        if bad.any():
            k = int(np.argmax(bad))
            chunk = int(segs.chunks[k])
            raise VerifyError(f"{self._map.place(chunk, int(segs.starts[k]))}: segment {self._map.doc(int(ids[k]))} "
                              f"follows "
                              f"doc id {int(previous[k])} in chunk {chunk}; a best_fit chunk lays out its documents in "
                              "increasing doc id order")

    def _check_shards_and_windows(self, block: Block, segs: SegmentPlaces, real: np.ndarray) -> np.ndarray:
        """Doc ids in the chunk's shard and all in one window; windows never go back. Return each chunk's window."""
        ids = block.segment_doc_ids
        beyond = real & (ids >= self._map.total_docs)
        if beyond.any():
            k = int(np.argmax(beyond))
            raise VerifyError(f"{self._map.place(int(segs.chunks[k]), int(segs.starts[k]))}: doc id {int(ids[k])} is "
                              f"in no "
                              f"shard; the shards hold counts.documents={self._map.total_docs} documents (doc ids "
                              f"0..{self._map.total_docs - 1})")
        index = np.flatnonzero(real)
        real_ids = ids[index]
        doc_shard = self._map.shard_of_docs(real_ids)
        chunk_shard = self._map.shard_of_chunks(segs.chunks[index])
        if (doc_shard != chunk_shard).any():
            k = int(index[np.argmax(doc_shard != chunk_shard)])
            chunk = int(segs.chunks[k])
            raise VerifyError(f"{self._map.place(chunk, int(segs.starts[k]))}: {self._map.doc(int(ids[k]))} is in "
                              f"chunk "
                              f"{chunk}, which lies in {self._map.chunk_shard_label(chunk)}; a shard's chunks hold "
                              f"only "
                              "its own documents (windows never span shards)")
        windows = np.full(ids.size, -1, dtype=np.int64)
        windows[index] = self._map.windows_of(real_ids)
        chunk_windows = windows[block.segment_offsets[:-1]]  # every chunk starts with a document
        mixed = real & (windows != chunk_windows[segs.rows])
        if mixed.any():
            k = int(np.argmax(mixed))
            chunk, first = int(segs.chunks[k]), int(ids[block.segment_offsets[segs.rows[k]]])
            raise VerifyError(f"{self._map.place(chunk, int(segs.starts[k]))}: {self._map.doc(int(ids[k]))} is in "
                              f"{self._map.window_label(int(windows[k]))}, but chunk {chunk} also holds "
                              f"{self._map.doc(first)} "
                              f"of {self._map.window_label(int(chunk_windows[segs.rows[k]]))}; a best_fit chunk holds "
                              "documents of one window")
        previous = np.concatenate([[self.last_window], chunk_windows[:-1]])
        back = chunk_windows < previous
        if back.any():
            row = int(np.argmax(back))
            chunk = self.next_chunk + row
            first = int(ids[block.segment_offsets[row]])
            raise VerifyError(f"{self._map.place(chunk, 0)}: {self._map.doc(first)} of "
                              f"{self._map.window_label(int(chunk_windows[row]))} "
                              f"comes after chunk {chunk - 1}, which holds "
                              f"{self._map.window_label(int(previous[row]))}; "
                              "windows are packed one after another, each into its own consecutive chunks")
        if chunk_windows.size:
            self.last_window = int(chunk_windows[-1])
        return chunk_windows

    def _advance(self, block: Block, windows: np.ndarray) -> list[Piece]:
        """Hold back the block's last window; check (and return the pieces of) the windows it completes."""
        n = windows.size
        if n == 0:
            return []
        last_start = int(np.searchsorted(windows, windows[-1]))  # windows never decrease along the chunks
        done: list[_Part] = []
        if self._pending and (last_start > 0 or self._pending[-1].windows[-1] < windows[0]):
            done, self._pending = self._pending, []
        if last_start > 0:
            done.append(self._part(block, 0, last_start, windows))
        self._pending.append(self._part(block, last_start, n, windows))
        piece = self._check_windows(done) if done else None
        return [piece] if piece is not None else []

    def _part(self, block: Block, start: int, stop: int, windows: np.ndarray) -> _Part:
        lo, hi = int(block.segment_offsets[start]), int(block.segment_offsets[stop])
        return _Part(int(block.chunk_indices[start]), windows[start:stop].copy(),
                     np.diff(block.segment_offsets[start:stop + 1]), block.segment_doc_ids[lo:hi].copy(),
                     block.segment_lengths[lo:hi].copy(),
                     block.input_ids[start:stop].copy() if self.keep_tokens else None)

    def flush(self) -> Sequence[Piece]:
        done, self._pending = self._pending, []
        piece = self._check_windows(done) if done else None
        return [piece] if piece is not None else []

    # --------------------------------------------------------------- per window

    def _check_windows(self, parts: list[_Part]) -> Piece | None:
        """Check complete windows (consecutive chunks); return their tokens in doc id order (if kept)."""
        c = self.context_length
        first_chunk = parts[0].first_chunk
        windows = np.concatenate([p.windows for p in parts])
        counts = np.concatenate([p.segment_counts for p in parts])
        ids = np.concatenate([p.segment_doc_ids for p in parts])
        lengths = np.concatenate([p.segment_lengths for p in parts]).astype(np.int64)
        segs = segment_places(first_chunk, counts, lengths, c)
        real = ids >= 0
        # documents, segments of one document in chunk order (segments are in chunk order)
        ids, lengths, chunks, starts = ids[real], lengths[real], segs.chunks[real], segs.starts[real]
        order = np.argsort(ids, kind="stable")
        doc_ids, doc_lengths = ids[order], lengths[order]
        new_doc = np.ones(doc_ids.size, dtype=bool)
        new_doc[1:] = doc_ids[1:] != doc_ids[:-1]
        doc_first = np.flatnonzero(new_doc)
        docs, totals = doc_ids[doc_first], np.add.reduceat(doc_lengths, doc_first) if doc_ids.size else doc_lengths
        self._check_document_pieces(order, new_doc, doc_ids, doc_lengths, totals, chunks, starts)
        self.num_split += int(np.count_nonzero(totals > c))
        self._check_best_fit(windows, first_chunk, segs.rows[real], ids, lengths, starts, docs, totals)
        if not self.keep_tokens:
            return None
        return self._doc_order_piece(parts, first_chunk, order, doc_ids, doc_lengths, chunks, starts)

    def _check_document_pieces(self, order: np.ndarray, new_doc: np.ndarray, doc_ids: np.ndarray,
                               doc_lengths: np.ndarray, totals: np.ndarray, chunks: np.ndarray,
                               starts: np.ndarray) -> None:
        """In chunk order, every segment of a document but its last is a full chunk of C tokens."""
        c = self.context_length
        last = np.ones(doc_ids.size, dtype=bool)
        last[:-1] = new_doc[1:]
        bad = ~last & (doc_lengths != c)
        if not bad.any():
            return
        j = int(np.argmax(bad))
        here, there = int(order[j]), int(order[j + 1])
        total = int(totals[np.cumsum(new_doc)[j] - 1])
        place = self._map.place(int(chunks[here]), int(starts[here]))
        then = f"chunk {int(chunks[there])} position {int(starts[there])}"
        doc = self._map.doc(int(doc_ids[j]))
        if total <= c:
            raise VerifyError(f"{place}: {doc} holds {total} <= C={c} tokens but is cut: {int(doc_lengths[j])} of "
                              f"them here, {int(doc_lengths[j + 1])} in {then}; best_fit never cuts a document that "
                              "fits one chunk")
        raise VerifyError(f"{place}: {doc} holds {total} > C={c} tokens; its segment here holds {int(doc_lengths[j])} "
                          f"tokens and another follows in {then}: a document longer than C is its full {c}-token "
                          f"pieces, then its remainder of {total % c or c} tokens, in chunk order")

    # --------------------------------------------------------------- against the expected layout

    def _check_best_fit(self, windows: np.ndarray, first_chunk: int, rows: np.ndarray, ids: np.ndarray,
                        lengths: np.ndarray, starts: np.ndarray, docs: np.ndarray, totals: np.ndarray) -> None:
        """Per window, best-fit decreasing over its document lengths gives its chunks, fills and segments.

        ``windows``: per chunk of the group. ``rows``/``ids``/``lengths``/``starts``: its document
        segments in chunk order (rows from 0). ``docs``/``totals``: its documents, sorted, and their lengths.
        """
        bounds = np.flatnonzero(np.diff(windows)) + 1
        chunk_starts = np.concatenate([[0], bounds]).astype(np.int64)
        chunk_stops = np.concatenate([bounds, [windows.size]]).astype(np.int64)
        run_windows = windows[chunk_starts]
        layout = expected_layout(run_windows, docs, totals, self._map.windows_of(docs), self.context_length,
                                 self.max_segments)
        self._compare_chunks(layout, run_windows, first_chunk, chunk_starts, chunk_stops)
        expected_rows = chunk_starts[layout.window_of_item] + layout.bins
        self._compare_fills(layout, expected_rows, windows, first_chunk, rows, ids, lengths)
        self._compare_segments(layout, expected_rows, windows, first_chunk, rows, ids, lengths, starts)
        self._shard_tokens += np.bincount(self._map.shard_of_docs(ids), weights=lengths,
                                          minlength=self._shard_tokens.size).astype(np.int64)

    def _compare_chunks(self, layout: ExpectedLayout, run_windows: np.ndarray, first_chunk: int,
                        chunk_starts: np.ndarray, chunk_stops: np.ndarray) -> None:
        """Each window fills as many chunks as best-fit decreasing opens for it."""
        found_chunks = chunk_stops - chunk_starts
        if (layout.num_bins != found_chunks).any():
            r = int(np.argmax(layout.num_bins != found_chunks))
            a, b = int(chunk_starts[r]), int(chunk_stops[r])
            s0 = int(layout.item_starts[r])
            tokens = int(layout.lengths[s0:s0 + int(layout.item_counts[r])].sum())
            raise VerifyError(f"{self._map.place(first_chunk + a, 0)}: {self._map.window_label(int(run_windows[r]))} "
                              f"fills chunks "
                              f"{first_chunk + a}..{first_chunk + b - 1} ({b - a} chunks, {tokens} tokens), but "
                              f"best-fit "
                              f"decreasing packs its {int(layout.item_counts[r])} pieces into "
                              f"{int(layout.num_bins[r])}: "
                              "not best-fit")

    def _compare_fills(self, layout: ExpectedLayout, expected_rows: np.ndarray, windows: np.ndarray,
                       first_chunk: int, rows: np.ndarray, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Each chunk holds as many tokens as best-fit decreasing puts in it."""
        found_fills = np.bincount(rows, weights=lengths, minlength=windows.size).astype(np.int64)
        expected_fills = np.bincount(expected_rows, weights=layout.lengths, minlength=windows.size).astype(np.int64)
        if not np.array_equal(found_fills, expected_fills):
            i = int(np.argmax(found_fills != expected_fills))
            chunk = first_chunk + i
            raise VerifyError(f"{self._map.place(chunk, int(found_fills[i]))}: chunk {chunk} holds "
                              f"{int(found_fills[i])} "
                              f"tokens (doc ids {ids[rows == i].tolist()}) of "
                              f"{self._map.window_label(int(windows[i]))}; "
                              f"best-fit decreasing fills it with {int(expected_fills[i])}: not best-fit")

    def _compare_segments(self, layout: ExpectedLayout, expected_rows: np.ndarray, windows: np.ndarray,
                          first_chunk: int, rows: np.ndarray, ids: np.ndarray, lengths: np.ndarray,
                          starts: np.ndarray) -> None:
        """Each chunk holds the segments best-fit decreasing puts in it, in doc id order."""
        order = np.argsort(expected_rows, kind="stable")  # by chunk, then doc id
        expected = (expected_rows[order], layout.doc_ids[order], layout.lengths[order])
        found = (rows, ids, lengths)
        if any(not np.array_equal(f, e) for f, e in zip(found, expected)):
            m = min(rows.size, order.size)  # equal when every document passed _check_document_pieces
            differ = np.logical_or.reduce([f[:m] != e[:m] for f, e in zip(found, expected)])
            i = int(np.argmax(differ)) if differ.any() else m - 1
            raise VerifyError(f"{self._map.place(first_chunk + int(rows[i]), int(starts[i]))}: "
                              f"{self._map.doc(int(ids[i]))} "
                              f"({int(lengths[i])} tokens) is here, where best-fit decreasing over "
                              f"{self._map.window_label(int(windows[rows[i]]))} puts doc id {int(expected[1][i])} "
                              f"({int(expected[2][i])} tokens) in chunk {first_chunk + int(expected[0][i])}: not "
                              f"best-fit")

    def _doc_order_piece(self, parts: list[_Part], first_chunk: int, order: np.ndarray, doc_ids: np.ndarray,
                         doc_lengths: np.ndarray, chunks: np.ndarray, starts: np.ndarray) -> Piece:
        """The windows' tokens in doc id order (a document's segments in chunk order), with dense doc ids."""
        c = self.context_length
        flat = np.concatenate([p.tokens for p in parts]).reshape(-1)
        sources = (chunks[order] - first_chunk) * c + starts[order]
        ends = np.cumsum(doc_lengths)
        targets = ends - doc_lengths
        gather = np.repeat(sources - targets, doc_lengths) + np.arange(int(ends[-1]) if ends.size else 0)
        segment_chunks, segment_starts = chunks[order], starts[order]

        def where(i: int) -> str:
            j = int(np.searchsorted(ends, i, side="right"))
            return self._map.place(int(segment_chunks[j]), int(segment_starts[j]) + i - int(targets[j]))

        return Piece(flat[gather], np.repeat(doc_ids, doc_lengths), where)

    def finish(self, manifest: dict[str, Any], where: str) -> None:
        super().finish(manifest, where)
        wrong = self._shard_tokens != self._map.recorded_tokens
        if wrong.any():
            k = int(np.argmax(wrong))
            first, n = int(self._map.shard_first[k]), int(self._map.shard_chunks[k])
            raise VerifyError(f"{where}: shards[{k}] ({self._map.shard_paths[k]}): "
                              f"num_tokens={int(self._map.recorded_tokens[k])} "
                              f"but its chunks {first}..{first + n - 1} hold {int(self._shard_tokens[k])} tokens")

