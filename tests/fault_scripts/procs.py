"""Process helpers for the fault tests (Linux ``/proc`` only; no psutil).

Ray sets the title of an actor's worker process to ``ray::<ActorClass>`` (plus ``.<method>``
while a call runs), and Ray Data names its map actors ``MapWorker(MapBatches(<UDF>))``. A
packer is therefore a process whose command line contains :data:`PACKER_TITLE`. The tests
only ever look inside the process tree they started themselves (the machine is shared with
other engineers' Ray instances), and they tie a packer to a shard in flight by the
``.tmp-*`` chunk file it holds open in the job's staging directory.
"""

from __future__ import annotations

import glob
import os
import time

PACKER_TITLE = "MapWorker(MapBatches(ShardPackerActor))"
TMP_PREFIX = ".tmp-"


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [state, ppid, ...]; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text[text.rindex(")") + 2:].split()


def parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.02)
    return not is_alive(pid)


def command_line(pid: int) -> str:
    """The process's command line (Ray's process title for Ray workers); '' if gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` in the process tree (not ``root`` itself)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            ppid = parent_pid(int(entry))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def packer_pids(root: int) -> list[int]:
    """Live packer actor processes below ``root``."""
    return sorted(p for p in descendants(root) if PACKER_TITLE in command_line(p) and is_alive(p))


def open_tmp_files(pid: int, directory: str) -> list[str]:
    """The ``.tmp-*`` files directly inside ``directory`` that ``pid`` holds open."""
    directory = os.path.realpath(directory)
    found = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if os.path.dirname(target) == directory and os.path.basename(target).startswith(TMP_PREFIX):
            found.append(target)
    return sorted(found)


def staging_dirs(output: str) -> list[str]:
    """The job's staging directories beside ``output`` (``.<name>.raypack-staging-*``)."""
    parent, name = os.path.split(os.path.abspath(output))
    return sorted(p for p in glob.glob(os.path.join(parent, f".{name}.raypack-staging-*"))
                  if not p.endswith("-old"))


def final_name(tmp_path: str) -> str:
    """``.tmp-<uuid hex>-chunks-N.arrow`` -> ``chunks-N-`` (see raypack.packed.writer: the final name
    adds the file's hash)."""
    base = os.path.basename(tmp_path)
    assert base.startswith(TMP_PREFIX), base
    return base[len(TMP_PREFIX):].split("-", 1)[1].removesuffix(".arrow") + "-"
