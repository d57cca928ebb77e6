"""A token shard replaced during a run by one with the same row groups and the same document lengths
(an attacker's trial): every count the plan checks agrees, so the tasks read before the swap and
after it were packed into one output without a word. Each task now checks its file is the one the
run planned, when it starts and when its reads end, as the text path's tasks do."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raypack.pack.packer as packer
from raypack.errors import InputError
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.pack.publish import staging_dir

from helpers import file_digests


def write_shard(path, seed: int, num_groups: int = 4, docs: int = 6) -> None:
    """``num_groups`` row groups of ``docs`` documents of 5-14 tokens; the lengths do not depend on ``seed``."""
    lengths = [5 + (k * 7) % 10 for k in range(num_groups * docs)]
    rng = np.random.default_rng(seed)
    rows = [rng.integers(1, 1000, n).tolist() for n in lengths]
    pq.write_table(pa.table({"input_ids": pa.array(rows, pa.list_(pa.int32()))}), path, row_group_size=docs)


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "tokens"
    root.mkdir()
    for k in range(3):
        write_shard(root / f"s{k}.parquet", seed=k)
    return root


def config(tmp_path, corpus, name="out"):
    return make_config(dict(inputs=[str(corpus)], output=str(tmp_path / name), context_length=16, pad_token=0,
                            task_tokens=40, num_workers=1, read_batch_size=3))


def test_the_plan_cuts_each_shard_into_several_tasks(tmp_path, corpus):
    from raypack.pack.plan import make_plan

    tasks = make_plan(config(tmp_path, corpus)).tasks
    assert len(tasks) >= 6 and len({t.path for t in tasks}) == 3


def swap_when(monkeypatch, shard, when):
    """Replace ``shard`` with the same lengths under other tokens when ``when(task)`` holds, just before that
    task takes its file's identity (the local engine)."""
    real, swapped = packer.identify_input, []

    def swapping(task, settings):
        if not swapped and when(task):
            write_shard(shard, seed=99)
            swapped.append(task.task_index)
        return real(task, settings)

    monkeypatch.setattr(packer, "identify_input", swapping)
    return swapped


def test_a_shard_replaced_between_its_tasks_is_named_and_the_other_files_tasks_are_kept(tmp_path, corpus,
                                                                                        monkeypatch):
    changed = corpus / "s1.parquet"
    swapped = swap_when(monkeypatch, changed, lambda t: t.path == str(changed) and t.row_start > 0)
    staging = staging_dir(str(tmp_path / "out"))
    with pytest.raises(InputError, match=rf"^shard {re.escape(str(changed))} changed during the run .*; the finished "
                                         rf"tasks are kept in {re.escape(staging)}: rerun with --resume once it is "
                                         "fixed$"):
        run_pack(config(tmp_path, corpus), engine="local")
    assert swapped
    monkeypatch.undo()
    assert os.listdir(os.path.join(staging, "_results"))
    summary = run_pack(config(tmp_path, corpus), engine="local", resume=True)
    assert summary.kept[0] >= 1
    run_pack(config(tmp_path, corpus, "clean"), engine="local")
    assert file_digests(str(tmp_path / "out")) == file_digests(str(tmp_path / "clean"))


def test_a_shard_deleted_during_the_run_keeps_the_other_files_finished_tasks(tmp_path, corpus, monkeypatch):
    """An operator's trial: a file removed during the run threw the finished tasks away, as for bad data; a file
    changed during the run kept them. A file that is gone has changed too."""
    gone = corpus / "s2.parquet"
    real = packer.identify_input

    def removing(task, settings):
        if task.path == str(gone) and gone.exists():
            gone.unlink()
        return real(task, settings)

    monkeypatch.setattr(packer, "identify_input", removing)
    staging = staging_dir(str(tmp_path / "out"))
    with pytest.raises(InputError, match=rf"^input path not found: {re.escape(str(gone))}; it was there when the run "
                                         rf"listed its inputs.*; the finished tasks are kept in {re.escape(staging)}: "
                                         "rerun with --resume once it is fixed$"):
        run_pack(config(tmp_path, corpus), engine="local")
    assert len(os.listdir(os.path.join(staging, "_results"))) >= 2


def test_a_shard_replaced_while_its_last_task_reads_it_is_named(tmp_path, corpus, monkeypatch):
    """The swap after the task took its identity: only the check when its reads end can see it."""
    changed = corpus / "s2.parquet"
    real, swapped = packer.iter_document_batches, []

    def reading(path, *args, **kwargs):
        for batch in real(path, *args, **kwargs):
            yield batch
            if path == str(changed) and not swapped:
                write_shard(changed, seed=99)
                swapped.append(path)

    monkeypatch.setattr(packer, "iter_document_batches", reading)
    with pytest.raises(InputError, match=rf"^shard {re.escape(str(changed))} changed during the run"):
        run_pack(config(tmp_path, corpus), engine="local")
    assert swapped


@pytest.mark.parametrize("engine", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_shard_replaced_after_the_plan_is_named(tmp_path, corpus, monkeypatch, engine, request):
    import raypack.pack.job as job

    if engine == "ray":
        request.getfixturevalue("ray_session")
    changed = corpus / "s0.parquet"
    planned = job.make_plan
    monkeypatch.setattr(job, "make_plan", lambda *a, **k: (planned(*a, **k), write_shard(changed, seed=99))[0])
    with pytest.raises(InputError, match=rf"^shard {re.escape(str(changed))} changed during the run \(.*\), so its "
                                         "tasks would mix two versions of it"):
        run_pack(config(tmp_path, corpus), engine=engine)


def test_an_unchanged_corpus_packs_as_before(tmp_path, corpus):
    """The check changes nothing in an output: the same files as a run in one task per shard."""
    run_pack(config(tmp_path, corpus), engine="local")
    whole = make_config(dict(inputs=[str(corpus)], output=str(tmp_path / "whole"), context_length=16, pad_token=0,
                             num_workers=1, read_batch_size=3))
    run_pack(whole, engine="local")
    out, whole = (json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("out", "whole"))
    assert out["content_sha256"] == whole["content_sha256"]
