"""The package's shape: Ray imported by the engine alone, modules under 600 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "raypack"
TOO_LONG_FOR_NOW: set[str] = set()
"""Modules being split (issue 13): drop a name here when its split lands."""
RAY_IMPORT = re.compile(r"^\s*(import ray\b|from ray\b)", re.MULTILINE)


def _modules() -> list[Path]:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 20  # guard against a vacuous pass: the package was found
    return modules


def test_only_the_engine_imports_ray():
    importers = [p.relative_to(PACKAGE).as_posix() for p in _modules() if RAY_IMPORT.search(p.read_text())]
    assert importers == ["engine/pipeline.py"]


def test_no_module_over_600_lines():
    sizes = {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in _modules()}
    assert {name: n for name, n in sizes.items() if n > 600 and name not in TOO_LONG_FOR_NOW} == {}


def test_a_strategys_own_rules_stay_pure():
    """A strategy's rules.py (in its folder) is of the rules layer: numpy/pyarrow and raypack.rules alone."""
    rules = sorted((PACKAGE / "strategies").glob("*/rules.py"))
    assert [p.parent.name for p in rules] == ["best_fit"]
    for path in rules:
        imported = {node.module if isinstance(node, ast.ImportFrom) else alias.name
                    for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names}
        raypack = {name for name in imported if name.split(".")[0] == "raypack"}
        assert raypack and all(name.startswith("raypack.rules.") for name in raypack), (path, raypack)
        assert not imported & {"ray", "os", "pyarrow.fs", "pyarrow.parquet", "logging"}, (path, imported)


def test_test_files_do_not_import_each_other():
    """Shared builders live in tests/helpers.py (and reference.py, packing_faults.py, s3_server.py)."""
    tests = sorted(Path(__file__).resolve().parent.rglob("*.py"))
    importers = [p.name for p in tests if re.search(r"^\s*(from|import) test_", p.read_text(), re.MULTILINE)]
    assert importers == []


def test_ray_fault_and_s3_tests_are_marked_slow(request):
    """``make test-fast`` (-m "not slow") must start no Ray, kill no worker and start no S3 server.

    Checks the tests collected in this session: a full run checks them all."""
    unmarked = [
        item.nodeid for item in request.session.items
        if ("ray_session" in getattr(item, "fixturenames", ()) or "test_faults.py" in item.nodeid
            or "test_s3.py" in item.nodeid) and item.get_closest_marker("slow") is None
    ]
    assert unmarked == []


def test_the_fast_tier_guard_knows_ray_s3_servers_and_ray_runs():
    """tests/conftest.py refuses these in tests not marked slow (the classifier it asks)."""
    import sys

    from tiers import starts_ray_or_s3

    py = sys.executable
    assert starts_ray_or_s3([py, "-m", "moto.server", "-H", "127.0.0.1", "-p", "5000"]) == "an S3 server (moto)"
    assert starts_ray_or_s3(["/x/ray/core/src/ray/gcs/gcs_server", "--port=1"]) == "Ray"
    assert starts_ray_or_s3(["/venv/bin/ray", "start", "--head"]) == "Ray"
    assert starts_ray_or_s3([py, "-m", "raypack.cli", "pack", "--input", "a"]) == "a raypack run on Ray (no --local)"
    assert starts_ray_or_s3([py, "jobs/pack.py", "--input", "a"]) == "a raypack run on Ray (no --local)"
    assert starts_ray_or_s3([py, "-m", "raypack.cli", "pack", "--input", "a", "--local"]) is None
    assert starts_ray_or_s3([py, "-m", "raypack.cli", "verify", "out"]) is None
    assert starts_ray_or_s3(["git", "status"]) is None
