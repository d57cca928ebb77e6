"""Tests for raypack.rules.masks: literal cases, properties against a naive reference, validation.

The reference below applies the rule of the masks module docstring verbatim, one (i, j) pair
at a time: i may attend to j iff j <= i and doc_ids[j] == doc_ids[i] and doc_ids[i] != -1.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from raypack.rules import masks
from raypack.rules.masks import (
    VarlenInfo,
    build_bool_mask,
    build_intra_document_mask,
    cu_seqlens,
    loss_mask,
    position_ids,
)

NEG_INF = -np.inf
FLOAT_DTYPES = [np.float16, np.float32, np.float64]
ALL_FUNCTIONS = [build_intra_document_mask, build_bool_mask, cu_seqlens, position_ids, loss_mask]


# --- naive reference and helpers ------------------------------------------------------------


def reference_allowed(doc_ids) -> np.ndarray:
    """(L,) -> (L, L) or (B, L) -> (B, L, L) bool: the rule, applied pair by pair."""
    ids = np.asarray(doc_ids)
    if ids.ndim == 2:
        return np.stack([reference_allowed(row) for row in ids])
    size = ids.size
    allowed = np.zeros((size, size), dtype=bool)
    for i in range(size):
        for j in range(size):
            allowed[i, j] = j <= i and ids[j] == ids[i] and ids[i] != -1
    return allowed


def runs_of(row) -> list[tuple[int, int, int]]:
    """Maximal runs of one (L,) row as (start, end, doc_id), by a plain loop."""
    runs: list[tuple[int, int, int]] = []
    for i, doc_id in enumerate(np.asarray(row).tolist()):
        if runs and runs[-1][2] == doc_id:
            runs[-1] = (runs[-1][0], i + 1, doc_id)
        else:
            runs.append((i, i + 1, doc_id))
    return runs


def is_contiguous(row) -> bool:
    """True if every real id occupies one run (number of real runs == distinct real ids)."""
    real = [doc_id for _, _, doc_id in runs_of(row) if doc_id != -1]
    return len(real) == len(set(real))


def as_rows(doc_ids) -> np.ndarray:
    ids = np.asarray(doc_ids)
    return ids[None] if ids.ndim == 1 else ids


# --- strategies -----------------------------------------------------------------------------


@st.composite
def contiguous_rows(draw, length: int) -> list[int]:
    """Sorted ids (possibly skipping some), each in one run, then 0..L padding positions."""
    num_pad = draw(st.one_of(st.just(0), st.integers(0, length)))
    max_doc_len = draw(st.sampled_from([1, 3, 20]))  # many tiny runs take a grouped path
    ids: list[int] = []
    doc_id = draw(st.integers(0, 3))
    while len(ids) < length - num_pad:
        ids += [doc_id] * draw(st.integers(1, max_doc_len))
        doc_id += draw(st.integers(1, 3))
    return ids[: length - num_pad] + [-1] * num_pad


def arbitrary_rows(length: int) -> st.SearchStrategy[list[int]]:
    """Any ids in [-1, 4]: non-contiguous repeats, padding anywhere."""
    return st.lists(st.integers(-1, 4), min_size=length, max_size=length)


@st.composite
def doc_ids_arrays(draw, contiguous_only: bool = False) -> np.ndarray:
    """(L,) or (B, L) int64 doc ids, L in 1..64, B in 1..4; rows mix both kinds unless told."""
    length = draw(st.integers(1, 64))
    row = contiguous_rows(length) if contiguous_only else st.one_of(
        contiguous_rows(length), arbitrary_rows(length)
    )
    if draw(st.booleans()):
        return np.array(draw(row), dtype=np.int64)
    return np.array(draw(st.lists(row, min_size=1, max_size=4)), dtype=np.int64)


def tally(seen: Counter, doc_ids: np.ndarray) -> None:
    """Count the features a test needs to have seen for its checks to mean something."""
    seen["batched"] += doc_ids.ndim == 2
    for row in as_rows(doc_ids):
        runs = runs_of(row)
        seen["multi_segment"] += sum(doc_id != -1 for _, _, doc_id in runs) > 1
        seen["many_tiny_runs"] += len(runs) > 16 and max(end - start for start, end, _ in runs) == 1
        seen["padding"] += -1 in row
        seen["contiguous"] += is_contiguous(row)
        seen["non_contiguous"] += not is_contiguous(row)


# --- literal cases --------------------------------------------------------------------------


def test_additive_mask_literal():
    o, x = 0.0, NEG_INF
    expected = np.array(
        [
            [o, x, x, x, x, x],
            [o, o, x, x, x, x],
            [x, x, o, x, x, x],
            [x, x, o, o, x, x],
            [x, x, o, o, o, x],
            [x, x, x, x, x, x],
        ],
        dtype=np.float32,
    )
    mask = build_intra_document_mask(np.array([0, 0, 1, 1, 1, -1]))
    assert mask.dtype == np.float32
    np.testing.assert_array_equal(mask, expected)


def test_bool_mask_literal_leading_and_inner_padding():
    t, f = True, False
    expected = np.array(
        [
            [f, f, f, f, f, f],
            [f, f, f, f, f, f],
            [f, f, t, f, f, f],
            [f, f, t, t, f, f],
            [f, f, f, f, f, f],
            [f, f, f, f, f, t],
        ]
    )
    np.testing.assert_array_equal(build_bool_mask([-1, -1, 4, 4, -1, 9]), expected)


def test_non_contiguous_repeat_is_exact():
    t, f = True, False
    expected = np.array([[t, f, f, f], [t, t, f, f], [f, f, t, f], [t, t, f, t]])
    np.testing.assert_array_equal(build_bool_mask(np.array([3, 3, 5, 3])), expected)
    mask = build_intra_document_mask(np.array([3, 3, 5, 3]), dtype=np.float64)
    np.testing.assert_array_equal(mask, np.where(expected, 0.0, NEG_INF))
    # The segment forms describe runs (maximal, within a row), not documents:
    assert cu_seqlens([3, 3, 5, 3]).cu_seqlens.tolist() == [0, 2, 3, 4]
    assert position_ids([3, 3, 5, 3]).tolist() == [0, 1, 0, 0]


def test_segment_forms_literal():
    doc_ids = np.array([0, 0, 1, 1, 1, -1, -1, -1])
    info = cu_seqlens(doc_ids)
    assert isinstance(info, VarlenInfo)
    assert info.cu_seqlens.dtype == np.int32
    assert info.cu_seqlens.tolist() == [0, 2, 5, 8]
    assert info.max_seqlen == 3
    assert position_ids(doc_ids).tolist() == [0, 1, 0, 1, 2, 0, 1, 2]
    assert position_ids(doc_ids).dtype == np.int64
    assert loss_mask(doc_ids).tolist() == [True] * 5 + [False] * 3


def test_batch_literal_runs_never_cross_rows():
    doc_ids = np.array([[0, 0, 1], [1, 1, -1]])
    info = cu_seqlens(doc_ids)
    assert info.cu_seqlens.tolist() == [0, 2, 3, 5, 6]
    assert info.max_seqlen == 2
    assert cu_seqlens([[7, 7], [7, 7]]).cu_seqlens.tolist() == [0, 2, 4]
    assert position_ids(doc_ids).tolist() == [[0, 1, 0], [0, 1, 0]]
    t, f = True, False
    expected = np.array(
        [[[t, f, f], [t, t, f], [f, f, t]], [[t, f, f], [t, t, f], [f, f, f]]]
    )
    np.testing.assert_array_equal(build_bool_mask(doc_ids), expected)
    assert build_intra_document_mask(doc_ids).shape == (2, 3, 3)


def test_empty_inputs():
    assert build_intra_document_mask(np.zeros(0, np.int64)).shape == (0, 0)
    assert build_bool_mask(np.zeros((2, 0), np.int64)).shape == (2, 0, 0)
    info = cu_seqlens(np.zeros(0, np.int64))
    assert info.cu_seqlens.tolist() == [0] and info.max_seqlen == 0
    assert position_ids(np.zeros((3, 0), np.int64)).shape == (3, 0)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint16, np.int64])
def test_any_integer_dtype_is_accepted(dtype):
    doc_ids = np.array([0, 0, 1, 2, 2], dtype=dtype)
    np.testing.assert_array_equal(build_bool_mask(doc_ids), reference_allowed(doc_ids))
    assert cu_seqlens(doc_ids).cu_seqlens.tolist() == [0, 2, 3, 5]


def broadcast_allowed(ids: np.ndarray) -> np.ndarray:
    """The rule, vectorised: a second reference for sizes the double loop is too slow for."""
    index = np.arange(ids.size)
    return (index[None] <= index[:, None]) & (ids[None] == ids[:, None]) & (ids[:, None] != -1)


def large_cases(rng: np.random.Generator):
    for size in (257, 1000):
        lengths = np.maximum(1, rng.lognormal(np.log(size / 6), 1.0, size).astype(np.int64))
        ids = np.repeat(np.arange(lengths.size) * 2, lengths)[: size - 13]
        yield np.concatenate([ids, np.full(13, -1)])
    # Many tiny runs, padding between them: the grouped short-run path.
    lengths = rng.integers(1, 4, size=400)
    ids = np.repeat(np.where(np.arange(400) % 3 == 2, -1, np.arange(400)), lengths)
    yield ids[:999]


def test_large_contiguous_matches_broadcast_formula(monkeypatch):
    grouped_calls = []
    fill_short_runs = masks._fill_short_runs
    monkeypatch.setattr(
        masks, "_fill_short_runs", lambda *args: grouped_calls.append(1) or fill_short_runs(*args)
    )
    for ids in large_cases(np.random.default_rng(7)):
        allowed = broadcast_allowed(ids)
        assert is_contiguous(ids) and allowed.any()
        np.testing.assert_array_equal(build_bool_mask(ids), allowed)
        np.testing.assert_array_equal(
            build_intra_document_mask(ids), np.where(allowed, 0.0, NEG_INF).astype(np.float32)
        )
    assert grouped_calls, "no case took the grouped path for many short runs"


def test_contiguous_ids_take_the_fast_path(monkeypatch):
    def refuse(*args):
        raise AssertionError("literal fallback used for contiguous doc ids")

    monkeypatch.setattr(masks, "_fill_literal", refuse)
    contiguous = ([0, 0, 1, 1, 1, -1], [-1, -1, 4, 4, -1, 9], [[5, 5, 6], [6, 7, -1]], [2],
                  [9, 9, 2, 2, -1, 4])  # the last: contiguous although ids decrease
    for doc_ids in contiguous:
        np.testing.assert_array_equal(build_bool_mask(doc_ids), reference_allowed(doc_ids))
    with pytest.raises(AssertionError, match="literal fallback"):
        build_bool_mask([3, 3, 5, 3])


def test_result_is_fresh_and_writable():
    doc_ids = np.array([0, 0, 0, 1, -1])
    first = build_intra_document_mask(doc_ids)
    assert first.flags.writeable and first.flags.c_contiguous
    first[...] = 7.0
    np.testing.assert_array_equal(
        build_intra_document_mask(doc_ids), np.where(reference_allowed(doc_ids), 0.0, NEG_INF)
    )


def test_documented_nan_remedy_leaves_mask_untouched():
    doc_ids = np.array([[0, 0, -1], [1, -1, -1]])
    mask = build_intra_document_mask(doc_ids, dtype=np.float64)
    scores = np.zeros(mask.shape)
    with np.errstate(invalid="ignore"):
        raw = np.exp(scores + mask) / np.exp(scores + mask).sum(-1, keepdims=True)
    assert np.isnan(raw[~loss_mask(doc_ids)]).all()
    assert not np.isnan(raw[loss_mask(doc_ids)]).any()
    # The remedy from the build_intra_document_mask docstring, verbatim:
    bias = mask.copy()
    rows = np.nonzero(~loss_mask(doc_ids))
    bias[rows + rows[-1:]] = 0.0
    fixed = np.exp(scores + bias) / np.exp(scores + bias).sum(-1, keepdims=True)
    assert not np.isnan(fixed).any()
    np.testing.assert_array_equal(fixed[loss_mask(doc_ids)], raw[loss_mask(doc_ids)])
    np.testing.assert_array_equal(mask, build_intra_document_mask(doc_ids, dtype=np.float64))


# --- properties against the reference -------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_masks_match_reference(dtype):
    seen: Counter = Counter()

    @settings(max_examples=60, deadline=None)
    @given(doc_ids_arrays())
    @example(np.array([3, 3, 5, 3]))
    @example(np.array([1, -1, 1, -1, -1]))
    @example(np.array([[0, 0, 1, -1], [2, 2, 2, 2]]))
    def check(doc_ids):
        tally(seen, doc_ids)
        allowed = reference_allowed(doc_ids)
        mask = build_intra_document_mask(doc_ids, dtype=dtype)
        assert mask.dtype == dtype
        assert mask.shape == doc_ids.shape + doc_ids.shape[-1:]
        np.testing.assert_array_equal(mask, np.where(allowed, 0.0, NEG_INF).astype(dtype))
        np.testing.assert_array_equal(build_bool_mask(doc_ids), mask == 0)

    check()
    for feature in ("batched", "multi_segment", "padding", "contiguous", "non_contiguous"):
        assert seen[feature] > 0, f"no generated example had {feature}: {seen}"


def test_segment_forms_agree_with_masks_on_contiguous_ids():
    seen: Counter = Counter()

    @settings(max_examples=150, deadline=None)
    @given(doc_ids_arrays(contiguous_only=True))
    @example(np.array([[1, 1, 1], [1, 1, -1]]))
    def check(doc_ids):
        tally(seen, doc_ids)
        rows = as_rows(doc_ids)
        length = rows.shape[1]
        info = cu_seqlens(doc_ids)
        expected_bounds = [row_index * length + start for row_index, row in enumerate(rows)
                           for start, _, _ in runs_of(row)] + [rows.size]
        assert info.cu_seqlens.tolist() == expected_bounds
        assert info.max_seqlen == max(np.diff(expected_bounds))
        positions = as_rows(position_ids(doc_ids))
        allowed = build_bool_mask(doc_ids).reshape(rows.shape + (length,))
        for row_index, row in enumerate(rows):
            for start, end, doc_id in runs_of(row):
                assert positions[row_index, start:end].tolist() == list(range(end - start))
                for i in range(start, end):
                    columns = np.flatnonzero(allowed[row_index, i]).tolist()
                    first = i - positions[row_index, i]
                    assert columns == (list(range(first, i + 1)) if doc_id != -1 else [])
        np.testing.assert_array_equal(loss_mask(doc_ids), doc_ids != -1)
        assert position_ids(doc_ids).shape == loss_mask(doc_ids).shape == doc_ids.shape

    check()
    for feature in ("batched", "multi_segment", "padding", "many_tiny_runs"):
        assert seen[feature] > 0, f"no generated example had {feature}: {seen}"
    assert seen["non_contiguous"] == 0


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize("function", ALL_FUNCTIONS)
def test_rejects_3d_doc_ids(function):
    with pytest.raises(ValueError, match=r"shape \(2, 2, 2\).*\(L,\).*\(B, L\)"):
        function(np.zeros((2, 2, 2), np.int64))


@pytest.mark.parametrize("function", ALL_FUNCTIONS)
def test_rejects_scalar_doc_ids(function):
    with pytest.raises(ValueError, match=r"shape \(\)"):
        function(np.int64(3))


@pytest.mark.parametrize("function", ALL_FUNCTIONS)
@pytest.mark.parametrize("bad", [np.array([0.0, 1.0]), np.array([True, False]), ["a", "b"]])
def test_rejects_non_integer_doc_ids(function, bad):
    with pytest.raises(TypeError, match=rf"dtype {np.asarray(bad).dtype}; it must be an integer"):
        function(bad)


@pytest.mark.parametrize("function", ALL_FUNCTIONS)
def test_rejects_ids_below_padding(function):
    with pytest.raises(ValueError, match=r"contains -2; ids must be >= 0, or -1"):
        function(np.array([0, -2, 1]))


@pytest.mark.parametrize("dtype", [np.int32, bool, np.complex64, "int8"])
def test_rejects_non_float_mask_dtype(dtype):
    with pytest.raises(TypeError, match=rf"dtype={np.dtype(dtype)} cannot hold an additive mask"):
        build_intra_document_mask(np.array([0, 0, 1]), dtype=dtype)


def test_rejects_unknown_mask_dtype():
    with pytest.raises(TypeError, match="is not a numpy dtype"):
        build_intra_document_mask(np.array([0]), dtype="bfloat-ish")


def test_cu_seqlens_rejects_more_positions_than_int32_holds():
    doc_ids = np.broadcast_to(np.int64(0), (2, 2**30))  # 2**31 positions, no memory
    with pytest.raises(ValueError, match=r"2147483648 positions; cu_seqlens is int32"):
        cu_seqlens(doc_ids)
