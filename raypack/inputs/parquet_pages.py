"""A Parquet text column's page headers, read to check what its footer states. No Ray.

pyarrow sizes and reads a column chunk by its footer, but allocates and decodes each page by the page's
own header, written beside its data. A footer can lie where the pages cannot, so a hostile file passed
the checks made from the footer (raypack.inputs.parquet):
  * a footer that understates a column's size (1,000 bytes for a 1.6 GB text, 147 KB of zstd on disk)
    passed the refusal of a document over ``max_document_bytes``, and the page was decoded whole before
    the text was refused: 3.3 GB for the 147 KB file;
  * a footer whose row counts all agree on a lie (2 rows where the pages hold 4) had pyarrow read 2 rows:
    documents dropped, exit 0.

:func:`check_text_pages` walks the headers of a row group's text column chunk (one ranged read of a few
KiB per page; no page data is read) and refuses, in one line, a page whose header says it holds more
text than its values can at ``max_document_bytes`` each, and data pages whose values do not add up to
the rows the footer claims; :func:`check_dictionary_pages`, at planning, the dictionary pages alone (the
footer cannot bound a row group whose dictionary holds texts its rows do not use). Only what the
Parquet format fixes is parsed: Thrift's compact protocol, the PageHeader fields 1-3 and the
``num_values`` of the data, dictionary and v2 headers; other fields are skipped by their types.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from raypack.errors import InputError

__all__ = ["PageHeader", "check_dictionary_pages", "check_text_pages", "first_page_header", "read_page_header"]

DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
"""Parquet's PageType."""

FIRST_READ_BYTES = 4096
"""Bytes read for a page header at first; a longer one (large page statistics) is read again, longer."""

MAX_HEADER_BYTES = 16 << 20
"""The longest page header read (Arrow's own limit, ``kDefaultMaxPageHeaderSize``)."""

_MAX_DEPTH = 16
"""Nested structs a header may hold (PageHeader's own go 3 deep)."""

_NUM_VALUES_FIELD = {DATA_PAGE: 5, DICTIONARY_PAGE: 7, DATA_PAGE_V2: 8}
"""PageHeader's field holding each page type's header, whose field 1 is ``num_values``."""


class PageHeader(NamedTuple):
    page_type: int
    uncompressed_size: int
    compressed_size: int
    num_values: int | None
    """Values (nulls included) of a data or dictionary page; None for an index page."""
    header_size: int


class _Truncated(Exception):
    """The bytes read end inside the header: read more."""


class _Reader:
    """Thrift compact protocol over ``data``, from ``position``."""

    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def byte(self) -> int:
        if self.position >= len(self.data):
            raise _Truncated
        value = self.data[self.position]
        self.position += 1
        return value

    def varint(self) -> int:
        value, shift = 0, 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ValueError("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0:
            raise ValueError("a negative length")
        if self.position + n > len(self.data):
            raise _Truncated
        self.position += n

    def fields(self, depth: int):
        """(field id, type) of each field of a struct, up to its stop; the caller reads or skips each value."""
        if depth > _MAX_DEPTH:
            raise ValueError(f"structs nested over {_MAX_DEPTH} deep")
        last = 0
        while True:
            header = self.byte()
            if header == 0:
                return
            kind, delta = header & 0x0F, header >> 4
            last = last + delta if delta else self.zigzag()
            yield last, kind

    def skip(self, kind: int, depth: int) -> None:
        if kind in (1, 2):  # a bool field: its value is its type
            return
        if kind == 3:
            self.skip_bytes(1)
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.skip_bytes(8)
        elif kind == 8:
            self.skip_bytes(self.varint())
        elif kind in (9, 10):
            header = self.byte()
            size, element = header >> 4, header & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                if element in (1, 2):
                    self.skip_bytes(1)  # a bool in a list takes a byte
                else:
                    self.skip(element, depth + 1)
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == 12:
            for _, inner in self.fields(depth + 1):
                self.skip(inner, depth + 1)
        else:
            raise ValueError(f"an unknown Thrift type {kind}")


def _parse(data: bytes) -> PageHeader:
    reader = _Reader(data)
    found: dict[int, int] = {}
    num_values: int | None = None
    nested: dict[int, int] = {}
    for field, kind in reader.fields(0):
        if field in (1, 2, 3) and kind == 5:
            found[field] = reader.zigzag()
        elif field in (5, 7, 8) and kind == 12:
            for inner, inner_kind in reader.fields(1):
                if inner == 1 and inner_kind == 5:
                    nested[field] = reader.zigzag()
                else:
                    reader.skip(inner_kind, 2)
        else:
            reader.skip(kind, 1)
    if any(f not in found for f in (1, 2, 3)):
        raise ValueError("no page type or size")
    page_type = found[1]
    if page_type in _NUM_VALUES_FIELD:
        num_values = nested.get(_NUM_VALUES_FIELD[page_type])
        if num_values is None:
            raise ValueError("a data or dictionary page without its num_values")
    if found[2] < 0 or found[3] < 0 or (num_values is not None and num_values < 0):
        raise ValueError("a negative size or count")
    return PageHeader(page_type, found[2], found[3], num_values, reader.position)


def read_page_header(source: pa.NativeFile, offset: int, end: int) -> PageHeader:
    """The page header at byte ``offset`` of ``source`` (a page of the column chunk ending at ``end``).
    ValueError where it is not one."""
    size = FIRST_READ_BYTES
    while True:
        data = source.read_at(max(0, min(size, end - offset)), offset)
        try:
            return _parse(data)
        except _Truncated:
            if len(data) < size or size >= MAX_HEADER_BYTES:
                raise ValueError("the column chunk ends inside a page header") from None
            size *= 4


def check_text_pages(source: pa.NativeFile, metadata: pq.FileMetaData, leaf: int, group: int, path: str,
                     column: str, max_text_bytes: int | None) -> None:
    """InputError where row group ``group``'s (flat) text column ``leaf`` has a page whose header says it
    holds more text than its values take at ``max_text_bytes`` each (plus 64 bytes a value and 1 MiB:
    lengths, levels), or data pages whose values are not the rows the footer claims. Reads each page's
    header only (see the module docstring)."""
    row_group = metadata.row_group(group)
    chunk = row_group.column(leaf)
    where = f"text file {path} row group {group}"
    start = _first_page(chunk)
    if start is None:
        if row_group.num_rows == 0:
            return
        raise InputError(f"{where}: its footer gives its {column!r} column no page; the file is damaged or hostile: "
                         "re-write or remove it")
    end = start + chunk.total_compressed_size
    offset, values = start, 0
    while offset < end:
        page = _header_at(source, offset, end, where, column)
        if page.page_type in (DATA_PAGE, DATA_PAGE_V2):
            values += page.num_values
        _check_page_bytes(page, where, column, max_text_bytes)
        offset += page.header_size + page.compressed_size
    if values != row_group.num_rows:
        raise InputError(f"{where}: its footer claims {row_group.num_rows:,} rows, and the pages of its {column!r} "
                         f"column hold {values:,} values; the footer is damaged or hostile: re-write or remove "
                         "the file")


def _values(n: int, noun: str = "values") -> str:
    return f"{n:,} {noun if n != 1 else noun[:-1]}"


def check_dictionary_pages(source: pa.NativeFile, metadata: pq.FileMetaData, leaf: int, path: str, column: str,
                           max_text_bytes: int) -> None:
    """At planning, where the footer cannot bound a row group's text (a dictionary page may hold texts no row
    of that group uses: a categorical column's every category): each dictionary page's header, as
    :func:`check_text_pages` checks it. One small ranged read per row group with a dictionary page."""
    for group in range(metadata.num_row_groups):
        chunk = metadata.row_group(group).column(leaf)
        start = _first_page(chunk)
        if not chunk.has_dictionary_page or start is None:
            continue
        where = f"text file {path} row group {group}"
        page = _header_at(source, start, start + chunk.total_compressed_size, where, column)
        if page.page_type == DICTIONARY_PAGE:
            _check_page_bytes(page, where, column, max_text_bytes)


def first_page_header(source: pa.NativeFile, chunk: pq.ColumnChunkMetaData) -> PageHeader | None:
    """The header of a column chunk's first page (its dictionary page, if it has one), or None where the
    footer gives it no page or no readable header is there (the read says what is wrong, if anything).
    One ranged read of a few KiB."""
    start = _first_page(chunk)
    if start is None:
        return None
    try:
        return read_page_header(source, start, start + chunk.total_compressed_size)
    except (ValueError, OSError, pa.ArrowException):
        return None


def _header_at(source: pa.NativeFile, offset: int, end: int, where: str, column: str) -> PageHeader:
    try:
        return read_page_header(source, offset, end)
    except (ValueError, OSError, pa.ArrowException) as e:
        raise InputError(f"{where}: no readable page header at byte {offset:,} of its {column!r} column ({e}); "
                         "the file is damaged or hostile: re-write or remove it") from None


def _first_page(chunk: pq.ColumnChunkMetaData) -> int | None:
    """The column chunk's first page: offset 0 is the file's magic, never a page (pyarrow writes a
    data_page_offset of 0 for a row group of no rows, its dictionary page at 4)."""
    offsets = [o for o in (chunk.data_page_offset, chunk.dictionary_page_offset if chunk.has_dictionary_page
                           else None) if o is not None and o > 0]
    return min(offsets) if offsets else None


def _check_page_bytes(page: PageHeader, where: str, column: str, max_text_bytes: int | None) -> None:
    if max_text_bytes is not None and page.num_values is not None and \
            page.uncompressed_size > page.num_values * (max_text_bytes + 64) + (1 << 20):
        raise InputError(
            f"{where}: a page of its {column!r} column holds {page.uncompressed_size:,} bytes (its page header "
            f"says) for {_values(page.num_values)}, more than {_values(page.num_values, 'texts')} of "
            f"max_document_bytes={max_text_bytes:,} take, so a document there is longer (refused before the "
            "page, which a Parquet reader decodes whole, is read); raise --max-document-bytes if the workers "
            "have the memory (about 2.5x the page), or split the document upstream")
