"""Reading packed output back: ``read_packed(path)`` gives a lazy :class:`PackedDataset`.

See docs/FORMAT.md. Nothing is read before it is needed:
  1. ``read_packed`` reads and checks ``manifest.json`` only (a directory without one is an
     unfinished job and is refused). The manifest is untrusted input: raypack.packed.manifest checks
     every field and that each listed file is a plain content-addressed chunk file name.
  2. A chunk file is opened the first time one of its chunks is asked for, only as a plain
     file directly inside the directory (no symlink, FIFO or subdirectory) whose size equals
     the manifest's ``num_bytes`` (:func:`raypack.packed.manifest.open_chunk_file`: one stat, no
     hashing; ``raypack verify`` hashes): memory-mapped when local, through ``pyarrow.fs``
     otherwise. Opening reads the footer and the record batch headers, checks the schema and
     that the file holds the manifest's ``num_chunks`` rows. A file that is gone (the output
     was replaced by ``--overwrite``) is a one-line InputError, never another output's bytes:
     names are content-addressed. Files already open stay readable (their mapping outlives
     the unlink).
  3. A lookup decodes only the record batch holding the chunk, once (decoded batches are
     kept; they hold views of the file and a small offsets array). Tokens of chunks from one
     record batch are returned as read-only zero-copy views of the file; dense ``doc_ids``
     are ``np.repeat(segment_doc_ids, segment_lengths)``.
  4. At most ``MAX_OPEN_FILES`` files stay open; the least recently used is closed (views
     already returned stay valid) and reopened when needed again.

Cost of ``ds[i]``: two binary searches, the first time its record batch is touched one
decode (O(chunks + segments) of that batch, no token copy), and one (C,) ``np.repeat``.

Attention masks are never stored. ``iter_batches(with_mask=True)`` and ``mask(i)`` build them
at read time with :func:`raypack.rules.masks.build_intra_document_mask` and follow the convention
written in that module. Ray is not imported here: :meth:`PackedDataset.to_ray_dataset` calls
:func:`raypack.engine.pipeline.packed_to_ray_dataset`, the engine's adapter.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.io.fs import error_text
from raypack.packed.manifest import (
    MIX_KIND,
    Manifest,
    load_manifest,
    open_chunk_file,
    read_manifest_json,
    resolve_output,
    side_columns_of,
)
from raypack.packed.writer import side_arrow_type, slice_chunks
from raypack.rules.core import Chunks, concat_chunks
from raypack.rules.side_columns import SideColumn

if TYPE_CHECKING:
    from raypack.mix.dataset import MixedDataset

__all__ = ["PackedDataset", "chunks_table", "iter_file_tables", "list_column", "load_manifest", "read_packed"]

_COLUMNS = ("chunk_index", "input_ids", "segment_doc_ids", "segment_lengths")
_DAMAGED = "the output is damaged; rerun the job"
MAX_OPEN_FILES = 64
"""Chunk files a PackedDataset keeps open at once; the least recently used is closed first."""


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


def list_column(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets from 0, values)`` of a list column, read through its offsets (slice-safe)."""
    offsets = column.offsets.to_numpy(zero_copy_only=True).astype(np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    values = column.values.slice(start, stop - start).to_numpy(zero_copy_only=True)
    return offsets - start, values


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
    return flat.to_numpy(zero_copy_only=not pa.types.is_boolean(flat.type)).reshape(n, context_length)


def _decode(batch: pa.RecordBatch, path: str, context_length: int, side_names: tuple[str, ...] = ()) -> Chunks:
    """A record batch as :class:`Chunks`; tokens (and side columns ``side_names``, in ``sides``)
    are zero-copy views of the batch."""
    input_ids = _fixed_rows(batch, "input_ids", path, context_length)
    offsets, seg_ids = list_column(batch.column("segment_doc_ids"))
    len_offsets, seg_lens = list_column(batch.column("segment_lengths"))
    if not np.array_equal(offsets, len_offsets) or np.any(_row_sums(offsets, seg_lens) != context_length):
        raise InputError(
            f"{path}: segment_doc_ids/segment_lengths do not describe chunks of {context_length} "
            f"positions; {_DAMAGED}"
        )
    sides = tuple(_fixed_rows(batch, name, path, context_length) for name in side_names)
    return Chunks(input_ids, offsets, seg_ids, seg_lens, sides)


class _ChunkFile:
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
            raise InputError(f"{self.path}: a record batch is unreadable ({error_text(e, 300)}); {_DAMAGED}") from e
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
            raise InputError(f"{self.path}: record batch {k} is unreadable ({error_text(e, 300)}); {_DAMAGED}") from e

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


# ----------------------------------------------------------------------------- dataset


class BatchReads:
    """``iter_batches`` and ``mask`` from ``__len__``, ``__getitem__`` and ``get_batch`` (a packed
    output's :class:`PackedDataset`, a mix's ``raypack.mix.dataset.MixedDataset``)."""

    def iter_batches(
        self, batch_size: int, with_mask: bool = False, mask_dtype: npt.DTypeLike = np.float32
    ) -> Iterator[dict[str, np.ndarray]]:
        """Batches of ``batch_size`` items in order (the last may be shorter).

        Each is a ``get_batch`` dict; ``with_mask`` adds ``"attention_mask"``, (n, C, C)
        of ``mask_dtype``, built from ``doc_ids`` by ``build_intra_document_mask``.
        """
        batch_size = operator.index(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        build_mask = _mask_builder() if with_mask else None
        return self._iter_batches(batch_size, build_mask, mask_dtype)

    def _iter_batches(self, batch_size: int, build_mask, mask_dtype) -> Iterator[dict[str, np.ndarray]]:
        for start in range(0, len(self), batch_size):
            batch = self.get_batch(start, min(start + batch_size, len(self)))
            if build_mask is not None:
                batch["attention_mask"] = build_mask(batch["doc_ids"], dtype=mask_dtype)
            yield batch

    def mask(self, index: int, dtype: npt.DTypeLike = np.float32) -> np.ndarray:
        """The (C, C) additive attention mask of item ``index`` (see raypack.rules.masks)."""
        return _mask_builder()(self[index]["doc_ids"], dtype=dtype)


class PackedDataset(BatchReads):
    """Packed chunks of one output directory, in global order, read lazily.

    ``ds[i]`` -> ``{"input_ids": (C,) token dtype, "doc_ids": (C,) int64}``, negative ``i``
    counting from the end; ``doc_ids`` holds global document ids, -1 on padding. An output with
    side columns (:attr:`extra_columns`) adds one (C,) array of its type per column, by name
    (batches: (n, C)); on padding it holds the column's fill. Arrays that
    come from one record batch are read-only views of the file: copy them to write. They
    stay valid after :meth:`close`, which only releases file handles.
    """

    def __init__(self, path: str, manifest: dict[str, Any], filesystem: pafs.FileSystem, base: str) -> None:
        self.path = path
        self.manifest = manifest
        self.context_length = int(manifest["context_length"])
        self.pad_token = int(manifest["pad_token"])
        self.token_dtype = np.dtype(manifest["token_dtype"])
        self.extra_columns = side_columns_of(manifest)
        """Side columns (raypack.rules.side_columns): ``(name, type, fill)`` each, () without any."""
        self._num_chunks = int(manifest["counts"]["chunks"])
        self._filesystem, self._base = filesystem, base
        self._files = [_ChunkFile(filesystem, base, f, self.context_length, self.token_dtype, self.extra_columns)
                       for f in manifest["files"]]
        self._first_chunks = np.array([f.first_chunk for f in self._files], dtype=np.int64)
        self._open_files: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return self._num_chunks

    def __repr__(self) -> str:
        return (f"PackedDataset({self.path!r}, chunks={len(self)}, context_length={self.context_length}, "
                f"token_dtype={self.token_dtype.name}, files={len(self._files)})")

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        """Chunk ``index``: ``{"input_ids": (C,), "doc_ids": (C,) int64}``."""
        i = operator.index(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"chunk index {index} is out of range for {len(self)} chunks")
        (piece,) = self._pieces(i, i + 1)
        return {"input_ids": piece.input_ids[0], "doc_ids": piece.doc_ids()[0],
                **{c.name: side[0] for c, side in zip(self.extra_columns, piece.sides)}}

    def get_batch(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Chunks ``[start, stop)``: ``{"input_ids": (n, C), "doc_ids": (n, C) int64}``; may span files."""
        start, stop = operator.index(start), operator.index(stop)
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"get_batch({start}, {stop}) is out of range; need 0 <= start <= stop <= {len(self)}")
        chunks = concat_chunks(list(self._pieces(start, stop)), self.context_length, self.token_dtype)
        if not chunks.num_chunks:  # no piece: no side arrays either
            chunks = chunks._replace(sides=tuple(np.zeros((0, self.context_length), c.type)
                                                 for c in self.extra_columns))
        return {"input_ids": chunks.input_ids, "doc_ids": chunks.doc_ids(),
                **{c.name: side for c, side in zip(self.extra_columns, chunks.sides)}}

    def record_batches(self) -> Iterator[tuple[str, Chunks]]:
        """``(file path, Chunks)`` per record batch in global order, each decoded and checked as by
        a lookup but not kept (memory: one record batch); each file is closed after its last batch."""
        for file in self._files:
            try:
                for chunks in file.record_batches():
                    yield file.path, chunks
            finally:
                file.close()

    def close(self) -> None:
        """Close every open chunk file; reading again reopens them."""
        for file in self._files:
            file.close()
        self._open_files.clear()

    def __enter__(self) -> PackedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _file(self, f: int) -> _ChunkFile:
        """File ``f``, keeping at most MAX_OPEN_FILES open (least recently used closed first)."""
        self._open_files[f] = None
        self._open_files.move_to_end(f)
        while len(self._open_files) > MAX_OPEN_FILES:
            self._files[self._open_files.popitem(last=False)[0]].close()
        return self._files[f]

    def pieces(self, start: int, stop: int) -> Iterator[Chunks]:
        """Global chunks ``[start, stop)`` as :class:`Chunks` views, one per (file, record batch)
        touched, in order (tokens not copied; the doc ids stay as segments)."""
        start, stop = operator.index(start), operator.index(stop)
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"pieces({start}, {stop}) is out of range; need 0 <= start <= stop <= {len(self)}")
        return self._pieces(start, stop)

    def _pieces(self, start: int, stop: int) -> Iterator[Chunks]:
        """Global chunks ``[start, stop)`` as views, one per (file, record batch) touched."""
        f = int(np.searchsorted(self._first_chunks, start, side="right")) - 1
        while start < stop:
            file = self._file(f)
            end = min(stop, file.first_chunk + file.num_chunks)
            yield from file.pieces(start - file.first_chunk, end - file.first_chunk)
            start, f = end, f + 1

    def to_ray_dataset(self, batch_rows: int | None = None):
        """A ``ray.data.Dataset`` of the chunks in global order, one row per chunk.

        Ray stays in the engine: this calls :func:`raypack.engine.pipeline.packed_to_ray_dataset`
        (imported here, on first use), which documents the columns, blocks and order.
        """
        from raypack.engine.pipeline import packed_to_ray_dataset

        return packed_to_ray_dataset(self, batch_rows)

    def file_items(self) -> list[dict[str, Any]]:
        """The chunk files holding chunks, in order: ``{"path", "first_chunk", "num_chunks", "num_bytes"}``.

        The rows :func:`iter_file_tables` takes, with ``filesystem`` and ``base``; no file is opened.
        """
        return [{"path": f.name, "first_chunk": f.first_chunk, "num_chunks": f.num_chunks, "num_bytes": f.num_bytes}
                for f in self._files if f.num_chunks]

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The filesystem holding the output directory."""
        return self._filesystem

    @property
    def base(self) -> str:
        """The output directory's path inside :attr:`filesystem`."""
        return self._base


def _mask_builder():
    from raypack.rules.masks import build_intra_document_mask

    return build_intra_document_mask


def chunks_table(chunks: Chunks, side_names: tuple[str, ...] = ()) -> pa.Table:
    """``input_ids``, dense ``doc_ids`` and the side columns ``side_names`` (``chunks.sides``) as
    fixed_size_list columns (tokens not copied)."""
    c = chunks.input_ids.shape[1]
    return pa.table({
        "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(chunks.input_ids.reshape(-1)), c),
        "doc_ids": pa.FixedSizeListArray.from_arrays(pa.array(chunks.doc_ids().reshape(-1)), c),
        **{name: pa.FixedSizeListArray.from_arrays(pa.array(side.reshape(-1)), c)
           for name, side in zip(side_names, chunks.sides)},
    })


def iter_file_tables(item: dict[str, Any], *, filesystem: pafs.FileSystem, base: str, context_length: int,
                     token_dtype: str, batch_rows: int | None,
                     extra_columns: tuple[tuple[str, str, int], ...] = ()) -> Iterator[pa.Table]:
    """:func:`chunks_table` per record batch (or per ``batch_rows`` chunks) of the chunk file
    ``item`` (a :meth:`PackedDataset.file_items` row), in order; the file is closed at the end."""
    columns = tuple(SideColumn(*c) for c in extra_columns)
    file = _ChunkFile(filesystem, base, item, context_length, np.dtype(token_dtype), columns)
    try:
        for chunks in file.blocks(batch_rows):
            yield chunks_table(chunks, tuple(c.name for c in columns))
    finally:
        file.close()


def read_packed(path: str) -> PackedDataset | MixedDataset:
    """Open the packed output directory ``path`` (local path or URI) for reading; a mix
    (``raypack mix``) opens as a :class:`raypack.mix.dataset.MixedDataset`, read the same way.

    Reads and checks the manifest only (:func:`raypack.packed.manifest.check_manifest`: every field's
    type and range, file names that are plain content-addressed chunk file names, files that tile
    the chunks); chunk files open on first use, each through
    :func:`raypack.packed.manifest.open_chunk_file` (a plain file directly inside the directory, its
    size equal to the manifest's ``num_bytes``: one stat, no hashing). Hashes, structure and
    inputs are checked only by ``raypack verify``. Raises InputError for a directory without a
    manifest (unfinished job) and for a manifest that fails those checks.
    """
    data, where = read_manifest_json(path)
    if isinstance(data, dict) and data.get("kind") == MIX_KIND:
        from raypack.mix.dataset import open_mix

        return open_mix(path, data, where)
    manifest = Manifest.from_dict(data, where)
    filesystem, base = resolve_output(path)
    return PackedDataset(path, manifest, filesystem, base)
