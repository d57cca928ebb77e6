"""raypack: pack tokenized corpora into fixed-length context windows, identically at any parallelism.

The core (packing, masks, reading packed output) imports numpy and pyarrow only; Ray is
imported by ``raypack.engine.pipeline`` alone, when a job runs. Names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Chunks": "raypack.rules.core",
    "StreamPacker": "raypack.rules.core",
    "pack_sequences": "raypack.rules.core",
    "build_intra_document_mask": "raypack.rules.masks",
    "build_bool_mask": "raypack.rules.masks",
    "cu_seqlens": "raypack.rules.masks",
    "position_ids": "raypack.rules.masks",
    "loss_mask": "raypack.rules.masks",
    "PackedDataset": "raypack.packed.reader",
    "read_packed": "raypack.outputs",
    "InputError": "raypack.errors",
}

__all__ = sorted(_EXPORTS)


def console_main(argv: list[str] | None = None) -> int:
    """The ``raypack`` command (and ``jobs/pack.py``): :func:`raypack.cli.main`, loaded here so that a
    Ctrl-C while it loads (numpy, pyarrow: a few tenths of a second) is one line too, not a traceback.
    The first Ctrl-C raises KeyboardInterrupt and the process ignores any after it: its one line, the
    work kept for ``--resume`` and Ray's shutdown are not cut short by a second one (a double tap, or
    ``timeout``, which signals the child and its process group). SIGTERM does the same, exit 143
    (:func:`raypack.io.terminal.stop_on_sigterm`). On Ray, it shuts Ray down itself and leaves
    without the interpreter's teardown (:func:`raypack.engine.pipeline.leave`): a Ctrl-C a few
    seconds into a run left Ray's threads to crash there (exit 139, "Segmentation fault") in about a
    third of the tries, and a SIGTERM during the shutdown at exit killed a finished run. Stopped with
    a background job still running (a read or upload that hangs, which :mod:`raypack.io.threads` did not
    wait out), it leaves the same way, so that the interpreter does not wait for it at exit."""
    import signal
    import sys
    import threading

    from raypack.io.threads import stop_requested, stopped_at

    stopped_at(None)  # a new command: no stop's deadline (a caller's process may run several)
    before = set(threading.enumerate())  # a caller's threads are not this command's to leave behind

    def first_interrupt(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_requested()  # the waits for background jobs share one deadline from here (raypack.io.threads)
        raise KeyboardInterrupt

    first_interrupt.raypack_stops = True  # type: ignore[attr-defined]  (raypack.io.terminal.command_done)

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored (nohup, &)
        signal.signal(signal.SIGINT, first_interrupt)
    from raypack.io.terminal import interrupted_code, interrupted_line, stop_on_sigterm

    stop_on_sigterm()
    try:
        from raypack.cli import main

        code = main(argv)  # its own Ctrl-C line once it runs a command; this one while it loads
    except KeyboardInterrupt:
        print(interrupted_line([], None), file=sys.stderr)
        code = interrupted_code()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command has ended: Ray's shutdown runs whole
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ray = sys.modules.get("ray")
    if ray is not None and (code in (130, 143) or getattr(ray, "is_initialized", lambda: False)()):
        try:
            from raypack.engine.pipeline import leave
        except Exception:  # noqa: BLE001 - Ray only half there: leave the usual way
            return code
        leave(code)
    if code in (130, 143):
        from raypack.io.threads import threads_left

        if threads_left(before):  # a job a bounded wait left running (a store that stopped answering): not joined
            import logging
            import os

            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    stopped_at(None)
    return code


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'raypack' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
