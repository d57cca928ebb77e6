"""Side columns (``--extra-columns``): per-token list columns of the input packed with the tokens.

A side column holds one value per token of its document (a loss mask, labels, ...), of any
integer or bool type. Packing moves it with the tokens by the very same code: right after a
batch is read, the tokens and the side values become ONE numpy structured array (``packed
dtype``: the field ``input_ids`` of the token dtype, then one field per side column, e.g.
``[("input_ids", "<i4"), ("loss_mask", "i1")]``), and the packers (raypack.core,
raypack.best_fit) slice, join, gather and reshape it like a plain token array. Only what
creates padding needs the *pad value* (:func:`pad_value`: the pad token, then each column's
fill), and only the chunk writer splits the fields into columns again (:func:`split_fields`).
With no side columns nothing here is used: the token arrays stay plain.

Specs are plain values so that they travel in PackSettings, resume records and manifests:
``SideColumn(name, type, fill)``; ``type`` is a numpy dtype name (``"bool"``, ``"int8"``, ...),
resolved at plan time from the inputs (:func:`common_side_type`).
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["RESERVED_NAMES", "SIDE_TYPES", "TOKEN_FIELD", "SideColumn", "combine", "common_side_type",
           "packed_dtype", "pad_value", "parse_side_spec", "split_fields", "token_field"]

TOKEN_FIELD = "input_ids"
"""The tokens' field in a packed structured array (the output column's name)."""
RESERVED_NAMES = ("chunk_index", "input_ids", "segment_doc_ids", "segment_lengths", "doc_ids", "attention_mask",
                  "position_ids")
"""Output columns and read-side keys a side column may not be named."""
SIDE_TYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
"""The value types a side column may have (numpy names; Arrow's bool is numpy's bool)."""


class SideColumn(NamedTuple):
    """One side column: its name, value type (a :data:`SIDE_TYPES` name) and padding fill."""

    name: str
    type: str
    fill: int = 0


def parse_side_spec(spec: Any) -> tuple[str, int]:
    """``"NAME"`` or ``"NAME=FILL"`` as ``(name, fill)``; ValueError naming the spec otherwise."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"extra column {spec!r} must be a string NAME or NAME=FILL (e.g. loss_mask, labels=-100)")
    name, sep, fill_text = spec.partition("=")
    name = name.strip()
    if not name or name in RESERVED_NAMES:
        raise ValueError(f"extra column {spec!r}: the name must be a column of the input other than "
                         f"{', '.join(RESERVED_NAMES)}")
    if not sep:
        return name, 0
    try:
        return name, int(fill_text.strip())
    except ValueError:
        raise ValueError(f"extra column {spec!r}: FILL must be an integer (e.g. labels=-100)") from None


def check_fill(column: SideColumn) -> None:
    """ValueError unless ``column.fill`` fits ``column.type`` (bool: 0 or 1)."""
    fill = column.fill
    if isinstance(fill, bool) or not isinstance(fill, numbers.Integral):
        raise ValueError(f"extra column {column.name}: fill={fill!r} must be an integer")
    low, high = (0, 1) if column.type == "bool" else (np.iinfo(column.type).min, np.iinfo(column.type).max)
    if not low <= fill <= high:
        raise ValueError(f"extra column {column.name}: fill={fill} does not fit its type {column.type} "
                         f"({low}..{high}); choose a fill in that range")


def common_side_type(types: Sequence[str]) -> str | None:
    """The one type holding every shard's values of a side column (numpy promotion), or None when
    none does (uint64 with a signed type)."""
    dtype = np.result_type(*[np.dtype(t) for t in types])
    return dtype.name if dtype.name in SIDE_TYPES else None


def packed_dtype(token_dtype: npt.DTypeLike, columns: Sequence[SideColumn]) -> np.dtype:
    """The array dtype the packers move: the token dtype itself without side columns, else the
    structured dtype ``[(TOKEN_FIELD, token dtype), (name, type), ...]`` (little-endian, packed)."""
    token = np.dtype(token_dtype)
    if not columns:
        return token
    return np.dtype([(TOKEN_FIELD, token.newbyteorder("<"))] + [(c.name, np.dtype(c.type)) for c in columns])


def pad_value(pad_token: int, columns: Sequence[SideColumn], token_dtype: npt.DTypeLike) -> int | np.void:
    """What fills a padding position: ``pad_token``, or with side columns a scalar of the packed
    dtype holding the pad token and each column's fill."""
    if not columns:
        return pad_token
    return np.array((pad_token, *(c.fill for c in columns)), dtype=packed_dtype(token_dtype, columns))[()]


def token_field(values: np.ndarray) -> np.ndarray:
    """The tokens of a packed array (a strided view when it is structured; itself otherwise)."""
    return values[TOKEN_FIELD] if values.dtype.names else values


def split_fields(values: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """``(tokens, side values)`` of a packed array, each contiguous with ``values``' shape (one
    copy per field when structured; ``(values, ())`` otherwise)."""
    names = values.dtype.names
    if not names:
        return values, ()
    return (np.ascontiguousarray(values[TOKEN_FIELD]),
            tuple(np.ascontiguousarray(values[name]) for name in names[1:]))


def combine(tokens: np.ndarray, sides: Sequence[np.ndarray], dtype: np.dtype) -> np.ndarray:
    """Tokens (already of the token field's dtype) and side values (same length, types that cast
    safely) as one (T,) array of the packed ``dtype``. Cost: one interleaving copy of each."""
    out = np.empty(tokens.size, dtype=dtype)
    out[TOKEN_FIELD] = tokens
    for name, values in zip(dtype.names[1:], sides):
        if not np.can_cast(values.dtype, dtype[name], "safe"):
            raise ValueError(f"column {name} has values of type {values.dtype}; the output holds {dtype[name]}")
        out[name] = values
    return out


def from_fields(tokens: np.ndarray, sides: dict[str, np.ndarray]) -> np.ndarray:
    """A packed array from its fields by name (tokens first), for fragments coming back from a packer."""
    if not sides:
        return tokens
    dtype = np.dtype([(TOKEN_FIELD, tokens.dtype)] + [(name, values.dtype) for name, values in sides.items()])
    return combine(tokens, list(sides.values()), dtype)
