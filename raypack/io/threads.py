"""Background threads that must not hold up a command being stopped: bounded waits on Ctrl-C and SIGTERM.

A thread pool ends with its jobs: a context manager's exit waits for every running one. On a store that
stopped answering, each read or upload in flight waits out its timeouts and retries, and a SIGTERM took
590 s to end a run (an operator's trial: an S3 server frozen mid-run). So when the command is being
stopped, :func:`stop_pool` cancels the queued jobs and waits a bounded time for the running ones, and
:func:`call_within` bounds the store requests a stop makes itself (an upload's abort, the lock's
deletion). From the Ctrl-C or SIGTERM on (:func:`stop_requested`, called by raypack's handlers) all these
waits share one deadline, ``JOIN_TIMEOUT_S`` after the signal. A job still running after that is left to end
on its own, and the command ends without it (``raypack.console_main`` leaves without the interpreter's join
of such threads). What it leaves is what a killed run leaves: its finished tasks, which ``--resume`` keeps,
and temporary uploads and a stale lock, which the next run clears.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Collection, Iterable, TypeVar

__all__ = ["JOIN_TIMEOUT_S", "call_within", "interruptible", "left_behind_level", "stop_pending", "stop_pool",
           "stop_requested", "stopped_at", "threads_left", "time_left"]

T = TypeVar("T")

JOIN_TIMEOUT_S = 10.0
"""How long a stopped command waits for a background job in flight: once a Ctrl-C or SIGTERM came, for all of them
together (a stop meets several: the upload in flight, the queued ones' aborts, the lock's deletion)."""

_stop_deadline: list[float] = []
"""When the waits of a command being stopped end (:func:`stop_requested`); empty while none is."""


def stop_requested() -> None:
    """A Ctrl-C or SIGTERM came (raypack's signal handlers, in the console script): from now on every bounded wait
    ends by one deadline, ``JOIN_TIMEOUT_S`` from now."""
    if not _stop_deadline:
        _stop_deadline.append(time.monotonic() + JOIN_TIMEOUT_S)


def stopped_at(deadline: float | None) -> None:
    """Set (a deadline, ``time.monotonic()`` scale) or clear (None) the stop's deadline: a new command starts."""
    _stop_deadline.clear()
    if deadline is not None:
        _stop_deadline.append(deadline)


def stop_pending() -> bool:
    """Whether a Ctrl-C or SIGTERM came during this command (:func:`stop_requested`)."""
    return bool(_stop_deadline)


def left_behind_level() -> int:
    """The log level of a line saying what a bounded wait left behind (an upload, a lock): DEBUG while a command
    is being stopped (its one line says the run stopped; what is left is what a killed run leaves, which the next
    run clears), WARNING otherwise."""
    return logging.DEBUG if _stop_deadline else logging.WARNING


def time_left(timeout: float) -> float:
    """``timeout``, or less: what is left of a stop's deadline (every wait of a stopped command shares it)."""
    if not _stop_deadline:
        return timeout
    return max(0.0, min(timeout, _stop_deadline[0] - time.monotonic()))


def stop_pool(pool: ThreadPoolExecutor, running: Iterable[Future], timeout: float = JOIN_TIMEOUT_S) -> None:
    """Shut ``pool`` down for a command being stopped: its queued jobs cancelled, its ``running`` ones waited
    for at most ``timeout`` seconds in all."""
    pool.shutdown(wait=False, cancel_futures=True)
    # not the cancelled ones: futures.wait counts a job cancelled by shutdown as pending until its timeout
    concurrent.futures.wait([f for f in running if not f.cancelled()], timeout=time_left(timeout))


def call_within(fn: Callable[[], None], timeout: float, name: str) -> bool:
    """``fn()`` on a daemon thread, waited for at most ``timeout`` seconds: True when it ended in time (its
    exception, if any, is raised here), False when it is still running (left to end on its own)."""
    thread, outcome = _started(fn, name)
    thread.join(time_left(timeout))
    if thread.is_alive():
        return False
    outcome.result()
    return True


def interruptible(fn: Callable[[], T], name: str) -> T:
    """``fn()``, on the main thread made interruptible: run on a daemon thread and joined, so that a Ctrl-C or
    SIGTERM reaches the main thread while ``fn`` waits on a store (a signal's handler runs only between the main
    thread's bytecodes: the final publish's upload to a frozen store held a SIGTERM for minutes, an operator's
    trial). Its exception is raised here. Elsewhere than on the main thread, called directly."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    thread, outcome = _started(fn, name)
    thread.join()  # a lock's wait: a signal's handler runs, and its KeyboardInterrupt is raised here
    return outcome.result()


def _started(fn: Callable[[], T], name: str) -> tuple[threading.Thread, Future]:
    """A daemon thread named ``name`` running ``fn``, and the Future of its result or exception."""
    outcome: Future = Future()

    def run() -> None:
        try:
            outcome.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - raised by the caller
            outcome.set_exception(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, outcome


def threads_left(started_before: Collection[threading.Thread] = ()) -> list[str]:
    """The names of raypack's threads (named ``raypack-...``) still running: a pool's job left running by
    :func:`stop_pool`, a request :func:`call_within` or :func:`interruptible` gave up on, a chunk file's writer
    thread. After a stop, ``raypack.console_main`` leaves without the interpreter's teardown while any is: the
    teardown waited for them, and pyarrow's S3 finalizer for their requests (a stop that printed its line, then
    did not exit for minutes: an operator's trial). Not those in ``started_before`` (a caller's process running
    several commands). Listed by ``threading.enumerate`` alone: after a join that a signal interrupted, Python 3.11
    marks a thread still running as stopped (``is_alive()`` False: bpo-45274's fix releases the lock it holds)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("raypack-") and t not in started_before]
