"""Shards: discovery, cheap counts and global offsets. pyarrow only, no Ray.

The driver runs this before any worker starts:

  1. ``discover_shards(inputs)`` lists the shard files in a fixed order: the order of the
     inputs, each file/directory/glob expanded in sorted path order, duplicates dropped.
  2. ``inspect_shard(path)`` counts each shard's documents and tokens as cheaply as the
     format allows (Parquet footer statistics, Arrow IPC list offsets, a JSONL scan).
  3. ``plan_offsets(infos)`` turns the counts into global offsets by a cumulative sum:
     document ``i`` of shard ``k`` has global doc id ``doc_offsets[k] + i``, and shard ``k``'s
     tokens start at global stream position ``token_offsets[k]``.

Every file access goes through a ``pyarrow.fs`` filesystem, so local paths and URIs such as
``s3://bucket/key``, ``gs://bucket/key`` or ``file:///data`` work alike (and any scheme
fsspec knows, through ``pyarrow.fs.FSSpecHandler``). Credentials and endpoints come from the
filesystem's own environment variables and config files (for S3: ``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL``, ``~/.aws/config``, ...). One filesystem is made per URI root
(scheme, bucket, query), so planning 10k shards in one bucket resolves its region once. A
shard path returned by ``discover_shards`` is an absolute local path, or a URI when the
input was one.

Counts are exact for shards the readers accept. Parquet footer counts are the number of
non-null tokens; a shard holding null tokens is rejected by ``raypack.readers`` anyway.
"""

from __future__ import annotations

import fnmatch
import functools
import logging
import pathlib
import re
import urllib.parse
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.ipc as paipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from raypack.errors import InputError

__all__ = [
    "SHARD_SUFFIXES",
    "ShardInfo",
    "ShardPlan",
    "bucket_of",
    "check_bucket",
    "clear_filesystem_cache",
    "common_token_type",
    "discover_shards",
    "inspect_shard",
    "iter_ipc_batches",
    "iter_jsonl_lists",
    "open_input_file",
    "open_parquet",
    "plan_offsets",
    "resolve_filesystem",
    "shard_format",
    "token_value_type",
]

logger = logging.getLogger(__name__)

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

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_GLOB_MAGIC = re.compile(r"[*?\[]")
_FIRST_FOOTER_SAFE_ARROW_MAJOR = 6
"""Arrow >= 6 (PARQUET-2067) counts null and empty lists in a list leaf's null_count."""


# ---------------------------------------------------------------------------------------------
# Filesystems and discovery


def resolve_filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding ``path`` and the path inside it.

    URIs (``s3://bucket/key``, ``file:///abs``, ...) go through ``FileSystem.from_uri``, once
    per root ``scheme://netloc?query`` (cached); schemes pyarrow does not know go through
    fsspec. Anything else is a local path, made absolute.
    """
    if not _URI_RE.match(path):
        return pafs.LocalFileSystem(), pathlib.Path(path).absolute().as_posix()
    try:
        split = urllib.parse.urlsplit(path)
        fs, root_path = _filesystem_for(f"{split.scheme}://{split.netloc}/" + (f"?{split.query}" if split.query else ""))
    except (pa.ArrowException, OSError, ValueError, ImportError) as e:
        raise InputError(
            f"cannot open a filesystem for {path!r}: {_msg(e)}; give a local path or a URI such as "
            "s3://bucket/key (check the bucket name, region and credentials)"
        ) from e
    if root_path is None:  # fsspec
        return fs, fs.handler.fs._strip_protocol(path.split("?", 1)[0])
    rel = urllib.parse.unquote(split.path).strip("/")
    if not rel or not root_path:
        return fs, rel or root_path
    return fs, f"{root_path.rstrip('/')}/{rel}"


@functools.lru_cache(maxsize=256)
def _filesystem_for(root: str) -> tuple[pafs.FileSystem, str | None]:
    """The filesystem of URI root ``root`` and the root's path in it (None when from fsspec)."""
    try:
        return pafs.FileSystem.from_uri(root)
    except pa.ArrowInvalid as e:
        if "Unrecognized filesystem type" not in str(e):
            raise
    import fsspec

    fs, _ = fsspec.core.url_to_fs(root)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), None


def clear_filesystem_cache() -> None:
    """Forget the cached filesystems (after changing credentials or endpoints in this process)."""
    _filesystem_for.cache_clear()


def bucket_of(fs: pafs.FileSystem, fs_path: str) -> str | None:
    """The bucket ``fs_path`` lies in when ``fs`` is S3 or GCS (paths ``bucket/key``), else None."""
    return fs_path.split("/", 1)[0] if fs.type_name in ("s3", "gcs") else None


def check_bucket(fs: pafs.FileSystem, fs_path: str, what: str) -> None:
    """Raise InputError naming the bucket when ``fs`` is an object store lacking ``fs_path``'s bucket.

    ``what`` names the path for the message, e.g. "input s3://bucket/data".
    """
    bucket = bucket_of(fs, fs_path)
    if bucket is not None and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        raise InputError(
            f"bucket {bucket!r} does not exist ({what}); check the bucket name and the endpoint "
            "(AWS_ENDPOINT_URL) the credentials point at"
        )


def shard_format(path: str) -> str | None:
    """The shard format ("parquet", "jsonl" or "arrow") named by ``path``'s suffix, else None."""
    suffix = _shard_suffix(path)
    return SHARD_SUFFIXES[suffix] if suffix else None


def discover_shards(inputs: Sequence[str] | str) -> list[str]:
    """Shard paths, in a fixed order, for files, directories and globs.

    Order: the order of ``inputs``, each input expanded in sorted path order; a path seen
    before is dropped (the first occurrence keeps its place). A directory expands to every
    shard file under it (recursive); a glob (``*``, ``?``, ``[...]``, and ``**`` for any
    number of directories) must match the whole path, one path component per pattern
    component. Expansion keeps only known shard suffixes and skips names starting with
    ``_`` or ``.`` (``_SUCCESS``, ``.tmp/``) at any level below the directory or glob root.
    A single string is taken as one input.
    """
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs:
        raise InputError("no inputs given; list shard files, directories or globs to pack")
    seen: dict[str, None] = {}
    for item in inputs:
        for path in _expand_input(item):
            seen.setdefault(path, None)
    return list(seen)


def _expand_input(item: str) -> list[str]:
    if not isinstance(item, str) or not item:
        raise InputError(f"input {item!r} must be a non-empty path string")
    if _GLOB_MAGIC.search(item):
        return _expand_glob(item)
    fs, fs_path = resolve_filesystem(item)
    return _expand_path(item, fs, fs_path)


def _expand_path(item: str, fs: pafs.FileSystem, fs_path: str) -> list[str]:
    info = fs.get_file_info(fs_path)
    if info.type == pafs.FileType.NotFound:
        check_bucket(fs, fs_path, f"input {item}")
        raise InputError(f"input path not found: {item}; check the path (globs may use * ? [...])")
    if info.type == pafs.FileType.File:
        if shard_format(fs_path) is None:
            raise InputError(
                f"input file {item} has an unknown shard suffix; accepted: {_accepted_suffixes()}"
            )
        return [_to_user_path(item, fs_path, fs_path)]
    paths = sorted(_list_shard_files(fs, fs_path, recursive=True))
    if not paths:
        raise InputError(
            f"input directory {item} holds no shard files (accepted suffixes: "
            f"{_accepted_suffixes()}; names starting with '_' or '.' are skipped)"
        )
    return [_to_user_path(item, fs_path, p) for p in paths]


def _expand_glob(item: str) -> list[str]:
    trimmed = item.rstrip("/")
    parts = trimmed.split("/")
    first_magic = next(i for i, part in enumerate(parts) if _GLOB_MAGIC.search(part))
    base = "/".join(parts[:first_magic]) or ("/" if trimmed.startswith("/") else ".")
    if _URI_RE.match(item) and first_magic < 3:
        raise InputError(f"glob {item} must not put wildcards in the URI's bucket or host")
    pattern_parts = parts[first_magic:]
    fs, base_fs_path = resolve_filesystem(base)
    if fs.get_file_info(base_fs_path).type != pafs.FileType.Directory:
        check_bucket(fs, base_fs_path, f"input {item}")
        raise InputError(f"glob {item} matched nothing: its base directory {base} does not exist")
    recursive = len(pattern_parts) > 1 or "**" in pattern_parts
    candidates = _list_shard_files(fs, base_fs_path, recursive=recursive)
    matches = sorted(
        p for p in candidates if _match_parts(pattern_parts, _relative_parts(base_fs_path, p))
    )
    if not matches:
        raise InputError(
            f"glob {item} matched no shard files (accepted suffixes: {_accepted_suffixes()}; "
            "names starting with '_' or '.' are skipped); check the pattern"
        )
    return [_to_user_path(base, base_fs_path, p) for p in matches]


def _list_shard_files(fs: pafs.FileSystem, root: str, *, recursive: bool) -> Iterator[str]:
    """Files under ``root`` with a shard suffix and no hidden component below ``root``."""
    selector = pafs.FileSelector(root, recursive=recursive, allow_not_found=True)
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or shard_format(info.path) is None:
            continue
        if any(part.startswith(("_", ".")) for part in _relative_parts(root, info.path)):
            continue
        yield info.path


def _relative_parts(root: str, path: str) -> list[str]:
    root = root.rstrip("/")
    rel = path[len(root) :] if path.startswith(root) else path
    return [part for part in rel.split("/") if part]


def _match_parts(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Component-wise fnmatch; a ``**`` component matches zero or more components."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _match_parts(rest, parts[1:])


def _to_user_path(item: str, item_fs_path: str, fs_path: str) -> str:
    """``fs_path`` written the way the input was: a local path, or a URI like ``item``."""
    if not _URI_RE.match(item):
        return fs_path
    item = item.rstrip("/")
    at = item.rfind(item_fs_path.rstrip("/")) if item_fs_path.strip("/") else -1
    if at < 0:
        return item[: item.index("://") + 3] + fs_path
    return item[:at] + fs_path + item[at + len(item_fs_path.rstrip("/")) :]


def _shard_suffix(path: str) -> str | None:
    name = path.rsplit("/", 1)[-1].lower()
    matches = [s for s in SHARD_SUFFIXES if name.endswith(s) and len(name) > len(s)]
    return max(matches, key=len) if matches else None


def _accepted_suffixes() -> str:
    return ", ".join(SHARD_SUFFIXES)


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
        raise InputError(f"shard {path} has an unknown suffix; accepted: {_accepted_suffixes()}")
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
            f"shard {path} is not a readable Parquet file ({_msg(e)}); re-write or remove it"
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
        logger.info("shard %s: no usable Parquet token statistics; counted by scanning", path)
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
            f"shard {path}: cannot read row group {group} ({_msg(e)}); re-write the file"
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
                f"shard {path}: cannot read Arrow record batch {i} ({_msg(e)}); re-write the file"
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
                f"shard {path} is not a readable Arrow IPC file or stream ({_msg(file_error)}; "
                f"{_msg(e)}); re-write it with pyarrow.ipc.new_file"
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
                f"shard {path}: cannot parse JSON Lines after document {num_yielded} ({_msg(e)}); each "
                f"line must be one object whose {column!r} is a list of integers (int64), and no "
                f"line may exceed {MAX_JSON_BLOCK_SIZE} bytes"
            ) from e
        except OSError as e:
            raise InputError(f"shard {path}: cannot read ({_msg(e)}); check the file") from e


def _jsonl_blocks(
    fs: pafs.FileSystem, fs_path: str, column: str, block_size: int, *, skip: int
) -> Iterator[pa.ListArray]:
    schema = pa.schema([(column, pa.list_(pa.int64()))])
    parse_options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read_options = pajson.ReadOptions(block_size=block_size)
    with fs.open_input_stream(fs_path, compression=_compression(fs_path)) as stream:
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
        with fs.open_input_stream(fs_path, compression=_compression(fs_path)) as stream:
            read_options = pajson.ReadOptions(block_size=JSON_BLOCK_SIZE)
            return list(pajson.open_json(stream, read_options=read_options).schema.names)
    except (pa.ArrowException, OSError):
        return []


def _compression(fs_path: str) -> str | None:
    suffix = _shard_suffix(fs_path) or ""
    return next((c for ext, c in _COMPRESSION_BY_SUFFIX.items() if suffix.endswith(ext)), None)


def open_input_file(fs: pafs.FileSystem, fs_path: str, path: str) -> pa.NativeFile:
    """``fs.open_input_file``; a missing or unreadable file raises InputError naming ``path``."""
    try:
        return fs.open_input_file(fs_path)
    except FileNotFoundError as e:
        raise InputError(f"input path not found: {path}; was it moved after discovery?") from e
    except PermissionError as e:
        raise InputError(f"shard {path} is not readable ({_msg(e)}); check its permissions") from e


def _msg(error: BaseException) -> str:
    """pyarrow's message on one line."""
    return " ".join(str(error).split())


# ---------------------------------------------------------------------------------------------
# Offsets and the common token type


class ShardPlan(NamedTuple):
    """Global offsets of shards in discovery order.

    doc_offsets:   (n + 1,) int64; shard k holds global doc ids [doc_offsets[k], doc_offsets[k+1]).
    token_offsets: (n + 1,) int64; shard k's tokens sit at stream positions
                   [token_offsets[k], token_offsets[k+1]).
    """

    doc_offsets: npt.NDArray[np.int64]
    token_offsets: npt.NDArray[np.int64]

    @property
    def num_docs(self) -> int:
        return int(self.doc_offsets[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.token_offsets[-1])


def plan_offsets(infos: Sequence[ShardInfo]) -> ShardPlan:
    """Exclusive cumulative sums of the shards' document and token counts, starting at 0."""
    num_docs = np.array([info.num_docs for info in infos], dtype=np.int64)
    num_tokens = np.array([info.num_tokens for info in infos], dtype=np.int64)
    if (num_docs < 0).any() or (num_tokens < 0).any():
        raise ValueError("shard counts must be >= 0")
    return ShardPlan(_exclusive_cumsum(num_docs), _exclusive_cumsum(num_tokens))


def _exclusive_cumsum(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


_INTEGER_BITS = {f"{sign}int{bits}": bits for sign in ("", "u") for bits in (8, 16, 32, 64)}


def common_token_type(infos: Sequence[ShardInfo]) -> str:
    """The narrowest integer type every shard's token type converts to without loss.

    All signed: the widest; all unsigned: the widest; mixed: a signed type wide enough for
    both (uint16 + int32 -> int32, uint32 + int32 -> int64). uint64 mixed with a signed type
    has no such type and raises InputError naming a shard of each.
    """
    if not infos:
        raise InputError("no shards to take a token type from; check the inputs")
    for info in infos:
        if info.token_type not in _INTEGER_BITS:
            raise ValueError(f"shard {info.path} token_type={info.token_type!r} is not an integer type")
    signed = [i for i in infos if not i.token_type.startswith("u")]
    unsigned = [i for i in infos if i.token_type.startswith("u")]
    widest_signed = max(signed, key=lambda i: _INTEGER_BITS[i.token_type], default=None)
    widest_unsigned = max(unsigned, key=lambda i: _INTEGER_BITS[i.token_type], default=None)
    if widest_unsigned is None:
        return widest_signed.token_type
    if widest_signed is None:
        return widest_unsigned.token_type
    bits = max(_INTEGER_BITS[widest_signed.token_type], 2 * _INTEGER_BITS[widest_unsigned.token_type])
    if bits > 64:
        raise InputError(
            f"no integer type can hold both {widest_unsigned.token_type} (shard "
            f"{widest_unsigned.path}) and {widest_signed.token_type} (shard {widest_signed.path}) "
            "safely; re-write the shards with one token type (int64 holds ids < 2**63)"
        )
    return f"int{bits}"
