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
  * pieces (what the packer reads): ``iter_token_pieces`` is the same stream, except that a
    Parquet row group of long documents is read page by page (raypack.parquet_pages) and a
    document longer than ``max_tokens`` arrives in consecutive pieces (``TokenPiece``);
  * validation: every batch is checked before it is yielded (vectorised, O(tokens) at numpy
    speed): no null documents (an empty document is ``[]``, not null), no null tokens inside a
    document, no negative token ids. ``check_tokens_fit`` adds the one check that depends on
    the output: every token id fits the output token dtype.

Each failure raises ``InputError`` naming the shard, the row and the value. Files are opened
through :mod:`raypack.fs`, so every function takes local paths and URIs alike.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.ipc as paipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from raypack.errors import InputError
from raypack.fs import error_text, open_input_file, resolve_filesystem
from raypack.parquet_pages import TokenPiece, Unsupported, iter_row_group_pieces

__all__ = [
    "FORMATS",
    "JSON_BLOCK_SIZE",
    "SHARD_SUFFIXES",
    "ShardInfo",
    "accepted_suffixes",
    "check_tokens_fit",
    "compression_of",
    "inspect_shard",
    "iter_ipc_batches",
    "iter_jsonl_lists",
    "iter_token_batches",
    "iter_token_pieces",
    "open_parquet",
    "shard_format",
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

PAGE_READ_MEAN_DIVISOR = 16
"""A row group with a mean document length above max_tokens / this is read page by page."""

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
        leaf = _token_leaf_index(parquet_file.schema, column)
        trusted = leaf is not None and _footer_null_counts_exact(metadata.created_by)
        num_tokens, method = 0, "parquet-footer"
        for group in range(metadata.num_row_groups):
            count = _footer_token_count(metadata.row_group(group), leaf) if trusted else None
            if count is None:
                count, method = _scan_row_group_tokens(parquet_file, group, column, path), "scan"
            num_tokens += count
    if method == "scan":
        log.info("shard %s: no usable Parquet token statistics; counted by scanning", path)
    return ShardInfo(path, "parquet", metadata.num_rows, num_tokens, str(value_type), method)


def _token_leaf_index(schema: pq.ParquetSchema, column: str) -> int | None:
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
    num_docs = num_tokens = 0
    value_type = None
    for schema, batch in iter_ipc_batches(fs, fs_path, path):
        if value_type is None:
            value_type = token_value_type(schema, column, path)
        if batch is None:
            continue
        lists = batch.column(schema.get_field_index(column))
        num_docs += len(lists)
        if len(lists):
            offsets = lists.offsets
            num_tokens += offsets[len(offsets) - 1].as_py() - offsets[0].as_py()
    return ShardInfo(path, "arrow", num_docs, num_tokens, str(value_type), "ipc-offsets")


def iter_ipc_batches(
    fs: pafs.FileSystem, fs_path: str, path: str
) -> Iterator[tuple[pa.Schema, pa.RecordBatch | None]]:
    """``(schema, None)``, then ``(schema, batch)`` per record batch of an Arrow IPC file, in order.

    The leading item lets callers check the schema before any batch is read. The IPC stream
    format is accepted too (read sequentially). Local files are memory-mapped, so a batch
    costs only the pages that are touched.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        fs = pafs.LocalFileSystem(use_mmap=True)
    with open_input_file(fs, fs_path, path) as source:
        try:
            reader = paipc.open_file(source)
        except pa.ArrowInvalid as file_error:
            yield from _iter_ipc_stream(fs, fs_path, path, file_error)
            return
        yield from _ipc_file_batches(reader, path)


def _ipc_file_batches(reader: paipc.RecordBatchFileReader, path: str):
    yield reader.schema, None
    for i in range(reader.num_record_batches):
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
    num_yielded = 0
    while True:
        try:
            for lists in _jsonl_blocks(fs, fs_path, column, block_size, skip=num_yielded):
                num_yielded += len(lists)
                yield lists
            return
        except pa.ArrowInvalid as e:
            if num_yielded == 0 and "Empty JSON stream" in str(e):
                return  # an empty (or blank) shard holds no documents
            if "straddl" in str(e) and block_size < MAX_JSON_BLOCK_SIZE:
                block_size *= 4
                continue
            raise InputError(
                f"shard {path}: cannot parse JSON Lines after document {num_yielded} ({error_text(e)}); each "
                f"line must be one object whose {column!r} is a list of integers (int64), and no "
                f"line may exceed {MAX_JSON_BLOCK_SIZE} bytes"
            ) from e
        except OSError as e:
            raise InputError(f"shard {path}: cannot read ({error_text(e)}); check the file") from e


def _jsonl_blocks(
    fs: pafs.FileSystem, fs_path: str, column: str, block_size: int, *, skip: int
) -> Iterator[pa.ListArray]:
    schema = pa.schema([(column, pa.list_(pa.int64()))])
    parse_options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read_options = pajson.ReadOptions(block_size=block_size)
    with fs.open_input_stream(fs_path, compression=compression_of(fs_path)) as stream:
        reader = pajson.open_json(stream, read_options=read_options, parse_options=parse_options)
        for batch in reader:
            lists = batch.column(0)
            if skip >= len(lists):
                skip -= len(lists)
                continue
            yield lists.slice(skip)
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
    json_block_size: int = JSON_BLOCK_SIZE,
    validate: bool = True,
) -> Iterator[tuple[int, pa.ListArray | pa.LargeListArray]]:
    """Yield ``(first_row, tokens)`` for ``path`` in file order, each batch validated.

    tokens: list<int*> or large_list<int*> array of 1..batch_size documents (zero-copy slices
    of what the format reader produced; JSONL gives list<int64>). Consecutive batches are
    contiguous: ``first_row`` of the next batch is this one's ``first_row + len(tokens)``.
    Memory: one Parquet batch, one JSON block or one IPC record batch at a time.
    ``validate=False`` skips the token checks (for a pass that reads only document lengths).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} must be one of {', '.join(FORMATS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
    fs, fs_path = resolve_filesystem(path)
    if fmt == "parquet":
        lists_iter = _parquet_lists(fs, fs_path, path, column, batch_size)
    elif fmt == "arrow":
        lists_iter = _ipc_lists(fs, fs_path, path, column)
    else:
        lists_iter = iter_jsonl_lists(fs, fs_path, path, column, block_size=json_block_size)
    first_row = 0
    for lists in lists_iter:
        for start in range(0, len(lists), batch_size):
            tokens = lists.slice(start, batch_size)
            if validate:
                validate_token_batch(tokens, path=path, first_row=first_row)
            yield first_row, tokens
            first_row += len(tokens)


def _parquet_lists(fs, fs_path: str, path: str, column: str, batch_size: int):
    with open_input_file(fs, fs_path, path) as source:
        parquet_file = open_parquet(source, path)
        token_value_type(parquet_file.schema_arrow, column, path)
        yield from _parquet_batches(parquet_file, path, column, batch_size)


def _parquet_batches(parquet_file: pq.ParquetFile, path: str, column: str, batch_size: int,
                     row_groups: list[int] | None = None) -> Iterator[pa.Array]:
    """pyarrow's reader: ``column`` of ``row_groups`` (all by default), ``batch_size`` rows at a time."""
    batches = parquet_file.iter_batches(batch_size=batch_size, columns=[column], row_groups=row_groups)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise InputError(
                f"shard {path}: cannot read Parquet data ({error_text(e)}); re-write the file"
            ) from e
        if batch is None:
            return
        yield batch.column(0)


def iter_token_pieces(
    path: str,
    fmt: str,
    column: str = "input_ids",
    batch_size: int = 8192,
    max_tokens: int = 1 << 20,
    *,
    json_block_size: int = JSON_BLOCK_SIZE,
    validate: bool = True,
) -> Iterator[TokenPiece]:
    """Like :func:`iter_token_batches`, but a Parquet row group whose documents may be longer
    than ``max_tokens`` is read page by page (raypack.parquet_pages): pieces of at most
    ``max_tokens`` tokens, a longer document cut across consecutive pieces.

    Each :class:`TokenPiece` carries the full lengths of the documents that start in it, so
    counts need no reassembly. Other inputs, and row groups the page reader does not handle,
    give whole documents (``continued`` False). Memory for a page-read row group: one page,
    one piece and 8 bytes per row of the row group.
    """
    if fmt != "parquet":
        for first_row, docs in iter_token_batches(path, fmt, column, batch_size, json_block_size=json_block_size,
                                                  validate=validate):
            yield TokenPiece(first_row, docs, False, np.diff(docs.offsets.to_numpy()).astype(np.int64))
        return
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    fs, fs_path = resolve_filesystem(path)
    with open_input_file(fs, fs_path, path) as source:
        parquet_file = open_parquet(source, path)
        token_value_type(parquet_file.schema_arrow, column, path)
        first_row = 0
        for group in range(parquet_file.metadata.num_row_groups):
            pieces = _row_group_pieces(source, parquet_file, group, column, first_row, batch_size, max_tokens, path)
            for piece in pieces:
                if validate:
                    validate_token_batch(piece.docs, path=path, first_row=piece.first_row)
                yield piece
            first_row += parquet_file.metadata.row_group(group).num_rows


def reads_by_pages(row_group: pq.RowGroupMetaData, leaf: int | None, max_tokens: int) -> bool:
    """Whether :func:`iter_token_pieces` reads this row group page by page: its token leaf
    holds more than ``max_tokens`` levels and a mean of more than max_tokens / PAGE_READ_MEAN_DIVISOR
    per row (pyarrow decodes a row whole; the page reader is slower on short documents)."""
    if leaf is None or row_group.num_rows == 0:
        return False
    num_levels = row_group.column(leaf).num_values
    return num_levels > max_tokens and num_levels * PAGE_READ_MEAN_DIVISOR > max_tokens * row_group.num_rows


def _row_group_pieces(source: pa.NativeFile, parquet_file: pq.ParquetFile, group: int, column: str,
                      first_row: int, batch_size: int, max_tokens: int, path: str) -> Iterator[TokenPiece]:
    leaf = _token_leaf_index(parquet_file.schema, column)
    if reads_by_pages(parquet_file.metadata.row_group(group), leaf, max_tokens):
        pieces = iter_row_group_pieces(source, parquet_file, group, column, first_row, max_tokens, path)
        try:
            first = next(pieces)
        except Unsupported as e:
            log.info("shard %s row group %d: read by pyarrow (page reader: %s)", path, group, e)
        else:
            yield first
            yield from pieces
            return
    for lists in _parquet_batches(parquet_file, path, column, batch_size, row_groups=[group]):
        for start in range(0, len(lists), batch_size):
            docs = lists.slice(start, batch_size)
            yield TokenPiece(first_row, docs, False, np.diff(docs.offsets.to_numpy()).astype(np.int64))
            first_row += len(docs)


def _ipc_lists(fs, fs_path: str, path: str, column: str):
    for schema, batch in iter_ipc_batches(fs, fs_path, path):
        if batch is None:
            token_value_type(schema, column, path)
            continue
        yield batch.column(schema.get_field_index(column))


def validate_token_batch(tokens: pa.Array, *, path: str, first_row: int) -> None:
    """Raise InputError unless ``tokens`` is a list array of non-null, non-negative integers.

    tokens: list/large_list array (may be a slice); ``first_row`` is the shard-local row of
    ``tokens[0]``, used only in messages. Reads values through ``flatten()``, never through
    the raw ``.values`` child, so slices are checked exactly.
    """
    if not (pa.types.is_list(tokens.type) or pa.types.is_large_list(tokens.type)):
        raise InputError(
            f"shard {path}: token column has type {tokens.type}; it must be a list of integers"
        )
    if not pa.types.is_integer(tokens.type.value_type):
        raise InputError(
            f"shard {path}: token ids have type {tokens.type.value_type}; they must be integers"
        )
    if tokens.null_count:
        row = int(np.flatnonzero(tokens.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(
            f"shard {path} row {first_row + row}: the document is null; every document must be "
            "a list of token ids (write [] for an empty document)"
        )
    values = tokens.flatten()
    if values.null_count:
        at = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        row = _row_of(tokens, at)
        raise InputError(
            f"shard {path} row {first_row + row}: token {at - _row_start(tokens, row)} of the "
            "document is null; token ids must be non-null integers"
        )
    if pa.types.is_signed_integer(values.type) and len(values):
        array = values.to_numpy()
        if array.min() < 0:
            at = int(np.argmax(array < 0))
            raise InputError(
                f"shard {path} row {first_row + _row_of(tokens, at)}: token {int(array[at])} is "
                "negative; token ids must be >= 0"
            )


def check_tokens_fit(
    tokens: npt.NDArray[np.integer],
    lengths: npt.NDArray[np.integer],
    dtype: npt.DTypeLike | pa.DataType,
    *,
    path: str,
    first_row: int,
) -> None:
    """Raise InputError if a token id does not fit ``dtype`` (the output token dtype).

    tokens: (T,) flat token ids of a batch; lengths: (n,) document lengths summing to T
    (as from ``raypack.core.flatten_documents``); ``first_row`` is the shard-local row of
    the batch's first document. Costs one min and one max unless a token is out of range.
    """
    target = np.dtype(dtype.to_pandas_dtype()) if isinstance(dtype, pa.DataType) else np.dtype(dtype)
    if target.kind not in "iu":
        raise ValueError(f"dtype={target} must be an integer dtype")
    tokens = np.asarray(tokens)
    if tokens.size == 0 or np.can_cast(tokens.dtype, target, casting="safe"):
        return
    info = np.iinfo(target)
    too_low, too_high = int(tokens.min()) < info.min, int(tokens.max()) > info.max
    if not (too_low or too_high):
        return
    bad = tokens < tokens.dtype.type(info.min) if too_low else tokens > tokens.dtype.type(info.max)
    at = int(np.argmax(bad))
    row = int(np.searchsorted(np.cumsum(lengths), at, side="right"))
    raise InputError(
        f"shard {path} row {first_row + row}: token {int(tokens[at])} does not fit the output "
        f"token dtype {target} ({info.min}..{info.max}); set token_dtype to a wider type or 'auto'"
    )


def _row_of(tokens: pa.Array, flat_index: int) -> int:
    """The row (within ``tokens``) holding flattened value ``flat_index``; no null rows."""
    starts = _relative_offsets(tokens)
    return int(np.searchsorted(starts, flat_index, side="right")) - 1


def _row_start(tokens: pa.Array, row: int) -> int:
    return int(_relative_offsets(tokens)[row])


def _relative_offsets(tokens: pa.Array) -> np.ndarray:
    offsets = tokens.offsets.to_numpy()
    return offsets - offsets[0]
