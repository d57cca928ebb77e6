"""Where a run writes and how its output becomes visible: one writer, then one publish.

Every run takes the output's lock first (:mod:`raypack.io.lock`), before it looks at the output,
plans or writes, and holds it until the output is published or the run has failed; a second
run on the same output gets one line naming the owner. :func:`run_published` is that life, in one
place, for every command that publishes (pack, tokenize, mix); how an output is written and made
visible is its kind's (:mod:`raypack.pack.outputs`):

* a local directory (:class:`~raypack.pack.outputs.directory.LocalOutput`): a staging directory
  beside it, published by one atomic rename;
* an object-store prefix such as ``s3://bucket/out``
  (:class:`~raypack.pack.outputs.object_store.ObjectStoreOutput`): no rename, the manifest, written
  last, is the commit.

Either way bad input leaves nothing, and any other failure (a crash, a lost cluster, Ctrl-C) keeps
the finished tasks for ``--resume``.
"""

from __future__ import annotations

import os
from typing import Callable, TypeVar

import pyarrow.fs as pafs

from raypack.errors import InputChanged, InputError, Interrupted
from raypack.io.fs import is_uri, resolve_filesystem
from raypack.io.threads import stop_pending
from raypack.pack.outputs.directory import LocalOutput, staging_dir
from raypack.pack.outputs.object_store import ObjectStoreOutput

__all__ = ["LocalOutput", "ObjectStoreOutput", "check_free_before_start", "output_target", "plan_before_start",
           "run_published", "staging_dir", "work_kept"]

P = TypeVar("P")
R = TypeVar("R")



def run_published(output: str, *, overwrite: bool, resume: bool, plan: Callable[[], P],
                  write: Callable[[LocalOutput | ObjectStoreOutput, P], R],
                  finished: Callable[[], R] | None = None, resumable: bool = True) -> R:
    """The life of every run that publishes an output (pack, tokenize), in one place:

    1. take the output's lock (held to the end), finish a publish a dead run left half done,
       refuse an output that is not free for this run. Where that publish made the output complete
       and this run is a ``resume`` (what the interrupted run's line told the user to run), the
       run is done: returns ``finished()`` (without it, the output is refused as complete);
    2. ``plan()`` (bad input raises before anything is made);
    3. make the work directory, ``write(target, planned)`` into ``target.work_dir``, publish;
       bad input or a full disk leaves nothing (``after_failure``), anything else keeps the
       work for ``--resume``; Ctrl-C raises :class:`~raypack.errors.Interrupted` naming it, and so does one
       whose raise Python dropped (in a weakref callback), found before the publish. Where no task had
       finished (nothing a ``--resume`` would keep: a new user's trial was told to resume an empty
       directory), and in a command with no ``--resume`` (not ``resumable``: a mix), Ctrl-C keeps nothing.
    Returns what ``write`` returned.
    """
    target = output_target(output)
    target.check_publishable()
    target.acquire()
    try:
        recovered = target.recover(resume)
        if recovered and resume and finished is not None:
            return finished()
        try:
            target.check_free(overwrite=overwrite, resume=resume)
        except InputError as e:
            if recovered:  # said as "not empty", a rerun of the killed command read as a failure (a trial)
                raise InputError(f"output {target.output} is complete: the run before was killed in its publish, "
                                 "which this run finished; nothing more to do (to pack it again, pass "
                                 "--overwrite)") from e
            raise
        try:
            planned = plan()
        except InputError as e:
            if resume:
                target.keep_for_resume(e)
            raise
        target.prepare(fresh=overwrite and not resume, resume=resume)
        try:
            result = write(target, planned)
            if stop_pending():  # a Ctrl-C or SIGTERM in the last task whose raise Python dropped: not published
                raise KeyboardInterrupt
            target.publish()
        except KeyboardInterrupt:
            if not resumable or not target.holds_finished_work():  # nothing a --resume would keep
                target.discard()
                raise Interrupted(None) from None
            target.after_stop()
            raise Interrupted(target.work_dir) from None
        except BaseException as e:
            if isinstance(e, InputChanged):  # not bad data: the tasks finished from the other files stay
                target.keep_for_resume(e)
            target.after_failure(e)
            raise
    finally:
        target.lock.release()
    return result


def check_free_before_start(output: str, *, overwrite: bool, resume: bool) -> bool:
    """What :func:`run_published` refuses about the output (not empty, an unfinished run, already
    complete), said before Ray takes seconds to start. No lock, nothing changed: run_published checks
    again under the lock. Skipped where a dead run's publish is to be finished first (its refusal
    would be premature): returns True there (a ``resume`` then needs no engine: run_published
    finishes that publish, and the run with it)."""
    target = output_target(output)
    target.check_publishable()
    if isinstance(target, LocalOutput):
        target.lock.check_free()  # another run writing it: one line now, not after Ray's start
        if target.publish_pending() and not (resume and os.path.isdir(target.records_aside)
                                             and not target.swapped_out()):
            return True
    target.check_free(overwrite=overwrite, resume=resume)
    return False


def work_kept(output: str | None) -> str | None:
    """The staging directory of a local ``output`` where earlier runs' finished tasks wait for ``--resume``
    (a run interrupted before it took the output, say during Ray's start, still names them); else None."""
    if not output or is_uri(output):
        return None
    target = LocalOutput(output)
    return target.work_dir if target.holds_finished_work() else None


def plan_before_start(output: str, *, resume: bool, plan: Callable[[], P]) -> P:
    """``plan()`` before an engine takes seconds to start (no lock: a plan reads the inputs, not the output);
    bad input in a ``resume`` says what is kept, as :func:`run_published` does."""
    try:
        return plan()
    except InputError as e:
        if resume:
            output_target(output).keep_for_resume(e)
        raise


def output_target(output: str) -> LocalOutput | ObjectStoreOutput:
    """How ``output`` (a local path or a URI) is written and published."""
    if not is_uri(output):
        return LocalOutput(output)
    fs, base = resolve_filesystem(output)
    if isinstance(fs, pafs.LocalFileSystem):
        return LocalOutput(base)
    return ObjectStoreOutput(output.rstrip("/"), fs, base)


