"""A reader of the Thrift compact protocol, enough for Parquet page headers (raypack.inputs.parquet_pages).

``read_struct(buf, pos)`` gives a struct as {field id: value}: integers as int, booleans as
bool, binary as bytes, lists and sets as lists, structs as dicts, maps as {} (skipped), doubles
as None (skipped). Unknown fields are kept by id, so a caller reads the ids it knows and ignores
the rest. Python per field (a page header has about ten). A buffer that ends inside the struct
raises :class:`Truncated` (read more and retry); a malformed one, ValueError.
"""

from __future__ import annotations

__all__ = ["Truncated", "need", "read_struct", "read_varint"]




class Truncated(Exception):
    """The buffer ends inside the value being read."""


def need(buf, end: int) -> None:
    """Raise Truncated unless ``buf`` holds ``end`` bytes."""
    if end > len(buf):
        raise Truncated


def read_varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while shift < 70:
        need(buf, pos + 1)
        byte, pos = buf[pos], pos + 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def _zigzag(buf, pos: int) -> tuple[int, int]:
    n, pos = read_varint(buf, pos)
    return (n >> 1) ^ -(n & 1), pos


def _read_value(buf, pos: int, ttype: int, depth: int):
    """One compact-protocol value of type ``ttype`` at ``pos``: (value, position after it)."""
    if ttype in (1, 2):  # a boolean field: the value is in the type
        return ttype == 1, pos
    if ttype in (3, 7):  # byte, double
        need(buf, pos + (1 if ttype == 3 else 8))
        return (buf[pos] if ttype == 3 else None), pos + (1 if ttype == 3 else 8)
    if ttype in (4, 5, 6):
        return _zigzag(buf, pos)
    if ttype == 8:
        size, pos = read_varint(buf, pos)
        need(buf, pos + size)
        return bytes(buf[pos:pos + size]), pos + size
    if ttype == 12:
        return read_struct(buf, pos, depth + 1)
    if ttype not in (9, 10, 11):
        raise ValueError(f"unknown Thrift type {ttype}")
    if ttype == 11:  # map: size, then key and value types (absent when empty)
        size, pos = read_varint(buf, pos)
        need(buf, pos + (size > 0))
        types, pos = (buf[pos], pos + 1) if size else ([0, 0], pos)
        item_types = [types >> 4, types & 0x0F] * size if size else []
    else:  # list, set: size and element type in one byte (size 15: a varint follows)
        need(buf, pos + 1)
        head, pos = buf[pos], pos + 1
        size = head >> 4
        if size == 15:
            size, pos = read_varint(buf, pos)
        item_types = [3 if head & 0x0F in (1, 2) else head & 0x0F] * size  # list booleans: one byte each
    items = []
    for item_type in item_types:
        item, pos = _read_value(buf, pos, item_type, depth)
        items.append(item)
    return items, pos


def read_struct(buf, pos: int, depth: int = 0) -> tuple[dict[int, object], int]:
    """A compact-protocol struct at ``buf[pos:]`` as {field id: value}, and the position after it."""
    if depth > 16:
        raise ValueError("Thrift structs nested too deep")
    fields: dict[int, object] = {}
    field_id = 0
    while True:
        need(buf, pos + 1)
        head, pos = buf[pos], pos + 1
        if head == 0:
            return fields, pos
        if head >> 4:
            field_id += head >> 4
        else:
            field_id, pos = _zigzag(buf, pos)
        fields[field_id], pos = _read_value(buf, pos, head & 0x0F, depth)
