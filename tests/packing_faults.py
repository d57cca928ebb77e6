"""Test helpers shared by the resume and object-storage tests: make the one-process packer fail
on one shard, as a crash or a bad shard would; watch (or fail) the fsyncs that publish files."""

from __future__ import annotations

import json
import os
import threading

import raypack.pack.job as job
import raypack.pack.packer as shard_pack


def fail_at_shard(monkeypatch, index: int, error: BaseException) -> list[int]:
    """Make the packer raise ``error`` on shard ``index`` (local engine); return the shards packed."""
    packed, real = [], shard_pack.pack_shard

    def flaky(task, settings, stop=None, committer=None):
        if task.shard_index == index:
            raise error
        packed.append(task.shard_index)
        return real(task, settings, stop, committer)

    monkeypatch.setattr(job, "pack_shard", flaky)
    return packed


def fail_at_call(monkeypatch, owner, name: str, call: int, error: BaseException) -> None:
    """Make ``owner.name`` (a function) raise ``error`` at its ``call``-th call (from 1), e.g. the one pass's
    ``tokenize_held`` at its fourth task."""
    real, calls = getattr(owner, name), []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, failing)


def record_fsyncs(monkeypatch, fail_on_publish_thread: BaseException | None = None) -> list[tuple[str, str]]:
    """Record every ``os.fsync`` as (the file's name, the calling thread's name), in order. With
    ``fail_on_publish_thread``, an fsync of a chunk file on a Committer's thread raises it instead."""
    events, real = [], os.fsync

    def fsync(fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        thread = threading.current_thread().name
        events.append((name, thread))
        if fail_on_publish_thread is not None and "chunks-" in name and thread.startswith("raypack-publish"):
            raise fail_on_publish_thread
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return events


def check_published_before_the_manifest(out: str, fsyncs: list[tuple[str, str]]) -> None:
    """Every chunk file the manifest lists was fsynced (under its temporary name) before the
    manifest, and the packers' own files on a Committer's thread, never on a packer's."""
    with open(os.path.join(out, "manifest.json")) as f:
        files = json.load(f)["files"]
    names = [name for name, _ in fsyncs]
    manifest_at = max(k for k, name in enumerate(names) if name.endswith("-manifest.json"))
    for entry in files:
        stem = f"chunks-{entry['first_chunk']:012d}.arrow"
        assert any(name.endswith(stem) for name in names[:manifest_at]), f"{entry['path']}: not fsynced first"
    chunk_threads = {thread for name, thread in fsyncs if "chunks-" in name}
    assert any(t.startswith("raypack-publish") for t in chunk_threads), chunk_threads  # the committer did publish
    assert not any(t.startswith(("raypack-packer", "raypack-tokenize")) for t in chunk_threads), chunk_threads
