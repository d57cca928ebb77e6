"""The input formats, by name and suffix: one line per format. pyarrow only, no Ray.

A shard's format is named by its file's suffix (the longest registered suffix wins, lower case);
everything else asks the format object (raypack.inputs.base.InputFormat). To add a format, write
its module and add one line to ``FORMATS`` (README: "Adding an input format").
"""

from __future__ import annotations

from raypack.inputs.arrow import ArrowFormat
from raypack.inputs.base import InputFormat
from raypack.inputs.jsonl import JsonLinesFormat
from raypack.inputs.parquet import ParquetFormat

__all__ = ["FORMATS", "accepted_suffixes", "format_named", "format_of", "shard_format", "shard_suffix"]

FORMATS: dict[str, InputFormat] = {fmt.name: fmt for fmt in (
    ParquetFormat(),
    JsonLinesFormat(),
    ArrowFormat(),
)}
"""Name -> format, in the order messages list them."""


def format_named(name: str) -> InputFormat:
    """The registered format ``name``; ValueError naming the registered ones otherwise."""
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise ValueError(f"fmt={name!r} must be one of {', '.join(FORMATS)}")
    return fmt


def _suffixes() -> dict[str, InputFormat]:
    return {suffix: fmt for fmt in FORMATS.values() for suffix in fmt.suffixes}


def shard_suffix(path: str) -> str | None:
    """The longest registered suffix ending ``path``'s file name (lower case), else None."""
    name = path.rsplit("/", 1)[-1].lower()
    matches = [s for s in _suffixes() if name.endswith(s) and len(name) > len(s)]
    return max(matches, key=len) if matches else None


def format_of(path: str) -> InputFormat | None:
    """The format named by ``path``'s suffix, else None."""
    suffix = shard_suffix(path)
    return _suffixes()[suffix] if suffix else None


def shard_format(path: str) -> str | None:
    """The name of the format named by ``path``'s suffix ("parquet", "jsonl", "arrow", ...), else None."""
    fmt = format_of(path)
    return fmt.name if fmt else None


def accepted_suffixes() -> str:
    """The accepted shard suffixes, for error messages."""
    return ", ".join(_suffixes())
