"""The ``--local`` commands never import pandas.

pyarrow's pandas shim imports pandas the first time a process calls ``pa.array``,
``Array.to_numpy``, ``pa.scalar`` and the like: 0.2 s on the path of a fresh process's first task and
33 MiB (BENCHMARKS.md, "pandas"), for nothing a ``--local`` run uses. raypack builds its arrays from
buffers instead (raypack.rules.arrays). Each command here runs in a fresh process in which importing
pandas ends the process with exit 3 and the stack on stderr, so a new call that asks the shim fails
here, naming itself.
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

NO_PANDAS = r"""
import importlib.abc, os, runpy, sys, traceback

class NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pandas":
            print("pandas imported here:", file=sys.stderr)
            traceback.print_stack(file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
        return None

sys.meta_path.insert(0, NoPandas())
sys.argv = ["raypack", *sys.argv[1:]]
runpy.run_module("raypack.cli", run_name="__main__")
"""


def raypack_without_pandas(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_PANDAS, *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAYPACK_NO_PROGRESS": "1"})


def test_the_guard_catches_an_import_of_pandas():
    """The launcher itself: a process that imports pandas exits 3 (so the test below can fail)."""
    done = subprocess.run([sys.executable, "-c", NO_PANDAS.replace('runpy.run_module("raypack.cli", '
                                                                   'run_name="__main__")', "import pandas")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "pandas imported here:" in done.stderr


@pytest.mark.slow  # ~12 s: a fresh process per command
def test_local_commands_do_not_import_pandas(tmp_path):
    texts = [text for text in CORPUS if len(text) < 20000] * 3
    tokenizer = tmp_path / "tokenizer.json"
    train_byte_level_bpe(texts, 500).save(str(tokenizer))
    text_dir = tmp_path / "text"
    text_dir.mkdir()
    for k in range(2):
        pq.write_table(pa.table({"text": texts[k::2]}), text_dir / f"part-{k}.parquet", row_group_size=7)
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    t = str(tokenizer)
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
        done = raypack_without_pandas(*argv)
        assert done.returncode == 0, f"raypack {' '.join(argv[:2])}: exit {done.returncode}\n{done.stderr[-3000:]}"
    # the one pass and the two steps give the same chunks, as everywhere else
    digests = [json.loads((tmp_path / name / "manifest.json").read_text())["content_sha256"] for name in ("one", "two")]
    assert digests[0] == digests[1]
