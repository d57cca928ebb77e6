"""Input formats: Parquet, JSON Lines and Arrow IPC shards of token lists. pyarrow/numpy only, no Ray.

All that raypack knows of its input formats is here:

  * suffixes: ``shard_format(path)`` names a shard's format from ``SHARD_SUFFIXES`` (the
    longest suffix wins; ``.jsonl.gz`` / ``.jsonl.zst`` are read through a decompressing
    stream, ``compression_of``);
  * counts: ``inspect_shard(path)`` counts a shard's documents and tokens as cheaply as the
    format allows (Parquet footer statistics, Arrow IPC list offsets, a JSONL scan) and checks
    its token column's type (``token_value_type``). Counts are exact for shards the readers
    accept: Parquet footer counts are the number of non-null tokens, and a shard holding null
    tokens is rejected by ``validate_token_batch`` anyway;
  * streaming: ``iter_token_batches`` reads a shard in file order with bounded memory and
    yields ``(first_row, tokens)``: ``tokens`` is a list/large_list array of integer token ids
    holding at most ``batch_size`` documents, ``first_row`` the shard-local index of its first
    document;
  * side columns (``--extra-columns``, raypack.rules.side_columns): ``iter_document_batches`` reads
    them alongside the tokens, the same rows, and checks one value per token
    (``validate_side_batch``); ``shard_side_types`` reads their types from a schema at plan time;
  * pieces (what the packer reads) are in :mod:`raypack.inputs.token_pieces`: the same stream, except
    that a Parquet row group of long documents is read page by page (raypack.inputs.parquet_pages) and
    a document longer than ``max_tokens`` arrives in consecutive pieces;
  * validation (:mod:`raypack.rules.token_checks`): every batch is checked before it is yielded
    (vectorised, O(tokens) at numpy speed): no null documents (an empty document is ``[]``, not
    null), no null tokens inside a document, no negative token ids. ``check_tokens_fit`` adds
    the one check that depends on the output: every token id fits the output token dtype.

Each failure raises ``InputError`` naming the shard, the row and the value. Files are opened
through :mod:`raypack.io.fs`, so every function takes local paths and URIs alike.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace
from typing import Iterator, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.ipc as paipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from raypack.errors import InputError
from raypack.io.fs import error_text, open_input_file, resolve_filesystem
from raypack.rules.side_columns import side_value_types
from raypack.rules.token_checks import check_tokens_fit, validate_side_batch, validate_token_batch

__all__ = [
    "FORMATS",
    "DocumentBatch",
    "JSON_BLOCK_SIZE",
    "SHARD_SUFFIXES",
    "ShardInfo",
    "accepted_suffixes",
    "check_tokens_fit",
    "compression_of",
    "inspect_shard",
    "iter_document_batches",
    "iter_ipc_batches",
    "iter_jsonl_lists",
    "iter_token_batches",
    "open_parquet",
    "shard_format",
    "shard_side_types",
    "side_value_types",
    "token_value_type",
    "validate_token_batch",
]

log = logging.getLogger(__name__)

SHARD_SUFFIXES: dict[str, str] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".jsonl.gz": "jsonl",
    ".jsonl.zst": "jsonl",
    ".arrow": "arrow",
    ".ipc": "arrow",
    ".feather": "arrow",
}
"""File name suffix (lower case) -> shard format. Longest suffix wins."""

_COMPRESSION_BY_SUFFIX = {".gz": "gzip", ".zst": "zstd"}

JSON_BLOCK_SIZE = 16 << 20
"""Bytes the JSONL reader parses at a time; grown (x4, up to MAX_JSON_BLOCK_SIZE) for longer lines."""
MAX_JSON_BLOCK_SIZE = 1 << 30
_FIRST_FOOTER_SAFE_ARROW_MAJOR = 6
"""Arrow >= 6 (PARQUET-2067) counts null and empty lists in a list leaf's null_count."""

FORMATS: tuple[str, ...] = tuple(dict.fromkeys(SHARD_SUFFIXES.values()))
"""The shard formats: ("parquet", "jsonl", "arrow")."""


# ---------------------------------------------------------------------------------------------
# Suffixes


def shard_format(path: str) -> str | None:
    """The shard format ("parquet", "jsonl" or "arrow") named by ``path``'s suffix, else None."""
    suffix = shard_suffix(path)
    return SHARD_SUFFIXES[suffix] if suffix else None


def shard_suffix(path: str) -> str | None:
    """The longest ``SHARD_SUFFIXES`` key ending ``path``'s file name (lower case), else None."""
    name = path.rsplit("/", 1)[-1].lower()
    matches = [s for s in SHARD_SUFFIXES if name.endswith(s) and len(name) > len(s)]
    return max(matches, key=len) if matches else None


def accepted_suffixes() -> str:
    """The accepted shard suffixes, for error messages."""
    return ", ".join(SHARD_SUFFIXES)


def compression_of(fs_path: str) -> str | None:
    """The stream compression ("gzip", "zstd") named by ``fs_path``'s suffix, else None."""
    suffix = shard_suffix(fs_path) or ""
    return next((c for ext, c in _COMPRESSION_BY_SUFFIX.items() if suffix.endswith(ext)), None)


# ---------------------------------------------------------------------------------------------
# Counts


@dataclass(frozen=True)
class ShardInfo:
    """One shard's counts, from ``inspect_shard``."""

    path: str
    format: str
    """"parquet", "jsonl" or "arrow"."""
    num_docs: int
    num_tokens: int
    token_type: str
    """Arrow value type of the token lists, e.g. "int32", "int64", "uint16"."""
    count_method: str
    """"parquet-footer", "scan" or "ipc-offsets"."""
    unit_docs: tuple[int, ...] = field(default=(), compare=False)
    """Documents per row group (Parquet) or record batch (Arrow IPC file), in file order; empty
    when the shard can only be read whole (JSONL, an IPC stream, a tokenized corpus's part file)."""
    unit_tokens: tuple[int, ...] = field(default=(), compare=False)
    """Tokens per row group or record batch, as ``unit_docs``."""
    source: dict | None = None
    """A tokenized corpus's part: the text it came from ({"path", "format", "start", "end"})."""


def inspect_shard(
    path: str, column: str = "input_ids", *, json_block_size: int = JSON_BLOCK_SIZE
) -> ShardInfo:
    """Count a shard's documents and tokens, cheaply, and check its token column's type.

    Parquet: footer statistics (no data read) when the writer's list null counts are known
    to be exact (Arrow C++ >= 6); otherwise, per row group lacking usable statistics, a scan
    of the token column only. Arrow IPC: one subtraction of list offsets per record batch
    (memory-mapped for local files). JSONL: a streaming scan.
    """
    fmt = shard_format(path)
    if fmt is None:
        raise InputError(f"shard {path} has an unknown suffix; accepted: {accepted_suffixes()}")
    fs, fs_path = resolve_filesystem(path)
    if fmt == "parquet":
        return _inspect_parquet(fs, fs_path, path, column)
    if fmt == "arrow":
        return _inspect_ipc(fs, fs_path, path, column)
    return _inspect_jsonl(fs, fs_path, path, column, json_block_size)


def token_value_type(schema: pa.Schema, column: str, path: str) -> pa.DataType:
    """The integer value type of ``column``, a list/large_list of integers, in ``schema``."""
    if column not in schema.names:
        raise InputError(
            f"shard {path} has no column {column!r}; its columns are {schema.names}; "
            "set the token column name"
        )
    field_type = schema.field(column).type
    if not (pa.types.is_list(field_type) or pa.types.is_large_list(field_type)):
        raise InputError(
            f"shard {path} column {column!r} has type {field_type}; it must be a list of "
            "integer token ids (list<int32>, large_list<int64>, ...)"
        )
    value_type = field_type.value_type
    if not pa.types.is_integer(value_type):
        raise InputError(
            f"shard {path} column {column!r} has type {field_type}; token ids must be "
            f"integers, not {value_type}"
        )
    return value_type


def open_parquet(source: pa.NativeFile, path: str) -> pq.ParquetFile:
    """``ParquetFile`` over ``source``; a corrupt or truncated file raises InputError."""
    try:
        return pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20)
    except (pa.ArrowException, OSError) as e:
        raise InputError(
            f"shard {path} is not a readable Parquet file ({error_text(e)}); re-write or remove it"
        ) from e


def _inspect_parquet(fs: pafs.FileSystem, fs_path: str, path: str, column: str) -> ShardInfo:
    with open_input_file(fs, fs_path, path) as source:
        parquet_file = open_parquet(source, path)
        value_type = token_value_type(parquet_file.schema_arrow, column, path)
        metadata = parquet_file.metadata
        leaf = token_leaf_index(parquet_file.schema, column)
        trusted = leaf is not None and _footer_null_counts_exact(metadata.created_by)
        unit_tokens, method = [], "parquet-footer"
        for group in range(metadata.num_row_groups):
            count = _footer_token_count(metadata.row_group(group), leaf) if trusted else None
            if count is None:
                count, method = _scan_row_group_tokens(parquet_file, group, column, path), "scan"
            unit_tokens.append(count)
        unit_docs = tuple(metadata.row_group(group).num_rows for group in range(metadata.num_row_groups))
    if method == "scan":
        log.info("shard %s: no usable Parquet token statistics; counted by scanning", path)
    return ShardInfo(path, "parquet", metadata.num_rows, sum(unit_tokens), str(value_type), method,
                     unit_docs, tuple(unit_tokens))


def token_leaf_index(schema: pq.ParquetSchema, column: str) -> int | None:
    """Index of the one leaf column under ``column`` with one repetition level, else None."""
    leaves = [
        i
        for i in range(len(schema))
        if schema.column(i).path.startswith(column + ".")
        and schema.column(i).max_repetition_level == 1
    ]
    return leaves[0] if len(leaves) == 1 else None


def _footer_null_counts_exact(created_by: str | None) -> bool:
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
    return _sum_list_lengths(table.column(0))


def _sum_list_lengths(lists: pa.Array | pa.ChunkedArray) -> int:
    total = pc.sum(pc.list_value_length(lists)).as_py()
    return int(total or 0)


def _inspect_ipc(fs: pafs.FileSystem, fs_path: str, path: str, column: str) -> ShardInfo:
    unit_docs, unit_tokens = [], []
    value_type = None
    for schema, batch in iter_ipc_batches(fs, fs_path, path):
        if value_type is None:
            value_type = token_value_type(schema, column, path)
        if batch is None:
            continue
        lists = batch.column(schema.get_field_index(column))
        unit_docs.append(len(lists))
        offsets = lists.offsets
        unit_tokens.append(offsets[len(offsets) - 1].as_py() - offsets[0].as_py() if len(lists) else 0)
    info = ShardInfo(path, "arrow", sum(unit_docs), sum(unit_tokens), str(value_type), "ipc-offsets")
    if not _is_ipc_file(fs, fs_path):
        return info  # a stream has no record batch index: read whole
    return replace(info, unit_docs=tuple(unit_docs), unit_tokens=tuple(unit_tokens))


def _is_ipc_file(fs: pafs.FileSystem, fs_path: str) -> bool:
    """True for the Arrow IPC file format (random access by record batch), False for a stream."""
    with fs.open_input_file(fs_path) as f:
        return f.read(6) == b"ARROW1"


def iter_ipc_batches(
    fs: pafs.FileSystem, fs_path: str, path: str, units: tuple[int, int] | None = None
) -> Iterator[tuple[pa.Schema, pa.RecordBatch | None]]:
    """``(schema, None)``, then ``(schema, batch)`` per record batch of an Arrow IPC file, in order.

    The leading item lets callers check the schema before any batch is read. The IPC stream
    format is accepted too (read sequentially, whole). Local files are memory-mapped, so a batch
    costs only the pages that are touched. ``units``: only record batches ``[start, end)`` of
    an IPC file.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        fs = pafs.LocalFileSystem(use_mmap=True)
    with open_input_file(fs, fs_path, path) as source:
        try:
            reader = paipc.open_file(source)
        except pa.ArrowInvalid as file_error:
            if units is not None:
                raise InputError(f"shard {path} is no longer an Arrow IPC file ({error_text(file_error)}); "
                                 "the file changed during the run (rerun on a stable copy)") from file_error
            yield from _iter_ipc_stream(fs, fs_path, path, file_error)
            return
        yield from _ipc_file_batches(reader, path, units)


def _ipc_file_batches(reader: paipc.RecordBatchFileReader, path: str, units: tuple[int, int] | None):
    yield reader.schema, None
    start, end = units if units is not None else (0, reader.num_record_batches)
    if end > reader.num_record_batches:
        raise InputError(f"shard {path} has {reader.num_record_batches} record batches, the plan reads "
                         f"{start}..{end - 1}; the file changed during the run (rerun on a stable copy)")
    for i in range(start, end):
        try:
            batch = reader.get_batch(i)
        except (pa.ArrowException, OSError) as e:
            raise InputError(
                f"shard {path}: cannot read Arrow record batch {i} ({error_text(e)}); re-write the file"
            ) from e
        yield reader.schema, batch


def _iter_ipc_stream(fs: pafs.FileSystem, fs_path: str, path: str, file_error: Exception):
    with fs.open_input_stream(fs_path) as stream:
        try:
            reader = paipc.open_stream(stream)
            yield reader.schema, None
            for batch in reader:
                yield reader.schema, batch
        except (pa.ArrowException, OSError) as e:
            raise InputError(
                f"shard {path} is not a readable Arrow IPC file or stream ({error_text(file_error)}; "
                f"{error_text(e)}); re-write it with pyarrow.ipc.new_file"
            ) from e


def _inspect_jsonl(
    fs: pafs.FileSystem, fs_path: str, path: str, column: str, block_size: int
) -> ShardInfo:
    num_docs = num_tokens = num_null_docs = 0
    for lists in iter_jsonl_lists(fs, fs_path, path, column, block_size=block_size):
        num_docs += len(lists)
        num_null_docs += lists.null_count
        num_tokens += _sum_list_lengths(lists)
    if num_docs and num_null_docs == num_docs:
        keys = _jsonl_first_keys(fs, fs_path, path)
        raise InputError(
            f"shard {path}: no line has a {column!r} list (keys of the first line: {keys}); "
            "set the token column name"
        )
    return ShardInfo(path, "jsonl", num_docs, num_tokens, "int64", "scan")


def iter_jsonl_lists(
    fs: pafs.FileSystem,
    fs_path: str,
    path: str,
    column: str,
    *,
    block_size: int = JSON_BLOCK_SIZE,
) -> Iterator[pa.ListArray]:
    """``column`` of a JSON Lines shard as list<int64> arrays, block by block, in file order.

    Other keys are ignored; a missing key gives a null row. When a line is longer than
    ``block_size`` the read restarts with 4x larger blocks (up to MAX_JSON_BLOCK_SIZE),
    skipping the rows already yielded, so callers see each row exactly once.
    """
    for arrays in _iter_jsonl_columns(fs, fs_path, path, (column,), block_size=block_size):
        yield arrays[0]


def _iter_jsonl_columns(fs: pafs.FileSystem, fs_path: str, path: str, columns: tuple[str, ...], *,
                        block_size: int = JSON_BLOCK_SIZE) -> Iterator[tuple[pa.ListArray, ...]]:
    """:func:`iter_jsonl_lists` of several columns at once: one list<int64> array per column."""
    what = f"{columns[0]!r} is a list of integers (int64)" if len(columns) == 1 else \
        f"{', '.join(map(repr, columns))} are lists of integers (int64; write booleans as 0/1)"
    num_yielded = 0
    while True:
        try:
            for arrays in _jsonl_blocks(fs, fs_path, columns, block_size, skip=num_yielded):
                num_yielded += len(arrays[0])
                yield arrays
            return
        except pa.ArrowInvalid as e:
            if num_yielded == 0 and "Empty JSON stream" in str(e):
                return  # an empty (or blank) shard holds no documents
            if "straddl" in str(e) and block_size < MAX_JSON_BLOCK_SIZE:
                block_size *= 4
                continue
            raise InputError(
                f"shard {path}: cannot parse JSON Lines after document {num_yielded} ({error_text(e)}); each "
                f"line must be one object whose {what}, and no "
                f"line may exceed {MAX_JSON_BLOCK_SIZE} bytes"
            ) from e
        except OSError as e:
            raise InputError(f"shard {path}: cannot read ({error_text(e)}); check the file") from e


def _jsonl_blocks(
    fs: pafs.FileSystem, fs_path: str, columns: tuple[str, ...], block_size: int, *, skip: int
) -> Iterator[tuple[pa.ListArray, ...]]:
    schema = pa.schema([(column, pa.list_(pa.int64())) for column in columns])
    parse_options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read_options = pajson.ReadOptions(block_size=block_size)
    with fs.open_input_stream(fs_path, compression=compression_of(fs_path)) as stream:
        reader = pajson.open_json(stream, read_options=read_options, parse_options=parse_options)
        for batch in reader:
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            yield tuple(batch.column(k).slice(skip) for k in range(len(columns)))
            skip = 0


def _jsonl_first_keys(fs: pafs.FileSystem, fs_path: str, path: str) -> list[str]:
    try:
        with fs.open_input_stream(fs_path, compression=compression_of(fs_path)) as stream:
            read_options = pajson.ReadOptions(block_size=JSON_BLOCK_SIZE)
            return list(pajson.open_json(stream, read_options=read_options).schema.names)
    except (pa.ArrowException, OSError):
        return []


# ---------------------------------------------------------------------------------------------
# Streaming token batches and their validation


def iter_token_batches(
    path: str,
    fmt: str,
    column: str = "input_ids",
    batch_size: int = 8192,
    *,
    units: tuple[int, int] | None = None,
    first_row: int = 0,
    rows: tuple[int, int] | None = None,
    json_block_size: int = JSON_BLOCK_SIZE,
    validate: bool = True,
) -> Iterator[tuple[int, pa.ListArray | pa.LargeListArray]]:
    """Yield ``(first_row, tokens)`` for ``path`` in file order, each batch validated.

    tokens: list<int*> or large_list<int*> array of 1..batch_size documents (zero-copy slices
    of what the format reader produced; JSONL gives list<int64>). Consecutive batches are
    contiguous: ``first_row`` of the next batch is this one's ``first_row + len(tokens)``.
    Memory: one Parquet batch (one row group per ``iter_batches`` call: pyarrow reads ahead
    across the row groups of one call), one JSON block or one IPC record batch at a time.
    ``units``: read only row groups (Parquet) or record batches (Arrow IPC file) ``[start,
    end)``, whose first row is the shard's row ``first_row`` (rows are always shard-local);
    ``rows``: yield only the shard-local rows ``[start, end)`` of what is read (documents
    outside are decoded and dropped). ``validate=False`` skips the token checks (for a pass
    that reads only document lengths).
    """
    for batch in iter_document_batches(path, fmt, column, batch_size, units=units, first_row=first_row, rows=rows,
                                       json_block_size=json_block_size, validate=validate):
        yield batch.first_row, batch.tokens


class DocumentBatch(NamedTuple):
    """Consecutive documents of a shard: their tokens and, per side column, their side values."""

    first_row: int
    tokens: pa.ListArray | pa.LargeListArray
    sides: tuple[pa.Array, ...] = ()
    """One list array per side column (raypack.rules.side_columns), one value per token, checked."""


def iter_document_batches(
    path: str,
    fmt: str,
    column: str = "input_ids",
    batch_size: int = 8192,
    *,
    extra_columns: tuple[str, ...] = (),
    units: tuple[int, int] | None = None,
    first_row: int = 0,
    rows: tuple[int, int] | None = None,
    json_block_size: int = JSON_BLOCK_SIZE,
    validate: bool = True,
) -> Iterator[DocumentBatch]:
    """:func:`iter_token_batches` with the side columns ``extra_columns`` read alongside (same
    rows), each checked to hold one integer/bool value per token (:func:`validate_side_batch`)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} must be one of {', '.join(FORMATS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
    if units is not None and fmt == "jsonl":
        raise ValueError("units: a JSON Lines shard is read whole")
    fs, fs_path = resolve_filesystem(path)
    columns = (column, *extra_columns)
    if fmt == "parquet":
        arrays_iter = _parquet_columns(fs, fs_path, path, columns, batch_size, units)
    elif fmt == "arrow":
        arrays_iter = _ipc_columns(fs, fs_path, path, columns, units)
    else:
        arrays_iter = _iter_jsonl_columns(fs, fs_path, path, columns, block_size=json_block_size)
    for start, arrays in _clip_rows(arrays_iter, first_row, rows):
        for offset in range(0, len(arrays[0]), batch_size):
            tokens, *sides = (a.slice(offset, batch_size) for a in arrays)
            if validate:
                validate_token_batch(tokens, path=path, first_row=start + offset)
                validate_side_batch(tokens, sides, extra_columns, column, path=path, first_row=start + offset)
            yield DocumentBatch(start + offset, tokens, tuple(sides))


def _clip_rows(arrays_iter: Iterator[tuple[pa.Array, ...]], first_row: int,
               rows: tuple[int, int] | None) -> Iterator[tuple[int, tuple[pa.Array, ...]]]:
    """``(shard-local first row, arrays)`` of each tuple of equally long arrays, cut to ``rows`` (all when None)."""
    start = first_row
    for arrays in arrays_iter:
        end = start + len(arrays[0])
        if rows is None:
            yield start, arrays
        else:
            low, high = max(start, rows[0]), min(end, rows[1])
            if low < high:
                yield low, tuple(a.slice(low - start, high - low) for a in arrays)
            if end >= rows[1]:
                return
        start = end


def _parquet_columns(fs, fs_path: str, path: str, columns: tuple[str, ...], batch_size: int,
                     units: tuple[int, int] | None):
    with open_input_file(fs, fs_path, path) as source:
        parquet_file = open_parquet(source, path)
        token_value_type(parquet_file.schema_arrow, columns[0], path)
        side_value_types(parquet_file.schema_arrow, columns[1:], path)
        start, end = units if units is not None else (0, parquet_file.num_row_groups)
        if end > parquet_file.num_row_groups:
            raise InputError(f"shard {path} has {parquet_file.num_row_groups} row groups, the plan reads "
                             f"{start}..{end - 1}; the file changed during the run (rerun on a stable copy)")
        for group in range(start, end):
            for batch in _parquet_record_batches(parquet_file, path, columns, batch_size, row_groups=[group]):
                yield tuple(batch.columns)


def parquet_batches(parquet_file: pq.ParquetFile, path: str, column: str, batch_size: int,
                     row_groups: list[int] | None = None) -> Iterator[pa.Array]:
    """pyarrow's reader: ``column`` of ``row_groups`` (all by default), ``batch_size`` rows at a time."""
    for batch in _parquet_record_batches(parquet_file, path, (column,), batch_size, row_groups):
        yield batch.column(0)


def _parquet_record_batches(parquet_file: pq.ParquetFile, path: str, columns: tuple[str, ...], batch_size: int,
                            row_groups: list[int] | None = None) -> Iterator[pa.RecordBatch]:
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


def _ipc_columns(fs, fs_path: str, path: str, columns: tuple[str, ...], units: tuple[int, int] | None):
    for schema, batch in iter_ipc_batches(fs, fs_path, path, units):
        if batch is None:
            token_value_type(schema, columns[0], path)
            side_value_types(schema, columns[1:], path)
            continue
        yield tuple(batch.column(schema.get_field_index(c)) for c in columns)


def shard_side_types(path: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """:func:`side_value_types` of shard ``path`` (its footer or IPC schema; JSON Lines: int64)."""
    fmt = shard_format(path)
    if fmt == "jsonl":
        return side_value_types(None, names, path)
    fs, fs_path = resolve_filesystem(path)
    if fmt == "parquet":
        with open_input_file(fs, fs_path, path) as source:
            return side_value_types(open_parquet(source, path).schema_arrow, names, path)
    for schema, _ in iter_ipc_batches(fs, fs_path, path):
        return side_value_types(schema, names, path)
    raise InputError(f"shard {path}: no Arrow schema; re-write it with pyarrow.ipc.new_file")
