"""Interrupted runs, --resume and --overwrite: nothing partial is ever published, and a
resumed run's output directory is byte-identical to a clean run's."""

from __future__ import annotations

import errno
import hashlib
import os

import numpy as np
import pytest

from raypack.config import make_config
from raypack.errors import InputError
from packing_faults import fail_at_shard
from raypack.job import run_pack
from raypack.publish import staging_dir
from raypack.sample import write_sample_corpus


def tree_digest(path) -> dict[str, str]:
    """Every file under ``path`` (relative name -> sha256)."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            out[os.path.relpath(full, path)] = hashlib.sha256(open(full, "rb").read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(str(root), num_shards=6, docs_per_shard=40, mean_doc_len=20, seed=3)
    return str(root)


def config(tmp_path, corpus, name="out", **overrides):
    values = dict(inputs=[corpus], output=str(tmp_path / name), context_length=16, pad_token=0,
                  read_batch_size=7, chunks_per_record_batch=4)
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


def test_resume_repacks_a_shard_whose_input_changed(tmp_path, corpus, monkeypatch):
    import shutil

    local_corpus = tmp_path / "corpus"
    shutil.copytree(corpus, local_corpus)
    fail_at_shard(monkeypatch, 5, RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        run_pack(config(tmp_path, str(local_corpus)), engine="local")
    first = sorted(local_corpus.iterdir())[0]
    os.utime(first, ns=(1, 1))  # same bytes, new identity: must not be trusted blindly
    packed = fail_at_shard(monkeypatch, -1, RuntimeError("unused"))
    run_pack(config(tmp_path, str(local_corpus)), engine="local", resume=True)
    assert packed == [0, 5]


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
    out.mkdir()
    (out / "precious.txt").write_text("old output")
    fail_at_shard(monkeypatch, 1, RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        run_pack(config(tmp_path, corpus, overwrite=True), engine="local")
    assert (out / "precious.txt").read_text() == "old output"
    monkeypatch.undo()
    run_pack(config(tmp_path, corpus, overwrite=True), engine="local")
    assert tree_digest(out) == clean_run


def test_resume_of_a_complete_output_says_so(tmp_path, corpus):
    run_pack(config(tmp_path, corpus), engine="local")
    with pytest.raises(InputError, match="already complete"):
        run_pack(config(tmp_path, corpus), engine="local", resume=True)


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
