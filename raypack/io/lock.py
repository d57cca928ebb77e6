"""One writer per output: a lock taken before a run looks at, plans or writes its output.

Local (:class:`LocalLock`): the file ``.<name>.raypack-lock`` beside the output, locked with
``flock(LOCK_EX | LOCK_NB)`` and holding the owner's host, pid and start time. The kernel
drops the lock when its process dies however it dies (SIGKILL included), so a lock left by
a dead run is never in the way: the file stays, the lock does not. Works across hosts on
filesystems whose flock reaches the server (NFSv4, Lustre, CephFS, GPFS). Where flock is not
supported at all, the owner record alone decides: a live pid on this host, or any other host,
holds the lock; a dead pid on this host is stale and taken over.

Object store (:class:`ObjectStoreLock`): an object ``.raypack-lock.json`` under the output
prefix, written when absent and read back. pyarrow offers no conditional put, so this is
advisory: two runs started within the same moment can both pass. A lock whose owner is a dead
pid on this host is taken over; one from another host must be deleted by hand (the message
says which object) when its run is known to be gone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import socket
import time

import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.io.terminal import signals_deferred
from raypack.io.threads import JOIN_TIMEOUT_S, call_within, left_behind_level

log = logging.getLogger(__name__)


def owner_record() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def describe(owner: dict) -> str:
    return f"pid {owner.get('pid')} on {owner.get('host')}, since {owner.get('started')}"


def is_stale(owner: dict) -> bool:
    """A record of a process on this host that no longer runs."""
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.ENOSPC, errno.EDQUOT,
                        errno.ENOENT})  # ENOENT: a directory that takes no new file (/proc)
"""Why a directory cannot take the lock file: the user's to fix, so one line."""


class LocalLock:
    """An exclusive lock on a local output, held from :meth:`acquire` to :meth:`release`."""

    def __init__(self, path: str, *, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None
        self._made: list[str] = []
        """The directories :meth:`acquire` made for the lock file, deepest first (:meth:`release`
        removes those left empty: a run that failed leaves no empty folders)."""

    def acquire(self) -> None:
        """Take the lock or raise InputError naming the run that holds it. Ctrl-C and SIGTERM are held off
        while it is taken, then delivered once it is given back: one that came while the lock file was made
        left it behind, after a line that said nothing was written (a new user's trial)."""
        with signals_deferred() as came:
            self._acquire()
        if came:
            self.release()
            for signum in dict.fromkeys(came):
                signal.raise_signal(signum)

    def _acquire(self) -> None:
        parent = os.path.dirname(self.path) or "."
        try:
            self._made = _missing_dirs(parent)
            os.makedirs(parent, exist_ok=True)
            while True:
                fd = self._open_and_lock()
                if _same_file(fd, self.path):  # not a lock file its last owner just removed
                    break
                os.close(fd)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(owner_record()).encode(), 0)
            except BaseException:
                os.close(fd)
                raise
        except OSError as e:
            a_file = e.errno == errno.EEXIST and os.path.lexists(parent) and not os.path.isdir(parent)
            if e.errno not in UNWRITABLE and not a_file:
                raise
            why = "it is a file, not a directory" if a_file else os.strerror(e.errno)
            raise InputError(f"{self.what}: cannot write in {os.path.abspath(parent)} ({why}); give "
                             "an --output in a directory this user can write") from None
        self._fd = fd

    def check_free(self) -> None:
        """InputError naming the run that holds the lock now, if one does; the lock is not kept
        (a run checks before Ray starts, then takes it)."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except OSError:
            return  # no lock file (or none this user can open): acquire decides
        try:
            if self._flock(fd):
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
            owner = _read_record(fd)
        finally:
            os.close(fd)
        raise InputError(f"{self.what} is being written by another raypack run ({describe(owner)}); "
                         f"wait for it to finish or stop it, then run again")

    def _open_and_lock(self) -> int:
        """The lock file, open and locked, or InputError naming the run that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            locked = self._flock(fd)
        except BaseException:
            os.close(fd)
            raise
        if not locked:
            owner = _read_record(fd)
            os.close(fd)
            raise InputError(f"{self.what} is being written by another raypack run ({describe(owner)}); "
                             f"wait for it to finish or stop it, then run again")
        return fd

    def _flock(self, fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        owner = _read_record(fd)  # no flock on this filesystem: the record decides
        return not owner or is_stale(owner) or owner.get("pid") == os.getpid()

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        for directory in self._made:
            try:
                os.rmdir(directory)  # only if empty
            except OSError:
                break


def _missing_dirs(path: str) -> list[str]:
    """The directories of ``path`` that do not exist yet, deepest first."""
    missing = []
    path = os.path.abspath(path)
    while not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _read_record(fd: int) -> dict:
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _same_file(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino)


class ObjectStoreLock:
    """An advisory lock object under an object-store prefix (no conditional put in pyarrow)."""

    NAME = ".raypack-lock.json"

    def __init__(self, fs: pafs.FileSystem, path: str, *, what: str) -> None:
        self._fs = fs
        self.path = path
        self.what = what
        self._record: dict | None = None

    def acquire(self) -> None:
        owner = self._read()
        if owner is not None and not is_stale(owner):
            raise InputError(f"{self.what} is being written by another raypack run ({describe(owner)}); wait for "
                             f"it to finish, or if that run is gone delete {self.path} and run again")
        record = owner_record()
        with self._fs.open_output_stream(self.path) as f:
            f.write(json.dumps(record).encode())
        back = self._read()
        if back == {}:  # not a record: the store kept other bytes than the upload's (a trial: moto, no credentials)
            with contextlib.suppress(OSError):
                self._fs.delete_file(self.path)
            raise InputError(f"{self.what}: the lock {self.path} read back holds other bytes than were written; the "
                             "store did not keep the upload as sent: check the credentials and the endpoint "
                             "(AWS_ENDPOINT_URL)")
        if back != record:
            raise InputError(f"{self.what} was taken by another raypack run just now; wait for it to finish")
        self._record = record

    def release(self) -> None:
        """Delete the lock object, waiting at most JOIN_TIMEOUT_S (raypack.io.threads): a store that stopped
        answering held a stopped run for minutes here (an operator's trial). A lock left behind names this
        process, which the next run on this host takes over once it has ended."""
        if self._record is None:
            return
        self._record = None

        def delete() -> None:
            try:
                self._fs.delete_file(self.path)
            except FileNotFoundError:
                pass

        try:
            if not call_within(delete, JOIN_TIMEOUT_S, "raypack-lock-release"):
                log.log(left_behind_level(), "could not delete the lock %s (the store did not answer in time); the "
                        "next run on this host takes it over, or delete it once this run has ended", self.path)
        except OSError as e:
            log.warning("could not delete the lock %s: %s", self.path, e)

    def _read(self) -> dict | None:
        try:
            with self._fs.open_input_stream(self.path) as f:
                record = json.loads(f.read() or b"{}")
        except FileNotFoundError:
            return None
        except (ValueError, RecursionError):
            return {}
        return record if isinstance(record, dict) else {}
