"""The local engine's threads: a run's tasks packed (or counted) ``workers`` at a time, in this process. No Ray.

pyarrow's readers, numpy's copies, the Arrow IPC writer and hashlib release the GIL, so two packers
on two threads share two cores where one packer, with its read-ahead and writer threads,
left part of one idle (BENCHMARKS.md, "The token-only job on threads": 1.20x). Each task writes its own files
and returns its own result, so the output does not depend on the number of threads or on their
timing: the results come back in task order.

A failure ends the run as it would without threads, with the same error: the tasks not started
are not started, the running tasks after the failed one stop before their next read batch
(:func:`until_stopped`: their partial files are removed, as on any error), the running tasks
before it finish (one of them may fail too), and the failure of the earliest task is raised here,
in the caller's thread. Ctrl-C stops every running task. A task that does not stop within
JOIN_TIMEOUT_S (raypack.io.threads; after a Ctrl-C or SIGTERM, what is left of the stop's deadline, which every
wait of a stopped command shares) is left to its daemon thread: a read that hangs.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator, Sequence, TypeVar

from raypack.io.threads import JOIN_TIMEOUT_S, time_left

__all__ = ["Stopped", "run_tasks", "until_stopped"]

T = TypeVar("T")
R = TypeVar("R")

POLL_S = 0.5


class Stopped(Exception):
    """A task given up because another task of its run failed, or the run was interrupted."""


def run_tasks(fn: Callable[[T, threading.Event | None], R], tasks: Sequence[T], workers: int,
              on_result: Callable[[R], None] | None = None) -> list[R]:
    """``fn(task, stop)`` for every task, at most ``workers`` at once (in task order of starting),
    ``on_result`` called in this thread as each one ends; the results in task order. With one
    worker (or one task) the tasks run here, one after another, with ``stop`` None."""
    if workers <= 1 or len(tasks) <= 1:
        results = []
        for task in tasks:
            results.append(fn(task, None))
            if on_result is not None:
                on_result(results[-1])
        return results

    halt = threading.Event()  # set: no task starts any more
    stops: dict[int, threading.Event] = {}  # a started task's own stop
    ended: queue.Queue = queue.Queue()
    pending = iter(enumerate(tasks))
    take = threading.Lock()

    def work() -> None:
        while not halt.is_set():
            with take:
                item = None if halt.is_set() else next(pending, None)  # halt may come after the loop's check
                if item is None:
                    return
                k, task = item
                stops[k] = threading.Event()
            try:
                ended.put((k, fn(task, stops[k]), None))
            except BaseException as e:  # noqa: BLE001 - raised by the caller's thread
                halt.set()
                ended.put((k, None, e))

    threads = [threading.Thread(target=work, name=f"raypack-packer-{i}", daemon=True)
               for i in range(min(workers, len(tasks)))]
    for thread in threads:
        thread.start()
    results: list = [None] * len(tasks)
    failure: tuple[int, BaseException] | None = None
    done: set[int] = set()
    try:
        while len(done) < len(tasks):
            if failure is not None:
                with take:
                    earlier = [j for j in stops if j < failure[0] and j not in done]
                if not earlier:
                    break  # every task before the failed one has ended: its error is the run's
            k, result, error = _next(ended)
            done.add(k)
            if error is None:
                results[k] = result
                if on_result is not None:
                    on_result(result)
            elif failure is None or k < failure[0]:
                failure = (k, error)
                halt.set()
                with take:
                    for j, event in stops.items():
                        if j > k:
                            event.set()  # later tasks stop; earlier ones finish, as one after another
        if failure is not None:
            raise failure[1]
    except BaseException:
        halt.set()
        with take:
            for event in stops.values():
                event.set()
        deadline = time.monotonic() + time_left(JOIN_TIMEOUT_S)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        raise
    for thread in threads:
        thread.join()
    return results


def _next(ended: queue.Queue) -> tuple:
    """The next task's end; waits in steps, so that Ctrl-C is raised here promptly."""
    while True:
        try:
            return ended.get(timeout=POLL_S)
        except queue.Empty:
            continue


def until_stopped(items: Iterator[T], stop: threading.Event | None, what: str) -> Iterator[T]:
    """``items``, raising :class:`Stopped` before the next one once ``stop`` is set (``items`` is
    closed either way, so a read-ahead thread behind it ends)."""
    if stop is None:
        yield from items
        return
    try:
        for item in items:
            if stop.is_set():
                raise Stopped(f"{what}: stopped, another task of this run failed or it was interrupted")
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
