"""The README's map of ``raypack/``, made from the tree: every package and module with the first
sentence of its docstring. ``tests/test_readme.py`` fails when the README's copy differs.

    python tests/file_map.py           # print the map
    python tests/file_map.py --write   # put it into README.md, between the two markers
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "raypack"
README = ROOT / "README.md"
BEGIN = "<!-- file map: made by `python tests/file_map.py --write`; tests/test_readme.py checks it -->"
END = "<!-- end of file map -->"
NAME_WIDTH = 30
LINE_WIDTH = 118
SKIP = {"__init__.py", "__main__.py"}


def summary(path: Path) -> str:
    """The first sentence of the module's docstring, on one line, cut at a word to fit the map."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    paragraph = re.sub(r":\w+:`~?([^`]+)`", r"\1", paragraph).replace("``", "`")
    end = next((i + 1 for i, ch in enumerate(paragraph) if ch == "." and paragraph[i + 1:i + 2] in ("", " ")
                and not paragraph[max(0, i - 3):i + 1].endswith(("e.g.", "i.e."))), len(paragraph))
    sentence = paragraph[:end]
    room = LINE_WIDTH - NAME_WIDTH
    if len(sentence) > room:
        sentence = sentence[:room - 3].rsplit(" ", 1)[0] + "..."
    return sentence


def entries(folder: Path, depth: int = 0) -> list[str]:
    lines = []
    for path in sorted(folder.iterdir(), key=lambda p: (p.is_dir(), p.name)):
        if path.name.startswith((".", "__pycache__")) or path.name in SKIP:
            continue
        indent = "  " * (depth + 1)
        if path.is_dir() and (path / "__init__.py").exists():
            name = path.name + "/"
            lines.append(f"{indent}{name:<{NAME_WIDTH - len(indent)}}{summary(path / '__init__.py')}".rstrip())
            lines.extend(entries(path, depth + 1))
        elif path.suffix == ".py":
            lines.append(f"{indent}{path.name:<{NAME_WIDTH - len(indent)}}{summary(path)}".rstrip())
    return lines


def file_map() -> str:
    head = f"{'raypack/':<{NAME_WIDTH}}{summary(PACKAGE / '__init__.py')}".rstrip()
    return "\n".join(["```", head, *entries(PACKAGE), "```"])


def readme_map(text: str) -> str | None:
    """The map in the README's text, between the markers (None: no markers)."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write() -> None:
    text = README.read_text()
    if readme_map(text) is None:
        raise SystemExit(f"{README}: no markers; put {BEGIN!r} and {END!r} where the map goes")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    README.write_text(f"{before}{BEGIN}\n{file_map()}\n{END}{after}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(file_map())
