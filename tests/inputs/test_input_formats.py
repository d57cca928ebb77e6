"""The input-format seam: a fourth format, defined here and registered by one line, packs like Parquet."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from raypack.errors import InputError
from raypack.inputs import registry
from raypack.inputs.base import InputFormat, ReadLimits, ShardInfo
from raypack.pack.config import make_config
from raypack.pack.job import run_pack

from helpers import read_output
from reference import naive_pack


class SpaceSeparatedFormat(InputFormat):
    """A toy format: one document per line, its token ids separated by spaces (a blank line: []).
    No units, no side columns, no text: only what the protocol requires."""

    name = "tsv"
    title = "space-separated ids"
    suffixes = (".tsv",)

    def _documents(self, path: str) -> list[list[int]]:
        with open(path) as f:
            return [[int(t) for t in line.split()] for line in f.read().splitlines()]

    def inspect(self, path: str, column: str, limits: ReadLimits) -> ShardInfo:
        docs = self._documents(path)
        return ShardInfo(path, self.name, len(docs), sum(map(len, docs)), "int64", "scan")

    def read_columns(self, path, columns, units, limits):
        if columns[1:]:
            raise InputError(f"shard {path}: a {self.title} shard has no side columns")
        docs = self._documents(path)
        for start in range(0, len(docs), limits.batch_size):
            yield (pa.array(docs[start:start + limits.batch_size], pa.list_(pa.int64())),)

    def side_types(self, path, names):
        raise InputError(f"shard {path}: a {self.title} shard has no side columns")

    def write(self, path, table, rows_per_unit=None):
        with open(path, "w") as f:
            f.writelines(" ".join(map(str, doc)) + "\n" for doc in table.column(0).to_pylist())


@pytest.fixture
def tsv(monkeypatch):
    monkeypatch.setitem(registry.FORMATS, "tsv", SpaceSeparatedFormat())  # the one registry line
    return registry.FORMATS["tsv"]


def documents(seed: int, num_docs: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, rng.integers(0, 40)).tolist() for _ in range(num_docs)]


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_a_registered_fourth_format_packs_like_parquet(tmp_path, tsv, strategy):
    shards = [documents(seed, 60) for seed in range(3)]
    for fmt in ("tsv", "parquet"):
        (tmp_path / fmt).mkdir()
        for k, docs in enumerate(shards):
            table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})
            registry.FORMATS[fmt].write(str(tmp_path / fmt / f"s{k}.{fmt}"), table, 25)
    outputs = {}
    for fmt in ("tsv", "parquet"):
        config = make_config(dict(inputs=[str(tmp_path / fmt)], output=str(tmp_path / f"out-{fmt}"),
                                  context_length=16, read_batch_size=7, strategy=strategy, token_dtype="int32"))
        run_pack(config, engine="local")
        outputs[fmt] = read_output(str(tmp_path / f"out-{fmt}"))
    (tsv_ids, tsv_docs, manifest), (pq_ids, pq_docs, _) = outputs["tsv"], outputs["parquet"]
    assert tsv_ids.shape[0] > 10 and [s["format"] for s in manifest["shards"]] == ["tsv"] * 3
    np.testing.assert_array_equal(tsv_ids, pq_ids)
    np.testing.assert_array_equal(tsv_docs, pq_docs)
    if strategy == "concat":
        want_ids, want_docs = naive_pack([d for docs in shards for d in docs], 16, 0, np.int32)
        np.testing.assert_array_equal(tsv_ids, want_ids)
        np.testing.assert_array_equal(tsv_docs, want_docs)


def test_a_fourth_format_gets_the_shared_checks_and_refusals(tmp_path, tsv):
    from raypack.inputs.reading import iter_document_batches
    from raypack.inputs.shards import discover_shards

    (tmp_path / "a.tsv").write_text("1 2 3\n\n4 -5\n")
    assert discover_shards([str(tmp_path)]) == [str(tmp_path / "a.tsv")]
    with pytest.raises(InputError, match=r"a\.tsv row 2: token -5 is negative"):
        list(iter_document_batches(str(tmp_path / "a.tsv"), "tsv", batch_size=2))
    with pytest.raises(ValueError, match=r"units: a space-separated ids shard is read whole"):
        list(iter_document_batches(str(tmp_path / "a.tsv"), "tsv", units=(0, 1)))
    with pytest.raises(InputError, match=r"text input .*a\.tsv is tsv; give text as Parquet"):
        tsv.text_tasks(str(tmp_path / "a.tsv"), task_rows=1, task_bytes=1)


def test_without_its_registry_line_the_suffix_is_unknown(tmp_path):
    (tmp_path / "a.tsv").write_text("1 2 3\n")
    from raypack.inputs.shards import discover_shards

    with pytest.raises(InputError, match=r"a\.tsv has an unknown shard suffix"):
        discover_shards([str(tmp_path / "a.tsv")])
