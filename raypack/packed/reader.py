"""Reading packed output back: ``read_packed(path)`` (raypack.outputs) gives a lazy :class:`PackedDataset`.

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
import pyarrow.fs as pafs

from raypack.packed.chunk_files import ChunkFile
from raypack.packed.manifest import Manifest, resolve_output
from raypack.rules.core import Chunks, concat_chunks

if TYPE_CHECKING:
    pass

__all__ = ["BatchReads", "MAX_OPEN_FILES", "PackedDataset", "open_packed"]

MAX_OPEN_FILES = 64
"""Chunk files a PackedDataset keeps open at once; the least recently used is closed first."""


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

    def __init__(self, path: str, manifest: Manifest, filesystem: pafs.FileSystem, base: str) -> None:
        self.path = path
        self.manifest = manifest
        self.context_length = manifest.context_length
        self.pad_token = manifest.pad_token
        self.token_dtype = manifest.token_dtype
        self.extra_columns = manifest.extra_columns
        """Side columns (raypack.rules.side_columns): ``(name, type, fill)`` each, () without any."""
        self._num_chunks = manifest.num_chunks
        self._filesystem, self._base = filesystem, base
        self._files = [ChunkFile(filesystem, base, f, self.context_length, self.token_dtype, self.extra_columns)
                       for f in manifest.files]
        self._first_chunks = np.array([f.first_chunk for f in self._files], dtype=np.int64)
        self._open_files: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return self._num_chunks

    @property
    def content_sha256(self) -> str:
        """The manifest's digest of the chunks' content (docs/FORMAT.md): equal outputs, equal digests."""
        return self.manifest["content_sha256"]

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

    def _file(self, f: int) -> ChunkFile:
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


def open_packed(path: str, data: Any, where: str) -> PackedDataset:
    """The packed output directory ``path`` (local path or URI) whose parsed, unchecked manifest is
    ``data`` (read from ``where`` by :func:`raypack.packed.manifest.read_manifest_json`), for reading.

    Checks the manifest (:func:`raypack.packed.manifest.check_manifest`: every field's type and
    range, file names that are plain content-addressed chunk file names, files that tile the
    chunks; a mix's manifest is refused); chunk files open on first use, each through
    :func:`raypack.packed.manifest.open_chunk_file` (a plain file directly inside the directory, its
    size equal to the manifest's ``num_bytes``: one stat, no hashing). Hashes, structure and
    inputs are checked only by ``raypack verify``. Any output, a mix included, opens with
    :func:`raypack.outputs.read_packed`.
    """
    manifest = Manifest.from_dict(data, where)
    filesystem, base = resolve_output(path)
    return PackedDataset(path, manifest, filesystem, base)
