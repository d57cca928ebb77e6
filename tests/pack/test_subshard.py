"""Sub-shard tasks (issue 15): a large Parquet / Arrow IPC shard is packed as several tasks of
whole row groups / record batches, and the chunks are exactly those of the unsplit run."""

from __future__ import annotations

import glob
import os
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raypack.pack.job as job
from raypack.cli import main
from raypack.errors import InputError
from raypack.pack import packer as shard_pack
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.pack.plan import make_plan, split_units
from raypack.pack.publish import staging_dir

from helpers import file_digests, read_output
from reference import naive_pack


def random_docs(seed: int, num_docs: int, max_len: int = 30) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, rng.integers(0, max_len + 1)).tolist() for _ in range(num_docs)]


def write_parquet(path, docs: list[list[int]], group_rows: list[int]) -> str:
    """One Parquet file whose row groups hold ``group_rows`` documents each (in order)."""
    assert sum(group_rows) == len(docs)
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for rows in group_rows:
            writer.write_table(table.slice(start, rows), row_group_size=max(rows, 1))
            start += rows
    assert pq.ParquetFile(path).metadata.num_row_groups == len(group_rows)  # not vacuous
    return str(path)


def write_ipc(path, docs: list[list[int]], batch_rows: list[int]) -> str:
    """One Arrow IPC file whose record batches hold ``batch_rows`` documents each."""
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with pa.ipc.new_file(str(path), table.schema) as writer:
        start = 0
        for rows in batch_rows:
            writer.write_batch(table.slice(start, rows).combine_chunks().to_batches()[0] if rows else
                               pa.record_batch({"input_ids": pa.array([], pa.list_(pa.int32()))}))
            start += rows
    assert pa.ipc.open_file(str(path)).num_record_batches == len(batch_rows)
    return str(path)


def config(inputs, out, **overrides):
    values = dict(inputs=inputs, output=str(out), context_length=8, pad_token=0, read_batch_size=3,
                  chunks_per_record_batch=2)
    values.update(overrides)
    return make_config(values)


def chunks_of(out) -> tuple[np.ndarray, np.ndarray]:
    input_ids, doc_ids, _ = read_output(str(out))
    return input_ids, doc_ids


# ----------------------------------------------------------------------------- the rule


def test_split_units_literal():
    assert split_units([5, 5, 5, 5], 10).tolist() == [0, 2, 4]
    assert split_units([3, 9, 1, 1, 20], 10).tolist() == [0, 2, 5]
    assert split_units([5, 0, 5], 1).tolist() == [0, 1, 3]  # an empty unit joins the next task
    assert split_units([50], 10).tolist() == [0, 1]
    assert split_units([1, 1, 1], 100).tolist() == [0, 3]
    assert split_units([], 10).tolist() == [0]


@given(st.lists(st.integers(0, 50), max_size=30), st.integers(1, 120))
def test_split_units_follows_the_rule(unit_tokens, target):
    bounds = split_units(unit_tokens, target).tolist()
    assert bounds[0] == 0 and bounds[-1] == len(unit_tokens) and bounds == sorted(set(bounds))
    for start, end in zip(bounds[:-1], bounds[1:]):
        held = sum(unit_tokens[start:end])
        if end < len(unit_tokens):
            assert held >= target  # every task but the last holds the target ...
        assert end - start == 1 or sum(unit_tokens[start:end - 1]) < target  # ... and not one unit more


def test_tasks_of_a_footer_layout(tmp_path):
    """Row groups of 3, 1, 4, 2 documents of 5 tokens; task_tokens=10: tasks of units 0, 1..2, 3."""
    docs = [[k] * 5 for k in range(10)]
    before = write_parquet(tmp_path / "in" / "a.parquet", [[7]] * 3, [3])
    path = write_parquet(tmp_path / "in" / "b.parquet", docs, [3, 1, 4, 2])
    plan = make_plan(config([before, path], tmp_path / "out", task_tokens=10))
    assert len(plan.shards) == 2 and plan.shards[1].unit_tokens == (15, 5, 20, 10)
    got = [(t.task_index, t.shard_index, t.unit_start, t.unit_end, t.row_start, t.num_docs, t.num_tokens,
            t.doc_offset, t.token_offset, t.unit_first_row) for t in plan.tasks]
    assert got == [
        (0, 0, 0, -1, 0, 3, 3, 0, 0, 0),  # 3 tokens: one whole-shard task
        (1, 1, 0, 1, 0, 3, 15, 3, 3, 0),  # 15 >= 10
        (2, 1, 1, 3, 3, 5, 25, 6, 18, 3),  # 5 < 10, then 5 + 20
        (3, 1, 3, 4, 8, 2, 10, 11, 43, 8),  # what is left
    ]
    assert len(make_plan(config([path], tmp_path / "out", task_tokens=0)).tasks) == 1
    assert len(make_plan(config([path], tmp_path / "out", task_tokens=50)).tasks) == 1  # holds 50: not more
    assert len(make_plan(config([path], tmp_path / "out", task_tokens=1)).tasks) == 4
    assert len(make_plan(config([path], tmp_path / "out", task_tokens=10, strategy="best_fit")).tasks) == 1
    assert len(make_plan(config([path], tmp_path / "out", task_tokens=10, strategy="best_fit",
                                best_fit_window=4)).tasks) == 3  # rows 0, 4 and 8 start windows (not 3)


def test_jsonl_and_ipc_stream_shards_stay_whole(tmp_path):
    docs = random_docs(1, 40)
    (tmp_path / "in").mkdir()
    with open(tmp_path / "in" / "a.jsonl", "w") as f:
        f.writelines(f'{{"input_ids": {d}}}\n' for d in docs)
    table = pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))})
    with pa.ipc.new_stream(str(tmp_path / "in" / "b.arrow"), table.schema) as writer:
        for batch in table.to_batches(max_chunksize=5):
            writer.write_batch(batch)
    plan = make_plan(config([str(tmp_path / "in")], tmp_path / "out", task_tokens=1))
    assert [t.is_whole_shard for t in plan.tasks] == [True, True]


# ----------------------------------------------------------------------------- same chunks


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_one_shard_in_tasks_gives_the_unsplit_chunks(tmp_path, fmt):
    docs = random_docs(2, 300)
    units = [37, 1, 60, 0, 90, 52, 60] if fmt == "arrow" else [37, 1, 60, 90, 52, 60]
    write = write_ipc if fmt == "arrow" else write_parquet
    path = write(tmp_path / "in" / f"one.{fmt}", docs, units)
    tokens = sum(map(len, docs))
    split = config([path], tmp_path / "split", task_tokens=tokens // 8)
    plan = make_plan(split)
    assert len(plan.tasks) >= 4 and all(not t.is_whole_shard for t in plan.tasks)
    assert {t.token_offset % 8 for t in plan.tasks} != {0}  # not vacuous: task edges cut chunks
    run_pack(split, engine="local")
    run_pack(config([path], tmp_path / "whole", task_tokens=0), engine="local")
    whole, parts = chunks_of(tmp_path / "whole"), chunks_of(tmp_path / "split")
    np.testing.assert_array_equal(parts[0], whole[0])
    np.testing.assert_array_equal(parts[1], whole[1])
    expected_ids, expected_doc_ids = naive_pack(docs, 8, 0, np.int32)
    np.testing.assert_array_equal(parts[0], expected_ids)
    np.testing.assert_array_equal(parts[1], expected_doc_ids)
    assert len(glob.glob(str(tmp_path / "split" / "chunks-*"))) > len(glob.glob(str(tmp_path / "whole" / "chunks-*")))


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_long_documents_inside_split_tasks(tmp_path, strategy):
    """Row groups of documents longer than read_batch_tokens (fed to the packer in slices), and a
    task covers only its row groups: the split run gives the whole run's chunks."""
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, 1000, n).tolist() for n in (900, 3, 1500, 0, 700, 1200, 5, 800)]
    path = write_parquet(tmp_path / "in" / "long.parquet", docs, [2, 2, 2, 2])
    assert sum(len(d) > 64 for d in docs) >= 5  # not vacuous: documents longer than read_batch_tokens
    common = dict(read_batch_tokens=64, strategy=strategy, best_fit_window=2)
    split = config([path], tmp_path / "split", task_tokens=1200, **common)
    assert len(make_plan(split).tasks) >= 3
    run_pack(split, engine="local")
    run_pack(config([path], tmp_path / "whole", task_tokens=0, **common), engine="local")
    whole, parts = chunks_of(tmp_path / "whole"), chunks_of(tmp_path / "split")
    np.testing.assert_array_equal(parts[0], whole[0])
    np.testing.assert_array_equal(parts[1], whole[1])
    if strategy == "concat":
        np.testing.assert_array_equal(parts[0], naive_pack(docs, 8, 0, np.int32)[0])


def test_cli_local_splits_and_equals_the_unsplit_run(tmp_path, capsys):
    docs = random_docs(3, 200)
    path = write_parquet(tmp_path / "in" / "one.parquet", docs, [40] * 5)
    args = ["pack", "--input", path, "--context-length", "16", "--pad-token", "0", "--local"]
    assert main([*args, "--output", str(tmp_path / "split"), "--task-tokens", "500"]) == 0
    assert main([*args, "--output", str(tmp_path / "whole"), "--task-tokens", "0"]) == 0
    assert main([*args, "--output", str(tmp_path / "split-bf"), "--task-tokens", "500", "--strategy", "best_fit",
                 "--best-fit-window", "20"]) == 0
    assert main([*args, "--output", str(tmp_path / "whole-bf"), "--task-tokens", "0", "--strategy", "best_fit",
                 "--best-fit-window", "20"]) == 0
    assert len(glob.glob(str(tmp_path / "split-bf" / "chunks-*"))) > 1  # not vacuous: best_fit split too
    for name in ("split", "split-bf"):
        whole = chunks_of(tmp_path / name.replace("split", "whole"))
        np.testing.assert_array_equal(chunks_of(tmp_path / name)[0], whole[0])
        np.testing.assert_array_equal(chunks_of(tmp_path / name)[1], whole[1])
    assert main(["verify", str(tmp_path / "split")]) == 0 and main(["verify", str(tmp_path / "split-bf")]) == 0
    _, _, manifest = read_output(str(tmp_path / "split"))
    assert manifest["config"]["task_tokens"] == 500
    assert manifest["shards"] == read_output(str(tmp_path / "whole"))[2]["shards"]  # one row per shard, as before


def test_best_fit_tasks_start_only_on_window_boundaries(tmp_path):
    """Window 20, row groups of 20, 20, 13, 7, 20, 40 documents: tasks may start at rows 0, 20, 40,
    60, 80 (never 53); the chunks are those of the unsplit run."""
    docs = random_docs(8, 120, max_len=12)
    path = write_parquet(tmp_path / "in" / "one.parquet", docs, [20, 20, 13, 7, 20, 40])
    runs = {}
    for name, task_tokens, window in (("split", 1, 20), ("whole", 0, 20), ("split-0", 1, 0)):
        cfg = config([path], tmp_path / name, task_tokens=task_tokens, strategy="best_fit", best_fit_window=window)
        runs[name] = [t.row_start for t in make_plan(cfg).tasks]
        run_pack(cfg, engine="local")
    assert runs == {"split": [0, 20, 40, 60, 80], "whole": [0], "split-0": [0]}
    whole, split = chunks_of(tmp_path / "whole"), chunks_of(tmp_path / "split")
    assert (whole[1] == -1).sum() > 8  # not vacuous: best_fit padded inside the stream
    np.testing.assert_array_equal(split[0], whole[0])
    np.testing.assert_array_equal(split[1], whole[1])
    _, _, manifest = read_output(str(tmp_path / "split"))
    assert manifest["shards"] == read_output(str(tmp_path / "whole"))[2]["shards"]  # first_chunk, num_chunks too
    assert len(manifest["files"]) == 5


def test_ray_splits_and_equals_the_local_unsplit_run(tmp_path, ray_session):
    docs = random_docs(4, 240)
    path = write_parquet(tmp_path / "in" / "one.parquet", docs, [30] * 8)
    ipc = write_ipc(tmp_path / "in" / "two.arrow", docs[:100], [25] * 4)
    split = config([path, ipc], tmp_path / "split", task_tokens=600)
    assert len(make_plan(split).tasks) > 4
    run_pack(split, engine="ray")
    run_pack(config([path, ipc], tmp_path / "whole", task_tokens=0), engine="local")
    run_pack(config([path, ipc], tmp_path / "split-local", task_tokens=600), engine="local")
    whole, parts = chunks_of(tmp_path / "whole"), chunks_of(tmp_path / "split")
    np.testing.assert_array_equal(parts[0], whole[0])
    np.testing.assert_array_equal(parts[1], whole[1])
    assert file_digests(str(tmp_path / "split")) == file_digests(str(tmp_path / "split-local"))
    best_fit = dict(strategy="best_fit", best_fit_window=30)  # row groups of 30 and 25: windows at 0, 30, ...
    run_pack(config([path, ipc], tmp_path / "bf-split", task_tokens=600, **best_fit), engine="ray")
    run_pack(config([path, ipc], tmp_path / "bf-whole", task_tokens=0, **best_fit), engine="local")
    assert len(glob.glob(str(tmp_path / "bf-split" / "chunks-*"))) > 3
    whole, parts = chunks_of(tmp_path / "bf-whole"), chunks_of(tmp_path / "bf-split")
    np.testing.assert_array_equal(parts[0], whole[0])
    np.testing.assert_array_equal(parts[1], whole[1])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_row_groups_and_target_match_the_naive_reference(tmp_path_factory, data):
    group_rows = data.draw(st.lists(st.integers(1, 12), min_size=1, max_size=8), label="group_rows")
    docs = random_docs(data.draw(st.integers(0, 1000), label="seed"), sum(group_rows), max_len=15)
    target = data.draw(st.integers(1, 80), label="task_tokens")
    c = data.draw(st.integers(1, 12), label="C")
    root = tmp_path_factory.mktemp("hyp")
    path = write_parquet(root / "in" / "one.parquet", docs, group_rows)
    cfg = config([path], root / "out", task_tokens=target, context_length=c)
    run_pack(cfg, engine="local")
    input_ids, doc_ids = chunks_of(root / "out")
    expected_ids, expected_doc_ids = naive_pack(docs, c, 0, np.int32)
    np.testing.assert_array_equal(input_ids, expected_ids.reshape(-1, c))
    np.testing.assert_array_equal(doc_ids, expected_doc_ids.reshape(-1, c))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_best_fit_split_equals_whole_for_any_row_groups_and_window(tmp_path_factory, data):
    group_rows = data.draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=2, max_size=8), label="group_rows")
    docs = random_docs(data.draw(st.integers(0, 1000), label="seed"), sum(group_rows), max_len=15)
    window = data.draw(st.integers(0, 8), label="window")
    target = data.draw(st.integers(1, 60), label="task_tokens")
    root = tmp_path_factory.mktemp("hyp-bf")
    path = write_parquet(root / "in" / "one.parquet", docs, group_rows)
    out = {}
    for name, task_tokens in (("split", target), ("whole", 0)):
        cfg = config([path], root / name, task_tokens=task_tokens, strategy="best_fit", best_fit_window=window,
                     context_length=10)
        run_pack(cfg, engine="local")
        out[name] = chunks_of(root / name)
    np.testing.assert_array_equal(out["split"][0], out["whole"][0])
    np.testing.assert_array_equal(out["split"][1], out["whole"][1])


# ----------------------------------------------------------------------------- resume and changes


def fail_at_task(monkeypatch, index: int) -> list[int]:
    """The local packer raises on task ``index`` (-1: never); returns the tasks packed."""
    packed, real = [], shard_pack.pack_shard

    def flaky(task, settings, stop=None, committer=None):
        if task.task_index == index:
            raise RuntimeError("crash")
        packed.append(task.task_index)
        return real(task, settings, stop, committer)

    monkeypatch.setattr(job, "pack_shard", flaky)
    return packed


def test_resume_keeps_finished_tasks_and_gives_the_clean_bytes(tmp_path, monkeypatch):
    docs = random_docs(5, 300)
    path = write_parquet(tmp_path / "in" / "one.parquet", docs, [50] * 6)
    cfg = config([path], tmp_path / "out", task_tokens=700, num_workers=1)  # one packer: the tasks packed are known
    num_tasks = len(make_plan(cfg).tasks)
    assert num_tasks >= 4
    fail_at_task(monkeypatch, 2)
    with pytest.raises(RuntimeError, match="crash"):
        run_pack(cfg, engine="local")
    monkeypatch.undo()
    records = sorted(os.listdir(os.path.join(staging_dir(cfg.output), "_results")))
    assert records == ["task-000000.json", "task-000001.json"]
    packed = fail_at_task(monkeypatch, -1)
    run_pack(cfg, engine="local", resume=True)
    monkeypatch.undo()
    assert packed == list(range(2, num_tasks))
    run_pack(config([path], tmp_path / "clean", task_tokens=700), engine="local")
    assert file_digests(cfg.output) == file_digests(str(tmp_path / "clean"))


@pytest.mark.parametrize("change", ["row groups", "task_tokens"])
def test_resume_after_the_split_changed_gives_a_clean_runs_bytes(tmp_path, monkeypatch, change):
    """The file rewritten with other row groups (same documents), or another target: the old
    tasks' records do not match, their chunk files are swept, the output is a clean run's."""
    docs = random_docs(6, 300)
    path = write_parquet(tmp_path / "in" / "one.parquet", docs, [50] * 6)
    cfg = config([path], tmp_path / "out", task_tokens=700)
    fail_at_task(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="crash"):
        run_pack(cfg, engine="local")
    monkeypatch.undo()
    old_files = set(os.listdir(staging_dir(cfg.output)))
    if change == "row groups":
        write_parquet(path, docs, [20, 80, 10, 90, 100])
    else:
        cfg = config([path], tmp_path / "out", task_tokens=1100)
    packed = fail_at_task(monkeypatch, -1)
    run_pack(cfg, engine="local", resume=True)
    monkeypatch.undo()
    assert packed == list(range(len(make_plan(cfg).tasks)))  # nothing was kept: every task changed
    clean = config([path], tmp_path / "clean", task_tokens=cfg.task_tokens)
    run_pack(clean, engine="local")
    assert sorted(os.listdir(cfg.output)) == sorted(os.listdir(clean.output))
    assert file_digests(cfg.output) == file_digests(clean.output)
    assert old_files - set(os.listdir(cfg.output)), "not vacuous: the crashed run's files were swept"


def test_a_file_that_loses_row_groups_during_the_run_is_one_line(tmp_path, monkeypatch):
    docs = random_docs(7, 120)
    path = write_parquet(tmp_path / "in" / "one.parquet", docs, [30] * 4)
    cfg = config([path], tmp_path / "out", task_tokens=300)
    plan = make_plan(cfg)
    assert plan.tasks[-1].unit_end == 4
    write_parquet(path, docs, [30, 30, 60])  # the same rows for the first three tasks
    monkeypatch.setattr(job, "make_plan", lambda config: plan)
    with pytest.raises(InputError, match=r"one.parquet changed during the run \(8,\d+ bytes when the run listed its "
                                         r"inputs, 8,\d+ now\)"):
        run_pack(cfg, engine="local")
    # without the plan's mark of the file, the reader's own check of its row groups still says it
    unmarked = replace(plan, tasks=tuple(replace(t, planned="") for t in plan.tasks))
    monkeypatch.setattr(job, "make_plan", lambda config: unmarked)
    with pytest.raises(InputError, match=r"one.parquet has 3 row groups, the plan reads 3\.\.3; the file changed"):
        run_pack(cfg, engine="local")


def test_progress_counts_tasks_when_a_shard_is_split(tmp_path, caplog):
    docs = random_docs(9, 120)
    path = write_parquet(tmp_path / "in" / "one.parquet", docs, [30] * 4)
    num_tasks = len(make_plan(config([path], tmp_path / "out", task_tokens=300)).tasks)
    assert num_tasks > 1
    with caplog.at_level("INFO", logger="raypack.io.progress"):
        run_pack(config([path], tmp_path / "out", task_tokens=300), engine="local")
        run_pack(config([path], tmp_path / "whole", task_tokens=0), engine="local")
    lines = [r.getMessage() for r in caplog.records if r.name == "raypack.io.progress"]
    assert lines[-2].startswith(f"packed {num_tasks}/{num_tasks} tasks (1 shard), ")
    assert lines[-1].startswith("packed 1/1 shards, ")
