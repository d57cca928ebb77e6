"""What a command's processes do not import: pandas in ``--local`` runs; pandas and Ray Data in the one pass on Ray.

pyarrow's pandas shim imports pandas the first time a process calls ``pa.array``,
``Array.to_numpy``, ``pa.scalar`` and the like: 0.2 s on the path of a fresh process's first task and
33 MiB (BENCHMARKS.md, "stop 60"), for nothing a ``--local`` run uses. raypack builds its arrays from
buffers instead (raypack.rules.arrays). The one pass on Ray runs plain actors, so its driver needs no
Ray Data (0.3 s and 50 MiB), and its actors none of it either. A new call that imports one fails here,
naming itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import CORPUS, train_byte_level_bpe

LAUNCHER = r"""
import importlib.abc, os, runpy, sys, traceback
FORBIDDEN = set(os.environ.get("RAYPACK_TEST_FORBIDDEN", "pandas").split(","))

class Forbidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in FORBIDDEN:
            print(name, "imported here:", file=sys.stderr)
            traceback.print_stack(file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
        return None

sys.meta_path.insert(0, Forbidden())
sys.argv = ["raypack", *sys.argv[1:]]
runpy.run_module("raypack.cli", run_name="__main__")
"""


def raypack_without(*argv: str, forbidden: str = "pandas") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LAUNCHER, *argv], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "RAYPACK_NO_PROGRESS": "1", "RAYPACK_TEST_FORBIDDEN": forbidden})


def test_the_guard_catches_an_import_of_pandas():
    """The launcher itself: a process that imports pandas exits 3 (so the test below can fail)."""
    done = subprocess.run([sys.executable, "-c", LAUNCHER.replace('runpy.run_module("raypack.cli", '
                                                                   'run_name="__main__")', "import pandas")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "pandas imported here:" in done.stderr


TEXTS = [text for text in CORPUS if len(text) < 20000] * 3


def text_corpus(tmp_path) -> tuple[str, str]:
    """(a directory of two Parquet text files, a byte-level BPE tokenizer.json trained on them)."""
    tokenizer = tmp_path / "tokenizer.json"
    train_byte_level_bpe(TEXTS, 500).save(str(tokenizer))
    text_dir = tmp_path / "text"
    text_dir.mkdir()
    for k in range(2):
        pq.write_table(pa.table({"text": TEXTS[k::2]}), text_dir / f"part-{k}.parquet", row_group_size=7)
    return str(text_dir), str(tokenizer)


@pytest.mark.slow  # ~12 s: a fresh process per command
def test_local_commands_do_not_import_pandas(tmp_path):
    texts = TEXTS
    text_dir, t = text_corpus(tmp_path)
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    commands = [
        ("pack", "--input", str(text_dir), "--output", str(tmp_path / "one"), "--local", "--context-length", "64",
         "--tokenizer", t),
        ("pack", "--input", str(jsonl), "--output", str(tmp_path / "fit"), "--local", "--context-length", "64",
         "--tokenizer", t, "--strategy", "best_fit", "--bos", "1", "--eos", "2"),
        ("pack", "--input", str(jsonl), "--output", str(tmp_path / "ref"), "--local", "--context-length", "64",
         "--tokenizer", t, "--tokenizer-backend", "reference", "--long-docs", "truncate"),
        ("pack", "--input", str(text_dir), "--output", str(tmp_path / "dry"), "--local", "--context-length", "64",
         "--tokenizer", t, "--dry-run"),
        ("tokenize", "--input", str(text_dir), "--output", str(tmp_path / "tok"), "--local", "--tokenizer", t),
        ("pack", "--input", str(tmp_path / "tok"), "--output", str(tmp_path / "two"), "--local",
         "--context-length", "64"),
        ("pack", "--input", str(tmp_path / "tok"), "--output", str(tmp_path / "two-fit"), "--local",
         "--context-length", "64", "--strategy", "best_fit"),
        ("verify", str(tmp_path / "one"), "--check-tokenizer"),
        ("verify", str(tmp_path / "two")),
        ("stats", str(tmp_path / "two")),
        ("export", "--format", "megatron", "--output", str(tmp_path / "megatron" / "corpus"), str(tmp_path / "two"),
         "--verify"),
    ]
    for argv in commands:
        done = raypack_without(*argv)
        assert done.returncode == 0, f"raypack {' '.join(argv[:2])}: exit {done.returncode}\n{done.stderr[-3000:]}"
    # the one pass and the two steps give the same chunks, as everywhere else
    digests = [json.loads((tmp_path / name / "manifest.json").read_text())["content_sha256"] for name in ("one", "two")]
    assert digests[0] == digests[1]


SITECUSTOMIZE = r"""
import importlib.abc, os, sys, traceback

class Forbidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("pandas", "ray.data"):
            with open(os.path.join(os.environ["RAYPACK_TEST_HITS"], f"hit-{os.getpid()}-{name}"), "w") as f:
                f.write(" ".join(sys.argv[:1]) + "\n" + "".join(traceback.format_stack()))
        return None

sys.meta_path.insert(0, Forbidden())
"""


@pytest.mark.slow  # starts an embedded Ray (~6 s)
def test_the_one_pass_on_ray_imports_neither_ray_data_nor_pandas(tmp_path):
    """Its driver and its packer actors, every Python process of the run (a sitecustomize on PYTHONPATH, which
    Ray's workers inherit, notes each import): the actors hand their result rows back as Arrow IPC bytes, since
    Ray's pickling of an Arrow table imports pandas."""
    text_dir, tokenizer = text_corpus(tmp_path)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    hits = tmp_path / "hits"
    hits.mkdir()
    env = {**os.environ, "RAYPACK_NO_PROGRESS": "1", "RAYPACK_TEST_HITS": str(hits),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "raypack.cli", "pack", "--input", text_dir, "--output",
                           str(tmp_path / "out"), "--context-length", "64", "--tokenizer", tokenizer, "--workers", "2",
                           "--task-rows", "5"], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "documents" in done.stdout
    found = {path.name: path.read_text()[-2000:] for path in hits.iterdir()}
    assert found == {}
