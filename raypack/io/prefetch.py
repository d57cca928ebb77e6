"""Read ahead: the next item of an iterator is produced on a thread while the caller uses this one
(:func:`prefetched`), or what a function puts, for a producer that pushes (:func:`handed_over`).

For readers that release the GIL (pyarrow's Parquet and JSON readers) in front of work that also
does (a Rust tokenizer): the read of batch k+1 overlaps the encode of batch k. Memory: at most
``depth`` items beyond the one the caller holds. Order, values and exceptions are the iterator's
own; an exception is raised where the caller would have met it. Closing the generator (or leaving
a ``for`` loop early) stops the thread after the item it is producing (waiting at most
JOIN_TIMEOUT_S of raypack.io.threads, or what is left of a stop's deadline; past it, a read that hangs, the daemon
thread is left to end on its own); an exception in the caller (Ctrl-C) does not wait for it.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator, TypeVar

from raypack.io.threads import JOIN_TIMEOUT_S, time_left

__all__ = ["Stopped", "handed_over", "prefetched"]

T = TypeVar("T")

_END = object()


def prefetched(items: Iterator[T], depth: int = 1, name: str = "raypack-read-ahead") -> Iterator[T]:
    """``items``, produced on a thread ``depth`` items ahead of the caller."""

    def produce(put: Callable[[T], None]) -> None:
        try:
            for item in items:
                put(item)
        except Stopped:
            close = getattr(items, "close", None)
            if close is not None:
                close()
            raise

    return handed_over(produce, depth, name)


def handed_over(produce: Callable[[Callable[[T], None]], None], depth: int = 1,
                name: str = "raypack-hand-over") -> Iterator[T]:
    """What ``produce(put)`` puts, in order, ``produce`` running on a thread at most ``depth`` items ahead
    of the caller: for a producer that pushes (a task tokenized into pieces, handed one by one to the
    packer) rather than iterates. ``put`` raises :class:`Stopped` once the caller has gone (left early, or
    raised), which ends ``produce``; an exception of ``produce``'s is raised where the caller meets it.
    Stopping waits as :func:`prefetched`'s does."""
    if depth < 1:
        raise ValueError(f"depth={depth!r} must be >= 1")
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: T) -> None:
        if not _put(slots, (item, None), stop):
            raise Stopped

    def run() -> None:
        try:
            produce(put)
        except Stopped:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the caller, who raises it
            _put(slots, (_END, e), stop)
            return
        _put(slots, (_END, None), stop)

    return _consumed(run, slots, stop, name)


class Stopped(Exception):
    """Raised by a :func:`handed_over` producer's ``put`` once its caller has gone."""


def _consumed(run: Callable[[], None], slots: queue.Queue, stop: threading.Event, name: str) -> Iterator:
    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    wait_s = JOIN_TIMEOUT_S
    try:
        while True:
            item, error = slots.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    except GeneratorExit:  # the caller left early: the producer ends after its current item
        raise
    except BaseException:  # Ctrl-C or an error of the caller's: do not wait for a read that may hang
        wait_s = 0.0
        raise
    finally:
        stop.set()
        deadline = time.monotonic() + time_left(wait_s)
        while thread.is_alive() and time.monotonic() < deadline:
            try:  # unblock a producer waiting for a free slot
                slots.get(timeout=0.05)
            except queue.Empty:
                pass


def _put(slots: queue.Queue, entry: tuple, stop: threading.Event) -> bool:
    """Put ``entry`` unless the consumer stopped; False when it did."""
    while not stop.is_set():
        try:
            slots.put(entry, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
