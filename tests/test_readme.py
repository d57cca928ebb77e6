"""The README's map of raypack/ is the tree's (tests/file_map.py makes it from the modules' docstrings)."""

from __future__ import annotations

from file_map import PACKAGE, README, file_map, readme_map


def test_the_readme_maps_every_module_as_the_tree_has_it():
    mapped = readme_map(README.read_text())
    assert mapped is not None, "README.md has no file map markers"
    modules = [p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert len(modules) > 40  # the package was found
    missing = [p.relative_to(PACKAGE).as_posix() for p in modules if f" {p.name} " not in mapped + " "]
    assert missing == [], f"not in the README's file map: {missing}; run python tests/file_map.py --write"
    assert mapped == file_map(), "the README's file map is stale: run python tests/file_map.py --write"
