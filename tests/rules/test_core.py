"""raypack.rules.core against the rules: literal cases, properties against the naive reference in
tests/reference.py, streaming and sharded invariants, and every validation rule.

Layers, in order: literal tiny arrays written by hand; pack_sequences vs naive_pack over all
input forms; StreamPacker batch-split invariance and segment invariants; sharded packers with
heads/tails stitched by a driver; bad input.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from typing import Any, Callable, NamedTuple

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raypack.rules.core import (
    Chunks,
    Fragment,
    StreamPacker,
    concat_chunks,
    pack_sequences,
    split_document_mask,
    stitch_fragments,
)

from reference import naive_pack, naive_segments

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ----------------------------------------------------------------------------- input forms


class Form(NamedTuple):
    """One way of handing documents to raypack: how to build it and the dtype it must keep."""

    name: str
    dtype: np.dtype
    build: Callable[[list[list[int]]], Any]


def _numpy_list(dtype) -> Callable[[list[list[int]]], list[np.ndarray]]:
    return lambda docs: [np.asarray(doc, dtype=dtype) for doc in docs]


def _sliced_arrow(docs: list[list[int]]) -> pa.ListArray:
    """``docs`` as a slice of a bigger list<int32> array with junk (and nulls) on both sides."""
    before = [[-7, -7, -7], None, [], [-8]]
    after = [[-9] * 5, None]
    big = pa.array(before + docs + after, type=pa.list_(pa.int32()))
    sliced = big[len(before): len(before) + len(docs)]
    assert sliced.offset == len(before)
    return sliced


def _chunked_arrow(docs: list[list[int]]) -> pa.ChunkedArray:
    """``docs`` as a chunked list<int32> array of several chunks, one of them empty."""
    third = len(docs) // 3
    parts = [docs[:third], [], docs[third: 2 * third], docs[2 * third:]]
    return pa.chunked_array([pa.array(p, type=pa.list_(pa.int32())) for p in parts], type=pa.list_(pa.int32()))


FORMS = {
    form.name: form
    for form in [
        Form("list", np.dtype(np.int64), lambda docs: [list(doc) for doc in docs]),
        Form("np_int16", np.dtype(np.int16), _numpy_list(np.int16)),
        Form("np_int32", np.dtype(np.int32), _numpy_list(np.int32)),
        Form("np_uint16", np.dtype(np.uint16), _numpy_list(np.uint16)),
        Form("np_int64", np.dtype(np.int64), _numpy_list(np.int64)),
        Form("arrow_list_int32", np.dtype(np.int32), lambda docs: pa.array(docs, type=pa.list_(pa.int32()))),
        Form("arrow_large_list_int64", np.dtype(np.int64),
             lambda docs: pa.array(docs, type=pa.large_list(pa.int64()))),
        Form("arrow_sliced", np.dtype(np.int32), _sliced_arrow),
        Form("arrow_chunked", np.dtype(np.int32), _chunked_arrow),
    ]
}


def expected_dtype(form: str, docs: list[list[int]]) -> np.dtype:
    """The form's dtype, except that an empty Python list of numpy arrays carries none: int64."""
    return np.dtype(np.int64) if form.startswith("np_") and not docs else FORMS[form].dtype


def token_range(dtype: np.dtype) -> tuple[int, int]:
    """Token values to draw for a dtype: its full range; for int64 beyond int32 (but not huge)."""
    if dtype == np.int64:
        return -(2**40), 2**40
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def make_docs(lengths: list[int], seed: int, dtype: np.dtype) -> list[list[int]]:
    low, high = token_range(dtype)
    rng = np.random.default_rng(seed)
    return [rng.integers(low, high, size=n, endpoint=True).tolist() for n in lengths]


def pad_for(choice: str, dtype: np.dtype) -> int:
    info = np.iinfo(dtype)
    return {"zero": 0, "min": int(info.min), "max": int(info.max)}[choice]


# ----------------------------------------------------------------------------- strategies


def doc_lengths(context_length: int) -> st.SearchStrategy[int]:
    """0, 1, exactly C, k*C +/- 1, many times C, or anything up to 3C."""
    c = context_length
    special = [0, 1, c, c - 1, c + 1, 2 * c - 1, 2 * c, 2 * c + 1, 7 * c, 7 * c + 1, 10 * c - 1]
    return st.one_of(st.sampled_from(special), st.integers(0, 3 * c))


@st.composite
def corpora(draw, max_docs: int = 10) -> tuple[int, list[int], int]:
    """``(C, doc lengths, seed)``; the tokens themselves come from the seed (see make_docs)."""
    context_length = draw(st.one_of(st.just(1), st.integers(2, 9), st.sampled_from([16, 32])))
    lengths = draw(st.lists(doc_lengths(context_length), max_size=max_docs))
    seed = draw(st.integers(0, 2**32 - 1))
    return context_length, lengths, seed


def cut_points(data: st.DataObject, start: int, end: int, max_cuts: int = 6) -> list[int]:
    """Sorted cut indices in [start, end], repeats allowed (so empty pieces happen)."""
    return sorted(data.draw(st.lists(st.integers(start, end), max_size=max_cuts)))


def pieces(start: int, end: int, cuts: list[int]) -> list[tuple[int, int]]:
    bounds = [start, *cuts, end]
    return list(zip(bounds[:-1], bounds[1:]))


# ----------------------------------------------------------------------------- helpers


def check_chunks(chunks: Chunks, context_length: int, dtype: np.dtype) -> None:
    """Chunks invariants: shapes, dtypes, segments canonical and agreeing with doc_ids()."""
    n = chunks.num_chunks
    offsets, seg_ids, seg_lens = chunks.segment_offsets, chunks.segment_doc_ids, chunks.segment_lengths
    assert chunks.input_ids.shape == (n, context_length)
    assert chunks.input_ids.dtype == dtype
    assert (offsets.dtype, seg_ids.dtype, seg_lens.dtype) == (np.int64, np.int64, np.int32)
    assert offsets.shape == (n + 1,) and offsets[0] == 0
    assert offsets[-1] == seg_ids.size == seg_lens.size
    assert np.all(np.diff(offsets) >= 1), "segment_offsets must increase (every chunk has a segment)"
    dense = chunks.doc_ids()
    assert dense.shape == (n, context_length) and dense.dtype == np.int64
    for i in range(n):
        ids = seg_ids[offsets[i]: offsets[i + 1]].tolist()
        lens = seg_lens[offsets[i]: offsets[i + 1]].tolist()
        assert sum(lens) == context_length
        assert all(length > 0 for length in lens)
        assert all(a != b for a, b in zip(ids, ids[1:])), f"adjacent segments share an id: {ids}"
        assert list(zip(ids, lens)) == naive_segments(dense[i].tolist())


def check_fragment(fragment: Fragment, context_length: int, dtype: np.dtype) -> None:
    size = fragment.input_ids.size
    assert 0 < size < context_length
    assert fragment.input_ids.dtype == dtype
    assert int(fragment.segment_lengths.sum()) == size and np.all(fragment.segment_lengths > 0)
    ids = fragment.segment_doc_ids
    assert np.all(ids[1:] != ids[:-1])


def dense_of(parts: list[Chunks], context_length: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate chunk batches to ``(input_ids, doc_ids)`` with plain numpy."""
    parts = [p for p in parts if p.num_chunks]
    input_ids = np.concatenate([np.zeros((0, context_length), dtype)] + [p.input_ids for p in parts])
    doc_ids = np.concatenate([np.zeros((0, context_length), np.int64)] + [p.doc_ids() for p in parts])
    return input_ids, doc_ids


def shift_ids(doc_ids: np.ndarray, first_doc_id: int) -> np.ndarray:
    return np.where(doc_ids == -1, -1, doc_ids + first_doc_id)


def assert_packed_equal(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    assert got[0].dtype == want[0].dtype, (got[0].dtype, want[0].dtype)
    assert got[1].dtype == np.int64
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


# ----------------------------------------------------------------------------- literal cases

MAIN_DOCS = [[1, 2, 3], [4], [], [5, 6, 7, 8, 9]]


def test_literal_main_example():
    input_ids, doc_ids = pack_sequences(MAIN_DOCS, 4, 0)
    np.testing.assert_array_equal(input_ids, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 0, 0]])
    np.testing.assert_array_equal(doc_ids, [[0, 0, 0, 1], [3, 3, 3, 3], [3, -1, -1, -1]])
    assert input_ids.dtype == np.int64 and doc_ids.dtype == np.int64


@pytest.mark.parametrize(
    ("docs", "context_length", "pad", "want_ids", "want_docs"),
    [
        pytest.param([[7], [], [8, 9]], 1, 0, [[7], [8], [9]], [[0], [2], [2]], id="C=1"),
        pytest.param([[1, 2], [3, 4]], 2, 5, [[1, 2], [3, 4]], [[0, 0], [1, 1]], id="exact-fill-no-pad"),
        pytest.param([[1, 2, 3, 4, 5]], 2, 9, [[1, 2], [3, 4], [5, 9]], [[0, 0], [0, 0], [0, -1]],
                     id="single-doc-spans-3"),
        pytest.param([[], [], [1]], 3, -1, [[1, -1, -1]], [[2, -1, -1]], id="empties-take-ids"),
        pytest.param([[1], [2], [3]], 8, 0, [[1, 2, 3, 0, 0, 0, 0, 0]], [[0, 1, 2, -1, -1, -1, -1, -1]],
                     id="all-in-one-chunk"),
        pytest.param([[1, 2, 3], [4, 5, 6]], 2, 0, [[1, 2], [3, 4], [5, 6]], [[0, 0], [0, 1], [1, 1]],
                     id="boundary-inside-both"),
    ],
)
def test_literal_cases(docs, context_length, pad, want_ids, want_docs):
    input_ids, doc_ids = pack_sequences(docs, context_length, pad)
    np.testing.assert_array_equal(input_ids, want_ids)
    np.testing.assert_array_equal(doc_ids, want_docs)


@pytest.mark.parametrize("docs", [[], [[], [], []]], ids=["no-docs", "only-empty-docs"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_literal_no_tokens_gives_zero_chunks(docs, form):
    input_ids, doc_ids = pack_sequences(FORMS[form].build(docs), 3, 0)
    assert input_ids.shape == doc_ids.shape == (0, 3)
    assert input_ids.dtype == expected_dtype(form, docs) and doc_ids.dtype == np.int64


@pytest.mark.parametrize("form", sorted(FORMS))
def test_literal_main_example_every_form(form):
    input_ids, doc_ids = pack_sequences(FORMS[form].build(MAIN_DOCS), 4, 0)
    assert input_ids.dtype == FORMS[form].dtype
    np.testing.assert_array_equal(input_ids, [[1, 2, 3, 4], [5, 6, 7, 8], [9, 0, 0, 0]])
    np.testing.assert_array_equal(doc_ids, [[0, 0, 0, 1], [3, 3, 3, 3], [3, -1, -1, -1]])


def test_literal_dtype_extremes_survive():
    docs = [np.array([-32768, 32767], np.int16), np.array([0], np.int16)]
    input_ids, _ = pack_sequences(docs, 2, -32768)
    assert input_ids.dtype == np.int16
    np.testing.assert_array_equal(input_ids, [[-32768, 32767], [0, -32768]])
    docs = [np.array([65535, 0, 40000], np.uint16)]
    input_ids, _ = pack_sequences(docs, 2, 65535)
    assert input_ids.dtype == np.uint16
    np.testing.assert_array_equal(input_ids, [[65535, 0], [40000, 65535]])


def test_literal_single_chunk_chunked_array():
    docs = pa.chunked_array([pa.array(MAIN_DOCS, type=pa.list_(pa.uint16()))])
    input_ids, doc_ids = pack_sequences(docs, 4, 0)
    assert input_ids.dtype == np.uint16
    np.testing.assert_array_equal(doc_ids, [[0, 0, 0, 1], [3, 3, 3, 3], [3, -1, -1, -1]])


def test_literal_stream_segments():
    packer = StreamPacker(4, 0)
    chunks = packer.push(MAIN_DOCS, 0)
    np.testing.assert_array_equal(chunks.input_ids, [[1, 2, 3, 4], [5, 6, 7, 8]])
    np.testing.assert_array_equal(chunks.segment_offsets, [0, 2, 3])
    np.testing.assert_array_equal(chunks.segment_doc_ids, [0, 1, 3])
    np.testing.assert_array_equal(chunks.segment_lengths, [3, 1, 4])
    last = packer.finish()
    np.testing.assert_array_equal(last.input_ids, [[9, 0, 0, 0]])
    np.testing.assert_array_equal(last.segment_offsets, [0, 2])
    np.testing.assert_array_equal(last.segment_doc_ids, [3, -1])
    np.testing.assert_array_equal(last.segment_lengths, [1, 3])


def test_literal_stream_chunk_emitted_as_soon_as_full():
    packer = StreamPacker(4, 0)
    assert packer.push([[1, 2, 3]], 0).num_chunks == 0
    chunks = packer.push([[4, 5]], 1)
    np.testing.assert_array_equal(chunks.input_ids, [[1, 2, 3, 4]])
    np.testing.assert_array_equal(chunks.doc_ids(), [[0, 0, 0, 1]])
    np.testing.assert_array_equal(packer.finish().input_ids, [[5, 0, 0, 0]])


def test_literal_head_and_tail():
    packer = StreamPacker(4, 0, start_position=6)
    chunks = packer.push([[1, 2, 3], [4, 5, 6, 7, 8]], 10)
    np.testing.assert_array_equal(chunks.input_ids, [[3, 4, 5, 6]])
    np.testing.assert_array_equal(chunks.doc_ids(), [[10, 11, 11, 11]])
    assert packer.finish(pad=False).num_chunks == 0
    head, tail = packer.head, packer.tail
    assert head.start == 6 and tail.start == 12
    np.testing.assert_array_equal(head.input_ids, [1, 2])
    np.testing.assert_array_equal(head.segment_doc_ids, [10])
    np.testing.assert_array_equal(head.segment_lengths, [2])
    np.testing.assert_array_equal(tail.input_ids, [7, 8])
    np.testing.assert_array_equal(tail.segment_doc_ids, [11])
    np.testing.assert_array_equal(tail.segment_lengths, [2])


def test_literal_sharded_stitch():
    """MAIN_DOCS in shards [[1,2,3]] | [[4], []] | [[5..9]]: the driver stitches chunks 0 and 2."""
    shard0 = StreamPacker(4, 0, dtype=np.int64)
    assert shard0.push(MAIN_DOCS[:1], 0).num_chunks == 0
    shard0.finish(pad=False)
    shard1 = StreamPacker(4, 0, start_position=3, dtype=np.int64)
    assert shard1.push(MAIN_DOCS[1:3], 1).num_chunks == 0
    shard1.finish(pad=False)
    shard2 = StreamPacker(4, 0, start_position=4, dtype=np.int64)
    middle = shard2.push(MAIN_DOCS[3:], 3)
    shard2.finish(pad=False)
    assert shard0.head is None and shard1.tail is None and shard2.head is None
    first = stitch_fragments([shard0.tail, shard1.head], 4, 0, pad=False, dtype=np.int64)
    last = stitch_fragments([shard2.tail], 4, 0, pad=True, dtype=np.int64)
    np.testing.assert_array_equal(first.input_ids, [[1, 2, 3, 4]])
    np.testing.assert_array_equal(first.doc_ids(), [[0, 0, 0, 1]])
    np.testing.assert_array_equal(middle.input_ids, [[5, 6, 7, 8]])
    np.testing.assert_array_equal(last.input_ids, [[9, 0, 0, 0]])
    np.testing.assert_array_equal(last.doc_ids(), [[3, -1, -1, -1]])


# ----------------------------------------------------------------------------- pack_sequences vs reference

EDGE_CORPORA = [
    pytest.param(1, [1, 0, 3, 1], id="C=1"),
    pytest.param(4, [9], id="single-doc"),
    pytest.param(4, [4], id="single-doc-exactly-C"),
    pytest.param(4, [0, 0, 0], id="only-empty"),
    pytest.param(4, [], id="no-docs"),
    pytest.param(4, [3, 5, 7, 9, 4, 0, 1], id="kC-plus-minus-1"),
    pytest.param(3, [30, 0, 29, 31], id="many-times-C"),
    pytest.param(5, [1] * 12, id="many-tiny"),
]


@pytest.mark.parametrize(("context_length", "lengths"), EDGE_CORPORA)
@pytest.mark.parametrize("form", sorted(FORMS))
def test_pack_sequences_edge_corpora(form, context_length, lengths):
    docs = make_docs(lengths, seed=len(lengths), dtype=FORMS[form].dtype)
    dtype = expected_dtype(form, docs)
    got = pack_sequences(FORMS[form].build(docs), context_length, 0)
    assert_packed_equal(got, naive_pack(docs, context_length, 0, dtype=dtype))
    assert got[0].shape[0] == math.ceil(sum(lengths) / context_length)


@SETTINGS
@given(corpus=corpora(), form=st.sampled_from(sorted(FORMS)), pad_choice=st.sampled_from(["zero", "min", "max"]))
def test_pack_sequences_matches_reference(corpus, form, pad_choice):
    context_length, lengths, seed = corpus
    docs = make_docs(lengths, seed, FORMS[form].dtype)
    dtype = expected_dtype(form, docs)
    pad = pad_for(pad_choice, FORMS[form].dtype)
    got = pack_sequences(FORMS[form].build(docs), context_length, pad)
    assert_packed_equal(got, naive_pack(docs, context_length, pad, dtype=dtype))
    assert got[0].shape == (math.ceil(sum(lengths) / context_length), context_length)


def test_reference_infers_dtype_like_the_rules():
    """The reference's own dtype choice (used nowhere else) agrees on each form."""
    for form in FORMS.values():
        docs = make_docs([3, 0, 5], seed=1, dtype=form.dtype)
        assert naive_pack(form.build(docs), 4, 0)[0].dtype == form.dtype, form.name


# ----------------------------------------------------------------------------- streaming


def stream_pack(examples: Any, context_length: int, pad: int, cuts: list[int], num_docs: int,
                first_doc_id: int, dtype: np.dtype | None) -> list[Chunks]:
    packer = StreamPacker(context_length, pad, dtype=dtype)
    parts = [packer.push(examples[a:b], first_doc_id + a) for a, b in pieces(0, num_docs, cuts)]
    parts.append(packer.finish())
    assert packer.head is None and packer.tail is None
    return parts


@pytest.mark.parametrize("explicit_dtype", [True, False], ids=["dtype-given", "dtype-inferred"])
@SETTINGS
@given(corpus=corpora(), form=st.sampled_from(sorted(FORMS)), first_doc_id=st.sampled_from([0, 1, 1000]),
       data=st.data())
def test_stream_batch_split_invariance(explicit_dtype, corpus, form, first_doc_id, data):
    """Any split into batches (empty ones too) gives pack_sequences' chunks, ids offset by
    first_doc_id, in the documents' dtype. (dtype-inferred fails today: see
    test_stream_dtype_not_locked_by_empty_first_batch.)"""
    context_length, lengths, seed = corpus
    docs = make_docs(lengths, seed, FORMS[form].dtype)
    dtype = FORMS[form].dtype if explicit_dtype else expected_dtype(form, docs)
    examples = FORMS[form].build(docs)
    cuts = cut_points(data, 0, len(docs))
    event(f"empty batches: {any(a == b for a, b in pieces(0, len(docs), cuts))}")

    parts = stream_pack(examples, context_length, 0, cuts, len(docs), first_doc_id,
                        FORMS[form].dtype if explicit_dtype else None)
    for part in parts:
        # A dtype=None packer fed an empty Python batch first cannot know the dtype yet, so
        # only the dtype of chunks it actually returns is held to the rule there.
        strict = explicit_dtype or part.num_chunks
        check_chunks(part, context_length, dtype if strict else part.input_ids.dtype)
    assert parts[-1].num_chunks == (1 if sum(lengths) % context_length else 0)
    got = dense_of(parts, context_length, dtype)

    want_ids, want_docs = pack_sequences(examples, context_length, 0)
    assert want_ids.dtype == expected_dtype(form, docs)
    assert_packed_equal(got, (want_ids.astype(dtype), shift_ids(want_docs, first_doc_id)))
    ref_ids, ref_docs = naive_pack(docs, context_length, 0, dtype=dtype)
    assert_packed_equal(got, (ref_ids, shift_ids(ref_docs, first_doc_id)))
    merged = concat_chunks(parts, context_length, dtype)
    check_chunks(merged, context_length, dtype)
    assert_packed_equal((merged.input_ids, merged.doc_ids()), got)


def test_stream_chunks_are_emitted_eagerly():
    """Each push returns every chunk completed so far; only a partial chunk is carried."""
    packer = StreamPacker(3, 0)
    pushed = 0
    emitted = 0
    for doc_id, length in enumerate([2, 0, 5, 1, 3, 8]):
        emitted += packer.push([list(range(length))], doc_id).num_chunks
        pushed += length
        assert emitted == pushed // 3
    assert pushed % 3 and packer.finish().num_chunks == 1


def test_stream_push_runs_keeps_segments_canonical():
    """A document fed in pieces (push_runs with the same id twice) stays one segment per chunk."""
    packer = StreamPacker(4, 0)
    first = packer.push_runs(np.array([1, 2, 3], np.int32), np.array([2, 1]), np.array([7, 7]))
    chunks = packer.push_runs(np.array([4, 5, 6], np.int32), np.array([1, 2]), np.array([7, 8]))
    assert first.num_chunks == 0
    check_chunks(chunks, 4, np.dtype(np.int32))
    np.testing.assert_array_equal(chunks.segment_doc_ids, [7])
    np.testing.assert_array_equal(chunks.segment_lengths, [4])
    last = packer.finish()
    np.testing.assert_array_equal(last.segment_doc_ids, [8, -1])
    np.testing.assert_array_equal(last.input_ids, [[5, 6, 0, 0]])


def test_stream_carry_does_not_alias_the_callers_batch():
    """The partial chunk kept between pushes must survive the caller reusing its buffer."""
    tokens = np.array([1, 2, 3, 4, 5, 6], np.int32)
    packer = StreamPacker(4, 0)
    packer.push_runs(tokens, np.array([6]), np.array([0]))
    tokens[:] = -1
    np.testing.assert_array_equal(packer.finish().input_ids, [[5, 6, 0, 0]])


def test_stream_dtype_not_locked_by_empty_first_batch():
    """An empty first batch (a Python list) does not lock a dtype=None packer to int64: the output
    keeps the documents' int16 however the batches are split (a fixed bug)."""
    docs = [np.array([1, 2, 3, 4, 5], np.int16)]
    packer = StreamPacker(4, 0)
    parts = [packer.push(docs[:0], 0), packer.push(docs, 0), packer.finish()]
    assert [p.input_ids.dtype for p in parts[1:]] == [np.int16, np.int16]


# ----------------------------------------------------------------------------- sharded streaming


class ShardStats(Counter):
    """Counts of the situations a sharded run went through (to guard against vacuous passes)."""


def pack_sharded(
    examples: Any, lengths: list[int], context_length: int, pad: int, dtype: np.dtype,
    shard_cuts: list[int], batch_cuts: list[list[int]],
) -> tuple[np.ndarray, np.ndarray, ShardStats]:
    """Pack shard by shard as a driver would, stitch heads and tails, assemble in global order."""
    c = context_length
    doc_starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).tolist()
    total = doc_starts[-1]
    num_chunks = -(-total // c)
    rows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    groups: dict[int, list[Fragment]] = defaultdict(list)
    stats = ShardStats()

    for k, (a, b) in enumerate(pieces(0, len(lengths), shard_cuts)):
        start, end = doc_starts[a], doc_starts[b]
        packer = StreamPacker(c, pad, start_position=start, dtype=dtype)
        parts = [packer.push(examples[x:y], x) for x, y in pieces(a, b, batch_cuts[k])]
        assert packer.finish(pad=False).num_chunks == 0
        for part in parts:
            check_chunks(part, c, dtype)
        chunks = concat_chunks(parts, c, dtype)
        first_index = -(-start // c)
        assert chunks.num_chunks == max(0, end // c - first_index)
        dense = chunks.doc_ids()
        for i in range(chunks.num_chunks):
            assert first_index + i not in rows
            rows[first_index + i] = (chunks.input_ids[i], dense[i])

        head_end = min(end, first_index * c)
        if start < head_end:
            assert packer.head is not None and packer.head.start == start
            assert packer.head.input_ids.size == head_end - start
        else:
            assert packer.head is None
        tail_start = end // c * c
        if end % c and tail_start >= start:
            assert packer.tail is not None and packer.tail.start == tail_start
            assert packer.tail.input_ids.size == end - tail_start
        else:
            assert packer.tail is None
        for fragment in (packer.head, packer.tail):
            if fragment is not None:
                check_fragment(fragment, c, dtype)
                groups[fragment.start // c].append(fragment)

        stats["shards"] += 1
        stats["empty shards"] += a == b
        stats["shards of only empty docs"] += a < b and start == end
        stats["shards starting mid-chunk"] += start < end and start % c != 0
        stats["shards inside one chunk"] += start < end and chunks.num_chunks == 0
        stats["batches"] += len(parts)

    for index, fragments in groups.items():
        assert [f.start for f in fragments] == sorted(f.start for f in fragments)
        stitched = stitch_fragments(fragments, c, pad, pad=index == num_chunks - 1, dtype=dtype)
        check_chunks(stitched, c, dtype)
        assert stitched.num_chunks == 1 and index not in rows
        rows[index] = (stitched.input_ids[0], stitched.doc_ids()[0])
        stats["stitched chunks"] += 1
        stats["chunks of 3+ fragments"] += len(fragments) >= 3

    stats["docs split across chunks"] += sum(
        1 for s, e in zip(doc_starts, doc_starts[1:]) if e > s and s // c != (e - 1) // c
    )
    assert sorted(rows) == list(range(num_chunks))
    input_ids = np.stack([rows[i][0] for i in range(num_chunks)]) if num_chunks else np.zeros((0, c), dtype)
    doc_ids = np.stack([rows[i][1] for i in range(num_chunks)]) if num_chunks else np.zeros((0, c), np.int64)
    return input_ids, doc_ids, stats


@SETTINGS
@given(corpus=corpora(max_docs=12), form=st.sampled_from(sorted(FORMS)), data=st.data())
def test_sharded_matches_reference(corpus, form, data):
    context_length, lengths, seed = corpus
    dtype = FORMS[form].dtype
    docs = make_docs(lengths, seed, dtype)
    examples = FORMS[form].build(docs)
    shard_cuts = cut_points(data, 0, len(docs), max_cuts=8)
    batch_cuts = [cut_points(data, a, b, max_cuts=3) for a, b in pieces(0, len(docs), shard_cuts)]
    input_ids, doc_ids, stats = pack_sharded(examples, lengths, context_length, 7, dtype, shard_cuts, batch_cuts)
    for name, count in stats.items():
        if count and name not in ("shards", "batches"):
            event(name)
    assert_packed_equal((input_ids, doc_ids), naive_pack(docs, context_length, 7, dtype=dtype))


SHARD_CASES = [
    # (C, doc lengths, shard cuts)
    pytest.param(4, [3, 1, 0, 5], [1, 3], id="main-example"),
    pytest.param(4, [1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 2, 3, 5, 7], id="many-shards-inside-chunks"),
    pytest.param(4, [2, 0, 0, 3, 6], [1, 1, 3, 4], id="empty-and-only-empty-shards"),
    pytest.param(5, [12, 7, 3, 5], [1, 2, 3], id="mid-chunk-starts"),
    pytest.param(3, [0, 0, 0], [1, 2], id="no-tokens-at-all"),
    pytest.param(1, [2, 0, 3, 1], [1, 2, 3], id="C=1"),
    pytest.param(4, [4, 4, 8], [1, 2], id="aligned-shards"),
    pytest.param(6, [1, 1, 1, 1, 1, 1, 1], [0, 0, 7, 7], id="empty-shards-at-ends"),
]


@pytest.mark.parametrize(("context_length", "lengths", "shard_cuts"), SHARD_CASES)
@pytest.mark.parametrize("form", ["list", "np_uint16", "arrow_sliced", "arrow_chunked"])
def test_sharded_cases(form, context_length, lengths, shard_cuts):
    dtype = FORMS[form].dtype
    docs = make_docs(lengths, seed=3, dtype=dtype)
    batch_cuts = [[] for _ in range(len(shard_cuts) + 1)]
    input_ids, doc_ids, _ = pack_sharded(FORMS[form].build(docs), lengths, context_length, 0, dtype,
                                         shard_cuts, batch_cuts)
    assert_packed_equal((input_ids, doc_ids), naive_pack(docs, context_length, 0, dtype=dtype))


def test_sharded_grid_is_not_vacuous():
    """A seeded sweep of random corpora, shards and batches: every run must match the reference,
    and together they must go through every situation the sharded test is meant to cover."""
    rng = np.random.default_rng(20240501)
    total = ShardStats()
    for _ in range(150):
        c = int(rng.integers(1, 9))
        lengths = [int(rng.choice([0, 1, c, c - 1, c + 1, 2 * c + 1, int(rng.integers(0, 3 * c + 1))]))
                   for _ in range(int(rng.integers(0, 12)))]
        shard_cuts = sorted(rng.integers(0, len(lengths) + 1, size=int(rng.integers(0, 8))).tolist())
        batch_cuts = [sorted(rng.integers(a, b + 1, size=int(rng.integers(0, 3))).tolist())
                      for a, b in pieces(0, len(lengths), shard_cuts)]
        docs = make_docs(lengths, seed=int(rng.integers(1 << 30)), dtype=np.dtype(np.int32))
        examples = pa.array(docs, type=pa.list_(pa.int32()))
        input_ids, doc_ids, stats = pack_sharded(examples, lengths, c, 0, np.dtype(np.int32), shard_cuts, batch_cuts)
        assert_packed_equal((input_ids, doc_ids), naive_pack(docs, c, 0, dtype=np.int32))
        total.update(stats)
    for situation in ["empty shards", "shards of only empty docs", "shards starting mid-chunk",
                      "shards inside one chunk", "docs split across chunks", "stitched chunks",
                      "chunks of 3+ fragments"]:
        assert total[situation] >= 5, f"the sweep never hit {situation!r}: {dict(total)}"


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("context_length", "error", "match"),
    [
        (0, ValueError, "context_length=0"),
        (-1, ValueError, "context_length=-1"),
        (2.5, TypeError, "context_length=2.5"),
        ("8", TypeError, "context_length='8'"),
        (True, TypeError, "context_length=True"),
        (None, TypeError, "context_length=None"),
    ],
)
def test_bad_context_length(context_length, error, match):
    with pytest.raises(error, match=re.escape(match)):
        pack_sequences([[1, 2]], context_length, 0)
    with pytest.raises(error, match=re.escape(match)):
        StreamPacker(context_length, 0)


@pytest.mark.parametrize(
    ("pad", "error", "match"),
    [
        (1.5, TypeError, "pad_token=1.5"),
        ("0", TypeError, "pad_token='0'"),
        (None, TypeError, "pad_token=None"),
        (False, TypeError, "pad_token=False"),
    ],
)
def test_bad_pad_token_type(pad, error, match):
    with pytest.raises(error, match=re.escape(match)):
        pack_sequences([[1, 2]], 4, pad)
    with pytest.raises(error, match=re.escape(match)):
        StreamPacker(4, pad, dtype=np.int32)
    with pytest.raises(error, match=re.escape(match)):
        StreamPacker(4, pad).push([[1, 2]], 0)


@pytest.mark.parametrize(
    ("docs", "pad", "dtype"),
    [
        pytest.param([np.array([1, 2], np.uint16)], 70000, np.uint16, id="70000-uint16"),
        pytest.param([np.array([1, 2], np.uint8)], -1, np.uint8, id="-1-uint8"),
        pytest.param([np.array([1, 2], np.int8)], 128, np.int8, id="128-int8"),
        pytest.param(pa.array([[1, 2]], type=pa.list_(pa.uint16())), 70000, np.uint16, id="70000-arrow-uint16"),
        pytest.param(pa.array([[1, 2]], type=pa.list_(pa.int32())), 2**31, np.int32, id="2**31-arrow-int32"),
    ],
)
def test_pad_token_not_representable(docs, pad, dtype):
    match = rf"pad_token={pad}\b.*{np.dtype(dtype).name}"
    with pytest.raises(ValueError, match=match):
        pack_sequences(docs, 4, pad)
    with pytest.raises(ValueError, match=match):
        StreamPacker(4, pad, dtype=dtype)
    with pytest.raises(ValueError, match=match):
        StreamPacker(4, pad).push(docs, 0)


def test_token_not_representable_in_packer_dtype():
    with pytest.raises(ValueError, match="70000"):
        StreamPacker(4, 0, dtype=np.uint16).push([[1, 70000]], 0)
    with pytest.raises(ValueError, match="-1"):
        StreamPacker(4, 0, dtype=np.uint8).push(pa.array([[-1, 3]], type=pa.list_(pa.int32())), 0)


def test_non_integer_packer_dtype():
    with pytest.raises(TypeError, match="float32"):
        StreamPacker(4, 0, dtype=np.float32)


@pytest.mark.parametrize(
    ("docs", "error", "match"),
    [
        pytest.param([[1.5, 2.5]], TypeError, r"document 0 .*1\.5 of type float", id="float-tokens"),
        pytest.param([[1], np.array([0.5])], TypeError, r"document 1 .*float64.*0\.5", id="float-array"),
        pytest.param([["a", "b"]], TypeError, r"document 0 .*'a'", id="string-tokens"),
        pytest.param([[True, False]], TypeError, r"document 0 .*bool", id="bool-tokens"),
        pytest.param([[1], [[1, 2]]], TypeError, r"document 1 has shape \(1, 2\)", id="nested-list"),
        pytest.param([[1, None]], TypeError, r"document 0 .*None", id="none-token"),
        pytest.param(pa.array([[1.5]], type=pa.list_(pa.float32())), TypeError, r"list<item: float>",
                     id="arrow-list-float"),
        pytest.param(pa.array([1, 2]), TypeError, r"int64.*list", id="arrow-not-a-list"),
        pytest.param(pa.array([[1], None, [2]], type=pa.list_(pa.int32())), ValueError, r"document 1 is null",
                     id="arrow-null-row"),
        pytest.param(pa.array([[1], [2], None, [3]], type=pa.list_(pa.int32()))[2:], ValueError,
                     r"document 0 is null", id="arrow-null-row-in-slice"),
        pytest.param(pa.chunked_array([pa.array([[1]], type=pa.list_(pa.int32())),
                                       pa.array([None], type=pa.list_(pa.int32()))]),
                     ValueError, r"document 1 is null", id="chunked-null-row"),
        pytest.param(pa.array([[1, None, 3]], type=pa.list_(pa.int32())), ValueError, r"null token",
                     id="arrow-null-token"),
    ],
)
def test_bad_documents(docs, error, match):
    with pytest.raises(error, match=match):
        pack_sequences(docs, 4, 0)
    with pytest.raises(error, match=match):
        StreamPacker(4, 0).push(docs, 0)


def test_nulls_outside_a_slice_are_fine():
    big = pa.array([None, [1, 2], [3], None], type=pa.list_(pa.int32()))
    input_ids, doc_ids = pack_sequences(big[1:3], 2, 0)
    np.testing.assert_array_equal(input_ids, [[1, 2], [3, 0]])
    np.testing.assert_array_equal(doc_ids, [[0, 0], [1, -1]])


# ----------------------------------------------------------------------------- known bugs (see report)


@pytest.mark.parametrize(
    ("docs", "value"),
    [
        pytest.param([[1, 2.5]], "2.5", id="float-after-int"),
        pytest.param([[1, None]], "None", id="none-after-int"),
        pytest.param([[1, "x"]], "'x'", id="string-after-int"),
        pytest.param([[[1], [2, 3]]], "document 0", id="ragged-nested"),
    ],
)
def test_error_names_the_offending_value(docs, value):
    """The message quotes the bad token, not the document's first one converted (a fixed bug)."""
    with pytest.raises((TypeError, ValueError), match=re.escape(value)):
        pack_sequences(docs, 4, 0)


@pytest.mark.parametrize("docs", [[[2**63]], [[2**63], [1]]], ids=["alone", "mixed-with-small"])
def test_python_ints_beyond_int64_are_rejected_by_value(docs):
    """Python ints are packed as int64, so 2**63 is refused naming it (it used to become uint64
    silently, or, mixed with other ints, fail with numpy's "Invalid integer data type 'f'")."""
    with pytest.raises((TypeError, ValueError), match=str(2**63)):
        pack_sequences(docs, 4, 0)


def test_empty_python_doc_does_not_widen_numpy_dtype():
    """An empty Python list among int16 arrays leaves the output int16: it carries no tokens, so
    it takes no part in the dtype promotion (it used to count as int64)."""
    input_ids, _ = pack_sequences([np.array([1, 2], np.int16), []], 4, 0)
    assert input_ids.dtype == np.int16


# ----------------------------------------------------------------------------- split documents


def test_split_document_mask_literal():
    # C = 4 from position 2: [2,5) crosses 4; [5,5) empty; [5,8) stays; [8,9) stays; [9,13) crosses 12.
    assert split_document_mask(np.array([3, 0, 3, 1, 4]), 2, 4).tolist() == [True, False, False, False, True]
    assert split_document_mask(np.zeros(0, np.int64), 0, 4).tolist() == []


@given(st.lists(st.integers(0, 20), max_size=30), st.integers(0, 50), st.integers(1, 9))
def test_split_document_mask_equals_a_loop(lengths, start, c):
    expected, position = [], start
    for n in lengths:
        expected.append(n > 0 and position // c != (position + n - 1) // c)
        position += n
    assert split_document_mask(np.array(lengths, dtype=np.int64), start, c).tolist() == expected

