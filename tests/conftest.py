"""Shared fixtures. One local Ray per test session (starting one takes seconds): one per
pytest-xdist worker under `make test`.

Every test that uses ``ray_session`` is marked ``slow`` here, so ``make test-fast``
(``pytest -m "not slow"``) runs no Ray; other slow tests carry ``@pytest.mark.slow`` themselves.
"""

from __future__ import annotations

import os
import sys

import pytest

from tiers import starts_ray_or_s3


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


# ----------------------------------------------------------------------------- the fast tier's promise
# `make test-fast` (-m "not slow") starts no Ray, no S3 server and no subprocess that starts Ray.
# An audit hook sees every process a test starts; while a test not marked slow runs, one that
# would start Ray (gcs_server, raylet, `ray start`, a raypack run without --local) or an S3
# server (moto) is refused, and the test fails naming what it started.

_FAST_TEST: list[str] = []
def _audit(event: str, args) -> None:
    if event == "subprocess.Popen" and _FAST_TEST:
        what = starts_ray_or_s3(args[1])
        if what is not None:
            raise RuntimeError(f"{_FAST_TEST[0]} is in the fast tier but starts {what}: mark it @pytest.mark.slow "
                               "(tests/conftest.py)")


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_ray(request):
    """Tests not marked slow: no Ray in this process either (ray.init refused; Ray left running fails)."""
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    _FAST_TEST[:] = [request.node.nodeid]
    was_running = _ray_running()  # a slow test's session Ray may be up already: only a new one counts
    ray = sys.modules.get("ray")
    saved = getattr(ray, "init", None)
    if ray is not None:
        ray.init = _refuse_ray_init
    try:
        yield
    finally:
        _FAST_TEST.clear()
        if ray is not None:
            ray.init = saved
    if not was_running and _ray_running():
        pytest.fail(f"{request.node.nodeid} is in the fast tier but left Ray running: mark it @pytest.mark.slow")


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(getattr(ray, "is_initialized", lambda: False)())


def _refuse_ray_init(*args, **kwargs):
    raise RuntimeError("a test in the fast tier called ray.init: mark it @pytest.mark.slow (tests/conftest.py)")
