"""raypack stats against a naive count over pack_sequences' dense doc ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.cli import main
from raypack.cli.stats import NUM_BINS, packing_stats
from raypack.errors import install_extra
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.rules.core import pack_sequences

from reference import naive_best_fit


def write_shards(root, docs, cuts):
    bounds = [0, *cuts, len(docs)]
    for k in range(len(bounds) - 1):
        table = pa.table({"input_ids": pa.array(docs[bounds[k]: bounds[k + 1]], pa.list_(pa.int32()))})
        pq.write_table(table, root / f"part-{k:03d}.parquet")
    return bounds


def naive(docs, c, bounds=None, window=None):
    """Dense doc ids by the reference (concat; best_fit per shard when ``window`` is given)."""
    if window is None:
        _, doc_ids = pack_sequences([np.asarray(d, np.int32) for d in docs], c, 0)
    else:
        parts = [naive_best_fit(docs[a:b], c, 0, window, dtype=np.int32)[1] for a, b in zip(bounds, bounds[1:])]
        doc_ids = np.concatenate([np.where(p >= 0, p + a, -1) for p, a in zip(parts, bounds)])
    chunks_of = {}
    fragments = []
    for i, row in enumerate(doc_ids):
        start = 0
        for j in range(1, len(row) + 1):
            if j == len(row) or row[j] != row[start]:
                if row[start] >= 0:
                    chunks_of.setdefault(int(row[start]), set()).add(i)
                    fragments.append(j - start)
                start = j
    split = sorted(d for d, chunks in chunks_of.items() if len(chunks) > 1)
    return split, fragments, int((doc_ids == -1).sum())


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stats_equal_a_naive_count(tmp_path, seed, strategy):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 100, size=n).tolist() for n in rng.integers(0, 40, size=80)]
    shard_dir = tmp_path / "in"
    shard_dir.mkdir()
    bounds = write_shards(shard_dir, docs, [20, 21, 50])
    out = tmp_path / "out"
    run_pack(make_config(dict(inputs=[str(shard_dir)], output=str(out), context_length=16, pad_token=0,
                              chunks_per_record_batch=3, strategy=strategy, best_fit_window=7)), engine="local")
    stats = packing_stats(str(out))
    split, fragments, padding = naive(docs, 16, bounds, 7 if strategy == "best_fit" else None)
    assert stats.strategy == strategy
    assert len(split) > 3, "vacuous: the corpus should split documents"
    assert stats.split_documents == len(split)
    assert stats.padding_positions == padding
    assert stats.fragment_counts.sum() == len(fragments)
    assert stats.fragment_counts.tolist() == np.histogram(fragments, bins=stats.fragment_bin_edges)[0].tolist()
    assert stats.fragment_counts.size <= NUM_BINS
    per_shard = [sum(bounds[k] <= d < bounds[k + 1] for d in split) for k in range(len(bounds) - 1)]
    assert stats.shard_split_documents.tolist() == per_shard
    assert stats.shard_documents.tolist() == np.diff(bounds).tolist()


@pytest.fixture
def small_output(tmp_path):
    shard_dir = tmp_path / "in"
    shard_dir.mkdir()
    write_shards(shard_dir, [[1] * 10, [2] * 30, [3] * 5], [1])
    out = tmp_path / "out"
    run_pack(make_config(dict(inputs=[str(shard_dir)], output=str(out), context_length=16, pad_token=0)),
             engine="local")
    return str(out)


def test_stats_cli(small_output, capsys):
    assert main(["stats", small_output]) == 0
    printed = capsys.readouterr().out
    assert "split documents" in printed and "fragment lengths" in printed and "part-001.parquet" in printed


def test_stats_plot(small_output, tmp_path):
    pytest.importorskip("matplotlib")
    from raypack.cli.stats import plot_stats

    png = plot_stats(packing_stats(small_output), str(tmp_path / "stats.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_one_line_before_the_report(small_output, tmp_path, monkeypatch, capsys):
    import importlib.util

    from raypack.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["stats", small_output, "--plot", str(tmp_path / "s.png")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and install_extra("plot") in err, (out, err)


@pytest.mark.parametrize("name, said", [
    ("x.txt", "give a file name ending in .png (the plot is a PNG)"),
    ("x", "give a file name ending in .png (the plot is a PNG)"),
    ("dir.png", "give a file name ending in .png (the plot is a PNG)"),  # a directory of that name
    ("missing/x.png", "is not a directory; create it, or give a path in one"),
])
def test_a_plot_path_that_cannot_be_written_is_one_line_before_the_report(small_output, tmp_path, capsys, name,
                                                                          said):
    """A new user's trial: a .txt name or a missing folder gave a traceback after the report, and a name without
    .png (or a directory) wrote another file than the one the line named."""
    pytest.importorskip("matplotlib")
    from raypack.cli import main

    (tmp_path / "dir.png").mkdir()
    assert main(["stats", small_output, "--plot", str(tmp_path / name)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"raypack: error: --plot {tmp_path / name}: " + (
        said if not said.startswith("is not") else f"{tmp_path / 'missing'} {said}") + "\n", err


@pytest.mark.parametrize("files, said", [
    (["index.json", "shard.00000.mds"], "an MDS export (index.json)"),
    (["corpus.bin", "corpus.idx"], "a Megatron indexed dataset (corpus.bin + .idx)"),
])
def test_an_export_given_as_an_output_is_named_as_one(tmp_path, capsys, files, said):
    """stats of an MDS export said "1 file(s) like index.json: an input", and of a Megatron one "the job did not
    finish" (a new user's trial)."""
    from raypack.cli import main

    for name in files:
        (tmp_path / name).write_bytes(b"x")
    assert main(["stats", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"raypack: error: {tmp_path} is {said}, not a packed output (its reader "
                                       "reads it); give the directory raypack pack wrote (its --output)\n")
