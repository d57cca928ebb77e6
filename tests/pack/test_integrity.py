"""Nothing stale, nothing foreign (issue 12): a resumed output holds exactly what its manifest
lists whatever changed since the crash; one writer per output; a publish that dies half way
is finished by the next run."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raypack.pack.job as job
import raypack.pack.outputs.directory as directory
import raypack.pack.publish as publish
from raypack.errors import InputError
from raypack.io.lock import LocalLock
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.pack.publish import staging_dir
from raypack.sample import write_sample_corpus
from raypack.verify import verify_output

from helpers import file_digests, tree_digest
from packing_faults import fail_at_call, fail_at_shard


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    write_sample_corpus(str(root), num_shards=6, docs_per_shard=40, mean_doc_len=20, seed=3)
    return root


def config(tmp_path, inputs, name="out", **overrides):
    values = dict(inputs=[str(i) for i in inputs], output=str(tmp_path / name), context_length=16, pad_token=0,
                  read_batch_size=7, chunks_per_record_batch=4)
    values.update(overrides)
    return make_config(values)


def shards(corpus) -> list:
    return sorted(p for p in corpus.iterdir() if p.suffix == ".parquet")


def crash_at(monkeypatch, tmp_path, inputs, shard, **overrides):
    fail_at_shard(monkeypatch, shard, RuntimeError("crash"))
    with pytest.raises(RuntimeError, match="crash"):
        run_pack(config(tmp_path, inputs, **overrides), engine="local")
    monkeypatch.undo()
    assert os.path.isdir(staging_dir(str(tmp_path / "out")))


def append_rows(path, num_rows: int) -> None:
    table = pq.read_table(path)
    pq.write_table(pa.concat_tables([table, table.slice(0, num_rows)]), path)


def assert_exactly_the_manifest(out) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(os.listdir(out)) == sorted([f["path"] for f in manifest["files"]] + ["manifest.json"])
    verify_output(str(out))
    return manifest


# ----------------------------------------------------------------------------- 1: resume after a change


def change_append(corpus, tmp_path):
    append_rows(shards(corpus)[0], 10)
    return [corpus], {}


def change_delete(corpus, tmp_path):
    os.remove(shards(corpus)[1])
    return [corpus], {}


def change_context_length(corpus, tmp_path):
    return [corpus], {"context_length": 12}


def change_input_set(corpus, tmp_path):
    return shards(corpus)[2:], {}


@pytest.mark.parametrize("change", [change_append, change_delete, change_context_length, change_input_set])
def test_resume_after_any_change_equals_a_clean_run_on_the_new_inputs(tmp_path, corpus, monkeypatch, change):
    crash_at(monkeypatch, tmp_path, [corpus], 4)
    inputs, overrides = change(corpus, tmp_path)
    run_pack(config(tmp_path, inputs, **overrides), engine="local", resume=True)
    out = tmp_path / "out"
    assert_exactly_the_manifest(out)
    run_pack(config(tmp_path, inputs, "clean", **overrides), engine="local")
    assert tree_digest(out) == tree_digest(tmp_path / "clean")


def test_a_crash_leaves_files_a_resume_on_changed_inputs_must_drop(tmp_path, corpus, monkeypatch):
    """Guards the test above: the crash really leaves chunk files the new layout does not use."""
    crash_at(monkeypatch, tmp_path, [corpus], 4)
    staged = {n for n in os.listdir(staging_dir(str(tmp_path / "out"))) if n.startswith("chunks-")}
    append_rows(shards(corpus)[0], 10)
    run_pack(config(tmp_path, [corpus], "clean"), engine="local")
    assert staged - set(os.listdir(tmp_path / "clean"))


def test_bad_input_in_a_resume_keeps_the_finished_tasks(tmp_path, corpus, monkeypatch):
    """A file added before the resume is not Parquet: one line, saying the earlier runs' tasks are kept
    (they were deleted with the staging directory, and the next resume did them again); once it is gone,
    the resume keeps them and equals a clean run."""
    crash_at(monkeypatch, tmp_path, [corpus], 4)
    staging = staging_dir(str(tmp_path / "out"))
    records = sorted(os.listdir(os.path.join(staging, "_results")))
    assert records
    (corpus / "zz.parquet").write_bytes(b"not a Parquet file at all")
    with pytest.raises(InputError, match=rf"zz\.parquet.*; the finished tasks are kept in "
                                         rf"{re.escape(staging)}: rerun with --resume once it is fixed$"):
        run_pack(config(tmp_path, [corpus]), engine="local", resume=True)
    assert sorted(os.listdir(os.path.join(staging, "_results"))) == records
    (corpus / "zz.parquet").unlink()
    summary = run_pack(config(tmp_path, [corpus]), engine="local", resume=True)
    assert summary.kept[0] == len(records)
    run_pack(config(tmp_path, [corpus], "clean"), engine="local")
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "clean")


def one_pass_crashed_at_its_third_task(tmp_path, monkeypatch):
    """Four text files packed in one pass (``pack --tokenizer``, local), the run crashed as its third task
    was packed: two tasks' records kept. Its (config, text options) for the resume."""
    import raypack.tokenize.onepass as onepass
    from raypack.tokenize.job import TextOptions

    (tmp_path / "text").mkdir()
    for k in range(4):
        pq.write_table(pa.table({"text": [f"text {k} {i} " * (i % 5) for i in range(40)]}),
                       tmp_path / "text" / f"t{k}.parquet")
    settings = make_config(dict(inputs=[str(tmp_path / "text")], output=str(tmp_path / "out"), context_length=16))
    options = TextOptions(tokenizer="tiktoken:cl100k_base")
    fail_at_call(monkeypatch, onepass, "pack_held", 3, RuntimeError("crash"))
    with pytest.raises(RuntimeError, match="crash"):
        run_pack(settings, engine="local", text=options)
    monkeypatch.undo()
    return settings, options


def test_bad_input_in_a_one_pass_resume_keeps_the_finished_tasks(tmp_path, monkeypatch):
    """The same for ``pack --tokenizer``, whose tasks are planned as they are tokenized: the bad file is met
    inside the run, where the staging directory was deleted with the earlier runs' tasks."""
    settings, options = one_pass_crashed_at_its_third_task(tmp_path, monkeypatch)
    staging = staging_dir(str(tmp_path / "out"))
    records = sorted(os.listdir(os.path.join(staging, "_results")))
    assert len(records) == 2
    (tmp_path / "text" / "t9.parquet").write_bytes(b"not a Parquet file at all")
    with pytest.raises(InputError, match=r"t9\.parquet.*; the finished tasks are kept in "):
        run_pack(settings, engine="local", text=options, resume=True)
    assert sorted(os.listdir(os.path.join(staging, "_results"))) == records
    (tmp_path / "text" / "t9.parquet").unlink()
    assert run_pack(settings, engine="local", text=options, resume=True).kept[0] == 2


def test_ctrl_c_before_a_resume_takes_its_output_still_names_the_kept_work(tmp_path, corpus, monkeypatch, capsys):
    """Ctrl-C while Ray starts, in a --resume: the line named no kept work ("nothing was written") though the
    runs before's tasks wait in the staging directory; it names them and the command to run."""
    from raypack.cli import main

    crash_at(monkeypatch, tmp_path, [corpus], 4)

    def ctrl_c_in_rays_start(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "connect_ray", ctrl_c_in_rays_start)
    args = ["pack", "--input", str(corpus), "--output", str(tmp_path / "out"), "--context-length", "16", "--resume"]
    assert main(args) == 130
    staging = staging_dir(str(tmp_path / "out"))
    assert capsys.readouterr().err == (f"raypack: interrupted; the finished work is kept in {staging}; finish with: "
                                       f"raypack {shlex.join(args)}\n")
    assert main([*args[:4], str(tmp_path / "elsewhere"), *args[5:-1]]) == 130  # a fresh run: nothing kept
    assert capsys.readouterr().err == "raypack: interrupted; nothing was written\n"
    assert main(["verify", str(tmp_path / "out")]) == 2  # it said "no such output directory"
    assert capsys.readouterr().err == (f"raypack: error: {tmp_path / 'out'}: no output here yet: an unfinished "
                                       f"run's work is in {staging}; finish it with the run's own command and "
                                       "--resume, then verify\n")
    assert main(["stats", str(tmp_path / "out")]) == 2  # it said "no such output directory" too
    assert capsys.readouterr().err.endswith("--resume, then run stats\n")


@pytest.mark.parametrize("engine", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_file_changed_during_a_run_keeps_the_other_files_finished_tasks(tmp_path, monkeypatch, engine):
    """One input changed while the run read it (an operator's trial: a file appended to 6 s into a 12-shard run)
    is not bad data: the run stops with its one line, and the tasks finished from the other files are kept for
    --resume (they were deleted with the staging directory, as for bad input), on either engine."""
    import raypack.tokenize.tasks as tasks
    from raypack.tokenize.job import TextOptions

    (tmp_path / "text").mkdir()
    for k in range(4):
        pq.write_table(pa.table({"text": [f"text {k} {i} " * (i % 5) for i in range(40)]}),
                       tmp_path / "text" / f"t{k}.parquet")
    settings = make_config(dict(inputs=[str(tmp_path / "text")], output=str(tmp_path / "out"), context_length=16,
                                num_workers=1))
    options = TextOptions(tokenizer="tiktoken:cl100k_base")
    changed = tmp_path / "text" / "t3.parquet"
    real = tasks.check_planned

    def append_first(task, identity):  # t3 appended to once t0-t2 are packed, as its task starts
        if task.path == str(changed) and pq.read_metadata(changed).num_rows == 40:
            append_rows(changed, 5)
            identity = tasks.sampled_identity(task.path, task.format)
        return real(task, identity)

    monkeypatch.setattr(tasks, "check_planned", append_first)
    if engine == "ray":  # the actors import the module anew: the file is changed before the run instead
        monkeypatch.undo()
        import raypack.tokenize.job as job

        planned = job.plan_text_tasks
        monkeypatch.setattr(job, "plan_text_tasks", lambda *a, **k: (planned(*a, **k), append_rows(changed, 5))[0])
    staging = staging_dir(str(tmp_path / "out"))
    with pytest.raises(InputError, match=rf"text file {re.escape(str(changed))} changed during the run \(.*; the "
                                         rf"finished tasks are kept in {re.escape(staging)}: rerun with --resume "
                                         "once it is fixed$"):
        run_pack(settings, engine=engine, text=options)
    monkeypatch.undo()
    assert os.listdir(os.path.join(staging, "_results"))
    summary = run_pack(settings, engine="local", text=options, resume=True)
    assert summary.kept[0] >= 1
    run_pack(make_config(dict(inputs=[str(tmp_path / "text")], output=str(tmp_path / "clean"), context_length=16)),
             engine="local", text=options)
    assert file_digests(str(tmp_path / "out")) == file_digests(str(tmp_path / "clean"))


def test_a_kept_task_whose_input_was_modified_since_is_named_once(tmp_path, corpus, monkeypatch, caplog):
    """An input modified after its task was recorded, with its size and edges the same (a same-size edit in its
    middle, which the sampled identity cannot see; an operator's trial): the task is kept, as before, and one
    WARNING names the file and the way to start over. Files not touched since are not named."""
    import logging

    crash_at(monkeypatch, tmp_path, [corpus], 4)
    touched = shards(corpus)[1]
    later = os.stat(touched).st_mtime + 3600
    os.utime(touched, (later, later))
    with caplog.at_level(logging.INFO, logger="raypack"):
        summary = run_pack(config(tmp_path, [corpus]), engine="local", resume=True)
    assert summary.kept[0] == 4
    said = [r for r in caplog.records if "was modified after" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in said] == [(
        "WARNING", f"resume: {touched} was modified after its finished task was recorded; its size and first and "
        "last MiB are the same, so the task is kept. If its content changed, start over with --overwrite (or pass "
        "--verify-inputs to the run and its --resume, which compares every byte)")]


def test_a_one_pass_resume_says_a_file_changed_where_an_edit_kept_its_size(tmp_path, monkeypatch, caplog):
    """A JSON Lines file edited at its start with its size kept (its lines reordered): its tasks split at other
    bytes, and the resume's reason named "another split of the text into tasks" (an operator's trial); it
    names the file as changed. The output equals a clean run's."""
    import logging

    import raypack.tokenize.onepass as onepass
    from raypack.tokenize.job import TextOptions

    (tmp_path / "text").mkdir()
    lines = [json.dumps({"text": f"line {i} " + "x" * (i * 7 % 23)}) + "\n" for i in range(60)]
    path = tmp_path / "text" / "t0.jsonl"
    path.write_text("".join(lines))
    settings = make_config(dict(inputs=[str(tmp_path / "text")], output=str(tmp_path / "out"), context_length=16))
    options = TextOptions(tokenizer="tiktoken:cl100k_base", task_bytes=400)
    fail_at_call(monkeypatch, onepass, "pack_held", 3, RuntimeError("crash"))
    with pytest.raises(RuntimeError, match="crash"):
        run_pack(settings, engine="local", text=options)
    monkeypatch.undo()
    size = path.stat().st_size
    path.write_text("".join(reversed(lines)))
    assert path.stat().st_size == size
    with caplog.at_level(logging.INFO, logger="raypack"):
        run_pack(settings, engine="local", text=options, resume=True)
    said = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert said and f"{path} changed (its first or last MiB differs)" in said[0], said
    assert not [m for m in said if "another split" in m], said
    run_pack(make_config(dict(inputs=[str(tmp_path / "text")], output=str(tmp_path / "clean"), context_length=16)),
             engine="local", text=options)
    assert file_digests(tmp_path / "out") == file_digests(tmp_path / "clean") != {}


def test_a_one_pass_resume_says_a_file_changed_where_its_size_did(tmp_path, monkeypatch, caplog):
    """Rows appended to a file whose task finished: the resume's reason names the file as changed (it said
    only "another split of the text into tasks"), and the output equals a clean run's."""
    import logging

    settings, options = one_pass_crashed_at_its_third_task(tmp_path, monkeypatch)
    append_rows(tmp_path / "text" / "t0.parquet", 5)
    with caplog.at_level(logging.INFO, logger="raypack"):
        summary = run_pack(settings, engine="local", text=options, resume=True)
    said = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert len(said) == 2 and f"{tmp_path / 'text' / 't0.parquet'} changed (its size differs)" in said[0], said
    assert summary.kept[0] == 0  # t1's chunks moved with t0's new rows (global doc ids and chunk starts)
    # t1's record holds: its line says why it is redone all the same (it said "its record was made for
    # another task or other settings", a line per task)
    assert said[1].startswith(f"resume: text task 1 ({tmp_path / 'text' / 't1.parquet'}) and those after it whose "
                              "documents moved are tokenized again: its documents now start at doc "), said
    assert not [r for r in caplog.records if "another task or other settings" in r.getMessage()]
    run_pack(make_config(dict(inputs=[str(tmp_path / "text")], output=str(tmp_path / "clean"), context_length=16)),
             engine="local", text=options)
    assert file_digests(str(tmp_path / "out")) == file_digests(str(tmp_path / "clean"))


# ----------------------------------------------------------------------------- 4: one writer per output


def test_a_second_run_on_the_same_output_is_refused_while_the_first_plans(tmp_path, corpus, monkeypatch):
    planning, release = threading.Event(), threading.Event()
    real_plan = job.make_plan

    def slow_plan(cfg):
        planning.set()
        release.wait(30)
        return real_plan(cfg)

    monkeypatch.setattr(job, "make_plan", slow_plan)
    first = threading.Thread(target=run_pack, args=(config(tmp_path, [corpus]),), kwargs={"engine": "local"})
    first.start()
    try:
        assert planning.wait(30)
        for flags in ({}, {"overwrite": True}):
            with pytest.raises(InputError, match=rf"being written by another raypack run \(pid {os.getpid()} on "):
                run_pack(config(tmp_path, [corpus], **flags), engine="local")
        with pytest.raises(InputError, match="being written by another raypack run"):
            run_pack(config(tmp_path, [corpus]), engine="local", resume=True)
    finally:
        release.set()
        first.join(60)
    assert_exactly_the_manifest(tmp_path / "out")
    assert not os.path.exists(tmp_path / ".out.raypack-lock")


HOLD_LOCK = """
import sys, time
from raypack.io.lock import LocalLock
LocalLock(sys.argv[1], what="output").acquire()
print("locked", flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def lock_held_by_another_process(lock_path: str):
    """A live process holding ``lock_path`` (its pid yielded); SIGKILLed on exit."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, lock_path], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_lock_held_by_a_live_process_refuses_and_a_killed_one_does_not(tmp_path, corpus):
    lock_path = str(tmp_path / ".out.raypack-lock")
    with lock_held_by_another_process(lock_path) as pid:
        with pytest.raises(InputError, match=rf"pid {pid} on "):
            run_pack(config(tmp_path, [corpus]), engine="local")
    assert os.path.exists(lock_path)  # the file stays; the kernel dropped the lock
    run_pack(config(tmp_path, [corpus]), engine="local")
    assert_exactly_the_manifest(tmp_path / "out")


def test_a_ray_run_on_an_output_another_run_holds_is_refused_before_ray_starts(tmp_path, corpus, monkeypatch):
    """It started Ray (seconds, and a "Ray's logs are in" line) and only then met the lock."""
    lock_path = str(tmp_path / ".out.raypack-lock")
    monkeypatch.setattr(job, "connect_ray", lambda *a, **k: pytest.fail("Ray was started"))
    with lock_held_by_another_process(lock_path) as pid:
        with pytest.raises(InputError, match=rf"being written by another raypack run \(pid {pid} on "):
            run_pack(config(tmp_path, [corpus]), engine="ray")
    lock = LocalLock(lock_path, what="output")
    lock.check_free()  # its holder is gone
    lock.acquire()
    lock.release()


def test_the_lock_is_not_taken_on_a_file_its_owner_just_removed(tmp_path):
    path = str(tmp_path / "lock")
    a = LocalLock(path, what="output")
    a.acquire()
    b = LocalLock(path, what="output")
    with pytest.raises(InputError):
        b.acquire()
    a.release()
    b.acquire()
    c = LocalLock(path, what="output")
    with pytest.raises(InputError):
        c.acquire()
    b.release()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_lock_is_taken_leaves_no_lock_file(tmp_path, monkeypatch, signum):
    """Ctrl-C (or SIGTERM) just as the lock file is made: the file was left behind, after a line saying
    nothing was written (a new user's trial, 2 of 5 tries). Now the signal comes once the lock is given back."""
    import raypack.io.lock as lock

    class Stop(BaseException):
        pass

    def stop(number, frame):
        raise Stop

    previous = signal.signal(signal.SIGTERM, stop)
    # SIGINT as a shell gives it: a test before this one in the same worker may have left another handler
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    real = lock.LocalLock._flock

    def flock_then_signal(self, fd):
        signal.raise_signal(signum)  # delivered at once, unless held off
        return real(self, fd)

    monkeypatch.setattr(lock.LocalLock, "_flock", flock_then_signal)
    path = tmp_path / ".out.raypack-lock"
    try:
        with pytest.raises(KeyboardInterrupt if signum == signal.SIGINT else Stop):
            LocalLock(str(path), what="output").acquire()
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    assert not path.exists()
    monkeypatch.setattr(lock.LocalLock, "_flock", real)
    again = LocalLock(str(path), what="output")
    again.acquire()  # not held by anyone
    again.release()


@pytest.mark.parametrize("error", ["EROFS", "EACCES", "ENOSPC", "ENOENT"])
@pytest.mark.parametrize("command", ["pack", "tokenize", "export"])
def test_an_output_where_this_user_cannot_write_is_one_line(tmp_path, corpus, monkeypatch, capsys, error, command):
    """A read-only filesystem, a directory without write permission (root ignores chmod, so the
    error is injected where the first file is made: the lock), a full disk: one line naming the
    directory, exit 2 (it was a traceback, exit 1), nothing written."""
    import errno

    import raypack.io.lock as lock
    from raypack.cli import main

    real_open = os.open

    def refuse(path, *args, **kwargs):
        if str(path).endswith(".raypack-lock"):
            raise OSError(getattr(errno, error), os.strerror(getattr(errno, error)), path)
        return real_open(path, *args, **kwargs)

    if command == "export":
        run_pack(config(tmp_path, [corpus]), engine="local")
        args = ["export", str(tmp_path / "out"), "--format", "mds", "--output", str(tmp_path / "o")]
    elif command == "tokenize":
        pq.write_table(pa.table({"text": ["some text"]}), tmp_path / "t.parquet")
        args = ["tokenize", "--local", "--input", str(tmp_path / "t.parquet"), "--tokenizer", "tiktoken:cl100k_base",
                "--output", str(tmp_path / "o")]
    else:
        args = ["pack", "--local", "--input", str(corpus), "--context-length", "8", "--output", str(tmp_path / "o")]
    before = sorted(os.listdir(tmp_path))
    monkeypatch.setattr(lock.os, "open", refuse)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = f"output {tmp_path / 'o'}: cannot write in {tmp_path} ({os.strerror(getattr(errno, error))})"
    assert len(err) == 1 and said in err[0], err
    assert sorted(os.listdir(tmp_path)) == before


# ----------------------------------------------------------------------------- 7: publish


def test_overwrite_publishes_with_one_exchange(tmp_path, corpus, monkeypatch):
    run_pack(config(tmp_path, [corpus]), engine="local")
    calls, real = [], directory.exchange_paths

    def exchange(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(directory, "exchange_paths", exchange)
    run_pack(config(tmp_path, [corpus], context_length=12, overwrite=True), engine="local")
    assert calls == [(staging_dir(str(tmp_path / "out")), str(tmp_path / "out"))]
    assert_exactly_the_manifest(tmp_path / "out")["context_length"] == 12
    assert sorted(os.listdir(tmp_path)) == ["corpus", "out"]


def test_exchange_swaps_two_directories(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    if not directory.exchange_paths(str(tmp_path / "a"), str(tmp_path / "b")):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    assert os.listdir(tmp_path / "b") == ["x"] and os.listdir(tmp_path / "a") == []


def test_overwrite_without_exchange_falls_back_to_two_renames(tmp_path, corpus, monkeypatch):
    run_pack(config(tmp_path, [corpus]), engine="local")
    monkeypatch.setattr(directory, "exchange_paths", lambda a, b: False)
    run_pack(config(tmp_path, [corpus], context_length=12, overwrite=True), engine="local")
    assert_exactly_the_manifest(tmp_path / "out")["context_length"] == 12
    assert sorted(os.listdir(tmp_path)) == ["corpus", "out"]


def die_in_publish(monkeypatch, after: str, error: BaseException | None = None) -> type[BaseException]:
    """Make the publish stop dead right after ``after`` ("exchange" or "first rename"), just before its
    exchange, its records removed ("before the exchange"), or just before the publish ("before the
    rename"), raising ``error`` (default: a BaseException of its own); its type."""
    class Died(BaseException):
        pass

    raised = Died() if error is None else error
    if after == "before the rename":
        def publish_then_die(self):
            raise raised

        monkeypatch.setattr(directory.LocalOutput, "publish", publish_then_die)
    elif after in ("exchange", "before the exchange"):
        real = directory.exchange_paths

        def exchange_then_die(a, b):
            assert after == "before the exchange" or real(a, b)
            raise raised

        monkeypatch.setattr(directory, "exchange_paths", exchange_then_die)
    else:
        monkeypatch.setattr(directory, "exchange_paths", lambda a, b: False)
        real_replace = os.replace

        def replace_then_die(a, b):
            real_replace(a, b)
            if b.endswith("-old"):
                raise raised

        monkeypatch.setattr(directory.os, "replace", replace_then_die)
    return type(raised)


@pytest.mark.parametrize("after", ["exchange", "first rename"])
def test_a_publish_that_died_is_finished_by_the_next_run(tmp_path, corpus, monkeypatch, after):
    if after == "exchange" and directory._renameat2() is None:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    run_pack(config(tmp_path, [corpus]), engine="local")
    died = die_in_publish(monkeypatch, after)
    with pytest.raises(died):
        run_pack(config(tmp_path, [corpus], context_length=12, overwrite=True), engine="local")
    monkeypatch.undo()
    # The next run on the output (here one that is refused: the output is complete) first
    # finishes the publish: the new output is in place and nothing of the old one is left. Its line says
    # so (an operator's trial: it said 'not empty', and a rerun of the killed command read as a failure).
    out = os.path.realpath(tmp_path / "out")
    with pytest.raises(InputError, match=rf"^output {re.escape(out)} is complete: the run before was killed in its "
                                         r"publish, which this run finished; nothing more to do \(to pack it again, "
                                         r"pass --overwrite\)$"):
        run_pack(config(tmp_path, [corpus]), engine="local")
    assert_exactly_the_manifest(tmp_path / "out")["context_length"] == 12
    assert sorted(os.listdir(tmp_path)) == ["corpus", "out"]


@pytest.mark.parametrize("when", ["before the exchange", "exchange"])
def test_a_publish_killed_half_way_is_finished_whatever_the_manifests_times_say(tmp_path, corpus, monkeypatch, when):
    """Killed in the publish, before or after the exchange of the two directories, and then the manifest of
    the directory that is not the new output touched to be the newer one (an operator's trial did it with
    ``touch -d '+1 hour'``): the next run still publishes the new output and removes the old one. The
    directory to publish was chosen by modification time, which kept the old output here (after the
    exchange), or deleted the new one (before it)."""
    if directory._renameat2() is None:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    out = tmp_path / "out"
    run_pack(config(tmp_path, [corpus]), engine="local")
    run_pack(config(tmp_path, [corpus], "clean", context_length=12), engine="local")
    died = die_in_publish(monkeypatch, when)
    with pytest.raises(died):
        run_pack(config(tmp_path, [corpus], context_length=12, overwrite=True), engine="local")
    monkeypatch.undo()
    staged = os.path.join(staging_dir(str(out)), "manifest.json")
    not_new = staged if when == "exchange" else str(out / "manifest.json")
    later = os.stat(not_new).st_mtime + 3600
    os.utime(not_new, (later, later))
    with pytest.raises(InputError, match="is complete: the run before was killed in its publish"):  # finished first
        run_pack(config(tmp_path, [corpus]), engine="local")
    assert assert_exactly_the_manifest(out)["context_length"] == 12
    assert file_digests(str(out)) == file_digests(str(tmp_path / "clean"))
    assert sorted(os.listdir(tmp_path)) == ["clean", "corpus", "out"]


@pytest.mark.parametrize("engine", ["local", "ray"])
@pytest.mark.parametrize("when", ["exchange", "first rename"])
@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_run_stopped_inside_its_publish_is_finished_by_the_resume_its_line_names(tmp_path, corpus, monkeypatch,
                                                                                    capsys, command, when, engine):
    """A run stopped inside its publish (the signals are held off there, so: killed, or an error), its
    records removed: the interrupted line's own ``--resume`` command finishes the publish, exit 0, with the
    output's counts (it was 'already complete', exit 2, for a run that had in fact finished). On Ray that
    resume starts no Ray: there is nothing to run. (A publish sets its records aside now, and a --resume
    checks its tasks again instead, :func:`test_a_resume_after_a_publish_killed_before_its_swap_packs_today`;
    this is the publish of a raypack before that, and the one killed after its swap.)"""
    import raypack.engine.session as session
    from raypack.cli import main

    if when == "exchange" and directory._renameat2() is None:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    if command == "tokenize":
        pq.write_table(pa.table({"text": [f"text number {i} " * (i % 7) for i in range(60)]}), tmp_path / "t.parquet")
        args = ["tokenize", "--local", "--input", str(tmp_path / "t.parquet"), "--tokenizer", "tiktoken:cl100k_base",
                "--output", str(tmp_path / "out")]
    else:
        args = ["pack", "--local", "--input", str(corpus), "--context-length", "8", "--output", str(tmp_path / "out")]
    assert main(args) == 0  # an output to replace: the run stopped is an --overwrite
    args = [*args, "--overwrite"]
    before = sorted(os.listdir(tmp_path))
    capsys.readouterr()
    die_in_publish(monkeypatch, when, KeyboardInterrupt())  # Ctrl-C there
    assert main(args) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "finish with: raypack " in line, line
    again = shlex.split(line.split("finish with: raypack ", 1)[1])
    assert again == [*(a for a in args if a != "--overwrite"), "--resume"]  # the two are refused together
    monkeypatch.undo()
    shutil.rmtree(directory.LocalOutput(str(tmp_path / "out")).records_aside)
    if engine == "ray":
        again.remove("--local")

        def no_ray(*a, **k):
            raise AssertionError("Ray started for a resume with nothing to run")

        monkeypatch.setattr(session, "connect_ray", no_ray)
        monkeypatch.setattr(job, "connect_ray", no_ray)
    assert main(again) == 0
    captured = capsys.readouterr()
    done = "finished the interrupted publish of" + f" {tmp_path / 'out'}"
    assert captured.out.startswith(done), captured.out
    assert "time" not in captured.out
    if command == "pack":
        assert_exactly_the_manifest(tmp_path / "out")
    else:
        assert "tokens" in captured.out and (tmp_path / "out" / "manifest.json").is_file()
    assert sorted(os.listdir(tmp_path)) == sorted(set(before) | {"out"})
    # and a resume of that complete output is still refused, as before
    assert main(again) == 2
    assert "already complete; nothing to resume" in capsys.readouterr().err


@pytest.mark.parametrize("when", ["before the exchange", "exchange", "first rename"])
@pytest.mark.parametrize("command", ["pack", "pack --tokenizer", "tokenize"])
def test_a_resume_after_a_publish_killed_before_its_swap_packs_today(tmp_path, corpus, monkeypatch, command, when):
    """Killed in its publish (SIGKILL: the signals are held off there), then ``--resume`` with another
    context length and an input edited: it finished the dead run's publish, exit 0, and the output was the
    dead run's, though a resume packs today's inputs and settings (an operator's trial). The publish now sets
    the records aside (one rename) before the swap, and a --resume puts them back: its tasks are checked
    again, as for a run killed just before its publish. Killed after the swap (a rename later), the output is
    the dead run's, as before."""
    from raypack.cli import main

    if when != "first rename" and directory._renameat2() is None:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    inputs = tmp_path / "in"
    if command == "pack":
        shutil.copytree(corpus, inputs)
        edit = sorted(inputs.glob("*.parquet"))[0]
        base = ["pack", "--local", "--pad-token", "0"]
    else:
        inputs.mkdir()
        for k in range(3):
            pq.write_table(pa.table({"text": [f"shard {k} text {i} " * (i % 5) for i in range(40)]}),
                           inputs / f"t{k}.parquet")
        edit = inputs / "t0.parquet"
        base = [command.split()[0], "--local", "--tokenizer", "tiktoken:cl100k_base",
                "--tokenizer-backend", "reference"]
    sized = (lambda c: ["--context-length", str(c)]) if command != "tokenize" else (lambda c: [])

    def args(name, c, *more):
        return [*base, "--input", str(inputs), "--output", str(tmp_path / name), *sized(c), *more]

    assert main(args("out", 8)) == 0
    die_in_publish(monkeypatch, when)
    with pytest.raises(BaseException):  # noqa: B017 (die_in_publish's own exception: killed)
        main(args("out", 10, "--overwrite") if command != "tokenize" else args("out", 0, "--overwrite",
                                                                                "--eos", "<|endoftext|>"))
    monkeypatch.undo()
    table = pq.read_table(edit)
    pq.write_table(table.slice(0, table.num_rows - 1), edit)  # an input edited after the kill
    swapped = when == "exchange"  # the dead run's output was in place: complete, as one rename later
    assert main(args("out", 12, "--resume")) == (2 if swapped else 0)
    assert main(args("clean", 12)) == 0
    assert (tree_digest(tmp_path / "out") == tree_digest(tmp_path / "clean")) != swapped
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


@pytest.mark.parametrize("first", [0, 3])
def test_an_interrupted_overwrite_is_finished_by_the_resume_its_line_names(tmp_path, corpus, monkeypatch, capsys,
                                                                           first):
    """Ctrl-C in an ``--overwrite`` run: its line names the command with ``--resume`` in place of
    ``--overwrite`` (the two are refused together: it named both, which exited 2), and that resume
    replaces the old output with what a clean run makes. Interrupted at the first task (``--workers 1``),
    no task had finished: nothing is kept, the line says so, the old output is as it was, and the run's own
    command (``--overwrite``) does it all again."""
    from raypack.cli import main

    base = ["pack", "--local", "--workers", "1", "--input", str(corpus), "--pad-token", "0", "--output"]
    assert main([*base, str(tmp_path / "clean"), "--context-length", "12"]) == 0
    args = [*base, str(tmp_path / "out"), "--context-length", "12", "--overwrite"]
    assert main([*base, str(tmp_path / "out"), "--context-length", "8"]) == 0
    old = file_digests(str(tmp_path / "out"))
    capsys.readouterr()
    fail_at_shard(monkeypatch, first, KeyboardInterrupt())
    assert main(args) == 130
    line = capsys.readouterr().err.strip().splitlines()[-1]
    if first == 0:
        assert line == "raypack: interrupted; nothing was written", line
        assert not os.path.exists(staging_dir(str(tmp_path / "out")))
        assert file_digests(str(tmp_path / "out")) == old
        again = args
    else:
        again = shlex.split(line.split("with: raypack ", 1)[1])
        assert again == [*args[:-1], "--resume"]
    monkeypatch.undo()
    assert main(again) == 0
    assert assert_exactly_the_manifest(tmp_path / "out")["context_length"] == 12
    assert file_digests(str(tmp_path / "out")) == file_digests(str(tmp_path / "clean"))
    assert not os.path.exists(staging_dir(str(tmp_path / "out")))


def test_a_run_stopped_before_any_task_finished_does_not_block_the_plain_command(tmp_path, corpus, monkeypatch,
                                                                                  capsys):
    """Ctrl-C before any task finished left a staging directory with no work in it, and the run's own command,
    run again, was refused as 'an earlier run ... did not finish' (a new user's trial). Then it was kept and
    the line told the user to ``--resume`` it, with nothing to resume (a later trial): now nothing is left,
    and the line says nothing was written."""
    from raypack.cli import main

    base = ["pack", "--local", "--workers", "1", "--input", str(corpus), "--pad-token", "0", "--context-length", "12"]
    assert main([*base, "--output", str(tmp_path / "clean")]) == 0
    fail_at_shard(monkeypatch, 0, KeyboardInterrupt())
    assert main([*base, "--output", str(tmp_path / "out")]) == 130
    assert capsys.readouterr().err == "raypack: interrupted; nothing was written\n"
    assert not os.path.exists(staging_dir(str(tmp_path / "out")))
    assert not os.path.exists(tmp_path / "out")
    monkeypatch.undo()
    assert main([*base, "--output", str(tmp_path / "out")]) == 0
    assert file_digests(str(tmp_path / "out")) == file_digests(str(tmp_path / "clean"))
    assert not os.path.exists(staging_dir(str(tmp_path / "out")))


def test_an_interrupted_mix_keeps_nothing(tmp_path, corpus, monkeypatch, capsys):
    """``mix`` has no ``--resume``: Ctrl-C leaves no staging directory, and its line says nothing was
    written (it named a ``--resume`` that mix refuses)."""
    import raypack.mix.dataset as dataset
    from raypack.cli import main

    run_pack(config(tmp_path, [corpus]), engine="local")

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset, "write_manifest", interrupt)
    command = ["mix", "--source", str(tmp_path / "out"), "--weight", "1", "--num-chunks", "5", "--output",
               str(tmp_path / "mix")]
    assert main(command) == 130
    assert capsys.readouterr().err == "raypack: interrupted; nothing was written\n"
    assert sorted(os.listdir(tmp_path)) == ["corpus", "out"]
    monkeypatch.undo()
    assert main(command) == 0


@pytest.mark.parametrize("change", ["nothing", "context length", "a damaged chunk file", "rows appended"])
def test_ctrl_c_after_the_manifest_before_the_publish_is_resumed_against_the_days_inputs(
        tmp_path, corpus, monkeypatch, capsys, change):
    """Ctrl-C once the staged manifest is written, before the publish: ``--resume`` checks every task as for
    any unfinished run, so the output is what a clean run on the inputs and settings of the day makes. It
    published the staged output unchecked (an operator's trial: a resume asking for another context length
    published the old one, and a chunk file damaged in between was published as it was)."""
    from raypack.cli import main

    base = ["pack", "--local", "--input", str(corpus), "--pad-token", "0", "--context-length"]
    args = [*base, "8", "--output", str(tmp_path / "out")]
    die_in_publish(monkeypatch, "before the rename", KeyboardInterrupt())
    assert main(args) == 130
    monkeypatch.undo()
    line = capsys.readouterr().err.strip().splitlines()[-1]
    again = shlex.split(line.split("finish with: raypack ", 1)[1])
    staging = staging_dir(str(tmp_path / "out"))
    assert os.path.isfile(os.path.join(staging, "manifest.json"))
    if change == "context length":
        again[again.index("--context-length") + 1] = "12"
    elif change == "a damaged chunk file":
        chunk = next(n for n in sorted(os.listdir(staging)) if n.startswith("chunks-"))
        with open(os.path.join(staging, chunk), "r+b") as f:
            f.seek(200)
            f.write(b"XXXX")
    elif change == "rows appended":
        append_rows(shards(corpus)[2], 5)
    assert main(again) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"packed {tmp_path / 'out'}"), out
    assert ("kept from the run before" in out) == (change != "context length"), out  # the unchanged tasks
    length = "12" if change == "context length" else "8"
    assert main([*base, length, "--output", str(tmp_path / "clean")]) == 0
    assert_exactly_the_manifest(tmp_path / "out")
    assert file_digests(str(tmp_path / "out")) == file_digests(str(tmp_path / "clean"))
    assert not os.path.exists(staging)


def test_a_stop_whose_raise_was_lost_in_the_last_task_is_not_published(tmp_path, corpus, monkeypatch, capsys):
    """A Ctrl-C whose KeyboardInterrupt Python dropped (raised in a weakref callback: "Exception ignored in ...")
    during the last task let the run publish and exit 0 (an operator's stop trial): nothing raised it again, as
    the end of a next task does. It is found before the publish: the run's stop line, and its resume makes the
    clean run's output."""
    import time

    from raypack.cli import main
    from raypack.io.threads import stopped_at

    base = ["pack", "--local", "--input", str(corpus), "--pad-token", "0", "--context-length", "12"]
    assert main([*base, "--output", str(tmp_path / "clean")]) == 0
    real = job.write_manifest

    def manifest_then_a_lost_stop(*args, **kwargs):
        real(*args, **kwargs)
        stopped_at(time.monotonic() + 10)  # what raypack's handler sets before its raise, which was dropped

    monkeypatch.setattr(job, "write_manifest", manifest_then_a_lost_stop)
    capsys.readouterr()
    try:
        assert main([*base, "--output", str(tmp_path / "out")]) == 130
    finally:
        stopped_at(None)
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert not os.path.exists(tmp_path / "out")
    again = shlex.split(line.split("finish with: raypack ", 1)[1])
    monkeypatch.undo()
    assert main(again) == 0
    assert file_digests(str(tmp_path / "out")) == file_digests(str(tmp_path / "clean"))
    assert not os.path.exists(staging_dir(str(tmp_path / "out")))


def test_ctrl_c_inside_the_publish_is_held_off_until_the_output_is_in_place(tmp_path, corpus, monkeypatch, capsys):
    """A real SIGINT as the output is swapped in: the publish finishes, the run ends as finished (exit 0,
    its summary), and no staging or old directory is left; a Ctrl-C just after is dropped the same way."""
    from raypack.cli import main

    if directory._renameat2() is None:
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    args = ["pack", "--local", "--input", str(corpus), "--pad-token", "0", "--output", str(tmp_path / "out")]
    assert main([*args, "--context-length", "8"]) == 0
    real = directory.exchange_paths

    def exchange_under_ctrl_c(a, b):
        os.kill(os.getpid(), signal.SIGINT)  # delivered at the next bytecode: inside the publish
        return real(a, b)

    monkeypatch.setattr(directory, "exchange_paths", exchange_under_ctrl_c)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a shell gives it
    try:
        assert main([*args, "--context-length", "12", "--overwrite"]) == 0
    finally:
        signal.signal(signal.SIGINT, previous)
    assert capsys.readouterr().out.startswith(f"packed {tmp_path / 'out'}")
    assert assert_exactly_the_manifest(tmp_path / "out")["context_length"] == 12
    assert sorted(os.listdir(tmp_path)) == ["corpus", "out"]


def test_a_complete_staging_directory_is_published_by_the_next_run(tmp_path, corpus):
    """A run that died between writing its manifest and the rename."""
    run_pack(config(tmp_path, [corpus], "done"), engine="local")
    shutil.copytree(tmp_path / "done", staging_dir(str(tmp_path / "out")))
    run_pack(config(tmp_path, [corpus], "out", context_length=12, overwrite=True), engine="local")
    assert_exactly_the_manifest(tmp_path / "out")["context_length"] == 12
    assert not os.path.exists(staging_dir(str(tmp_path / "out")))


def test_an_old_output_moved_aside_is_restored_when_its_replacement_never_came(tmp_path, corpus):
    run_pack(config(tmp_path, [corpus]), engine="local")
    before = tree_digest(tmp_path / "out")
    old = directory.LocalOutput(str(tmp_path / "out")).old_dir
    os.replace(tmp_path / "out", old)
    with pytest.raises(InputError, match="not empty"):
        run_pack(config(tmp_path, [corpus]), engine="local")
    assert tree_digest(tmp_path / "out") == before and not os.path.exists(old)


@pytest.mark.parametrize("spelling", ["link", "link/", "link/."])
@pytest.mark.parametrize("existing", [False, True])
def test_an_output_that_is_a_symlink_to_a_directory_publishes_into_that_directory(tmp_path, corpus, existing,
                                                                                 spelling):
    """The link stays a link; the run and every later run (--overwrite) write the directory it names. An
    operator's trial: ``link/`` was not seen as the link, so it took another lock than ``link``'s, replaced the
    link with a directory, and every later ``--overwrite`` of ``link`` failed with a traceback."""
    real = tmp_path / "disk" / "out"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    if existing:
        run_pack(config(tmp_path, [corpus], name="link"), engine="local")
    spelled = f"{tmp_path}/{spelling}"  # not through pathlib, which drops the slash and the dot
    assert publish.output_target(spelled).lock.path == str(tmp_path / "disk" / ".out.raypack-lock")
    for output in (spelled, str(tmp_path / "link")):
        run_pack(config(tmp_path, [corpus], output=output, overwrite=True), engine="local")
        assert os.path.islink(tmp_path / "link") and os.path.isfile(real / "manifest.json")
        verify_output(str(tmp_path / "link"), [])
    run_pack(config(tmp_path, [corpus], name="plain"), engine="local")
    assert file_digests(str(real)) == file_digests(str(tmp_path / "plain"))
    assert sorted(os.listdir(tmp_path)) == ["corpus", "disk", "link", "plain"]
    assert sorted(os.listdir(tmp_path / "disk")) == ["out"]  # no staging or lock left beside it


@pytest.mark.parametrize("command", ["pack", "tokenize", "pack --tokenizer"])
@pytest.mark.parametrize("depth", [1, 2])
def test_an_output_under_a_file_is_one_line(tmp_path, corpus, capsys, command, depth):
    """``--output FILE/x`` (a new user's slip: the input file named as the output's folder): a hostile trial
    got a traceback (FileExistsError from the lock's folder), exit 1. ``FILE/x/y`` said 'Not a directory'."""
    from raypack.cli import main

    pq.write_table(pa.table({"text": ["some text"]}), tmp_path / "t.parquet")
    output = tmp_path / "t.parquet" / "x" / ("y" if depth == 2 else "")
    output = str(output).rstrip("/")
    if command == "tokenize":
        args = ["tokenize", "--input", str(tmp_path / "t.parquet"), "--tokenizer", "tiktoken:cl100k_base"]
    elif command == "pack":
        args = ["pack", "--input", str(corpus), "--context-length", "8"]
    else:
        args = ["pack", "--input", str(tmp_path / "t.parquet"), "--tokenizer", "tiktoken:cl100k_base",
                "--context-length", "8"]
    before = sorted(os.listdir(tmp_path))
    assert main([*args, "--local", "--output", output]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    parent = os.path.dirname(output)
    why = "it is a file, not a directory" if depth == 1 else os.strerror(errno.ENOTDIR)
    assert err == [f"raypack: error: output {output}: cannot write in {parent} ({why}); give an --output in a "
                   "directory this user can write"], err
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("resume_after", [False, True])
def test_a_publish_the_file_system_refuses_is_one_line_and_the_next_run_finishes_it(tmp_path, corpus, monkeypatch,
                                                                                    capsys, resume_after):
    """The rename into place refused (EPERM: an immutable output; EBUSY): a traceback, and the same traceback
    on every later run (an operator's trial). One line now, exit 2, the complete output kept; once the cause
    is gone, the next run finishes the publish."""
    from raypack.cli import main

    args = ["pack", "--local", "--input", str(corpus), "--context-length", "8", "--output", str(tmp_path / "out")]
    real = os.rename

    def refused(a, b):
        raise PermissionError(errno.EPERM, "Operation not permitted", a, None, b)

    monkeypatch.setattr(directory.os, "rename", refused)
    capsys.readouterr()
    assert main(args) == 2
    staging = publish.staging_dir(str(tmp_path / "out"))
    assert capsys.readouterr().err.strip().splitlines() == [
        f"raypack: error: cannot rename the finished output into place at {tmp_path / 'out'} (Operation not "
        f"permitted); it is complete in {staging}: fix that (the directory's permissions, an immutable or busy "
        "directory) and run the same command again, which finishes the publish"]
    assert os.path.isfile(os.path.join(staging, "manifest.json")) and not (tmp_path / "out").exists()
    assert main(args) == 2  # still refused: the same line
    assert "cannot rename the finished output into place" in capsys.readouterr().err
    monkeypatch.setattr(directory.os, "rename", real)
    if resume_after:  # another context length: the records, set aside, survived the retry (a trial: deleted)
        assert main([*args[:4], "--context-length", "12", "--output", str(tmp_path / "out"), "--resume"]) == 0
        assert assert_exactly_the_manifest(tmp_path / "out")["context_length"] == 12
    else:
        assert main(args) == 2  # finished now; said as the run before's publish, finished
        assert "is complete: the run before was killed in its publish, which this run finished" in \
            capsys.readouterr().err
        assert_exactly_the_manifest(tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["corpus", "out"]


@pytest.mark.parametrize("where", ["as the watchdog starts", "between the file's end and its publish"])
def test_a_ctrl_c_around_a_chunk_file_leaves_no_temporary_file(tmp_path, corpus, monkeypatch, where):
    """A stop between a chunk file's opening and its hand-over to the publisher left a .tmp file in the staging
    directory (an operator's trial: 1 stop in 10; empty files, and a whole one never published)."""
    import raypack.pack.packer as packer

    calls = []

    def interrupt(real):
        def at_third_task(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return real(*args, **kwargs)
        return at_third_task

    name = "ProgressWatchdog" if where == "as the watchdog starts" else "peak_rss_bytes"
    monkeypatch.setattr(packer, name, interrupt(getattr(packer, name)))
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(tmp_path, [corpus], num_workers=1), engine="local")  # packed on the main thread, as a
    staging = staging_dir(str(tmp_path / "out"))  # signal's KeyboardInterrupt is raised there only
    left = [n for _, _, names in os.walk(staging) for n in names if n.startswith(".tmp")] if os.path.isdir(staging) \
        else []
    assert len(calls) == 3 and left == [], left


def test_a_stop_removes_the_unfinished_files_of_killed_workers_records_too(tmp_path):
    """A Ray worker ended by a stop (raypack.engine.pipeline.end_workers) may leave its chunk file or its task's
    resume record half written: both go as the stop ends; the finished tasks' files and records stay."""
    from raypack.pack.resume import RESULTS_DIR
    from raypack.packed.writer import TMP_PREFIX

    output = directory.LocalOutput(str(tmp_path / "out"))
    output.prepare(fresh=True)
    results = os.path.join(output.work_dir, RESULTS_DIR)
    os.makedirs(results)
    kept = {"chunks-000000000000-ab.arrow", os.path.join(RESULTS_DIR, "task-000000.json")}
    unfinished = {f"{TMP_PREFIX}1-chunks.arrow", os.path.join(RESULTS_DIR, f"{TMP_PREFIX}2-task-000001.json")}
    for name in kept | unfinished:
        with open(os.path.join(output.work_dir, name), "w") as f:
            f.write("x")
    output.after_stop()
    left = {os.path.relpath(os.path.join(root, name), output.work_dir)
            for root, _, names in os.walk(output.work_dir) for name in names}
    assert left == kept
