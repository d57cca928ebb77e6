"""The local engine's threads (raypack.pack.local): results in task order, at most ``workers`` at once,
the earliest task's failure raised in the caller (the error of one worker running them in order),
the later running tasks stopped and the rest not started (Ctrl-C stops every one); end to end,
``--local --workers 2`` gives the bytes of one packer, after a crash and a resume too, the error
line of one packer when two shards are bad, and Ctrl-C in the CLI leaves no partial file."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.pack.local import Stopped, run_tasks, until_stopped
from raypack.pack.publish import staging_dir
from raypack.packed.writer import TMP_PREFIX
from raypack.sample import write_sample_corpus

from helpers import tree_digest, write_long_token_shards
from packing_faults import fail_at_shard

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Tracker:
    """Counts the tasks running at once, and which started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.started: list[int] = []

    def __enter__(self):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.running -= 1


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_results_come_in_task_order_with_at_most_workers_at_once(workers):
    rng = random.Random(workers)
    delays = [rng.uniform(0, 0.02) for _ in range(12)]
    tracker, seen = Tracker(), []

    def task(k, stop):
        with tracker:
            time.sleep(delays[k])
            return k * k

    assert run_tasks(task, list(range(12)), workers, on_result=seen.append) == [k * k for k in range(12)]
    assert sorted(seen) == [k * k for k in range(12)]
    assert tracker.most <= workers
    assert not [t for t in threading.enumerate() if t.name.startswith("raypack-packer")]


def test_one_worker_runs_in_the_caller_without_a_stop_event():
    callers = []
    run_tasks(lambda k, stop: callers.append((threading.current_thread(), stop)), [0, 1], 1)
    assert callers == [(threading.main_thread(), None)] * 2


def _slow_items(n: int = 10_000):
    for k in range(n):
        time.sleep(0.005)
        yield k


def test_a_failure_stops_the_later_running_task_and_the_rest_never_start():
    started, stopped = [], []

    def task(k, stop):
        started.append(k)
        if k == 0:
            time.sleep(0.05)
            raise ValueError("task 0 is bad")
        _run_until_stopped(k, stop, stopped)
        return k

    before = time.monotonic()
    with pytest.raises(ValueError, match="task 0 is bad"):
        run_tasks(task, list(range(6)), 2)
    assert time.monotonic() - before < 5  # task 1 would take 50 s: it was stopped
    assert sorted(started) == [0, 1] and stopped == [1]
    assert not [t for t in threading.enumerate() if t.name.startswith("raypack-packer")]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_error_raised_is_the_earliest_tasks_whatever_fails_first_in_time(workers):
    """Task 2 fails at once, task 1 a little later: the run raises task 1's error, as one worker
    running them in order would (the error line does not depend on --workers)."""
    started = []

    def task(k, stop):
        started.append(k)
        if k == 2:
            raise ValueError("task 2 is bad")
        if k == 1:
            time.sleep(0.2)
            raise ValueError("task 1 is bad")
        return k

    with pytest.raises(ValueError, match="task 1 is bad"):
        run_tasks(task, list(range(8)), workers)
    if workers == 1:
        assert started == [0, 1]
    assert not [t for t in threading.enumerate() if t.name.startswith("raypack-packer")]


def test_an_earlier_task_that_succeeds_is_finished_and_the_later_failure_raised():
    finished = []

    def task(k, stop):
        if k == 1:
            raise ValueError("task 1 is bad")
        time.sleep(0.3)  # task 0 ends after task 1 failed: it is not stopped
        finished.append(k)
        return k

    with pytest.raises(ValueError, match="task 1 is bad"):
        run_tasks(task, [0, 1, 2, 3], 2, on_result=lambda r: finished.append(("result", r)))
    assert finished[:2] == [0, ("result", 0)]
    assert 3 not in finished


def _run_until_stopped(k, stop, stopped: list[int]) -> None:
    """A task of ~50 s that notes ``k`` in ``stopped`` when it is stopped."""
    try:
        for _ in until_stopped(_slow_items(), stop, f"task {k}"):
            pass
    except Stopped:
        stopped.append(k)
        raise


def test_ctrl_c_in_the_caller_stops_the_running_tasks():
    stopped = []

    def task(k, stop):
        _run_until_stopped(k, stop, stopped)

    main = threading.main_thread().ident
    # Python's own handler: a suite started in the background (``cmd &``) inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, lambda: signal.pthread_kill(main, signal.SIGINT))
    try:
        timer.start()
        before = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            run_tasks(task, list(range(5)), 2)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - before < 5
    assert sorted(stopped) == [0, 1]
    assert not [t for t in threading.enumerate() if t.name.startswith("raypack-packer")]


def test_a_stopped_run_waits_for_a_task_that_hangs_only_until_the_stops_deadline():
    """Once a Ctrl-C or SIGTERM came, every wait of the command shares one deadline (raypack.io.threads); the
    local engine's wait for its running tasks took its own 10 s from the failure instead."""
    from raypack.io.threads import stopped_at

    release, started = threading.Event(), threading.Event()

    def task(k, stop):
        if k == 0:
            started.wait(10)
            raise ValueError("task 0 failed")
        started.set()
        release.wait(30)  # a read that hangs: it never looks at its stop

    stopped_at(time.monotonic() + 0.3)  # a signal came just before
    try:
        before = time.monotonic()
        with pytest.raises(ValueError, match="task 0 failed"):
            run_tasks(task, [0, 1], 2)
        assert time.monotonic() - before < 3
    finally:
        stopped_at(None)
        release.set()


def test_until_stopped_closes_what_it_reads():
    closed = []

    def items():
        try:
            yield from range(100)
        finally:
            closed.append(True)

    stop = threading.Event()
    got = []
    with pytest.raises(Stopped, match="mine: stopped"):
        for k in until_stopped(items(), stop, "mine"):
            got.append(k)
            if k == 3:
                stop.set()
    assert got == [0, 1, 2, 3] and closed == [True]
    assert list(until_stopped(iter(range(3)), None, "x")) == [0, 1, 2]


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(str(root), num_shards=8, docs_per_shard=60, mean_doc_len=25, seed=11)
    return str(root)


def config(tmp_path, corpus, name, **overrides):
    values = dict(inputs=[corpus], output=str(tmp_path / name), context_length=16, pad_token=0,
                  read_batch_size=5, chunks_per_record_batch=3)
    return make_config({**values, **overrides})


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_threads_give_the_bytes_of_one_packer(tmp_path, corpus, strategy):
    for workers in (1, 2, 5):
        run_pack(config(tmp_path, corpus, f"w{workers}", num_workers=workers, strategy=strategy), engine="local")
    assert tree_digest(tmp_path / "w1") == tree_digest(tmp_path / "w2") == tree_digest(tmp_path / "w5")


@pytest.mark.parametrize("crash_at", [0, 3, 7])
def test_a_threaded_crash_resumes_to_the_clean_bytes(tmp_path, corpus, monkeypatch, crash_at):
    run_pack(config(tmp_path, corpus, "clean", num_workers=1), engine="local")
    fail_at_shard(monkeypatch, crash_at, RuntimeError("crash"))
    with pytest.raises(RuntimeError, match="crash"):
        run_pack(config(tmp_path, corpus, "out", num_workers=2), engine="local")
    staging = staging_dir(str(tmp_path / "out"))
    if os.path.isdir(staging):  # gone where no task had finished: there was nothing to resume
        assert not [n for n in os.listdir(staging) if n.startswith(TMP_PREFIX)]  # no partial file
    kept = len(os.listdir(os.path.join(staging, "_results"))) if os.path.isdir(os.path.join(staging, "_results")) else 0
    monkeypatch.undo()
    packed = fail_at_shard(monkeypatch, -1, RuntimeError("unused"))
    run_pack(config(tmp_path, corpus, "out", num_workers=2), engine="local", resume=True)
    assert crash_at in packed and len(packed) == 8 - kept
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "clean")


def test_bad_input_on_a_thread_is_one_line_and_leaves_nothing(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    rng = np.random.default_rng(1)
    for k in range(4):
        docs = [list(rng.integers(0, 50, 30)) for _ in range(200)]
        if k == 2:
            docs[150][4] = -7
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), root / f"s{k}.parquet")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "raypack.cli", "pack", "--local", "--workers", "2", "--input",
                           str(root), "--output", str(out), "--context-length", "16", "--pad-token", "0"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("packed ")]
    assert len(lines) == 1 and "s2.parquet" in lines[0] and "-7" in lines[0], proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_two_bad_shards_give_the_first_shards_line_for_any_workers(tmp_path, workers):
    """Shard 0's bad token is its last; shard 1's is its first, so with two threads shard 1 fails
    first in time. The line names shard 0, as one packer reading them in order does."""
    root = tmp_path / "in"
    root.mkdir()
    rng = np.random.default_rng(2)
    for k, (num_docs, bad_row) in enumerate([(6000, 5999), (200, 0), (200, None)]):
        docs = [list(rng.integers(0, 50, 30)) for _ in range(num_docs)]
        if bad_row is not None:
            docs[bad_row][4] = -7 - k
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), root / f"s{k}.parquet")
    proc = subprocess.run([sys.executable, "-m", "raypack.cli", "pack", "--local", "--workers", workers,
                           "--read-batch-size", "64", "--input", str(root), "--output", str(tmp_path / "out"),
                           "--context-length", "16", "--pad-token", "0"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("packed ")]
    assert len(lines) == 1 and "s0.parquet" in lines[0] and "-7" in lines[0], proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_ctrl_c_with_local_threads_is_one_line_and_leaves_no_partial_file(tmp_path):
    write_long_token_shards(tmp_path / "in", 40, 300)
    args = ["pack", "--local", "--workers", "2", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
            "--context-length", "64", "--pad-token", "0"]
    proc = subprocess.Popen([sys.executable, "-m", "raypack.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    staging = tmp_path / ".out.raypack-staging-partial"
    records = staging / "_results"
    deadline = time.monotonic() + 120
    while not (records.is_dir() and len(os.listdir(records)) >= 2) and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if not line.startswith("packed ")]
    assert len(lines) == 1 and lines[0].startswith("raypack: interrupted; the finished work is kept in "), err
    assert not [n for n in os.listdir(staging) if n.startswith(TMP_PREFIX)], "a partial file was left"
    done = subprocess.run([sys.executable, "-m", "raypack.cli", *args, "--resume"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    clean_args = ["pack", "--local", "--workers", "1", "--input", str(tmp_path / "in"), "--output",
                  str(tmp_path / "clean"), "--context-length", "64", "--pad-token", "0"]
    clean = subprocess.run([sys.executable, "-m", "raypack.cli", *clean_args],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO})
    assert clean.returncode == 0, clean.stderr
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "clean")


def test_a_thread_the_system_refuses_is_one_line_naming_the_limit_and_leaves_nothing(tmp_path, capsys, monkeypatch,
                                                                                      corpus):
    from raypack.cli import NO_THREAD, NO_THREAD_WORKERS, main

    out = tmp_path / "out"

    def refuse(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    code = main(["pack", "--local", "--workers", "2", "--input", corpus, "--output", str(out),
                 "--context-length", "16"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err == f"raypack: error: {NO_THREAD}{NO_THREAD_WORKERS}", err
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if "raypack-staging" in p]


def test_a_refused_thread_in_a_command_without_workers_does_not_suggest_them(tmp_path, capsys, monkeypatch):
    import raypack.cli as cli

    def refuse(args):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(cli, "_run_stats", refuse)
    code = cli.main(["stats", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err == f"raypack: error: {cli.NO_THREAD}" and "--workers" not in err, err
