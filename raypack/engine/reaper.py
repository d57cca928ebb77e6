"""When the process that started an embedded Ray dies, its Ray processes die with it.

``ray.init(address="local")`` starts the GCS, a raylet and agents (DashboardAgent,
RuntimeEnvAgent) as children of the driver, and ``ray.shutdown`` ends them. A driver that is
SIGKILLed (an OOM kill, ``kill -9``, a scheduler's hard timeout) runs no shutdown: the raylet
notices its GCS is gone, but the two agents ignore SIGTERM and linger for a minute or more
(issue 25, item 13). So an embedded Ray gets a reaper: a small process, started in its own
session, that holds the read end of a pipe whose write end only the driver holds. It blocks until
the pipe reads EOF, which happens when the driver exits for any reason, waits until the driver is
gone (this process's parent changes), then SIGKILLs every process of that Ray session
(:func:`session_processes`: its command line names the session's directory, or it holds a file
open inside it), and exits. It is started before ``ray.init``, with a glob of the session directories
this process's Ray may make (:func:`session_glob`), so that a Ctrl-C or a SIGKILL while Ray starts is
covered too.

The wait matters: the pipe can read EOF before the driver has ended (its interpreter's shutdown
closes the pipe, then runs atexit handlers and Ray's own shutdown), and the driver holds files in
the session directory, so reaping at EOF could SIGKILL the driver itself (a Ctrl-C that ended
with exit -9 instead of 130). After a clean ``ray.shutdown`` none is left, so it does nothing.
Linux (``/proc``); elsewhere it is not started. No Ray import here.
"""

from __future__ import annotations

import datetime
import glob
import os
import signal
import subprocess
import sys
import time

__all__ = ["end_processes", "reap", "reaping", "session_glob", "session_processes", "session_workers",
           "sessions_started", "start_reaper"]

_REAPERS: dict[str, subprocess.Popen] = {}
"""This process's reapers by session (each one's stdin is the pipe's write end: kept open while
this process lives)."""


def start_reaper(session_dir: str, since: float | None = None) -> subprocess.Popen | None:
    """Start the reaper of the Ray session ``session_dir`` (once per session); None off Linux.

    ``since``: ``session_dir`` is a glob of session directories (:func:`sessions_started`), for a reaper
    started before ``ray.init``, which names its session only once it is under way: a Ctrl-C or a SIGKILL
    while Ray starts left its agents running for a minute (a new user's trial)."""
    if not sys.platform.startswith("linux") or not os.path.isdir("/proc") or not session_dir:
        return None
    reaper = _REAPERS.get(session_dir)
    if reaper is None or reaper.poll() is not None:
        extra = [] if since is None else [repr(float(since))]
        reaper = _REAPERS[session_dir] = subprocess.Popen(
            [sys.executable, "-m", "raypack.engine.reaper", session_dir, str(os.getpid()), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            close_fds=True)
    return reaper


def session_glob(temp_dir: str, pid: int) -> str:
    """The glob of the session directories an embedded Ray started by process ``pid`` may have: Ray
    names each ``session_<local time>_<pid>`` under ``<temp_dir>/ray``."""
    return os.path.join(glob.escape(temp_dir), "ray", f"session_*_{pid}")


def sessions_started(pattern: str, since: float) -> list[str]:
    """The directories matching ``pattern`` (:func:`session_glob`) whose name's time is at or after
    ``since`` (less a second): an older session of another process that had this pid is left alone."""
    found = []
    for path in glob.glob(pattern):
        stamp = os.path.basename(path).removeprefix("session_").rsplit("_", 1)[0]
        try:
            started = datetime.datetime.strptime(stamp, "%Y-%m-%d_%H-%M-%S_%f").timestamp()
        except ValueError:
            continue
        if started >= since - 1 and not os.path.islink(path):
            found.append(path)
    return sorted(found)


def reaping() -> bool:
    """A reaper of this process's embedded Ray is running: its processes end when this one does."""
    return any(reaper.poll() is None for reaper in _REAPERS.values())


def session_processes(session_dir: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """Processes of the Ray session ``session_dir`` (Linux ``/proc``): its command line names the
    directory (the GCS, the raylet, the log monitor), or it holds a file open inside it (the agents,
    which rename themselves ``ray::DashboardAgent`` and so on, and keep their logs open there)."""
    root = session_dir.rstrip("/")
    needle = root.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                named = needle in f.read()
            if named or _holds_a_file_in(entry, root):
                found.append(int(entry))
        except OSError:
            continue
    return found


AGENTS = (b"ray::DashboardAgent", b"ray::RuntimeEnvAgent")
"""Processes of a session named ``ray::`` that are not workers: the raylet's agents."""


def session_workers(session_dir: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """The worker processes of the Ray session ``session_dir``: actors', tasks' and idle ones, which Ray names
    ``ray::...`` (``ray::TextPackerActor.pack``, ``ray::IDLE``); not its agents, GCS or raylet."""
    found = []
    for pid in session_processes(session_dir, exclude):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                name = f.read().split(b"\0", 1)[0].rstrip()
        except OSError:
            continue
        if name.startswith(b"ray::") and name not in AGENTS:
            found.append(pid)
    return found


def end_processes(pids: list[int], timeout: float) -> list[int]:
    """SIGKILL ``pids`` and wait at most ``timeout`` seconds until each has ended (gone, or a zombie its parent has
    not reaped yet: it runs no more code); those still running after it."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + timeout
    running = list(pids)
    while running:
        running = [pid for pid in running if _running(pid)]
        if not running or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    return running


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _holds_a_file_in(pid: str, root: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target == root or target.startswith(root + "/"):
            return True
    return False


def ancestors(pid: int) -> tuple[int, ...]:
    """The processes above ``pid``: its parent, the parent's, ... up to pid 1 (Linux ``/proc``)."""
    found: list[int] = []
    while pid > 1 and len(found) < 64:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])  # the field after the state: the parent
        except (OSError, ValueError, IndexError):
            break
        found.append(pid)
    return tuple(found)


def reap(session_dir: str, rounds: int = 3, spare: tuple[int, ...] = ()) -> int:
    """SIGKILL every process of the session but this one and ``spare`` (a few rounds: one may start
    another); how many."""
    killed = 0
    for _ in range(rounds):
        pids = session_processes(session_dir, exclude=(os.getpid(), *spare))
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.2)
    return killed


def _main(argv: list[str]) -> int:
    session_dir, driver = argv[0], int(argv[1])
    since = float(argv[2]) if len(argv) > 2 else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    above = ancestors(driver)  # taken while the driver lives: its parent, and theirs
    try:
        while sys.stdin.buffer.read(1 << 16):
            pass
    except OSError:
        pass
    while os.getppid() == driver:  # EOF can come while the driver is still ending: wait until it has
        time.sleep(0.05)
    time.sleep(0.5)  # a clean ray.shutdown that is still ending its processes finishes first
    for directory in [session_dir] if since is None else sessions_started(session_dir, since):
        reap(directory, spare=(driver, *above))  # never the driver (its pid may be another's by now) or what
        # started it (a shell, a scheduler's step, a test runner), whatever it holds open
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
