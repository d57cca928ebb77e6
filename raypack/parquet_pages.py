"""Page-level streaming of a Parquet token column: a huge document in pieces of bounded size.

pyarrow decodes a row whole, so one 50M-token document costs the reader ~10x its bytes. This
module reads one row group's token column page by page (numpy/pyarrow only; Python per page
and per level run, never per token) and yields it as :class:`TokenPiece` s of at most
``max_tokens`` values each, cutting a longer document into consecutive pieces:

  1. locate the column chunk from the footer and read each page (header + body) at its offset;
  2. parse the page header (Thrift compact protocol, ``_read_struct``), decompress the body
     with ``pyarrow.Codec``;
  3. decode repetition/definition levels (RLE/bit-packed hybrid, ``_decode_hybrid``) and the
     values (PLAIN, or dictionary indices into the PLAIN dictionary page);
  4. pass 1 reads levels only: every document's full length (rows start at repetition level
     0), nulls rejected; pass 2 reads values and cuts the row group's token stream every
     ``max_tokens`` tokens (as :func:`raypack.core.iter_run_slices`).

Memory: one page, one piece (``max_tokens`` values) and 8 bytes per row of the row group.
Cost: the levels are decoded twice (pass 1 and 2). Anything this reader does not handle
(an encoding, a page type, a schema shape, a codec) raises :class:`Unsupported` before the
first piece of the row group, so the caller reads that row group with pyarrow instead;
a malformed page raises InputError.
"""

from __future__ import annotations

import functools
from typing import Iterator, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.errors import InputError

__all__ = ["TokenPiece", "Unsupported", "iter_row_group_pieces"]

_CODECS = {"UNCOMPRESSED": None, "SNAPPY": "snappy", "GZIP": "gzip", "ZSTD": "zstd",
           "LZ4_RAW": "lz4_raw", "BROTLI": "brotli"}
_PLAIN, _PLAIN_DICTIONARY, _RLE, _RLE_DICTIONARY = 0, 2, 3, 8
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3
_PHYSICAL = {"INT32": np.dtype("<i4"), "INT64": np.dtype("<i8")}
_HEADER_READ = 1 << 12
_WINDOW = 1 << 18
"""Levels decoded at a time."""
_MAX_HEADER = 1 << 24


class TokenPiece(NamedTuple):
    """Consecutive documents of a shard, the first and last possibly cut (one piece of a longer one)."""

    first_row: int
    """Shard-local row of ``docs[0]``."""
    docs: pa.ListArray | pa.LargeListArray
    """The tokens of the piece, one list per document (or document piece)."""
    continued: bool
    """``docs[0]`` continues the previous piece's last document (same row)."""
    doc_lens: npt.NDArray[np.int64]
    """Full lengths of the documents that start in this piece (all but a continued first one)."""


class Unsupported(Exception):
    """This row group needs pyarrow's reader (raised before any piece of it is yielded)."""


class _Page(NamedTuple):
    reps: np.ndarray
    defs: np.ndarray
    values: np.ndarray | None


# ---------------------------------------------------------------------------------------------
# Thrift compact protocol (only what a PageHeader needs; unknown fields are skipped by type)


class _Truncated(Exception):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _Truncated
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _zigzag(buf: bytes, pos: int) -> tuple[int, int]:
    n, pos = _varint(buf, pos)
    return (n >> 1) ^ -(n & 1), pos


def _read_value(buf: bytes, pos: int, ttype: int, depth: int):
    if ttype in (1, 2):
        return ttype == 1, pos
    if ttype == 3:
        if pos >= len(buf):
            raise _Truncated
        return buf[pos], pos + 1
    if ttype in (4, 5, 6):
        return _zigzag(buf, pos)
    if ttype == 7:
        if pos + 8 > len(buf):
            raise _Truncated
        return None, pos + 8
    if ttype == 8:
        size, pos = _varint(buf, pos)
        if pos + size > len(buf):
            raise _Truncated
        return buf[pos:pos + size], pos + size
    if ttype in (9, 10):
        return _read_list(buf, pos, depth)
    if ttype == 11:
        return _read_map(buf, pos, depth)
    if ttype == 12:
        return _read_struct(buf, pos, depth + 1)
    raise ValueError(f"unknown Thrift type {ttype}")


def _read_list(buf: bytes, pos: int, depth: int):
    if pos >= len(buf):
        raise _Truncated
    head, pos = buf[pos], pos + 1
    size, etype = head >> 4, head & 0x0F
    if size == 15:
        size, pos = _varint(buf, pos)
    items = []
    for _ in range(size):
        if etype in (1, 2):  # booleans in a list take one byte each
            item, pos = _read_value(buf, pos, 3, depth)
        else:
            item, pos = _read_value(buf, pos, etype, depth)
        items.append(item)
    return items, pos


def _read_map(buf: bytes, pos: int, depth: int):
    size, pos = _varint(buf, pos)
    if size == 0:
        return {}, pos
    if pos >= len(buf):
        raise _Truncated
    types, pos = buf[pos], pos + 1
    for _ in range(2 * size):
        _, pos = _read_value(buf, pos, (types >> 4) if _ % 2 == 0 else (types & 0x0F), depth)
    return {}, pos


def _read_struct(buf: bytes, pos: int, depth: int = 0) -> tuple[dict[int, object], int]:
    """A compact-protocol struct at ``buf[pos:]`` as {field id: value}, and the position after it."""
    if depth > 16:
        raise ValueError("Thrift structs nested too deep")
    fields: dict[int, object] = {}
    field_id = 0
    while True:
        if pos >= len(buf):
            raise _Truncated
        head, pos = buf[pos], pos + 1
        if head == 0:
            return fields, pos
        delta, ttype = head >> 4, head & 0x0F
        if delta:
            field_id += delta
        else:
            field_id, pos = _zigzag(buf, pos)
        fields[field_id], pos = _read_value(buf, pos, ttype, depth)


# ---------------------------------------------------------------------------------------------
# Levels and values, decoded a window at a time


class _Hybrid:
    """The RLE/bit-packed hybrid encoding in ``data``, decoded on demand: ``read(n)`` gives the
    next n values as (n,) uint32. Memory: the values read, plus ``n * bit_width`` bytes."""

    def __init__(self, data: memoryview, bit_width: int) -> None:
        if not 0 <= bit_width <= 32:
            raise ValueError(f"bit width {bit_width} is not 0..32")
        self.data, self.width, self.pos = data, bit_width, 0
        self.run_left = self.run_value = self.packed_done = 0
        self.packed_start = -1

    def read(self, n: int) -> np.ndarray:
        if self.width == 0:
            return np.zeros(n, np.uint32)
        parts = []
        while n:
            if self.run_left == 0:
                self._next_run()
            m = min(n, self.run_left)
            parts.append(self._take(m))
            n, self.run_left = n - m, self.run_left - m
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def _next_run(self) -> None:
        header, self.pos = _varint(self.data, self.pos)
        if header & 1:  # bit-packed: (header >> 1) groups of 8 values (the last may be cut short)
            nbytes = min((header >> 1) * self.width, len(self.data) - self.pos)
            self.packed_start, self.packed_done, self.run_left = self.pos, 0, nbytes * 8 // self.width
            self.pos += nbytes
        else:
            nbytes = (self.width + 7) // 8
            if self.pos + nbytes > len(self.data):
                raise _Truncated
            self.run_value = int.from_bytes(self.data[self.pos:self.pos + nbytes], "little")
            self.packed_start, self.run_left = -1, header >> 1
            self.pos += nbytes

    def _take(self, m: int) -> np.ndarray:
        if self.packed_start < 0:
            return np.full(m, self.run_value, np.uint32)
        values = _unpack(self.data, self.packed_start, self.packed_done, m, self.width)
        self.packed_done += m
        return values


def _unpack(data: memoryview, start: int, first: int, m: int, width: int) -> np.ndarray:
    """(m,) uint32: values ``first .. first+m`` of the bit-packed run at byte ``start``."""
    bit_start = first * width
    byte_start, shift = start + bit_start // 8, bit_start % 8
    if width in (8, 16, 32) and shift == 0:
        return np.frombuffer(data, f"<u{width // 8}", m, byte_start).astype(np.uint32)
    num_bytes = (shift + m * width + 7) // 8
    bits = np.unpackbits(np.frombuffer(data, np.uint8, num_bytes, byte_start), bitorder="little")
    packed = np.packbits(bits[shift:shift + m * width].reshape(m, width), axis=1, bitorder="little")
    if packed.shape[1] == 3:
        packed = np.concatenate([packed, np.zeros((m, 1), np.uint8)], axis=1)
    return np.ascontiguousarray(packed).view(f"<u{packed.shape[1]}").reshape(m).astype(np.uint32)


def _v1_levels(body: memoryview, pos: int, bit_width: int) -> tuple[_Hybrid, int]:
    if pos + 4 > len(body):
        raise _Truncated
    size = int.from_bytes(body[pos:pos + 4], "little")
    if pos + 4 + size > len(body):
        raise _Truncated
    return _Hybrid(body[pos + 4:pos + 4 + size], bit_width), pos + 4 + size


class _PageCursor:
    """One data page's levels and values, read ``window`` levels at a time."""

    def __init__(self, chunk: _Chunk, num_levels: int, reps: _Hybrid, defs: _Hybrid, values, encoding: int):
        self.chunk, self.num_levels, self.reps, self.defs = chunk, num_levels, reps, defs
        self.values, self.encoding, self.pos, self.indices = values, encoding, 0, None

    def windows(self, window: int, with_values: bool) -> Iterator[_Page]:
        for start in range(0, self.num_levels, window):
            m = min(window, self.num_levels - start)
            reps, defs = self.reps.read(m), self.defs.read(m)
            count = int(np.count_nonzero(defs == self.chunk.max_def))
            yield _Page(reps, defs, self._read_values(count) if with_values else None)

    def _read_values(self, count: int) -> np.ndarray:
        chunk = self.chunk
        if callable(self.values):
            self.values = self.values()  # v2: decompress the values on first use
        if self.encoding == _PLAIN:
            size = count * chunk.physical.itemsize
            if self.pos + size > len(self.values):
                raise _Truncated
            raw = np.frombuffer(self.values, chunk.physical, count, self.pos)
            self.pos += size
            return raw.astype(chunk.dtype, copy=False)  # INT32/INT64 bits, cast modulo 2**n as pyarrow does
        if count == 0:
            return np.zeros(0, chunk.dtype)
        if chunk.dictionary is None:
            raise ValueError("dictionary-encoded page without a dictionary page")
        if self.indices is None:
            if len(self.values) < 1:
                raise _Truncated
            self.indices = _Hybrid(self.values[1:], self.values[0])
        indices = self.indices.read(count)
        if indices.size and int(indices.max()) >= chunk.dictionary.size:
            raise ValueError(f"dictionary index {int(indices.max())} >= dictionary size {chunk.dictionary.size}")
        return chunk.dictionary[indices].astype(chunk.dtype, copy=False)


def _as_bytes(data) -> memoryview:
    return memoryview(data).cast("B")


def _plain(body: memoryview, dtype: np.dtype, count: int) -> np.ndarray:
    if len(body) < count * dtype.itemsize:
        raise _Truncated
    return np.frombuffer(body, dtype, count)


# ---------------------------------------------------------------------------------------------
# The column chunk


class _Chunk:
    """One row group's token leaf column: its pages, decoded one at a time."""

    def __init__(self, source: pa.NativeFile, parquet_file: pq.ParquetFile, group: int, leaf: int,
                 value_type: pa.DataType, max_def: int) -> None:
        meta = parquet_file.metadata.row_group(group).column(leaf)
        physical = parquet_file.schema.column(leaf).physical_type
        if meta.compression not in _CODECS or physical not in _PHYSICAL:
            raise Unsupported(f"compression {meta.compression}, physical type {physical}")
        codec = _CODECS[meta.compression]
        self.codec = pa.Codec(codec) if codec else None
        self.source, self.max_def, self.num_levels = source, max_def, meta.num_values
        self.physical = _PHYSICAL[physical]
        self.dtype = np.dtype(value_type.to_pandas_dtype())
        self.start = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
        self.end = self.start + meta.total_compressed_size
        self.dictionary: np.ndarray | None = None

    def windows(self, with_values: bool) -> Iterator[_Page]:
        """The data pages' levels (and values) in order, at most _WINDOW levels at a time."""
        pos, num_levels = self.start, 0
        while pos < self.end:
            header, body_pos = self._header(pos)
            size = _field(header, 3)
            if size < 0 or body_pos + size > self.end:
                raise ValueError(f"page of {size} bytes runs past the column chunk")
            kind = _field(header, 1)
            if kind == _DICTIONARY_PAGE:
                self._read_dictionary(header, body_pos, size, with_values)
            elif kind in (_DATA_PAGE, _DATA_PAGE_V2):
                page = self._data_page(header, self._read(body_pos, size))
                num_levels += page.num_levels
                yield from page.windows(_WINDOW, with_values)
            elif kind != _INDEX_PAGE:
                raise Unsupported(f"page type {kind}")
            pos = body_pos + size
        if num_levels != self.num_levels:
            raise ValueError(f"the pages hold {num_levels} levels, the footer says {self.num_levels}")

    def _read(self, pos: int, size: int) -> bytes:
        data = self.source.read_at(size, pos)
        if len(data) < size:
            raise _Truncated
        return data

    def _header(self, pos: int) -> tuple[dict, int]:
        size = _HEADER_READ
        while True:
            buf = self.source.read_at(min(size, self.end - pos), pos)
            try:
                header, used = _read_struct(buf, 0)
                return header, pos + used
            except _Truncated:
                if len(buf) < min(size, self.end - pos) or size >= min(_MAX_HEADER, self.end - pos):
                    raise
                size *= 8

    def _read_dictionary(self, header: dict, pos: int, size: int, with_values: bool) -> None:
        head = _field(header, 7, dict)
        if _field(head, 2) not in (_PLAIN, _PLAIN_DICTIONARY):
            raise Unsupported(f"dictionary encoding {_field(head, 2)}")
        if not with_values:
            return
        body = self._decompress(_as_bytes(self._read(pos, size)), _field(header, 2))
        self.dictionary = _plain(body, self.physical, _field(head, 1)).copy()

    def _data_page(self, header: dict, raw: bytes) -> _PageCursor:
        raw, uncompressed, def_width = _as_bytes(raw), _field(header, 2), self.max_def.bit_length()
        if _field(header, 1) == _DATA_PAGE:
            head = _field(header, 5, dict)
            encoding, count = _field(head, 2), _field(head, 1)
            if _field(head, 3) != _RLE or _field(head, 4) != _RLE:
                raise Unsupported("levels not RLE-encoded")
            body = self._decompress(raw, uncompressed)
            reps, pos = _v1_levels(body, 0, 1)
            defs, pos = _v1_levels(body, pos, def_width) if self.max_def else (_Hybrid(body, 0), pos)
            values = body[pos:]
        else:
            head = _field(header, 8, dict)
            encoding, count, def_size, rep_size = _field(head, 4), _field(head, 1), _field(head, 5), _field(head, 6)
            if min(def_size, rep_size) < 0 or rep_size + def_size > len(raw):
                raise _Truncated
            reps, defs = _Hybrid(raw[:rep_size], 1), _Hybrid(raw[rep_size:rep_size + def_size], def_width)
            values = raw[rep_size + def_size:]
            if _field(head, 7, bool) if 7 in head else True:
                values = functools.partial(self._decompress, values, uncompressed - rep_size - def_size)
        if encoding not in (_PLAIN, _PLAIN_DICTIONARY, _RLE_DICTIONARY):
            raise Unsupported(f"value encoding {encoding}")
        if count < 0:
            raise ValueError(f"num_values {count} < 0")
        return _PageCursor(self, count, reps, defs, values, encoding)

    def _decompress(self, data: memoryview, size: int) -> memoryview:
        if self.codec is None:
            return data
        return _as_bytes(self.codec.decompress(data, decompressed_size=size))


def _field(struct: dict, field_id: int, kind: type = int):
    value = struct.get(field_id)
    if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
        raise ValueError(f"page header field {field_id} is missing or not {kind.__name__}")
    return value


# ---------------------------------------------------------------------------------------------
# Row groups as pieces


def iter_row_group_pieces(source: pa.NativeFile, parquet_file: pq.ParquetFile, group: int, column: str,
                          first_row: int, max_tokens: int, path: str) -> Iterator[TokenPiece]:
    """Row group ``group``'s ``column`` as :class:`TokenPiece` s of at most ``max_tokens`` tokens.

    ``first_row``: shard-local row of the row group's first row. Raises Unsupported (before
    the first piece) when pyarrow must read this row group; InputError for a malformed page
    or a null document/token. Pieces cut the row group's tokens every ``max_tokens``; an
    empty document goes with the piece holding its position (the last one at the end).
    """
    field = parquet_file.schema_arrow.field(column)
    leaf = _leaf_index(parquet_file, column, field)
    chunk = _Chunk(source, parquet_file, group, leaf, field.type.value_type,
                   parquet_file.schema.column(leaf).max_definition_level)
    with _page_errors(path, group):
        doc_lens = _row_lengths(chunk, field, path, first_row, parquet_file.metadata.row_group(group).num_rows)
    ends = np.cumsum(doc_lens)
    starts = ends - doc_lens
    values = _value_stream(chunk, path, group)
    num_tokens = int(ends[-1]) if ends.size else 0
    num_slices = max(1, -(-num_tokens // max_tokens))
    first_slice = np.minimum(starts // max_tokens, num_slices - 1)
    last_slice = np.minimum(np.maximum(starts, ends - 1) // max_tokens, num_slices - 1)
    offsets_type = np.int64 if pa.types.is_large_list(field.type) else np.int32
    list_class = pa.LargeListArray if pa.types.is_large_list(field.type) else pa.ListArray
    for k in range(num_slices):
        lo = int(np.searchsorted(last_slice, k, side="left"))
        hi = int(np.searchsorted(first_slice, k, side="right"))
        start, end = k * max_tokens, min((k + 1) * max_tokens, num_tokens)
        tokens = values.take(end - start)
        offsets = np.concatenate([[start], np.clip(ends[lo:hi], start, end)]) - start
        tokens = np.zeros(0, chunk.dtype) if tokens is None else tokens
        docs = list_class.from_arrays(pa.array(offsets.astype(offsets_type)), pa.array(tokens, field.type.value_type),
                                      type=field.type)
        continued = bool(lo < hi and starts[lo] < start)
        yield TokenPiece(first_row + lo, docs, continued, doc_lens[lo + continued:hi])


def _leaf_index(parquet_file: pq.ParquetFile, column: str, field: pa.Field) -> int:
    schema = parquet_file.schema
    leaves = [i for i in range(len(schema)) if schema.column(i).path.startswith(column + ".")]
    if len(leaves) != 1 or schema.column(leaves[0]).max_repetition_level != 1:
        raise Unsupported(f"column {column} is not one repeated leaf")
    max_def = schema.column(leaves[0]).max_definition_level
    value_field = field.type.value_field
    if max_def != 1 + field.nullable + value_field.nullable:
        raise Unsupported(f"definition levels {max_def} for {field}")
    return leaves[0]


def _row_lengths(chunk: _Chunk, field: pa.Field, path: str, first_row: int, num_rows: int) -> np.ndarray:
    """Pass 1, levels only: (num_rows,) int64 document lengths; a null document or token raises."""
    empty_def = chunk.max_def - 1 - field.type.value_field.nullable
    row_starts, num_values, num_levels, num_started = [], 0, 0, 0
    for page in chunk.windows(with_values=False):
        if num_levels == 0 and page.reps.size and page.reps[0] != 0:
            raise ValueError("the first level does not start a row")
        _check_nulls(page, empty_def, chunk.max_def, path, first_row + num_started)
        is_value = page.defs == chunk.max_def
        before = np.cumsum(is_value) - is_value
        row_starts.append(before[page.reps == 0] + num_values)
        num_values += int(is_value.sum())
        num_levels += page.reps.size
        num_started += row_starts[-1].size
    starts = np.concatenate(row_starts + [np.array([num_values])]).astype(np.int64)
    if starts.size - 1 != num_rows:
        raise ValueError(f"the pages hold {starts.size - 1} rows, the footer says {num_rows}")
    return np.diff(starts)


def _check_nulls(page: _Page, empty_def: int, max_def: int, path: str, first_row: int) -> None:
    bad = (page.defs < empty_def) | ((page.defs > empty_def) & (page.defs < max_def))
    if page.defs.size and int(page.defs.max()) > max_def:
        raise ValueError(f"definition level {int(page.defs.max())} > {max_def}")
    if not bad.any():
        return
    at = int(np.argmax(bad))
    row = first_row + int(np.count_nonzero(page.reps[:at + 1] == 0)) - 1
    if page.defs[at] < empty_def:
        raise InputError(f"shard {path} row {row}: the document is null; every document must be "
                         "a list of token ids (write [] for an empty document)")
    raise InputError(f"shard {path} row {row}: a token of the document is null; token ids must be "
                     "non-null integers")


class _ValueStream:
    """Pass 2: the row group's token values in order, taken ``n`` at a time (copied out of pages)."""

    def __init__(self, pages: Iterator[np.ndarray]) -> None:
        self.pages, self.parts, self.num_buffered = pages, [], 0

    def take(self, n: int) -> np.ndarray | None:
        if n == 0:
            return None
        while self.num_buffered < n:
            part = next(self.pages)
            self.parts.append(part)
            self.num_buffered += part.size
        joined = np.concatenate(self.parts) if len(self.parts) != 1 else self.parts[0]
        self.parts, self.num_buffered = ([joined[n:]] if joined.size > n else []), joined.size - n
        return joined[:n]


def _value_stream(chunk: _Chunk, path: str, group: int) -> _ValueStream:
    def values() -> Iterator[np.ndarray]:
        with _page_errors(path, group):
            for page in chunk.windows(with_values=True):
                yield page.values
        raise InputError(f"shard {path} row group {group}: the pages hold fewer tokens than their levels; "
                         "re-write the file")

    return _ValueStream(values())


class _page_errors:
    """Turn a malformed page (truncated, bad header, bad levels) into an InputError naming the file."""

    def __init__(self, path: str, group: int) -> None:
        self.path, self.group = path, group

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None or kind in (InputError, Unsupported, GeneratorExit) or not issubclass(
                kind, (_Truncated, ValueError, OSError, pa.ArrowException, IndexError)):
            return False
        reason = "truncated" if kind is _Truncated else str(error).splitlines()[0] if str(error) else kind.__name__
        raise InputError(f"shard {self.path} row group {self.group}: malformed Parquet page ({reason}); "
                         "re-write the file") from error
