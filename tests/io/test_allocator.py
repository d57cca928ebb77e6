"""Arrow's pool told to hand freed pages back (raypack.io.allocator): set by the command before pyarrow loads,
passed to an embedded Ray's workers, and never over a value the caller chose. What it saves is a benchmark's
figure (bench/bench_onepass.py --rss), not a test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raypack.io import allocator
from raypack.io.allocator import LEGACY_PURGE_DELAY, PURGE_DELAY, PURGE_DELAY_MS, for_started_processes

REPO = Path(__file__).resolve().parents[2]

# The command as `raypack --version` runs it, with a note of the environment at the moment anything first
# imports pyarrow: mimalloc reads its settings once, when libarrow loads.
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
try:
    if sys.argv[1] == "module":  # as python -m raypack.cli runs it: the package raypack.cli is imported first
        sys.argv = ["raypack", "pack", "--help"]
        runpy.run_module("raypack.cli", run_name="__main__", alter_sys=True)
    code = raypack.console_main(["pack", "--help"])  # as the raypack script and jobs/pack.py run it
except SystemExit as stop:  # argparse's, after the help
    code = stop.code
seen["code"] = code
seen["pyarrow_loaded"] = "pyarrow.lib" in sys.modules
print("SEEN", json.dumps(seen))
"""


def _watch(env_extra: dict[str, str], entry: str = "script") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (PURGE_DELAY, LEGACY_PURGE_DELAY)}
    env.update(env_extra, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", WATCH, entry], env=env, capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.rsplit("SEEN ", 1)[1])


@pytest.mark.parametrize("entry", ["script", "module"])
def test_the_command_sets_the_purge_delay_before_pyarrow_loads(entry):
    seen = _watch({}, entry)
    assert seen["code"] == 0
    assert seen["pyarrow_loaded"], "the watch saw no pyarrow import: it proves nothing"
    assert seen["at_pyarrow"] == PURGE_DELAY_MS


@pytest.mark.parametrize("name", [PURGE_DELAY, LEGACY_PURGE_DELAY])
def test_a_delay_the_caller_set_is_kept(name):
    seen = _watch({name: "250"}, "module")
    assert seen["at_pyarrow"] == ("250" if name == PURGE_DELAY else None)


def test_purge_freed_pages_says_whether_this_process_follows_it(monkeypatch):
    monkeypatch.delenv(PURGE_DELAY, raising=False)
    monkeypatch.delenv(LEGACY_PURGE_DELAY, raising=False)
    import pyarrow  # noqa: F401  (loaded: too late for this process's pool)

    assert allocator.purge_freed_pages() is False
    assert os.environ[PURGE_DELAY] == PURGE_DELAY_MS


def test_started_processes_get_it_and_the_caller_keeps_its_environment(monkeypatch):
    monkeypatch.delenv(PURGE_DELAY, raising=False)
    monkeypatch.delenv(LEGACY_PURGE_DELAY, raising=False)
    with for_started_processes():
        child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('MIMALLOC_PURGE_DELAY'))"],
                               capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == PURGE_DELAY_MS
    assert PURGE_DELAY not in os.environ  # a library caller's own environment, as it was
    monkeypatch.setenv(PURGE_DELAY, "0")
    with for_started_processes():
        assert os.environ[PURGE_DELAY] == "0"
    assert os.environ[PURGE_DELAY] == "0"


EMBEDDED = r"""
import json, os
from raypack.engine import pipeline
import ray
pipeline.init_ray(None)
@ray.remote(num_cpus=0.1)
def env():
    return os.environ.get("MIMALLOC_PURGE_DELAY")
workers = ray.get([env.remote() for _ in range(3)])
print(json.dumps({"driver": os.environ.get("MIMALLOC_PURGE_DELAY"), "workers": workers}))
"""


@pytest.mark.slow
def test_an_embedded_rays_workers_get_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (PURGE_DELAY, LEGACY_PURGE_DELAY, "RAY_ADDRESS")}
    env.update(PYTHONPATH=str(REPO), RAYPACK_NO_PROGRESS="1")
    done = subprocess.run([sys.executable, "-c", EMBEDDED], env=env, capture_output=True, text=True, cwd=tmp_path,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"driver": None, "workers": [PURGE_DELAY_MS] * 3}
