"""Arrow's pool told to hand freed pages back in a command that tokenizes text (raypack.io.allocator): set
before pyarrow loads, from the command line, never over a value the caller chose, and not for the token-only
job. What it saves and costs is a benchmark's figure (bench/bench_onepass.py --rss), not a test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raypack.io import allocator
from raypack.io.allocator import LEGACY_PURGE_DELAY, PURGE_DELAY, PURGE_DELAY_MS, tokenizes

REPO = Path(__file__).resolve().parents[2]

# The command as `python -m raypack.cli ARGS` or the raypack script runs it, with a note of the environment at
# the moment anything first imports pyarrow: mimalloc reads its settings once, when libarrow loads.
WATCH = r"""
import builtins, json, os, sys
seen = {}
real_import = builtins.__import__
def watching(name, *args, **kwargs):
    if name.split(".")[0] == "pyarrow" and "at_pyarrow" not in seen:
        seen["at_pyarrow"] = os.environ.get("MIMALLOC_PURGE_DELAY")
    return real_import(name, *args, **kwargs)
builtins.__import__ = watching
import raypack, runpy
entry, args = sys.argv[1], sys.argv[2:]
sys.argv = ["raypack", *args]
try:
    if entry == "module":  # as python -m raypack.cli runs it: the package raypack.cli is imported first
        runpy.run_module("raypack.cli", run_name="__main__", alter_sys=True)
    code = raypack.console_main(args)  # as the raypack script and jobs/pack.py run it
except SystemExit as stop:  # argparse's, after the help
    code = stop.code
seen["code"] = code
seen["pyarrow_loaded"] = "pyarrow.lib" in sys.modules
print("SEEN", json.dumps(seen))
"""


def _watch(args: list[str], entry: str = "module", env_extra: dict[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (PURGE_DELAY, LEGACY_PURGE_DELAY)}
    env.update(env_extra or {}, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", WATCH, entry, *args], env=env, capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.rsplit("SEEN ", 1)[1])
    assert seen["code"] == 0 and seen["pyarrow_loaded"], seen  # else the watch proves nothing
    return seen


@pytest.mark.parametrize("entry", ["script", "module"])
def test_a_text_command_sets_the_purge_delay_before_pyarrow_loads(entry):
    assert _watch(["pack", "--tokenizer", "tok.json", "--help"], entry)["at_pyarrow"] == PURGE_DELAY_MS
    assert _watch(["tokenize", "--help"], entry)["at_pyarrow"] == PURGE_DELAY_MS


def test_the_token_only_job_keeps_arrows_default():
    assert _watch(["pack", "--help"])["at_pyarrow"] is None


@pytest.mark.parametrize("name", [PURGE_DELAY, LEGACY_PURGE_DELAY])
def test_a_delay_the_caller_set_is_kept(name):
    seen = _watch(["pack", "--tokenizer=tok.json", "--help"], env_extra={name: "250"})
    assert seen["at_pyarrow"] == ("250" if name == PURGE_DELAY else None)


def test_which_command_lines_tokenize(tmp_path):
    text = tmp_path / "text.toml"
    text.write_text('context_length = 2048\ntokenizer = "tokenizer.json"\n')
    tokens = tmp_path / "tokens.toml"
    tokens.write_text("context_length = 2048\n")
    broken = tmp_path / "broken.toml"
    broken.write_text("context_length = = 2\n")
    assert tokenizes(["pack", "--input", "in", "--tokenizer", "tiktoken:cl100k_base"])
    assert tokenizes(["pack", "--tokenizer=t.json"])
    assert tokenizes(["tokenize", "--input", "in"])
    assert tokenizes(["pack", "--config", str(text)])
    assert tokenizes(["pack", f"--config={text}"])
    assert not tokenizes(["pack", "--input", "in", "--output", "out"])
    assert not tokenizes(["pack", "--config", str(tokens)])
    assert not tokenizes(["pack", "--config", str(broken)])  # its one line is the command's, later
    assert not tokenizes(["pack", "--config", str(tmp_path / "missing.toml")])
    assert not tokenizes(["pack", "--config"])
    assert not tokenizes(["verify", "out", "--check-tokenizer"])


def test_purge_freed_pages_says_whether_this_process_follows_it(monkeypatch):
    monkeypatch.delenv(PURGE_DELAY, raising=False)
    monkeypatch.delenv(LEGACY_PURGE_DELAY, raising=False)
    import pyarrow  # noqa: F401  (loaded: too late for this process's pool)

    assert allocator.purge_freed_pages() is False
    assert os.environ[PURGE_DELAY] == PURGE_DELAY_MS


EMBEDDED = r"""
import json, os
from raypack.io.allocator import purge_freed_pages
purge_freed_pages()  # what the command did for a text run
from raypack.engine import pipeline
import ray
pipeline.init_ray(None)
@ray.remote(num_cpus=0.1)
def env():
    return os.environ.get("MIMALLOC_PURGE_DELAY")
print(json.dumps(ray.get([env.remote() for _ in range(3)])))
"""


@pytest.mark.slow
def test_an_embedded_rays_workers_inherit_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (PURGE_DELAY, LEGACY_PURGE_DELAY, "RAY_ADDRESS")}
    env.update(PYTHONPATH=str(REPO), RAYPACK_NO_PROGRESS="1")
    done = subprocess.run([sys.executable, "-c", EMBEDDED], env=env, capture_output=True, text=True, cwd=tmp_path,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [PURGE_DELAY_MS] * 3
