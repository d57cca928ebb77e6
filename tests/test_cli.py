"""The entry points a user runs: the configs shipped in configs/, `raypack pack` with the
embedded Ray, and jobs/pack.py (the `ray job submit` entrypoint)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from raypack.cli import main
from raypack.config import load_config
from raypack.packed import read_packed
from raypack.sample import write_sample_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.toml"))))
def test_shipped_configs_load(path):
    config = load_config(path)
    assert config.context_length >= 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(str(root), num_shards=3, docs_per_shard=50, mean_doc_len=30, seed=7)
    return str(root)


def test_cli_pack_with_ray_prints_the_summary(ray_session, tmp_path, corpus, capsys):
    code = main(["pack", "--config", os.path.join(ROOT, "configs", "tiny.toml"), "--input", corpus,
                 "--output", str(tmp_path / "out"), "--context-length", "64", "--workers", "2"])
    printed = capsys.readouterr().out
    assert code == 0
    for word in ("documents", "tokens", "chunks", "padding", "split documents", "tokens/s"):
        assert word in printed
    assert len(read_packed(str(tmp_path / "out"))) > 0
    assert main(["verify", str(tmp_path / "out")]) == 0


@pytest.mark.slow  # > 5 s
def test_job_entrypoint_runs(tmp_path, corpus):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "jobs", "pack.py"), "--local", "--input", corpus, "--output", str(out),
         "--context-length", "64", "--pad-token", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "packed" in done.stdout and (out / "manifest.json").exists()
