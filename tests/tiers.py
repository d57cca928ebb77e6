"""What the fast tier (`make test-fast`, -m "not slow") may not start; tests/conftest.py enforces it."""

from __future__ import annotations

import os

_RAY_PROGRAMS = ("gcs_server", "raylet", "ray/_private", "ray/dashboard", "default_worker.py")
_RUN_COMMANDS = ("pack", "tokenize")


def starts_ray_or_s3(args) -> str | None:
    """What a process started with ``args`` would start that the fast tier must not: "Ray", "an S3
    server (moto)", "a raypack run on Ray (no --local)"; None for anything else."""
    words = [os.fsdecode(a) for a in (args if isinstance(args, (list, tuple)) else [args])]
    text = " ".join(words)
    if any(p in text for p in _RAY_PROGRAMS) or (len(words) > 1 and words[0].endswith("ray") and words[1] == "start"):
        return "Ray"
    if "moto.server" in text or "moto_server" in text:
        return "an S3 server (moto)"
    cli = "raypack.cli" in words or any(w.endswith("/raypack") for w in words)
    job = any(w.endswith("jobs/pack.py") for w in words)
    runs = job or (cli and any(c in words for c in _RUN_COMMANDS))
    if runs and "--local" not in words and "--dry-run" not in words:
        return "a raypack run on Ray (no --local)"
    return None
