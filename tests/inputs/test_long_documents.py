"""Long documents in slices: ``iter_run_slices`` cuts a read batch at arbitrary token
positions, and both packers (concat's StreamPacker, best_fit's BestFitPacker) give exactly the
chunks and counts they give for whole documents; a shard whose one document is far longer than
``read_batch_tokens`` packs to the same bytes, its packer fed slices of at most that size."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as paipc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from raypack.errors import InputError
from raypack.rules.core import StreamPacker, concat_chunks, iter_run_slices
from raypack.strategies.best_fit.rules import BestFitPacker

from helpers import pack_one
from reference import naive_best_fit, naive_pack

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def corpora(draw, max_docs=30):
    """(C, document lengths): empty documents, documents around C and many times C."""
    c = draw(st.integers(1, 9))
    lengths = draw(st.lists(st.one_of(st.integers(0, c + 1), st.integers(0, 6 * c + 1), st.sampled_from([0, c, 3 * c])),
                            max_size=max_docs))
    return c, np.array(lengths, dtype=np.int64)


def flat_tokens(lengths: np.ndarray, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1000, size=int(lengths.sum())).astype(np.int32)


def docs_of(tokens: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    return [d.tolist() for d in np.split(tokens, np.cumsum(lengths)[:-1])] if lengths.size else []


def sliced(tokens, lengths, first_doc_id, max_tokens, batch_cuts=(), first=None):
    """Read batches cut at ``batch_cuts`` (document indices), each cut in token slices (the first
    slice of each of at most ``first`` tokens, when given)."""
    bounds = [0, *sorted(batch_cuts), lengths.size]
    token_bounds = np.r_[0, np.cumsum(lengths)]
    for a, b in zip(bounds, bounds[1:]):
        yield from iter_run_slices(tokens[token_bounds[a]:token_bounds[b]], lengths[a:b], first_doc_id + a, max_tokens,
                                   first)


# ----------------------------------------------------------------------------- iter_run_slices


def test_literal_slices():
    tokens = np.arange(10, dtype=np.int32)
    got = [(t.tolist(), r.tolist(), i) for t, r, i in iter_run_slices(tokens, np.array([0, 7, 0, 3, 0]), 5, 4)]
    assert got == [([0, 1, 2, 3], [0, 4], 5),          # empty doc 5 at position 0; doc 6 begins
                   ([4, 5, 6, 7], [3, 0, 1], 6),       # doc 6 continues and ends; empty 7; doc 8 begins
                   ([8, 9], [2, 0], 8)]                # doc 8 ends; the empty last doc at the end


def test_literal_slices_boundaries_and_no_tokens():
    tokens = np.arange(8, dtype=np.int32)
    got = [(r.tolist(), i) for _, r, i in iter_run_slices(tokens, np.array([4, 0, 4]), 0, 4)]
    assert got == [([4], 0), ([0, 4], 1)]  # an empty doc on a boundary goes with the slice starting there
    got = [(t.size, r.tolist(), i) for t, r, i in iter_run_slices(np.zeros(0, np.int32), np.array([0, 0]), 3, 4)]
    assert got == [(0, [0, 0], 3)]
    with pytest.raises(ValueError, match="max_tokens=0 must be >= 1"):
        next(iter_run_slices(tokens, np.array([8]), 0, 0))


def test_literal_slices_with_a_shorter_first_one():
    tokens = np.arange(10, dtype=np.int32)
    got = [(t.tolist(), r.tolist(), i) for t, r, i in iter_run_slices(tokens, np.array([0, 7, 0, 3, 0]), 5, 4, 1)]
    assert got == [([0], [0, 1], 5),                   # the first slice: 1 token
                   ([1, 2, 3, 4], [4], 6),             # doc 6 continues
                   ([5, 6, 7, 8], [2, 0, 2], 6),       # doc 6 ends; empty 7; doc 8 begins
                   ([9], [1, 0], 8)]                   # doc 8 ends; the empty last doc at the end
    got = [(t.size, r.tolist(), i) for t, r, i in iter_run_slices(np.zeros(0, np.int32), np.array([0]), 3, 4, 2)]
    assert got == [(0, [0], 3)]
    for first in (0, 5):
        with pytest.raises(ValueError, match=f"first={first} must be in"):
            next(iter_run_slices(tokens, np.array([10]), 0, 4, first))


@SETTINGS
@given(corpus=corpora(), max_tokens=st.integers(1, 20), data=st.data())
def test_slices_cover_every_token_and_document_once(corpus, max_tokens, data):
    c, lengths = corpus
    tokens = flat_tokens(lengths)
    first = data.draw(st.one_of(st.none(), st.integers(1, max_tokens)))
    slices = list(iter_run_slices(tokens, lengths, 100, max_tokens, first))
    assert all(t.size <= max_tokens for t, _, _ in slices)
    if first is not None:  # boundaries at first, first + max_tokens, ...
        ends = np.cumsum([t.size for t, _, _ in slices])[:-1]
        assert ends.tolist() == list(range(first, tokens.size, max_tokens))
    assert np.concatenate([t for t, _, _ in slices]).tolist() == tokens.tolist()
    per_doc = np.zeros(lengths.size, np.int64)
    next_id = 100
    for t, runs, first_id in slices:
        assert runs.sum() == t.size and first_id in (next_id - 1, next_id)
        assert first_id == next_id or runs[0] > 0  # only a cut document continues
        np.add.at(per_doc, np.arange(first_id, first_id + runs.size) - 100, runs)
        next_id = first_id + runs.size
    assert next_id == 100 + lengths.size and per_doc.tolist() == lengths.tolist()


# ----------------------------------------------------------------------------- packers fed slices


@pytest.mark.slow  # > 5 s
@SETTINGS
@given(corpus=corpora(), max_tokens=st.integers(1, 20), data=st.data())
def test_concat_slices_give_the_same_chunks(corpus, max_tokens, data):
    c, lengths = corpus
    tokens = flat_tokens(lengths)
    cuts = data.draw(st.lists(st.integers(0, lengths.size), max_size=4))
    first = data.draw(st.one_of(st.none(), st.integers(1, max_tokens)))
    packer = StreamPacker(c, 0, dtype=np.int32)
    parts = []
    for t, runs, first_id in sliced(tokens, lengths, 0, max_tokens, cuts, first):
        parts += packer.push_runs_parts(t, runs, np.arange(first_id, first_id + runs.size))
    parts.append(packer.finish(pad=True))
    got = concat_chunks(parts, c, np.int32)
    want_ids, want_docs = naive_pack(docs_of(tokens, lengths), c, 0, np.int32)
    if any(length > max_tokens for length in lengths):
        event("a document longer than a slice")
    np.testing.assert_array_equal(got.input_ids, want_ids)
    np.testing.assert_array_equal(got.doc_ids(), want_docs)
    whole = concat_chunks([StreamPacker(c, 0, dtype=np.int32).push_runs(tokens, lengths, np.arange(lengths.size))],
                          c, np.int32)
    assert got.segment_lengths[:whole.segment_lengths.size].tolist() == whole.segment_lengths.tolist()


@SETTINGS
@given(corpus=corpora(), max_tokens=st.integers(1, 20), window=st.integers(0, 6), data=st.data())
def test_best_fit_slices_give_the_same_chunks(corpus, max_tokens, window, data):
    c, lengths = corpus
    tokens = flat_tokens(lengths)
    cuts = data.draw(st.lists(st.integers(0, lengths.size), max_size=4))
    packer = BestFitPacker(c, 0, window=window, first_doc_id=7, dtype=np.int32)
    parts = []
    for t, runs, first_id in sliced(tokens, lengths, 7, max_tokens, cuts):
        parts += packer.push_runs_parts(t, runs, first_id)
    parts.append(packer.finish())
    got = concat_chunks(parts, c, np.int32)
    want_ids, want_docs = naive_best_fit(docs_of(tokens, lengths), c, 0, window, np.int32)
    if any(length > max(max_tokens, c) for length in lengths):
        event("a document longer than a slice and C")
    np.testing.assert_array_equal(got.input_ids.reshape(-1, c), want_ids)
    np.testing.assert_array_equal(got.doc_ids().reshape(-1, c), np.where(want_docs >= 0, want_docs + 7, -1))


def test_best_fit_emits_full_pieces_while_the_document_is_read():
    """A long document's full pieces leave at once, before its window (or the document) ends."""
    c = 4
    packer = BestFitPacker(c, 0, window=3, dtype=np.int32)
    parts = packer.push_runs_parts(np.arange(3, dtype=np.int32), np.array([3]), 0)  # doc 0 begins
    assert sum(p.num_chunks for p in parts) == 0
    parts = packer.push_runs_parts(np.arange(3, 14, dtype=np.int32), np.array([2, 9]), 0)  # doc 0 ends, doc 1 begins
    (full,) = [p for p in parts if p.num_chunks]
    assert full.input_ids.tolist() == [[0, 1, 2, 3], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert full.doc_ids().tolist() == [[0] * 4, [1] * 4, [1] * 4]
    parts = packer.push_runs_parts(np.arange(14, 20, dtype=np.int32), np.array([4, 2]), 1)  # doc 1 goes on
    assert [p.input_ids.tolist() for p in parts if p.num_chunks] == [[[13, 14, 15, 16]]]
    last = packer.finish()  # short items: doc 0's [4], doc 1's [17], doc 2's [18, 19]
    assert last.input_ids.tolist() == [[4, 17, 18, 19]] and last.doc_ids().tolist() == [[0, 1, 2, 2]]


def test_best_fit_full_pieces_of_one_document_are_not_copied():
    tokens = np.arange(10 * 8 + 3, dtype=np.int32)
    packer = BestFitPacker(8, 0, window=0, dtype=np.int32)
    (full,) = packer.push_runs_parts(tokens, np.array([tokens.size]), 0)
    assert full.num_chunks == 10 and np.shares_memory(full.input_ids, tokens)


def test_best_fit_refuses_documents_out_of_order():
    packer = BestFitPacker(4, 0, window=0, dtype=np.int32)
    packer.push_runs_parts(np.arange(3, dtype=np.int32), np.array([3]), 0)
    with pytest.raises(ValueError, match="first_doc_id=5: documents must come in order; expected 1 or 0"):
        packer.push_runs_parts(np.arange(3, dtype=np.int32), np.array([3]), 5)


# ----------------------------------------------------------------------------- a shard with one long document


def write_shard(path, lengths: np.ndarray, fmt: str) -> np.ndarray:
    tokens = flat_tokens(lengths, seed=3)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))})
    if fmt == "parquet":
        pq.write_table(table, path)
    else:
        with paipc.new_file(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=3)
    return tokens


def read_output(out, result):
    table = paipc.open_file(out / result.file.path).read_all()
    return np.array(table.column("input_ids").combine_chunks().flatten()), table


@pytest.fixture
def spy_slices(monkeypatch):
    """Record the tokens of every slice a packer is fed."""
    sizes = []
    for cls in (StreamPacker, BestFitPacker):
        original = cls.push_runs_parts

        def spy(self, tokens, *args, _original=original):
            sizes.append(int(tokens.size))
            return _original(self, tokens, *args)
        monkeypatch.setattr(cls, "push_runs_parts", spy)
    return sizes


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_shard_with_one_2m_token_document_packs_identically_in_slices(tmp_path, strategy, spy_slices):
    lengths = np.array([2_000_000 + 5], np.int64)
    tokens = write_shard(tmp_path / "long.parquet", lengths, "parquet")
    sliced_result = pack_one(tmp_path / "long.parquet", tmp_path / "sliced", strategy, 64 << 10)
    assert len(spy_slices) > 30 and max(spy_slices) <= 64 << 10  # the packer was fed slices, not the document
    spy_slices.clear()
    whole_result = pack_one(tmp_path / "long.parquet", tmp_path / "whole", strategy, 1 << 30)
    assert max(spy_slices) == lengths[0]  # unsliced: one push of the whole document
    assert sliced_result.file.sha256 == whole_result.file.sha256
    assert sliced_result.file.num_bytes == whole_result.file.num_bytes
    for name in ("num_docs", "num_nonempty_docs", "num_tokens", "num_split_docs"):
        assert getattr(sliced_result, name) == getattr(whole_result, name)
    got, table = read_output(tmp_path / "sliced", sliced_result)
    full = lengths[0] // 2048 * 2048
    np.testing.assert_array_equal(got[:full], tokens[:full])  # the document in order, chunk after chunk
    assert sliced_result.num_split_docs == 1
    segment_ids = table.column("segment_doc_ids").to_pylist()
    assert all(ids == [5] for ids in segment_ids[:full // 2048])  # every slice continued doc 5: one segment
    if strategy == "concat":
        assert got.size == full and sliced_result.tail.input_ids.tolist() == tokens[full:].tolist()
    else:
        rest = int(lengths[0] - full)  # best_fit: the remainder, padded, in the last chunk
        assert got[full:full + rest].tolist() == tokens[full:].tolist() and table.num_rows == full // 2048 + 1


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_mixed_shard_packs_identically_for_any_slice_size(tmp_path, strategy, fmt):
    """Short, empty and long documents; a stream starting mid-chunk (concat head); slices that
    cut documents anywhere; the bytes and every count equal those of unsliced reading."""
    rng = np.random.default_rng(1)
    lengths = np.r_[rng.integers(0, 3000, 20), 0, 70_000, 0, 0, rng.integers(0, 5000, 9), 4096, 30_001, 3]
    path = tmp_path / f"mixed.{'parquet' if fmt == 'parquet' else 'arrow'}"
    write_shard(path, lengths, fmt)
    results = {}
    for read_batch_tokens, read_batch_size in [(1 << 30, 0), (1 << 30, 7), (4093, 0), (1000, 3), (2048, 1)]:
        out = tmp_path / f"out-{read_batch_tokens}-{read_batch_size}"
        results[out.name] = pack_one(path, out, strategy, read_batch_tokens, read_batch_size, token_offset=1000)
    first = next(iter(results.values()))
    for result in results.values():
        assert result.file.sha256 == first.file.sha256
        for name in ("num_docs", "num_nonempty_docs", "num_tokens", "num_split_docs"):
            assert getattr(result, name) == getattr(first, name)
        if strategy == "concat":
            assert result.head.input_ids.tolist() == first.head.input_ids.tolist()
            assert result.tail.input_ids.tolist() == first.tail.input_ids.tolist()
            assert result.tail.segment_doc_ids.tolist() == first.tail.segment_doc_ids.tolist()
    assert first.num_split_docs >= 3 and first.num_nonempty_docs < first.num_docs


# ----------------------------------------------------------------------------- max_document_tokens


def _write(path, docs, fmt, rows_per_unit=None):
    from raypack.inputs.registry import FORMATS

    FORMATS[fmt].write(str(path), pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), rows_per_unit)
    return str(path)


def _read(path, fmt, limit, **kwargs):
    from raypack.inputs.reading import iter_document_batches

    return [d for b in iter_document_batches(path, fmt, batch_size=4, max_document_tokens=limit, **kwargs)
            for d in b.tokens.to_pylist()]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "arrow"])
def test_a_document_over_the_limit_names_file_row_and_length(tmp_path, fmt):
    docs = [[1, 2], [3] * 5, [], [4] * 9, [5]]
    path = _write(tmp_path / f"s.{fmt}", docs, fmt, rows_per_unit=2)
    assert _read(path, fmt, 9) == docs  # at the limit: read
    assert _read(path, fmt, None) == docs
    with pytest.raises(InputError, match=rf"shard .*s\.{fmt} row 3: the document holds 9 tokens, more than "
                                         r"max_document_tokens=8 .*raise --max-document-tokens .*or split the "
                                         r"document upstream"):
        _read(path, fmt, 8)
    with pytest.raises(InputError, match=r"row 1: the document holds 5 tokens, more than max_document_tokens=4"):
        _read(path, fmt, 4)
    long = _write(tmp_path / f"long.{fmt}", [[1] * 1_234], fmt)  # counts as the other lines write them
    with pytest.raises(InputError, match=r"row 0: the document holds 1,234 tokens, more than max_document_tokens="
                                         r"1,000 "):
        _read(long, fmt, 1_000)


def test_parquet_document_alone_in_its_row_group_is_refused_from_the_footer(tmp_path, monkeypatch):
    """No byte of a document the footer shows too long is read: pyarrow is never asked for its row group."""
    docs = [[1, 2], [3, 4], list(range(50)), [5]]
    path = _write(tmp_path / "s.parquet", docs, "parquet", rows_per_unit=2)
    with pq.ParquetWriter(path, pa.schema([("input_ids", pa.list_(pa.int32()))])) as writer:
        for group in (docs[:2], docs[2:3], docs[3:]):
            writer.write_table(pa.table({"input_ids": pa.array(group, pa.list_(pa.int32()))}))
    assert pq.ParquetFile(path).metadata.num_row_groups == 3
    asked = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *args, row_groups=None, **kwargs):
        asked.extend(row_groups)
        return original(self, *args, row_groups=row_groups, **kwargs)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    with pytest.raises(InputError, match=r"s\.parquet row 2: the document holds 50 tokens, more than "
                                         r"max_document_tokens=49"):
        _read(path, "parquet", 49)
    assert asked == [0]  # row group 1 (the long document) was refused before pyarrow read it
    asked.clear()
    assert _read(path, "parquet", 50) == docs and asked == [0, 1, 2]


def test_parquet_row_group_that_may_hold_a_long_document_is_read_in_fewer_rows(tmp_path, monkeypatch):
    from raypack.inputs.base import ReadLimits
    from raypack.inputs.parquet import ParquetFormat

    docs = [[1]] * 40 + [list(range(100))] + [[2]] * 59
    path = _write(tmp_path / "s.parquet", docs, "parquet")
    sizes = [len(b[0]) for b in ParquetFormat().read_columns(path, ("input_ids",), None, ReadLimits(64, 1 << 20, 99))]
    assert sum(sizes) == 100 and max(sizes) <= 99 * 100 // 199  # rows expected to hold ~99 tokens at the mean
    sizes = [len(b[0]) for b in ParquetFormat().read_columns(path, ("input_ids",), None, ReadLimits(64, 1 << 20, 200))]
    assert sizes == [64, 36]  # the footer bounds every document within the limit: read as asked


def test_jsonl_line_over_the_limit_bytes_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    import pyarrow.json as pajson

    from raypack.inputs.jsonl import JSON_BYTES_PER_TOKEN

    docs = [[1], [2, 3], [7] * 200, [4]]
    path = _write(tmp_path / "s.jsonl", docs, "jsonl")
    parsed = []
    original = pajson.read_json
    monkeypatch.setattr(pajson, "read_json", lambda src, **kw: parsed.append(src.size()) or original(src, **kw))
    limit = 5  # 5 * 24 = 120 bytes a line; the long line has 415
    for block_size in (1 << 20, 64):  # a long line inside one block, and one running across blocks
        parsed.clear()
        with pytest.raises(InputError, match=rf"s\.jsonl row 2: its line is longer than {limit * JSON_BYTES_PER_TOKEN} "
                                             r"bytes \(24 per token of max_document_tokens=5; .*raise "
                                             r"--max-document-tokens"):
            _read(path, "jsonl", limit, json_block_size=block_size)
        assert all(size < 400 for size in parsed)  # the long line was never handed to the parser
    assert _read(path, "jsonl", 200) == docs


def test_pack_refuses_a_long_document_with_one_line(tmp_path, capsys):
    from raypack.cli import main

    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "s.parquet", [[1, 2], list(range(1, 30)), [3]], "parquet", rows_per_unit=1)
    args = ["pack", "--local", "--input", str(tmp_path / "in"), "--context-length", "4"]
    assert main([*args, "--output", str(tmp_path / "o1"), "--max-document-tokens", "28"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "s.parquet row 1: the document holds 29 tokens, more than " \
                                     "max_document_tokens=28" in err
    assert not (tmp_path / "o1").exists()
    assert main([*args, "--output", str(tmp_path / "o2"), "--max-document-tokens", "29"]) == 0
    assert main([*args, "--output", str(tmp_path / "o3"), "--max-document-tokens", "0"]) == 2
    assert "--max-document-tokens 0: must be an integer >= 1" in capsys.readouterr().err
