"""``raypack export --format mds``: a packed output (any strategy) as a MosaicML streaming (MDS)
dataset, sample i = chunk i. The format (bytes, index, decoding) is :mod:`raypack.export.mds_format`.

Parallel parts: part p (one chunk file of the packed output) writes ``shard.{p:05d}.{k:05d}.mds``,
k = 0, 1, ... (:class:`PartWriter`) and returns their index entries; ``index.json`` is written
from all parts' entries in part order, last, once every shard is published: a directory without
it is not a dataset. Shards close at the first sample that would pass ``size_limit`` bytes
(counted as MDSWriter does: 4 bytes per sample beyond its own, plus the header), so a shard's
bytes depend only on the part's chunks and the options, not on which process wrote it. On any
error the shards written are removed and no index is written. Files go through
:class:`raypack.packed.writer.AtomicFile`, so any filesystem the job supports (local, ``s3://``, ...).

Two drivers: :func:`export_mds` (Python, parts in order in this process) and :class:`MdsExporter`
(the ``raypack export`` seam: parts in a local process pool with ``--workers``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.export.base import Exporter, ExportMismatch, cast_tokens
from raypack.export.mds_format import (
    DAMAGED,
    DEFAULT_SIZE_LIMIT,
    INDEX_NAME,
    SHARD_NAME_RE,
    TOKEN_DTYPES,
    EncodedChunks,
    assemble_samples,
    config_bytes,
    decode_shard,
    encode_chunks,
    entry_layout,
    load_index,
    read_shard,
    shard_config,
    shard_head,
    shard_name,
    write_index,
)
from raypack.export.sources import ChunkPart, Source
from raypack.io.fs import is_uri, resolve_filesystem
from raypack.outputs import read_packed
from raypack.packed.reader import PackedDataset
from raypack.packed.writer import MANIFEST_NAME, AtomicFile, Committer, publish_or_abort
from raypack.rules.core import Chunks, concat_chunks

log = logging.getLogger(__name__)

WRITE_BLOCK_BYTES = 8 << 20
"""A shard is assembled and written this many bytes at a time (one reused buffer)."""


# ----------------------------------------------------------------------------- writing


class PartWriter:
    """Writes part ``part`` of an MDS export into ``out_dir``: :meth:`write` chunks in order, then
    :meth:`close` returns the index entries of its shards ``shard.{part}.{k}.mds``.

    A shard is held as views (tokens are not copied) until it is full, then written whole through
    :class:`AtomicFile` (appears complete or not at all), assembled WRITE_BLOCK_BYTES at a time in
    one reused buffer, and published (fsync, rename) here or, given a ``committer``, on its
    thread: then :meth:`close` returns before the last shards are published, and the caller
    waits with ``committer.wait()`` before writing the index. Memory: one shard's segment bytes
    plus the source batches it views. :meth:`abort` removes the shards this writer published.
    """

    def __init__(self, out_dir: str, part: int, *, context_length: int, token_dtype: npt.DTypeLike,
                 size_limit: int | None = DEFAULT_SIZE_LIMIT, committer: Committer | None = None) -> None:
        if size_limit is not None and not 0 < size_limit < 1 << 32:
            raise ValueError(f"size_limit={size_limit} must be in [1, 2**32) bytes (MDS offsets are u32), or None")
        self.out_dir, self.part = out_dir, part
        self.context_length, self.token_dtype = context_length, np.dtype(token_dtype)
        if self.token_dtype.name not in TOKEN_DTYPES:
            raise ValueError(f"token dtype {self.token_dtype} is not one MDS holds ({', '.join(TOKEN_DTYPES)})")
        self.size_limit = size_limit
        self.config = shard_config(context_length, self.token_dtype, size_limit)
        self._config_bytes = config_bytes(self.config)
        self._pending: list[EncodedChunks] = []
        self._pending_bytes = self._empty_bytes = 8 + len(self._config_bytes)
        self._entries: list[dict[str, Any]] = []
        self._made_dir = False
        """:meth:`prepare` found no output directory (local): :meth:`abort` removes it if left empty."""
        self._buffer: np.ndarray | None = None
        self._committer = committer

    def write(self, chunks: Chunks) -> None:
        """Append ``chunks`` (input_ids (n, C) of the token dtype) as the next samples."""
        if chunks.input_ids.shape[1:] != (self.context_length,) or chunks.input_ids.dtype != self.token_dtype:
            raise ValueError(f"chunks of shape {chunks.input_ids.shape} {chunks.input_ids.dtype}; this part writes "
                             f"(n, {self.context_length}) {self.token_dtype}")
        encoded = encode_chunks(chunks)
        costs = encoded.sizes() + 4
        start = 0
        while start < encoded.num_samples:
            take = self._room(costs[start:])
            if take == 0:
                self._flush()
                continue
            self._pending.append(encoded.rows(start, start + take))
            self._pending_bytes += int(costs[start: start + take].sum())
            start += take
            if start < encoded.num_samples:
                self._flush()

    def _room(self, costs: np.ndarray) -> int:
        """How many of the next samples (``costs``: bytes + 4 each) fit the open shard; an empty
        shard takes at least one. Without a size limit a shard still stops below 4 GiB (u32 offsets)."""
        limit = self.size_limit if self.size_limit is not None else (1 << 32) - 1
        fit = int(np.searchsorted(np.cumsum(costs) + self._pending_bytes, limit, side="right"))
        return max(fit, 1) if not self._pending else fit

    def _flush(self) -> None:
        if not self._pending:
            return
        name = shard_name(self.part, len(self._entries))
        sizes = np.concatenate([e.sizes() for e in self._pending])
        file = AtomicFile(self.out_dir, name, make_dirs=True)
        try:
            file.write(shard_head(sizes, self._config_bytes))
            for encoded in self._pending:
                for block in self._blocks(encoded):
                    file.write(memoryview(block))
        except BaseException:
            file.abort()
            raise
        if self._committer is None:
            publish_or_abort(file.commit, file.abort)
        else:
            self._committer.submit_file(file)
        num_bytes = int(4 + 4 * (sizes.size + 1) + len(self._config_bytes) + sizes.sum())
        self._entries.append({"samples": int(sizes.size), "raw_data": {"basename": name, "bytes": num_bytes,
                                                                      "hashes": {}},
                              "zip_data": None, **self.config})
        self._pending, self._pending_bytes = [], self._empty_bytes

    def _blocks(self, encoded: EncodedChunks) -> Iterator[np.ndarray]:
        """``encoded``'s samples assembled in runs of at most WRITE_BLOCK_BYTES (at least one sample)."""
        ends = np.cumsum(encoded.sizes())
        start = 0
        while start < encoded.num_samples:
            base = int(ends[start - 1]) if start else 0
            stop = max(start + 1, int(np.searchsorted(ends, base + WRITE_BLOCK_BYTES, side="right")))
            need = int(ends[stop - 1]) - base
            if self._buffer is None or self._buffer.size < need:
                self._buffer = np.empty(max(need, WRITE_BLOCK_BYTES), np.uint8)
            yield assemble_samples(encoded.rows(start, stop), self._buffer)
            start = stop

    def close(self) -> list[dict[str, Any]]:
        """Write the last shard; the part's index entries in order (none for a part without chunks)."""
        self._flush()
        self._buffer = None
        return self._entries

    @property
    def shard_names(self) -> list[str]:
        """The shards written so far (published, or being published by the committer)."""
        return [e["raw_data"]["basename"] for e in self._entries]

    def abort(self) -> None:
        """Remove every shard this writer published (on error; with a committer, after it drained)."""
        self._pending = []
        remove_shards(self.out_dir, self.shard_names)
        self._entries = []


def remove_shards(out_dir: str, names: Iterable[str]) -> None:
    """Delete shard files ``names`` of ``out_dir``, ignoring those already gone."""
    fs, base = resolve_filesystem(out_dir)
    for name in names:
        try:
            fs.delete_file(posixpath.join(base, name))
        except FileNotFoundError:
            pass
        except OSError as e:  # keep the caller's error; an unlisted shard is never read
            log.warning("could not delete %s/%s: %s", base, name, e)


def write_part(out_dir: str, part: int, chunks: Iterable[Chunks], *, context_length: int,
               token_dtype: npt.DTypeLike, size_limit: int | None = DEFAULT_SIZE_LIMIT,
               committer: Committer | None = None) -> list[dict[str, Any]]:
    """Write part ``part`` from ``chunks`` (in order, of the token dtype); its index entries. On error
    the part's published shards are removed (after ``committer`` has drained). With a committer, the
    last shards may still be being published on return: ``committer.wait()`` before the index."""
    writer = PartWriter(out_dir, part, context_length=context_length, token_dtype=token_dtype,
                        size_limit=size_limit, committer=committer)
    try:
        for piece in chunks:
            writer.write(piece)
        return writer.close()
    except BaseException:
        if committer is not None:
            committer.drain()
        writer.abort()
        raise


# ----------------------------------------------------------------------------- the export


class MdsExport(NamedTuple):
    """What an export holds: ``num_samples`` samples (= chunks) of ``context_length`` tokens in
    ``num_shards`` shard files of ``num_bytes`` bytes in all (index.json not counted)."""

    path: str
    num_samples: int
    num_shards: int
    num_bytes: int
    context_length: int
    token_dtype: str

    @property
    def num_tokens(self) -> int:
        """Token positions exported (padding included): samples x C."""
        return self.num_samples * self.context_length


def _summary(out_dir: str, entries: list[dict[str, Any]], context_length: int, dtype: np.dtype) -> MdsExport:
    return MdsExport(out_dir, sum(e["samples"] for e in entries), len(entries),
                     sum(e["raw_data"]["bytes"] for e in entries), context_length, dtype.name)


def _cast_chunks(pieces: Iterable[Chunks], dtype: np.dtype, where: str) -> Iterator[Chunks]:
    """``pieces`` with their tokens cast to ``dtype`` (InputError naming ``where`` when one does not fit)."""
    for piece in pieces:
        yield piece._replace(input_ids=cast_tokens(piece.input_ids, dtype, where))


def _check_not_source(src_dir: str, out_dir: str) -> None:
    (out_fs, out_base), (src_fs, src_base) = resolve_filesystem(out_dir), resolve_filesystem(src_dir)
    if out_fs.type_name == src_fs.type_name and out_base.rstrip("/") == src_base.rstrip("/"):
        raise InputError(f"{out_dir} is the packed output itself; give another directory for the export")


def _check_a_place_of_its_own(out_dir: str) -> None:
    """A local directory that holds files no MDS export wrote (an input directory, a home directory) or that
    lies inside a raypack output is refused: the export was written beside them, and the output's own
    ``--overwrite`` then refused the files it had not written (a new user's trial)."""
    if is_uri(out_dir):
        return
    path = os.path.abspath(out_dir)
    here = path
    while True:
        if os.path.isfile(os.path.join(here, MANIFEST_NAME)):
            raise InputError(f"{out_dir} is inside the raypack output {here} (it holds {MANIFEST_NAME}); give a "
                             "directory of its own for the export")
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, INDEX_NAME)):
        names = sorted(os.listdir(path))
        if names:
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            raise InputError(f"{out_dir} holds {names[0]!r}{more}, which no MDS export wrote; give an empty or new "
                             "directory for the export")


def _clear_previous(out_dir: str, overwrite: bool) -> None:
    """Refuse an ``out_dir`` holding an index (unless ``overwrite``: then remove it, then its shards)."""
    fs, base = resolve_filesystem(out_dir)
    index_path = posixpath.join(base, INDEX_NAME)
    if fs.get_file_info(index_path).type == pafs.FileType.NotFound:
        return
    if not overwrite:
        raise InputError(f"{out_dir} already holds an MDS export ({INDEX_NAME}); pass overwrite=True "
                         "(--overwrite) to replace it")
    names = [e["raw_data"]["basename"] for e in load_index(out_dir)]
    fs.delete_file(index_path)
    remove_shards(out_dir, names)


def export_mds(src_dir: str, out_dir: str, *, size_limit: int | None = DEFAULT_SIZE_LIMIT,
               token_dtype: npt.DTypeLike | None = None, overwrite: bool = False) -> MdsExport:
    """Export the packed output ``src_dir`` (any strategy) as an MDS dataset in ``out_dir``
    (local path or URI): sample i is chunk i. One part per chunk file of the output, written in
    order in this process (each shard's fsync on a :class:`Committer` thread, overlapping the
    next), then ``index.json``; on any error the shards written are removed and
    no index is written. ``token_dtype``: the tokens' dtype in the export (default: the
    output's; each id is checked to fit). Cost: one pass over the tokens, no copy but the write.
    """
    ds = read_packed(src_dir)
    dtype = np.dtype(token_dtype) if token_dtype is not None else ds.token_dtype
    _check_not_source(src_dir, out_dir)
    _check_a_place_of_its_own(out_dir)
    _clear_previous(out_dir, overwrite)
    entries: list[dict[str, Any]] = []
    try:
        with Committer() as committer:
            for part in range(len(ds.file_items())):
                entries += export_part(ds, out_dir, part, token_dtype=dtype, size_limit=size_limit,
                                       committer=committer)
        write_index(out_dir, entries)
    except BaseException:  # the committer has drained: nothing is being published any more
        remove_shards(out_dir, [e["raw_data"]["basename"] for e in entries])
        raise
    finally:
        ds.close()
    return _summary(out_dir, entries, ds.context_length, dtype)


def export_part(ds: PackedDataset, out_dir: str, part: int, *, token_dtype: npt.DTypeLike | None = None,
                size_limit: int | None = DEFAULT_SIZE_LIMIT,
                committer: Committer | None = None) -> list[dict[str, Any]]:
    """Write part ``part`` of the export of ``ds`` (its chunk file ``ds.file_items()[part]``) into
    ``out_dir``; its index entries, for :func:`write_index` in part order. Parts are independent:
    a task elsewhere opens ``read_packed(src)`` and writes its parts. On error the part's
    published shards are removed (after ``committer`` has drained). With a committer, the last
    shards may still be being published on return: ``committer.wait()`` before the index."""
    dtype = np.dtype(token_dtype) if token_dtype is not None else ds.token_dtype
    item = ds.file_items()[part]
    chunks = ds.pieces(item["first_chunk"], item["first_chunk"] + item["num_chunks"])
    return write_part(out_dir, part, _cast_chunks(chunks, dtype, f"{ds.path}/{item['path']}"),
                      context_length=ds.context_length, token_dtype=dtype, size_limit=size_limit, committer=committer)


def verify_mds(out_dir: str, src_dir: str) -> MdsExport:
    """Check the MDS export ``out_dir`` against the packed output ``src_dir``: its index, then every
    shard decoded by :func:`decode_shard` (not the writer's code) and compared with the source's
    chunks in order (tokens by value, segment doc ids, lengths), and the sample count. Raises
    InputError naming the shard and the first differing sample; returns what was checked.
    Cost: every shard read once, one shard in memory at a time."""
    entries = load_index(out_dir)
    ds = read_packed(src_dir)
    chunk = 0
    try:
        for entry in entries:
            where = f"{out_dir}/{entry['raw_data']['basename']}"
            found = decode_shard(read_shard(out_dir, entry), entry, where)
            end = chunk + found.num_chunks
            if end > len(ds) or found.input_ids.shape[1] != ds.context_length:
                raise InputError(f"{where}: holds samples past the source's {len(ds)} chunks of "
                                 f"{ds.context_length} tokens; {DAMAGED}")
            _compare(found, concat_chunks(list(ds.pieces(chunk, end)), ds.context_length, ds.token_dtype),
                     chunk, where)
            chunk = end
        if chunk != len(ds):
            raise InputError(f"{out_dir}: holds {chunk} samples, the source {src_dir} {len(ds)} chunks; {DAMAGED}")
    finally:
        ds.close()
    context_length, dtype = entry_layout(entries[0], out_dir) if entries else (ds.context_length, ds.token_dtype)
    return _summary(out_dir, entries, context_length, dtype)


def _compare(found: Chunks, expected: Chunks, first_chunk: int, where: str) -> None:
    """InputError naming the first sample of ``found`` that differs from ``expected``."""
    expected_offsets = expected.segment_offsets - expected.segment_offsets[0]
    bad = ~np.all(found.input_ids == expected.input_ids, axis=1)
    if not np.array_equal(found.segment_offsets, expected_offsets):
        bad |= np.diff(found.segment_offsets) != np.diff(expected_offsets)
    elif not (np.array_equal(found.segment_doc_ids, expected.segment_doc_ids)
              and np.array_equal(found.segment_lengths, expected.segment_lengths)):
        seg_bad = (found.segment_doc_ids != expected.segment_doc_ids) | \
                  (found.segment_lengths != expected.segment_lengths)
        bad[np.searchsorted(found.segment_offsets, np.flatnonzero(seg_bad), side="right") - 1] = True
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{where}: sample {i} differs from chunk {first_chunk + i} of the source; {DAMAGED}")


# ----------------------------------------------------------------------------- raypack export --format mds


class MdsExporter(Exporter):
    """The export seam's MDS format: parts are the packed output's chunk files, each written by
    :func:`write_part` in its process (its own :class:`Committer`, drained before it returns);
    ``finalize`` writes ``index.json`` from the parts' entries; ``abort`` removes every shard."""

    name = "mds"
    summary = "MosaicML streaming (MDS) dataset DIR/index.json + shards, one sample per chunk (packed output)"
    token_dtypes = TOKEN_DTYPES
    source_kinds = frozenset({"packed"})
    unit = "chunks"
    overwrite_note = "the old export is removed before the new one is written"
    size_limit: int | None = DEFAULT_SIZE_LIMIT

    def __init__(self, output: str, token_dtype: np.dtype) -> None:
        super().__init__(output, token_dtype)
        self.size_limit = type(self).size_limit  # on the instance: pickled to the pool with it
        self._entries: list[dict[str, Any]] = []

    def output_paths(self) -> list[str]:
        path, sep, query = self.output.partition("?")
        return [f"{path.rstrip('/')}/{INDEX_NAME}{sep}{query}"]

    def describe(self) -> str:
        return (f"{self.output} ({sum(e['samples'] for e in self._entries):,} samples in {len(self._entries):,} "
                f"shards, {self.token_dtype.name})")

    def prepare(self, source: Source) -> None:
        """Refuse the source directory itself; remove a previous export (the run checked --overwrite)."""
        _check_not_source(source.path, self.output)
        _check_a_place_of_its_own(self.output)
        fs, base = resolve_filesystem(self.output)
        self._made_dir = (isinstance(fs, pafs.LocalFileSystem)
                          and fs.get_file_info(base).type == pafs.FileType.NotFound)
        _clear_previous(self.output, overwrite=True)

    def write_part(self, part: ChunkPart, batches: Iterator[Chunks]) -> list[dict[str, Any]]:
        """Part ``part``'s shards; their index entries (every shard published on return)."""
        chunks = _cast_chunks(batches, self.token_dtype, f"{self.output}: part {part.index} ({part.path})")
        with Committer() as committer:
            return write_part(self.output, part.index, chunks, context_length=part.context_length,
                              token_dtype=self.token_dtype, size_limit=self.size_limit, committer=committer)

    def finalize(self, source: Source, results: list[list[dict[str, Any]]]) -> None:
        self._entries = [entry for entries in results for entry in entries]
        write_index(self.output, self._entries)

    def abort(self) -> None:
        """Remove every shard file of the directory (a previous export's went in ``prepare``)."""
        fs, base = resolve_filesystem(self.output)
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        remove_shards(self.output, [i.base_name for i in infos if SHARD_NAME_RE.fullmatch(i.base_name)])
        if self._made_dir:
            with contextlib.suppress(OSError):
                os.rmdir(base)  # made by this run and left empty: gone too

    def verify(self, source: Source) -> list[str]:
        """:func:`verify_mds` (every shard decoded and compared with the chunks) and the token dtype."""
        try:
            found = verify_mds(self.output, source.path)
        except InputError as e:
            if isinstance(e.__cause__, FileNotFoundError):  # no index.json: not an export, not a mismatch
                raise
            raise ExportMismatch(str(e)) from e
        if self.dtype_given and found.token_dtype != self.token_dtype.name:
            raise ExportMismatch(f"{self.output}: token dtype {found.token_dtype}, expected {self.token_dtype.name}")
        return [f"verified {self.output} against {source.path}", f"  samples   {found.num_samples:>14,}",
                f"  shards    {found.num_shards:>14,}", f"  dtype     {found.token_dtype:>14}"]
