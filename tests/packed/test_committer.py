"""The Committer (raypack.packed.writer): files published on one background thread, in the order
submitted, at most ``max_pending`` queued, an earlier failure raised by the next submit."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest

from raypack.packed.writer import AtomicFile, Committer


def test_jobs_run_in_submission_order_on_one_thread_whoever_submits():
    ran, threads = [], set()

    def job(submitter: int, k: int):
        def publish():
            ran.append((submitter, k))
            threads.add(threading.current_thread().name)
        return publish

    with Committer(max_pending=3) as committer:
        def submit_all(submitter: int) -> None:
            for k in range(50):
                committer.submit(job(submitter, k), lambda: None)

        submitters = [threading.Thread(target=submit_all, args=(s,)) for s in range(3)]
        for t in submitters:
            t.start()
        for t in submitters:
            t.join()
    assert len(ran) == 150
    for s in range(3):
        assert [k for who, k in ran if who == s] == list(range(50))
    assert len(threads) == 1 and threads.pop().startswith("raypack-publish")


def test_a_submit_beyond_max_pending_waits_for_the_oldest():
    release = threading.Event()
    with Committer(max_pending=2) as committer:
        for _ in range(2):
            committer.submit(lambda: release.wait(30), lambda: None)
        third = threading.Thread(target=committer.submit, args=(lambda: None, lambda: None))
        third.start()
        third.join(0.3)
        assert third.is_alive()  # two jobs queued: the third waits
        release.set()
        third.join(30)
        assert not third.is_alive()


def test_an_earlier_failure_is_raised_by_the_next_submit_which_aborts_its_own_job():
    events = []

    def fail():
        events.append("publish 1")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        with Committer() as committer:
            committer.submit(fail, lambda: events.append("abort 1"))
            _wait_until(lambda: "abort 1" in events)  # the failure has happened on the thread
            committer.submit(lambda: events.append("publish 2"), lambda: events.append("abort 2"))
    assert events == ["publish 1", "abort 1", "abort 2"]


def test_wait_raises_the_first_error_once_every_job_ended_and_drain_raises_none():
    events, release = [], threading.Event()
    committer = Committer(max_pending=4)

    def fail(k):
        def publish():
            release.wait(30)  # all three are queued before the first fails
            events.append(k)
            raise ValueError(f"job {k}")
        return publish

    committer.submit(fail(1), lambda: None)
    committer.submit(fail(2), lambda: None)
    committer.submit(lambda: events.append(3), lambda: None)
    release.set()
    with pytest.raises(ValueError, match="job 1"):
        committer.wait()
    assert events == [1, 2, 3]
    committer.submit(fail(4), lambda: None)
    committer.drain()  # no error
    committer.wait()  # drained: nothing left to raise
    committer.__exit__(None, None, None)


def test_submit_file_publishes_atomic_files(tmp_path):
    with Committer() as committer:
        for k in range(3):
            f = AtomicFile(str(tmp_path), f"f{k}")
            f.write(b"x" * k)
            committer.submit_file(f)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0", "f1", "f2"]
    assert (tmp_path / "f2").read_bytes() == b"xx"


def test_max_pending_must_be_positive():
    with pytest.raises(ValueError, match="max_pending=0 must be >= 1"):
        Committer(max_pending=0)


def _wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert predicate()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
def test_a_local_file_starts_writeback_each_step_and_drops_the_step_before(tmp_path, monkeypatch):
    """Each step asks the kernel to write back the new bytes and to drop the previous step's (by then
    written back) from the page cache; the bytes on disk are those written."""
    from raypack.packed import writer

    calls = []
    real = os.posix_fadvise
    monkeypatch.setattr(writer, "WRITEBACK_BYTES", 1000)
    monkeypatch.setattr(writer.os, "posix_fadvise", lambda fd, offset, length, advice: (
        calls.append((offset, length, advice)), real(fd, offset, length, advice))[-1])
    f = AtomicFile(str(tmp_path), "f")
    data = bytes(range(256)) * 40  # 10,240 bytes
    for k in range(0, len(data), 700):
        f.write(data[k:k + 700])
    f.commit()
    assert (tmp_path / "f").read_bytes() == data
    assert {advice for _, _, advice in calls} == {os.POSIX_FADV_DONTNEED}
    ends = [offset + length for offset, length, _ in calls]
    assert ends == [1400, 2800, 4200, 5600, 7000, 8400, 9800]  # a step each time 1,000 bytes are unflushed
    assert [offset for offset, _, _ in calls] == [0, 0] + ends[:-2]  # from the step before's start
