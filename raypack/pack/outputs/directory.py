"""A local directory output (:class:`LocalOutput`), published by renaming a complete staging directory into its place.

Everything is written into a staging directory beside the output, ``.<name>.raypack-staging-partial``,
and published by one atomic rename (``renameat2(RENAME_EXCHANGE)`` when an old output is there, so
readers of the path see the old directory or the new one, never neither; a plain rename otherwise). So:

* bad input (found while planning or while packing) and a full disk leave nothing behind;
* ``overwrite`` replaces the old output only once the new one is complete, and only an output a
  raypack run wrote: an output holding anything else is refused (:func:`~raypack.pack.outputs.base.refuse_foreign`);
* before publishing, everything in the staging directory that the manifest does not list is
  removed (resume records, temporary files, chunk files of a layout that changed between a
  crash and a resume): a published directory holds exactly the manifest and its files;
* a run that dies for any other reason (a crash, a lost cluster, Ctrl-C) keeps its staging
  directory, and ``resume`` finishes it. Ctrl-C and SIGTERM are held off during the publish's
  renames. A run that died *while publishing* (killed) is finished by the next run on that
  output (:meth:`LocalOutput.recover`): a staging directory holding a manifest and no resume
  records is a complete output. The publish first writes the new manifest's sha256 beside the
  output (``.<name>.raypack-publishing``), so the next run knows which of the two directories is
  the new one: the staging directory is published if it holds that manifest, else (the old output
  swapped out by the exchange) deleted. One that still holds its records stopped before its
  publish began: its manifest is dropped, and ``resume`` checks its tasks as any others.

Where the exchange is not available (not Linux, or a filesystem that refuses it) the publish
is two renames, output -> ``.<name>.raypack-staging-old`` then staging -> output; a crash
between them is recovered the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import logging
import os
import shutil
import signal

from raypack.errors import InputError, PublishFailed
from raypack.io.lock import LocalLock
from raypack.io.terminal import signals_deferred
from raypack.pack.outputs.base import is_run_object, refuse_damaged, refuse_foreign
from raypack.pack.resume import RESULTS_DIR
from raypack.packed.writer import MANIFEST_NAME, TMP_PREFIX

__all__ = ["LocalOutput", "exchange_paths", "staging_dir"]

log = logging.getLogger(__name__)


def staging_dir(output: str) -> str:
    parent, name = os.path.split(os.path.abspath(output))
    return os.path.join(parent, f".{name}.raypack-staging-partial")


class LocalOutput:
    """A local directory, published by renaming a complete staging directory into its place."""

    def __init__(self, output: str) -> None:
        absolute = os.path.abspath(output)  # "link/" and "link/." are "link": one lock, and the link stays
        if os.path.islink(absolute):  # publish into the directory it names
            absolute = os.path.realpath(absolute)
        self.output = absolute
        self.work_dir = staging_dir(absolute)
        """Where the run writes: the staging directory."""
        self.old_dir = f"{self.work_dir[:-len('-partial')]}-old"
        parent, name = os.path.split(self.output)
        self.marker = os.path.join(parent, f".{name}.raypack-publishing")
        """Written as a publish begins, removed once it is done: the sha256 of the manifest being published."""
        self.records_aside = os.path.join(parent, f".{name}.raypack-records")
        """Where a publish moves the resume records (one rename) before the swap; removed once it is done. A
        ``--resume`` after a publish killed before its swap moves them back (:meth:`recover`)."""
        self.resumed = False
        """A --resume, or an earlier run's finished tasks in the staging directory (:meth:`prepare`): a
        full disk keeps the finished tasks (:meth:`after_failure`)."""
        self.lock = LocalLock(os.path.join(parent, f".{name}.raypack-lock"), what=f"output {output}")

    def acquire(self) -> None:
        self.lock.acquire()

    def check_publishable(self) -> None:
        """A mount point cannot be renamed into: the run was written beside it, on the parent's file system,
        and its publish was an EBUSY traceback, again on every later run (an operator's trial: a container's
        volume is mounted at the output path)."""
        if os.path.ismount(self.output):
            raise InputError(f"output {self.output} is a mount point: raypack writes a run beside its output and "
                             "renames it into place, which a mount point cannot take; give a directory inside it "
                             f"(e.g. --output {os.path.join(self.output, 'packed')})")

    def recover(self, resume: bool = False) -> bool:
        """Finish a publish that a dead run left half done (call holding the lock). True when the
        dead run's output is now the published one: its publish finished here, or had swapped it in
        (the staging directory then held the old output). A run stopped after writing its manifest but
        before its publish began (its resume records still there) is not published here: its manifest
        goes, and it is an unfinished run like any other, whose tasks ``--resume`` checks against the
        inputs and settings of the day (they may have changed since) and the chunk files' sha256. So is
        one killed in its publish before the swap, under ``--resume`` (its records set aside): it returned
        the dead run's output, exit 0, with the inputs or settings changed since (an operator's trial)."""
        staging, output, old = self.work_dir, self.output, self.old_dir
        staged = os.path.join(staging, MANIFEST_NAME)
        finished = False
        aside = resume and os.path.isdir(self.records_aside)
        if aside and self.publish_pending() and not self.swapped_out():
            os.replace(self.records_aside, os.path.join(staging, RESULTS_DIR))
        if os.path.isfile(staged) and self._holds_records():
            # Stopped after its manifest, before its publish: its tasks are checked again like any
            # unfinished run's (--resume verifies each against today's inputs and settings)
            log.info("an interrupted run into %s wrote its manifest but did not publish; its tasks are "
                     "checked again", output)
            os.remove(staged)
        elif self.publish_pending():  # killed in the publish itself (signals are held off there)
            finished = not aside  # swapped in already: a --resume finds it complete, as one rename later
            if self.swapped_out():
                log.info("removing %s: an output replaced by an interrupted publish", staging)
                shutil.rmtree(staging)
            else:
                log.info("finishing the interrupted publish of %s", output)
                self.publish()
        if os.path.isdir(old):
            if not os.path.exists(output):
                log.info("restoring %s: its replacement was never published", output)
                os.replace(old, output)
            else:
                shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(self.marker):
            os.remove(self.marker)
        shutil.rmtree(self.records_aside, ignore_errors=True)
        return finished

    def swapped_out(self) -> bool:
        """Whether the staging directory of a publish killed half way holds the old output (the exchange was
        done) rather than the new one: the new one is the manifest whose sha256 the publish wrote first. A
        publish that left no such record (a raypack before it) is judged by the manifests' modification
        times, which a manifest touched in between can fool."""
        staged, published = (os.path.join(d, MANIFEST_NAME) for d in (self.work_dir, self.output))
        if not os.path.isfile(published):
            return False
        try:
            with open(self.marker, encoding="ascii") as f:
                new = f.read().strip()
        except (OSError, ValueError):
            new = ""
        if new:
            if new == _sha256_of(staged):
                return False
            if new == _sha256_of(published):
                return True
        return os.stat(published).st_mtime_ns >= os.stat(staged).st_mtime_ns

    def check_free(self, *, overwrite: bool, resume: bool) -> None:
        out, staging = self.output, self.work_dir
        if os.path.lexists(staging) and not os.path.isdir(staging):  # every run failed on it (a trial)
            raise InputError(f"{staging} is not a directory; raypack keeps an unfinished run's work there: move or "
                             "remove it, then run again")
        if os.path.exists(out) and not os.path.isdir(out):
            raise InputError(f"output {out} exists and is a file, not a directory: give --output a directory "
                             "(a new path is made), or move the file away")
        if os.path.isdir(staging) and not (resume or overwrite) and self.holds_finished_work():
            raise InputError(f"an earlier run into {out} did not finish (its work is in {staging}); "
                             f"pass --resume to finish it or --overwrite to start over")
        if os.path.isdir(out):
            refuse_foreign(out, [n for n in os.listdir(out) if not is_run_object(n) and not is_run_object(f"{n}/")],
                           overwrite=overwrite)
        if resume and os.path.isdir(staging):
            return  # an unfinished run (an --overwrite one, where an output is there) to finish
        if os.path.isdir(out) and os.listdir(out) and not overwrite:
            if resume and os.path.exists(os.path.join(out, MANIFEST_NAME)):
                refuse_damaged(out)
                raise InputError(f"output {out} is already complete; nothing to resume (to pack it again, with other "
                                 "inputs or settings, pass --overwrite instead of --resume)")
            raise InputError(f"output directory {out} is not empty; pass --overwrite to replace it "
                             f"(the old output is removed only after the new one is complete)")

    def keep_for_resume(self, error: InputError) -> None:
        """Bad input in a ``--resume`` whose staging directory holds the runs before's finished tasks:
        they stay, and the line says so (raises ``error`` with that said; nothing where none are kept)."""
        if self._holds_records():
            raise InputError(f"{error}; the finished tasks are kept in {self.work_dir}: "
                             "rerun with --resume once it is fixed") from error

    def holds_finished_work(self) -> bool:
        """Whether the staging directory holds a finished task's record, or a complete output."""
        return os.path.isfile(os.path.join(self.work_dir, MANIFEST_NAME)) or self._holds_records()

    def publish_pending(self) -> bool:
        """Whether a dead run's publish is half done (:meth:`recover` finishes it): a manifest in the
        staging directory and no resume records (the publish removes them first)."""
        return os.path.isfile(os.path.join(self.work_dir, MANIFEST_NAME)) and not self._holds_records()

    def _holds_records(self) -> bool:
        results = os.path.join(self.work_dir, RESULTS_DIR)
        return os.path.isdir(results) and any(os.scandir(results))

    def discard(self) -> None:
        """Remove the staging directory (a run that keeps nothing)."""
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def prepare(self, *, fresh: bool, resume: bool = False) -> None:
        if fresh:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        results = os.path.join(self.work_dir, RESULTS_DIR)
        if os.path.lexists(results) and not os.path.isdir(results) or os.path.islink(results):
            log.info("resume: %s is not a folder (damaged); every task is packed again", results)
            os.remove(results)  # a file or a link where the records go: a traceback on every --resume
        self.resumed = resume or os.path.isdir(results)
        os.makedirs(self.work_dir, exist_ok=True)

    def sweep(self, keep: set[str]) -> None:
        """Remove everything in the staging directory but the files in ``keep`` and the resume
        records: temporary files of killed attempts, chunk files of an earlier layout. The records go
        in :meth:`publish`, so that a run killed before its manifest is written keeps its tasks."""
        for entry in os.scandir(self.work_dir):
            if entry.name in keep or entry.name == RESULTS_DIR:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.remove(entry.path)

    def publish(self) -> None:
        """Make the complete staging directory the output: one atomic rename where possible. A Ctrl-C or
        SIGTERM from the resume records' removal to the rename is held off, so that an interrupted run
        either has its records (:meth:`recover` then leaves its tasks to be checked by ``--resume``) or
        is published; one that comes after is dropped: the output is complete, and the old one, moved
        aside first, is removed by the next run if its removal here is cut short."""
        staging, output, old = self.work_dir, self.output, self.old_dir
        shutil.rmtree(old, ignore_errors=True)  # a leftover (recover removes it): the name is needed below
        manifest = os.path.join(staging, MANIFEST_NAME)
        with signals_deferred() as came:
            if os.path.isfile(manifest):  # which directory is the new one, should the publish be killed
                with open(self.marker, "w", encoding="ascii") as f:
                    f.write(_sha256_of(manifest) + "\n")
            results = os.path.join(staging, RESULTS_DIR)
            if os.path.isdir(results) and not os.path.islink(results):  # the manifest is written
                shutil.rmtree(self.records_aside, ignore_errors=True)  # a stale one: these are this run's
                os.replace(results, self.records_aside)  # one rename; removed once the output is published
            else:
                shutil.rmtree(results, ignore_errors=True)
            try:
                if not os.path.exists(output):
                    os.rename(staging, output)
                elif exchange_paths(staging, output):
                    os.replace(staging, old)  # the old output, swapped into the staging directory's name
                else:  # no exchange here: two renames (see recover)
                    os.replace(output, old)
                    os.replace(staging, output)
            except OSError as e:  # a traceback, again on every later run (an operator's trial: chattr +i)
                raise PublishFailed(f"cannot rename the finished output into place at {output} ({e.strerror}); it "
                                    f"is complete in {staging}: fix that (the directory's permissions, an immutable "
                                    "or busy directory) and run the same command again, which finishes the "
                                    "publish") from e
            if os.path.exists(self.marker):
                os.remove(self.marker)
        if came:
            log.info("%s came as %s was published; it is complete", "Ctrl-C" if signal.SIGINT in came else
                     "SIGTERM", output)
        try:
            shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(self.records_aside, ignore_errors=True)
        except KeyboardInterrupt:
            log.info("the old output's removal was cut short; the next run on %s removes %s", output, old)

    def after_failure(self, error: BaseException) -> None:
        """Bad input and a full disk leave nothing; anything else keeps the work for --resume. Bad input
        or a full disk during a resume keeps the finished tasks (its temporary files go; the line says
        so): deleting them undid the earlier runs' work, which the next --resume then redid."""
        staging = self.work_dir
        if isinstance(error, OSError) and error.errno == errno.ENOSPC and self.resumed:
            self._remove_temporary_files()
            raise InputError(f"writing the output failed: {error.strerror} ({_where(error, staging)}); the "
                             f"finished tasks are kept in {staging}: free space and rerun with --resume") from error
        if isinstance(error, InputError) and self.resumed:  # the runs before did their tasks on good input
            self._remove_temporary_files()
            self.keep_for_resume(error)
        if isinstance(error, InputError) or (isinstance(error, OSError) and error.errno == errno.ENOSPC):
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(error, OSError):
                raise InputError(f"writing the output failed: {error.strerror} ({_where(error, staging)}); "
                                 f"nothing was published; free space and run again") from error
        elif os.path.isdir(staging) and not self.resumed and not self.holds_finished_work():
            shutil.rmtree(staging, ignore_errors=True)  # no task finished: nothing to resume (it said there was)
        elif os.path.isdir(staging) and not isinstance(error, PublishFailed):  # that one's line says what is kept
            log.error("the run failed; its finished shards are kept in %s: rerun with --resume to finish it", staging)

    def after_stop(self) -> None:
        """A stopped run (Ctrl-C, SIGTERM) keeps its finished tasks; its unfinished files go. They are those of a
        task a stopped Ray worker was writing (raypack.engine.pipeline.end_workers ended it before the lock is
        given back: an operator's stop trial left such a .tmp chunk file, which only the next run cleared)."""
        if os.path.isdir(self.work_dir):
            with contextlib.suppress(OSError):  # a file a hung thread still writes: the next run's sweep
                self._remove_temporary_files()

    def _remove_temporary_files(self) -> None:
        """This run's unfinished files, chunk files and resume records (a worker killed while it wrote its task's
        record left one in ``_results``); the finished tasks' files and records stay."""
        for directory in (self.work_dir, os.path.join(self.work_dir, RESULTS_DIR)):
            if not os.path.isdir(directory) or os.path.islink(directory):
                continue
            for entry in os.scandir(directory):
                if entry.name.startswith(TMP_PREFIX) and entry.is_file(follow_symlinks=False):
                    os.remove(entry.path)


def _sha256_of(path: str) -> str:
    """The hex sha256 of a (small) file's bytes."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _where(error: OSError, staging: str) -> str:
    """The file a failed write names, else the staging directory (Ray Data re-raises a worker's
    OSError with its own long message where the file name was)."""
    name = error.filename
    return name if isinstance(name, str) and os.sep in name and "\n" not in name and len(name) < 1024 else staging


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange_paths(a: str, b: str) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False where the platform or the filesystem cannot (then nothing changed).
    """
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


def _renameat2():
    if not os.uname().sysname == "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


# ----------------------------------------------------------------------------- object store
