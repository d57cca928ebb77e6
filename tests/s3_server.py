"""A real S3-compatible server for the tests: moto's server mode, on 127.0.0.1 only.

``moto_server()`` starts ``python -m moto.server -H 127.0.0.1 -p PORT`` in a subprocess and
stops it on exit; ``s3_environment(endpoint)`` points the standard AWS variables at it (dummy
credentials, ``AWS_ENDPOINT_URL``, no profile or config file, no EC2 metadata look-ups, so no
request ever leaves the loopback) and restores the environment afterwards. tests/io/test_s3.py
uses both through a module fixture, so ``make test`` (and with it .ci/run) starts and stops
the server itself. Not a conftest: nothing here runs unless a test imports it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
"""Set for the tests; AWS_ENDPOINT_URL is added with the server's address."""
UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_listening(port: int, proc: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    with open(log_path, errors="replace") as f:
        tail = f.read()[-2000:]
    raise RuntimeError(f"moto server on {HOST}:{port} did not start (exit code {proc.poll()}): {tail}")


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on a free loopback port; yields its endpoint URL ``http://127.0.0.1:PORT``."""
    with moto_server_process() as (endpoint, _):
        yield endpoint


@contextlib.contextmanager
def moto_server_process() -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`moto_server`, yielding its process too (a test freezes it with SIGSTOP: a store that stops
    answering); a stopped server is continued before it is terminated."""
    with tempfile.NamedTemporaryFile(prefix="moto-", suffix=".log", delete=False) as log:
        log_path = log.name
    port = _free_port()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, proc, log_path)
        yield f"http://{HOST}:{port}", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.remove(log_path)


@contextlib.contextmanager
def s3_environment(endpoint: str) -> Iterator[None]:
    """The AWS variables pointing at ``endpoint`` for the duration; the previous values restored."""
    saved = {k: os.environ.get(k) for k in (*ENV, "AWS_ENDPOINT_URL", *UNSET)}
    os.environ.update(ENV, AWS_ENDPOINT_URL=endpoint)
    for key in UNSET:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
