"""``raypack pack --dry-run``: its figures equal what real runs of both strategies write, and it
writes nothing."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from raypack.cli import main
from raypack.pack.config import make_config
from raypack.pack.dry_run import dry_run

from helpers import pack, random_corpus, write_shards


@pytest.fixture
def corpus(tmp_path):
    docs = random_corpus(5, 400, 30)
    return docs, write_shards(tmp_path, docs, [100, 100, 250])


def config(shard_dir, **values):
    return make_config(dict(inputs=[shard_dir], output="unused", context_length=8, pad_token=0, **values))


def test_whole_corpus_figures_equal_real_runs(tmp_path, corpus):
    docs, shard_dir = corpus
    report = dry_run(config(shard_dir, best_fit_window=16), sample_docs=0)
    concat, best_fit = report.strategies
    for figures, options in ((concat, {}), (best_fit, dict(strategy="best_fit", best_fit_window=16))):
        name = options.get("strategy", "concat")
        pack(tmp_path, shard_dir, name=name, **options)
        counts = json.load(open(tmp_path / name / "manifest.json"))["counts"]
        assert (figures.num_chunks, figures.padding_positions, figures.split_documents) == (
            counts["chunks"], counts["padding_positions"], counts["split_documents"])
    assert report.num_docs == report.corpus_docs == len(docs)
    assert best_fit.split_short_documents == 0
    positions = np.cumsum([0] + [len(d) for d in docs])
    cut_short = sum(1 for d, start in zip(docs, positions)
                    if 0 < len(d) <= 8 and start // 8 != (start + len(d) - 1) // 8)
    assert concat.split_short_documents == cut_short > 0
    assert dict(best_fit.window_padding)[16] == best_fit.padding_positions


def test_sample_is_the_first_documents_of_the_stream(corpus):
    docs, shard_dir = corpus
    report = dry_run(config(shard_dir), sample_docs=120)
    assert report.num_docs == 120 and report.num_shards == 3  # shard 0, the empty shard 1, 20 of shard 2
    assert report.num_tokens == sum(len(d) for d in docs[:120])


def test_cli_dry_run_prints_both_and_writes_nothing(tmp_path, corpus, capsys):
    _, shard_dir = corpus
    out = tmp_path / "never"
    assert main(["pack", "--input", shard_dir, "--output", str(out), "--context-length", "8", "--dry-run",
                 "--sample-docs", "0"]) == 0
    printed = capsys.readouterr().out
    assert "concat" in printed and "best_fit (window 8,192)" in printed and "nothing written" in printed
    assert not os.path.exists(out) and not [p for p in os.listdir(tmp_path) if "staging" in p]
    assert main(["pack", "--input", shard_dir, "--context-length", "8", "--dry-run", "--sample-docs", "-1"]) == 2
    assert "--sample-docs=-1 must be >= 0" in capsys.readouterr().err
