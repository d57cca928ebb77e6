"""A JSON document (a manifest of any kind, an export's index) read as untrusted input, with bounds.

:func:`read_json_document` reads at most ``max_bytes + 1`` bytes, then :func:`parse_json_document`
bounds what the parse may build *before* ``json.loads`` runs, from one pre-scan of the raw bytes
(numpy over 64 KiB pieces; ~1-3 s for 128 MiB, O(piece) memory):

  1. escapes are neutralised (``\\\\`` and then ``\\"`` become two plain bytes: same length, so
     every other byte keeps its place), so the quotes left delimit the strings;
  2. outside strings it counts the containers (``[`` and ``{``), the separators (``,`` and
     ``:``: one per array element or object member beyond the first) and the nesting depth;
  3. a document deeper than MAX_DEPTH, or holding more containers or separators than a raypack
     manifest of its size ever does (:func:`build_caps`), is refused unparsed.

Why density caps: ``json.loads`` builds ~45-75 bytes per value whatever the value's size
(``{}``, ``0``, ``"ab"``), so a document of tiny values builds 20-25x its bytes (a 250 MB
``[{}, {}, ...]``: 6.6 GB). raypack's manifests, written with indent=2, spend ~18-24 bytes per
separator and >= 200 per container; the caps allow 16 and 128 (plus a constant for small
documents), so what a parse builds stays within ~5x the document's bytes (the densest document
the caps let through: 8-string lists of 14-character strings; tests/packed/test_manifest_kinds.py
and bench/bench_manifest.py measure it): at the 128 MiB cap a reader peaks under 1 GiB. The
depth cap (real manifests: 4) means no RecursionError, neither in the parse nor in any check or
message walking the values.

Then :class:`CheckedDocument` is the read-only base of every typed manifest (packed output,
tokenized corpus, mix): ``doc[key]`` gives the JSON field, the subclasses add typed accessors;
the field checks they use live in raypack.io.untrusted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.io.untrusted import DAMAGED, one_line

__all__ = ["MAX_DEPTH", "CheckedDocument", "build_caps", "check_json_shape", "parse_json_document",
           "read_json_document", "scan_json"]

MAX_DEPTH = 32
"""Deepest nesting a document may have (a manifest: 4, e.g. shards[k].source.path)."""
_PIECE = 64 << 10
"""Bytes scanned at once: the scan's arrays stay under ~30x this (2 MiB), whatever the document's size."""
_OPEN, _CLOSE, _SEPARATOR, _QUOTE = 1, 2, 3, 4
_CLASSES = np.zeros(256, np.int8)
_CLASSES[np.frombuffer(b"[{", np.uint8)] = _OPEN
_CLASSES[np.frombuffer(b"]}", np.uint8)] = _CLOSE
_CLASSES[np.frombuffer(b",:", np.uint8)] = _SEPARATOR
_CLASSES[ord('"')] = _QUOTE


def build_caps(num_bytes: int) -> tuple[int, int]:
    """(most separators, most containers) a document of ``num_bytes`` may hold: what raypack's
    manifests need at that size, with room (they use >= 20 and >= 200 bytes for each)."""
    return 65536 + num_bytes // 16, 8192 + num_bytes // 128


def scan_json(raw: bytes) -> tuple[int, int, int]:
    """(separators, containers, depth) of ``raw`` counted outside strings; for a document that is
    not valid JSON the figures are those of its well-formed prefix, roughly (json.loads refuses it)."""
    raw = raw.replace(b"\\\\", b"__").replace(b'\\"', b"__")  # no copy when it holds no backslash
    data = np.frombuffer(raw, np.uint8)
    in_string, depth, max_depth, separators, containers = 0, 0, 0, 0, 0
    for start in range(0, data.size, _PIECE):
        classes = _CLASSES[data[start:start + _PIECE]]
        quotes = np.flatnonzero(classes == _QUOTE)
        marks = np.flatnonzero(classes & 3)  # brackets and separators (_QUOTE & 3 == 0)
        outside = (np.searchsorted(quotes, marks) + in_string) % 2 == 0
        marks = classes[marks[outside]]
        in_string = (in_string + quotes.size) % 2
        separators += int(np.count_nonzero(marks == _SEPARATOR))
        opens = marks == _OPEN
        steps = opens.astype(np.int64) - (marks == _CLOSE)
        containers += int(np.count_nonzero(opens))
        if steps.size:
            levels = np.cumsum(steps) + depth
            max_depth, depth = max(max_depth, int(levels.max())), int(levels[-1])
    return separators, containers, max_depth


def parse_json_document(raw: bytes, where: str, fix: str = DAMAGED) -> Any:
    """``raw`` parsed, once :func:`scan_json` shows it within MAX_DEPTH and :func:`build_caps`;
    InputError naming ``where`` otherwise, or when it is not UTF-8 JSON."""
    check_json_shape(raw, where, fix)
    return _loads(_decode(raw, where, fix), where, fix)


def check_json_shape(raw: bytes, where: str, fix: str = DAMAGED) -> None:
    """InputError naming ``where`` unless :func:`scan_json` shows ``raw`` within MAX_DEPTH and
    :func:`build_caps` (nothing is parsed)."""
    separators, containers, depth = scan_json(raw)
    max_separators, max_containers = build_caps(len(raw))
    if depth > MAX_DEPTH:
        raise InputError(f"{where}: JSON nested {depth} levels deep, more than {MAX_DEPTH}; not a raypack manifest, "
                         f"or {fix}")
    if separators > max_separators or containers > max_containers:
        raise InputError(f"{where}: {separators} JSON values and {containers} arrays or objects in {len(raw)} bytes, "
                         f"more than a raypack manifest of that size holds ({max_separators} and {max_containers}); "
                         f"not a raypack manifest, or {fix}")


def _decode(raw: bytes, where: str, fix: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{where}: not valid JSON ({one_line(e)}); {fix}") from e


def _loads(text: str, where: str, fix: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InputError(f"{where}: not valid JSON ({one_line(e)}); {fix}") from e


def read_json_document(filesystem: pafs.FileSystem, path: str, max_bytes: int, fix: str = DAMAGED,
                       what: str = "a raypack manifest") -> Any:
    """The JSON document at ``path``: at most ``max_bytes + 1`` bytes read, then
    :func:`parse_json_document`. InputError naming ``path`` when unreadable, larger or not JSON."""
    try:
        with filesystem.open_input_file(path) as f:  # read(n) allocates n: ask for the size, capped
            raw = f.read(min(f.size(), max_bytes + 1))
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"{path}: unreadable ({one_line(e)})") from e
    if len(raw) > max_bytes:
        raise InputError(f"{path}: larger than {max_bytes} bytes; not {what}")
    check_json_shape(raw, path, fix)
    text = _decode(raw, path, fix)
    del raw  # only the text stays alive while json.loads builds
    return _loads(text, path, fix)


class CheckedDocument(Mapping[str, Any]):
    """A checked JSON object, read-only: ``doc[key]`` is the field as the format names it;
    subclasses (one per manifest kind) add typed accessors and the check that builds them."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def to_dict(self) -> dict[str, Any]:
        """A deep copy, as JSON would give it."""
        return json.loads(json.dumps(self._data))

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)
