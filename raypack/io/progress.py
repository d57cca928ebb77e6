"""raypack's own progress line: at most one a second, on the ``raypack.io.progress`` logger (stderr).

``packed 5/16 shards, 1.2M tokens/s, ETA 12s``. Fed by the driver as results arrive (locally after
each shard, on Ray as each result row comes out of the pipeline). Pure Python, O(1) per update.

The rate and the ETA are the pace since the first finished item, once a second has passed since
it and another item finished: the time before the first (Ray's start-up, actors importing their
modules) is not the pace of the rest (a demo once printed "ETA 46s", then finished in a second).
Before that, and on the last line, the rate since the start (as the run's summary gives it, start-up
included) and no ETA: items that finish together (many workers) would otherwise give a rate of a
few tokens over microseconds, and an ETA from the start counts start-up as pace (a 10 s run once
said "ETA 73s"). Items kept from a resume record count as done, not in the pace; while only kept items
have finished, the line gives no rate.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from raypack.io.threads import stop_pending

log = logging.getLogger(__name__)


class Progress:
    """Counts finished items (shards, text tasks) and their tokens; logs a line at most every ``interval`` s."""

    def __init__(self, verb: str, total: int, unit: str, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.verb, self.total, self.unit, self.interval, self.clock = verb, total, unit, interval, clock
        self.start = self.last = clock()
        self.done = self.kept = self.tokens = 0
        """Items finished (kept ones too), kept from a resume record, and the tokens of the others."""
        self.first: tuple[float, int, int] | None = None
        """When the first item was processed, and the items and tokens processed by then."""

    def add(self, num_tokens: int, *, kept: bool = False) -> None:
        """One item finished with ``num_tokens`` tokens (``kept``: from its resume record, no work
        done); logs when a second has passed or it was the last. Raises KeyboardInterrupt where a Ctrl-C or
        SIGTERM came and the run goes on: its handler's raise was lost (raised in a weakref callback, which
        Python prints and drops: an operator's trial, 1 Ctrl-C in 50), and the run would have finished."""
        if stop_pending():
            raise KeyboardInterrupt
        self.done += 1
        now = self.clock()
        if kept:
            self.kept += 1
        else:
            self.tokens += num_tokens
            if self.first is None:
                self.first = (now, self.done - self.kept, self.tokens)
        if now - self.last >= self.interval or self.done == self.total:
            self.last = now
            log.info("%s", self.line(now))

    def line(self, now: float) -> str:
        processed = self.done - self.kept
        since, items, tokens = self.start, processed, self.tokens
        paced = self.first is not None and self.done < self.total and processed > self.first[1] \
            and now - self.first[0] >= self.interval
        if paced:
            since, items, tokens = self.first[0], processed - self.first[1], self.tokens - self.first[2]
        elapsed = max(now - since, 1e-9)
        text = f"{self.verb} {self.done}/{self.total} {self.unit}"
        if processed:  # none yet, only kept ones: no rate (it said "0 tokens/s (1 kept ...)", an operator's trial)
            text += f", {_si(tokens / elapsed)} tokens/s"
        if self.kept:
            text += f" ({self.kept} kept from the run before)"
        if paced:  # not from the start: start-up is not the pace of the rest
            text += f", ETA {elapsed / items * (self.total - self.done):.0f}s"
        return text


def _si(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.0f}"
