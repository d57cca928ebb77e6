"""Shared fixtures. One local Ray for the whole test session (starting one takes seconds).

Every test that uses ``ray_session`` is marked ``slow`` here, so ``make test-fast``
(``pytest -m "not slow"``) runs no Ray; other slow tests carry ``@pytest.mark.slow`` themselves.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


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
