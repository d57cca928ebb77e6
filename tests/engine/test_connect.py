"""--address checked before ray.init (raypack.engine.connect): an operator's trial found a hang for a port that
is not a Ray cluster's (the dashboard's), a hang for ``auto`` after its head died, a traceback for an
``http://`` address, and ``auto`` joining another process's embedded Ray. Each is one line now; nothing
here starts Ray."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from raypack.engine.connect import resolve_address
from raypack.errors import InputError


@pytest.fixture
def http1_port():
    """An HTTP/1 server (what the dashboard's job server, or an S3 endpoint, is)."""
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("given", ["--address", "RAY_ADDRESS"])
def test_an_http_address_is_the_job_servers_and_one_line(tmp_path, given):
    with pytest.raises(InputError) as excinfo:
        resolve_address("http://127.0.0.1:8265", given, str(tmp_path))
    assert str(excinfo.value) == (
        f"{given}=http://127.0.0.1:8265 is the address of the Ray dashboard's job server (what `ray job submit` "
        "takes); raypack joins the cluster itself: give the GCS address `ray start --head` printed (HOST:6379 by "
        "default), or auto on a node of the cluster")


@pytest.mark.slow   # a raypack run without --local, in a child process (nothing is started: refused first)
def test_an_http_ray_address_is_one_line_and_nothing_written(tmp_path):
    import os
    import subprocess
    import sys

    from raypack.sample import write_sample_corpus

    write_sample_corpus(str(tmp_path / "in"), num_shards=1, docs_per_shard=5, mean_doc_len=5, seed=0)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-m", "raypack.cli", "pack", "--input", str(tmp_path / "in"), "--output",
                           str(tmp_path / "out"), "--context-length", "8"], capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": repo, "RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert proc.returncode == 2 and proc.stderr.startswith("raypack: error: RAY_ADDRESS=http://127.0.0.1:8265 is the "
                                                           "address of the Ray dashboard's job server"), proc.stderr
    assert proc.stderr.count("\n") == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_port_that_answers_as_no_ray_cluster_is_one_line_at_once(http1_port):
    start = time.monotonic()
    with pytest.raises(InputError, match=rf"^--address=127\.0\.0\.1:{http1_port} answers, but not as a Ray cluster "
                                         r"\(a GCS speaks gRPC; this answered b'<!DOCTYPE': a dashboard or job "
                                         "server port"):
        resolve_address(f"127.0.0.1:{http1_port}", "--address", "/nonexistent")
    assert time.monotonic() - start < 5


@pytest.fixture(autouse=True)
def short_probe(monkeypatch):
    """A listener that says nothing is waited for PROBE_TIMEOUT_S (3 s): a tenth of a second here."""
    import raypack.engine.connect as connect

    monkeypatch.setattr(connect, "PROBE_TIMEOUT_S", 0.1)


def test_a_port_that_says_nothing_is_left_to_ray(tmp_path):
    """Token authentication's errors come from ray.init (its line names the variables): a listener that does
    not answer the probe is not refused here."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert resolve_address(address, "--address", str(tmp_path)) == address


def test_auto_joins_only_the_cluster_ray_start_recorded(tmp_path, http1_port):
    with pytest.raises(InputError, match=r"^no Ray cluster found for --address=auto: none was started on this node "
                                         r"with `ray start` \(no .*ray_current_cluster; a Ray that another process "
                                         r"started for itself is not joined\)"):
        resolve_address("auto", "--address", str(tmp_path))
    (tmp_path / "ray").mkdir()
    recorded = tmp_path / "ray" / "ray_current_cluster"
    port = closed_port()
    recorded.write_text(f"127.0.0.1:{port}")
    with pytest.raises(InputError, match=rf"^no Ray cluster at --address=auto \(the cluster last started on this "
                                         rf"node, 127\.0\.0\.1:{port}\) \(.*\); it is gone \(its head stopped without "
                                         r"`ray stop`\?\): start one with `ray start --head`, or give a live "
                                         r"cluster's address \(HOST:PORT\)$"):
        resolve_address("auto", "--address", str(tmp_path))
    with socket.create_server(("127.0.0.1", 0)) as listener:
        live = f"127.0.0.1:{listener.getsockname()[1]}"
        recorded.write_text(live + "\n")
        # left to Ray as auto (it reads the same file, and joins with the head's token: a trial's regression)
        assert resolve_address("auto", "RAY_ADDRESS", str(tmp_path)) == "auto"
    for junk in ("garbage", "http://127.0.0.1:8265", "127.0.0.1:1\njunk", "", "ray://127.0.0.1:1"):
        recorded.write_text(junk)
        with pytest.raises(InputError, match=r"^no Ray cluster found for --address=auto: .*ray_current_cluster holds "
                                             r".*, not a cluster's HOST:PORT; start one"):
            resolve_address("auto", "--address", str(tmp_path))
    assert resolve_address("local", "--address", str(tmp_path)) == "local"


@pytest.mark.parametrize("address, said", [
    ("HTTP://127.0.0.1:8265", "is the address of the Ray dashboard's job server"),
    ("ray://127.0.0.1:10001", "is a Ray Client address, which raypack does not use"),
    ("127.0.0.1:\u00b2", "'\u00b2' is not a port (1-65535)"),
    ("127.0.0.1:99999", "'99999' is not a port (1-65535)"),
])
def test_addresses_ray_would_meet_with_a_traceback_are_one_line(tmp_path, address, said):
    """A trial: each of these was a traceback from Ray or from the port's int()."""
    with pytest.raises(InputError) as excinfo:
        resolve_address(address, "--address", str(tmp_path))
    assert said in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_a_path_a_ray_worker_cannot_open_is_one_line(monkeypatch):
    """An operator's trial: an output directory only the driver saw gave a 100-line traceback (exit 1) whose
    last line was Ray's message where the file name was. It is one line naming the path and the fix."""
    import errno
    import types

    import raypack.engine.session as session
    from raypack.errors import WorkerError

    fake = types.SimpleNamespace(original_error=lambda e: e, logs_dir=lambda: "/tmp/ray/session_x/logs")
    monkeypatch.setattr(session, "engine", lambda: fake)
    garbled = FileNotFoundError(errno.ENOENT, "No such file or directory",
                                "Failed to apply UDF transform after 1/1 attempts\nTraceback ...\nFileNotFoundError: "
                                "[Errno 2] No such file or directory: '/priv/out/.tmp-1-chunks.arrow'")

    def failing(error):
        def run(pipeline):
            raise error
        return run

    with pytest.raises(WorkerError) as excinfo:
        session.on_ray(failing(garbled), "a packer")
    assert str(excinfo.value) == (
        "a packer on Ray failed: No such file or directory (/priv/out/.tmp-1-chunks.arrow): a worker could not open "
        "or write a path; on a cluster every node must see the inputs and the output at the same paths (shared "
        "storage, or an object store); Ray's logs are in /tmp/ray/session_x/logs")
    full = OSError(errno.ENOSPC, "No space left on device", "/out/x")
    with pytest.raises(OSError) as excinfo:   # a full disk: the publish says it and keeps what it may
        session.on_ray(failing(full), "a packer")
    assert excinfo.value is full


@pytest.mark.slow   # starts an embedded Ray in a child process
def test_rays_error_messages_stay_off_the_terminal(tmp_path):
    """An operator's trial: a worker killed during a run put '(raylet) A worker died ...' lines with colour codes
    among the run's own lines; the README says Ray's logs stay in its logs directory unless -v."""
    import os
    import subprocess
    import sys

    script = ("import sys, ray\n"
              "from raypack.engine.pipeline import init_ray\n"
              "init_ray(None, verbose=sys.argv[1] == 'v')\n"
              "ray._private.worker.print_to_stdstream({'lines': ['A worker died or was killed'], 'pid': 'raylet', "
              "'is_err': False}, ignore_prefix=False)\n"
              "sys.stdout.flush(); sys.stderr.flush()\n"
              "ray.shutdown()\n")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", script, "quiet"], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": repo})
    assert proc.returncode == 0, proc.stderr
    assert "A worker died" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    # with -v it is Ray's to print: the same script, verbose, printed it (a second Ray start, 8 s: left out)
