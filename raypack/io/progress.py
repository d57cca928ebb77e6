"""raypack's own progress line: at most one a second, on the ``raypack.io.progress`` logger (stderr).

``packed 5/16 shards, 1.2M tokens/s, ETA 12s``. Fed by the driver as results arrive (locally after
each shard, on Ray as each result row comes out of the pipeline). Pure Python, O(1) per update.

The rate and the ETA are taken from the first finished item on, once there is a second one: the
time before the first (Ray's start-up, actors importing their modules) is not the pace of the rest
(a demo once printed "ETA 46s", then finished in a second).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

log = logging.getLogger(__name__)


class Progress:
    """Counts finished items (shards, text tasks) and their tokens; logs a line at most every ``interval`` s."""

    def __init__(self, verb: str, total: int, unit: str, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.verb, self.total, self.unit, self.interval, self.clock = verb, total, unit, interval, clock
        self.start = self.last = clock()
        self.done = self.tokens = 0
        self.first: tuple[float, int] | None = None
        """When the first item finished, and its tokens."""

    def add(self, num_tokens: int) -> None:
        """One item finished with ``num_tokens`` tokens; logs when a second has passed or it was the last."""
        self.done += 1
        self.tokens += num_tokens
        now = self.clock()
        if self.first is None:
            self.first = (now, num_tokens)
        if now - self.last >= self.interval or self.done == self.total:
            self.last = now
            log.info("%s", self.line(now))

    def line(self, now: float) -> str:
        since, items, tokens = self.start, self.done, self.tokens
        if self.first is not None and self.done > 1 and now > self.first[0]:
            since, items, tokens = self.first[0], self.done - 1, self.tokens - self.first[1]
        elapsed = max(now - since, 1e-9)
        text = f"{self.verb} {self.done}/{self.total} {self.unit}, {_si(tokens / elapsed)} tokens/s"
        if self.done < self.total:
            text += f", ETA {elapsed / items * (self.total - self.done):.0f}s"
        return text


def _si(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"
