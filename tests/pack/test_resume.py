"""Interrupted runs, --resume and --overwrite: nothing partial is ever published, and a
resumed run's output directory is byte-identical to a clean run's."""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import logging
import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.errors import InputError
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.pack.publish import staging_dir
from raypack.pack.resume import RESULTS_DIR, record_name
from raypack.sample import write_sample_corpus

from helpers import tree_digest
from packing_faults import check_published_before_the_manifest, fail_at_call, fail_at_shard, record_fsyncs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(str(root), num_shards=6, docs_per_shard=40, mean_doc_len=20, seed=3)
    return str(root)


def config(tmp_path, corpus, name="out", **overrides):
    """One local packer (num_workers=1): these tests name the shards packed again, which with the
    local engine's threads depends on their timing (test_threaded_crash_... covers those)."""
    values = dict(inputs=[corpus], output=str(tmp_path / name), context_length=16, pad_token=0,
                  read_batch_size=7, chunks_per_record_batch=4, num_workers=1)
    values.update(overrides)
    return make_config(values)


@pytest.fixture
def clean_run(tmp_path, corpus):
    run_pack(config(tmp_path, corpus, "clean"), engine="local")
    return tree_digest(tmp_path / "clean")


def test_interrupted_run_is_refused_then_resumed_byte_identical(tmp_path, corpus, clean_run, monkeypatch):
    fail_at_shard(monkeypatch, 4, RuntimeError("worker lost"))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_pack(config(tmp_path, corpus), engine="local")
    out = tmp_path / "out"
    assert not out.exists()  # nothing published
    assert os.path.isdir(staging_dir(str(out)))  # the work is kept
    monkeypatch.undo()

    with pytest.raises(InputError, match="did not finish.*--resume.*--overwrite"):
        run_pack(config(tmp_path, corpus), engine="local")

    packed = fail_at_shard(monkeypatch, -1, RuntimeError("unused"))
    run_pack(config(tmp_path, corpus), engine="local", resume=True)
    assert packed == [4, 5]  # shards 0-3 were kept, verified
    assert tree_digest(out) == clean_run
    assert not os.path.exists(staging_dir(str(out)))


def test_resume_repacks_a_damaged_file(tmp_path, corpus, clean_run, monkeypatch):
    fail_at_shard(monkeypatch, 5, RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        run_pack(config(tmp_path, corpus), engine="local")
    staging = staging_dir(str(tmp_path / "out"))
    victim = sorted(p for p in os.listdir(staging) if p.startswith("chunks-"))[1]
    with open(os.path.join(staging, victim), "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    packed = fail_at_shard(monkeypatch, -1, RuntimeError("unused"))
    run_pack(config(tmp_path, corpus), engine="local", resume=True)
    assert len(packed) == 2  # the damaged shard and the one that crashed
    assert 5 in packed
    assert tree_digest(tmp_path / "out") == clean_run


@pytest.mark.parametrize("what", ["chunks", "record"])
def test_resume_repacks_a_shard_whose_file_was_replaced_by_a_fifo(tmp_path, corpus, clean_run, monkeypatch, what):
    """A FIFO under a recorded chunk file's name (or a record's) would block a read forever: it is
    not opened; the shard is packed again and the output equals a clean run."""
    fail_at_shard(monkeypatch, 5, RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        run_pack(config(tmp_path, corpus), engine="local")
    staging = staging_dir(str(tmp_path / "out"))
    if what == "chunks":
        victim = os.path.join(staging, sorted(p for p in os.listdir(staging) if p.startswith("chunks-"))[1])
    else:
        victim = os.path.join(staging, record_name(1))
    os.remove(victim)
    os.mkfifo(victim)
    packed = fail_at_shard(monkeypatch, -1, RuntimeError("unused"))
    run_pack(config(tmp_path, corpus), engine="local", resume=True)
    assert len(packed) == 2 and 5 in packed  # the shard whose file became a FIFO and the one that crashed
    assert tree_digest(tmp_path / "out") == clean_run


def test_resume_keeps_a_shard_whose_mtime_alone_changed(tmp_path, corpus, monkeypatch):
    local_corpus = tmp_path / "corpus"
    shutil.copytree(corpus, local_corpus)
    crash_at(monkeypatch, 5, config(tmp_path, str(local_corpus)))
    os.utime(sorted(local_corpus.iterdir())[0], ns=(1, 1))  # same bytes: identity is content, not mtime
    packed = fail_at_shard(monkeypatch, -1, RuntimeError("unused"))
    run_pack(config(tmp_path, str(local_corpus)), engine="local", resume=True)
    assert packed == [5]
    run_pack(config(tmp_path, str(local_corpus), "clean"), engine="local")
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "clean")


def test_bad_input_found_while_packing_leaves_nothing(tmp_path, corpus, monkeypatch):
    fail_at_shard(monkeypatch, 2, InputError("shard x row 3: token -1 is negative"))
    with pytest.raises(InputError, match="negative"):
        run_pack(config(tmp_path, corpus), engine="local")
    assert sorted(os.listdir(tmp_path)) == []


def test_full_disk_leaves_nothing_and_says_so(tmp_path, corpus, monkeypatch):
    fail_at_shard(monkeypatch, 3, OSError(errno.ENOSPC, "No space left on device", "chunks-x.arrow"))
    with pytest.raises(InputError, match="No space left on device.*nothing was published"):
        run_pack(config(tmp_path, corpus), engine="local")
    assert sorted(os.listdir(tmp_path)) == []


def test_overwrite_replaces_only_after_success(tmp_path, corpus, clean_run, monkeypatch):
    out = tmp_path / "out"
    run_pack(config(tmp_path, corpus, context_length=5), engine="local")  # an old output
    old = tree_digest(out)
    fail_at_shard(monkeypatch, 1, RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        run_pack(config(tmp_path, corpus, overwrite=True), engine="local")
    assert tree_digest(out) == old
    monkeypatch.undo()
    run_pack(config(tmp_path, corpus, overwrite=True), engine="local")
    assert tree_digest(out) == clean_run


def test_resume_of_a_complete_output_says_so(tmp_path, corpus):
    run_pack(config(tmp_path, corpus), engine="local")
    with pytest.raises(InputError, match=r"already complete; nothing to resume \(to pack it again, with other "
                                         r"inputs or settings, pass --overwrite"):
        run_pack(config(tmp_path, corpus), engine="local", resume=True)


@pytest.mark.parametrize("manifest", ["", "{\"format_version\": 3, \"coun", "null", "{}"])
def test_resume_of_an_output_whose_manifest_does_not_load_says_so(tmp_path, corpus, manifest):
    """Truncated, emptied or edited: said as that, with --overwrite, not as 'already complete' (an operator's
    trial); the output is not touched."""
    run_pack(config(tmp_path, corpus), engine="local")
    (tmp_path / "out" / "manifest.json").write_text(manifest)
    before = tree_digest(tmp_path / "out")
    with pytest.raises(InputError, match=r"out has a manifest\.json that (does not load \(.+\)|holds no manifest); "
                                         r"nothing to resume: pass --overwrite instead of --resume to pack it again$"):
        run_pack(config(tmp_path, corpus), engine="local", resume=True)
    assert tree_digest(tmp_path / "out") == before


def test_ray_resume_equals_clean_run(ray_session, tmp_path, corpus, clean_run, monkeypatch):
    fail_at_shard(monkeypatch, 3, RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        run_pack(config(tmp_path, corpus), engine="local")
    monkeypatch.undo()
    run_pack(config(tmp_path, corpus, num_workers=2, read_batch_size=5), engine="ray", resume=True)
    assert tree_digest(tmp_path / "out") == clean_run


def test_manifest_does_not_depend_on_execution_settings(tmp_path, corpus):
    run_pack(config(tmp_path, corpus, "a", read_batch_size=3, num_workers=1), engine="local")
    run_pack(config(tmp_path, corpus, "b", read_batch_size=100, num_workers=2), engine="local")
    a, b = tree_digest(tmp_path / "a"), tree_digest(tmp_path / "b")
    assert a == b
    assert np.all([name.startswith("chunks-") or name == "manifest.json" for name in a])


# ----------------------------------------------------------------------------- records are verified, inputs identified


def crash_at(monkeypatch, index: int, cfg) -> str:
    """Run ``cfg`` until shard ``index`` crashes; return the staging directory it leaves."""
    fail_at_shard(monkeypatch, index, RuntimeError("crash"))
    with pytest.raises(RuntimeError, match="crash"):
        run_pack(cfg, engine="local")
    monkeypatch.undo()
    return staging_dir(cfg.output)


def resume(monkeypatch, cfg) -> list[int]:
    """Resume ``cfg``; return the shards packed again."""
    packed = fail_at_shard(monkeypatch, -1, RuntimeError("unused"))
    run_pack(cfg, engine="local", resume=True)
    monkeypatch.undo()
    return packed


def record_of(staging: str, shard: int) -> str:
    (path,) = glob.glob(os.path.join(staging, "_results", f"task-{shard:06d}.*"))
    return path


def edit_record(path: str, edit) -> None:
    """Apply ``edit`` to the parsed record and write it back, its checksum left as it was."""
    with open(path) as f:
        record = json.load(f)
    edit(record)
    with open(path, "w") as f:
        json.dump(record, f)


def bump_fragment_token(record: dict) -> None:
    fragment = record["result"]["tail"]
    assert fragment and fragment["input_ids"]  # not vacuous: the shard has a tail to damage
    fragment["input_ids"][0] += 1


def test_record_with_a_flipped_fragment_token_is_repacked(tmp_path, corpus, clean_run, monkeypatch, caplog):
    staging = crash_at(monkeypatch, 5, config(tmp_path, corpus))
    edit_record(record_of(staging, 3), bump_fragment_token)
    with caplog.at_level(logging.INFO, logger="raypack.pack.resume"):
        assert resume(monkeypatch, config(tmp_path, corpus)) == [3, 5]
    assert tree_digest(tmp_path / "out") == clean_run
    assert [r.message for r in caplog.records if "shard 3" in r.message and "checksum" in r.message]


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


def _garbage(path):
    open(path, "wb").write(os.urandom(300))


def _edit_checksum(path):
    edit_record(path, lambda r: r.update(record_sha256="0" * 64))


def _forge_version(path):
    edit_record(path, lambda r: r.update(version=r["version"] + 1))  # checksum no longer matches either


def _nested(path):
    open(path, "w").write("[" * 100_000 + "]" * 100_000)  # past Python's parser: RecursionError, not ValueError


def _a_directory(path):
    os.remove(path)
    os.mkdir(path)


@pytest.mark.parametrize("damage", [_truncate, _garbage, _edit_checksum, _forge_version, _nested, _a_directory])
def test_damaged_record_is_repacked(tmp_path, corpus, clean_run, monkeypatch, damage):
    staging = crash_at(monkeypatch, 5, config(tmp_path, corpus))
    damage(record_of(staging, 2))
    assert resume(monkeypatch, config(tmp_path, corpus)) == [2, 5]
    assert tree_digest(tmp_path / "out") == clean_run


def test_a_chunk_file_that_is_a_folder_is_packed_again(tmp_path, corpus, clean_run, monkeypatch):
    """A trial: a task's chunk file replaced by a folder of its name failed every --resume (IsADirectoryError
    as the task's new file took the name)."""
    staging = crash_at(monkeypatch, 5, config(tmp_path, corpus))
    with open(record_of(staging, 2)) as f:
        name = json.load(f)["result"]["file"]["path"]
    os.remove(os.path.join(staging, name))
    os.mkdir(os.path.join(staging, name))
    assert resume(monkeypatch, config(tmp_path, corpus)) == [2, 5]
    assert tree_digest(tmp_path / "out") == clean_run


@pytest.mark.parametrize("flags", [{}, {"resume": True}, {"overwrite": True}])
def test_a_staging_path_that_is_a_file_is_one_line(tmp_path, corpus, flags):
    """A trial: a file where the staging directory goes failed every run, --overwrite too, with a traceback."""
    staging = staging_dir(str(tmp_path / "out"))
    open(staging, "w").write("x")
    resume_flag = flags.pop("resume", False)
    with pytest.raises(InputError, match=rf"^{re.escape(staging)} is not a directory; raypack keeps an unfinished "
                                         "run's work there: move or remove it, then run again$"):
        run_pack(config(tmp_path, corpus, **flags), engine="local", resume=resume_flag)


def test_a_results_folder_that_is_a_file_is_packed_again(tmp_path, corpus, clean_run, monkeypatch):
    """An operator's trial: ``_results`` made a plain file in the staging directory failed every --resume with a
    traceback (NotADirectoryError). Its tasks are packed again, as for records that do not load."""
    staging = crash_at(monkeypatch, 5, config(tmp_path, corpus))
    shutil.rmtree(os.path.join(staging, "_results"))
    open(os.path.join(staging, "_results"), "w").write("x")
    assert resume(monkeypatch, config(tmp_path, corpus)) == [0, 1, 2, 3, 4, 5]
    assert tree_digest(tmp_path / "out") == clean_run


def test_record_of_another_version_is_repacked_even_with_a_valid_checksum(tmp_path, corpus, clean_run, monkeypatch,
                                                                        caplog):
    staging = crash_at(monkeypatch, 5, config(tmp_path, corpus))
    resign_record(record_of(staging, 1), lambda record: record.update(version=record["version"] + 1))
    with caplog.at_level(logging.INFO, logger="raypack.pack.resume"):
        assert resume(monkeypatch, config(tmp_path, corpus)) == [1, 5]
    assert tree_digest(tmp_path / "out") == clean_run
    assert [r.message for r in caplog.records if "shard 1" in r.message and "has version" in r.message]


def resign_record(path, change) -> None:
    """Apply ``change`` to the record at ``path`` and give it a valid checksum again (as the packer
    computes it), so only the check that follows the checksum can refuse it."""
    record = json.load(open(path))
    record.pop("record_sha256")
    change(record)
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    record["record_sha256"] = hashlib.sha256(canonical).hexdigest()
    json.dump(record, open(path, "w"))


def flip_digest(record: dict) -> None:
    digests = record["result"]["file"]["digests"]
    assert len(digests) >= 64  # not vacuous: the shard wrote chunks, so its record holds their digests
    record["result"]["file"]["digests"] = ("0" if digests[0] != "0" else "1") + digests[1:]


def test_record_with_a_flipped_chunk_digest_is_repacked(tmp_path, corpus, clean_run, monkeypatch, caplog):
    """The range digests are in the checksummed record: one flipped digit and the shard is packed
    again, so the manifest's content_sha256 stays the clean run's."""
    staging = crash_at(monkeypatch, 5, config(tmp_path, corpus))
    edit_record(record_of(staging, 2), flip_digest)
    with caplog.at_level(logging.INFO, logger="raypack.pack.resume"):
        assert resume(monkeypatch, config(tmp_path, corpus)) == [2, 5]
    assert tree_digest(tmp_path / "out") == clean_run
    assert [r.message for r in caplog.records if "shard 2" in r.message and "checksum" in r.message]


def test_record_with_misshapen_digests_is_repacked_even_with_a_valid_checksum(tmp_path, corpus, clean_run,
                                                                              monkeypatch, caplog):
    staging = crash_at(monkeypatch, 5, config(tmp_path, corpus))
    resign_record(record_of(staging, 1),
                  lambda record: record["result"]["file"].update(digests=record["result"]["file"]["digests"][64:]))
    with caplog.at_level(logging.INFO, logger="raypack.pack.resume"):
        assert resume(monkeypatch, config(tmp_path, corpus)) == [1, 5]
    assert tree_digest(tmp_path / "out") == clean_run
    assert [r.message for r in caplog.records if "shard 1" in r.message and "range digests" in r.message]


# A corpus of JSONL shards larger than 2 MiB, so that the middle is read by neither end's MiB.
BIG = 1 << 21


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    paths = write_sample_corpus(str(root), num_shards=2, docs_per_shard=1500, mean_doc_len=300, seed=5, fmt="jsonl")
    assert all(os.path.getsize(p) > BIG + 4096 for p in paths)  # not vacuous: a middle exists
    return str(root)


def big_config(tmp_path, corpus, name="out", **overrides):
    """One local packer, as :func:`config`: the tests name the shards packed again."""
    values = dict(inputs=[corpus], output=str(tmp_path / name), context_length=512, pad_token=0, num_workers=1)
    values.update(overrides)
    return make_config(values)


def rewrite_in_place(path, offset: int) -> None:
    """Change one token's last digit at or after byte ``offset``: same size, same mtime."""
    stat = os.stat(path)
    data = bytearray(open(path, "rb").read())
    at = offset
    while not (chr(data[at]).isdigit() and data[at + 1] in b",]"):
        at += 1
    data[at] = ord(str((int(chr(data[at])) + 1) % 10))
    open(path, "wb").write(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(path).st_size == stat.st_size and os.stat(path).st_mtime_ns == stat.st_mtime_ns


def copy_corpus(corpus, tmp_path) -> tuple[str, str]:
    local = str(tmp_path / "corpus")
    shutil.copytree(corpus, local)
    return local, sorted(glob.glob(os.path.join(local, "shard-*")))[0]


@pytest.mark.parametrize("where", ["first MiB", "last MiB"])
def test_shard_rewritten_in_place_at_an_end_is_repacked(tmp_path, big_corpus, monkeypatch, where):
    local, first = copy_corpus(big_corpus, tmp_path)
    crash_at(monkeypatch, 1, big_config(tmp_path, local))
    size = os.path.getsize(first)
    rewrite_in_place(first, 100 if where == "first MiB" else size - 1000)
    assert resume(monkeypatch, big_config(tmp_path, local)) == [0, 1]
    run_pack(big_config(tmp_path, local, "clean"), engine="local")
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "clean")


def test_known_limit_same_size_same_mtime_change_in_the_middle_is_kept_without_verify_inputs(
        tmp_path, big_corpus, monkeypatch):
    """Documented limit (README, raypack/pack/resume.py): only the ends are hashed by default, so the
    stale shard is kept and the output is the old content's, not the new one's."""
    local, first = copy_corpus(big_corpus, tmp_path)
    run_pack(big_config(tmp_path, local, "old"), engine="local")
    crash_at(monkeypatch, 1, big_config(tmp_path, local))
    rewrite_in_place(first, os.path.getsize(first) // 2)
    assert resume(monkeypatch, big_config(tmp_path, local)) == [1]
    run_pack(big_config(tmp_path, local, "new"), engine="local")
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "old") != tree_digest(tmp_path / "new")


def test_verify_inputs_detects_a_change_in_the_middle(tmp_path, big_corpus, monkeypatch):
    local, first = copy_corpus(big_corpus, tmp_path)
    crash_at(monkeypatch, 1, big_config(tmp_path, local, verify_inputs=True))
    rewrite_in_place(first, os.path.getsize(first) // 2)
    assert resume(monkeypatch, big_config(tmp_path, local, verify_inputs=True)) == [0, 1]
    run_pack(big_config(tmp_path, local, "clean"), engine="local")
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "clean")


def test_verify_inputs_keeps_an_unchanged_shard(tmp_path, big_corpus, monkeypatch):
    local, _ = copy_corpus(big_corpus, tmp_path)
    crash_at(monkeypatch, 1, big_config(tmp_path, local, verify_inputs=True))
    assert resume(monkeypatch, big_config(tmp_path, local, verify_inputs=True)) == [1]


def test_verify_inputs_does_not_reuse_a_record_without_a_full_hash(tmp_path, corpus, clean_run, monkeypatch):
    crash_at(monkeypatch, 5, config(tmp_path, corpus))
    assert resume(monkeypatch, config(tmp_path, corpus, verify_inputs=True)) == [0, 1, 2, 3, 4, 5]
    assert tree_digest(tmp_path / "out") == clean_run


def test_verify_inputs_leaves_the_output_bytes_unchanged(tmp_path, corpus, clean_run, monkeypatch):
    run_pack(config(tmp_path, corpus, "full", verify_inputs=True), engine="local")
    assert tree_digest(tmp_path / "full") == clean_run  # manifest included
    crash_at(monkeypatch, 3, config(tmp_path, corpus, verify_inputs=True))
    assert resume(monkeypatch, config(tmp_path, corpus, verify_inputs=True)) == [3, 4, 5]
    assert tree_digest(tmp_path / "out") == clean_run


def test_verify_inputs_on_the_command_line():
    from raypack.cli import build_parser

    args = build_parser().parse_args(["pack", "--verify-inputs"])
    assert args.verify_inputs is True
    assert "verify_inputs" not in make_config({"verify_inputs": True}).output_dict()
    with pytest.raises(InputError, match="verify_inputs"):
        make_config({"verify_inputs": "yes"})


def test_parquet_footer_is_part_of_the_identity_however_large(tmp_path):
    from raypack.pack.resume import EDGE_BYTES, sampled_identity

    path = str(tmp_path / "wide.parquet")
    tokens = np.random.default_rng(0).integers(0, 1 << 30, 1 << 19)
    table = pa.table({"input_ids": pa.array([tokens], pa.list_(pa.int64()))})
    table = table.replace_schema_metadata({"note": "x" * (3 * EDGE_BYTES // 2)})  # a footer of > 1 MiB
    pq.write_table(table, path, compression="none")
    size = os.path.getsize(path)
    data = bytearray(open(path, "rb").read())
    at = data.index(b"x" * 1000)  # where the footer's note starts
    assert EDGE_BYTES < at < size - EDGE_BYTES  # not vacuous: neither end's MiB holds it
    before = sampled_identity(path, "parquet")
    data[at] = ord("y")
    open(path, "wb").write(bytes(data))
    assert pq.read_metadata(path).num_rows == 1
    assert sampled_identity(path, "parquet") != before
    assert sampled_identity(path, "jsonl") == sampled_identity(path, "jsonl")


# ----------------------------------------------------------------------------- publishing off the packers


@pytest.mark.parametrize("workers", [1, 2])
def test_local_packers_publish_on_the_committer_and_every_file_before_the_manifest(tmp_path, corpus, clean_run,
                                                                                   monkeypatch, workers):
    """The local engine's chunk files are fsynced and renamed (then their resume records written) on
    a Committer thread while the packers go on, and all of them before the manifest: the same bytes."""
    fsyncs = record_fsyncs(monkeypatch)
    run_pack(config(tmp_path, corpus, "clean", num_workers=workers, overwrite=True), engine="local")
    check_published_before_the_manifest(str(tmp_path / "clean"), fsyncs)
    assert tree_digest(tmp_path / "clean") == clean_run


def test_a_failed_fsync_on_the_committer_is_the_full_disk_line_and_leaves_nothing(tmp_path, corpus, monkeypatch):
    record_fsyncs(monkeypatch, fail_on_publish_thread=OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(InputError, match="No space left on device.*nothing was published"):
        run_pack(config(tmp_path, corpus, num_workers=2), engine="local")
    assert sorted(os.listdir(tmp_path)) == []


def test_an_input_gone_or_unreadable_when_its_task_starts_is_one_line(tmp_path, monkeypatch):
    """A shard deleted (or made unreadable) after planning met the resume identity first: a
    FileNotFoundError / PermissionError traceback, exit 1."""
    from raypack.pack.resume import file_sha256, sampled_identity

    gone = str(tmp_path / "gone.jsonl")
    for read in (lambda: sampled_identity(gone, "jsonl"), lambda: file_sha256(gone)):
        with pytest.raises(InputError, match=r"input path not found: .*gone.jsonl; it was there when the run"):
            read()


def test_a_full_disk_during_a_resume_keeps_the_finished_tasks(tmp_path, corpus, clean_run, monkeypatch):
    """It deleted the staging directory (the rule for a fresh run), so the next --resume redid every
    task; now the earlier runs' work stays, and only this attempt's temporary files go."""
    cfg = config(tmp_path, corpus)
    staging = crash_at(monkeypatch, 3, cfg)
    kept = sorted(os.listdir(os.path.join(staging, RESULTS_DIR)))
    assert kept
    fail_at_shard(monkeypatch, 4, OSError(errno.ENOSPC, "No space left on device", "chunks-x.arrow"))
    with pytest.raises(InputError, match=r"No space left on device.*the finished tasks are kept in .*rerun with "
                                         r"--resume"):
        run_pack(cfg, engine="local", resume=True)
    monkeypatch.undo()
    assert set(kept) <= set(os.listdir(os.path.join(staging, RESULTS_DIR)))
    assert not [n for n in os.listdir(staging) if n.startswith(".tmp-")]
    packed = resume(monkeypatch, cfg)
    assert 4 in packed and not set(packed) & {0, 1, 2, 3}  # 0-2 from the crashed run, 3 from the full one
    assert tree_digest(tmp_path / "out") == clean_run


def test_a_full_disk_in_a_run_started_with_resume_keeps_its_finished_tasks(tmp_path, corpus, clean_run, monkeypatch):
    """``--resume`` from the start (an operator's one command for the first try and every retry): a
    full disk deleted what that run had finished, since no earlier run had left records (found by a
    new-user trial)."""
    cfg = config(tmp_path, corpus)
    fail_at_shard(monkeypatch, 3, OSError(errno.ENOSPC, "No space left on device", "chunks-x.arrow"))
    with pytest.raises(InputError, match=r"No space left on device.*the finished tasks are kept in "):
        run_pack(cfg, engine="local", resume=True)
    monkeypatch.undo()
    packed = resume(monkeypatch, cfg)
    assert 3 in packed and not set(packed) & {0, 1, 2}
    assert tree_digest(tmp_path / "out") == clean_run


def test_a_run_killed_after_its_sweep_but_before_its_manifest_keeps_its_tasks(tmp_path, corpus, clean_run,
                                                                              monkeypatch):
    """The sweep removed the resume records before the manifest was written: a kill in that window
    (0.1-0.2 s in a helper's trials) made the next --resume pack every task again."""
    import raypack.pack.job as job

    cfg = config(tmp_path, corpus)

    def killed(*args, **kwargs):
        raise RuntimeError("killed before the manifest")

    monkeypatch.setattr(job, "write_manifest", killed)
    with pytest.raises(RuntimeError, match="killed before the manifest"):
        run_pack(cfg, engine="local")
    monkeypatch.undo()
    assert os.listdir(os.path.join(staging_dir(cfg.output), RESULTS_DIR))
    assert resume(monkeypatch, cfg) == []  # every task kept
    assert tree_digest(tmp_path / "out") == clean_run


def test_a_full_disk_names_the_file_or_else_the_staging_directory(tmp_path):
    """Ray Data re-raised a worker's OSError with its own long message where the file name was, and
    the one line quoted Ray's advice on retries instead of a path."""
    from raypack.pack.publish import LocalOutput

    target = LocalOutput(str(tmp_path / "out"))
    os.makedirs(target.work_dir)
    for name, said in [("/data/out/chunks-1.arrow", "/data/out/chunks-1.arrow"),
                       ("Failed to apply UDF transform after 1/1 attempts.\nTo change retry attempts", target.work_dir),
                       (None, target.work_dir)]:
        with pytest.raises(InputError) as raised:
            target.after_failure(OSError(errno.ENOSPC, "No space left on device", name))
        assert str(raised.value).startswith(f"writing the output failed: No space left on device ({said}); ")
        os.makedirs(target.work_dir, exist_ok=True)


@pytest.mark.parametrize("text", [False, True])
def test_a_resume_says_which_input_files_of_the_run_before_are_gone(tmp_path, corpus, monkeypatch, caplog, text):
    """An input file deleted between a crash and its --resume: the resume packs today's inputs, which it did
    without a word (a new user's trial: 35,000 of 40,000 documents). It now says so, naming the file, also
    when the file's task number went to another file (read before this run's records replace them)."""
    from raypack.tokenize.job import TextOptions

    inputs = tmp_path / "in"
    shutil.copytree(corpus, inputs)
    names = sorted(n for n in os.listdir(inputs) if n.endswith(".parquet"))
    options = {}
    if text:
        for name in names:
            pq.write_table(pa.table({"text": [f"{name} doc {i}" for i in range(30)]}), inputs / name)
        options = dict(text=TextOptions(tokenizer="tiktoken:cl100k_base", tokenizer_backend="reference"))
    if text:  # the one pass: its fourth task's tokenizing fails
        import raypack.tokenize.onepass as onepass

        fail_at_call(monkeypatch, onepass, "tokenize_held", 4, RuntimeError("worker lost"))
    else:
        fail_at_shard(monkeypatch, 3, RuntimeError("worker lost"))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_pack(config(tmp_path, str(inputs)), engine="local", **options)
    monkeypatch.undo()
    os.remove(inputs / names[0])  # finished in the run before; its task number is another file's now
    with caplog.at_level(logging.INFO, logger="raypack"):
        run_pack(config(tmp_path, str(inputs)), engine="local", resume=True, **options)
    lines = [r.getMessage() for r in caplog.records if "not among today's inputs" in r.getMessage()]
    assert lines == [f"resume: the run before read 1 input file that is not among today's inputs "
                     f"({inputs / names[0]}); the output holds today's inputs only"], lines
    run_pack(config(tmp_path, str(inputs), "fresh"), engine="local", **options)
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "fresh")


def test_a_failure_before_any_task_finished_leaves_no_staging_directory(tmp_path, caplog):
    """A crash before any task finished kept an empty staging directory and said "its finished shards are
    kept ... rerun with --resume" (a hostile trial); there was nothing to resume. With a finished task's
    record the directory stays, and the line says so."""
    from raypack.pack.publish import LocalOutput

    target = LocalOutput(str(tmp_path / "out"))
    os.makedirs(target.work_dir)
    with caplog.at_level(logging.ERROR, logger="raypack"):
        target.after_failure(RuntimeError("worker lost"))
    assert not os.path.exists(target.work_dir)
    assert "rerun with --resume" not in caplog.text
    os.makedirs(os.path.join(target.work_dir, RESULTS_DIR))
    with open(os.path.join(target.work_dir, RESULTS_DIR, "task-000000.json"), "w") as f:
        f.write("{}")
    with caplog.at_level(logging.ERROR, logger="raypack"):
        target.after_failure(RuntimeError("worker lost"))
    assert os.path.isdir(target.work_dir)
    assert "rerun with --resume" in caplog.text


def test_an_output_that_is_a_mount_point_is_one_line_before_packing(tmp_path, corpus, monkeypatch, capsys):
    """A volume mounted at the output path (a container's usual layout): the run was written on the parent's
    file system and its publish, a rename onto the mount point, was an EBUSY traceback, again on every later
    run (an operator's trial). Refused before anything is written."""
    from raypack.cli import main

    out = tmp_path / "volume"
    out.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: os.path.abspath(p) == str(out) or real(p))
    code = main(["pack", "--local", "--input", str(corpus), "--output", str(out), "--context-length", "16"])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"raypack: error: output {out} is a mount point: raypack writes a run beside its output and renames it into "
        f"place, which a mount point cannot take; give a directory inside it (e.g. --output {out / 'packed'})"]
    assert not [n for n in os.listdir(tmp_path) if "raypack" in n] and not os.listdir(out)


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_resume_with_a_lower_max_document_bytes_refuses_what_a_clean_run_refuses(tmp_path, monkeypatch, command):
    """A task finished under the default limit kept its 500-byte text when --resume lowered
    --max-document-bytes to 400, exit 0, where a clean run with the same flags is one line naming the row
    (an operator's trial). The limit is in the resume record's settings now."""
    import raypack.tokenize.job as text_job
    import raypack.tokenize.onepass as onepass
    from raypack.tokenize.job import TextOptions, TokenizeConfig, run_tokenize

    inputs = tmp_path / "in"
    inputs.mkdir()
    for k in range(4):
        long_text = ["x" * 500] if k == 0 else []
        pq.write_table(pa.table({"text": long_text + [f"shard {k} doc {i}" for i in range(20)]}),
                       inputs / f"s{k}.parquet")

    def text(limit=None):
        return TextOptions(tokenizer="tiktoken:cl100k_base", tokenizer_backend="reference",
                           **({} if limit is None else {"max_document_bytes": limit}))

    def run(limit=None, resume=False):
        if command == "pack":
            return run_pack(config(tmp_path, str(inputs)), engine="local", resume=resume, text=text(limit))
        return run_tokenize(TokenizeConfig(inputs=(str(inputs),), output=str(tmp_path / "out"), text=text(limit)),
                            engine="local",
                            resume=resume)

    if command == "pack":
        fail_at_call(monkeypatch, onepass, "tokenize_held", 3, RuntimeError("worker lost"))
    else:
        fail_at_call(monkeypatch, text_job, "tokenize_task", 3, RuntimeError("worker lost"))
    with pytest.raises(RuntimeError, match="worker lost"):
        run()
    monkeypatch.undo()
    with pytest.raises(InputError, match=r"s0\.parquet row 0: .*500 bytes.*max_document_bytes=400|"
                                         r"s0\.parquet row 0.*400"):
        run(400, resume=True)


def test_a_resume_over_another_path_to_the_same_text_says_so(tmp_path, monkeypatch, caplog):
    """Resumed with ``--input link`` (a link to the directory the run before read): every task was tokenized
    again, "its record was made for another split of the text into tasks", which nothing had changed (an
    operator's trial). The reason names the other path now."""
    import raypack.tokenize.onepass as onepass
    from raypack.tokenize.job import TextOptions

    inputs = tmp_path / "in"
    inputs.mkdir()
    for k in range(4):
        pq.write_table(pa.table({"text": [f"shard {k} doc {i}" for i in range(20)]}), inputs / f"s{k}.parquet")
    os.symlink(inputs, tmp_path / "link")
    text = TextOptions(tokenizer="tiktoken:cl100k_base", tokenizer_backend="reference")
    fail_at_call(monkeypatch, onepass, "tokenize_held", 3, RuntimeError("worker lost"))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_pack(config(tmp_path, str(inputs)), engine="local", text=text)
    monkeypatch.undo()
    with caplog.at_level(logging.INFO, logger="raypack"):
        run_pack(config(tmp_path, str(tmp_path / "link")), engine="local", resume=True, text=text)
    said = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert len(said) == 1 and "its record names its file by another path" in said[0], said
    assert "another split" not in said[0]


def test_a_resume_with_a_lower_max_document_tokens_refuses_what_a_clean_run_refuses(tmp_path, monkeypatch):
    """Token shards: a task finished under the default limit kept its 60-token document when --resume lowered
    --max-document-tokens to 40, where a clean run with that limit is one line naming the row (the same as
    max_document_bytes for text: an operator's trial). The limit is in the resume record's settings now."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for k in range(4):
        docs = ([list(range(1, 61))] if k == 0 else []) + [[k + 1] * 5 for _ in range(10)]
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), inputs / f"s{k}.parquet")
    fail_at_shard(monkeypatch, 2, RuntimeError("worker lost"))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_pack(config(tmp_path, str(inputs)), engine="local")
    monkeypatch.undo()
    with pytest.raises(InputError, match=r"s0\.parquet row 0.*max_document_tokens=40"):
        run_pack(config(tmp_path, str(inputs), max_document_tokens=40), engine="local", resume=True)
    with pytest.raises(InputError, match=r"s0\.parquet row 0.*max_document_tokens=40"):
        run_pack(config(tmp_path, str(inputs), "clean", max_document_tokens=40), engine="local")
