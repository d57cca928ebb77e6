"""What the terminal shows around a run: Ray's verbosity, the Ctrl-C line, quiet broken pipes, C++ lines
and console loggers kept off it."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import shlex
import sys
from typing import Iterator, Sequence

from raypack.io.threads import stop_requested

RAY_VERBOSE: contextvars.ContextVar[bool] = contextvars.ContextVar("raypack_ray_verbose", default=False)
"""``-v``: Ray's own log lines, the workers' output and Ray Data's progress reach the terminal too."""


_TERMINATED: list[int] = []
"""The SIGTERM that stopped this command, once one has (:func:`stop_on_sigterm`)."""


def stop_on_sigterm() -> None:
    """Make SIGTERM (``timeout``, ``kill``, a scheduler's preemption, ``ray job stop``) stop the command
    as Ctrl-C does: its one line with the work kept for ``--resume``, Ray shut down, exit 143 (128 +
    SIGTERM). Without it Python dies at once, and on Ray the core worker's handler prints a stack
    trace first. For the console script, on the main thread; any signal after the first is ignored,
    so that the line and the shutdown are not cut short. Not where SIGTERM is already handled."""
    import signal

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _TERMINATED.append(signum)
        stop_requested()
        raise KeyboardInterrupt

    on_sigterm.raypack_stops = True  # type: ignore[attr-defined]  (command_done knows it by this)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)


def command_done() -> None:
    """The command's work is done and its summary not yet flushed: from here a Ctrl-C or SIGTERM is
    ignored, so one that comes as the summary shows (``timeout``, a double tap) does not turn a
    finished run into exit 130/143. Only where raypack's own handlers are installed (the console
    script), not in a caller's process."""
    import signal

    for signum in (signal.SIGTERM, signal.SIGINT):
        if getattr(signal.getsignal(signum), "raypack_stops", False):
            signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def signals_deferred() -> Iterator[list[int]]:
    """Ctrl-C and SIGTERM held off for the block (a few renames: a publish), then dropped: the block
    finishes what it started, and the caller, knowing the signals that came (the yielded list), goes on
    as if they had come after it. Only on the main thread (elsewhere Python delivers no signal)."""
    import signal
    import threading

    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in before:
        signal.signal(signum, lambda number, frame: came.append(number))
    try:
        yield came
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def terminated() -> None:
    """Record that a SIGTERM stopped the command though another handler than ours took it (Ray's,
    while it starts): its line and exit code are then SIGTERM's."""
    import signal

    if not _TERMINATED:
        _TERMINATED.append(signal.SIGTERM)


def interrupted_code() -> int:
    """The exit code of a command stopped by Ctrl-C (130) or by SIGTERM (143)."""
    return 143 if _TERMINATED else 130


def interrupted_line(argv: Sequence[str], kept: str | None) -> str:
    """The one line Ctrl-C (or SIGTERM) prints: what was kept and the exact command that finishes the run
    (``kept`` None: no task had finished, and nothing is left). That command is the run's own with ``--resume``
    in place of ``--overwrite``: the two are refused together, and a resumed ``--overwrite`` replaces the
    old output as the interrupted run would have."""
    what = "terminated (SIGTERM)" if _TERMINATED else "interrupted"
    if kept is None:
        return f"raypack: {what}; nothing was written"
    program = _program()
    again = list(argv) if "--resume" in argv else [*(a for a in argv if a != "--overwrite"), "--resume"]
    return (f"raypack: {what}; the finished work is kept in {escaped_line(kept)}; finish with: {program} "
            f"{' '.join(map(shell_word, again))}")


_CONTROL = {code: ascii(chr(code))[1:-1] for code in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]}
"""Control characters (C0, DEL, C1: U+009B opens a terminal escape) and the Unicode line and paragraph
separators, as Python writes them in a string (``\\n``, ``\\x1b``, ``\\u2028``)."""
_SHELL_CONTROL = {code: "".join(f"\\x{b:02x}" for b in chr(code).encode()) for code in _CONTROL}
"""The same as bash's ``$'...'`` writes them: their UTF-8 bytes, so the shell reads back the same path."""


def escaped_line(text: str) -> str:
    """``text`` with its control characters escaped, so an error stays one line (and moves no cursor)
    whatever a path in it holds (a file named with a newline: a hostile trial)."""
    return text.translate(_CONTROL)


class OneLineFormatter(logging.Formatter):
    """raypack's INFO and WARNING lines with their control characters escaped, as the error lines are: a
    path that holds a newline keeps each one line. Other libraries' records (``-v``) are left as they are."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return escaped_line(text) if record.name.split(".")[0] == "raypack" else text


def configure_logging() -> None:
    """The command's log lines: INFO and up, the message alone, one line each (unless the root logger
    has its handlers already: a host program's, or pytest's)."""
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def shell_word(arg: str) -> str:
    """``arg`` quoted for a POSIX shell on one line: shlex's quoting, or bash's ``$'...'`` where it holds
    control characters (a newline in a path would break the line to paste)."""
    if not any(ord(c) in _CONTROL for c in arg):
        return shlex.quote(arg)
    return "$'" + arg.replace("\\", "\\\\").replace("'", "\\'").translate(_SHELL_CONTROL) + "'"


def _program() -> str:
    """The command as the user ran it, for a line to paste: ``.venv/bin/raypack`` where that was typed (a
    new user's trial: "raypack ..." failed outside the venv), else ``raypack``."""
    typed = sys.argv[0] if sys.argv else ""
    return shlex.quote(typed) if os.path.basename(typed) == "raypack" else "raypack"


def silence_stdout() -> None:
    """After a BrokenPipeError (``raypack verify OUT | head``): point stdout at /dev/null so that
    Python's flush at exit raises nothing."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


@contextlib.contextmanager
def stderr_off(off: bool) -> Iterator[None]:
    """File descriptor 2 points at /dev/null inside (C++ lines too); Python's own exceptions still propagate."""
    if not off:
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def quiet_console(name: str) -> None:
    """Keep logger ``name`` off the terminal (its file handlers keep everything): a failed task's
    ERROR line and traceback there stood above the one line raypack says for it."""
    for handler in logging.getLogger(name).handlers:
        if not isinstance(handler, logging.FileHandler) and "File" not in type(handler).__name__:
            handler.setLevel(logging.CRITICAL + 1)
