"""Worker loss, for real: a packer process killed mid-shard, and a Ray node removed mid-shard.

Each job runs in a subprocess with its own Ray (never the session's ``ray_session``), in a
private ``RAY_TMPDIR`` so that nothing here touches other Ray instances on the machine. The
test finds the packer by its Ray process title inside that subprocess's process tree, waits
until it holds a ``.tmp-*`` chunk file open in the job's staging directory (so the shard is
in flight), and kills it. The job must still exit 0 and its output must equal, byte for
byte, a clean one-process run (``engine="local"``, what ``raypack pack --local`` does).

Proof that the killed shard was re-run rather than lost or skipped: the killed process's
temporary file is still there after it died (it never published that chunk file), yet the
final output holds that chunk file with the clean run's bytes, and a third packer process
appeared although the pool holds two actors (Ray restarted the killed one). Ray's own account
(task resubmitted, actor RESTARTING) is printed from its session logs, for the record only:
log formats are not a contract.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.sample import write_sample_corpus

pytestmark = pytest.mark.slow  # killed workers and removed Ray nodes: minutes, not seconds

FAULT_SCRIPTS = Path(__file__).parent.parent / "fault_scripts"


def _load_procs():
    spec = importlib.util.spec_from_file_location("raypack_fault_procs", FAULT_SCRIPTS / "procs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


procs = _load_procs()

CONTEXT_LENGTH = 512
NUM_SHARDS = 6
DOCS_PER_SHARD = 6000  # ~1M tokens per shard
READ_BATCH_SIZE = 8    # ~750 read batches per shard: a shard takes ~0.3 s alone, 1-2 s under Ray here
JOB_TIMEOUT_S = 120

pytest.importorskip("ray")
if not os.path.isdir("/proc/self/fd"):
    pytest.skip("the fault tests find Ray processes through Linux /proc", allow_module_level=True)


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def corpus(tmp_path) -> str:
    path = str(tmp_path / "corpus")
    write_sample_corpus(path, num_shards=NUM_SHARDS, docs_per_shard=DOCS_PER_SHARD,
                        mean_doc_len=CONTEXT_LENGTH / 3)
    return path


@pytest.fixture
def big_corpus(tmp_path) -> str:
    """Fewer, 3x longer shards: removing a node takes longer than killing a process, and the
    shard must still be mid-way when it lands (the first version raced a 0.3 s shard)."""
    path = str(tmp_path / "big-corpus")
    write_sample_corpus(path, num_shards=4, docs_per_shard=3 * DOCS_PER_SHARD, mean_doc_len=CONTEXT_LENGTH / 3)
    return path


@pytest.fixture
def ray_env():
    """Environment for a subprocess with its own Ray, in a private, short temp dir.

    Short because Ray's unix sockets live under it (108-byte path limit); private so the
    subprocess's ``ray_current_cluster`` file and sessions never meet other Ray instances.
    """
    ray_tmp = tempfile.mkdtemp(prefix="rpf-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=ray_tmp, RAY_DEDUP_LOGS="0", PYTHONUNBUFFERED="1")
    yield env
    shutil.rmtree(ray_tmp, ignore_errors=True)


def clean_local_run(corpus: str, out: str) -> dict:
    """The reference: one process, no Ray (``raypack pack --local``)."""
    config = make_config(dict(inputs=[corpus], output=out, context_length=CONTEXT_LENGTH, pad_token=0,
                              read_batch_size=READ_BATCH_SIZE))
    return run_pack(config, engine="local").manifest


def arrow_digests(out: str) -> dict[str, str]:
    return {os.path.basename(p): hashlib.sha256(Path(p).read_bytes()).hexdigest()
            for p in sorted(glob.glob(os.path.join(out, "*.arrow")))}


def assert_same_output(out: str, reference: str) -> dict:
    """Every ``*.arrow`` file byte-identical and the manifests' content hash, counts and files equal."""
    got, want = arrow_digests(out), arrow_digests(reference)
    assert len(want) >= NUM_SHARDS, f"vacuous comparison: reference has only {sorted(want)}"
    assert got == want
    manifest = json.loads(Path(out, "manifest.json").read_text())
    ref_manifest = json.loads(Path(reference, "manifest.json").read_text())
    for key in ("content_sha256", "counts", "files", "token_dtype", "context_length"):
        assert manifest[key] == ref_manifest[key], key
    return manifest


def ray_messages(text: str) -> list[str]:
    """Lines of a Ray run's stderr worth reporting (restarts, retries, deaths, errors)."""
    keys = ("restarting=1", "ERROR", "Error", "died", "dead", "retr")
    return [line[:400] for line in text.splitlines() if any(k in line for k in keys)]


RAY_LOG_KEYS = ("failed with error", "retries left", "Will resubmit task", "state: RESTARTING",
                "num_restarts: 1", "health check failed", "marked dead")


def ray_log_messages(ray_tmp: str, limit: int = 40) -> list[str]:
    """Fault handling as Ray logged it: the driver's core worker (task retries, actor restarts)
    and the GCS (node deaths), from the private session dir."""
    lines = []
    for pattern in ("python-core-driver-*.log", "gcs_server.out"):
        for path in sorted(glob.glob(os.path.join(ray_tmp, "ray", "session_2*", "logs", pattern))):
            for line in Path(path).read_text(errors="replace").splitlines():
                if any(k in line for k in RAY_LOG_KEYS):
                    lines.append(f"{os.path.basename(path)[:24]}: {line[:300]}")
    return lines[:limit]


def kill_group_leftovers(pid: int) -> None:
    """On a failed test: SIGKILL the job's whole process tree, by pid."""
    for child in procs.descendants(pid) + [pid]:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Kill(NamedTuple):
    pid: int
    title: str
    tmp_files: list[str]
    """The .tmp-* chunk files the victim held open just before the kill."""
    tmp_bytes: list[int]
    tmp_files_after: list[str]
    """Those still present once it was dead: never published by it."""
    packers_before: set[int]
    """Every packer pid seen up to the kill."""
    seconds_into_job: float


def kill_packer_mid_shard(job: subprocess.Popen, output: str, started: float, timeout: float) -> Kill:
    """Wait for a packer below ``job`` writing a tmp chunk file in the staging dir; SIGKILL it.

    "Writing": the file is open in the packer and already holds data (at least one record batch
    of chunks), so the kill lands after the shard started and before it was published.
    """
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job.poll() is not None:
            raise AssertionError(f"the job exited (rc={job.returncode}) before a packer was caught mid-shard")
        packers = procs.packer_pids(job.pid)
        seen.update(packers)
        for staging in procs.staging_dirs(output):
            for pid in packers:
                tmp_files = procs.open_tmp_files(pid, staging)
                sizes = [os.path.getsize(t) if os.path.exists(t) else -1 for t in tmp_files]
                if not tmp_files or min(sizes) <= 0:
                    continue
                title = procs.command_line(pid)
                os.kill(pid, signal.SIGKILL)
                assert procs.wait_dead(pid, 10), f"packer {pid} survived SIGKILL"
                after = [t for t in tmp_files if os.path.exists(t)]
                return Kill(pid, title, tmp_files, sizes, after, seen, time.monotonic() - started)
        time.sleep(0.02)
    raise AssertionError(f"no packer wrote a tmp chunk file within {timeout}s")


def watch_packers(job: subprocess.Popen, timeout: float) -> set[int]:
    """Packer pids seen until the job exits."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while job.poll() is None and time.monotonic() < deadline:
        seen.update(procs.packer_pids(job.pid))
        time.sleep(0.05)
    return seen


class JobRun(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_job_process(cmd: list[str], env: dict, log_dir: Path, during=None) -> tuple[JobRun, object]:
    """Run ``cmd``; ``during(job)`` runs while it does. Whatever happens, leave no process behind."""
    out_path, err_path = log_dir / "job.out", log_dir / "job.err"
    with open(out_path, "w") as stdout, open(err_path, "w") as stderr:
        job = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=env)
        try:
            seen = during(job) if during else None
            returncode = job.wait(timeout=JOB_TIMEOUT_S)
        finally:
            if job.poll() is None:
                kill_group_leftovers(job.pid)
                job.wait(timeout=10)
    return JobRun(returncode, out_path.read_text(), err_path.read_text()), seen


def cli_pack_command(corpus: str, out: str) -> list[str]:
    return [sys.executable, "-m", "raypack.cli", "pack", "--input", corpus, "--output", out,
            "--context-length", str(CONTEXT_LENGTH), "--pad-token", "0", "--workers", "2",
            "--read-batch-size", str(READ_BATCH_SIZE)]


# ----------------------------------------------------------------------------- 1a: kill -9 a packer


def test_packer_killed_mid_shard_is_rerun_and_output_is_identical(tmp_path, corpus, ray_env):
    reference = str(tmp_path / "out-local")
    clean_local_run(corpus, reference)
    out = str(tmp_path / "out-ray")
    started = time.monotonic()

    def kill_then_watch(job):
        kill = kill_packer_mid_shard(job, out, started, timeout=90)
        return kill, watch_packers(job, timeout=JOB_TIMEOUT_S)

    run, (kill, later_packers) = run_job_process(cli_pack_command(corpus, out), ray_env, tmp_path, kill_then_watch)
    print(f"{kill}\npackers seen after the kill: {sorted(later_packers)}; job took {time.monotonic() - started:.1f}s")
    print("\n".join(ray_messages(run.stderr) + ray_log_messages(ray_env["RAY_TMPDIR"])))

    assert run.returncode == 0, f"job failed after the kill:\n{run.stderr[-4000:]}"
    # The victim really was a packer, in the middle of a shard: it had written part of a chunk
    # file and died before publishing it.
    assert procs.PACKER_TITLE in kill.title
    assert len(kill.tmp_files) == 1 and kill.tmp_files_after == kill.tmp_files, \
        "the victim had already published its chunk file: the kill did not land mid-shard"
    killed_file = procs.final_name(kill.tmp_files[0])
    # Ray re-ran the shard: the pool holds 2 actors, so a third packer process is a restart,
    # and the chunk file the victim never finished was published with the clean run's bytes.
    assert len(kill.packers_before | later_packers) >= 3, "no packer was restarted after the kill"
    manifest = assert_same_output(out, reference)
    (published,) = [f["path"] for f in manifest["files"] if f["path"].startswith(killed_file)]
    assert os.path.exists(os.path.join(out, published))
    assert not [n for n in os.listdir(out) if n.startswith(procs.TMP_PREFIX)], "temporary files published"
    assert not procs.staging_dirs(out)


def test_a_tokenizing_packer_killed_mid_run_is_replaced_and_output_is_identical(tmp_path, ray_env):
    """``pack --tokenizer`` on Ray: a TextPackerActor SIGKILLed once a task is packed. It failed the
    run (exit 1, "ActorDiedError"); now a new actor tokenizes the tasks the dead one held again and
    packs those already placed, and the output equals one process's, byte for byte."""
    from raypack.sample import write_sample_texts

    corpus = str(tmp_path / "text")
    write_sample_texts(corpus, num_shards=8, docs_per_shard=1500, mean_doc_words=300, seed=5)
    args = ["--input", corpus, "--context-length", "256", "--tokenizer", "tiktoken:cl100k_base", "--eos", "100257",
            "--tokenizer-backend", "reference", "--task-rows", "500"]
    reference = str(tmp_path / "out-local")
    assert subprocess.run([sys.executable, "-m", "raypack.cli", "pack", *args, "--local", "--output", reference],
                          env=ray_env, capture_output=True).returncode == 0
    out = str(tmp_path / "out-ray")
    killed: list[str] = []

    def kill_a_text_packer(job):
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and job.poll() is None:
            packed = [f for d in procs.staging_dirs(out) for f in os.listdir(d) if f.startswith("chunks-")]
            actors = [p for p in procs.descendants(job.pid) if "TextPackerActor" in procs.command_line(p)]
            if packed and actors:
                killed.append(procs.command_line(actors[0]))
                os.kill(actors[0], signal.SIGKILL)
                return
            time.sleep(0.02)

    run, _ = run_job_process([sys.executable, "-m", "raypack.cli", "pack", *args, "--workers", "2", "--output", out],
                             ray_env, tmp_path, kill_a_text_packer)
    assert killed, f"no tokenizing packer was caught mid-run:\n{run.stderr[-3000:]}"
    assert run.returncode == 0, f"job failed after the kill:\n{run.stderr[-4000:]}"
    assert "a tokenizing packer died" in run.stderr
    assert arrow_digests(out) == arrow_digests(reference) and len(arrow_digests(out)) >= 8
    manifest, ref_manifest = (json.loads(Path(o, "manifest.json").read_text()) for o in (out, reference))
    assert manifest["content_sha256"] == ref_manifest["content_sha256"]
    assert not [n for n in os.listdir(out) if n.startswith(procs.TMP_PREFIX)] and not procs.staging_dirs(out)


# ----------------------------------------------------------------------------- 1b: lose a node


def test_worker_node_removed_mid_shard_output_is_identical(tmp_path, big_corpus, ray_env):
    """A 3-node Cluster on this machine; the worker node hosting a packer mid-shard is removed
    (all its processes SIGKILLed, raylet first): see fault_scripts/remove_node.py for how the
    node is chosen."""
    reference = str(tmp_path / "out-local")
    clean_local_run(big_corpus, reference)
    out, report_path = str(tmp_path / "out-cluster"), tmp_path / "report.json"
    cmd = [sys.executable, str(FAULT_SCRIPTS / "remove_node.py"), "--input", big_corpus, "--output", out,
           "--report", str(report_path), "--context-length", str(CONTEXT_LENGTH),
           "--read-batch-size", str(READ_BATCH_SIZE), "--timeout", "100"]
    run, _ = run_job_process(cmd, ray_env, tmp_path)
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    print(json.dumps(report, indent=1))
    print("\n".join(ray_messages(run.stderr) + ray_log_messages(ray_env["RAY_TMPDIR"])))

    assert run.returncode == 0 and report.get("removed") and "error" not in report, \
        f"{report.get('error', '')}\n{run.stderr[-4000:]}"
    victim, removed = report["victim"], report["removed_node"]
    assert report["nodes"][removed] == "worker"
    assert procs.PACKER_TITLE in victim["title"]
    assert report["packers_before"][str(victim["pid"])] == removed, "the removed node did not host the victim"
    assert report["victim_dead"], "the packer outlived its node"
    assert len(victim["tmp_files"]) == 1 and report["tmp_files_after"] == victim["tmp_files"], \
        "the victim had already published its chunk file: the removal did not land mid-shard"
    # The shard was re-run elsewhere: the pool holds 2 actors, so a third packer process is a
    # restart; it ran on a surviving node and published the chunk file the victim never finished.
    assert len(set(report["packers_before"]) | set(report["packers_after"])) >= 3, "no packer was restarted"
    assert removed not in report["packers_after"].values()
    killed_file = procs.final_name(victim["tmp_files"][0])
    manifest = assert_same_output(out, reference)
    assert manifest["content_sha256"] == report["content_sha256"]
    assert [f["path"] for f in manifest["files"] if f["path"].startswith(killed_file)]
    assert not [n for n in os.listdir(out) if n.startswith(procs.TMP_PREFIX)], "temporary files published"
