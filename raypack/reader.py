"""Reading packed output back: ``read_packed(path)`` gives a lazy :class:`PackedDataset`.

See docs/FORMAT.md. Nothing is read before it is needed:
  1. ``read_packed`` reads and checks ``manifest.json`` only (a directory without one is an
     unfinished job and is refused).
  2. A chunk file is opened the first time one of its chunks is asked for: memory-mapped when
     local, through ``pyarrow.fs`` otherwise. Opening reads the footer and the record batch
     headers, checks the schema and that the file holds the manifest's ``num_chunks`` rows.
  3. A lookup decodes only the record batch holding the chunk, once (decoded batches are
     kept; they hold views of the file and a small offsets array). Tokens of chunks from one
     record batch are returned as read-only zero-copy views of the file; dense ``doc_ids``
     are ``np.repeat(segment_doc_ids, segment_lengths)``.
  4. At most ``MAX_OPEN_FILES`` files stay open; the least recently used is closed (views
     already returned stay valid) and reopened when needed again.

Cost of ``ds[i]``: two binary searches, the first time its record batch is touched one
decode (O(chunks + segments) of that batch, no token copy), and one (C,) ``np.repeat``.

Attention masks are never stored. ``iter_batches(with_mask=True)`` and ``mask(i)`` build them
at read time with :func:`raypack.masks.build_intra_document_mask` and follow the convention
written in that module. Ray is imported only inside :meth:`PackedDataset.to_ray_dataset`.
"""

from __future__ import annotations

import json
import operator
import os
import posixpath
from collections import OrderedDict
from typing import Any, Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.core import Chunks, concat_chunks
from raypack.errors import InputError
from raypack.output import FORMAT_VERSION, MANIFEST_NAME, slice_chunks
from raypack.shards import check_bucket, resolve_filesystem

__all__ = ["PackedDataset", "load_manifest", "read_packed"]

_COLUMNS = ("chunk_index", "input_ids", "segment_doc_ids", "segment_lengths")
_MANIFEST_KEYS = ("context_length", "pad_token", "token_dtype", "files")
_FILE_KEYS = ("path", "first_chunk", "num_chunks")
_DAMAGED = "the output is damaged; rerun the job"
MAX_OPEN_FILES = 64
"""Chunk files a PackedDataset keeps open at once; the least recently used is closed first."""


# ----------------------------------------------------------------------------- paths


def _resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding ``path`` and the path inside it; a path without a scheme is local."""
    if "://" not in path:
        return pafs.LocalFileSystem(), os.path.abspath(path)
    return resolve_filesystem(path)  # cached per bucket; credentials from the filesystem's environment


def _open_ipc(filesystem: pafs.FileSystem, path: str) -> tuple[pa.NativeFile, pa.ipc.RecordBatchFileReader]:
    """Open an Arrow IPC file: memory-mapped when local, else as a random-access stream."""
    try:
        if isinstance(filesystem, pafs.LocalFileSystem):
            source = pa.memory_map(path, "r")
        else:
            source = filesystem.open_input_file(path)
    except FileNotFoundError as e:
        raise InputError(f"{path}: listed in the manifest but missing; {_DAMAGED}") from e
    try:
        return source, pa.ipc.open_file(source)
    except pa.ArrowInvalid as e:
        source.close()
        raise InputError(f"{path}: not an Arrow IPC file ({e}); {_DAMAGED}") from e


# ----------------------------------------------------------------------------- manifest


def load_manifest(path: str) -> dict[str, Any]:
    """The parsed ``manifest.json`` of output directory ``path`` (local path or URI).

    Raises InputError when the directory or its manifest is missing, the manifest is not
    JSON, lacks a required key, or has a ``format_version`` this reader does not know.
    """
    filesystem, base = _resolve(path)
    manifest_path = posixpath.join(base, MANIFEST_NAME)
    if filesystem.get_file_info(manifest_path).type == pafs.FileType.NotFound:
        if filesystem.get_file_info(base).type == pafs.FileType.NotFound:
            check_bucket(filesystem, base, f"output {path}")
            raise InputError(f"{path}: no such output directory; check the path")
        raise InputError(f"{path} is incomplete: no {MANIFEST_NAME}; the job did not finish (rerun it)")
    with filesystem.open_input_stream(manifest_path) as f:
        text = f.read()
    try:
        manifest = json.loads(text)
    except ValueError as e:
        raise InputError(f"{manifest_path}: not valid JSON ({e}); {_DAMAGED}") from e
    _check_manifest(manifest, manifest_path)
    return manifest


def _check_manifest(manifest: Any, where: str) -> None:
    if not isinstance(manifest, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(manifest).__name__}")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise InputError(
            f"{where}: format_version={version!r} is not supported (this reader reads version "
            f"{FORMAT_VERSION}); read it with the raypack version that wrote it"
        )
    missing = [k for k in _MANIFEST_KEYS if k not in manifest]
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(missing)}; {_DAMAGED}")
    try:
        is_integer = np.dtype(manifest["token_dtype"]).kind in "iu"
    except TypeError:
        is_integer = False
    if not is_integer:
        raise InputError(f"{where}: token_dtype={manifest['token_dtype']!r} is not an integer dtype; {_DAMAGED}")


def _check_files(files: list[dict[str, Any]], where: str) -> int:
    """Check the file list is complete and contiguous from chunk 0; return the total chunks."""
    next_chunk = 0
    for entry in files:
        missing = [k for k in _FILE_KEYS if k not in entry]
        if missing:
            raise InputError(f"{where}: file entry {entry!r} lacks {', '.join(missing)}")
        if entry["first_chunk"] != next_chunk or entry["num_chunks"] < 0:
            raise InputError(
                f"{where}: file {entry['path']} has first_chunk={entry['first_chunk']}, "
                f"num_chunks={entry['num_chunks']}; expected first_chunk={next_chunk} (files must "
                f"cover the chunks contiguously from 0); {_DAMAGED}"
            )
        next_chunk += entry["num_chunks"]
    return next_chunk


# ----------------------------------------------------------------------------- one file


def _list_column(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
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


def _decode(batch: pa.RecordBatch, path: str, context_length: int) -> Chunks:
    """A record batch as :class:`Chunks`; tokens are a zero-copy view of the batch."""
    tokens = batch.column("input_ids")
    if tokens.null_count:
        raise InputError(f"{path}: input_ids holds nulls; {_DAMAGED}")
    n = batch.num_rows
    flat = tokens.values.slice(tokens.offset * context_length, n * context_length)
    input_ids = flat.to_numpy(zero_copy_only=True).reshape(n, context_length)
    offsets, seg_ids = _list_column(batch.column("segment_doc_ids"))
    len_offsets, seg_lens = _list_column(batch.column("segment_lengths"))
    if not np.array_equal(offsets, len_offsets) or np.any(_row_sums(offsets, seg_lens) != context_length):
        raise InputError(
            f"{path}: segment_doc_ids/segment_lengths do not describe chunks of {context_length} "
            f"positions; {_DAMAGED}"
        )
    return Chunks(input_ids, offsets, seg_ids, seg_lens)


class _ChunkFile:
    """One chunk file of the manifest, opened on first use.

    ``_batch_starts`` is the cumulative row index of its record batches, (num_batches + 1,)
    int64, so a lookup decodes one record batch, not the file. Decoded batches are kept:
    their tokens and segments are views of the file, only the (rows + 1,) offsets are new.
    """

    def __init__(self, filesystem: pafs.FileSystem, path: str, first_chunk: int, num_chunks: int,
                 context_length: int, token_dtype: np.dtype) -> None:
        self.filesystem = filesystem
        self.path = path
        self.first_chunk = int(first_chunk)
        self.num_chunks = int(num_chunks)
        self.context_length = context_length
        self.token_dtype = token_dtype
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
            source, reader = _open_ipc(self.filesystem, self.path)
            self._check_schema(reader.schema)
            rows = [reader.get_batch(k).num_rows for k in range(reader.num_record_batches)]
            starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
            if starts[-1] != self.num_chunks:
                raise InputError(
                    f"{self.path}: holds {starts[-1]} chunks but the manifest says num_chunks="
                    f"{self.num_chunks}; {_DAMAGED}"
                )
            self._batch_starts, self._source, self._reader = starts, source, reader
        return self._reader

    def _check_schema(self, schema: pa.Schema) -> None:
        missing = [c for c in _COLUMNS if c not in schema.names]
        if missing:
            raise InputError(
                f"{self.path}: no column(s) {', '.join(missing)}; not a raypack chunk file (docs/FORMAT.md)"
            )
        found = schema.field("input_ids").type
        expected = pa.list_(pa.from_numpy_dtype(self.token_dtype), self.context_length)
        if found != expected:
            raise InputError(f"{self.path}: input_ids has type {found}, the manifest says {expected}; "
                             f"{_DAMAGED}")

    def _batch(self, k: int) -> Chunks:
        chunks = self._decoded.get(k)
        if chunks is None:
            try:
                chunks = _decode(self._open().get_batch(k), self.path, self.context_length)
            except pa.ArrowInvalid as e:
                raise InputError(f"{self.path}: record batch {k} is unreadable ({e}); {_DAMAGED}") from e
            self._decoded[k] = chunks
        return chunks

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


class PackedDataset:
    """Packed chunks of one output directory, in global order, read lazily.

    ``ds[i]`` -> ``{"input_ids": (C,) token dtype, "doc_ids": (C,) int64}``, negative ``i``
    counting from the end; ``doc_ids`` holds global document ids, -1 on padding. Arrays that
    come from one record batch are read-only views of the file: copy them to write. They
    stay valid after :meth:`close`, which only releases file handles.
    """

    def __init__(self, path: str, manifest: dict[str, Any], filesystem: pafs.FileSystem, base: str) -> None:
        self.path = path
        self.manifest = manifest
        self.context_length = int(manifest["context_length"])
        self.pad_token = int(manifest["pad_token"])
        self.token_dtype = np.dtype(manifest["token_dtype"])
        self._num_chunks = _check_files(manifest["files"], posixpath.join(base, MANIFEST_NAME))
        self._files = [
            _ChunkFile(filesystem, posixpath.join(base, f["path"]), f["first_chunk"], f["num_chunks"],
                       self.context_length, self.token_dtype)
            for f in manifest["files"]
        ]
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
        return {"input_ids": piece.input_ids[0], "doc_ids": piece.doc_ids()[0]}

    def get_batch(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Chunks ``[start, stop)``: ``{"input_ids": (n, C), "doc_ids": (n, C) int64}``; may span files."""
        start, stop = operator.index(start), operator.index(stop)
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"get_batch({start}, {stop}) is out of range; need 0 <= start <= stop <= {len(self)}")
        chunks = concat_chunks(list(self._pieces(start, stop)), self.context_length, self.token_dtype)
        return {"input_ids": chunks.input_ids, "doc_ids": chunks.doc_ids()}

    def iter_batches(
        self, batch_size: int, with_mask: bool = False, mask_dtype: npt.DTypeLike = np.float32
    ) -> Iterator[dict[str, np.ndarray]]:
        """Batches of ``batch_size`` chunks in global order (the last may be shorter).

        Each is a :meth:`get_batch` dict; ``with_mask`` adds ``"attention_mask"``, (n, C, C)
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
        """The (C, C) additive attention mask of chunk ``index`` (see raypack.masks)."""
        return _mask_builder()(self[index]["doc_ids"], dtype=dtype)

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

        Columns: ``input_ids`` fixed_size_list<token>[C] and ``doc_ids`` fixed_size_list<int64>[C].
        One read task per file; each yields one block per record batch, or blocks of
        ``batch_rows`` chunks. Order is kept (``preserve_order`` is set on this dataset's own
        context, not globally). Masks are not in the dataset; build them per batch. Ray's
        "numpy" batch format turns fixed_size_list columns into object arrays of rows, so
        stack them first::

            from raypack.masks import build_intra_document_mask
            for batch in ds.to_ray_dataset().iter_batches(batch_size=8, batch_format="numpy"):
                doc_ids = np.stack(batch["doc_ids"])         # (8, C) int64
                mask = build_intra_document_mask(doc_ids)    # (8, C, C)
        """
        import ray

        if batch_rows is not None and operator.index(batch_rows) < 1:
            raise ValueError(f"batch_rows={batch_rows} must be >= 1 or None")
        files = [f for f in self._files if f.num_chunks]
        if not files:
            return ray.data.from_arrow(_chunks_table(Chunks.empty(self.context_length, self.token_dtype)))
        items = [{"path": f.path, "first_chunk": f.first_chunk, "num_chunks": f.num_chunks} for f in files]
        ds = ray.data.from_items(items, override_num_blocks=len(items))
        ds.context.execution_options.preserve_order = True
        return ds.map_batches(
            _read_file_blocks, batch_size=1, batch_format="pyarrow",
            fn_kwargs={"filesystem": files[0].filesystem, "context_length": self.context_length,
                       "token_dtype": self.token_dtype.name, "batch_rows": batch_rows},
        )


def _mask_builder():
    from raypack.masks import build_intra_document_mask

    return build_intra_document_mask


def _chunks_table(chunks: Chunks) -> pa.Table:
    """``input_ids`` and dense ``doc_ids`` as fixed_size_list columns (tokens not copied)."""
    c = chunks.input_ids.shape[1]
    return pa.table({
        "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(chunks.input_ids.reshape(-1)), c),
        "doc_ids": pa.FixedSizeListArray.from_arrays(pa.array(chunks.doc_ids().reshape(-1)), c),
    })


def _read_file_blocks(items: pa.Table, *, filesystem: pafs.FileSystem, context_length: int,
                      token_dtype: str, batch_rows: int | None) -> Iterator[pa.Table]:
    """Ray map_batches function: read the files described by ``items``, yield chunk tables."""
    for item in items.to_pylist():
        file = _ChunkFile(filesystem, item["path"], item["first_chunk"], item["num_chunks"],
                          context_length, np.dtype(token_dtype))
        try:
            for chunks in file.blocks(batch_rows):
                yield _chunks_table(chunks)
        finally:
            file.close()


def read_packed(path: str) -> PackedDataset:
    """Open the packed output directory ``path`` (local path or URI) for reading.

    Reads the manifest only; chunk files open on first use. Raises InputError for a
    directory without a manifest (unfinished job) or an unknown ``format_version``.
    """
    manifest = load_manifest(path)
    filesystem, base = _resolve(path)
    return PackedDataset(path, manifest, filesystem, base)
