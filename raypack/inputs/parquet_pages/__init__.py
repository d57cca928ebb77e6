"""Page-level streaming of a Parquet token column: a huge document in pieces of bounded size.

pyarrow decodes a row whole (one 50M-token row: ~10x its bytes). This module reads one row
group's token column page by page, numpy/pyarrow only (Python per page, window and level run,
never per token), and yields :class:`TokenPiece` s of at most ``max_tokens`` tokens:

  1. find the column chunk in the footer; read each page (header, body) at its offset;
  2. parse the page header (raypack.inputs.parquet_pages.thrift_compact); read and decompress the body in parts of
     about 4 MiB as it is decoded (raypack.inputs.parquet_pages.page_streams; levels of v1 pages copied out first);
  3. decode levels (RLE/bit-packed hybrid, ``_Hybrid``) and values (PLAIN, or dictionary
     indices into the PLAIN dictionary page), ``_WINDOW`` levels at a time;
  4. pass 1, levels only: each document's full length (a row starts at repetition level 0),
     nulls rejected; pass 2, values: the row group's tokens cut every ``max_tokens`` (as
     :func:`raypack.rules.core.iter_run_slices` cuts a batch).

Memory: one part of a page body (compressed and decompressed; the whole body for lz4, small
pages and snappy not written in 64 KiB fragments: a one-row page holds the whole document,
~2 bytes/token for 16-bit dictionary indices, 4 for PLAIN int32), a v1 page's levels, a window
of levels, one piece and 8 bytes per row. Cost: levels decoded twice; 5-10x slower than
pyarrow on short documents (per-run Python); a large snappy page adds a Python walk of its
elements (~5M/s; ~0.2-0.3 per 16-bit token of text, few on incompressible tokens). What this
reader does not handle raises :class:`Unsupported` before the row group's first piece (the
caller uses pyarrow); a malformed page raises InputError.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.errors import InputError
from raypack.inputs.parquet_pages.page_streams import iter_body_parts
from raypack.inputs.parquet_pages.thrift_compact import Truncated, need, read_struct, read_varint

__all__ = ["TokenPiece", "Unsupported", "iter_row_group_pieces"]

_CODECS = {"UNCOMPRESSED": None, "SNAPPY": "snappy", "GZIP": "gzip", "ZSTD": "zstd",
           "LZ4": "lz4_raw", "BROTLI": "brotli"}  # pyarrow names LZ4_RAW "LZ4"
_PLAIN, _PLAIN_DICTIONARY, _RLE, _RLE_DICTIONARY = 0, 2, 3, 8
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3
_PHYSICAL = {"INT32": np.dtype("<i4"), "INT64": np.dtype("<i8")}
_HEADER_READ, _MAX_HEADER = 1 << 12, 1 << 24
_WINDOW = 1 << 18  # levels decoded at a time


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
    sides: tuple[pa.Array, ...] = ()
    """Side columns of whole documents (raypack.rules.side_columns; never read page by page)."""


class Unsupported(Exception):
    """This row group needs pyarrow's reader (raised before any piece of it is yielded)."""


_Page = NamedTuple("_Page", [("reps", np.ndarray), ("defs", np.ndarray), ("values", "np.ndarray | None")])


# ---------------------------------------------------------------------------------------------
# Levels and values, decoded a window at a time


class _Stream:
    """Bytes [0, size) of a page body, made of consecutive parts (raypack.inputs.parquet_pages.page_streams), read
    forward: taking bytes from ``start`` drops the bytes before it. Memory: the bytes from the
    last start taken to the end of the last part pulled."""

    def __init__(self, parts: Iterator[memoryview], size: int) -> None:
        self.parts, self.size, self.data, self.start = parts, size, memoryview(b""), 0

    @classmethod
    def of(cls, data: memoryview) -> _Stream:
        return cls(iter([data]), len(data))

    def take(self, start: int, n: int) -> memoryview:
        """Bytes [start, start + n) (start >= the last start taken); Truncated past the end."""
        end = start + n
        if end > self.start + len(self.data):
            self._extend(start, end)
        return self.data[start - self.start:end - self.start]

    def _extend(self, start: int, end: int) -> None:
        if end > self.size:
            raise Truncated
        pieces, have = [self.data[start - self.start:]], self.start + len(self.data)
        while have < end:
            part = next(self.parts, None)
            if part is None:
                raise Truncated
            pieces.append(part)
            have += len(part)
        self.data, self.start = memoryview(b"".join(pieces)).cast("B"), start


class _Hybrid:
    """The RLE/bit-packed hybrid encoding in ``stream`` from ``pos``, decoded on demand:
    ``read(n)`` gives the next n values as (n,) uint32. Memory: the values read, plus
    ``n * bit_width`` bytes."""

    def __init__(self, stream: _Stream, bit_width: int, pos: int = 0) -> None:
        if not 0 <= bit_width <= 32:
            raise ValueError(f"bit width {bit_width} is not 0..32")
        self.stream, self.width, self.pos = stream, bit_width, pos
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
        head = self.stream.take(self.pos, min(10, self.stream.size - self.pos))
        header, used = read_varint(head, 0)
        self.pos += used
        if header & 1:  # bit-packed: (header >> 1) groups of 8 values (the last may be cut short)
            nbytes = min((header >> 1) * self.width, self.stream.size - self.pos)
            self.packed_start, self.packed_done, self.run_left = self.pos, 0, nbytes * 8 // self.width
            self.pos += nbytes
        else:
            nbytes = (self.width + 7) // 8
            self.run_value = int.from_bytes(self.stream.take(self.pos, nbytes), "little")
            self.packed_start, self.run_left = -1, header >> 1
            self.pos += nbytes

    def _take(self, m: int) -> np.ndarray:
        if self.packed_start < 0:
            return np.full(m, self.run_value, np.uint32)
        bit_start = self.packed_done * self.width
        shift, num_bytes = bit_start % 8, (bit_start % 8 + m * self.width + 7) // 8
        values = _unpack(self.stream.take(self.packed_start + bit_start // 8, num_bytes), shift, m, self.width)
        self.packed_done += m
        return values


def _unpack(data: memoryview, shift: int, m: int, width: int) -> np.ndarray:
    """(m,) uint32: the m values of ``width`` bits packed in ``data`` from bit ``shift``."""
    if width in (8, 16, 32) and shift == 0:
        return np.frombuffer(data, f"<u{width // 8}", m).astype(np.uint32)
    bits = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
    packed = np.packbits(bits[shift:shift + m * width].reshape(m, width), axis=1, bitorder="little")
    if packed.shape[1] == 3:
        packed = np.concatenate([packed, np.zeros((m, 1), np.uint8)], axis=1)
    return np.ascontiguousarray(packed).view(f"<u{packed.shape[1]}").reshape(m).astype(np.uint32)


def _v1_levels(body: _Stream, pos: int, bit_width: int) -> tuple[_Hybrid, int]:
    """Levels of a v1 page at ``pos`` (4-byte size, then hybrid), copied out of the body."""
    size = int.from_bytes(body.take(pos, 4), "little")
    levels = memoryview(bytes(body.take(pos + 4, size)))
    return _Hybrid(_Stream.of(levels), bit_width), pos + 4 + size


class _PageCursor:
    """One data page's levels and values, read ``window`` levels at a time."""

    def __init__(self, chunk: _Chunk, num_levels: int, reps: _Hybrid, defs: _Hybrid, values: _Stream, pos: int,
                 encoding: int):
        self.chunk, self.num_levels, self.reps, self.defs = chunk, num_levels, reps, defs
        self.values, self.encoding, self.pos, self.indices = values, encoding, pos, None

    def windows(self, window: int, with_values: bool) -> Iterator[_Page]:
        for start in range(0, self.num_levels, window):
            m = min(window, self.num_levels - start)
            reps, defs = self.reps.read(m), self.defs.read(m)
            count = int(np.count_nonzero(defs == self.chunk.max_def))
            yield _Page(reps, defs, self._read_values(count) if with_values else None)

    def _read_values(self, count: int) -> np.ndarray:
        chunk = self.chunk
        if self.encoding == _PLAIN:
            size = count * chunk.physical.itemsize
            raw = np.frombuffer(self.values.take(self.pos, size), chunk.physical, count)
            self.pos += size
            return raw.astype(chunk.dtype, copy=False)  # INT32/INT64 bits, cast modulo 2**n as pyarrow does
        if count == 0:
            return np.zeros(0, chunk.dtype)
        if chunk.dictionary is None:
            raise ValueError("dictionary-encoded page without a dictionary page")
        if self.indices is None:
            self.indices = _Hybrid(self.values, self.values.take(self.pos, 1)[0], self.pos + 1)
        indices = self.indices.read(count)
        if indices.size and int(indices.max()) >= chunk.dictionary.size:
            raise ValueError(f"dictionary index {int(indices.max())} >= dictionary size {chunk.dictionary.size}")
        return chunk.dictionary[indices].astype(chunk.dtype, copy=False)


def _as_bytes(data) -> memoryview:
    return memoryview(data).cast("B")


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
        if codec and not pa.Codec.is_available(codec):
            raise Unsupported(f"codec {codec} not in this pyarrow")
        self.codec, self.codec_name = (pa.Codec(codec) if codec else None), codec
        self.source, self.max_def, self.num_levels = source, max_def, meta.num_values
        self.physical, self.dtype = _PHYSICAL[physical], np.dtype(value_type.to_pandas_dtype())
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
                page = self._data_page(header, body_pos, size)
                num_levels += page.num_levels
                yield from page.windows(_WINDOW, with_values)
            elif kind != _INDEX_PAGE:
                raise Unsupported(f"page type {kind}")
            pos = body_pos + size
        if num_levels != self.num_levels:
            raise ValueError(f"the pages hold {num_levels} levels, the footer says {self.num_levels}")

    def _read(self, pos: int, size: int) -> bytes:
        data = self.source.read_at(size, pos)
        need(data, size)
        return data

    def _header(self, pos: int) -> tuple[dict, int]:
        size = _HEADER_READ
        while True:
            buf = self.source.read_at(min(size, self.end - pos), pos)
            try:
                header, used = read_struct(buf, 0)
                return header, pos + used
            except Truncated:
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
        need(body, _field(head, 1) * self.physical.itemsize)
        self.dictionary = np.frombuffer(body, self.physical, _field(head, 1)).copy()

    def _data_page(self, header: dict, pos: int, size: int) -> _PageCursor:
        """The page whose body is the ``size`` bytes at ``pos``: levels read, values streamed."""
        uncompressed, def_width = _field(header, 2), self.max_def.bit_length()
        if _field(header, 1) == _DATA_PAGE:
            head = _field(header, 5, dict)
            encoding, count = _field(head, 2), _field(head, 1)
            if _field(head, 3) != _RLE or _field(head, 4) != _RLE:
                raise Unsupported("levels not RLE-encoded")
            body = self._body(pos, size, uncompressed, self.codec_name)
            reps, at = _v1_levels(body, 0, 1)
            defs, at = _v1_levels(body, at, def_width) if self.max_def else (_Hybrid(body, 0), at)
        else:
            head = _field(header, 8, dict)
            encoding, count, def_size, rep_size = _field(head, 4), _field(head, 1), _field(head, 5), _field(head, 6)
            if min(def_size, rep_size) < 0 or rep_size + def_size > min(size, uncompressed):
                raise ValueError(f"level sizes {rep_size}, {def_size} < 0 or past the page")
            levels = _as_bytes(self._read(pos, rep_size + def_size))
            reps = _Hybrid(_Stream.of(levels[:rep_size]), 1)
            defs = _Hybrid(_Stream.of(levels[rep_size:]), def_width)
            codec = self.codec_name if (_field(head, 7, bool) if 7 in head else True) else None
            levels_size = rep_size + def_size
            body, at = self._body(pos + levels_size, size - levels_size, uncompressed - levels_size, codec), 0
        if encoding not in (_PLAIN, _PLAIN_DICTIONARY, _RLE_DICTIONARY):
            raise Unsupported(f"value encoding {encoding}")
        if count < 0:
            raise ValueError(f"num_values {count} < 0")
        return _PageCursor(self, count, reps, defs, body, at, encoding)

    def _body(self, pos: int, size: int, uncompressed: int, codec: str | None) -> _Stream:
        """The body at ``pos`` decompressed in parts (raypack.inputs.parquet_pages.page_streams), as it is read."""
        def read(start: int, n: int) -> bytes:
            return self._read(pos + start, n)
        size_out = uncompressed if codec else size
        return _Stream(iter_body_parts(read, size, size_out, codec), size_out)

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
    num_tokens = int(ends[-1]) if ends.size else 0
    num_slices = max(1, -(-num_tokens // max_tokens))
    slice_lens = [min(max_tokens, num_tokens - k * max_tokens) for k in range(num_slices)]
    slices = _token_slices(chunk, slice_lens, path, group)
    first_slice = np.minimum(starts // max_tokens, num_slices - 1)
    last_slice = np.minimum(np.maximum(starts, ends - 1) // max_tokens, num_slices - 1)
    large = pa.types.is_large_list(field.type)
    for k in range(num_slices):
        lo = int(np.searchsorted(last_slice, k, side="left"))
        hi = int(np.searchsorted(first_slice, k, side="right"))
        start, end = k * max_tokens, min((k + 1) * max_tokens, num_tokens)
        tokens = pa.array(next(slices), field.type.value_type)  # first: reuses pass 1's freed page (-45 MiB)
        offsets = np.concatenate([[start], np.clip(ends[lo:hi], start, end)]) - start
        docs = (pa.LargeListArray if large else pa.ListArray).from_arrays(
            pa.array(offsets.astype(np.int64 if large else np.int32)), tokens, type=field.type)
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


def _token_slices(chunk: _Chunk, slice_lens: list[int], path: str, group: int) -> Iterator[np.ndarray]:
    """Pass 2: the row group's tokens as consecutive arrays of ``slice_lens`` values (copied out of pages)."""
    parts, num_buffered, windows = [], 0, chunk.windows(with_values=True)
    with _page_errors(path, group):
        for n in slice_lens:
            while num_buffered < n:
                page = next(windows, None)
                if page is None:
                    raise ValueError("the pages hold fewer tokens than their levels")
                parts.append(page.values)
                num_buffered += page.values.size
            joined = np.concatenate([np.zeros(0, chunk.dtype), *parts])
            parts, num_buffered = [joined[n:]], joined.size - n
            yield joined[:n]


@contextlib.contextmanager
def _page_errors(path: str, group: int) -> Iterator[None]:
    """Turn a malformed page (truncated, bad header, bad levels) into an InputError naming the file."""
    try:
        yield
    except (Truncated, ValueError, OSError, pa.ArrowException, IndexError) as e:
        reason = "truncated" if isinstance(e, Truncated) else (str(e).splitlines() or [type(e).__name__])[0]
        raise InputError(f"shard {path} row group {group}: malformed Parquet page ({reason}); re-write the file") from e
