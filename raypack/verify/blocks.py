"""Decoding a chunk file into blocks, and the two kinds of data that flow through verify.

A :class:`Block` is up to ``batch_chunks`` consecutive rows of one chunk file, decoded into numpy
(views of the file where possible) after the file's schema (columns, types, metadata), its record
batches (``validate(full=True)``) and its row count were checked. A :class:`Piece` is a stretch of
a token stream with its dense doc ids; a structure check turns blocks into the output's pieces, the
inputs are read as pieces, and the two streams are compared (:mod:`raypack.verify.inputs`).
Where segments lie in their chunks: :func:`row_of_segment` and :func:`segment_start` for one
segment (used to name it in a message), :func:`segment_places` for all of them at once.
Memory: one file's record batches are opened (not read) at a time; a block is ``n * C`` tokens.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.packed.manifest import side_columns_of
from raypack.packed.writer import CHUNK_FILE_VERSION, side_arrow_type
from raypack.rules.arrays import numpy_values
from raypack.rules.side_columns import SideColumn, combine, record_dtype
from raypack.verify.files import open_file
from raypack.verify.report import VerifyError

__all__ = ["Block", "Piece", "SegmentPlaces", "iter_blocks", "list_column", "row_of_segment", "segment_places",
           "segment_start"]

_COLUMNS = ("chunk_index", "input_ids", "segment_doc_ids", "segment_lengths")


class Block(NamedTuple):
    """``n`` consecutive rows of one chunk file, decoded (views of the file where possible).

    chunk_indices: (n,) int64.  input_ids: (n, C) token dtype; with side columns, structured
    records (raypack.rules.side_columns.record_dtype) holding each token with its side values.
    segment_offsets: (n + 1,) int64 from 0.  segment_doc_ids: (S,) int64.  segment_lengths: (S,) int32.
    """

    path: str
    first_row: int
    chunk_indices: npt.NDArray[np.int64]
    input_ids: npt.NDArray[np.integer]
    segment_offsets: npt.NDArray[np.int64]
    segment_doc_ids: npt.NDArray[np.int64]
    segment_lengths: npt.NDArray[np.int32]


class Piece(NamedTuple):
    """A stretch of a token stream. tokens: (k,); doc_ids: (k,) int64 dense; ``where(i)`` names position i."""

    tokens: np.ndarray
    doc_ids: np.ndarray
    where: Callable[[int], str]


def iter_blocks(fs: pafs.FileSystem, base: str, entry: dict[str, Any], manifest: dict[str, Any],
                batch_chunks: int) -> Iterator[Block]:
    """Every row of one chunk file in ``batch_chunks``-row blocks, after schema and row-count checks."""
    path = posixpath.join(base, entry["path"])
    with open_file(fs, base, entry) as source:
        try:
            reader = pa.ipc.open_file(source)
        except (pa.ArrowException, OSError) as e:
            raise VerifyError(f"{path}: not an Arrow IPC file ({e})") from e
        _check_schema(reader.schema, path, manifest)
        batches = [_get_batch(reader, k, path) for k in range(reader.num_record_batches)]
        num_rows = sum(b.num_rows for b in batches)
        if num_rows != entry["num_chunks"]:
            raise VerifyError(f"{path}: holds {num_rows} chunks, the manifest says num_chunks={entry['num_chunks']}")
        first_row = 0
        for batch in batches:
            for start in range(0, batch.num_rows, batch_chunks):
                part = batch.slice(start, batch_chunks)
                yield _decode(part, path, first_row, manifest.context_length, side_columns_of(manifest),
                              manifest.token_dtype.name)
                first_row += part.num_rows


def _get_batch(reader: pa.ipc.RecordBatchFileReader, k: int, path: str) -> pa.RecordBatch:
    try:
        batch = reader.get_batch(k)
        batch.validate(full=True)
    except (pa.ArrowException, OSError) as e:
        raise VerifyError(f"{path}: record batch {k} is invalid ({e})") from e
    return batch


def _check_schema(schema: pa.Schema, path: str, manifest: dict[str, Any]) -> None:
    c, token_type = manifest.context_length, pa.from_numpy_dtype(manifest.token_dtype)
    sides = side_columns_of(manifest)
    expected = {
        "chunk_index": pa.int64(),
        "input_ids": pa.list_(token_type, c),
        "segment_doc_ids": pa.list_(pa.int64()),
        "segment_lengths": pa.list_(pa.int32()),
        **{side.name: pa.list_(side_arrow_type(side.type), c) for side in sides},
    }
    if len(schema.names) != len(expected):
        raise VerifyError(f"{path}: columns are {schema.names}, expected {list(expected)}")
    for name, typ in expected.items():
        if name not in schema.names:
            raise VerifyError(f"{path}: no column {name!r}; columns are {schema.names}")
        found = schema.field(name).type
        if not _same_type(found, typ):
            raise VerifyError(f"{path}: column {name} has type {found}, expected {typ}")
    metadata = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
    expected_metadata = (("format_version", CHUNK_FILE_VERSION, "chunk files have"),
                         ("context_length", c, "the manifest says"),
                         ("pad_token", manifest.pad_token, "the manifest says"),
                         *((("extra_columns", json.dumps([s._asdict() for s in sides]), "the manifest says"),)
                           if sides else ()))
    for key, value, source in expected_metadata:
        if metadata.get(f"raypack.{key}") != str(value):
            raise VerifyError(f"{path}: schema metadata raypack.{key}={metadata.get(f'raypack.{key}')!r}, "
                              f"{source} {value}")


def _same_type(found: pa.DataType, expected: pa.DataType) -> bool:
    """Equal types, ignoring the name of a list's item field."""
    if isinstance(expected, (pa.ListType, pa.FixedSizeListType)):
        return (type(found) is type(expected) and found.value_type == expected.value_type
                and getattr(found, "list_size", None) == getattr(expected, "list_size", None))
    return found == expected


def _decode(batch: pa.RecordBatch, path: str, first_row: int, c: int, sides: tuple[SideColumn, ...] = (),
            token_dtype: str = "int64") -> Block:
    for name in (*_COLUMNS, *(side.name for side in sides)):
        column = batch.column(name)
        nulls = column.null_count + (column.flatten().null_count if name != "chunk_index" else 0)
        if nulls:
            raise VerifyError(f"{path} rows {first_row}..{first_row + batch.num_rows - 1}: column {name} holds nulls")
    tokens = batch.column("input_ids")
    flat = tokens.values.slice(tokens.offset * c, batch.num_rows * c)
    id_offsets, seg_ids = list_column(batch.column("segment_doc_ids"))
    len_offsets, seg_lens = list_column(batch.column("segment_lengths"))
    if not np.array_equal(id_offsets, len_offsets):
        row = int(np.argmax(id_offsets != len_offsets)) - 1
        raise VerifyError(f"{path} row {first_row + row}: segment_doc_ids and segment_lengths have "
                          "different numbers of segments")
    input_ids = numpy_values(flat).reshape(batch.num_rows, c)
    if sides:
        values = [_fixed_values(batch.column(side.name), c, batch.num_rows) for side in sides]
        input_ids = combine(input_ids.reshape(-1), values, record_dtype(token_dtype, sides)).reshape(-1, c)
    return Block(path, first_row, numpy_values(batch.column("chunk_index")), input_ids, id_offsets, seg_ids, seg_lens)


def _fixed_values(column: pa.FixedSizeListArray, c: int, num_rows: int) -> np.ndarray:
    """The (num_rows * C,) values of a fixed_size_list column (bool: Arrow's bits unpacked)."""
    return numpy_values(column.values.slice(column.offset * c, num_rows * c))


def list_column(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets from 0, values)`` of a (possibly sliced) list column: offsets copied as int64, values a view."""
    offsets = numpy_values(column.offsets).astype(np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    return offsets - start, numpy_values(column.values.slice(start, stop - start))


def row_of_segment(block: Block, k: int) -> int:
    """The row (chunk of the block) holding segment ``k``."""
    return int(np.searchsorted(block.segment_offsets, k, side="right")) - 1


def segment_start(block: Block, k: int, row: int) -> int:
    """Position of segment ``k`` inside its chunk ``row``."""
    first = int(block.segment_offsets[row])
    return int(block.segment_lengths[first:k].sum())


class SegmentPlaces(NamedTuple):
    """Per segment of some consecutive chunks: its chunk row, global chunk, start inside the chunk."""

    rows: np.ndarray
    chunks: np.ndarray
    starts: np.ndarray
    is_first: np.ndarray
    is_last: np.ndarray


def segment_places(first_chunk: int, counts: np.ndarray, lengths: np.ndarray, c: int) -> SegmentPlaces:
    """Where each segment is, given segments per chunk (each chunk's lengths summing to ``c``)."""
    rows = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    starts = np.cumsum(lengths, dtype=np.int64) - lengths - rows * c
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    is_first = np.zeros(lengths.size, dtype=bool)
    is_last = np.zeros(lengths.size, dtype=bool)
    is_first[offsets[:-1][counts > 0]] = True
    is_last[offsets[1:][counts > 0] - 1] = True
    return SegmentPlaces(rows, rows + first_chunk, starts, is_first, is_last)
