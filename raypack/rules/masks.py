"""Attention masks and varlen metadata for packed chunks. Pure numpy, no Ray, no I/O.

The rule (the one mask convention; every function here follows it):
  ``doc_ids`` gives, for each position of a packed chunk, the global index of the document it
  came from, ``-1`` on padding. Position ``i`` may attend to position ``j`` iff

      j <= i  and  doc_ids[j] == doc_ids[i]  and  doc_ids[i] != -1

  The additive form is ``0.0`` where allowed and ``-inf`` elsewhere; the boolean form is
  ``True`` where allowed. A padding row allows nothing (see ``build_intra_document_mask`` for
  what that means for softmax).

Forms, all derived from the rule:
  * ``build_intra_document_mask``: additive mask, (L,) -> (L, L), (B, L) -> (B, L, L).
  * ``build_bool_mask``: boolean mask, same shapes.
  * ``cu_seqlens``: flash-attn varlen boundaries of the *segments* (maximal runs of one id
    within a row) over the flattened batch, plus ``max_seqlen``.
  * ``pad_cu_seqlens``: ``cu_seqlens`` padded with zero-length segments to a fixed shape.
  * ``position_ids``: offset of each position from the start of its segment.
  * ``loss_mask``: ``True`` on real tokens.

The masks are exact for any ``doc_ids``, including an id that reappears after another id
(``[3, 3, 5, 3]``: position 3 attends to 0, 1 and 3). ``cu_seqlens`` and ``position_ids``
describe segments, so they agree with the masks exactly when every distinct id occupies one
contiguous run in its row, which packing guarantees (doc ids increase along the stream).

Input rules, shared by every function: ``doc_ids`` is array-like of shape (L,) or (B, L) with
an integer dtype and values ``>= -1``; anything else raises ``TypeError`` (dtype) or
``ValueError`` (shape, values).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = [
    "VarlenInfo",
    "build_bool_mask",
    "build_intra_document_mask",
    "cu_seqlens",
    "loss_mask",
    "pad_cu_seqlens",
    "position_ids",
]

PAD_ID = -1
_GROUP_FACTOR = 8  # a grouped window copy costs about as much as 8 per-run copies
_MASK_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class VarlenInfo(NamedTuple):
    """Segment boundaries in flash-attn ``*_varlen_*`` form.

    cu_seqlens: (S + 1,) int32; ``cu_seqlens[k]:cu_seqlens[k + 1]`` is segment ``k`` of the
                flattened (B * L,) batch; starts at 0, ends at B * L.
    max_seqlen: length of the longest segment (0 when there are no positions).
    """

    cu_seqlens: npt.NDArray[np.int32]
    max_seqlen: int


def _validate_doc_ids(doc_ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Return ``doc_ids`` as an int64 array of shape (L,) or (B, L), or raise."""
    arr = np.asarray(doc_ids)
    if arr.dtype.kind not in "iu":
        raise TypeError(
            f"doc_ids has dtype {arr.dtype}; it must be an integer dtype (e.g. int64), "
            "-1 marking padding"
        )
    if arr.ndim not in (1, 2):
        raise ValueError(
            f"doc_ids has shape {arr.shape}; it must be (L,) for one chunk or (B, L) for a batch"
        )
    arr = arr.astype(np.int64, copy=False)
    lowest = arr.min(initial=PAD_ID)
    if lowest < PAD_ID:
        raise ValueError(f"doc_ids contains {lowest}; ids must be >= 0, or -1 for padding")
    return arr


def _validate_mask_dtype(dtype: npt.DTypeLike) -> np.dtype:
    """Return ``dtype`` as a float16/32/64 ``np.dtype``, or raise TypeError."""
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype={dtype!r} is not a numpy dtype; use np.float32") from e
    if dt not in _MASK_DTYPES:
        raise TypeError(
            f"dtype={dt} cannot hold an additive mask; use float16, float32 or float64"
        )
    return dt


def _segment_starts(doc_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """(..., L) bool: True where a segment (maximal run of one id within a row) starts."""
    starts = np.ones(doc_ids.shape, dtype=bool)
    np.not_equal(doc_ids[..., 1:], doc_ids[..., :-1], out=starts[..., 1:])
    return starts


def _runs(row: npt.NDArray[np.int64]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segments of one non-empty (L,) row: (R,) starts, (R,) lengths, (R,) run ids."""
    changes = np.flatnonzero(row[1:] != row[:-1]) + 1
    starts = np.concatenate(([0], changes))
    return starts, np.concatenate((changes, [row.size])) - starts, row[starts]


def _is_contiguous(run_ids: npt.NDArray[np.int64]) -> bool:
    """True if no real id occurs in two runs (padding runs may repeat: they allow nothing).

    That is, the number of real runs equals the number of distinct real ids; increasing run
    ids (what packing produces) answer without sorting.
    """
    real = run_ids[run_ids != PAD_ID]
    return bool(np.all(real[1:] > real[:-1])) or np.unique(real).size == real.size


def _fill_fast(
    out: np.ndarray, row: npt.NDArray[np.int64], runs: tuple[np.ndarray, ...], allow, block
) -> None:
    """Write the (L, L) mask of a non-empty contiguous row (and its ``_runs``) into ``out``.

    1. Read ``out`` flat. Before the allowed run [s, i] of row i (segment [s, e)) lie the
       tail of row i - 1 and the head of row i, all blocked. So row i "owns" the period
       flat[i (L + 1) - L : i (L + 1) + 1] of L + 1 elements: ``block * (L + 1 - w)`` then
       ``allow * w`` with window ``w = i - s + 1`` (0 on padding). Periods tile flat[1:];
       element 0 is written directly.
    2. Window w is the slice ``template[w : w + L + 1]`` of ``[block] * (L + 1) + [allow] * L``,
       and the periods of consecutive rows are consecutive in memory, so a run is one
       strided copy (a sliding-window view, as ``as_strided`` makes) into an (e - s, L + 1)
       view of ``out``: one contiguous row copy per mask row. Padding runs are one fill.
    3. Many short runs (each <= sqrt(L), more than ``_GROUP_FACTOR`` per window they need)
       instead have their rows grouped by window: one fancy-indexed copy per window.
    Cost: each of the L * L elements written once; O(sqrt(L)) numpy calls per row.
    """
    size, dtype, step = row.size, out.dtype, out.itemsize
    period = size + 1
    template = np.empty(2 * size + 1, dtype=dtype)
    template[:period], template[period:] = block, allow
    flat = out.reshape(-1)
    flat[0] = block if row[0] == PAD_ID else allow
    periods = np.ndarray((size - 1, period), dtype, flat, step, (period * step, step))
    starts, lengths, run_ids = runs
    own_copy = _runs_with_own_copy(lengths, size)
    if own_copy is None:
        _copy_runs(periods, template, starts, lengths, run_ids, block)
        return
    _copy_runs(periods, template, starts[own_copy], lengths[own_copy], run_ids[own_copy], block)
    _fill_short_runs(periods, template, row, starts, lengths, ~own_copy)


def _copy_runs(
    periods: np.ndarray,
    template: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    run_ids: np.ndarray,
    block,
) -> None:
    """Write the periods of each given run: one strided window copy, or a fill if padding."""
    dtype, step = template.dtype, template.itemsize
    period = periods.shape[1]
    for start, length, doc_id in zip(starts.tolist(), lengths.tolist(), run_ids.tolist()):
        first, end = max(start, 1), start + length
        if doc_id == PAD_ID:
            periods[first - 1 : end - 1] = block
            continue
        offset = (first - start + 1) * step
        windows = np.ndarray((end - first, period), dtype, template, offset, (step, step))
        periods[first - 1 : end - 1] = windows


def _runs_with_own_copy(lengths: np.ndarray, size: int) -> npt.NDArray[np.bool_] | None:
    """(R,) bool: runs copied one by one, the others grouped by window; None if all are."""
    if lengths.size <= _GROUP_FACTOR:
        return None
    is_short = lengths <= math.isqrt(size)
    num_windows = lengths[is_short].max(initial=0)
    if np.count_nonzero(is_short) <= _GROUP_FACTOR * num_windows:
        return None
    return ~is_short


def _fill_short_runs(
    periods: np.ndarray,
    template: np.ndarray,
    row: npt.NDArray[np.int64],
    starts: np.ndarray,
    lengths: np.ndarray,
    is_short: npt.NDArray[np.bool_],
) -> None:
    """Copy the window of every row (>= 1) of the short runs, one numpy call per window."""
    run_of_row = np.repeat(np.arange(lengths.size), lengths)
    rows = np.flatnonzero(is_short[run_of_row])
    rows = rows[rows > 0]
    windows = np.where(row[rows] == PAD_ID, 0, rows - starts[run_of_row[rows]] + 1)
    for window in np.unique(windows).tolist():
        periods[rows[windows == window] - 1] = template[window : window + periods.shape[1]]


def _fill_literal(out: np.ndarray, row: np.ndarray, allow, block) -> None:
    """Write the (L, L) mask of any row into ``out`` by broadcasting the rule verbatim."""
    size = row.size
    causal = np.arange(size)[None, :] <= np.arange(size)[:, None]
    allowed = causal & (row[None, :] == row[:, None]) & (row[:, None] != PAD_ID)
    out[...] = block
    out[allowed] = allow


def _build_mask(doc_ids: npt.ArrayLike, dtype: np.dtype, allow, block) -> np.ndarray:
    """(L,) -> (L, L) or (B, L) -> (B, L, L) mask of ``dtype`` holding ``allow``/``block``."""
    ids = _validate_doc_ids(doc_ids)
    rows = ids[None] if ids.ndim == 1 else ids
    size = rows.shape[1]
    out = np.empty((rows.shape[0], size, size), dtype=dtype)
    if size == 0:
        return out.reshape(ids.shape + (size,))
    for row, row_out in zip(rows, out):
        runs = _runs(row)
        if _is_contiguous(runs[2]):
            _fill_fast(row_out, row, runs, allow, block)
        else:
            _fill_literal(row_out, row, allow, block)
    return out.reshape(ids.shape + (size,))


def build_intra_document_mask(
    doc_ids: npt.ArrayLike, dtype: npt.DTypeLike = np.float32
) -> npt.NDArray[np.floating]:
    """Additive attention mask following the module rule: 0.0 where allowed, -inf elsewhere.

    doc_ids: (L,) or (B, L) integer array, -1 on padding.
    dtype:   float16, float32 or float64 (else TypeError).
    Returns: (L, L) or (B, L, L) array of ``dtype``; ``mask[..., i, j]`` is the bias to add
             to the attention score of query i on key j. A fresh, writable array.

    Exact for any ``doc_ids``. When every real id occupies one contiguous run in its row
    (what packing produces) each element is written once from a strided causal template,
    about the cost of ``np.full((L, L), -inf)`` (up to ~2x with hundreds of tiny documents
    per row); otherwise the rule is broadcast literally (several (L, L) temporaries).

    Padding rows are all -inf, so a softmax over such a row is NaN (0 / 0); torch's
    scaled_dot_product_attention returns NaN outputs for those queries. The mask stays that
    way on purpose (padding allows nothing); remedies that leave it untouched:

        out = torch.nan_to_num(sdpa(q, k, v, attn_mask=bias), nan=0.0)  # after attention

        bias = mask.copy()                       # before softmax: padding attends to itself
        rows = np.nonzero(~loss_mask(doc_ids))   # (i,) or (b, i) of padding positions
        bias[rows + rows[-1:]] = 0.0             # bias[..., i, i] = 0.0

    Either way, weight the loss with ``loss_mask(doc_ids)`` so padding positions never
    contribute: ``(token_loss * loss_mask).sum() / loss_mask.sum()``.
    """
    dt = _validate_mask_dtype(dtype)
    return _build_mask(doc_ids, dt, dt.type(0.0), dt.type(-np.inf))


def build_bool_mask(doc_ids: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Boolean attention mask following the module rule: True where allowed.

    doc_ids: (L,) or (B, L) integer array, -1 on padding.
    Returns: (L, L) or (B, L, L) bool array, ``build_intra_document_mask(doc_ids) == 0``.
             Same fast path as the additive form. Padding rows are all False.
    """
    return _build_mask(doc_ids, np.dtype(bool), True, False)


def cu_seqlens(doc_ids: npt.ArrayLike) -> VarlenInfo:
    """Segment boundaries for flash-attn varlen kernels, following the module rule.

    doc_ids: (L,) or (B, L) integer array, -1 on padding.
    Returns: ``VarlenInfo(cu_seqlens, max_seqlen)``; ``cu_seqlens`` is (S + 1,) int32 over the
             flattened (B * L,) positions. A segment is a maximal run of one id within a row;
             a row boundary always ends a segment, even if the id continues in the next row.

    Causal attention within each segment equals the mask of the rule when every real id is
    one contiguous run per row, except on padding: padding runs form their own segment(s)
    and the kernel lets them attend within it. Exclude them from the loss with
    ``loss_mask(doc_ids)``.
    """
    ids = _validate_doc_ids(doc_ids)
    if ids.size > np.iinfo(np.int32).max:
        raise ValueError(f"doc_ids has {ids.size} positions; cu_seqlens is int32, split the batch")
    starts = np.flatnonzero(_segment_starts(ids).ravel())
    bounds = np.append(starts, ids.size).astype(np.int32)
    max_seqlen = int(np.diff(bounds).max()) if starts.size else 0
    return VarlenInfo(bounds, max_seqlen)


def pad_cu_seqlens(bounds: npt.ArrayLike, max_segments: int) -> npt.NDArray[np.int32]:
    """``cu_seqlens`` padded to a fixed shape, for CUDA graphs and ``torch.compile``.

    bounds:       (S + 1,) offsets from :func:`cu_seqlens` (S segments, padding runs included).
    max_segments: the fixed segment count N >= S.
    Returns: (N + 1,) int32, ``bounds`` then N - S copies of its last offset: zero-length
             segments at the end, which flash-attn varlen kernels accept. O(N).
    Raises ValueError when S > N; segments are never merged (documents would see each other).
    """
    bounds = np.asarray(bounds, dtype=np.int32)
    num_segments = bounds.size - 1
    if num_segments > max_segments:
        raise ValueError(f"the batch has {num_segments} segments (runs of one doc id per row, padding runs "
                         f"included) and max_segments={max_segments}; raise max_segments or use a smaller batch")
    return np.pad(bounds, (0, max_segments - num_segments), mode="edge")


def position_ids(doc_ids: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Position of each token within its segment, following the module rule.

    doc_ids: (L,) or (B, L) integer array, -1 on padding.
    Returns: int64 array of the same shape; 0 at the start of each segment (maximal run of one
             id within a row), counting up by 1. Padding runs count the same way (0, 1, ...);
             those positions are excluded by ``loss_mask``. For contiguous ids, a real
             position i attends to exactly the columns [i - position_ids[i], i].
    """
    ids = _validate_doc_ids(doc_ids)
    index = np.broadcast_to(np.arange(ids.shape[-1], dtype=np.int64), ids.shape)
    segment_start = np.where(_segment_starts(ids), index, 0)
    np.maximum.accumulate(segment_start, axis=-1, out=segment_start)
    return index - segment_start


def loss_mask(doc_ids: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """True on real tokens (``doc_ids != -1``), following the module rule.

    doc_ids: (L,) or (B, L) integer array, -1 on padding.
    Returns: bool array of the same shape.
    """
    return _validate_doc_ids(doc_ids) != PAD_ID
