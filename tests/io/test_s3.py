"""Object storage for real: a moto S3 server on 127.0.0.1 (tests/s3_server.py), reached through
pyarrow's S3 filesystem with credentials and endpoint from the standard AWS variables.

A sharded corpus (Parquet, JSONL and Arrow shards) is packed from s3:// to s3:// with both
engines and must equal a local-to-local run byte for byte; read_packed and verify read it
back from s3://; missing buckets, objects and globs give clear errors; an interrupted run
leaves no manifest and --resume finishes it byte-identically. Objects are listed and read
with boto3, independently of raypack's filesystem layer. The S3 tests are skipped, with the
reason, only when moto[server] or boto3 is not installed. Last, a scheme only fsspec knows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from raypack.errors import InputError, NotAnOutput
from raypack.inputs.shards import discover_shards
from raypack.io.fs import clear_filesystem_cache, resolve_filesystem
from raypack.outputs import read_packed
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.pack.resume import RESULTS_DIR
from raypack.packed.writer import ChunkFileWriter, chunk_schema
from raypack.rules.core import Chunks
from raypack.sample import write_sample_corpus
from raypack.verify import verify_output

from packing_faults import fail_at_shard
from s3_server import ENV, moto_server, moto_server_process, s3_environment

pytestmark = pytest.mark.slow  # a real S3 server in a subprocess, and Ray

BUCKET = "raypack-test"
SETTINGS = dict(context_length=16, pad_token=0, read_batch_size=7, chunks_per_record_batch=4)


class S3:
    """The running server: its endpoint, a boto3 client, and where the corpus is in the bucket."""

    def __init__(self, endpoint: str) -> None:
        import boto3

        self.endpoint = endpoint
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        self.corpus = f"s3://{BUCKET}/corpus"

    def objects(self, prefix: str) -> dict[str, bytes]:
        """Every object under ``s3://BUCKET/<prefix>/``: name relative to the prefix -> bytes."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/")
        keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        return {k[len(prefix) + 1:]: self.client.get_object(Bucket=BUCKET, Key=k)["Body"].read()
                for k in keys if not k.endswith("/")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """Parquet, JSONL and Arrow shards, in that order (directories a, b, c)."""
    root = tmp_path_factory.mktemp("s3corpus")
    write_sample_corpus(str(root / "a"), num_shards=3, docs_per_shard=40, mean_doc_len=20, seed=3)
    write_sample_corpus(str(root / "b"), num_shards=2, docs_per_shard=30, mean_doc_len=9, seed=4, fmt="jsonl")
    write_sample_corpus(str(root / "c"), num_shards=2, docs_per_shard=25, mean_doc_len=30, seed=5, fmt="arrow")
    return str(root)


@pytest.fixture(scope="module")
def s3(corpus):
    """A moto server on 127.0.0.1 with the corpus uploaded; the AWS variables point at it."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[test]')")
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install -e '.[test]')")
    root = corpus
    with moto_server() as endpoint, s3_environment(endpoint):
        clear_filesystem_cache()
        server = S3(endpoint)
        server.client.create_bucket(Bucket=BUCKET)
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                server.client.upload_file(path, BUCKET, f"corpus/{os.path.relpath(path, root)}")
        yield server
        clear_filesystem_cache()


@pytest.fixture(scope="module")
def local_run(corpus, tmp_path_factory):
    """The reference: the same corpus packed local to local, in one process."""
    out = str(tmp_path_factory.mktemp("local") / "out")
    run_pack(make_config(dict(inputs=[corpus], output=out, **SETTINGS)), engine="local")
    files = {name: Path(out, name).read_bytes() for name in os.listdir(out)}
    return out, files, json.loads(files["manifest.json"])


def s3_config(s3, name: str, **overrides):
    return make_config({**dict(inputs=[s3.corpus], output=f"s3://{BUCKET}/{name}", **SETTINGS), **overrides})


def assert_equals_local(s3, name: str, local_run) -> dict:
    """Every object under the prefix: the local run's chunk files, byte for byte, and a manifest."""
    _, local_files, local_manifest = local_run
    objects = s3.objects(name)
    assert sorted(objects) == sorted(local_files)  # nothing else: no records, no temporary objects
    chunk_names = [n for n in local_files if n.startswith("chunks-")]
    assert len(chunk_names) >= 7, "vacuous: the corpus should give several chunk files"
    for chunk_name in chunk_names:
        assert objects[chunk_name] == local_files[chunk_name], chunk_name
    manifest = json.loads(objects["manifest.json"])
    for key in ("content_sha256", "files", "counts", "token_dtype", "context_length"):
        assert manifest[key] == local_manifest[key], key
    assert [s["path"] for s in manifest["shards"]] == discover_shards([s3.corpus])
    without_path = lambda shards: [{k: v for k, v in s.items() if k != "path"} for s in shards]  # noqa: E731
    assert without_path(manifest["shards"]) == without_path(local_manifest["shards"])
    return manifest


# ----------------------------------------------------------------------------- s3 -> s3


def test_s3_to_s3_equals_the_local_run(s3, local_run):
    summary = run_pack(s3_config(s3, "local-engine"), engine="local")
    manifest = assert_equals_local(s3, "local-engine", local_run)
    assert summary.manifest == manifest
    assert {s["format"] for s in manifest["shards"]} == {"parquet", "jsonl", "arrow"}


def test_s3_to_s3_with_ray_equals_the_local_run(s3, local_run, tmp_path):
    """The CLI with the Ray engine, in its own process: its embedded Ray starts with the AWS
    variables in its environment, as a user's would (Ray workers inherit the environment Ray
    was started with, so the test session's shared Ray cannot be used here)."""
    config = tmp_path / "s3.toml"
    config.write_text("".join(f"{k} = {v}\n" for k, v in SETTINGS.items()))
    ray_tmp = tempfile.mkdtemp(prefix="rp-s3-", dir="/tmp")  # Ray's socket paths must stay short
    env = dict(os.environ, RAY_TMPDIR=ray_tmp, RAY_DEDUP_LOGS="0")
    done = subprocess.run(
        [sys.executable, "-m", "raypack.cli", "pack", "--config", str(config), "--input", s3.corpus,
         "--output", f"s3://{BUCKET}/ray-engine", "--workers", "2", "--read-batch-size", "3"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "packed s3://" in done.stdout
    assert_equals_local(s3, "ray-engine", local_run)


def test_read_packed_and_verify_over_s3(s3, local_run):
    run_pack(s3_config(s3, "read"), engine="local")
    remote, local = read_packed(f"s3://{BUCKET}/read"), read_packed(local_run[0])
    assert len(remote) == len(local) > 0
    for key in ("input_ids", "doc_ids"):
        np.testing.assert_array_equal(remote.get_batch(0, len(remote))[key], local.get_batch(0, len(local))[key])
    np.testing.assert_array_equal(remote[-1]["doc_ids"], local[-1]["doc_ids"])
    report = verify_output(f"s3://{BUCKET}/read")  # the manifest's shards are s3:// URIs: compared too
    assert report.inputs_compared and report.num_shards == 7
    assert report.content_sha256 == local_run[2]["content_sha256"]


def test_a_mix_on_s3_over_an_s3_and_a_local_source(s3, local_run):
    """raypack mix publishes a manifest alone under the prefix, records the S3 source by URI and the
    local one by absolute path, reads back the sources' chunks and verifies."""
    from raypack.mix.dataset import load_mix_config, run_mix

    run_pack(s3_config(s3, "mix-src"), engine="local")
    sources = [(f"s3://{BUCKET}/mix-src", 2), (local_run[0], 1)]
    run_mix(load_mix_config(None, sources=sources, output=f"s3://{BUCKET}/mix", num_chunks=30, seed=1))
    objects = s3.objects("mix")
    assert sorted(objects) == ["manifest.json"]
    recorded = [s["path"] for s in json.loads(objects["manifest.json"])["sources"]]
    assert recorded == [f"s3://{BUCKET}/mix-src", os.path.abspath(local_run[0])]
    remote, local = read_packed(f"s3://{BUCKET}/mix"), read_packed(local_run[0])
    batch = remote.get_batch(0, 30)
    assert set(batch["source"].tolist()) == {0, 1}
    for i in range(30):   # the two sources hold the same chunks
        np.testing.assert_array_equal(batch["input_ids"][i], local[remote.order.locate(i)[1]]["input_ids"])
    assert verify_output(f"s3://{BUCKET}/mix").lines()[0] == f"verified mix s3://{BUCKET}/mix"


def test_best_fit_over_s3_equals_the_local_run(s3, corpus, tmp_path):
    """best_fit's counting pass and packers read the shards through the store too."""
    best_fit = dict(strategy="best_fit", best_fit_window=5)
    local = str(tmp_path / "out")
    run_pack(make_config(dict(inputs=[corpus], output=local, **SETTINGS, **best_fit)), engine="local")
    run_pack(s3_config(s3, "best-fit", **best_fit), engine="local")
    objects = s3.objects("best-fit")
    local_names = sorted(os.listdir(local))
    assert sorted(objects) == local_names and len(local_names) >= 3
    for name in local_names:
        if name.startswith("chunks-"):
            assert objects[name] == Path(local, name).read_bytes(), name
    local_manifest = json.load(open(Path(local, "manifest.json")))
    assert json.loads(objects["manifest.json"])["content_sha256"] == local_manifest["content_sha256"]
    report = verify_output(f"s3://{BUCKET}/best-fit")
    assert report.inputs_compared and report.strategy == "best_fit"


# ----------------------------------------------------------------------------- errors


def test_missing_bucket_is_named(s3, tmp_path):
    with pytest.raises(InputError, match="bucket 'no-such-bucket' does not exist.*input s3://no-such-bucket/corpus"):
        run_pack(s3_config(s3, "x", inputs=["s3://no-such-bucket/corpus"]), engine="local")
    with pytest.raises(InputError, match="bucket 'no-such-bucket' does not exist.*input s3://no-such-bucket/c/"):
        discover_shards(["s3://no-such-bucket/c/*.parquet"])
    with pytest.raises(InputError, match="bucket 'no-such-bucket' does not exist.*output s3://no-such-bucket/out"):
        run_pack(s3_config(s3, "x", output="s3://no-such-bucket/out"), engine="local")
    with pytest.raises(InputError, match="bucket 'no-such-bucket' does not exist"):
        read_packed("s3://no-such-bucket/out")
    with pytest.raises(NotAnOutput, match="bucket 'no-such-bucket' does not exist"):  # exit 2, not a failed audit
        verify_output("s3://no-such-bucket/out")


def test_missing_object_and_empty_glob_are_named(s3):
    missing = f"{s3.corpus}/a/shard-00099.parquet"
    with pytest.raises(InputError, match=f"input path not found: {missing}"):
        run_pack(s3_config(s3, "x", inputs=[missing]), engine="local")
    with pytest.raises(InputError, match=f"input path not found: {s3.corpus}/nothing-here"):
        discover_shards([f"{s3.corpus}/nothing-here"])
    with pytest.raises(InputError, match=r"glob .*/a/\*\.feather matched no shard files"):
        run_pack(s3_config(s3, "x", inputs=[f"{s3.corpus}/a/*.feather"]), engine="local")
    with pytest.raises(InputError, match="glob .*nowhere.* matched nothing: its base directory .*nowhere does not "
                                         "exist"):
        discover_shards([f"{s3.corpus}/nowhere/*.parquet"])
    with pytest.raises(InputError, match="no such output directory"):
        read_packed(f"s3://{BUCKET}/never-written")
    assert not s3.objects("x")  # errors found while planning write nothing


def test_output_refused_inside_the_inputs_and_at_a_bucket_root(s3):
    with pytest.raises(InputError, match="lies inside the input "):
        run_pack(s3_config(s3, "corpus/a/out"), engine="local")
    with pytest.raises(InputError, match="root of a bucket"):
        run_pack(s3_config(s3, "", output=f"s3://{BUCKET}"), engine="local")
    s3.client.put_object(Bucket=BUCKET, Key="an-object", Body=b"x")
    with pytest.raises(InputError, match="exists and is an object, not a prefix"):
        run_pack(s3_config(s3, "an-object"), engine="local")


def test_one_filesystem_per_bucket(s3):
    """Planning many shards of one bucket makes (and resolves the region of) one filesystem."""
    first, _ = resolve_filesystem(f"{s3.corpus}/a/shard-00000.parquet")
    assert all(resolve_filesystem(p)[0] is first for p in discover_shards([s3.corpus]))
    assert resolve_filesystem(f"s3://{BUCKET}-other/x")[0] is not first


# ----------------------------------------------------------------------------- interruption, resume, overwrite


def test_interrupted_run_leaves_no_manifest_and_resume_finishes_it(s3, local_run, monkeypatch):
    fail_at_shard(monkeypatch, 4, RuntimeError("worker lost"))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_pack(s3_config(s3, "interrupted"), engine="local")
    left = s3.objects("interrupted")
    assert "manifest.json" not in left
    assert any(n.startswith(f"{RESULTS_DIR}/") for n in left) and any(n.startswith("chunks-") for n in left)
    with pytest.raises(InputError, match="incomplete: no manifest.json"):
        read_packed(f"s3://{BUCKET}/interrupted")
    monkeypatch.undo()

    with pytest.raises(InputError, match="did not finish.*--resume.*--overwrite"):
        run_pack(s3_config(s3, "interrupted"), engine="local")
    packed = fail_at_shard(monkeypatch, -1, RuntimeError("unused"))
    run_pack(s3_config(s3, "interrupted"), engine="local", resume=True)
    assert packed == [4, 5, 6]  # shards 0-3 were kept, verified
    assert_equals_local(s3, "interrupted", local_run)
    with pytest.raises(InputError, match="already complete"):
        run_pack(s3_config(s3, "interrupted"), engine="local", resume=True)


def test_bad_input_while_packing_leaves_nothing(s3, monkeypatch):
    fail_at_shard(monkeypatch, 2, InputError("shard x row 3: token -1 is negative"))
    with pytest.raises(InputError, match="negative"):
        run_pack(s3_config(s3, "bad"), engine="local")
    assert s3.objects("bad") == {}


def test_overwrite_replaces_the_old_output(s3, local_run, monkeypatch):
    s3.client.put_object(Bucket=BUCKET, Key="over/notes.txt", Body=b"not raypack's")
    for overwrite in (False, True):  # an output is replaced whole: a prefix holding other objects is refused
        with pytest.raises(InputError, match="holds 'notes.txt', which raypack did not write"):
            run_pack(s3_config(s3, "over", overwrite=overwrite), engine="local")
    assert s3.objects("over") == {"notes.txt": b"not raypack's"}
    s3.client.delete_object(Bucket=BUCKET, Key="over/notes.txt")
    run_pack(s3_config(s3, "over", context_length=32), engine="local")  # a different old output
    with pytest.raises(InputError, match="not empty.*--overwrite"):
        run_pack(s3_config(s3, "over"), engine="local")

    fail_at_shard(monkeypatch, 1, RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        run_pack(s3_config(s3, "over", overwrite=True), engine="local")
    assert "manifest.json" not in s3.objects("over")  # the old output stopped being readable first
    monkeypatch.undo()
    run_pack(s3_config(s3, "over", overwrite=True), engine="local")
    assert_equals_local(s3, "over", local_run)  # old objects the new manifest does not list are gone


def test_a_reader_open_during_an_overwrite_is_told_the_output_was_replaced(s3, local_run):
    """An object store reads a chunk file range by range: one the --overwrite deleted after the reader opened it
    said "the output is damaged; rerun the job" (an operator's trial). The reader never reads the new bytes."""
    run_pack(s3_config(s3, "reading", context_length=32), engine="local")
    reader = read_packed(f"s3://{BUCKET}/reading")
    first = reader.get_batch(0, 1)["input_ids"]  # opens the first chunk file, decodes its first record batch
    run_pack(s3_config(s3, "reading", overwrite=True), engine="local")  # context 16: other files, other bytes
    with pytest.raises(InputError, match=r"chunks-000000000000-[0-9a-f]{16}\.arrow: listed in the manifest but "
                                         r"missing since it was opened; the output was replaced or damaged"):
        reader.get_batch(4, 5)  # the same file's next record batch (4 chunks a batch)
    assert first.shape == (1, 32)


def test_a_failed_chunk_upload_leaves_no_object(s3):
    """pyarrow completes an upload when its stream is closed or dropped: abort must delete it."""
    chunks = Chunks(np.arange(32, dtype=np.int32).reshape(8, 4), np.arange(9, dtype=np.int64),
                    np.arange(8, dtype=np.int64), np.full(8, 4, np.int32))
    writer = ChunkFileWriter(f"s3://{BUCKET}/aborted", 0, chunk_schema(4, pa.int32(), 0), 2)
    writer.write(chunks)  # four record batches: the upload has started
    writer.abort()
    assert s3.objects("aborted") == {}
    never_written = ChunkFileWriter(f"s3://{BUCKET}/aborted", 0, chunk_schema(4, pa.int32(), 0), 2)
    never_written.abort()  # opened no upload, so deletes nothing (the name may be another shard's)
    assert s3.objects("aborted") == {}


# ----------------------------------------------------------------------------- any fsspec filesystem


def test_an_fsspec_filesystem_works_like_an_object_store(corpus, local_run):
    """A scheme pyarrow does not know (fsspec's in-process memory://) goes through fsspec."""
    pytest.importorskip("fsspec")
    out = f"memory://raypack-test-{uuid.uuid4().hex}/out"
    summary = run_pack(make_config(dict(inputs=[corpus], output=out, **SETTINGS)), engine="local")
    assert summary.manifest["content_sha256"] == local_run[2]["content_sha256"]
    np.testing.assert_array_equal(read_packed(out).get_batch(0, 5)["input_ids"],
                                  read_packed(local_run[0]).get_batch(0, 5)["input_ids"])
    assert verify_output(out).inputs_compared


# ----------------------------------------------------------------------------- issue 12 on a store


def test_s3_resume_after_inputs_changed_holds_exactly_the_manifest(s3, monkeypatch):
    """A crash, then a resume over fewer shards: every object of the old layout is gone."""
    fail_at_shard(monkeypatch, 4, RuntimeError("crash"))
    with pytest.raises(RuntimeError):
        run_pack(s3_config(s3, "changed"), engine="local")
    monkeypatch.undo()
    fewer = [f"{s3.corpus}/a", f"{s3.corpus}/c"]
    run_pack(s3_config(s3, "changed", inputs=fewer), engine="local", resume=True)
    objects = s3.objects("changed")
    manifest = json.loads(objects["manifest.json"])
    assert sorted(objects) == sorted([f["path"] for f in manifest["files"]] + ["manifest.json"])
    run_pack(s3_config(s3, "changed-clean", inputs=fewer), engine="local")
    assert s3.objects("changed-clean") == objects


def test_s3_lock_object_refuses_a_live_owner_and_takes_over_a_dead_one(s3):
    from raypack.io.lock import ObjectStoreLock

    key = f"locked/{ObjectStoreLock.NAME}"
    s3.client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({"host": "elsewhere", "pid": 1, "started": "x"}))
    with pytest.raises(InputError, match=rf"being written by another raypack run \(pid 1 on elsewhere.*delete "
                                         rf"{BUCKET}/{key}"):
        run_pack(s3_config(s3, "locked"), engine="local")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    owner = {"host": socket.gethostname(), "pid": int(dead.stdout), "started": "x"}
    s3.client.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(owner))
    run_pack(s3_config(s3, "locked"), engine="local")
    objects = s3.objects("locked")
    assert ObjectStoreLock.NAME not in objects and "manifest.json" in objects
    assert not [n for n in objects if n.startswith(".tmp-")]


# ----------------------------------------------------------------------------- raypack export on a store


def test_export_megatron_s3_to_s3_equals_the_local_export(s3, local_run, tmp_path):
    """A packed output on S3 exported to an S3 prefix: exactly PREFIX.bin and PREFIX.idx appear (the
    part objects are gone), byte-identical to the local export of the local run; --verify passes."""
    from raypack.export.job import run_export

    run_pack(s3_config(s3, "exp-src"), engine="local")
    run_export(local_run[0], "megatron", str(tmp_path / "ds"))
    run_export(f"s3://{BUCKET}/exp-src", "megatron", f"s3://{BUCKET}/exp/ds", verify=True)
    objects = s3.objects("exp")
    assert sorted(objects) == ["ds.bin", "ds.idx"]
    assert objects["ds.bin"] == (tmp_path / "ds.bin").read_bytes()
    assert objects["ds.idx"] == (tmp_path / "ds.idx").read_bytes()
    with pytest.raises(InputError, match="ds.bin exists; pass --overwrite"):
        run_export(f"s3://{BUCKET}/exp-src", "megatron", f"s3://{BUCKET}/exp/ds")


def test_export_mds_s3_to_s3_equals_the_local_export(s3, local_run, tmp_path):
    """A packed output on S3 exported as MDS to an S3 prefix (this module's server): the objects
    are the local export's files of the local run, byte for byte (that export is read back by
    the real library in test_export_mds.py); verify reads the shards from the bucket."""
    from raypack.export.mds import export_mds, verify_mds
    from raypack.export.mds_format import load_index

    run_pack(s3_config(s3, "mds-src"), engine="local")
    export_mds(local_run[0], str(tmp_path / "mds"), size_limit=4000)
    summary = export_mds(f"s3://{BUCKET}/mds-src", f"s3://{BUCKET}/mds", size_limit=4000)
    assert verify_mds(f"s3://{BUCKET}/mds", f"s3://{BUCKET}/mds-src") == summary
    objects = s3.objects("mds")
    local = {name: (tmp_path / "mds" / name).read_bytes() for name in os.listdir(tmp_path / "mds")}
    assert len(load_index(f"s3://{BUCKET}/mds")) > 1 and objects == local


def test_sigterm_while_the_store_is_frozen_ends_the_run_within_seconds_and_resume_finishes_it(tmp_path):
    """An S3 server that stops answering mid-run (SIGSTOP: sockets open, no reply): a SIGTERM took 590 s to end
    the run (an operator's trial), its uploads and the lock's deletion each waiting out the SDK's timeouts and
    retries. Now every wait of a stopped command shares one 10 s deadline: exit 143 with its one line. Once the
    server answers again, the printed --resume finishes the output as a clean run writes it."""
    import signal
    import time

    import pyarrow.fs as pafs

    from helpers import CORPUS, train_byte_level_bpe

    train_byte_level_bpe(CORPUS * 5, 400).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "in").mkdir()
    for k in range(8):
        (tmp_path / "in" / f"p{k}.jsonl").write_text("".join(
            json.dumps({"text": f"{k} {i} " + CORPUS[i % len(CORPUS)] * 3}) + "\n" for i in range(3000)))
    args = ["pack", "--input", str(tmp_path / "in"), "--context-length", "64", "--tokenizer",
            str(tmp_path / "tokenizer.json"), "--task-bytes", "200000", "--local"]
    with moto_server_process() as (endpoint, server):
        env = {**os.environ, **ENV, "AWS_ENDPOINT_URL": endpoint}
        with s3_environment(endpoint):
            clear_filesystem_cache()
            fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True)
            fs.create_dir("frozen")
            run = subprocess.Popen([sys.executable, "-m", "raypack.cli", *args, "--output", "s3://frozen/out"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            try:
                deadline = time.monotonic() + 120
                records = pafs.FileSelector(f"frozen/out/{RESULTS_DIR}", allow_not_found=True)
                while not fs.get_file_info(records) and run.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                server.send_signal(signal.SIGSTOP)  # a task has finished: the store stops answering mid-run
                time.sleep(1)
                assert run.poll() is None, "vacuous: the run ended before the store froze"
                sent = time.monotonic()
                run.send_signal(signal.SIGTERM)
                _, err = run.communicate(timeout=60)
                took = time.monotonic() - sent
            finally:
                server.send_signal(signal.SIGCONT)
                run.kill()
            assert run.returncode == 143, err
            assert took < 20, took  # one shared 10 s deadline, not each wait's own (nor the SDK's minutes)
            assert [line for line in err.strip().splitlines() if not line.startswith("packed ")] == [
                f"raypack: terminated (SIGTERM); the finished work is kept in s3://frozen/out; finish with: raypack "
                f"pack --input {tmp_path / 'in'} --context-length 64 --tokenizer {tmp_path / 'tokenizer.json'} "
                f"--task-bytes 200000 --local --output s3://frozen/out --resume"], err
            resumed = subprocess.run([sys.executable, "-m", "raypack.cli", *args, "--output", "s3://frozen/out",
                                      "--resume"], capture_output=True, text=True, env=env)
            assert resumed.returncode == 0, resumed.stderr
            clean = subprocess.run([sys.executable, "-m", "raypack.cli", *args, "--output", str(tmp_path / "clean")],
                                   capture_output=True, text=True, env=env)
            assert clean.returncode == 0, clean.stderr
            assert (read_packed("s3://frozen/out").manifest.content_sha256
                    == read_packed(str(tmp_path / "clean")).manifest.content_sha256)
            left = [info.path for info in fs.get_file_info(pafs.FileSelector("frozen/out", recursive=True))]
            assert left and all(re.fullmatch(r"frozen/out/(manifest\.json|chunks-\d{12}-[0-9a-f]{16}\.arrow)", p)
                                for p in left), left  # the stop's temporary uploads and lock, cleared by the resume
            clear_filesystem_cache()
