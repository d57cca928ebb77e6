"""Starting or joining Ray, and running a stage's tasks on it with failures as one line.

Ray itself is imported only when these are called (:mod:`raypack.engine.pipeline`), so the stages'
run modules (raypack.pack.job, raypack.tokenize.job) import this one freely.
"""

from __future__ import annotations

import errno
import re

from raypack.errors import InputError, WorkerError, install_extra
from raypack.io.threads import stop_pending

RAY_EXTRA = f"{install_extra('ray')} (or pass --local to run in this process)"


def engine():
    """:mod:`raypack.engine.pipeline`, imported now; InputError naming the extra when Ray is not installed."""
    try:
        from raypack.engine import pipeline
    except ImportError as e:
        raise InputError(f"Ray does not import ({e}); {RAY_EXTRA}") from e
    return pipeline


def connect_ray(address: str | None, *, verbose: bool | None = None, worker_num_cpus: float | None = None) -> None:
    """Start or join Ray now, so that a cluster that cannot be reached fails before anything is written;
    ``worker_num_cpus`` more than an embedded Ray would have is refused before it starts."""
    pipeline = engine()
    if worker_num_cpus is not None:
        pipeline.check_actors_fit_before_start(worker_num_cpus, address)
    pipeline.init_ray(address, verbose=verbose)


def on_ray(run, what: str):
    pipeline = engine()
    try:
        return run(pipeline)
    except (KeyboardInterrupt, SystemExit):
        if stop_pending():  # the command's Ctrl-C or SIGTERM: its workers end before the output's lock is given back
            pipeline.end_workers()  # (not a caller's Ctrl-C in its own process, whose Ray may run its own actors)
        raise
    except Exception as e:
        cause = pipeline.original_error(e)
        if isinstance(cause, OSError) and cause.errno != errno.ENOSPC and not isinstance(cause, InputError):
            raise WorkerError(path_failure(cause, what, pipeline.logs_dir())) from e
        if isinstance(cause, (InputError, OSError)):  # a full disk: the publish says it, keeping what it may
            raise cause from e
        raise WorkerError(worker_failure(cause, what, pipeline.logs_dir())) from e


def path_failure(cause: OSError, what: str, logs: str) -> str:
    """One line for a file a Ray worker could not open or write: on a cluster, a path that only the driver
    sees (an operator's trial: a traceback of 100 lines, its last one Ray's message where the file name was)."""
    name = cause.filename if isinstance(cause.filename, str) else ""
    if not name.startswith("/") or "\n" in name or len(name) > 1024:
        found = re.search(r"""(?:No such file or directory|Permission denied|Read-only file system): '(/[^'\n]+)'""",
                          str(cause))
        name = found.group(1) if found else ""
    where = f" ({name})" if name else ""
    return (f"{what} on Ray failed: {cause.strerror or type(cause).__name__}{where}: a worker could not open or write "
            "a path; on a cluster every node must see the inputs and the output at the same paths (shared storage, or "
            f"an object store); Ray's logs are in {logs}")


def worker_failure(cause: BaseException, what: str, logs: str) -> str:
    """One line: what failed, Ray's own first line about it, and where Ray's logs are."""
    text = str(cause).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{what} on Ray failed: {type(cause).__name__}: {first[:300]}; Ray's logs are in {logs}"
