"""Parquet shards: token lists (and side columns) in row groups, and raw text. pyarrow only, no Ray.

  * counts: footer statistics (no data read) when the writer's list null counts are known to be
    exact (Arrow C++ >= 6); otherwise, per row group lacking usable statistics, a scan of the token
    column only. Footer counts are the number of non-null tokens; a shard holding null tokens is
    rejected when it is read anyway;
  * units are row groups, read one ``iter_batches`` call per row group (pyarrow reads ahead across
    the row groups of one call), ``batch_size`` rows at a time;
  * long documents: pyarrow decodes a document whole. Before a row group is read, its footer bounds
    its longest document: its token leaf's ``num_values`` levels less one level per other row. A
    row group whose bound is within ``max_document_tokens`` is read as is. One over it may hold a
    document over the limit: when it has one row, the footer gives that row's length and the
    document is refused before any byte of it is read; otherwise it is read in batches of rows
    expected (at the row group's mean) to hold ``max_document_tokens`` tokens, and each batch's
    list offsets are checked before its values are used. So a refused document costs at most
    pyarrow's decode of one batch holding it (the document's values and levels, ~6-10 bytes per
    token, plus about the limit's worth of other rows), never a packer's copies of it;
  * text (``raypack tokenize``): tasks are row-group ranges from the footer
    (:func:`parquet_row_group_tasks`); :func:`iter_parquet_texts` reads one in batches of about
    TEXT_BATCH_BYTES of text (at most ``batch_rows`` rows), checking every batch (no null text,
    valid UTF-8) and naming the file row of a failure.
"""

from __future__ import annotations

import itertools
import logging
import re
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raypack.errors import InputChanged, InputError
from raypack.inputs.base import (
    HoldsTokens,
    InputFormat,
    ReadLimits,
    ShardInfo,
    check_batch_rows,
    check_named_once,
    token_value_type,
    too_long,
)
from raypack.inputs.parquet_pages import DICTIONARY_PAGE, check_dictionary_pages, check_text_pages, first_page_header
from raypack.inputs.text_arrays import is_text_type, text_slices
from raypack.io.fs import error_text, open_input_file, resolve_filesystem
from raypack.rules.side_columns import side_value_types

__all__ = ["ParquetFormat", "ParquetTextTask", "iter_parquet_texts", "open_parquet",
           "parquet_row_group_tasks", "token_leaf_index"]

log = logging.getLogger(__name__)

_FIRST_FOOTER_SAFE_ARROW_MAJOR = 6
"""Arrow >= 6 (PARQUET-2067) counts null and empty lists in a list leaf's null_count."""


class ParquetFormat(InputFormat):
    name = "parquet"
    title = "Parquet"
    suffixes = (".parquet", ".pq")
    text_task_unit = "row groups"
    has_units = True
    holds_text = True

    def inspect(self, path: str, column: str, limits: ReadLimits) -> ShardInfo:
        fs, fs_path = resolve_filesystem(path)
        with open_input_file(fs, fs_path, path) as source:
            parquet_file = open_parquet(source, path)
            value_type = token_value_type(parquet_file.schema_arrow, column, path)
            check_column_levels(parquet_file, column, path)
            metadata = parquet_file.metadata
            leaf = token_leaf_index(parquet_file.schema, column)
            trusted = leaf is not None and footer_null_counts_exact(created_by(metadata))
            unit_tokens, method = [], "parquet-footer"
            for group in range(metadata.num_row_groups):
                count = _footer_token_count(metadata.row_group(group), leaf) if trusted else None
                if count is None:
                    count, method = _scan_row_group_tokens(parquet_file, group, column, path), "scan"
                unit_tokens.append(count)
            unit_docs = tuple(metadata.row_group(group).num_rows for group in range(metadata.num_row_groups))
        if method == "scan":
            log.info("shard %s: no usable Parquet token statistics; counted by scanning", path)
        return ShardInfo(path, self.name, metadata.num_rows, sum(unit_tokens), str(value_type), method,
                         unit_docs, tuple(unit_tokens))

    def text_row(self, path: str, start: int, end: int, k: int) -> str:
        fs, fs_path = resolve_filesystem(path)
        with open_input_file(fs, fs_path, path) as source:
            metadata = open_parquet(source, path).metadata
            before = sum(metadata.row_group(g).num_rows for g in range(min(start, metadata.num_row_groups)))
        return f"row {before + k}"

    def schema(self, path: str) -> pa.Schema:
        fs, fs_path = resolve_filesystem(path)
        with open_input_file(fs, fs_path, path) as source:
            return open_parquet(source, path).schema_arrow

    def read_columns(self, path: str, columns: tuple[str, ...], units: tuple[int, int] | None,
                     limits: ReadLimits) -> Iterator[tuple[pa.Array, ...]]:
        fs, fs_path = resolve_filesystem(path)
        with open_input_file(fs, fs_path, path) as source:
            parquet_file = open_parquet(source, path)
            check_named_once(parquet_file.schema_arrow, columns, path)
            token_value_type(parquet_file.schema_arrow, columns[0], path)
            side_value_types(parquet_file.schema_arrow, columns[1:], path)
            check_column_levels(parquet_file, columns[0], path)
            metadata = parquet_file.metadata
            start, end = units if units is not None else (0, metadata.num_row_groups)
            if end > metadata.num_row_groups:
                raise InputChanged(f"shard {path} has {metadata.num_row_groups} row groups, the plan reads "
                                 f"{start}..{end - 1}; the file changed during the run (rerun on a stable copy)")
            leaf = token_leaf_index(parquet_file.schema, columns[0])
            first_row = sum(metadata.row_group(g).num_rows for g in range(start))
            for group in range(start, end):
                row_group = metadata.row_group(group)
                batch_size = _batch_rows(row_group, leaf, limits, path, first_row)
                for batch in _record_batches(parquet_file, path, columns, batch_size, [group]):
                    yield tuple(batch.columns)
                first_row += row_group.num_rows

    def side_types(self, path: str, names: tuple[str, ...]) -> tuple[str, ...]:
        fs, fs_path = resolve_filesystem(path)
        with open_input_file(fs, fs_path, path) as source:
            schema = open_parquet(source, path).schema_arrow
            check_named_once(schema, names, path)
            return side_value_types(schema, names, path)

    def metadata_start(self, size: int, tail: bytes) -> int:
        """Where the footer begins (``size`` when the file does not end like Parquet)."""
        if len(tail) < 8 or tail[-4:] != b"PAR1":
            return size
        footer_len = int.from_bytes(tail[-8:-4], "little")
        return max(size - 8 - footer_len, 0)

    def text_tasks(self, path: str, *, task_rows: int, task_bytes: int) -> list[tuple[int, int, int]]:
        return [(g.row_group_start, g.row_group_end, g.num_bytes)
                for g in parquet_row_group_tasks(path, target_rows=task_rows, target_bytes=task_bytes)]

    def text_notes(self, path: str, column: str, max_text_bytes: int | None = None) -> list[str]:
        fs, fs_path = resolve_filesystem(path)
        with open_input_file(fs, fs_path, path) as source:
            parquet_file = open_parquet(source, path)
            # at planning: a later file without its text column was met only once the files before it were
            # tokenized and packed (and that work thrown away)
            _check_text_column(parquet_file.schema_arrow, column, path)
            check_column_levels(parquet_file, column, path)
            metadata = parquet_file.metadata
            if max_text_bytes is not None:  # at planning, so before any page is read (and before Ray starts)
                check_row_group_text_bytes(metadata, column, path, range(metadata.num_row_groups), max_text_bytes)
                leaf = _flat_leaf(metadata.schema, column)
                if leaf is not None:
                    check_dictionary_pages(source, metadata, leaf, path, column, max_text_bytes)
            return large_page_notes(path, column, source, metadata)

    def iter_texts(self, path: str, column: str, start: int, end: int, batch_rows: int, *,
                   max_text_bytes: int | None = None) -> Iterator[tuple[int, pa.Array]]:
        return iter_parquet_texts(path, column, (start, end), batch_rows,  # batches sized from the footer
                                  max_text_bytes=max_text_bytes)

    def write(self, path: str, table: pa.Table, rows_per_unit: int | None = None) -> None:
        pq.write_table(table, path, row_group_size=rows_per_unit)


TEXT_BATCH_BYTES = 8 << 20
"""Bytes of text a Parquet text batch holds, about (:func:`text_batch_rows`; a JSON Lines text block
holds as many bytes of JSON, raypack.inputs.jsonl.TEXT_BLOCK_BYTES). A batch of ``batch_rows`` rows of books
would be gigabytes (BENCHMARKS.md: 350 texts of ~1 MB in one row group took the one pass to
0.75-1.88 GB). 16 MiB measured the same speed but a higher peak (x1 374 against 331 MiB)."""

ROWS_PER_BYTE = 64
"""A footer may claim at most ``max(MIN_ROWS_CAP, ROWS_PER_BYTE x file bytes)`` rows: pyarrow sizes
its buffers from the row count before it reads a value, so a lying count (2^40 rows in a 10 kB
file) would allocate terabytes. Real shards hold far fewer rows per byte (a row of one token
costs more than a byte even compressed); an RLE run of empty rows is the only dense case, and
MIN_ROWS_CAP leaves room for a million of them."""
MIN_ROWS_CAP = 1 << 20


def open_parquet(source: pa.NativeFile, path: str) -> pq.ParquetFile:
    """``ParquetFile`` over ``source``; a corrupt or truncated file, or a footer whose row counts
    the file's bytes cannot hold (ROWS_PER_BYTE), raises InputError. O(row groups)."""
    try:
        parquet_file = pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20)
        size = source.size()
    except (pa.ArrowException, OSError) as e:
        raise InputError(
            f"shard {path} is not a readable Parquet file ({error_text(e)}); re-write or remove it"
        ) from e
    _check_row_counts(parquet_file.metadata, size, path)
    return parquet_file


def _check_row_counts(metadata: pq.FileMetaData, size: int, path: str) -> None:
    cap = max(MIN_ROWS_CAP, ROWS_PER_BYTE * size)
    groups = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    bad = next((g for g, n in enumerate(groups) if not 0 <= n <= cap), None)
    if bad is not None or not 0 <= metadata.num_rows <= cap or metadata.num_rows != sum(groups):
        where = (f"row group {bad} claims {groups[bad]} rows in a file of {size} bytes (at most {cap})"
                 if bad is not None else f"the footer claims {metadata.num_rows} rows and its row groups "
                 f"{sum(groups)}")
        raise InputError(f"shard {path}: {where}; its footer is damaged or hostile: re-write or remove the file")


def check_column_levels(parquet_file: pq.ParquetFile, column: str, path: str) -> None:
    """Refuse a footer whose row groups claim other row counts than ``column``'s values say: pyarrow
    reads a row group's ``num_rows`` rows, so a count lower than the pages hold would silently drop
    documents. A flat column (text) holds one value per row; a list column (tokens) at least one level
    per row (an empty or null list is one). O(row groups); a nested column is not checked."""
    schema, metadata = parquet_file.schema, parquet_file.metadata
    flat = _flat_leaf(schema, column)
    leaf = flat if flat is not None else token_leaf_index(schema, column)
    if leaf is None:
        return
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        rows, values = row_group.num_rows, row_group.column(leaf).num_values
        if (values != rows) if flat is not None else (values < rows or (rows == 0 and values > 0)):
            raise InputError(f"shard {path}: row group {group} claims {rows} rows, and its column {column!r} holds "
                             f"{values} values; its footer is damaged or hostile: re-write or remove the file")


def created_by(metadata: pq.FileMetaData) -> str | None:
    """The footer's ``created_by``; None when it is not UTF-8 (a damaged or foreign footer)."""
    try:
        return metadata.created_by
    except UnicodeDecodeError:
        return None


def token_leaf_index(schema: pq.ParquetSchema, column: str) -> int | None:
    """Index of the one leaf column under ``column`` with one repetition level, else None."""
    leaves = [
        i
        for i in range(len(schema))
        if schema.column(i).path.startswith(column + ".")
        and schema.column(i).max_repetition_level == 1
    ]
    return leaves[0] if len(leaves) == 1 else None


def footer_null_counts_exact(created_by: str | None) -> bool:
    """Whether the writer ``created_by`` counts null and empty lists in a list leaf's null_count."""
    match = re.match(r"parquet-cpp-arrow version (\d+)\.", created_by or "")
    return bool(match) and int(match.group(1)) >= _FIRST_FOOTER_SAFE_ARROW_MAJOR


def _footer_token_count(row_group: pq.RowGroupMetaData, leaf: int) -> int | None:
    """Tokens in a row group from its footer: leaf levels minus null-or-empty-list levels.

    Each row contributes one level per token plus one placeholder per empty or null list;
    null_count counts the placeholders (and null tokens). None when statistics are absent
    or inconsistent.
    """
    if row_group.num_rows == 0:
        return 0
    chunk = row_group.column(leaf)
    stats = chunk.statistics
    if stats is None or not stats.has_null_count:
        return None
    num_levels, num_nulls = chunk.num_values, stats.null_count
    if num_levels < row_group.num_rows or not 0 <= num_nulls <= num_levels:
        return None
    return num_levels - num_nulls


def _scan_row_group_tokens(parquet_file: pq.ParquetFile, group: int, column: str, path: str) -> int:
    try:
        table = parquet_file.read_row_group(group, columns=[column])
    except (pa.ArrowException, OSError) as e:
        raise InputError(
            f"shard {path}: cannot read row group {group} ({error_text(e)}); re-write the file"
        ) from e
    return int(pc.sum(pc.list_value_length(table.column(0))).as_py() or 0)


def _batch_rows(row_group: pq.RowGroupMetaData, leaf: int | None, limits: ReadLimits, path: str,
                first_row: int) -> int:
    """Rows per batch for this row group, after the footer's check on its longest document (module
    docstring): ``limits.batch_size``, or fewer when it may hold a document over the limit (rows
    that hold about the limit's tokens at the row group's mean). A row group of one row over the
    limit raises :func:`too_long` at once, from the footer."""
    limit = limits.max_document_tokens
    if limit is None or leaf is None or row_group.num_rows == 0:
        return limits.batch_size
    num_levels = row_group.column(leaf).num_values
    longest_bound = num_levels - (row_group.num_rows - 1)  # every other row holds at least one level
    if longest_bound <= limit:
        return limits.batch_size
    if row_group.num_rows == 1:
        raise too_long(path, first_row, num_levels, limit)
    return max(1, min(limits.batch_size, limit * row_group.num_rows // num_levels))


def _record_batches(parquet_file: pq.ParquetFile, path: str, columns: tuple[str, ...], batch_size: int,
                    row_groups: list[int]) -> Iterator[pa.RecordBatch]:
    batches = parquet_file.iter_batches(batch_size=batch_size, columns=list(columns), row_groups=row_groups)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise InputError(
                f"shard {path}: cannot read Parquet data ({error_text(e)}); re-write the file"
            ) from e
        if batch is None:
            return
        yield batch


# ---------------------------------------------------------------------------------------------
# Raw text, for tokenizing


class ParquetTextTask(NamedTuple):
    """Row groups [row_group_start, row_group_end) of one file, holding num_rows rows in
    num_bytes bytes (the footer's uncompressed size of those row groups: a task's cost)."""

    row_group_start: int
    row_group_end: int
    num_rows: int
    num_bytes: int


def parquet_row_group_tasks(path: str, *, target_rows: int | None = None,
                            target_bytes: int | None = None) -> list[ParquetTextTask]:
    """One task per row group, or consecutive row groups merged until ``target_rows`` rows or
    ``target_bytes`` bytes (the footer's uncompressed sizes), whichever comes first: a task holds
    at most that much text, or one row group (a task is whole row groups).

    Reads only the footer. A file with no row groups gives no task.
    """
    fs, fs_path = resolve_filesystem(path)
    with open_input_file(fs, fs_path, path) as source:
        metadata = open_parquet(source, path).metadata
    tasks: list[ParquetTextTask] = []
    start, num_rows, num_bytes = 0, 0, 0
    for group in range(metadata.num_row_groups):
        num_rows += metadata.row_group(group).num_rows
        num_bytes += metadata.row_group(group).total_byte_size
        last = group == metadata.num_row_groups - 1
        if (last or target_rows is None or num_rows >= target_rows
                or (target_bytes is not None
                    and num_bytes + metadata.row_group(group + 1).total_byte_size > target_bytes)):
            tasks.append(ParquetTextTask(start, group + 1, num_rows, num_bytes))
            start, num_rows, num_bytes = group + 1, 0, 0
    return tasks


def iter_parquet_texts(
    path: str, column: str = "text", row_groups: tuple[int, int] | None = None, batch_rows: int = 8192,
    *, batch_bytes: int = TEXT_BATCH_BYTES, max_text_bytes: int | None = None,
) -> Iterator[tuple[int, pa.StringArray | pa.LargeStringArray]]:
    """Yield ``(first_row, texts)`` for row groups ``row_groups`` (default: all), in file order.

    ``first_row`` is task-local (the first row of ``row_groups`` is 0). Memory: one batch of at
    most ``batch_rows`` texts, fewer where the row group's texts are long: as many as hold
    ``batch_bytes`` at the row group's mean (:func:`text_batch_rows`), plus pyarrow's buffers for
    the batch (measured: up to about three times its text). ``max_text_bytes``: a row group whose
    footer gives its column more bytes than that many texts of this size take is refused before it is
    read (:func:`check_row_group_text_bytes`).
    """
    check_batch_rows(batch_rows)
    fs, fs_path = resolve_filesystem(path)
    with open_input_file(fs, fs_path, path) as source:
        parquet_file = open_parquet(source, path)
        _check_text_column(parquet_file.schema_arrow, column, path)
        check_column_levels(parquet_file, column, path)
        start, end = row_groups if row_groups is not None else (0, parquet_file.num_row_groups)
        if start >= end:
            return
        if end > parquet_file.num_row_groups:
            raise InputError(f"{path}: the task reads row groups [{start}, {end}), and the file now has "
                             f"{parquet_file.num_row_groups}; it changed since its tasks were planned: run again "
                             "on the file as it is now")
        if max_text_bytes is not None:
            check_row_group_text_bytes(parquet_file.metadata, column, path, range(start, end), max_text_bytes)
        leaf = _flat_leaf(parquet_file.metadata.schema, column)
        for group in range(start, end) if leaf is not None else ():  # what the footer said, by the pages
            check_text_pages(source, parquet_file.metadata, leaf, group, path, column, max_text_bytes)
        file_row = sum(parquet_file.metadata.row_group(g).num_rows for g in range(start))
        first_row = 0
        # One iter_batches per row group: over a range, pyarrow reads ahead and its memory grows
        # with the number of row groups (bench_text_job.py: 14 MiB flat vs 18 -> 92 MiB, 3 -> 30 groups).
        # Decoded on the caller's thread, not Arrow's pool (one column: nothing to do in parallel): the
        # pages the pool's threads freed stayed resident beside the next task's, ten tasks of a one pass
        # peaked at 405-430 MiB against 390-405, at the same speed (BENCHMARKS.md, "stop 61").
        batches = itertools.chain.from_iterable(
            parquet_file.iter_batches(batch_size=text_batch_rows(parquet_file.metadata, group, column, batch_rows,
                                                                 batch_bytes),
                                      row_groups=[group], columns=[column], use_threads=False)
            for group in range(start, end))
        for batch in _read_text_batches(batches, path):
            for texts in text_slices(batch.column(0), batch_bytes):  # a dictionary decoded a slice at a time
                _check_parquet_texts(texts, path, column, file_row + first_row)
                yield first_row, texts
                first_row += len(texts)


def _flat_leaf(schema: pq.ParquetSchema, column: str) -> int | None:
    """The leaf index of flat column ``column`` (a text column), or None."""
    return next((i for i in range(len(schema)) if schema.column(i).path == column), None)


def check_row_group_text_bytes(metadata: pq.FileMetaData, column: str, path: str, groups: range,
                               max_text_bytes: int) -> None:
    """InputError where a row group's ``column`` holds, by the footer, more bytes than its rows' texts
    could at ``max_text_bytes`` each (plus 64 bytes a row and 1 MiB for lengths, indices and page
    headers): a document there is longer (or its pages hold more than its rows). A Parquet page is
    decoded whole, so such a document was refused only after its page was in memory (a hostile trial:
    one 200 MB text, 18 KB of zstd on disk, took 806 MB to refuse). O(row groups), the footer only; a
    footer that understates its sizes is read as before and refused by the reader's own check."""
    schema = metadata.schema
    leaf = _flat_leaf(schema, column)
    if leaf is None:
        return
    for group in groups:
        row_group = metadata.row_group(group)
        chunk = row_group.column(leaf)
        if chunk.has_dictionary_page:  # its dictionary may hold texts no row of this group uses (a categorical
            continue  # column's every category, in every row group: a trial); its pages are checked before reading
        size, rows = chunk.total_uncompressed_size, row_group.num_rows
        if size > rows * (max_text_bytes + 64) + (1 << 20):
            raise InputError(
                f"text file {path} row group {group}: its {column!r} column holds {size:,} bytes (its footer says) "
                f"for {rows:,} rows, more than {rows:,} texts of max_document_bytes={max_text_bytes:,} take, so a "
                "document there is longer (refused before its page, which a Parquet reader decodes whole, is "
                "read); raise --max-document-bytes if the workers have the memory (about 2.5x the page), or split "
                "the document upstream")


LARGE_PAGE_NOTE_BYTES = 64 << 20
"""A text column chunk whose first page holds more text than this is named (:func:`large_page_notes`)."""


def large_page_notes(path: str, column: str, source: pa.NativeFile | None = None,
                     metadata: pq.FileMetaData | None = None) -> list[str]:
    """One line when ``column``'s first page holds more than LARGE_PAGE_NOTE_BYTES of text (by its
    header), in the row group whose column holds the most text. A Parquet page is decoded whole, and
    pyarrow's writer cuts pages only between write batches of 1,024 values: its dictionary page (the
    default) or, without one, its data pages hold up to 1,024 texts each, so long texts (books) make
    pages of up to ~1 GB, which pyarrow reads at up to ~2.5x their text (BENCHMARKS.md, "stop 51" and
    "stop 61"). That page stands for the file's others (one writer wrote them). One ranged read of a
    few KiB, where the footer gives a row group more than that much text; ``source`` and ``metadata``:
    the file, open, and its footer, if read already."""
    if source is None:
        try:
            fs, fs_path = resolve_filesystem(path)
            with open_input_file(fs, fs_path, path) as opened:
                return large_page_notes(path, column, opened, open_parquet(opened, path).metadata)
        except (InputError, OSError, ValueError, pa.ArrowException):
            return []  # the read says what is wrong with the file, if anything
    try:
        metadata = metadata if metadata is not None else open_parquet(source, path).metadata
        leaf = _flat_leaf(metadata.schema, column)
        if leaf is None or metadata.num_row_groups == 0:
            return []
        sizes = [metadata.row_group(g).column(leaf).total_uncompressed_size for g in range(metadata.num_row_groups)]
        where = max(range(len(sizes)), key=sizes.__getitem__)
        if sizes[where] <= LARGE_PAGE_NOTE_BYTES:
            return []  # no page can hold more
        page = first_page_header(source, metadata.row_group(where).column(leaf))
    except (InputError, OSError, ValueError, UnicodeDecodeError, pa.ArrowException):
        return []
    if page is None:
        return []
    largest = page.uncompressed_size
    kind = "dictionary page" if page.page_type == DICTIONARY_PAGE else "data page"
    if largest <= LARGE_PAGE_NOTE_BYTES:
        return []
    return [f"text file {path}: row group {where} keeps {largest >> 20:,} MiB of its {column!r} column's text in "
            f"one {kind}, which a Parquet reader decodes whole (up to about 2.5x that in memory); write the file "
            "with smaller pages (pyarrow: write_batch_size=16, and use_dictionary=False for that column), or "
            "smaller row groups"]


def text_batch_rows(metadata: pq.FileMetaData, group: int, column: str, batch_rows: int, batch_bytes: int) -> int:
    """Rows of row group ``group`` read at once: ``batch_rows``, or fewer, at least 1, to hold about
    ``batch_bytes`` of text at the mean row size the footer gives (``column``'s uncompressed bytes;
    the row group's when the column is not found). A footer that understates its sizes (or a
    dictionary-encoded column of repeated long texts, whose encoded size is less than its text)
    gives bigger batches, never more than ``batch_rows`` rows. O(columns)."""
    row_group = metadata.row_group(group)
    try:  # the column found by the schema: no other column's chunk metadata is built (a damaged one can abort pyarrow)
        schema = metadata.schema
        leaf = _flat_leaf(schema, column)
        size = row_group.total_byte_size if leaf is None else row_group.column(leaf).total_uncompressed_size
    except UnicodeDecodeError:  # a damaged footer's column path: the read names the damage, if any
        size = row_group.total_byte_size
    if row_group.num_rows <= 0 or size <= 0:
        return batch_rows
    return max(1, min(batch_rows, batch_bytes * row_group.num_rows // size))


def _read_text_batches(batches: Iterator[pa.RecordBatch], path: str) -> Iterator[pa.RecordBatch]:
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"text file {path}: cannot read Parquet data ({error_text(e)}); re-write the file") from e
        if batch is None:
            return
        yield batch


def _check_text_column(schema: pa.Schema, column: str, path: str) -> None:
    texts = [f.name for f in schema if is_text_type(f.type) and f.name != column]
    other = (f"; its text column is {texts[0]!r}: pass --text-column {texts[0]}" if len(texts) == 1 else
             f"; pass --text-column with one of its text columns: {', '.join(texts)}" if texts else "")
    if column not in schema.names:
        lists = [f.name for f in schema if pa.types.is_list(f.type) or pa.types.is_large_list(f.type)]
        fix = (f"; if {lists[0]!r} holds token ids, the file is tokenized already: pack it with `raypack pack`, "
               "no --tokenizer" if lists and not texts else
               other or "; it has no text column to pass with --text-column")
        raise (HoldsTokens if lists and not texts else InputError)(
            f"text file {path} has no column {column!r}; its columns: {', '.join(schema.names) or '(none)'}{fix}"
        )
    check_named_once(schema, [column], path)
    value_type = schema.field(column).type
    if not is_text_type(value_type):
        raise InputError(
            f"text file {path}: column {column!r} holds {value_type}, not text; it must hold strings "
            f"(string, large_string or string_view, binary holding UTF-8, or a dictionary of those){other}"
        )


def _check_parquet_texts(texts: pa.Array, path: str, column: str, file_row: int) -> None:
    """No nulls, valid UTF-8; ``file_row`` is the file row of ``texts[0]``, for messages."""
    if texts.null_count:
        row = file_row + int(np.flatnonzero(texts.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"text file {path} row {row}: {column!r} is null; give every row a string (\"\" if empty)")
    try:
        texts.validate(full=True)
    except pa.ArrowInvalid as e:
        row, where = _first_invalid_utf8(texts)
        raise InputError(f"text file {path} row {file_row + row}: {column!r} is not valid UTF-8 "
                         f"({where or error_text(e)}); re-encode the file") from e


def _first_invalid_utf8(texts: pa.Array) -> tuple[int, str]:
    """Row of the first invalid string, and where in it ("byte 0xff at byte 4 of the text"; Arrow's own
    "at string index N" counts rows of the batch, not of the file): a Python loop, on the error path only."""
    for row in range(len(texts)):
        try:
            texts.slice(row, 1).validate(full=True)
        except pa.ArrowInvalid:
            width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
            start, end = (int(x) for x in np.frombuffer(texts.buffers()[1], width)[texts.offset + row:][:2])
            data = texts.buffers()[2].slice(start, end - start).to_pybytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as e:
                return row, f"byte 0x{data[e.start]:02x} at byte {e.start:,} of the text"
            return row, ""
    return 0, ""
