"""The expected layout of best_fit windows: what best-fit decreasing must have produced.

:func:`expected_layout` re-runs the packer's own rules (:func:`raypack.strategies.best_fit.rules.split_items`,
:func:`raypack.strategies.best_fit.rules.best_fit_decreasing`) on the documents of some complete windows and
returns, per piece, the chunk of its window it must land in. :mod:`raypack.strategies.best_fit.verify`
compares the chunks it read with that layout. Pure numpy: no file, no message.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from raypack.strategies.best_fit.rules import best_fit_decreasing, split_items

__all__ = ["ExpectedLayout", "expected_layout"]


class ExpectedLayout(NamedTuple):
    """Best-fit decreasing over R consecutive windows holding P pieces (items), in stream order.

    doc_ids: (P,) int64, the piece's document.  lengths: (P,) int64, its tokens (1..C).
    window_of_item: (P,) int64, the piece's window, numbered 0..R-1 in the order given.
    item_starts, item_counts: (R,) int64, each window's pieces are ``[start, start + count)``.
    bins: (P,) int64, the chunk of its window the piece lands in (from 0, in opening order).
    num_bins: (R,) int64, chunks per window.
    """

    doc_ids: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    window_of_item: npt.NDArray[np.int64]
    item_starts: npt.NDArray[np.int64]
    item_counts: npt.NDArray[np.int64]
    bins: npt.NDArray[np.int64]
    num_bins: npt.NDArray[np.int64]


def expected_layout(windows: np.ndarray, docs: np.ndarray, totals: np.ndarray, doc_windows: np.ndarray,
                    context_length: int, max_segments: int | None = None) -> ExpectedLayout:
    """The layout best-fit decreasing gives the documents of ``windows`` (R global window ids, increasing).

    ``docs``/``totals``/``doc_windows``: the windows' documents (sorted doc ids), their lengths and
    global window ids; every window holds a document. Cost: best_fit_decreasing runs once per window,
    except for windows of one piece or whose pieces all exceed C/2 (one chunk each, longest first,
    ties in stream order; at most two segments, so within any ``max_segments``): those are laid
    out vectorised. ``max_segments``: the manifest's ``best_fit_max_segments`` (None: no limit).
    """
    c = context_length
    items = split_items(totals, c)  # in stream order: each window's items are contiguous
    item_windows = doc_windows[items.doc_index]
    item_starts = np.searchsorted(item_windows, windows)
    item_counts = np.diff(np.append(item_starts, item_windows.size))
    run_of_item = np.repeat(np.arange(windows.size), item_counts)
    bins = np.empty(items.lengths.size, dtype=np.int64)
    num_bins = item_counts.copy()
    all_long = np.logical_and.reduceat(2 * items.lengths > c, item_starts) | (item_counts == 1)
    fast = np.flatnonzero(all_long[run_of_item])
    by_length = fast[np.lexsort((-items.lengths[fast], run_of_item[fast]))]  # stable: ties in stream order
    fast_counts = np.bincount(run_of_item[fast], minlength=windows.size)
    bins[by_length] = np.arange(by_length.size) - (np.cumsum(fast_counts) - fast_counts)[run_of_item[by_length]]
    for r in np.flatnonzero(~all_long).tolist():
        s0, s1 = int(item_starts[r]), int(item_starts[r] + item_counts[r])
        bins[s0:s1], num_bins[r] = best_fit_decreasing(items.lengths[s0:s1], c, max_segments)
    return ExpectedLayout(docs[items.doc_index], items.lengths, run_of_item, item_starts, item_counts, bins, num_bins)
