"""raypack.strategies.best_fit.rules against its rules: literal cases, properties against the naive reference
(tests/reference.py ``naive_best_fit``, one item at a time), batch-split invariance, the
promises best_fit makes (no short document cut, pieces in order, padding only at chunk ends),
statistics from lengths alone, and bad input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raypack.rules.masks import build_intra_document_mask
from raypack.strategies.best_fit.rules import (
    BestFitChunkCounter,
    BestFitPacker,
    best_fit_decreasing,
    best_fit_stats,
    pack_best_fit,
    split_items,
)

from reference import naive_best_fit

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def corpora(draw, max_docs=40):
    """Documents (lists of token ids) with lengths around and far beyond C, and C itself."""
    c = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.one_of(st.integers(0, c), st.integers(0, 4 * c + 1), st.sampled_from([0, c, 2 * c])),
                            max_size=max_docs))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 1000, size=n).tolist() for n in lengths]
    return docs, c


# ----------------------------------------------------------------------------- literal


def test_literal_example():
    # C=10; lengths 3, 7, 5, 5, 12 -> items 3, 7, 5, 5, 10, 2 (doc 4 = a full piece + remainder 2).
    docs = [[1] * 3, [2] * 7, [3] * 5, [4] * 5, list(range(100, 112))]
    input_ids, doc_ids = pack_best_fit(docs, 10, 0)
    want_ids = [
        list(range(100, 110)),            # 10 (doc 4, piece 0) opens chunk 0, full
        [1] * 3 + [2] * 7,                # 7 opens chunk 1; 3 (doc 0) later fills it; by doc id
        [3] * 5 + [4] * 5,                # 5 (doc 2) opens chunk 2; 5 (doc 3) fits it exactly
        [110, 111] + [0] * 8,             # 2 (doc 4's remainder) fits nowhere: chunk 3, padded
    ]
    want_docs = [[4] * 10, [0] * 3 + [1] * 7, [2] * 5 + [3] * 5, [4, 4] + [-1] * 8]
    assert input_ids.tolist() == want_ids
    assert doc_ids.tolist() == want_docs


def test_literal_best_fit_picks_least_room_then_earliest_chunk():
    # C=10; 6 and 5 open chunks with rooms 4 and 5; 4 goes to the room-4 chunk (least room),
    # then 3 and 2: 3 -> the room-5 chunk (room 2 left), 2 -> that chunk too (best fit, room 0).
    docs = [[1] * 6, [2] * 5, [3] * 4, [4] * 3, [5] * 2]
    _, doc_ids = pack_best_fit(docs, 10, 0)
    assert doc_ids.tolist() == [[0] * 6 + [2] * 4, [1] * 5 + [3] * 3 + [4] * 2]
    # Ties between equal rooms go to the chunk opened first.
    _, doc_ids = pack_best_fit([[1] * 6, [2] * 6, [3] * 4], 10, 0)
    assert doc_ids.tolist() == [[0] * 6 + [2] * 4, [1] * 6 + [-1] * 4]


def test_literal_windows_do_not_share_chunks():
    docs = [[1] * 3, [2] * 3, [3] * 3, [4] * 3]
    assert pack_best_fit(docs, 6, 0, window=0)[1].tolist() == [[0] * 3 + [1] * 3, [2] * 3 + [3] * 3]
    expected = [[0] * 3 + [1] * 3, [2] * 3 + [-1] * 3, [3] * 3 + [-1] * 3]
    assert pack_best_fit(docs, 6, 0, window=3)[1].tolist() == expected


def test_literal_empty_inputs():
    for docs in ([], [[]], [[], []]):
        input_ids, doc_ids = pack_best_fit(docs, 4, 0)
        assert input_ids.shape == doc_ids.shape == (0, 4)


def test_split_items_literal():
    items = split_items(np.array([0, 3, 10, 12, 20]), 10)
    assert items.doc_index.tolist() == [1, 2, 3, 3, 4, 4]
    assert items.starts.tolist() == [0, 3, 13, 23, 25, 35]
    assert items.lengths.tolist() == [3, 10, 10, 2, 10, 10]


# ----------------------------------------------------------------------------- against the reference


@SETTINGS
@given(corpus=corpora(), window=st.integers(0, 7), pad=st.sampled_from([0, 7]),
       dtype=st.sampled_from([np.int32, np.int64, np.uint16]))
def test_pack_best_fit_matches_reference(corpus, window, pad, dtype):
    docs, c = corpus
    arrays = [np.asarray(d, dtype=dtype) for d in docs]
    got_ids, got_docs = pack_best_fit(arrays, c, pad, window=window)
    want_ids, want_docs = naive_best_fit(docs, c, pad, window, dtype=dtype)
    event(f"chunks {'>' if len(want_ids) > 3 else '<='} 3")
    if docs:  # no documents at all: no dtype to keep (int64, as pack_sequences)
        assert got_ids.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_docs, want_docs)


@SETTINGS
@given(lengths=st.lists(st.integers(1, 30), max_size=60), c=st.integers(1, 30))
def test_best_fit_decreasing_matches_first_principles(lengths, c):
    lengths = [min(n, c) for n in lengths]
    bins, num_bins = best_fit_decreasing(np.array(lengths, dtype=np.int64), c)
    rooms: list[int] = []
    want = [0] * len(lengths)
    for k in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        fitting = [(room, b) for b, room in enumerate(rooms) if room >= lengths[k]]
        if fitting:
            b = min(fitting)[1]
        else:
            b = len(rooms)
            rooms.append(c)
        rooms[b] -= lengths[k]
        want[k] = b
    assert bins.tolist() == want and num_bins == len(rooms)


@pytest.mark.slow  # > 5 s
@SETTINGS
@given(corpus=corpora(max_docs=60), window=st.integers(0, 9), data=st.data())
def test_batch_split_invariance(corpus, window, data):
    docs, c = corpus
    arrow = pa.array(docs, pa.list_(pa.int32()))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(docs)), max_size=6)))
    packer = BestFitPacker(c, 0, window=window, first_doc_id=100, dtype=np.int32)
    bounds = [0, *cuts, len(docs)]
    parts = [packer.push(arrow.slice(a, b - a)) for a, b in zip(bounds, bounds[1:])] + [packer.finish()]
    got = np.concatenate([p.input_ids for p in parts])
    got_docs = np.concatenate([p.doc_ids() for p in parts])
    want_ids, want_docs = pack_best_fit(arrow, c, 0, window=window)
    np.testing.assert_array_equal(got, want_ids)
    np.testing.assert_array_equal(got_docs, np.where(want_docs >= 0, want_docs + 100, -1))


# ----------------------------------------------------------------------------- promises


@pytest.mark.slow  # > 5 s
@SETTINGS
@given(corpus=corpora(), window=st.integers(0, 7))
def test_promises(corpus, window):
    docs, c = corpus
    arrow = pa.array(docs, pa.list_(pa.int64()))
    packer = BestFitPacker(c, -1, window=window, dtype=np.int64)
    chunks = [packer.push(arrow), packer.finish()]
    input_ids = np.concatenate([ch.input_ids for ch in chunks])
    doc_ids = np.concatenate([ch.doc_ids() for ch in chunks])
    split = sum(len(d) > c for d in docs)
    if split:
        event("a document longer than C")
    for row_ids, row_docs in zip(input_ids, doc_ids):
        real = row_docs >= 0
        assert not np.any(real[np.argmin(real):]) if not real.all() else True  # padding only at the end
        runs = row_docs[real][np.r_[True, np.diff(row_docs[real]) != 0]]
        assert np.all(np.diff(runs) > 0)  # each doc once per chunk, in increasing doc id
        assert np.all(row_ids[~real] == -1)
    for doc_id, doc in enumerate(docs):
        where = doc_ids == doc_id
        rows = np.flatnonzero(where.any(axis=1))
        if 0 < len(doc) <= c:
            assert rows.size == 1  # never cut
        assert input_ids[where].tolist() == doc  # in chunk order, the pieces give the document back
    counter = BestFitChunkCounter(c, window=window)
    counter.push([len(d) for d in docs])
    stats = best_fit_stats([len(d) for d in docs], c, window=window)
    assert counter.finish() == stats.num_chunks == len(input_ids)
    assert stats.padding_positions == int(np.count_nonzero(doc_ids < 0))
    assert stats.split_documents == split


def test_masks_follow_the_rule_on_best_fit_chunks():
    docs = [[1] * 5, [2] * 5, [3] * 9, [4] * 6]
    _, doc_ids = pack_best_fit(docs, 8, 0)
    assert (doc_ids == -1).any(axis=1).sum() >= 2  # several chunks end with padding
    mask = build_intra_document_mask(doc_ids)
    for row, ids in zip(mask, doc_ids):
        for i in range(8):
            for j in range(8):
                allowed = j <= i and ids[j] == ids[i] and ids[i] != -1
                assert row[i, j] == (0.0 if allowed else -np.inf)


@pytest.mark.slow  # > 5 s
def test_counter_matches_packer_over_many_windows():
    rng = np.random.default_rng(0)
    lengths = np.maximum(0, rng.lognormal(np.log(300), 1.0, size=5000)).astype(np.int64)
    tokens = np.zeros(int(lengths.sum()), np.int32)
    for window in (0, 1, 7, 1000):
        packer = BestFitPacker(1024, 0, window=window)
        parts = [packer.push_flat(tokens, lengths), packer.finish()]
        counter = BestFitChunkCounter(1024, window=window)
        for piece in np.array_split(lengths, 7):
            counter.push(piece)
        assert counter.finish() == sum(p.num_chunks for p in parts)


# ----------------------------------------------------------------------------- bad input


def test_bad_input():
    with pytest.raises(ValueError, match="window=-1 must be >= 0"):
        BestFitPacker(8, 0, window=-1)
    with pytest.raises(ValueError, match=r"context_length=0 must be in 1\.\.16777216"):
        BestFitPacker(0, 0, window=4)
    with pytest.raises(ValueError, match="pad_token=300 does not fit the token dtype uint8"):
        BestFitPacker(8, 300, window=4, dtype=np.uint8)
    packer = BestFitPacker(8, 0, window=4, dtype=np.uint8)
    with pytest.raises(ValueError, match="token 256 does not fit the token dtype uint8"):
        packer.push([np.array([1, 256], np.int32)])
    with pytest.raises(TypeError, match="must be a list of integers"):
        pack_best_fit(pa.array([1.5]), 8, 0)
