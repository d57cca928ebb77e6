"""What the terminal shows around a run: Ray's verbosity, the Ctrl-C line, quiet broken pipes."""

from __future__ import annotations

import contextvars
import os
import shlex
import sys
from typing import Sequence

RAY_VERBOSE: contextvars.ContextVar[bool] = contextvars.ContextVar("raypack_ray_verbose", default=False)
"""``-v``: Ray's own log lines, the workers' output and Ray Data's progress reach the terminal too."""


def interrupted_line(argv: Sequence[str], kept: str | None) -> str:
    """The one line Ctrl-C prints: what was kept and the exact command that finishes the run."""
    if kept is None:
        return "raypack: interrupted; nothing was written"
    again = list(argv) if "--resume" in argv else [*argv, "--resume"]
    return f"raypack: interrupted; the finished work is kept in {kept}; finish with: raypack {shlex.join(again)}"


def silence_stdout() -> None:
    """After a BrokenPipeError (``raypack verify OUT | head``): point stdout at /dev/null so that
    Python's flush at exit raises nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
