"""Timing shared by the benchmarks: interleaved rounds, so that a noisy machine (page faults,
other jobs) hits every candidate alike."""

from __future__ import annotations

import time
from typing import Callable


def time_interleaved(candidates: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call for each candidate; one warm-up, then ``repeats`` rotating rounds."""
    names = list(candidates)
    for name in names:
        candidates[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            result = candidates[name]()
            times[name].append(time.perf_counter() - start)
            del result
    return times
