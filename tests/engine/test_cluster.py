"""The README's cluster section for real (issue 15): a head started with `ray start --head`, token
authentication on, and `raypack pack --address HOST:PORT` against it; the output must equal a
`--local` run byte for byte. The head gets its own free port, temp dir, HOME and token, and is
always stopped by its own process id (`ray stop` would stop every Ray on the machine)."""

from __future__ import annotations

import contextlib
import filecmp
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from raypack.sample import write_sample_corpus

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_head(head: subprocess.Popen, temp_dir: str) -> None:
    """SIGTERM to `ray start --block` (it stops what it started), then SIGKILL to anything still using ``temp_dir``."""
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=2)
    except subprocess.TimeoutExpired:  # its graceful shutdown took 20 s under load; the sweep below ends the rest
        head.kill()
    for pid in pids_using(temp_dir):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def pids_using(temp_dir: str) -> list[int]:
    """Processes whose command line names ``temp_dir`` (Linux /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and temp_dir.encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                pids.append(int(entry))
    return pids


@pytest.fixture
def head(tmp_path):
    """A one-node cluster at 127.0.0.1:PORT with token auth; yields (address, client env)."""
    temp_dir = tempfile.mkdtemp(prefix="rp-head-", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path / "home"), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16),
               PYTHONPATH=REPO)
    cmd = [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(port),
           "--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats",
           "--dashboard-agent-listen-port", str(free_port()), "--temp-dir", temp_dir]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(temp_dir, "ray_current_cluster")):
            assert proc.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}", env
    finally:
        stop_head(proc, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_pack_against_a_ray_start_head_equals_local(head, tmp_path):
    address, env = head
    write_sample_corpus(str(tmp_path / "in"), num_shards=3, docs_per_shard=200, mean_doc_len=300)

    def pack(*args):
        return subprocess.run([sys.executable, "-m", "raypack.cli", "pack", "--config", "configs/tiny.toml",
                               "--input", str(tmp_path / "in"), *args], env=env, cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180)

    cluster = pack("--output", str(tmp_path / "cluster"), "--address", address)
    assert cluster.returncode == 0, cluster.stderr
    logs = [line for line in cluster.stderr.splitlines() if line.startswith("Ray's logs are in ")]
    assert logs and "/rp-head-" in logs[0], cluster.stderr  # it ran on that head, not on a Ray of its own
    local = pack("--output", str(tmp_path / "local"), "--local")
    assert local.returncode == 0, local.stderr
    names = sorted(os.listdir(tmp_path / "local"))
    assert sorted(os.listdir(tmp_path / "cluster")) == names and len(names) > 2
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "local", tmp_path / "cluster", names, shallow=False)
    assert not mismatch and not errors
