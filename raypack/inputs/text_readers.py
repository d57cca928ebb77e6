"""Stream raw texts out of Parquet and JSON Lines files, in splittable tasks. pyarrow only, no Ray.

A big text file is cut into tasks so that several workers tokenize it at once:

  * Parquet: ``parquet_row_group_tasks(path)`` gives ``(row_group_start, row_group_end,
    num_rows)`` ranges read from the footer; ``iter_parquet_texts`` reads one range.
  * JSON Lines (``.jsonl``): ``jsonl_byte_range_tasks(path, target_bytes)`` gives nominal
    half-open byte ranges ``(start, end)`` of about ``target_bytes`` each, from the file size
    alone. ``iter_jsonl_texts`` aligns them on lines: a range starts just after the first
    newline at or after its nominal start (the first range starts at 0) and ends just after
    the first newline at or after its nominal end (or at end of file). Neighbours use the
    same rule at the same byte, so every line is read by exactly one task; a line longer
    than a range leaves some ranges empty. ``.jsonl.gz`` and ``.jsonl.zst`` are one task each.

Both readers yield ``(first_row, texts)``: ``texts`` a string/large_string array of at most
``batch_rows`` rows, ``first_row`` the task-local index of its first row (consecutive
batches are contiguous). Numbering rows across a file is the driver's job: a Parquet task's
first file row is the sum of ``num_rows`` of the tasks before it, but a JSONL task's is
known only once the tasks before it have counted their rows (blank lines hold no row), so
each task reports its row count and the driver turns the counts into offsets afterwards.

Every batch is checked before it is yielded (O(bytes), in Arrow): no null text, text is a
string, valid UTF-8. A failure raises InputError naming the file and its row (Parquet) or
line (JSONL, 1-based; found by a Python re-scan of the failing block, on the error path only).
"""

from __future__ import annotations

import itertools
import json
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.json as pajson

from raypack.errors import InputError
from raypack.inputs.formats import compression_of, open_parquet
from raypack.io.fs import error_text, open_input_file, resolve_filesystem

__all__ = [
    "ParquetTextTask",
    "iter_jsonl_texts",
    "iter_parquet_texts",
    "jsonl_byte_range_tasks",
    "parquet_row_group_tasks",
]

JSONL_BLOCK_BYTES = 16 << 20  # bytes of whole lines parsed at once (more if a line is longer)
_SCAN_BYTES = 1 << 20


def _check_batch_rows(batch_rows: int) -> None:
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows={batch_rows!r} must be an integer >= 1")


# ---------------------------------------------------------------------------------------------
# Parquet


class ParquetTextTask(NamedTuple):
    """Row groups [row_group_start, row_group_end) of one file, holding num_rows rows in
    num_bytes bytes (the footer's uncompressed size of those row groups: a task's cost)."""

    row_group_start: int
    row_group_end: int
    num_rows: int
    num_bytes: int


def parquet_row_group_tasks(path: str, *, target_rows: int | None = None) -> list[ParquetTextTask]:
    """One task per row group, or consecutive row groups merged until ``target_rows`` rows.

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
        if target_rows is None or num_rows >= target_rows or group == metadata.num_row_groups - 1:
            tasks.append(ParquetTextTask(start, group + 1, num_rows, num_bytes))
            start, num_rows, num_bytes = group + 1, 0, 0
    return tasks


def iter_parquet_texts(
    path: str, column: str = "text", row_groups: tuple[int, int] | None = None, batch_rows: int = 8192
) -> Iterator[tuple[int, pa.StringArray | pa.LargeStringArray]]:
    """Yield ``(first_row, texts)`` for row groups ``row_groups`` (default: all), in file order.

    Memory: one batch of ``batch_rows`` texts (plus pyarrow's buffers for one row group).
    """
    _check_batch_rows(batch_rows)
    fs, fs_path = resolve_filesystem(path)
    with open_input_file(fs, fs_path, path) as source:
        parquet_file = open_parquet(source, path)
        _check_text_column(parquet_file.schema_arrow, column, path)
        start, end = row_groups if row_groups is not None else (0, parquet_file.num_row_groups)
        if start >= end:
            return
        file_row = sum(parquet_file.metadata.row_group(g).num_rows for g in range(start))
        first_row = 0
        # One iter_batches per row group: over a range, pyarrow reads ahead and its memory grows
        # with the number of row groups (bench_text_job.py: 14 MiB flat vs 18 -> 92 MiB, 3 -> 30 groups).
        batches = itertools.chain.from_iterable(
            parquet_file.iter_batches(batch_size=batch_rows, row_groups=[group], columns=[column])
            for group in range(start, end))
        for batch in _read_parquet_batches(batches, path):
            texts = batch.column(0)
            _check_parquet_texts(texts, path, column, file_row + first_row)
            yield first_row, texts
            first_row += len(texts)


def _read_parquet_batches(batches: Iterator[pa.RecordBatch], path: str) -> Iterator[pa.RecordBatch]:
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"text file {path}: cannot read Parquet data ({error_text(e)}); re-write the file") from e
        if batch is None:
            return
        yield batch


def _check_text_column(schema: pa.Schema, column: str, path: str) -> None:
    if column not in schema.names:
        raise InputError(
            f"text file {path} has no column {column!r}; its columns: {', '.join(schema.names) or '(none)'}; "
            f"pass the text column's name"
        )
    value_type = schema.field(column).type
    if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
        raise InputError(
            f"text file {path}: column {column!r} has type {value_type} in every row; "
            f"it must hold strings (string or large_string)"
        )


def _check_parquet_texts(texts: pa.Array, path: str, column: str, file_row: int) -> None:
    """No nulls, valid UTF-8; ``file_row`` is the file row of ``texts[0]``, for messages."""
    if texts.null_count:
        row = file_row + _first_null(texts)
        raise InputError(f"text file {path} row {row}: {column!r} is null; give every row a string (\"\" if empty)")
    try:
        texts.validate(full=True)
    except pa.ArrowInvalid as e:
        row = file_row + _first_invalid_utf8(texts)
        raise InputError(f"text file {path} row {row}: {column!r} is not valid UTF-8 ({error_text(e)}); "
                         "re-encode the file") from e


def _first_null(texts: pa.Array) -> int:
    return int(np.flatnonzero(texts.is_null().to_numpy(zero_copy_only=False))[0])


def _first_invalid_utf8(texts: pa.Array) -> int:
    """Row of the first invalid string: a Python loop, on the error path only."""
    for row in range(len(texts)):
        try:
            texts.slice(row, 1).validate(full=True)
        except pa.ArrowInvalid:
            return row
    return 0


# ---------------------------------------------------------------------------------------------
# JSON Lines


def jsonl_byte_range_tasks(path: str, target_bytes: int) -> list[tuple[int, int]]:
    """Nominal byte ranges ``[start, end)`` tiling the file, ``target_bytes`` each (last: the rest).

    Reads only the file size. A compressed file (.gz/.zst) or an empty one is one task
    ``(0, size)``. ``iter_jsonl_texts`` turns a nominal range into a line-aligned one.
    """
    if isinstance(target_bytes, bool) or not isinstance(target_bytes, int) or target_bytes < 1:
        raise ValueError(f"target_bytes={target_bytes!r} must be an integer >= 1")
    fs, fs_path = resolve_filesystem(path)
    size = _file_size(fs, fs_path, path)
    if compression_of(fs_path) or size <= target_bytes:
        return [(0, size)]
    return [(start, min(start + target_bytes, size)) for start in range(0, size, target_bytes)]


def iter_jsonl_texts(
    path: str,
    column: str = "text",
    start: int = 0,
    end: int | None = None,
    batch_rows: int = 8192,
    *,
    block_bytes: int = JSONL_BLOCK_BYTES,
) -> Iterator[tuple[int, pa.StringArray | pa.LargeStringArray]]:
    """Yield ``(first_row, texts)`` for the lines of nominal byte range [start, end) (module doc).

    ``end=None`` reads to end of file; a compressed file must be read whole (start=0).
    Memory: one block of ``block_bytes`` whole lines (or one longer line) and its texts.
    """
    _check_batch_rows(batch_rows)
    fs, fs_path = resolve_filesystem(path)
    compression = compression_of(fs_path)
    if compression and start != 0:
        raise ValueError(f"{path} is compressed ({compression}) and can only be read whole; got start={start}")
    first_row = 0
    for block in _iter_line_blocks(fs, fs_path, path, start, None if compression else end, block_bytes):
        texts = _parse_block(block.data, path, column, lambda i, b=block: _line_number(fs, fs_path, b, i))
        for offset in range(0, len(texts), batch_rows):
            yield first_row + offset, texts.slice(offset, batch_rows)
        first_row += len(texts)


class _LineBlock(NamedTuple):
    """Whole lines ``data`` that start at byte ``start`` of the (decompressed) file."""

    start: int
    data: bytes


def _iter_line_blocks(
    fs: pafs.FileSystem, fs_path: str, path: str, start: int, end: int | None, block_bytes: int
) -> Iterator[_LineBlock]:
    """Blocks of whole lines from the aligned start to the aligned end of [start, end)."""
    compression = compression_of(fs_path)
    try:
        if compression:
            with fs.open_input_stream(fs_path, compression=compression) as stream:
                yield from _split_lines(stream, 0, None, block_bytes)
            return
        with open_input_file(fs, fs_path, path) as source:
            aligned_start = _aligned_start(source, start)
            if end is not None and aligned_start > end:
                return  # the line at `start` runs past `end`: it belongs to an earlier range
            source.seek(aligned_start)
            yield from _split_lines(source, aligned_start, end, block_bytes)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"text file {path}: cannot read ({error_text(e)}); check the file") from e


def _aligned_start(source: pa.NativeFile, start: int) -> int:
    """0 for start 0, else just after the first newline at or after ``start`` (or the file size)."""
    if start == 0:
        return 0
    source.seek(start)
    position = start
    while chunk := source.read(_SCAN_BYTES):
        newline = chunk.find(b"\n")
        if newline >= 0:
            return position + newline + 1
        position += len(chunk)
    return position


def _split_lines(stream: pa.NativeFile, position: int, end: int | None, block_bytes: int) -> Iterator[_LineBlock]:
    """Read from ``position`` in blocks cut after a newline; stop after the first newline >= end."""
    carry = b""
    while chunk := stream.read(block_bytes):
        if end is not None and position + len(chunk) > end:
            newline = chunk.find(b"\n", max(end - position, 0))
            if newline >= 0:
                yield _LineBlock(position - len(carry), carry + chunk[: newline + 1])
                return
        last = chunk.rfind(b"\n")
        if last >= 0:
            yield _LineBlock(position - len(carry), carry + chunk[: last + 1])
            carry = chunk[last + 1 :]
        else:
            carry += chunk
        position += len(chunk)
    if carry:
        yield _LineBlock(position - len(carry), carry)


def _parse_block(data: bytes, path: str, column: str, line_number) -> pa.StringArray | pa.LargeStringArray:
    """``column`` of each JSON object line of ``data`` as a checked string array."""
    schema = pa.schema([(column, pa.string())])
    parse_options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read_options = pajson.ReadOptions(block_size=min(max(len(data), 1 << 20), 2**31 - 1), use_threads=False)
    try:
        table = pajson.read_json(pa.BufferReader(data), read_options=read_options, parse_options=parse_options)
    except pa.ArrowInvalid as e:
        if "Empty JSON" in str(e):
            return pa.array([], pa.string())
        _raise_bad_line(data, path, column, line_number, error_text(e))
    texts = table.column(0).combine_chunks()
    try:
        if texts.null_count:
            raise pa.ArrowInvalid("null text")
        texts.validate(full=True)
    except pa.ArrowInvalid as e:
        _raise_bad_line(data, path, column, line_number, error_text(e))
    return texts


def _raise_bad_line(data: bytes, path: str, column: str, line_number, arrow_message: str) -> None:
    """InputError naming the first bad line of ``data``: a Python scan, on the error path only."""
    for index, line in enumerate(data.split(b"\n")):
        reason = _bad_line_reason(line, column)
        if reason:
            raise InputError(f"text file {path} line {line_number(index)}: {reason}; fix or drop that line")
    last_line = line_number(data.count(b"\n"))
    raise InputError(
        f"text file {path} lines {line_number(0)}-{last_line}: cannot parse JSON Lines "
        f"({arrow_message}); each line must be one JSON object whose {column!r} is a string"
    )


_JSON_TYPES = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object", type(None): "null"}


def _bad_line_reason(line: bytes, column: str) -> str | None:
    """Why one line is not ``{column: "a string", ...}``, or None if it is (or is blank)."""
    if not line.strip():
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 (byte 0x{line[e.start]:02x} at byte {e.start} of the line)"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"not JSON ({e.msg} at column {e.colno})"
    if not isinstance(value, dict):
        return f"a JSON {_JSON_TYPES.get(type(value), 'string')} where an object was expected"
    if column not in value:
        return f"no key {column!r} (keys: {', '.join(value) or '(none)'})"
    text_value = value[column]
    if not isinstance(text_value, str):
        return f"{column!r} is a JSON {_JSON_TYPES.get(type(text_value), type(text_value).__name__)}, not a string"
    try:
        text_value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{column!r} holds an unpaired surrogate escape (\\ud800-\\udfff), which is not text"
    return None


def _line_number(fs: pafs.FileSystem, fs_path: str, block: _LineBlock, index: int) -> int:
    """1-based file line of line ``index`` of ``block``: counts newlines before it (error path)."""
    return _count_newlines(fs, fs_path, block.start) + index + 1


def _count_newlines(fs: pafs.FileSystem, fs_path: str, end: int) -> int:
    """Newlines in bytes [0, end) of the (decompressed) file."""
    count, position = 0, 0
    with fs.open_input_stream(fs_path, compression=compression_of(fs_path)) as stream:
        while position < end and (chunk := stream.read(min(_SCAN_BYTES, end - position))):
            count += chunk.count(b"\n")
            position += len(chunk)
    return count


def _file_size(fs: pafs.FileSystem, fs_path: str, path: str) -> int:
    info = fs.get_file_info(fs_path)
    if info.type != pafs.FileType.File:
        raise InputError(f"text file not found: {path}")
    return info.size
