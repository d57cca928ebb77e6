"""raypack.io.prefetch: the items, their order and the iterator's exceptions are unchanged; the
producer runs ahead by at most ``depth``; leaving early stops it and closes the iterator."""

from __future__ import annotations

import threading
import time

import pytest

from raypack.io.prefetch import Stopped, handed_over, prefetched


def test_items_in_order():
    assert list(prefetched(iter(range(100)))) == list(range(100))
    assert list(prefetched(iter([]))) == []


def test_an_exception_is_raised_where_the_caller_meets_it():
    def items():
        yield 1
        yield 2
        raise ValueError("row 3 is bad")

    seen = []
    with pytest.raises(ValueError, match="row 3 is bad"):
        for item in prefetched(items()):
            seen.append(item)
    assert seen == [1, 2]


@pytest.mark.parametrize("depth", [1, 3])
def test_the_producer_runs_at_most_depth_ahead(depth):
    produced = []

    def items():
        for k in range(20):
            produced.append(k)
            yield k

    it = prefetched(items(), depth=depth)
    assert next(it) == 0
    time.sleep(0.2)
    # one held by the caller, depth queued, one produced and waiting for a slot
    assert len(produced) <= 1 + depth + 1
    assert list(it) == list(range(1, 20))


def test_leaving_early_stops_the_thread_and_closes_the_iterator():
    closed = threading.Event()

    def items():
        try:
            for k in range(10**9):
                yield k
        finally:
            closed.set()

    before = threading.active_count()
    for item in prefetched(items()):
        if item == 5:
            break
    assert closed.wait(2)
    deadline = time.monotonic() + 2
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        next(prefetched(iter([1]), depth=0))


def _one_then_a_read_that_hangs(release: threading.Event):
    yield 1
    release.wait(30)  # a read that hangs (a FIFO, a dead mount, a frozen store)
    yield 2


def test_an_exception_in_the_caller_does_not_wait_for_a_read_that_hangs():
    """Ctrl-C while the producer is stuck in a read (a FIFO, a dead mount): the caller's exception
    propagates at once; the daemon thread is left behind."""
    release = threading.Event()
    it = prefetched(_one_then_a_read_that_hangs(release))
    assert next(it) == 1
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        it.throw(KeyboardInterrupt)
    assert time.monotonic() - start < 1
    release.set()


def test_leaving_early_in_a_stopped_command_waits_only_until_the_stops_deadline():
    """A caller that leaves early (its generator closed, as when an error elsewhere unwinds a task) waits for a
    read that hangs at most what is left of a Ctrl-C's or SIGTERM's deadline (raypack.io.threads), not 10 s more."""
    from raypack.io.threads import stopped_at

    release = threading.Event()
    it = prefetched(_one_then_a_read_that_hangs(release))
    assert next(it) == 1
    stopped_at(time.monotonic() + 0.3)
    try:
        start = time.monotonic()
        it.close()
        assert time.monotonic() - start < 3
    finally:
        stopped_at(None)
        release.set()


# ----------------------------------------------------------------------------- handed_over: a producer that pushes


def test_handed_over_gives_what_was_put_in_order_and_raises_the_producers_error():
    def produce(put):
        for k in range(50):
            put(k)
        raise ValueError("piece 50 is bad")

    seen = []
    with pytest.raises(ValueError, match="piece 50 is bad"):
        for item in handed_over(produce):
            seen.append(item)
    assert seen == list(range(50))
    assert list(handed_over(lambda put: None)) == []


def test_handed_over_runs_at_most_depth_ahead_and_ends_the_producer_when_the_caller_leaves():
    put_count, ended = [], threading.Event()

    def produce(put):
        try:
            for k in range(10**9):
                put_count.append(k)
                put(k)
        except Stopped:
            ended.set()
            raise

    items = handed_over(produce, depth=1)
    assert next(items) == 0
    time.sleep(0.2)
    assert len(put_count) <= 3  # the caller's, the one queued, the one waiting for a slot
    items.close()
    assert ended.wait(5)  # its put raised Stopped


def test_handed_over_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        next(handed_over(lambda put: None, depth=0))
