"""A per-shard progress deadline: a packer that makes no progress for a while is reported.

The packer beats once per read batch (and once per chunk batch written). A daemon thread
checks the time since the last beat; after ``timeout_s`` seconds without one it logs one
warning naming the shard, the process and how long, and again each further ``timeout_s``.
With ``restart=True`` it ends the process instead, after the warning (exit code 75): on Ray
the actor is restarted and its shard packed again from the start (the output is the same, as
after any worker loss); the local engine never restarts, since that would end the run.
No Ray here.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

log = logging.getLogger(__name__)

STALL_EXIT_CODE = 75


class ProgressWatchdog:
    """``with ProgressWatchdog(what, timeout_s) as dog: ... dog.beat() ...``; ``timeout_s <= 0``
    turns it off (no thread)."""

    def __init__(self, what: str, timeout_s: float, *, restart: bool = False, clock=time.monotonic) -> None:
        self.what = what
        self.timeout_s = float(timeout_s)
        self.restart = restart
        self.stalls = 0
        """Warnings given so far."""
        self._clock = clock
        self._last = clock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        self._last = self._clock()

    def __enter__(self) -> ProgressWatchdog:
        self._last = self._clock()
        if self.timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, name="raypack-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        reported = self._last
        while not self._done.wait(min(self.timeout_s / 4, 5.0)):
            idle = self._clock() - self._last
            if idle < self.timeout_s or self._clock() - reported < self.timeout_s:
                continue
            reported = self._clock()
            self.check(idle)

    def check(self, idle: float) -> None:
        """Report (and with ``restart``, end the process for) ``idle`` seconds without progress."""
        self.stalls += 1
        action = ("ending this packer so that Ray restarts it and packs the shard again" if self.restart
                  else "still waiting (set restart_stalled = true to restart a stalled packer on Ray)")
        log.warning("%s has made no progress for %.0f s (packer pid %d on %s); %s",
                    self.what, idle, os.getpid(), socket.gethostname(), action)
        if self.restart:
            logging.shutdown()
            os._exit(STALL_EXIT_CODE)
