"""The command line's lines for what is not bad input and for arguments it does not take: a storage failure,
a thread the system refused, an unknown flag (with the nearest one), paths given without ``--input``."""

from __future__ import annotations

import argparse
import shlex
from typing import Sequence

__all__ = ["NO_THREAD", "NO_THREAD_WORKERS", "storage_failed", "stray_paths_hint", "unknown_flags_hint"]


def storage_failed(error: OSError, command: str) -> str:
    """The line for a storage failure that is not bad input (an object store that stopped answering mid-run, a
    disk's I/O error): it was a traceback, exit 1 (an operator's trial: the S3 server killed during a pack). A
    pack or tokenize run keeps its finished tasks there, as for any failure but bad input."""
    from raypack.io.fs import error_text

    then = ("; the finished tasks are kept: run the same command with --resume once it answers"
            if command in ("pack", "tokenize") else "; run it again once it answers")
    return f"the storage failed: {error_text(error, 600)}{then}"


def unknown_flags_hint(parser: argparse.ArgumentParser, command: str, extra: Sequence[str]) -> str:
    """One line for arguments the command does not take, with the nearest flag it has (``--tokeniser``:
    did you mean --tokenizer?)."""
    import difflib

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = [f for action in sub._actions for f in action.option_strings if f.startswith("--")]
    guesses = []
    for word in extra:
        if word.startswith("-"):
            typed = word.split("=", 1)[0]
            close = ([f for f in flags if f.startswith(typed)] if len(typed) > 2 else [])[:2] or \
                difflib.get_close_matches(typed, flags, n=1, cutoff=0.75)  # a prefix is not taken (_Parser)
            guesses += [f"{typed}: did you mean {' or '.join(close)}?"] if close else []
    said = f"unrecognized arguments: {' '.join(extra)}"
    return f"{said} ({'; '.join(guesses)})" if guesses else f"{said}; raypack {command} --help lists its flags"


def stray_paths_hint(args: argparse.Namespace, argv: Sequence[str], extra: Sequence[str]) -> str | None:
    """The line for paths given bare to a command that takes them as ``--input`` (``raypack verify OUT
    IN``, ``raypack pack IN OUT``): the command as it should be; None for anything else."""
    if "inputs" not in vars(args) or any(a.startswith("-") for a in extra):
        return None
    inputs, output = list(extra), []
    if args.command == "pack" and args.output is None and len(extra) > 1:
        inputs, output = inputs[:-1], ["--output", inputs[-1]]
    kept = list(argv)
    for a in extra:
        kept.remove(a)
    suggested = [*kept, *[w for path in inputs for w in ("--input", path)], *output]
    return (f"unexpected argument{'s' if len(extra) > 1 else ''} {' '.join(map(repr, extra))}: raypack "
            f"{args.command} takes each input as --input PATH; run: raypack {shlex.join(suggested)}")


NO_THREAD = ("the system refused to start a thread (this process reached its limit on threads or on address "
             "space: ulimit -u, ulimit -v); raise the limit")
NO_THREAD_WORKERS = ", or pass --workers 1"
"""Added to NO_THREAD for the commands that take ``--workers``."""
