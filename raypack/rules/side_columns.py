"""Side columns (``--extra-columns``): per-token list columns of the input packed with the tokens.

A side column holds one value per token of its document (a loss mask, labels, ...), of any
integer or bool type. Packing moves it with the tokens by the very same code: right after a
batch is read, the tokens and the side values become ONE numpy array of records (the record
dtype: the field ``input_ids`` of the token dtype, then one field per side column, e.g.
``[("input_ids", "<i4"), ("loss_mask", "i1")]``), and the packers (raypack.rules.core,
raypack.strategies.best_fit.rules) slice, join, gather and reshape it like a plain token array. Only what
creates padding needs the *pad value* (:func:`pad_value`: the pad token, then each column's
fill), and only the chunk writer splits the fields into columns again (:func:`split_fields`).
With no side columns nothing here is used: the token arrays stay plain. The packers see the
records as *opaque* bytes (``V{itemsize}``: numpy moves those with memcpy; a structured dtype
is copied field by field, 10-30x slower); the fields are read back by viewing them as the
structured :func:`record_dtype` again.

Specs are plain values so that they travel in PackSettings, resume records and manifests:
``SideColumn(name, type, fill)``; ``type`` is a numpy dtype name (``"bool"``, ``"int8"``, ...),
resolved at plan time from the inputs (:func:`common_side_type`).
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from raypack.errors import InputError

__all__ = ["RESERVED_NAMES", "SIDE_TYPES", "TOKEN_FIELD", "SideColumn", "check_fill", "combine", "common_side_type",
           "from_fields", "opaque", "packed_dtype", "pad_record", "pad_value", "parse_side_spec", "record_dtype",
           "split_fields"]

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


def record_dtype(token_dtype: npt.DTypeLike, columns: Sequence[SideColumn]) -> np.dtype:
    """One position's record: the structured dtype ``[(TOKEN_FIELD, token dtype), (name, type), ...]``
    (little-endian, packed: no gaps)."""
    token = np.dtype(token_dtype).newbyteorder("<")
    return np.dtype([(TOKEN_FIELD, token)] + [(c.name, np.dtype(c.type).newbyteorder("<")) for c in columns])


def packed_dtype(token_dtype: npt.DTypeLike, columns: Sequence[SideColumn]) -> np.dtype:
    """The array dtype the packers move: the token dtype itself without side columns, else opaque
    records (``V{itemsize}`` of :func:`record_dtype`): numpy copies, joins and gathers those as raw
    bytes, 10-30x faster than a structured dtype, whose copies go field by field."""
    if not columns:
        return np.dtype(token_dtype)
    return np.dtype((np.void, record_dtype(token_dtype, columns).itemsize))


def opaque(records: np.ndarray) -> np.ndarray:
    """Structured records as the packers' opaque records (a view)."""
    return records.view(np.dtype((np.void, records.dtype.itemsize)))


def pad_record(pad_token: int, columns: Sequence[SideColumn], token_dtype: npt.DTypeLike) -> np.void:
    """The padding position's record (structured): the pad token, then each column's fill."""
    return np.array((pad_token, *(c.fill for c in columns)), dtype=record_dtype(token_dtype, columns))[()]


def pad_value(pad_token: int, columns: Sequence[SideColumn], token_dtype: npt.DTypeLike) -> int | np.void:
    """What fills a padding position in :func:`packed_dtype`: ``pad_token``, or the opaque
    :func:`pad_record`."""
    if not columns:
        return pad_token
    return opaque(np.array(pad_record(pad_token, columns, token_dtype)))[()]


def split_fields(values: np.ndarray, record: np.dtype | None = None) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """``(tokens, side values)`` of packed values, each contiguous with ``values``' shape (one
    strided copy per field); ``(values, ())`` for plain tokens. Opaque records are read as
    ``record`` (:func:`record_dtype`); structured ones as they are."""
    if values.dtype.kind != "V":
        return values, ()
    if not values.dtype.names:
        if record is None or record.itemsize != values.dtype.itemsize:
            raise TypeError(f"values of dtype {values.dtype} need their record dtype to be split (got {record})")
        values = values.view(record)
    names = values.dtype.names
    return (np.ascontiguousarray(values[names[0]]), tuple(np.ascontiguousarray(values[name]) for name in names[1:]))


def combine(tokens: np.ndarray, sides: Sequence[np.ndarray], record: np.dtype) -> np.ndarray:
    """Tokens (already of the token field's dtype) and side values (same length, types that cast
    safely) as one (T,) array of structured ``record`` s (:func:`opaque` gives the packers' view).
    Cost: one interleaving copy of each."""
    out = np.empty(tokens.size, dtype=record)
    out[TOKEN_FIELD] = tokens
    for name, values in zip(record.names[1:], sides):
        if not np.can_cast(values.dtype, record[name], "safe"):
            raise ValueError(f"column {name} has values of type {values.dtype}; the output holds {record[name]}")
        out[name] = values
    return out


def from_fields(tokens: np.ndarray, sides: dict[str, np.ndarray]) -> np.ndarray:
    """Packed values (opaque records) from their fields by name, tokens first: for fragments
    coming back from a packer. Plain tokens when there are no side columns."""
    if not sides:
        return tokens
    record = np.dtype([(TOKEN_FIELD, tokens.dtype.newbyteorder("<"))]
                      + [(name, values.dtype.newbyteorder("<")) for name, values in sides.items()])
    return opaque(combine(tokens, list(sides.values()), record))


def side_value_types(schema: pa.Schema | None, names: tuple[str, ...], path: str) -> tuple[str, ...]:
    """The value type (a raypack.rules.side_columns.SIDE_TYPES name) of each side column ``names`` in
    ``schema`` (None: JSON Lines, whose numbers are read as int64); InputError naming the shard,
    the column and its type when one is missing or not a list of integers or bools."""
    if schema is None:
        return tuple("int64" for _ in names)
    types = []
    for name in names:
        if name not in schema.names:
            raise InputError(f"shard {path} has no column {name!r} (an extra column); its columns are "
                             f"{schema.names}; drop it from extra_columns or add it to every shard")
        field_type = schema.field(name).type
        value_type = field_type.value_type if pa.types.is_list(field_type) or pa.types.is_large_list(field_type) \
            else None
        if value_type is None or not (pa.types.is_integer(value_type) or pa.types.is_boolean(value_type)):
            raise InputError(f"shard {path} column {name!r} has type {field_type}; an extra column must be a list "
                             "of integers or bools (one value per token)")
        types.append("bool" if pa.types.is_boolean(value_type) else value_type.to_pandas_dtype().__name__)
    return tuple(types)
