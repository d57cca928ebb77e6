"""Shared fixtures. One local Ray for the whole test session (starting one takes seconds)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """An embedded local Ray with 2 CPUs, started once, shut down at the end."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield ray
    ray.shutdown()
