"""Arrow's allocator told to hand freed pages back to the system within 10 ms in a command that tokenizes
text, so that a worker's peak memory follows one task, not the number of tasks it has run.

pyarrow's default pool is mimalloc (2.2 in pyarrow 26), which keeps freed pages for about a second before it
purges them. A one-pass ``pack --tokenizer --local`` over ten tasks of one shard's text then peaked at
394-401 MiB against 311-316 for one task (1.27x); the freed pages of earlier tasks' batches were kept while
the next ones were allocated elsewhere. With ``MIMALLOC_PURGE_DELAY=10`` (milliseconds): 314-336 against
275-277 MiB (1.14-1.21x over three runs of the bench), one task's peak lower too, at the same speed with
``--local`` and within a few percent on Ray (BENCHMARKS.md, stop 62). A delay of 0 purged every free at
once: 1.12x, but ~5% slower (every batch faulted its pages in afresh); 30 ms and more kept most of the
excess (1.21x at 30, 1.20x at 100). The token-only job is not given it: there the same 10 ms cost 15-20% of
its speed (it moves more bytes a second through freshly faulted pages) for memory it did not need (its peak
does not grow).

mimalloc reads the setting once, when ``libarrow`` loads, so it is decided from the command line before
anything imports pyarrow: the command's module (:mod:`raypack.cli`) calls :func:`purge_freed_pages` when
:func:`tokenizes` says so, which ``raypack``, ``python -m raypack.cli`` and ``jobs/pack.py`` all pass
through. An embedded Ray's worker processes inherit the driver's environment and load pyarrow afresh. A
value the caller's environment sets, or mimalloc's older name for it (``MIMALLOC_RESET_DELAY``), is kept. A
cluster's workers take their environment from the ``ray start`` that started them: set
``MIMALLOC_PURGE_DELAY=10`` there for the same bound. A program that imports raypack's library modules
keeps its own allocator's settings.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

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


def tokenizes(args: Sequence[str]) -> bool:
    """Whether a raypack command line tokenizes text: the ``tokenize`` command, a ``--tokenizer`` flag, or a
    ``--config`` file with a ``tokenizer`` key. The file is read quietly here: what is wrong with it is the
    command's to say, once it parses its arguments."""
    for k, arg in enumerate(args):
        if arg in ("tokenize", "--tokenizer") or arg.startswith("--tokenizer="):
            return True
        if arg == "--config" and k + 1 < len(args) and _config_names_tokenizer(args[k + 1]):
            return True
        if arg.startswith("--config=") and _config_names_tokenizer(arg.split("=", 1)[1]):
            return True
    return False


def _config_names_tokenizer(path: str) -> bool:
    from raypack.io.config_file import read_config_file

    try:
        return bool(read_config_file(path).get("tokenizer"))
    except Exception:  # noqa: BLE001 - the command reports it
        return False
