"""Bounded waits for background jobs when a command is stopped (raypack.io.threads): a store that stopped
answering must not hold a stopped run for minutes."""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from raypack.io import lock as lock_module
from raypack.io.threads import call_within, stop_pool, threads_left


def test_stop_pool_waits_a_bounded_time_and_drops_the_queued_jobs():
    release = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raypack-test")
    running = pool.submit(release.wait, 60)
    queued = pool.submit(lambda: "ran")
    started = time.monotonic()
    stop_pool(pool, [running, queued], timeout=0.3)
    assert time.monotonic() - started < 5
    assert queued.cancelled() and not running.done()
    assert any(name.startswith("raypack-test") for name in threads_left())  # what console_main leaves without
    release.set()
    running.result(timeout=5)


def test_call_within_returns_the_result_raises_the_error_and_gives_up_on_a_hang():
    assert call_within(lambda: None, 5, "raypack-t") is True
    with pytest.raises(ValueError, match="no"):
        call_within(lambda: (_ for _ in ()).throw(ValueError("no")), 5, "raypack-t")
    release = threading.Event()
    started = time.monotonic()
    assert call_within(lambda: release.wait(60), 0.3, "raypack-t") is False
    assert time.monotonic() - started < 5
    release.set()


def test_an_object_store_lock_whose_deletion_hangs_is_given_up_with_a_warning(monkeypatch, caplog):
    release = threading.Event()

    class FrozenStore:  # deletes as a frozen S3 server answers: never
        def delete_file(self, path):
            release.wait(60)

    monkeypatch.setattr(lock_module, "JOIN_TIMEOUT_S", 0.3)
    held = lock_module.ObjectStoreLock(FrozenStore(), "bucket/out/.raypack-lock.json", what="output s3://bucket/out")
    held._record = lock_module.owner_record()
    started = time.monotonic()
    held.release()
    assert time.monotonic() - started < 5
    assert "could not delete the lock bucket/out/.raypack-lock.json" in caplog.text
    release.set()


def test_a_committer_stopped_by_ctrl_c_aborts_the_jobs_it_drops():
    """Ctrl-C with a publish running and one queued: the queued one is dropped, and its abort runs (a partial
    file was left behind: CI, once); the running one ends as it would, and is all that is waited for."""
    from raypack.packed.writer import Committer

    release, done = threading.Event(), []
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with Committer(max_pending=2) as committer:
            committer.submit(lambda: (release.wait(30), done.append("published 1")), lambda: done.append("aborted 1"))
            committer.submit(lambda: done.append("published 2"), lambda: done.append("aborted 2"))
            threading.Timer(0.3, release.set).start()
            raise KeyboardInterrupt
    assert done == ["published 1", "aborted 2"]
    assert time.monotonic() - started < 5  # the running job's end, not the bounded wait's 10 s (a dropped job is
    # no job to wait for: concurrent.futures.wait counted it as pending)


def test_once_a_stop_came_every_bounded_wait_shares_one_deadline():
    """A stop meets several waits (the upload in flight, the dropped ones' aborts, the lock's deletion): each
    waited its own 10 s, so a frozen store held a SIGTERM for 30-50 s. From the signal on they share one."""
    from raypack.io.threads import left_behind_level, stop_requested, stopped_at

    release = threading.Event()
    try:
        stopped_at(time.monotonic() + 0.5)
        started = time.monotonic()
        for _ in range(4):
            assert call_within(lambda: release.wait(60), 10, "raypack-t") is False
        assert time.monotonic() - started < 2
        assert left_behind_level() == logging.DEBUG  # the stop's one line says it; what is left, the next run clears
        stopped_at(None)
        assert left_behind_level() == logging.WARNING
        stop_requested()
        stop_requested()  # the first signal sets the deadline; a second does not push it back
    finally:
        stopped_at(None)
        release.set()


def test_interruptible_lets_a_signal_reach_the_main_thread_while_a_request_waits():
    """The final publish's upload on the main thread, to a frozen store: a signal's handler runs only between the
    main thread's bytecodes, so a SIGTERM waited out the SDK (an operator's trial). The request now runs on a
    thread while the main thread waits on a lock, which a signal interrupts."""
    import signal

    from raypack.io.threads import interruptible

    assert interruptible(lambda: 7, "raypack-t") == 7
    with pytest.raises(ValueError, match="no"):
        interruptible(lambda: (_ for _ in ()).throw(ValueError("no")), "raypack-t")
    release = threading.Event()

    def stop(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            interruptible(lambda: release.wait(60), "raypack-upload")
        assert time.monotonic() - started < 5
        assert "raypack-upload" in threads_left()  # what console_main then leaves without waiting for
        assert "raypack-upload" not in threads_left(set(threading.enumerate()))  # a caller's, not this command's
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        release.set()
    on_a_thread = []
    worker = threading.Thread(target=lambda: on_a_thread.extend(
        [interruptible(lambda: threading.current_thread().name, "raypack-t"), threading.current_thread().name]))
    worker.start()
    worker.join()
    assert on_a_thread[0] == on_a_thread[1]  # off the main thread, called in place


def test_a_stop_whose_raise_was_lost_is_raised_again_when_the_next_task_ends():
    """A Ctrl-C's KeyboardInterrupt raised inside a weakref callback is printed and dropped by Python ("Exception
    ignored in: <function WeakSet...>"), and the run went on with Ctrl-C ignored (an operator's trial)."""
    from raypack.io.progress import Progress
    from raypack.io.threads import stopped_at

    progress = Progress("packed", 3, "tasks")
    progress.add(10)
    try:
        stopped_at(time.monotonic() + 10)  # a signal came, and its raise was lost
        with pytest.raises(KeyboardInterrupt):
            progress.add(10)
    finally:
        stopped_at(None)
    progress.add(10)


def test_a_ctrl_c_as_a_chunk_file_is_opened_leaves_no_empty_file(tmp_path, monkeypatch):
    """A signal's handler runs as soon as a call into C returns: a Ctrl-C that came while ``open`` made a chunk
    file's temporary file raised before the file was anyone's to abort (a 0-byte .tmp file left: a trial)."""
    import builtins

    from raypack.packed import writer

    real_open = builtins.open

    def open_then_stop(path, mode="r", *args, **kwargs):
        real_open(path, mode, *args, **kwargs).close()
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "open", open_then_stop, raising=False)
    with pytest.raises(KeyboardInterrupt):
        writer.AtomicFile(str(tmp_path), "chunks-000000000000")
    assert os.listdir(tmp_path) == []
