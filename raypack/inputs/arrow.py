"""Arrow IPC shards (file or stream format) of token lists. pyarrow only, no Ray.

Counts are one subtraction of list offsets per record batch. Units are the record batches of an
IPC file (random access); a stream has no index and is read whole, in order. Local files are
memory-mapped, so a record batch costs only the pages that are touched: a document over
``max_document_tokens`` is refused from its batch's list offsets before its values are touched
(raypack.inputs.reading checks the offsets of every batch first).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as paipc

from raypack.errors import InputChanged, InputError
from raypack.inputs.base import InputFormat, ReadLimits, ShardInfo, check_named_once, token_value_type
from raypack.io.fs import error_text, open_input_file, resolve_filesystem
from raypack.rules.side_columns import side_value_types

__all__ = ["ArrowFormat", "iter_ipc_batches"]


class ArrowFormat(InputFormat):
    name = "arrow"
    title = "Arrow IPC"
    suffixes = (".arrow", ".ipc", ".feather")
    has_units = True

    def schema(self, path: str) -> pa.Schema:
        fs, fs_path = resolve_filesystem(path)
        items = iter_ipc_batches(fs, fs_path, path)
        try:
            return next(items)[0]
        finally:
            items.close()

    def inspect(self, path: str, column: str, limits: ReadLimits) -> ShardInfo:
        fs, fs_path = resolve_filesystem(path)
        unit_docs, unit_tokens = [], []
        value_type = None
        for schema, batch in iter_ipc_batches(fs, fs_path, path):
            if value_type is None:
                value_type = token_value_type(schema, column, path)
            if batch is None:
                continue
            lists = _checked(batch.column(schema.get_field_index(column)), path, column, len(unit_docs))
            unit_docs.append(len(lists))
            offsets = lists.offsets
            unit_tokens.append(offsets[len(offsets) - 1].as_py() - offsets[0].as_py() if len(lists) else 0)
        info = ShardInfo(path, self.name, sum(unit_docs), sum(unit_tokens), str(value_type), "ipc-offsets")
        if not _is_ipc_file(fs, fs_path):
            return info  # a stream has no record batch index: read whole
        return replace(info, unit_docs=tuple(unit_docs), unit_tokens=tuple(unit_tokens))

    def read_columns(self, path: str, columns: tuple[str, ...], units: tuple[int, int] | None,
                     limits: ReadLimits) -> Iterator[tuple[pa.Array, ...]]:
        fs, fs_path = resolve_filesystem(path)
        first = units[0] if units is not None else 0
        for k, (schema, batch) in enumerate(iter_ipc_batches(fs, fs_path, path, units)):
            if batch is None:
                check_named_once(schema, columns, path)
                token_value_type(schema, columns[0], path)
                side_value_types(schema, columns[1:], path)
                continue
            yield tuple(_checked(batch.column(schema.get_field_index(c)), path, c, first + k - 1) for c in columns)

    def side_types(self, path: str, names: tuple[str, ...]) -> tuple[str, ...]:
        fs, fs_path = resolve_filesystem(path)
        for schema, _ in iter_ipc_batches(fs, fs_path, path):
            check_named_once(schema, names, path)
            return side_value_types(schema, names, path)
        raise InputError(f"shard {path}: no Arrow schema; re-write it with pyarrow.ipc.new_file")

    def write(self, path: str, table: pa.Table, rows_per_unit: int | None = None) -> None:
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=rows_per_unit)


def _checked(lists: pa.Array, path: str, column: str, batch: int) -> pa.Array:
    """``lists`` (a column of integer lists, read zero-copy from the file) once its offsets hold: each
    non-negative, none before the one before it, none past the values. Arrow's reader checks only the
    buffers' sizes, so offsets past the values crashed the run (a traceback, exit 1, its work kept), and
    decreasing ones were packed as other documents, which verify then passed (a hostile trial). Cost:
    O(rows), about a millisecond for 2M rows (integer values need no check)."""
    try:
        lists.validate(full=True)
    except pa.ArrowInvalid as e:
        raise InputError(f"shard {path}: record batch {batch}, column {column!r}: its list offsets are not those "
                         f"of a list array ({error_text(e)}); the file is damaged or hostile: re-write it") from e
    return lists


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
                raise InputChanged(f"shard {path} is no longer an Arrow IPC file ({error_text(file_error)}); "
                                 "the file changed during the run (rerun on a stable copy)") from file_error
            yield from _iter_ipc_stream(fs, fs_path, path, file_error)
            return
        yield from _ipc_file_batches(reader, path, units)


def _ipc_file_batches(reader: paipc.RecordBatchFileReader, path: str, units: tuple[int, int] | None):
    yield reader.schema, None
    start, end = units if units is not None else (0, reader.num_record_batches)
    if end > reader.num_record_batches:
        raise InputChanged(f"shard {path} has {reader.num_record_batches} record batches, the plan reads "
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
