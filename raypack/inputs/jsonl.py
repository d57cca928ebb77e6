"""JSON Lines shards: one JSON object per line, token ids as lists, or raw text. pyarrow only, no Ray.

One line reader serves both paths (:func:`iter_line_blocks`): it reads a file (``.jsonl.gz`` /
``.jsonl.zst`` through a decompressing stream) in blocks of whole lines, about ``block_bytes``
each (one longer line alone), and Arrow parses each block.

  * tokens: each block's ``column`` (and side columns) as list<int64>; a missing key gives a null
    row (refused when read, by raypack.rules.token_checks). Counts are a scan. No units: a shard is
    read whole. A line longer than ``max_document_tokens * JSON_BYTES_PER_TOKEN`` bytes (at most
    MAX_LINE_BYTES) is refused before it is parsed, as it is read (its bytes are never held whole);
    a shorter one is parsed and its length checked from the list offsets.
  * text (``raypack tokenize``): :func:`jsonl_byte_range_tasks` cuts a file into nominal byte ranges
    from its size; :func:`iter_jsonl_texts` aligns them on lines: a range starts just after the
    first newline at or after its nominal start (the first range starts at 0) and ends just after
    the first newline at or after its nominal end (or at end of file). Neighbours use the same
    rule at the same byte, so every line is read by exactly one task; a line longer than a range
    leaves some ranges empty. A compressed file is one task. Every batch is checked (no null
    text, a string, valid UTF-8); a failure names the 1-based line (a Python re-scan of the
    failing block, on the error path only). A task's rows are numbered from 0: its first file
    row is known once the tasks before it have counted theirs (blank lines hold no row).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.json as pajson

from raypack.errors import InputError
from raypack.inputs.base import InputFormat, ReadLimits, ShardInfo, check_batch_rows
from raypack.io.fs import error_text, open_input_file, resolve_filesystem
from raypack.rules.side_columns import side_value_types

__all__ = ["JSON_BYTES_PER_TOKEN", "JSONL_BLOCK_BYTES", "JsonLinesFormat", "MAX_LINE_BYTES", "TEXT_BLOCK_BYTES",
           "compression_of", "iter_jsonl_texts", "iter_line_blocks", "jsonl_byte_range_tasks"]

JSONL_BLOCK_BYTES = 16 << 20
"""Bytes of whole lines of token lists parsed at once (more when a line is longer)."""
TEXT_BLOCK_BYTES = 8 << 20
"""Bytes of whole lines of text parsed at once (more when a line is longer), as much as a Parquet text
batch holds (raypack.inputs.parquet.TEXT_BATCH_BYTES). The one pass on 407 MB of JSON Lines: 16 MiB
peaked at 588-713 MiB in 2.99-3.40 s, 8 MiB at 476-518 MiB in 2.84-2.99 s, 4 MiB at 414-455 MiB in
2.92-3.06 s (BENCHMARKS.md, "stop 61")."""
MAX_LINE_BYTES = 1 << 30
"""The longest token line read, whatever ``max_document_tokens``."""
JSON_BYTES_PER_TOKEN = 24
"""Bytes a line may spend per token of ``max_document_tokens`` (an int64 id, a comma and a space: 21)."""
_COMPRESSION_BY_SUFFIX = {".gz": "gzip", ".zst": "zstd"}
_SCAN_BYTES = 1 << 20


class JsonLinesFormat(InputFormat):
    name = "jsonl"
    title = "JSON Lines"
    suffixes = (".jsonl", ".json", ".jsonl.gz", ".jsonl.zst")
    holds_text = True

    def inspect(self, path: str, column: str, limits: ReadLimits) -> ShardInfo:
        num_docs = num_tokens = num_null_docs = 0
        for (lists,) in self.read_columns(path, (column,), None, limits):
            num_docs += len(lists)
            num_null_docs += lists.null_count
            num_tokens += int(pc.sum(pc.list_value_length(lists)).as_py() or 0)
        if num_docs and num_null_docs == num_docs:
            schema = _first_schema(path)
            keys = list(schema.names) if schema is not None else []
            text = next((f.name for f in schema or [] if pa.types.is_string(f.type)), None)
            hint = (f"; to pack its text {text!r}, tokenize it in the run: --tokenizer tokenizer.json (or "
                    f"tiktoken:cl100k_base) --text-column {text}") if text else ""
            raise InputError(
                f"shard {path}: no line has a {column!r} list (keys of the first line: {keys}); "
                f"name the token column with --token-column{hint}"
            )
        return ShardInfo(path, self.name, num_docs, num_tokens, "int64", "scan")

    def read_columns(self, path: str, columns: tuple[str, ...], units: tuple[int, int] | None,
                     limits: ReadLimits) -> Iterator[tuple[pa.Array, ...]]:
        """Module docstring; ``limits.json_block_size`` bytes of lines at a time."""
        fs, fs_path = resolve_filesystem(path)
        max_line_bytes = line_byte_limit(limits.max_document_tokens)
        num_read = 0
        blocks = iter_line_blocks(fs, fs_path, path, 0, None, limits.json_block_size,
                                  max_line_bytes=max_line_bytes, what="shard")
        try:
            for block in blocks:
                _check_line_lengths(block.data, max_line_bytes, path, num_read, limits.max_document_tokens)
                arrays = _parse_token_block(block.data, columns, path, num_read, max_line_bytes)
                num_read += len(arrays[0])
                if len(arrays[0]):
                    yield arrays
        except LineTooLong as e:
            raise _line_too_long(path, num_read, max_line_bytes, limits.max_document_tokens) from e

    def side_types(self, path: str, names: tuple[str, ...]) -> tuple[str, ...]:
        return side_value_types(None, names, path)

    def text_tasks(self, path: str, *, task_rows: int, task_bytes: int) -> list[tuple[int, int, int]]:
        return [(start, end, end - start) for start, end in jsonl_byte_range_tasks(path, task_bytes)]

    def iter_texts(self, path: str, column: str, start: int, end: int, batch_rows: int, *,
                   max_text_bytes: int | None = None) -> Iterator[tuple[int, pa.Array]]:
        return iter_jsonl_texts(path, column, start, end, batch_rows, max_text_bytes=max_text_bytes)

    def text_row(self, path: str, start: int, end: int, k: int) -> str:
        line = text_line(path, start, end, k)
        return f"line {line}" if line is not None else super().text_row(path, start, end, k)

    def write(self, path: str, table: pa.Table, rows_per_unit: int | None = None) -> None:
        """One object per row, keys in column order, lists without spaces (``{"input_ids": [1,2]}``)."""
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False, separators=(",", ": ")) + "\n"
                         for row in table.to_pylist())


def compression_of(fs_path: str) -> str | None:
    """The stream compression ("gzip", "zstd") named by ``fs_path``'s suffix, else None."""
    name = fs_path.rsplit("/", 1)[-1].lower()
    return next((c for ext, c in _COMPRESSION_BY_SUFFIX.items() if name.endswith(".jsonl" + ext)), None)


def line_byte_limit(max_document_tokens: int | None) -> int:
    """The longest token line accepted for ``max_document_tokens`` (module docstring)."""
    if max_document_tokens is None:
        return MAX_LINE_BYTES
    return min(MAX_LINE_BYTES, max_document_tokens * JSON_BYTES_PER_TOKEN)


# ---------------------------------------------------------------------------------------------
# The line reader


class LineBlock(NamedTuple):
    """Whole lines ``data`` that start at byte ``start`` of the (decompressed) file."""

    start: int
    data: bytes


class LineTooLong(Exception):
    """A line runs past ``max_line_bytes``; every line before it has been yielded."""

    def __init__(self, line_start: int) -> None:
        super().__init__(line_start)
        self.line_start = line_start
        """The (decompressed) byte offset where the line begins."""


def iter_line_blocks(fs: pafs.FileSystem, fs_path: str, path: str, start: int, end: int | None, block_bytes: int,
                     *, max_line_bytes: int | None = None, what: str = "text file") -> Iterator[LineBlock]:
    """Blocks of whole lines from the aligned start to the aligned end of nominal range [start, end)
    (module docstring; ``end`` None: to end of file; a compressed file is read whole from 0).
    A line still open after ``max_line_bytes`` bytes raises :class:`LineTooLong`."""
    compression = compression_of(fs_path)
    try:
        if compression:
            with fs.open_input_stream(fs_path, compression=compression) as stream:
                yield from _split_lines(stream, 0, None, block_bytes, max_line_bytes)
            return
        with open_input_file(fs, fs_path, path) as source:
            aligned_start = _aligned_start(source, start)
            if end is not None and aligned_start > end:
                return  # the line at `start` runs past `end`: it belongs to an earlier range
            source.seek(aligned_start)
            yield from _split_lines(source, aligned_start, end, block_bytes, max_line_bytes)
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{what} {path}: cannot read ({error_text(e)}); check the file") from e


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


def _split_lines(stream: pa.NativeFile, position: int, end: int | None, block_bytes: int,
                 max_line_bytes: int | None) -> Iterator[LineBlock]:
    """Read from ``position`` in blocks cut after a newline; stop after the first newline >= end.
    ``carry``: the parts of the line still open (joined once, when it ends). A block is copied once
    from what was read (the join, over a view of it: slicing the read bytes copied them once more)."""
    carry: list[bytes] = []
    num_carried = 0
    while chunk := stream.read(block_bytes):
        if end is not None and position + len(chunk) > end:
            newline = chunk.find(b"\n", max(end - position, 0))
            if newline >= 0:
                yield LineBlock(position - num_carried, b"".join([*carry, memoryview(chunk)[: newline + 1]]))
                return
        last = chunk.rfind(b"\n")
        if last >= 0:
            yield LineBlock(position - num_carried, b"".join([*carry, memoryview(chunk)[: last + 1]]))
            carry, num_carried = [chunk[last + 1:]], len(chunk) - last - 1
        else:
            carry.append(chunk)
            num_carried += len(chunk)
        if max_line_bytes is not None and num_carried > max_line_bytes:
            raise LineTooLong(position + len(chunk) - num_carried)
        position += len(chunk)
    if num_carried:
        yield LineBlock(position - num_carried, b"".join(carry))


def _check_line_lengths(data: bytes, max_line_bytes: int, path: str, num_read: int,
                        max_document_tokens: int | None) -> None:
    """A line of ``data`` longer than ``max_line_bytes`` raises before it is parsed. O(bytes) numpy,
    only for a block longer than the limit."""
    if len(data) <= max_line_bytes:
        return
    ends = np.r_[-1, np.flatnonzero(np.frombuffer(data, np.uint8) == 10), len(data)]
    long = np.flatnonzero(np.diff(ends) - 1 > max_line_bytes)
    if long.size:
        before = data[: int(ends[long[0]]) + 1]
        row = num_read + sum(1 for line in before.split(b"\n") if line.strip())
        raise _line_too_long(path, row, max_line_bytes, max_document_tokens)


def _line_too_long(path: str, row: int, max_line_bytes: int, max_document_tokens: int | None) -> InputError:
    if max_document_tokens is None or max_line_bytes == MAX_LINE_BYTES:
        return InputError(f"shard {path} row {row}: its line is longer than {max_line_bytes:,} bytes, the most a JSON "
                          "Lines shard may hold on one line; split the document upstream, or write the shard as "
                          "Parquet")
    return InputError(
        f"shard {path} row {row}: its line is longer than {max_line_bytes:,} bytes ({JSON_BYTES_PER_TOKEN} per token "
        f"of max_document_tokens={max_document_tokens:,}; a packer reads a document whole); raise "
        "--max-document-tokens if the packers have the memory (BENCHMARKS.md: bytes per token), or split the "
        "document upstream"
    )


# ---------------------------------------------------------------------------------------------
# Token lists


def _parse_token_block(data: bytes, columns: tuple[str, ...], path: str, num_read: int,
                       max_line_bytes: int) -> tuple[pa.Array, ...]:
    """One list<int64> array per column of the lines in ``data``; others keys are ignored."""
    schema = pa.schema([(column, pa.list_(pa.int64())) for column in columns])
    try:
        table = _read_json_block(data, schema)
    except pa.ArrowInvalid as e:
        what = f"{columns[0]!r} is a list of integers (int64)" if len(columns) == 1 else \
            f"{', '.join(map(repr, columns))} are lists of integers (int64; write booleans as 0/1)"
        raise InputError(
            f"shard {path}: cannot parse JSON Lines from document {num_read} on ({error_text(e)}); each line must be "
            f"one object whose {what}, and no line may exceed {max_line_bytes} bytes"
        ) from e
    if table is None:
        return tuple(pa.nulls(0, pa.list_(pa.int64())) for _ in columns)
    return tuple(_one_chunk(table.column(k)) for k in range(len(columns)))


def _read_json_block(data: bytes, schema: pa.Schema) -> pa.Table | None:
    """``data`` (whole lines) parsed with ``schema`` (others keys ignored); None when it holds no object."""
    parse_options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read_options = pajson.ReadOptions(block_size=min(max(len(data), 1 << 20), 2**31 - 1), use_threads=False)
    try:
        return pajson.read_json(pa.BufferReader(data), read_options=read_options, parse_options=parse_options)
    except pa.ArrowInvalid as e:
        if "Empty JSON" in str(e):
            return None
        raise


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _first_schema(path: str) -> pa.Schema | None:
    """The schema Arrow infers from the file's first block; None when it cannot read one."""
    fs, fs_path = resolve_filesystem(path)
    try:
        with fs.open_input_stream(fs_path, compression=compression_of(fs_path)) as stream:
            read_options = pajson.ReadOptions(block_size=JSONL_BLOCK_BYTES)
            return pajson.open_json(stream, read_options=read_options).schema
    except (pa.ArrowException, OSError):
        return None


# ---------------------------------------------------------------------------------------------
# Raw text, for tokenizing


def jsonl_byte_range_tasks(path: str, target_bytes: int) -> list[tuple[int, int]]:
    """Nominal byte ranges ``[start, end)`` tiling the file, ``target_bytes`` each (last: the rest).

    Reads only the file size. A compressed file (.gz/.zst) or an empty one is one task
    ``(0, size)``. ``iter_jsonl_texts`` turns a nominal range into a line-aligned one.
    """
    if isinstance(target_bytes, bool) or not isinstance(target_bytes, int) or target_bytes < 1:
        raise ValueError(f"target_bytes={target_bytes!r} must be an integer >= 1")
    fs, fs_path = resolve_filesystem(path)
    info = fs.get_file_info(fs_path)
    if info.type != pafs.FileType.File:
        raise InputError(f"text file not found: {path}")
    size = info.size
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
    block_bytes: int = TEXT_BLOCK_BYTES,
    max_text_bytes: int | None = None,
) -> Iterator[tuple[int, pa.StringArray | pa.LargeStringArray]]:
    """Yield ``(first_row, texts)`` for the lines of nominal byte range [start, end) (module doc).

    ``end=None`` reads to end of file; a compressed file must be read whole (start=0).
    Memory: one block of ``block_bytes`` whole lines (or one longer line, of at most
    :func:`text_line_limit` bytes: a longer one is refused as it is read, before it is held whole,
    where a 1 GiB line of a 1 MB .jsonl.gz took 4.3 GB) and its texts.
    """
    check_batch_rows(batch_rows)
    fs, fs_path = resolve_filesystem(path)
    compression = compression_of(fs_path)
    if compression and start != 0:
        raise ValueError(f"{path} is compressed ({compression}) and can only be read whole; got start={start}")
    first_row = 0
    max_line_bytes = text_line_limit(max_text_bytes)
    blocks = iter_line_blocks(fs, fs_path, path, start, None if compression else end, block_bytes,
                              max_line_bytes=max_line_bytes)
    try:
        for block in blocks:
            texts = _parse_text_block(block.data, path, column, lambda i, b=block: _line_number(fs, fs_path, b, i))
            for offset in range(0, len(texts), batch_rows):
                yield first_row + offset, texts.slice(offset, batch_rows)
            first_row += len(texts)
    except LineTooLong as e:
        if max_text_bytes is None:
            said = ";"
        elif max_line_bytes == MAX_LINE_BYTES:  # raising the limit cannot lift it (a trial: the line said to)
            said = f", raypack's longest JSON line whatever max_document_bytes (here {max_text_bytes:,});"
        else:
            said = (f", more than a text of max_document_bytes={max_text_bytes:,} takes as JSON (at most 6 bytes a "
                    "byte, escaped, and 1 MiB of other keys); raise --max-document-bytes if the workers have the "
                    "memory, or")
        line = _count_newlines(fs, fs_path, e.line_start) + 1
        raise InputError(f"{path}: line {line} is longer than {max_line_bytes:,} bytes{said} "
                         "split the document upstream") from None


def text_line_limit(max_text_bytes: int | None) -> int:
    """The longest JSON line read for texts of at most ``max_text_bytes``: ``\\uXXXX`` escapes take 6
    bytes a byte, and the line may hold other keys (1 MiB of them); MAX_LINE_BYTES without a limit."""
    return MAX_LINE_BYTES if max_text_bytes is None else min(MAX_LINE_BYTES, 6 * max_text_bytes + (1 << 20))


def _parse_text_block(data: bytes, path: str, column: str, line_number) -> pa.StringArray | pa.LargeStringArray:
    """``column`` of each JSON object line of ``data`` as a checked string array."""
    try:
        table = _read_json_block(data, pa.schema([(column, pa.string())]))
    except pa.ArrowInvalid as e:
        _raise_bad_line(data, path, column, line_number, error_text(e))
    if table is None:
        return pa.nulls(0, pa.string())
    texts = table.column(0).combine_chunks()
    try:
        if texts.null_count:
            raise pa.ArrowInvalid("null text")
        texts.validate(full=True)
        if len(texts) != _object_lines(data):
            raise pa.ArrowInvalid("not one object per line")
    except pa.ArrowInvalid as e:
        _raise_bad_line(data, path, column, line_number, error_text(e))
    return texts


def _object_lines(data: bytes) -> int:
    r"""The lines of ``data`` that are not blank, or -1 where one of them does not both start with ``{``
    and end with ``}``. Arrow's parser takes an object across lines (pretty-printed JSON) and two on one
    line alike; the tasks cut a file at newlines, so such a file was read or refused by how it was cut
    (a hostile trial), and its line numbers were off. Counting lines alone missed a line of two objects
    beside an object over two lines (their counts balance: a later trial). An object over lines has a line
    that does not end with ``}`` (a value, a ``,`` or ``:`` ends it); with none, each line holds at least
    one object, and the count makes it exactly one. O(bytes) numpy, and two ``memchr`` scans (``\r``,
    ``\t``); a Python pass only where a block has a blank line or blanks beside a newline. (Five substring
    searches found those before: 1.5 of the 2.6 CPU-s that reading 407 MB of JSON Lines took, BENCHMARKS.md
    "stop 61".)"""
    if data.startswith(b"\xef\xbb\xbf"):  # a BOM, which Arrow's parser skips where a block starts
        data = data[3:]
    if not data:
        return 0
    buffer = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buffer == 10)
    if data[:1].isspace() or (data[-1:].isspace() and not data.endswith(b"\n")) or b"\r" in data or \
            b"\t" in data or _blank_beside_a_newline(buffer, ends):
        lines = [line.strip() for line in data.split(b"\n")]
        lines = [line for line in lines if line]
        return len(lines) if all(line[:1] == b"{" and line[-1:] == b"}" for line in lines) else -1
    # no blank line here: every newline ends a line
    starts = np.concatenate(([0], ends[:-1] + 1)) if data.endswith(b"\n") else np.concatenate(([0], ends + 1))
    lasts = ends - 1 if data.endswith(b"\n") else np.concatenate((ends - 1, [len(data) - 1]))
    if not (np.all(buffer[starts] == ord("{")) and np.all(buffer[lasts] == ord("}"))):
        return -1
    return len(starts)


def _blank_beside_a_newline(buffer: np.ndarray, ends: np.ndarray) -> bool:
    r"""Whether ``buffer`` (whose newlines are at ``ends``) holds ``\n\n``, ``\n `` or `` \n``."""
    if ends.size == 0:
        return False
    if ends.size > 1 and bool(np.any(np.diff(ends) == 1)):
        return True
    after = ends[ends + 1 < buffer.size] + 1
    before = ends[ends > 0] - 1
    return bool(np.any(buffer[after] == 32)) or bool(np.any(buffer[before] == 32))


def _raise_bad_line(data: bytes, path: str, column: str, line_number, arrow_message: str) -> None:
    """InputError naming the first bad line of ``data``: a Python scan, on the error path only."""
    for index, line in enumerate(data.split(b"\n")):
        reason = _bad_line_reason(line, column)
        if reason:
            fix = "" if reason in _WHOLE_FILE else "; fix or drop that line"  # the file's form, not one line
            raise InputError(f"text file {path} line {line_number(index)}: {reason}{fix}")
    lines = data.split(b"\n")
    bad = _first_line_arrow_refuses(lines, column)
    if bad is not None:
        index, message = bad
        raise InputError(f"text file {path} line {line_number(index)}: JSON that Arrow's parser refuses ({message}) "
                         f"outside the {column!r} value (only {column!r} is read, but each line is parsed whole); "
                         "fix or drop that line")
    last_line = line_number(data.count(b"\n") - data.endswith(b"\n"))
    raise InputError(
        f"text file {path} lines {line_number(0)}-{last_line}: cannot parse JSON Lines "
        f"({arrow_message}); each line must be one JSON object whose {column!r} is a string"
    )


def _first_line_arrow_refuses(lines: list[bytes], column: str) -> tuple[int, str] | None:
    """The first of ``lines`` that Arrow refuses alone, with its message (lines Python's json reads, whose
    text is fine: a lone surrogate escape or 1e999 in another key): halves parsed until one line is left,
    about 2 log2(n) parses. Error path only."""
    schema = pa.schema([(column, pa.string())])

    def refused(low: int, high: int) -> str | None:
        try:
            _read_json_block(b"\n".join(lines[low:high]) + b"\n", schema)
        except pa.ArrowInvalid as e:
            return re.sub(r" in row \d+\.?$", "", error_text(e))  # the row of the one line parsed: 0
        return None

    low, high = 0, len(lines)
    if refused(low, high) is None:
        return None
    while high - low > 1:
        middle = (low + high) // 2
        if refused(low, middle) is not None:
            high = middle
        else:
            low = middle
    message = refused(low, low + 1)
    return None if message is None else (low, message)


_JSON_TYPES = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object", type(None): "null"}
"""By ``isinstance`` (an object parsed by :func:`_keys_kept` is a dict subclass)."""


_ARRAY_FILE = ("a JSON array of objects: the file is one JSON document, not JSON Lines (one object on each line); "
               "write one object a line, e.g. jq -c '.[]' FILE")


_CR_LINES = ("not JSON (its lines end with a carriage return alone, \\r, not \\n: convert them to \\n, e.g. "
             "tr '\\r' '\\n')")
_WHOLE_FILE = (_ARRAY_FILE, _CR_LINES)


def _bad_line_reason(line: bytes, column: str) -> str | None:
    """Why one line is not ``{column: "a string", ...}``, or None if it is (or is blank)."""
    if not line.strip():
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 (byte 0x{line[e.start]:02x} at byte {e.start} of the line)"
    try:
        value = json.loads(text, object_pairs_hook=_keys_kept)
    except RecursionError:
        return (f"JSON nested too deeply to parse (arrays or objects over {sys.getrecursionlimit():,} levels deep); "
                "each line must be one object whose text is a string")
    except json.JSONDecodeError as e:
        if b"\r" in line.rstrip(b"\r\n"):  # one "line" of many objects: the file ends its lines with \r alone
            return _CR_LINES
        if text.strip() == "[":
            return _ARRAY_FILE
        return (f"not JSON ({e.msg}{'' if e.msg.endswith(' at') else ' at'} column {e.colno}; JSON Lines holds one "
                "whole object on each line)")  # "...starting at"
    if isinstance(value, _KeptKeys) and value.keys_seen.count(column) > 1:
        return f"the key {column!r} appears {value.keys_seen.count(column)} times (which one is the text?)"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return _ARRAY_FILE
    if not isinstance(value, dict):
        return f"a JSON {_JSON_TYPES.get(type(value), 'string')} where an object was expected"
    if column not in value:
        return (f"no key {column!r} (keys: {', '.join(value) or '(none)'}; if one of them holds the text, pass it "
                "with --text-column)")
    text_value = value[column]
    if not isinstance(text_value, str):
        kind = next((name for cls, name in _JSON_TYPES.items() if isinstance(text_value, cls)), "value")
        return f"{column!r} is a JSON {kind}, not a string"
    try:
        text_value.encode("utf-8")
    except UnicodeEncodeError:
        return f"{column!r} holds an unpaired surrogate escape (\\ud800-\\udfff), which is not text"
    return None


class _KeptKeys(dict):
    """A parsed JSON object that remembers every key in order, repeats included."""

    keys_seen: list[str]


def _keys_kept(pairs: list[tuple[str, object]]) -> _KeptKeys:
    value = _KeptKeys(pairs)
    value.keys_seen = [key for key, _ in pairs]
    return value


def text_line(path: str, start: int, end: int | None, k: int) -> int | None:
    """1-based file line of text ``k`` (from 0; blank lines hold none) of the task over nominal bytes
    ``[start, end)``; None past its last. Error path: reads the file up to that line."""
    fs, fs_path = resolve_filesystem(path)
    seen = 0
    blocks = iter_line_blocks(fs, fs_path, path, start, None if compression_of(fs_path) else end, JSONL_BLOCK_BYTES,
                              max_line_bytes=MAX_LINE_BYTES)
    for block in blocks:
        for index, line in enumerate(block.data.split(b"\n")):
            if line.strip():
                if seen == k:
                    blocks.close()
                    return _count_newlines(fs, fs_path, block.start) + index + 1
                seen += 1
    return None


def _line_number(fs: pafs.FileSystem, fs_path: str, block: LineBlock, index: int) -> int:
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
