"""Arrow's allocator told to hand freed pages back to the system within 10 ms, so that a worker's peak memory
follows one task, not the number of tasks it has run.

pyarrow's default pool is mimalloc (2.2 in pyarrow 26), which keeps freed pages for about a second before
it purges them. A one-pass ``pack --tokenizer --local`` over ten tasks of one shard's text then peaked at
394-401 MiB against 311-316 for one task (1.27x); the freed pages of earlier tasks' batches were kept
while the next ones were allocated elsewhere. With ``MIMALLOC_PURGE_DELAY=10`` (milliseconds): 321 against
281 MiB (1.14x), one task's peak lower too, at the same speed (``bench/bench_onepass.py``: 62.9-66.0M
against 61.8-62.4M tokens/s ``--local``, 67.9-70.2M against 61.8-69.2M on Ray, 2 alternating rounds of 3;
BENCHMARKS.md, stop 62). A delay of 0 purged every free at once: 1.12x, but ~5% slower (every batch
faulted its pages in afresh); 30 ms and more kept most of the excess (1.21x at 30, 1.20x at 100).

mimalloc reads the setting once, when ``libarrow`` loads. The command's module (:mod:`raypack.cli`) calls
:func:`purge_freed_pages` before its imports load pyarrow, so ``raypack``, ``python -m raypack.cli`` and
``jobs/pack.py`` all run with it; an embedded Ray's worker processes inherit it from the driver and load
pyarrow afresh (:func:`for_started_processes`). A value the caller's environment sets, or mimalloc's older
name for it (``MIMALLOC_RESET_DELAY``), is kept. A cluster's workers take their environment from the
cluster: set ``MIMALLOC_PURGE_DELAY=10`` there (its runtime_env's ``env_vars``) for the same bound. A
program that imports raypack's library modules keeps its own allocator's settings.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

PURGE_DELAY = "MIMALLOC_PURGE_DELAY"
"""mimalloc's environment variable for how long (ms) a freed page is kept before it is handed back."""

LEGACY_PURGE_DELAY = "MIMALLOC_RESET_DELAY"
"""The same setting's name in mimalloc before 2.1 (pyarrow before 13); mimalloc still reads it."""

PURGE_DELAY_MS = "10"
"""The delay raypack sets: see the module's figures."""


def purge_freed_pages() -> bool:
    """Set :data:`PURGE_DELAY` to :data:`PURGE_DELAY_MS` in this process's environment unless the caller
    set it or its legacy name. Returns whether this process's own Arrow pool follows it: False once pyarrow
    is loaded here (processes started from here still do)."""
    if PURGE_DELAY not in os.environ and LEGACY_PURGE_DELAY not in os.environ:
        os.environ[PURGE_DELAY] = PURGE_DELAY_MS
    return "pyarrow.lib" not in sys.modules


@contextlib.contextmanager
def for_started_processes() -> Iterator[None]:
    """:func:`purge_freed_pages` for the processes started inside (an embedded Ray's: they inherit this
    environment), and this process's environment as it was after: a program that runs a job through the
    library keeps its own."""
    before = os.environ.get(PURGE_DELAY)
    purge_freed_pages()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PURGE_DELAY, None)
