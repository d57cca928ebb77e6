"""MDS export (raypack.export.mds, mds_format; ``raypack export --format mds``): every export is
read back by the real library (mosaicml-streaming's StreamingDataset, in a child process:
tests/mds_real.py) and checked sample by sample against the packed chunks; its bytes equal what
streaming's own MDSWriter writes for the same samples; verify catches any changed byte; a failed
export leaves nothing.

The library lives in ``RAYPACK_MDS_READER`` (default ``<venv>/mds-reader``, installed by the
Makefile with --no-deps beside the venv, never into it).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.cli import main
from raypack.errors import InputError
from raypack.export import mds, mds_format
from raypack.export.mds import export_mds, verify_mds, write_part
from raypack.export.mds_format import decode_shard, load_index, write_index
from raypack.outputs import read_packed
from raypack.packed import writer as output
from raypack.rules.core import Chunks, concat_chunks
from raypack.tokenize.corpus import build_tokenized_manifest, part_file_name, save_tokenized_manifest

from helpers import pack, random_corpus, write_shards

READER_DIR = os.environ.get("RAYPACK_MDS_READER", os.path.join(sys.prefix, "mds-reader"))
WORKER = os.path.join(os.path.dirname(__file__), "..", "mds_real.py")


# ----------------------------------------------------------------------------- the real library


class RealMds:
    """One child process running tests/mds_real.py (its torch import is paid once)."""

    def __init__(self) -> None:
        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.proc = subprocess.Popen([sys.executable, WORKER, READER_DIR], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": repo})

    def call(self, **request) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tests/mds_real.py exited with {self.proc.wait()}")
        return json.loads(line)

    def read(self, out_dir, tmp_path) -> dict[str, np.ndarray]:
        npz = str(tmp_path / f"read-{os.path.basename(out_dir)}.npz")
        reply = self.call(op="read", dir=str(out_dir), out=npz)
        assert reply["ok"], reply.get("traceback")
        return dict(np.load(npz))

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def real():
    if not os.path.isdir(os.path.join(READER_DIR, "streaming")):
        pytest.fail(f"mosaicml-streaming is not in {READER_DIR}: run `make` (it installs it there), or set "
                    "RAYPACK_MDS_READER to a directory made by `pip install --no-deps --target DIR` of the "
                    "packages the Makefile lists")
    worker = RealMds()
    yield worker
    worker.close()


# ----------------------------------------------------------------------------- builders


def packed(tmp_path, name="packed", docs=None, cuts=(40, 90), **overrides) -> str:
    """A packed output of a small corpus (C = 8 unless overridden); its path."""
    docs = random_corpus(seed=3, num_docs=150, max_len=30) if docs is None else docs
    shard_dir = write_shards(tmp_path / f"{name}-in", docs, list(cuts))
    values = dict(chunks_per_record_batch=4)
    values.update(overrides)
    pack(tmp_path, shard_dir, name=name, **values)
    return str(tmp_path / name)


def source_chunks(src: str) -> Chunks:
    ds = read_packed(src)
    return concat_chunks(list(ds.pieces(0, len(ds))), ds.context_length, ds.token_dtype)


def assert_matches_source(found: dict[str, np.ndarray], src: str) -> None:
    """The real reader's samples equal the packed chunks: tokens, segments, dense doc ids."""
    ds = read_packed(src)
    expected = source_chunks(src)
    assert found["tokens"].shape == expected.input_ids.shape == (len(ds), ds.context_length)
    assert found["tokens"].dtype == ds.token_dtype
    np.testing.assert_array_equal(found["tokens"], expected.input_ids)
    np.testing.assert_array_equal(found["llmfoundry_tokens"], expected.input_ids.astype(np.int64))
    np.testing.assert_array_equal(found["segment_counts"], np.diff(expected.segment_offsets))
    np.testing.assert_array_equal(found["segment_doc_ids"], expected.segment_doc_ids)
    np.testing.assert_array_equal(found["segment_lengths"], expected.segment_lengths)
    dense = np.repeat(found["segment_doc_ids"], found["segment_lengths"]).reshape(len(ds), -1)
    np.testing.assert_array_equal(dense, np.stack([ds[i]["doc_ids"] for i in range(len(ds))]))


# ----------------------------------------------------------------------------- literal bytes


def literal_chunks() -> Chunks:
    # pack_sequences([[1, 2, 3], [4, 5], [6]], context_length=4): doc ids [[0,0,0,1], [1,2,-1,-1]]
    return Chunks(np.array([[1, 2, 3, 4], [5, 6, 0, 0]], np.uint16), np.array([0, 2, 5]),
                  np.array([0, 1, 1, 2, -1]), np.array([3, 1, 1, 1, 2], np.int32))


def test_literal_shard_bytes(tmp_path):
    (entry,) = write_part(str(tmp_path), 0, [literal_chunks()], context_length=4, token_dtype="uint16",
                          size_limit=None)
    config = json.dumps(mds_format.shard_config(4, "uint16", None), sort_keys=True).encode()
    sample0 = (struct.pack("<II", 1 + 1 + 16, 1 + 1 + 8) + bytes([4, 2]) + struct.pack("<2q", 0, 1)
               + bytes([4, 2]) + struct.pack("<2i", 3, 1) + struct.pack("<4H", 1, 2, 3, 4))
    sample1 = (struct.pack("<II", 1 + 1 + 24, 1 + 1 + 12) + bytes([4, 3]) + struct.pack("<3q", 1, 2, -1)
               + bytes([4, 3]) + struct.pack("<3i", 1, 1, 2) + struct.pack("<4H", 5, 6, 0, 0))
    head = 4 + 4 * 3 + len(config)
    expected = (struct.pack("<I", 2) + struct.pack("<3I", head, head + len(sample0), head + len(sample0) + len(sample1))
                + config + sample0 + sample1)
    assert entry["raw_data"] == {"basename": "shard.00000.00000.mds", "bytes": len(expected), "hashes": {}}
    assert (tmp_path / "shard.00000.00000.mds").read_bytes() == expected
    assert entry["samples"] == 2 and entry["column_names"] == ["segment_doc_ids", "segment_lengths", "tokens"]
    assert entry["column_encodings"] == ["ndarray:int64", "ndarray:int32", "ndarray:uint16:4"]


def test_segment_shape_widths_cross_256(tmp_path):
    """300 one-token documents in a chunk: the segment arrays' shape takes a u16."""
    c = 300
    lens = np.ones(c, np.int32)
    chunks = Chunks(np.arange(2 * c, dtype=np.int32).reshape(2, c), np.array([0, 1, 1 + c]),
                    np.r_[7, np.arange(c)].astype(np.int64), np.r_[c, lens].astype(np.int32))
    (entry,) = write_part(str(tmp_path), 3, [chunks], context_length=c, token_dtype="int32", size_limit=None)
    decoded = decode_shard((tmp_path / "shard.00003.00000.mds").read_bytes(), entry, "x")
    for a, b in zip(decoded, chunks):
        np.testing.assert_array_equal(a, b)
    data = (tmp_path / "shard.00003.00000.mds").read_bytes()
    assert bytes([4, 1]) + struct.pack("<H", c) in data  # ndim 1, u16 shape, 300


# ----------------------------------------------------------------------------- the real reader


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("token_dtype", ["uint16", "int32", "uint32"])
def test_real_reader_sample_i_is_chunk_i(tmp_path, real, strategy, token_dtype):
    src = packed(tmp_path, strategy=strategy, token_dtype=token_dtype)
    ds = read_packed(src)
    assert len(ds.file_items()) >= 3, "several parts (chunk files)"
    chunks = source_chunks(src)
    assert (chunks.segment_doc_ids == -1).any() and np.diff(chunks.segment_offsets).max() > 1  # not vacuous
    out = tmp_path / "mds"
    summary = export_mds(src, str(out), size_limit=400)
    assert summary.num_samples == len(ds) and summary.num_shards > len(ds.file_items())
    assert sorted(os.listdir(out)) == sorted(["index.json"] + [e["raw_data"]["basename"] for e in load_index(str(out))])
    assert_matches_source(real.read(out, tmp_path), src)
    assert verify_mds(str(out), src) == summary


def test_one_shard_per_part_without_size_limit(tmp_path, real):
    src = packed(tmp_path)
    out = tmp_path / "mds"
    summary = export_mds(src, str(out), size_limit=None)
    assert summary.num_shards == len(read_packed(src).file_items()) > 1
    assert_matches_source(real.read(out, tmp_path), src)


def test_bytes_equal_streamings_own_writer(tmp_path, real):
    """All chunks as one part against MDSWriter with the same size limit: the shard files are
    byte-identical and the index entries equal but for the shard names, at size limits around
    where the per-sample and per-shard byte counts decide a boundary."""
    docs = random_corpus(seed=5, num_docs=120, max_len=40) + [[9]] * 700  # one-token documents: > 255 segments
    src = packed(tmp_path, docs=docs, cuts=(), token_dtype="uint16", context_length=300)
    chunks = source_chunks(src)
    assert np.diff(chunks.segment_offsets).max() > 255
    sample_npz = str(tmp_path / "src.npz")
    np.savez(sample_npz, tokens=chunks.input_ids, segment_doc_ids=chunks.segment_doc_ids,
             segment_lengths=chunks.segment_lengths, segment_counts=np.diff(chunks.segment_offsets))
    config = mds_format.shard_config(300, "uint16", None)
    encodings = dict(zip(config["column_names"], config["column_encodings"]))
    sample_sizes = mds_format.encode_chunks(chunks).sizes()
    head = 8 + len(json.dumps(mds_format.shard_config(300, "uint16", 1000), sort_keys=True))  # a 4-digit size_limit
    exact = int(head + sample_sizes[:3].sum() + 3 * 4)  # three samples fill a shard exactly
    assert 1000 < exact < 9999
    for size_limit in (exact - 1, exact, exact + 1, 2000, 10**6):
        ours, theirs = tmp_path / f"ours-{size_limit}", tmp_path / f"theirs-{size_limit}"
        write_index(str(ours), write_part(str(ours), 0, [chunks], context_length=300, token_dtype="uint16",
                                          size_limit=size_limit))
        reply = real.call(op="write", src=sample_npz, dir=str(theirs), size_limit=size_limit, encodings=encodings)
        assert reply["ok"], reply.get("traceback")
        our_index = json.loads((ours / "index.json").read_text())
        their_index = json.loads((theirs / "index.json").read_text())
        assert len(our_index["shards"]) == len(their_index["shards"]) > (size_limit < 10**6)
        for a, b in zip(our_index["shards"], their_index["shards"]):
            assert (ours / a["raw_data"]["basename"]).read_bytes() == (theirs / b["raw_data"]["basename"]).read_bytes()
            a["raw_data"].pop("basename"), b["raw_data"].pop("basename")
            assert a == b
        assert our_index["version"] == their_index["version"] == 2
    assert json.loads((tmp_path / f"ours-{exact}" / "index.json").read_text())["shards"][0]["samples"] == 3
    assert json.loads((tmp_path / f"ours-{exact - 1}" / "index.json").read_text())["shards"][0]["samples"] == 2


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**16), num_docs=st.integers(1, 60), size_limit=st.sampled_from([None, 300, 1000]),
       strategy=st.sampled_from(["concat", "best_fit"]))
def test_own_decoder_roundtrip(tmp_path_factory, seed, num_docs, size_limit, strategy):
    tmp_path = tmp_path_factory.mktemp("rt")
    docs = random_corpus(seed=seed, num_docs=num_docs, max_len=25)
    src = packed(tmp_path, docs=docs, cuts=[num_docs // 2], strategy=strategy)
    out = str(tmp_path / "mds")
    if len(read_packed(src)) == 0:
        assert export_mds(src, out).num_samples == 0
        return
    summary = export_mds(src, out, size_limit=size_limit)
    expected = source_chunks(src)
    decoded = [decode_shard(mds_format.read_shard(out, e), e, e["raw_data"]["basename"]) for e in load_index(out)]
    found = concat_chunks(decoded, 8, expected.input_ids.dtype)
    for a, b in zip(found, expected):
        np.testing.assert_array_equal(a, b)
    assert verify_mds(out, src) == summary


# ----------------------------------------------------------------------------- failure, overwrite


@pytest.mark.parametrize("fail_at", ["fourth shard", "last shard", "index"])
def test_failure_midway_leaves_nothing(tmp_path, real, monkeypatch, fail_at):
    """A commit that fails (on the committer thread, or the index's in this one) leaves an empty
    directory, which the real library refuses to read."""
    src = packed(tmp_path)
    num_shards = export_mds(src, str(tmp_path / "first"), size_limit=400).num_shards
    fail = {"fourth shard": 4, "last shard": num_shards, "index": num_shards + 1}[fail_at]
    out = tmp_path / "mds"
    commits = []
    original = output.AtomicFile.commit

    def failing_commit(self, name=None):
        commits.append(self.path)
        if len(commits) == fail:
            raise OSError("disk full (injected)")
        return original(self, name)

    monkeypatch.setattr(output.AtomicFile, "commit", failing_commit)
    with pytest.raises(OSError, match="injected"):
        export_mds(src, str(out), size_limit=400)
    # the shards published were removed, no temporary file is left, and it stopped soon after
    assert os.listdir(out) == [] and fail <= len(commits) < fail + 10
    reply = real.call(op="read", dir=str(out), out=str(tmp_path / "x.npz"))
    assert not reply["ok"] and "index.json" in reply["error"]


def test_failure_writing_the_index_leaves_nothing(tmp_path, monkeypatch):
    src = packed(tmp_path)
    out = tmp_path / "mds"

    def failing_index(out_dir, entries):
        raise OSError("index write failed (injected)")

    monkeypatch.setattr(mds, "write_index", failing_index)
    with pytest.raises(OSError, match="injected"):
        export_mds(src, str(out), size_limit=400)
    assert os.listdir(out) == []


def test_refuses_existing_export_unless_overwrite(tmp_path, real):
    src = packed(tmp_path)
    out = tmp_path / "mds"
    export_mds(src, str(out), size_limit=300)
    old = set(os.listdir(out))
    with pytest.raises(InputError, match="already holds an MDS export.*overwrite"):
        export_mds(src, str(out))
    summary = export_mds(src, str(out), overwrite=True)
    assert summary.num_shards == len(read_packed(src).file_items()) and set(os.listdir(out)) != old
    assert sorted(os.listdir(out)) == sorted(["index.json"] + [e["raw_data"]["basename"] for e in load_index(str(out))])
    assert_matches_source(real.read(out, tmp_path), src)
    with pytest.raises(InputError, match="is the packed output itself"):
        export_mds(src, src + "/")


def test_token_dtype_cast_and_its_check(tmp_path, real):
    src = packed(tmp_path, token_dtype="int32")
    out = tmp_path / "mds"
    export_mds(src, str(out), token_dtype="uint16")
    found = real.read(out, tmp_path)
    assert found["tokens"].dtype == np.uint16
    np.testing.assert_array_equal(found["tokens"], source_chunks(src).input_ids)
    verify_mds(str(out), src)
    with pytest.raises(InputError, match=r"token id \d+ does not fit int8"):
        export_mds(src, str(tmp_path / "small"), token_dtype="int8")
    assert not os.path.exists(tmp_path / "small" / "index.json")


def test_export_to_a_uri(tmp_path):
    """A non-local filesystem (fsspec's memory://): shards are uploads, the index last; verify reads them back."""
    fsspec = pytest.importorskip("fsspec")
    src = packed(tmp_path)
    out = "memory://mds-export-test/out"
    summary = export_mds(src, out, size_limit=400)
    assert verify_mds(out, src) == summary
    names = sorted(p.rsplit("/", 1)[1] for p in fsspec.filesystem("memory").ls("/mds-export-test/out", detail=False))
    assert names == sorted(["index.json"] + [e["raw_data"]["basename"] for e in load_index(out)])


# ----------------------------------------------------------------------------- verify


def test_verify_catches_every_changed_byte(tmp_path):
    src = packed(tmp_path, docs=[[1, 2, 3], [4, 5], [6]] * 3, cuts=())
    out = tmp_path / "mds"
    export_mds(src, str(out), size_limit=None)
    verify_mds(str(out), src)
    shards = sorted(glob.glob(str(out / "shard.*.mds")))
    missed, checked = [], 0
    for shard in shards:
        original = open(shard, "rb").read()
        for i in range(len(original)):
            damaged = bytearray(original)
            damaged[i] ^= 0x01  # the lowest bit: the smallest change a byte can take
            with open(shard, "wb") as f:
                f.write(damaged)
            checked += 1
            try:
                verify_mds(str(out), src)
                missed.append((shard, i))
            except InputError:
                pass
        with open(shard, "wb") as f:
            f.write(original)
    assert missed == [] and checked > 300
    with open(shards[0], "ab") as f:
        f.write(b"\0")
    with pytest.raises(InputError, match="bytes, index.json says"):
        verify_mds(str(out), src)


def test_verify_catches_a_wrong_index(tmp_path):
    src = packed(tmp_path)
    out = tmp_path / "mds"
    export_mds(src, str(out), size_limit=400)
    index = json.loads((out / "index.json").read_text())
    cases = {
        "drops the last shard": lambda ix: ix["shards"].pop(),
        "reorders shards": lambda ix: ix["shards"].insert(0, ix["shards"].pop(1)),
        "names a path": lambda ix: ix["shards"][0]["raw_data"].update(basename="../shard.00000.00000.mds"),
        "claims a size limit": lambda ix: ix["shards"][0].update(size_limit=123),
    }
    for what, damage in cases.items():
        bad = json.loads(json.dumps(index))
        damage(bad)
        (out / "index.json").write_text(json.dumps(bad))
        with pytest.raises(InputError):
            verify_mds(str(out), src)
            pytest.fail(what)
    (out / "index.json").unlink()
    with pytest.raises(InputError, match="holds no index.json"):
        verify_mds(str(out), src)


def test_write_index_merges_parts_in_order(tmp_path, real):
    """Parts written separately (as parallel tasks would), then one index: sample i is chunk i."""
    src = packed(tmp_path)
    ds = read_packed(src)
    out = str(tmp_path / "mds")
    parts = []
    for part in reversed(range(len(ds.file_items()))):  # any order of completion
        parts.append((part, mds.export_part(read_packed(src), out, part, size_limit=300)))
    write_index(out, [e for _, entries in sorted(parts) for e in entries])
    assert_matches_source(real.read(tmp_path / "mds", tmp_path), src)


# ----------------------------------------------------------------------------- raypack export --format mds


def cli_error(capsys, argv) -> str:
    """``main(argv)`` exits 2 with one line on stderr; that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("raypack: error: ")
    return err


def shard_files(out) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in sorted(os.listdir(out))}


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_cli_export_is_read_back_by_the_real_library(tmp_path, real, capsys, strategy):
    src = packed(tmp_path, strategy=strategy)
    parts = len(read_packed(src).file_items())
    assert parts >= 3
    out = tmp_path / "mds"
    assert main(["export", src, "--format", "mds", "--output", str(out), "--verify"]) == 0
    printed = capsys.readouterr().out
    assert f"parts     {parts:>14,}" in printed and f"verified {out} against {src}" in printed
    assert_matches_source(real.read(out, tmp_path), src)
    assert sorted(os.listdir(out)) == sorted(["index.json"] + [e["raw_data"]["basename"] for e in load_index(str(out))])
    assert main(["export", src, "--format", "mds", "--output", str(out), "--verify-only"]) == 0


def test_cli_export_equals_export_mds_for_any_number_of_workers(tmp_path, monkeypatch):
    """Parts in one process or two (spawned): the same files, byte for byte, as export_mds writes,
    with several shards per part (the size limit travels to the pool with the exporter)."""
    src = packed(tmp_path)
    monkeypatch.setattr(mds.MdsExporter, "size_limit", 400)
    export_mds(src, str(tmp_path / "api"), size_limit=400)
    expected = shard_files(tmp_path / "api")
    assert len(expected) > len(read_packed(src).file_items()) + 1
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        assert main(["export", src, "--format", "mds", "--output", str(out), "--workers", workers]) == 0
        assert shard_files(out) == expected


def test_cli_token_dtype(tmp_path, real, capsys):
    src = packed(tmp_path, token_dtype="int32")
    out = tmp_path / "mds"
    assert main(["export", src, "--format", "mds", "--output", str(out), "--token-dtype", "uint16", "--verify"]) == 0
    found = real.read(out, tmp_path)
    assert found["tokens"].dtype == np.uint16
    np.testing.assert_array_equal(found["tokens"], source_chunks(src).input_ids)
    capsys.readouterr()
    assert main(["export", src, "--format", "mds", "--output", str(out), "--verify-only"]) == 0  # its own dtype
    assert main(["export", src, "--format", "mds", "--output", str(out), "--verify-only", "--token-dtype",
                 "int32"]) == 1
    assert "token dtype uint16, expected int32" in capsys.readouterr().err
    err = cli_error(capsys, ["export", src, "--format", "mds", "--output", str(tmp_path / "small"),
                             "--token-dtype", "int8"])
    assert re.search(r"token id \d+ does not fit int8", err)
    assert not os.path.exists(tmp_path / "small" / "index.json")


def test_cli_verify_only_finds_a_flipped_byte(tmp_path, capsys):
    src = packed(tmp_path)
    out = tmp_path / "mds"
    argv = ["export", src, "--format", "mds", "--output", str(out)]
    assert main(argv) == 0
    shard = out / load_index(str(out))[1]["raw_data"]["basename"]
    data = bytearray(shard.read_bytes())
    data[-3] ^= 1  # a token of the shard's last sample
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main([*argv, "--verify-only"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("raypack: verify failed: ") and shard.name in err and "differs from chunk" in err
    (out / "index.json").unlink()
    assert "holds no index.json" in cli_error(capsys, [*argv, "--verify-only"])


def write_tokenized_corpus(root) -> str:
    """A one-part tokenized corpus (raypack tokenize's layout and manifest)."""
    out = os.path.join(root, "tokens")
    os.makedirs(out)
    name = part_file_name(0)
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3], [4]], pa.list_(pa.uint16()))}), os.path.join(out, name))
    data = open(os.path.join(out, name), "rb").read()
    shard = {"path": name, "num_docs": 2, "num_tokens": 4, "num_bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest(), "source": {}}
    save_tokenized_manifest(out, build_tokenized_manifest([shard], "uint16", {"kind": "test"}, {}))
    return out


def test_cli_refuses_a_tokenized_corpus_naming_the_fix(tmp_path, capsys):
    src = write_tokenized_corpus(tmp_path)
    err = cli_error(capsys, ["export", src, "--format", "mds", "--output", str(tmp_path / "mds")])
    assert "is a tokenized output; the mds format exports packed sources: pack it first" in err
    assert not os.path.exists(tmp_path / "mds")


def test_cli_existing_export_needs_overwrite(tmp_path, real, capsys, monkeypatch):
    src = packed(tmp_path)
    out = tmp_path / "mds"
    monkeypatch.setattr(mds.MdsExporter, "size_limit", 300)
    argv = ["export", src, "--format", "mds", "--output", str(out)]
    assert main(argv) == 0
    before = shard_files(out)
    assert f"{out}/index.json exists; pass --overwrite" in cli_error(capsys, argv)
    assert shard_files(out) == before
    monkeypatch.setattr(mds.MdsExporter, "size_limit", mds.DEFAULT_SIZE_LIMIT)  # fewer shards: the old ones go
    assert main([*argv, "--overwrite", "--workers", "2"]) == 0
    names = [e["raw_data"]["basename"] for e in load_index(str(out))]
    assert len(names) == len(read_packed(src).file_items()) < len(before) - 1
    assert sorted(os.listdir(out)) == sorted(["index.json", *names])
    assert_matches_source(real.read(out, tmp_path), src)
    assert "is the packed output itself" in cli_error(capsys, ["export", src, "--format", "mds", "--output", src,
                                                               "--overwrite"])


@pytest.mark.parametrize("fail_at", ["third part", "index"])
def test_cli_failure_removes_every_part_written(tmp_path, capsys, monkeypatch, fail_at):
    """A part that fails after earlier parts published their shards, or the index: nothing is left."""
    src = packed(tmp_path)
    out = tmp_path / "mds"
    original = mds.PartWriter.write

    def failing_write(self, chunks):
        if self.part == 2:
            raise OSError("injected")
        return original(self, chunks)

    def failing_index(out_dir, entries):
        raise OSError("injected")

    if fail_at == "index":
        monkeypatch.setattr(mds, "write_index", failing_index)
    else:
        monkeypatch.setattr(mds.PartWriter, "write", failing_write)
    capsys.readouterr()
    assert main(["export", src, "--format", "mds", "--output", str(out)]) == 1  # a storage failure: one line
    err = capsys.readouterr().err
    assert "injected" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()  # its shards, and the directory the run made for them


def test_cli_export_to_a_uri(tmp_path, capsys):
    fsspec = pytest.importorskip("fsspec")
    src = packed(tmp_path)
    out = "memory://mds-cli-test/out"
    assert main(["export", src, "--format", "mds", "--output", out, "--verify"]) == 0
    assert f"verified {out}" in capsys.readouterr().out
    names = sorted(p.rsplit("/", 1)[1] for p in fsspec.filesystem("memory").ls("/mds-cli-test/out", detail=False))
    assert names == sorted(["index.json"] + [e["raw_data"]["basename"] for e in load_index(out)])
    assert "index.json exists; pass --overwrite" in cli_error(capsys, ["export", src, "--format", "mds",
                                                                       "--output", out])


def test_the_batching_recipe_of_docs_mds_runs_on_the_real_reader(tmp_path, real):
    """docs/MDS.md's DataLoader recipe, run as written in the real library's process: its batch
    equals collate_packed over the packed output's chunks (torch's default collate cannot stack
    the ragged segment columns)."""
    import re

    from raypack.torch_data import collate_packed

    src = packed(tmp_path, context_length=16)
    export_mds(src, str(tmp_path / "mds"))
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "MDS.md")).read()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "DataLoader" in b]
    npz = str(tmp_path / "batch.npz")
    reply = real.call(op="exec", code=code, globals={"MDS_DIR": str(tmp_path / "mds")}, out=npz)
    assert reply["ok"], reply.get("traceback")
    found = dict(np.load(npz))
    ds = read_packed(src)
    expected = collate_packed([ds[i] for i in range(8)], attention="varlen")
    assert set(found) >= {"input_ids", "labels", "cu_seqlens"}
    for key in found:
        np.testing.assert_array_equal(found[key], np.asarray(expected[key]), err_msg=key)


@pytest.mark.parametrize("output", ["mds", "new/deeper/mds"])
def test_a_full_disk_leaves_no_directory_it_made(tmp_path, monkeypatch, capsys, output):
    """It left the (empty) output directory, and the folders made for it."""
    import errno

    src = packed(tmp_path)
    before = sorted(os.listdir(tmp_path))

    def full(self, part, batches):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / output / "shard.00000.mds"))

    monkeypatch.setattr(mds.MdsExporter, "write_part", full)
    assert main(["export", src, "--format", "mds", "--output", str(tmp_path / output)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "nothing was published" in err[0], err
    assert sorted(os.listdir(tmp_path)) == before


def test_an_existing_empty_output_directory_stays_after_a_failure(tmp_path, monkeypatch, capsys):
    import errno

    src = packed(tmp_path)
    (tmp_path / "mds").mkdir()
    monkeypatch.setattr(mds.MdsExporter, "write_part",
                        lambda self, part, batches: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    assert main(["export", src, "--format", "mds", "--output", str(tmp_path / "mds")]) == 2
    assert (tmp_path / "mds").is_dir()


def test_an_output_holding_other_files_or_inside_a_raypack_output_is_refused(tmp_path, capsys):
    """A new user's trial: an export went into a directory of notes, into the input directory and into another
    packed output (whose own --overwrite then refused the files raypack had not written there)."""
    src = packed(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "notes.txt").write_text("important")
    err = cli_error(capsys, ["export", src, "--format", "mds", "--output", str(tmp_path / "notes")])
    assert err.endswith(f"{tmp_path / 'notes'} holds 'notes.txt', which no MDS export wrote; give an empty or new "
                        "directory for the export"), err
    shutil.copytree(src, tmp_path / "other")
    for inside in ("other", "other/mds"):
        err = cli_error(capsys, ["export", src, "--format", "mds", "--output", str(tmp_path / inside)])
        assert err.endswith(f"is inside the raypack output {tmp_path / 'other'} (it holds manifest.json); give a "
                            "directory of its own for the export"), err
    assert sorted(os.listdir(tmp_path / "notes")) == ["notes.txt"] and not (tmp_path / "other" / "mds").exists()
    assert main(["export", src, "--format", "mds", "--output", str(tmp_path / "empty")]) == 0  # new: fine


def test_verify_only_without_token_dtype_takes_the_exports_own(tmp_path):
    """docs/MDS.md's third line (--verify-only, no --token-dtype) said a correct uint16 export was damaged."""
    from raypack.export.base import ExportMismatch
    from raypack.export.job import run_export, verify_export

    src = packed(tmp_path)
    run_export(src, "mds", str(tmp_path / "mds"), token_dtype="uint16")
    assert verify_export(src, "mds", str(tmp_path / "mds"))[-1].split() == ["dtype", "uint16"]
    with pytest.raises(ExportMismatch, match="token dtype uint16, expected int32"):
        verify_export(src, "mds", str(tmp_path / "mds"), token_dtype="int32")


def test_a_source_that_is_no_output_says_what_it_is(tmp_path, capsys):
    """One line for every bad source ("holds no manifest.json: give ... , finished"): a new user's trial asked
    for what each is, and an interrupted run's kept work named as verify and stats name it."""
    from raypack.pack.publish import staging_dir

    missing, a_file = str(tmp_path / "nothing"), str(tmp_path / "f.parquet")
    (tmp_path / "f.parquet").write_bytes(b"x")
    argv = ["--format", "mds", "--output", str(tmp_path / "mds")]
    assert cli_error(capsys, ["export", missing, *argv]).endswith(f"{missing} does not exist; give the directory of a "
                                                                  "finished tokenized corpus (raypack tokenize) or "
                                                                  "packed output (raypack pack)")
    assert f"{a_file} is a file, not an output directory" in cli_error(capsys, ["export", a_file, *argv])
    os.makedirs(os.path.join(staging_dir(str(tmp_path / "unfinished")), "_results"))
    with open(os.path.join(staging_dir(str(tmp_path / "unfinished")), "_results", "task-000000.json"), "w") as f:
        f.write("{}")
    assert cli_error(capsys, ["export", str(tmp_path / "unfinished"), *argv]).endswith(
        f"does not exist; an unfinished run's work is in {staging_dir(str(tmp_path / 'unfinished'))}: finish it "
        "with the run's own command and --resume, then export")
