"""Test helper shared by the resume and object-storage tests: make the one-process packer fail
on one shard, as a crash or a bad shard would."""

from __future__ import annotations

import raypack.pack.job as job
import raypack.pack.packer as shard_pack


def fail_at_shard(monkeypatch, index: int, error: BaseException) -> list[int]:
    """Make the packer raise ``error`` on shard ``index`` (local engine); return the shards packed."""
    packed, real = [], shard_pack.pack_shard

    def flaky(task, settings, stop=None):
        if task.shard_index == index:
            raise error
        packed.append(task.shard_index)
        return real(task, settings, stop)

    monkeypatch.setattr(job, "pack_shard", flaky)
    return packed
