"""Background threads that must not hold up a command being stopped: bounded waits on Ctrl-C and SIGTERM.

A thread pool ends with its jobs: a context manager's exit waits for every running one. On a store that
stopped answering, each read or upload in flight waits out its timeouts and retries, and a SIGTERM took
590 s to end a run (an operator's trial: an S3 server frozen mid-run). So when the command is being
stopped, :func:`stop_pool` cancels the queued jobs and waits at most ``JOIN_TIMEOUT_S`` for the running
ones; a job still running after that is left to end on its own, and the command ends without it
(``raypack.console_main`` leaves without the interpreter's join of such threads). What it leaves is what
a killed run leaves: its finished tasks, which ``--resume`` keeps.
"""

from __future__ import annotations

import concurrent.futures
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable

__all__ = ["JOIN_TIMEOUT_S", "call_within", "stop_pool", "threads_left"]

JOIN_TIMEOUT_S = 10.0
"""How long a stopped command waits for a background job in flight."""


def stop_pool(pool: ThreadPoolExecutor, running: Iterable[Future], timeout: float = JOIN_TIMEOUT_S) -> None:
    """Shut ``pool`` down for a command being stopped: its queued jobs cancelled, its ``running`` ones waited
    for at most ``timeout`` seconds in all."""
    pool.shutdown(wait=False, cancel_futures=True)
    # not the cancelled ones: futures.wait counts a job cancelled by shutdown as pending until its timeout
    concurrent.futures.wait([f for f in running if not f.cancelled()], timeout=timeout)


def call_within(fn: Callable[[], None], timeout: float, name: str) -> bool:
    """``fn()`` on a daemon thread, waited for at most ``timeout`` seconds: True when it ended in time (its
    exception, if any, is raised here), False when it is still running (left to end on its own)."""
    error: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - raised by the caller
            error.append(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return False
    if error:
        raise error[0]
    return True


def threads_left() -> list[str]:
    """The names of raypack's threads (named ``raypack-...``) still running that the interpreter would wait for at
    exit (not daemon threads): a pool's job left running by :func:`stop_pool`."""
    return [t.name for t in threading.enumerate() if t.name.startswith("raypack-") and not t.daemon and t.is_alive()]
