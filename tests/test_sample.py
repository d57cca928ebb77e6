"""The sample corpus generator: deterministic, the requested shape, readable in every format."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest

from raypack.errors import InputError
from raypack.sample import lognormal_lengths, main, write_sample_corpus


def read_docs(path: str) -> pa.ListArray:
    """The ``input_ids`` column of a shard in any format, as one list array."""
    if path.endswith(".parquet"):
        table = pq.read_table(path)
    elif path.endswith(".arrow"):
        table = pa.ipc.open_file(path).read_all()
    else:
        table = pajson.read_json(path)
    return table.column("input_ids").combine_chunks()


def corpus(root, **overrides) -> list[str]:
    args = dict(num_shards=3, docs_per_shard=50, mean_doc_len=20, seed=7)
    args.update(overrides)
    return write_sample_corpus(str(root), **args)


def test_shard_names_and_count(tmp_path):
    paths = corpus(tmp_path, num_shards=4)
    assert paths == [str(tmp_path / f"shard-{k:05d}.parquet") for k in range(4)]
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(p) for p in paths]
    assert all(len(read_docs(p)) == 50 for p in paths)


def test_deterministic_for_a_seed(tmp_path):
    first, again, other = corpus(tmp_path / "a"), corpus(tmp_path / "b"), corpus(tmp_path / "c", seed=8)
    for a, b in zip(first, again):
        assert read_docs(a).equals(read_docs(b))
    assert not read_docs(first[0]).equals(read_docs(other[0]))
    assert not read_docs(first[0]).equals(read_docs(first[1])), "shards should differ from each other"


@pytest.mark.parametrize("dtype", ["int32", "uint16", "int64"])
def test_dtype_and_tokens(tmp_path, dtype):
    (path,) = corpus(tmp_path, num_shards=1, dtype=dtype, vocab_size=1000)
    docs = read_docs(path)
    assert docs.type == pa.list_(pa.from_numpy_dtype(np.dtype(dtype)))
    tokens = docs.flatten().to_numpy()
    assert tokens.min() >= 0 and tokens.max() < 1000 and tokens.max() > 900


def test_same_tokens_in_every_dtype(tmp_path):
    (narrow,) = corpus(tmp_path / "a", num_shards=1, dtype="uint16")
    (wide,) = corpus(tmp_path / "b", num_shards=1, dtype="int64")
    assert read_docs(narrow).cast(pa.list_(pa.int64())).equals(read_docs(wide))


def test_lognormal_lengths_mean():
    lengths = lognormal_lengths(20_000, 170.0, seed=3)
    assert lengths.dtype == np.int64 and lengths.shape == (20_000,) and lengths.min() >= 1
    assert abs(lengths.mean() / 170.0 - 1) < 0.15
    assert lengths.max() > 3 * 170, "lengths should be spread, not constant"
    np.testing.assert_array_equal(lengths, lognormal_lengths(20_000, 170.0, seed=3))


def test_corpus_mean_doc_len(tmp_path):
    paths = corpus(tmp_path, num_shards=2, docs_per_shard=10_000, mean_doc_len=40, vocab_size=100, dtype="uint8")
    lengths = np.concatenate([np.diff(read_docs(p).offsets.to_numpy()) for p in paths])
    assert lengths.size == 20_000 and abs(lengths.mean() / 40 - 1) < 0.15


@pytest.mark.parametrize("fmt", ["jsonl", "arrow"])
def test_other_formats_hold_the_same_documents(tmp_path, fmt):
    reference = corpus(tmp_path / "parquet", dtype="int64")
    paths = corpus(tmp_path / fmt, fmt=fmt, dtype="int64")
    assert all(p.endswith(f".{fmt}") for p in paths)
    for ref, path in zip(reference, paths):
        assert read_docs(path).equals(read_docs(ref))


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_row_group_size(tmp_path, fmt):
    (path,) = corpus(tmp_path, num_shards=1, fmt=fmt, row_group_size=16)
    if fmt == "parquet":
        assert pq.ParquetFile(path).metadata.num_row_groups == 4
    else:
        assert pa.ipc.open_file(path).num_record_batches == 4


def test_empty_shards(tmp_path):
    paths = corpus(tmp_path, docs_per_shard=0)
    assert [len(read_docs(p)) for p in paths] == [0, 0, 0]


def test_refuses_to_mix_with_other_shards(tmp_path):
    corpus(tmp_path, num_shards=3)
    corpus(tmp_path, num_shards=3)  # the same names: overwritten
    with pytest.raises(InputError, match="already holds other shards.*shard-00002.parquet"):
        corpus(tmp_path, num_shards=2)


@pytest.mark.parametrize("overrides, message", [
    (dict(num_shards=0), "num_shards=0 must be >= 1"),
    (dict(docs_per_shard=-1), "docs_per_shard=-1 must be >= 0"),
    (dict(mean_doc_len=0), "mean_doc_len=0 must be > 0"),
    (dict(fmt="csv"), "fmt='csv' must be one of parquet, jsonl, arrow"),
    (dict(dtype="float32"), "dtype=float32 must be an integer dtype"),
    (dict(dtype="uint8", vocab_size=300), "vocab_size=300 must be in 1..256 for dtype uint8"),
    (dict(row_group_size=0), "row_group_size=0 must be >= 1"),
])
def test_rejects_bad_arguments(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        corpus(tmp_path, **overrides)


def test_main_prints_one_line(tmp_path, capsys):
    out = tmp_path / "sample"
    argv = ["--output", str(out), "--shards", "2", "--docs-per-shard", "30", "--context-length", "64", "--seed", "1"]
    assert main(argv) == 0
    line = capsys.readouterr().out
    docs = [read_docs(str(out / f"shard-0000{k}.parquet")) for k in range(2)]
    num_tokens = sum(len(d.flatten()) for d in docs)
    assert line == f"wrote 2 parquet shards, 60 documents, {num_tokens} tokens to {out}\n"


def test_main_default_mean_is_a_third_of_the_context(tmp_path, capsys):
    argv = ["--output", str(tmp_path), "--shards", "1", "--docs-per-shard", "5000", "--context-length", "300"]
    assert main(argv) == 0
    lengths = np.diff(read_docs(str(tmp_path / "shard-00000.parquet")).offsets.to_numpy())
    assert abs(lengths.mean() / 100 - 1) < 0.15


def test_main_reports_bad_input_in_one_line(tmp_path, capsys):
    assert main(["--output", str(tmp_path), "--shards", "0", "--docs-per-shard", "5", "--context-length", "8"]) == 2
    err = capsys.readouterr().err
    assert err == "error: num_shards=0 must be >= 1\n"
