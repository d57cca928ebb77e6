"""Which Ray cluster ``--address`` (or RAY_ADDRESS) names, checked before ``ray.init``, so that a wrong one
is one line within seconds instead of a hang or a traceback. No Ray import: the engine
(:mod:`raypack.engine.pipeline`) passes in what it needs.

- ``http://`` / ``https://``: the dashboard's job server (``ray job submit`` takes it), not the cluster:
  refused with the fix.
- ``auto``: the cluster last started on this node with ``ray start`` (``TEMP/ray/ray_current_cluster``), and
  only that one, checked as below and then left to Ray as ``auto`` (which reads the same file). Where there
  is no such file Ray's own ``auto`` falls back to any GCS process on the host, which found another
  process's embedded Ray (another raypack run's), joined it and died with it (an operator's trial).
- ``HOST:PORT``: something must listen there (TCP, within ``CONNECT_TIMEOUT_S``), and where it answers
  the HTTP/2 preface it must answer as HTTP/2 (a GCS is a gRPC server): an HTTP/1 port (the dashboard's
  8265, an S3 endpoint) hung ``ray.init`` for good. A port that says nothing is left to ``ray.init``
  (its own errors name the fix: raypack.engine.pipeline). Skipped under ``RAY_USE_TLS``.
- ``ray://`` (Ray Client): refused; Ray Data runs on the cluster. Other schemes: left to Ray.
"""

from __future__ import annotations

import os
import socket

from raypack.errors import InputError

CONNECT_TIMEOUT_S = 15.0
"""How long connecting to a cluster may take before the run stops with one line."""
PROBE_TIMEOUT_S = 3.0
"""How long the HTTP/2 probe waits for an answer (none: left to ray.init)."""
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS


def resolve_address(address: str, given: str, ray_temp_dir: str) -> str:
    """The cluster address to give ``ray.init`` for ``address`` (not None), or InputError, one line.
    ``given``: where it came from ("--address", or "RAY_ADDRESS"); ``ray_temp_dir``: Ray's temp dir
    (its ``ray_current_cluster`` file records the cluster ``ray start`` last started on this node). ``auto``
    stays ``auto`` once its cluster is checked: Ray then reads the same file, and joins with the head's
    own token where a HOST:PORT would need RAY_AUTH_MODE=token (a trial)."""
    if address == "local":
        return address
    scheme = address.split("://", 1)[0].lower() if "://" in address else ""
    if scheme in ("http", "https"):
        raise InputError(f"{given}={address} is the address of the Ray dashboard's job server (what `ray job submit` "
                         "takes); raypack joins the cluster itself: give the GCS address `ray start --head` printed "
                         "(HOST:6379 by default), or auto on a node of the cluster")
    if scheme == "ray":
        raise InputError(f"{given}={address} is a Ray Client address, which raypack does not use (Ray Data runs on the "
                         "cluster); run raypack on a node of the cluster with --address auto, or submit it with "
                         "`ray job submit` (README, On a cluster)")
    if address == "auto":
        recorded = _recorded_cluster(ray_temp_dir, given)
        check_reachable(recorded, f"{given}=auto (the cluster last started on this node, {recorded})", stale=True)
        return address
    check_reachable(address, f"{given}={address}")
    return address


def check_reachable(address: str, named: str, *, stale: bool = False) -> None:
    """Fail fast (one line) when ``host:port`` is no port, nothing listens there, or what listens there is
    no gRPC server (other schemes: Ray decides). ``named``: the address as the line names it; ``stale``: it
    was read from ray_current_cluster (a head killed without ``ray stop`` leaves it behind)."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host:
        return
    if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise InputError(f"{named}: {port!r} is not a port (1-65535); give HOST:PORT, e.g. 10.0.0.1:6379")
    host = host.strip("[]")
    try:
        connection = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
    except OSError as e:
        if stale:
            raise InputError(f"no Ray cluster at {named} ({e.strerror or e}); it is gone (its head stopped without "
                             "`ray stop`?): start one with `ray start --head`, or give a live cluster's address "
                             "(HOST:PORT)") from None
        unset = "; or unset RAY_ADDRESS for a local Ray" if named.startswith("RAY_ADDRESS") else ""
        raise InputError(f"no Ray cluster at {named} ({e.strerror or e}); start one with `ray start --head`, "
                         f"check the address, or use --address auto on the head node{unset}") from None
    with connection:
        if os.environ.get("RAY_USE_TLS", "0").lower() not in ("0", "", "false"):
            return
        answer = _answer_to_http2(connection)
    if answer is not None and not (len(answer) == 9 and answer[3] == 0x04):
        what = repr(answer[:16]) if answer else "it closed the connection"
        raise InputError(f"{named} answers, but not as a Ray cluster (a GCS speaks gRPC; this answered {what}: a "
                         "dashboard or job server port, 8265, or another service?); give the GCS address `ray start "
                         "--head` printed (HOST:6379 by default), or auto on a node of the cluster")


def _answer_to_http2(connection: socket.socket) -> bytes | None:
    """The first 9 bytes answered to the HTTP/2 preface (an HTTP/2 server's SETTINGS frame header), b"" when
    the server closed the connection, or None when it said nothing within PROBE_TIMEOUT_S."""
    connection.settimeout(PROBE_TIMEOUT_S)
    data = b""
    try:
        connection.sendall(_HTTP2_PREFACE)
        while len(data) < 9:
            chunk = connection.recv(9 - len(data))
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        return data or None
    except OSError:
        return data
    return data


def _address_file(ray_temp_dir: str) -> str:
    return os.path.join(ray_temp_dir, "ray", "ray_current_cluster")


def _recorded_cluster(ray_temp_dir: str, given: str) -> str:
    """The address ``ray start`` recorded on this node; InputError, one line, where there is none or it is
    no HOST:PORT."""
    path = _address_file(ray_temp_dir)
    fix = ("start one with `ray start --head`, give its address (HOST:PORT), or leave --address out (and unset "
           "RAY_ADDRESS) to run on an embedded local Ray")
    if not os.path.lexists(path):
        raise InputError(f"no Ray cluster found for {given}=auto: none was started on this node with `ray start` "
                         f"(no {path}; a Ray that another process started for itself is not joined); {fix}")
    try:
        with open(path, "rb") as f:
            text = f.read(4096).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"no Ray cluster found for {given}=auto: {path} cannot be read ({e}); {fix}") from None
    host, _, port = text.rpartition(":")
    if not host or "://" in text or any(c.isspace() for c in text) or not (port.isascii() and port.isdigit()):
        raise InputError(f"no Ray cluster found for {given}=auto: {path} holds {text[:60]!r}, not a cluster's "
                         f"HOST:PORT; {fix}")
    return text


def connect_hint(address: str | None, error: BaseException) -> str:
    """One line for ``ray.init``'s own failure to join ``address`` (an auth token missing or refused, a
    cluster that went away)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    first = first.split(". ")[0]  # Ray's first sentence; the fix follows in ours
    if address == "auto":  # nothing to find here: the fix is the other way round
        return (f"no Ray cluster found for --address auto ({first[:200]}); start one with `ray start --head`, or "
                "leave --address out (and unset RAY_ADDRESS) to run on an embedded local Ray")
    return (f"could not connect to the Ray cluster at {address or 'a new local instance'} ({first[:200]}); "
            "check the address; if the cluster uses token authentication, set RAY_AUTH_MODE=token and "
            "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token (`ray get-auth-token` on the head "
            "prints it), or run on the head node with --address auto")
