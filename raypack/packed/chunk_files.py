"""One chunk file of a packed output, opened and decoded lazily (steps 2 and 3 of :mod:`raypack.packed.reader`).

:class:`ChunkFile` opens a file only through :func:`raypack.packed.manifest.open_chunk_file`,
checks its schema and row count, and decodes one record batch at a time into
:class:`raypack.rules.core.Chunks` (zero-copy views of the file). :func:`iter_file_tables` is what
a Ray read task runs on one file (raypack.engine.pipeline).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.io.fs import error_text
from raypack.io.untrusted import DAMAGED
from raypack.packed.manifest import open_chunk_file
from raypack.packed.writer import side_arrow_type, slice_chunks
from raypack.rules.arrays import arrow_array, numpy_values
from raypack.rules.core import Chunks, concat_chunks
from raypack.rules.side_columns import SideColumn

__all__ = ["ChunkFile", "chunks_table", "iter_file_tables", "list_column"]

_COLUMNS = ("chunk_index", "input_ids", "segment_doc_ids", "segment_lengths")
_DAMAGED = "the output is damaged; rerun the job"


# ----------------------------------------------------------------------------- opening


def _open_ipc(filesystem: pafs.FileSystem, base: str, name: str,
              num_bytes: int) -> tuple[pa.NativeFile, pa.ipc.RecordBatchFileReader]:
    """Open chunk file ``name`` through :func:`raypack.packed.manifest.open_chunk_file` (a plain file
    directly inside ``base`` whose size is ``num_bytes``) and read its Arrow IPC footer."""
    source = open_chunk_file(filesystem, base, name, num_bytes)
    try:
        return source, pa.ipc.open_file(source)
    except (pa.ArrowException, OSError) as e:
        source.close()
        raise InputError(f"{base}/{name}: not an Arrow IPC file ({error_text(e, 300)}); {_DAMAGED}") from e


# ----------------------------------------------------------------------------- one file


def _same_type(found: pa.DataType, expected: pa.DataType) -> bool:
    """Equal types, ignoring the name of a list's item field."""
    if isinstance(expected, (pa.ListType, pa.FixedSizeListType)):
        return (type(found) is type(expected) and found.value_type == expected.value_type
                and getattr(found, "list_size", None) == getattr(expected, "list_size", None))
    return found == expected


def list_column(column: pa.ListArray, where: str = "a list column") -> tuple[np.ndarray, np.ndarray]:
    """``(offsets from 0, values)`` of a list column, read through its offsets (slice-safe).

    The offsets are checked against the values they index before any is used (a file whose
    offsets were edited would otherwise index past its values): non-decreasing, inside
    ``[0, len(values)]``; and the values they index hold no null. One vectorised pass over the (rows + 1,)
    offsets; InputError naming ``where``.
    """
    offsets = numpy_values(column.offsets).astype(np.int64)
    if offsets.size == 0 or offsets[0] < 0 or offsets[-1] > len(column.values) or np.any(np.diff(offsets) < 0):
        raise InputError(f"{where}: list offsets out of order or past the {len(column.values)} values they index; "
                         f"{_DAMAGED}")
    start, stop = int(offsets[0]), int(offsets[-1])
    values = column.values.slice(start, stop - start)
    if values.null_count:
        raise InputError(f"{where}: a list holds null values; {_DAMAGED}")
    return offsets - start, numpy_values(values)


def _row_sums(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per-row sums of a list column given as (offsets from 0, values)."""
    ends = np.zeros(values.size + 1, dtype=np.int64)
    np.cumsum(values, out=ends[1:])
    return np.diff(ends[offsets])


def _fixed_rows(batch: pa.RecordBatch, column: str, path: str, context_length: int) -> np.ndarray:
    """A fixed_size_list column as (n, C): a zero-copy view (bool: one copy, Arrow packs bits)."""
    values = batch.column(column)
    if values.null_count:
        raise InputError(f"{path}: {column} holds nulls; {_DAMAGED}")
    n = batch.num_rows
    flat = values.values.slice(values.offset * context_length, n * context_length)
    if flat.null_count:
        raise InputError(f"{path}: {column} holds null values; {_DAMAGED}")
    return numpy_values(flat).reshape(n, context_length)


def _decode(batch: pa.RecordBatch, path: str, context_length: int, side_names: tuple[str, ...] = ()) -> Chunks:
    """A record batch as :class:`Chunks`; tokens (and side columns ``side_names``, in ``sides``)
    are zero-copy views of the batch."""
    input_ids = _fixed_rows(batch, "input_ids", path, context_length)
    offsets, seg_ids = list_column(batch.column("segment_doc_ids"), f"{path}: segment_doc_ids")
    len_offsets, seg_lens = list_column(batch.column("segment_lengths"), f"{path}: segment_lengths")
    if not np.array_equal(offsets, len_offsets) or np.any(_row_sums(offsets, seg_lens) != context_length):
        raise InputError(
            f"{path}: segment_doc_ids/segment_lengths do not describe chunks of {context_length} "
            f"positions; {_DAMAGED}"
        )
    sides = tuple(_fixed_rows(batch, name, path, context_length) for name in side_names)
    return Chunks(input_ids, offsets, seg_ids, seg_lens, sides)


class ChunkFile:
    """One chunk file of the manifest, opened on first use.

    ``_batch_starts`` is the cumulative row index of its record batches, (num_batches + 1,)
    int64, so a lookup decodes one record batch, not the file. Decoded batches are kept:
    their tokens and segments are views of the file, only the (rows + 1,) offsets are new.
    """

    def __init__(self, filesystem: pafs.FileSystem, base: str, entry: dict[str, Any],
                 context_length: int, token_dtype: np.dtype, extra_columns: tuple[SideColumn, ...] = ()) -> None:
        """``entry``: the manifest's checked ``files[k]`` (name, first_chunk, num_chunks, num_bytes)."""
        self.filesystem = filesystem
        self.base = base
        self.name = entry["path"]
        self.path = f"{base}/{self.name}"
        self.first_chunk = int(entry["first_chunk"])
        self.num_chunks = int(entry["num_chunks"])
        self.num_bytes = int(entry["num_bytes"])
        self.context_length = context_length
        self.token_dtype = token_dtype
        self.extra_columns = tuple(extra_columns)
        self._source: pa.NativeFile | None = None
        self._reader: pa.ipc.RecordBatchFileReader | None = None
        self._batch_starts: np.ndarray | None = None
        self._decoded: dict[int, Chunks] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the open file (it reopens in the new process)."""
        return {**self.__dict__, "_source": None, "_reader": None, "_decoded": {}}

    @property
    def is_open(self) -> bool:
        return self._reader is not None

    def close(self) -> None:
        """Release the file handle; chunks already decoded stay valid, the rest reopen it."""
        if self._source is not None:
            self._source.close()
        self._source = self._reader = None

    def _open(self) -> pa.ipc.RecordBatchFileReader:
        if self._reader is None:
            source, reader = _open_ipc(self.filesystem, self.base, self.name, self.num_bytes)
            try:
                self._batch_starts = self._check_file(reader)
            except BaseException:
                source.close()
                raise
            self._source, self._reader = source, reader
        return self._reader

    def _check_file(self, reader: pa.ipc.RecordBatchFileReader) -> np.ndarray:
        """Schema as the manifest says and ``num_chunks`` rows; return the batch starts (num_batches + 1,)."""
        self._check_schema(reader.schema)
        try:
            rows = [reader.get_batch(k).num_rows for k in range(reader.num_record_batches)]
        except (pa.ArrowException, OSError) as e:
            raise self._unreadable("a record batch", e) from e
        starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        if starts[-1] != self.num_chunks:
            raise InputError(f"{self.path}: holds {starts[-1]} chunks but the manifest says num_chunks="
                             f"{self.num_chunks}; {_DAMAGED}")
        return starts

    def _check_schema(self, schema: pa.Schema) -> None:
        missing = [c for c in (*_COLUMNS, *(s.name for s in self.extra_columns)) if c not in schema.names]
        if missing:
            raise InputError(
                f"{self.path}: no column(s) {', '.join(missing)}; not a raypack chunk file (docs/FORMAT.md)"
            )
        expected_types = {
            "chunk_index": pa.int64(),
            "input_ids": pa.list_(pa.from_numpy_dtype(self.token_dtype), self.context_length),
            "segment_doc_ids": pa.list_(pa.int64()),
            "segment_lengths": pa.list_(pa.int32()),
            **{c.name: pa.list_(side_arrow_type(c.type), self.context_length) for c in self.extra_columns},
        }
        for column, expected in expected_types.items():
            found = schema.field(column).type
            if not _same_type(found, expected):
                raise InputError(f"{self.path}: {column} has type {found}, the manifest says {expected}; "
                                 f"{_DAMAGED}")

    def _batch(self, k: int) -> Chunks:
        chunks = self._decoded.get(k)
        if chunks is None:
            chunks = self._decode(k)
            self._decoded[k] = chunks
        return chunks

    def _decode(self, k: int) -> Chunks:
        try:
            return _decode(self._open().get_batch(k), self.path, self.context_length,
                           tuple(c.name for c in self.extra_columns))
        except (pa.ArrowException, OSError) as e:
            raise self._unreadable(f"record batch {k}", e) from e

    def _unreadable(self, what: str, error: BaseException) -> InputError:
        """The line for a read that failed: the file gone since it was opened (an object store reads it range by
        range, and an ``--overwrite`` deleted it: "the output is damaged" said otherwise, an operator's trial) or
        its bytes unreadable."""
        try:
            gone = isinstance(error, FileNotFoundError) or (
                self.filesystem.get_file_info(self.path).type == pafs.FileType.NotFound)
        except OSError:
            gone = False
        if gone:
            return InputError(f"{self.path}: listed in the manifest but missing since it was opened; {DAMAGED} (open "
                              "the output again)")
        return InputError(f"{self.path}: {what} is unreadable ({error_text(error, 300)}); {_DAMAGED}")

    def record_batches(self) -> Iterator[Chunks]:
        """Every record batch of the file in order, decoded and checked, without keeping them."""
        for k in range(self._starts().size - 1):
            yield self._decode(k)

    def _starts(self) -> np.ndarray:
        if self._batch_starts is None:
            self._open()
        return self._batch_starts

    def pieces(self, start: int, stop: int) -> Iterator[Chunks]:
        """Local chunks ``[start, stop)`` as one :class:`Chunks` view per record batch touched."""
        starts = self._starts()
        while start < stop:
            k = int(np.searchsorted(starts, start, side="right")) - 1
            end = min(stop, int(starts[k + 1]))
            yield slice_chunks(self._batch(k), start - int(starts[k]), end - int(starts[k]))
            start = end

    def blocks(self, rows: int | None) -> Iterator[Chunks]:
        """The whole file in order: one block per record batch, or blocks of ``rows`` chunks."""
        bounds = self._starts() if rows is None else np.r_[0:self.num_chunks:rows, self.num_chunks]
        for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            if stop > start:
                yield concat_chunks(list(self.pieces(start, stop)), self.context_length, self.token_dtype)


def chunks_table(chunks: Chunks, side_names: tuple[str, ...] = ()) -> pa.Table:
    """``input_ids``, dense ``doc_ids`` and the side columns ``side_names`` (``chunks.sides``) as
    fixed_size_list columns (tokens not copied)."""
    c = chunks.input_ids.shape[1]
    return pa.table({
        "input_ids": pa.FixedSizeListArray.from_arrays(arrow_array(chunks.input_ids.reshape(-1)), c),
        "doc_ids": pa.FixedSizeListArray.from_arrays(arrow_array(chunks.doc_ids().reshape(-1)), c),
        **{name: pa.FixedSizeListArray.from_arrays(arrow_array(side.reshape(-1)), c)
           for name, side in zip(side_names, chunks.sides)},
    })


def iter_file_tables(item: dict[str, Any], *, filesystem: pafs.FileSystem, base: str, context_length: int,
                     token_dtype: str, batch_rows: int | None,
                     extra_columns: tuple[tuple[str, str, int], ...] = ()) -> Iterator[pa.Table]:
    """:func:`chunks_table` per record batch (or per ``batch_rows`` chunks) of the chunk file
    ``item`` (a :meth:`PackedDataset.file_items` row), in order; the file is closed at the end."""
    columns = tuple(SideColumn(*c) for c in extra_columns)
    file = ChunkFile(filesystem, base, item, context_length, np.dtype(token_dtype), columns)
    try:
        for chunks in file.blocks(batch_rows):
            yield chunks_table(chunks, tuple(c.name for c in columns))
    finally:
        file.close()
