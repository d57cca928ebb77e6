"""Edit one integer of a Parquet file's footer (Thrift compact protocol), as a hostile writer would: a test
helper written apart from raypack.inputs.parquet_pages, which it is used to test."""

from __future__ import annotations

import struct


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _walk_struct(data: bytes, i: int, path: tuple, found: dict) -> int:
    last = 0
    while True:
        header = data[i]
        i += 1
        if header == 0:
            return i
        kind = header & 0x0F
        if header >> 4:
            last += header >> 4
        else:
            raw, i = _varint(data, i)
            last = (raw >> 1) ^ -(raw & 1)
        i = _walk_value(data, i, kind, (*path, last), found)


def _walk_value(data: bytes, i: int, kind: int, path: tuple, found: dict) -> int:
    if kind in (1, 2):
        return i
    if kind == 3:
        return i + 1
    if kind in (4, 5, 6):
        start = i
        _, i = _varint(data, i)
        found[path] = (start, i)
        return i
    if kind == 7:
        return i + 8
    if kind == 8:
        n, i = _varint(data, i)
        return i + n
    if kind in (9, 10):
        header = data[i]
        i += 1
        n, element = header >> 4, header & 0x0F
        if n == 15:
            n, i = _varint(data, i)
        for k in range(n):
            i = i + 1 if element in (1, 2) else _walk_value(data, i, element, (*path, k), found)
        return i
    if kind == 11:
        n, i = _varint(data, i)
        if n:
            types = data[i]
            i += 1
            for _ in range(n):
                i = _walk_value(data, i, types >> 4, (*path, "key"), found)
                i = _walk_value(data, i, types & 0x0F, (*path, "value"), found)
        return i
    if kind == 12:
        return _walk_struct(data, i, path, found)
    raise ValueError(f"Thrift type {kind}")


def set_footer_int(data: bytes, path: tuple, value: int) -> bytes:
    """``data`` (a whole Parquet file) with the integer at ``path`` of its FileMetaData set to ``value``:
    (3,) the file's num_rows; (4, g, 3) row group g's num_rows; (4, g, 1, c, 3, 5) column c's num_values,
    (4, g, 1, c, 3, 6) its total_uncompressed_size."""
    length = struct.unpack("<I", data[-8:-4])[0]
    footer_start = len(data) - 8 - length
    found: dict = {}
    _walk_struct(data, footer_start, (), found)
    start, end = found[path]
    zigzag = (value << 1) ^ (value >> 63)
    encoded = bytearray()
    while True:
        byte, zigzag = zigzag & 0x7F, zigzag >> 7
        encoded.append(byte | (0x80 if zigzag else 0))
        if not zigzag:
            break
    edited = data[:start] + bytes(encoded) + data[end:-8]
    return edited + struct.pack("<I", length + len(encoded) - (end - start)) + b"PAR1"
