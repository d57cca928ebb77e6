"""pack --tokenizer in one pass (raypack.tokenize.onepass): no tokenized Parquet written, the same
bytes as tokenize + pack (chunk files, content_sha256, manifest apart from naming the text), on
the local engine and on Ray with any number of workers; --resume keeps finished tasks without
tokenizing them again."""

from __future__ import annotations

import glob
import json
import os

import pytest
from test_tokenize_job import digests, options, text_dir, tok, tokenize  # noqa: F401 - fixtures

import raypack.tokenize.onepass as onepass
import raypack.tokenize.tasks as text_tasks
from raypack.cli import main
from raypack.pack.config import make_config
from raypack.pack.job import run_pack

STAGING = ".out.raypack-staging-partial"


def two_step_as_one(two: dict, text_inputs: list[str]) -> dict:
    """What the one-pass manifest must be, written independently from the two-step one: the same,
    but each shard row names its text range (the parts are gone) and the config its text inputs."""
    rows = []
    for row in two["shards"]:
        source = row["source"]
        rest = {k: v for k, v in row.items() if k not in ("path", "format", "source")}
        rows.append({"path": source["path"], "format": "text",
                     "text": {k: source[k] for k in ("format", "start", "end")}, **rest})
    return {**two, "shards": rows, "config": {**two["config"], "inputs": text_inputs}}


def manifest(out) -> dict:
    return json.load(open(os.path.join(out, "manifest.json")))


CASES = [
    pytest.param(dict(strategy="concat"), dict(task_rows=40, task_bytes=3000), id="concat"),
    pytest.param(dict(strategy="concat"), dict(task_rows=16, task_bytes=700, batch_bytes=64), id="concat-small-tasks"),
    pytest.param(dict(strategy="best_fit", best_fit_window=16), dict(task_rows=40, task_bytes=3000), id="best_fit"),
    pytest.param(dict(strategy="best_fit", best_fit_max_segments=2), dict(task_rows=16, task_bytes=900),
                 id="best_fit-max-segments"),
    pytest.param(dict(strategy="concat", long_docs="truncate"), dict(task_rows=40, task_bytes=3000), id="truncate"),
    pytest.param(dict(strategy="best_fit", long_docs="drop", best_fit_window=8), dict(task_rows=32, task_bytes=2000),
                 id="best_fit-drop"),
]


def pack_both(tmp_path, text_dir, tok, pack_kw, text_kw, engine="local", workers=2, name="one"):  # noqa: F811
    tokenized = tokenize(tmp_path, text_dir, tok, name=f"tok-{name}", eos="<eos>", **text_kw)
    common = dict(context_length=32, pad_token=0, **pack_kw)
    two = run_pack(make_config(dict(inputs=[tokenized], output=str(tmp_path / f"two-{name}"), **common)),
                   engine="local")
    one = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / name), num_workers=workers, **common)),
                   engine=engine, text=options(tok, eos="<eos>", **text_kw))
    return one, two


@pytest.mark.parametrize("pack_kw, text_kw", CASES)
def test_one_pass_equals_tokenize_then_pack(tmp_path, text_dir, tok, pack_kw, text_kw, monkeypatch):  # noqa: F811
    one, two = pack_both(tmp_path, text_dir, tok, pack_kw, text_kw)
    assert len(one.manifest["shards"]) > 3  # several tasks
    assert one.manifest["content_sha256"] == two.manifest["content_sha256"]
    assert digests(tmp_path / "one", "*.arrow") == digests(tmp_path / "two-one", "*.arrow")
    assert manifest(tmp_path / "one") == two_step_as_one(manifest(tmp_path / "two-one"), [text_dir])
    assert sorted(os.listdir(tmp_path / "one")) == sorted(["manifest.json", *digests(tmp_path / "one", "*.arrow")])
    assert main(["verify", str(tmp_path / "one")]) == 0


def test_one_pass_writes_no_tokenized_parquet(tmp_path, text_dir, tok, monkeypatch):  # noqa: F811
    def refused(*args, **kwargs):
        raise AssertionError("a tokenized part was written")

    monkeypatch.setattr(text_tasks, "write_part", refused)
    summary = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), context_length=32)),
                       engine="local", text=options(tok))
    assert summary.manifest["counts"]["documents"] == 240


def tokenized_tasks(monkeypatch, fail_at: int | None = None) -> list[int]:
    """Record which text tasks are tokenized; raise while tokenizing task ``fail_at``."""
    done, real = [], onepass.tokenize_held

    def flaky(task, *args):
        if task.task_index == fail_at:
            raise RuntimeError(f"killed at text task {fail_at}")
        done.append(task.task_index)
        return real(task, *args)

    monkeypatch.setattr(onepass, "tokenize_held", flaky)
    return done


def fail_packing(monkeypatch, index: int) -> None:
    real = onepass.pack_documents

    def flaky(task, *args):
        if task.task_index == index:
            raise RuntimeError(f"killed while packing task {index}")
        return real(task, *args)

    monkeypatch.setattr(onepass, "pack_documents", flaky)


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("crash", ["tokenizing", "packing"])
def test_resume_keeps_finished_tasks_without_tokenizing_them(tmp_path, text_dir, tok, monkeypatch, strategy,  # noqa: F811
                                                             crash):
    kw = dict(context_length=32, strategy=strategy, best_fit_window=16)
    clean = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "clean"), **kw)), engine="local",
                     text=options(tok))
    num_tasks, k = len(clean.manifest["shards"]), 3
    config = make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), **kw))
    if crash == "tokenizing":
        tokenized_tasks(monkeypatch, fail_at=k)
    else:
        fail_packing(monkeypatch, k)
    with pytest.raises(RuntimeError, match="killed"):
        run_pack(config, engine="local", text=options(tok))
    assert not glob.glob(str(tmp_path / STAGING / "**" / "*.parquet"), recursive=True)
    monkeypatch.undo()
    done = tokenized_tasks(monkeypatch)
    summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert done == list(range(k, num_tasks))  # tasks 0..k-1 kept, not tokenized again
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]
    assert digests(tmp_path / "out", "*") == digests(tmp_path / "clean", "*")


def test_resume_keeps_recorded_tasks_after_a_gap(tmp_path, text_dir, tok, monkeypatch):  # noqa: F811
    """A finished task after an unfinished one (as Ray leaves them) is kept once its offsets check."""
    kw = dict(context_length=32, strategy="best_fit", best_fit_window=16)
    clean = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "clean"), **kw)), engine="local",
                     text=options(tok))
    last = len(clean.manifest["shards"]) - 1
    config = make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), **kw))
    tokenized_tasks(monkeypatch, fail_at=last)
    with pytest.raises(RuntimeError, match="killed"):
        run_pack(config, engine="local", text=options(tok))
    os.remove(tmp_path / STAGING / "_results" / "task-000001.json")
    monkeypatch.undo()
    done = tokenized_tasks(monkeypatch)
    summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert done == [1, last]
    assert digests(tmp_path / "out", "*") == digests(tmp_path / "clean", "*")
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]


def test_resume_tokenizes_again_when_the_tokenize_options_change(tmp_path, text_dir, tok, monkeypatch):  # noqa: F811
    config = make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), context_length=32))
    tokenized_tasks(monkeypatch, fail_at=4)
    with pytest.raises(RuntimeError, match="killed"):
        run_pack(config, engine="local", text=options(tok))
    monkeypatch.undo()
    done = tokenized_tasks(monkeypatch)
    summary = run_pack(config, engine="local", resume=True, text=options(tok, eos="<eos>"))
    assert done[:4] == [0, 1, 2, 3]  # another EOS: other ids, nothing kept
    clean = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "clean"), context_length=32)),
                     engine="local", text=options(tok, eos="<eos>"))
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]


@pytest.mark.parametrize("pack_kw, text_kw", [CASES[1], CASES[3], CASES[5]])
def test_ray_one_pass_equals_local_for_any_workers(ray_session, tmp_path, text_dir, tok, pack_kw, text_kw):  # noqa: F811
    one, two = pack_both(tmp_path, text_dir, tok, pack_kw, text_kw)
    for workers in (1, 2):
        ray, _ = pack_both(tmp_path, text_dir, tok, pack_kw, text_kw, engine="ray", workers=workers,
                           name=f"ray{workers}")
        assert digests(tmp_path / f"ray{workers}", "*.arrow") == digests(tmp_path / "one", "*.arrow")
        assert manifest(tmp_path / f"ray{workers}") == manifest(tmp_path / "one")
    assert one.manifest["content_sha256"] == two.manifest["content_sha256"]
