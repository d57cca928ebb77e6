"""Audit a packed output directory against docs/FORMAT.md and, optionally, its inputs.

``verify_output(out, inputs)`` streams the output with bounded memory and stops at the FIRST
discrepancy, raising :class:`VerifyError` with a message naming it (file, chunk, position,
doc id, expected vs found). numpy and pyarrow only, no Ray; the output is read with plain
pyarrow, independently of ``raypack.reader``. Checks, in this order:

  1. Files. ``manifest.json`` passes :func:`raypack.manifest.load_manifest` (format version 2,
     every field typed and in range, files named ``chunks-{first:012d}-{sha256[:16]}.arrow``
     after their first chunk and hash, tiling chunks ``0..n-1`` contiguously); every listed file
     exists and no unlisted ``chunks-*.arrow`` does; each file is opened only as a plain file
     directly inside the directory (:func:`raypack.manifest.open_chunk_file`: no symlink, even
     one whose target hashes right, no FIFO), and its size and sha256 (hashed streaming) equal
     the manifest's; ``content_sha256`` is the sha256 of the files' digests, one per line, in
     order. Hashing comes first, so nothing below decodes a file whose bytes are not the ones
     the manifest vouches for.
  2. Structure, one slice of ``batch_chunks`` chunks at a time, in global order: the schema
     (columns, types, metadata) matches the manifest; each file holds its ``num_chunks`` rows;
     no nulls; ``chunk_index`` runs ``0..n-1``; segment lists agree in length, lengths are
     > 0 and sum to C per chunk; doc ids never decrease along the output, strictly increasing
     between segments except where a chunk's first segment continues the previous chunk's last
     document; padding (-1) appears only as the last segment of the last chunk, never filling
     a chunk, and holds ``pad_token``. At the end the manifest's counts (chunks, tokens,
     padding_positions, split_documents, and documents >= max doc id + 1) must equal what was
     read.
  3. Round trip (when inputs are compared), in the same pass: the non-padding token stream
     and its dense doc ids must equal the input documents concatenated in order, each token
     labelled with its document's global id. A cursor walks both streams, whose batch
     boundaries differ, comparing the overlap of the current output piece and input piece with
     numpy, so every non-empty document appears once, whole, contiguous and in order, and
     tokens are conserved. Then the input's document count must equal the manifest's, and, when
     the inputs are the manifest's shards, each shard's counts must equal what was recorded.

Memory: ``batch_chunks * C`` output positions (tokens plus int64 doc ids) and one input read
batch of ``INPUT_BATCH_DOCS`` documents. Cost: every file is read twice (hash, then decode;
the second read is usually served by the page cache), the inputs once, and O(tokens) numpy
work; no Python loop runs per token, document or segment.

``best_fit`` outputs (manifest ``"strategy": "best_fit"``; a manifest without a strategy is
``concat``) follow the rules of :mod:`raypack.best_fit`; 2 and 3 become:

  a. Manifest: also ``best_fit_window`` (N >= 0, as in ``config``) and the shards, each with
     ``first_chunk``/``num_chunks``: ranges that tile the chunks in shard order.
  b. Per block: chunk indices and segment lengths as in 2; per chunk, documents first in strictly
     increasing doc id (so none twice), then at most one padding segment (-1, holding
     ``pad_token``), never a chunk of padding only; every doc id lies in the shard whose chunk
     range holds the chunk, and in one window (rows ``[w*N, (w+1)*N)`` of its shard; N=0: the
     whole shard) shared by all of the chunk's documents; windows never go back along the chunks,
     so each window's chunks are exactly the contiguous run of chunks holding its doc ids.
  c. Per window, once its last chunk is read: every document's segments, in chunk order, are
     full C-token chunks except the last (so a document of at most C tokens is one segment, a
     longer one its full pieces then its remainder); re-running best-fit decreasing
     (:func:`raypack.best_fit.split_items`, :func:`raypack.best_fit.best_fit_decreasing`) on the
     window's document lengths gives the same number of chunks, the same fill per chunk and the
     same segments ("not best-fit" otherwise). At the end: the counts (split_documents = documents
     longer than C) and each shard's num_tokens.
  d. With inputs: each window's segments are put back in doc id order (a document's segments in
     chunk order) and that stream is compared with the inputs by the cursor of 3.

Memory for best_fit: the segments of one window plus one block (and, when the inputs are
compared, that window's tokens); windows never span shards, so ``best_fit_window=0`` holds a
shard. Python loops run only per window (best-fit decreasing), never per token or segment.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.best_fit import best_fit_decreasing, split_items
from raypack.core import flatten_documents
from raypack.errors import InputError
from raypack.formats import SHARD_SUFFIXES, iter_token_batches, shard_format
from raypack.fs import resolve_filesystem
from raypack.manifest import load_manifest, open_chunk_file, resolve_output, strategy_of
from raypack.output import CHUNK_FILE_RE, FORMAT_VERSION, MANIFEST_NAME, content_sha256
from raypack.shards import discover_shards

__all__ = ["INPUT_BATCH_DOCS", "VerifyError", "VerifyReport", "verify_output"]

log = logging.getLogger(__name__)

INPUT_BATCH_DOCS = 2048
"""Input documents read per batch when comparing with the inputs."""
HASH_BLOCK_BYTES = 8 << 20
"""Bytes read at a time when hashing a chunk file."""
_COLUMNS = ("chunk_index", "input_ids", "segment_doc_ids", "segment_lengths")


class VerifyError(ValueError):
    """The output breaks the format or differs from its inputs; the message says where and how."""


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify_output` checked; every count was read, and matched the manifest."""

    output: str
    num_files: int
    num_bytes: int
    num_chunks: int
    context_length: int
    num_tokens: int
    num_padding_positions: int
    num_documents: int
    """The manifest's document count (>= max doc id + 1; equal to the inputs' when compared)."""
    num_split_documents: int
    num_segments: int
    content_sha256: str
    inputs_compared: bool
    num_shards: int
    """Input shards compared (0 when inputs were not compared)."""
    seconds: float
    strategy: str = "concat"
    best_fit_window: int | None = None
    """Documents per best-fit window (0: a whole shard); None for concat."""
    input_paths: tuple[str, ...] = ()
    """The input shards read, in order (empty when inputs were not compared)."""

    def lines(self) -> list[str]:
        rate = self.num_tokens / self.seconds if self.seconds > 0 else 0.0
        inputs = (f"{self.num_shards} shard(s), {self.num_documents:,} documents: unpack(pack(x)) == x"
                  if self.inputs_compared else "not compared")
        return [
            f"verified {self.output}",
            f"  files            {self.num_files:>14,}  ({self.num_bytes:,} bytes, sha256 ok)",
            f"  chunks           {self.num_chunks:>14,}  of {self.context_length} tokens",
            f"  strategy         {self.strategy:>14}" + (
                f"  (windows of {self.best_fit_window:,} documents)" if self.best_fit_window
                else "  (windows of a whole shard)" if self.best_fit_window == 0 else ""),
            f"  tokens           {self.num_tokens:>14,}",
            f"  padding          {self.num_padding_positions:>14,}",
            f"  documents        {self.num_documents:>14,}",
            f"  split documents  {self.num_split_documents:>14,}",
            f"  inputs           {inputs}",
            *(f"    read {path}" for path in self.input_paths[:3]),
            *([f"    ... and {len(self.input_paths) - 3:,} more shard(s)"] if len(self.input_paths) > 3 else []),
            f"  content_sha256   {self.content_sha256}",
            f"  time             {self.seconds:>14.2f}s  ({rate / 1e6:,.1f}M tokens/s)",
        ]


def verify_output(
    out: str,
    inputs: Sequence[str] | None = None,
    *,
    token_column: str | None = None,
    batch_chunks: int = 1024,
) -> VerifyReport:
    """Audit output directory ``out`` (local path or URI); raise VerifyError at the first discrepancy.

    inputs: shard files/directories/globs to compare with (expanded like ``raypack pack`` does);
    None compares with the manifest's shards when every one of them still exists (only absolute
    paths or URIs of shard files without ``..``: anything else is an InputError asking for
    explicit inputs; the report names every shard read), ``[]`` skips the comparison. token_column: the inputs' token column (default: the manifest's config, else
    ``input_ids``). batch_chunks: chunks decoded at a time (bounds memory).
    Raises InputError for unusable arguments (an input path that does not exist).
    """
    start = time.perf_counter()
    if isinstance(batch_chunks, bool) or not isinstance(batch_chunks, int) or batch_chunks < 1:
        raise ValueError(f"batch_chunks={batch_chunks!r} must be an integer >= 1")
    manifest = _load_manifest(out)
    fs, base = resolve_output(out)
    num_bytes = _check_files(fs, base, manifest)
    shards = _resolve_inputs(manifest, inputs, posixpath.join(base, MANIFEST_NAME))
    structure = (_BestFitStructure(manifest, keep_tokens=shards is not None) if strategy_of(manifest) == "best_fit"
                 else _Structure(manifest))
    pieces = _output_pieces(fs, base, manifest, structure, batch_chunks)
    if shards is None:
        for _ in pieces:
            pass
    else:
        column = token_column or (manifest.get("config") or {}).get("token_column") or "input_ids"
        _compare_with_inputs(pieces, shards, column, manifest, posixpath.join(base, MANIFEST_NAME))
    return VerifyReport(
        output=out, num_files=len(manifest["files"]), num_bytes=num_bytes,
        num_chunks=structure.next_chunk, context_length=structure.context_length,
        num_tokens=structure.num_tokens, num_padding_positions=structure.num_padding,
        num_documents=manifest["counts"]["documents"], num_split_documents=structure.num_split,
        num_segments=structure.num_segments, content_sha256=manifest["content_sha256"],
        inputs_compared=shards is not None, num_shards=len(shards or ()),
        seconds=time.perf_counter() - start, strategy=strategy_of(manifest),
        best_fit_window=manifest.get("best_fit_window") if strategy_of(manifest) == "best_fit" else None,
        input_paths=tuple(shard.path for shard in shards or ()),
    )


# ----------------------------------------------------------------------------- 1. manifest


def _load_manifest(out: str) -> dict[str, Any]:
    """The manifest, checked by :func:`raypack.manifest.load_manifest`; its InputError becomes a VerifyError."""
    try:
        return load_manifest(out)
    except InputError as e:
        raise VerifyError(str(e)) from e


def _open_chunk_file(fs: pafs.FileSystem, base: str, entry: dict[str, Any]) -> pa.NativeFile:
    """The manifest's file ``entry`` through :func:`raypack.manifest.open_chunk_file` (a plain file
    directly inside ``base`` of ``num_bytes`` bytes); its InputError becomes a VerifyError."""
    try:
        return open_chunk_file(fs, base, entry["path"], entry["num_bytes"])
    except InputError as e:
        raise VerifyError(str(e)) from e


# ----------------------------------------------------------------------------- 1. files and hashes


def _check_files(fs: pafs.FileSystem, base: str, manifest: dict[str, Any]) -> int:
    """Listed files present, none unlisted, sizes and sha256 as recorded; return the total bytes."""
    present = {posixpath.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(base))}
    files = manifest["files"]
    for entry in files:
        if entry["path"] not in present:
            last = entry["first_chunk"] + entry["num_chunks"] - 1
            raise VerifyError(f"{posixpath.join(base, entry['path'])}: missing (the manifest lists it for "
                              f"chunks {entry['first_chunk']}..{last})")
    listed = {entry["path"] for entry in files}
    unlisted = sorted(n for n in present if _looks_like_chunk_file(n) and n not in listed)
    if unlisted:
        raise VerifyError(f"{posixpath.join(base, unlisted[0])}: a chunk file the manifest does not list "
                          f"({len(unlisted)} unlisted in all); it is not part of this output")
    for entry in files:
        _check_file_bytes(fs, base, entry)
    expected = content_sha256(files)
    if manifest["content_sha256"] != expected:
        raise VerifyError(f"{posixpath.join(base, MANIFEST_NAME)}: content_sha256={manifest['content_sha256']}, "
                          f"expected {expected} (sha256 of the files' sha256 digests, one per line)")
    return sum(entry["num_bytes"] for entry in files)


def _looks_like_chunk_file(name: str) -> bool:
    """A chunk file name of this format or of version 1 (``chunks-{first:012d}.arrow``)."""
    return CHUNK_FILE_RE.fullmatch(name) is not None or (name.startswith("chunks-") and name.endswith(".arrow"))


def _check_file_bytes(fs: pafs.FileSystem, base: str, entry: dict[str, Any]) -> None:
    """Size (checked on open) and sha256 of the file ``entry`` names, as the manifest records."""
    path = posixpath.join(base, entry["path"])
    with _open_chunk_file(fs, base, entry) as source:
        digest, num_bytes = _sha256(source)
    if num_bytes != entry["num_bytes"]:
        raise VerifyError(f"{path}: read {num_bytes} bytes, the manifest says num_bytes={entry['num_bytes']}")
    if digest != entry["sha256"]:
        raise VerifyError(f"{path}: sha256 {digest} differs from the manifest's {entry['sha256']}; "
                          "the file's bytes changed after it was written")


def _sha256(source: pa.NativeFile) -> tuple[str, int]:
    """Hex sha256 and size of an open file, read in HASH_BLOCK_BYTES blocks (zero-copy when mapped)."""
    sha, num_bytes = hashlib.sha256(), 0
    while (block := source.read_buffer(HASH_BLOCK_BYTES)).size:
        sha.update(block)
        num_bytes += block.size
    return sha.hexdigest(), num_bytes


# ----------------------------------------------------------------------------- 2. decoding


class _Block(NamedTuple):
    """``n`` consecutive rows of one chunk file, decoded (views of the file where possible).

    chunk_indices: (n,) int64.  input_ids: (n, C) token dtype.
    segment_offsets: (n + 1,) int64 from 0.  segment_doc_ids: (S,) int64.  segment_lengths: (S,) int32.
    """

    path: str
    first_row: int
    chunk_indices: npt.NDArray[np.int64]
    input_ids: npt.NDArray[np.integer]
    segment_offsets: npt.NDArray[np.int64]
    segment_doc_ids: npt.NDArray[np.int64]
    segment_lengths: npt.NDArray[np.int32]


def _iter_blocks(fs: pafs.FileSystem, base: str, entry: dict[str, Any], manifest: dict[str, Any],
                 batch_chunks: int) -> Iterator[_Block]:
    """Every row of one chunk file in ``batch_chunks``-row blocks, after schema and row-count checks."""
    path = posixpath.join(base, entry["path"])
    with _open_chunk_file(fs, base, entry) as source:
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
                yield _decode(part, path, first_row, manifest["context_length"])
                first_row += part.num_rows


def _get_batch(reader: pa.ipc.RecordBatchFileReader, k: int, path: str) -> pa.RecordBatch:
    try:
        batch = reader.get_batch(k)
        batch.validate(full=True)
    except (pa.ArrowException, OSError) as e:
        raise VerifyError(f"{path}: record batch {k} is invalid ({e})") from e
    return batch


def _check_schema(schema: pa.Schema, path: str, manifest: dict[str, Any]) -> None:
    c, token_type = manifest["context_length"], pa.from_numpy_dtype(np.dtype(manifest["token_dtype"]))
    expected = {
        "chunk_index": pa.int64(),
        "input_ids": pa.list_(token_type, c),
        "segment_doc_ids": pa.list_(pa.int64()),
        "segment_lengths": pa.list_(pa.int32()),
    }
    for name, typ in expected.items():
        if name not in schema.names:
            raise VerifyError(f"{path}: no column {name!r}; columns are {schema.names}")
        found = schema.field(name).type
        if not _same_type(found, typ):
            raise VerifyError(f"{path}: column {name} has type {found}, expected {typ}")
    metadata = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
    for key, value in (("format_version", FORMAT_VERSION), ("context_length", c), ("pad_token", manifest["pad_token"])):
        if metadata.get(f"raypack.{key}") != str(value):
            raise VerifyError(f"{path}: schema metadata raypack.{key}={metadata.get(f'raypack.{key}')!r}, "
                              f"the manifest says {value}")


def _same_type(found: pa.DataType, expected: pa.DataType) -> bool:
    """Equal types, ignoring the name of a list's item field."""
    if isinstance(expected, (pa.ListType, pa.FixedSizeListType)):
        return (type(found) is type(expected) and found.value_type == expected.value_type
                and getattr(found, "list_size", None) == getattr(expected, "list_size", None))
    return found == expected


def _decode(batch: pa.RecordBatch, path: str, first_row: int, c: int) -> _Block:
    for name in _COLUMNS:
        column = batch.column(name)
        nulls = column.null_count + (column.flatten().null_count if name != "chunk_index" else 0)
        if nulls:
            raise VerifyError(f"{path} rows {first_row}..{first_row + batch.num_rows - 1}: column {name} holds nulls")
    tokens = batch.column("input_ids")
    flat = tokens.values.slice(tokens.offset * c, batch.num_rows * c)
    id_offsets, seg_ids = _list_column(batch.column("segment_doc_ids"))
    len_offsets, seg_lens = _list_column(batch.column("segment_lengths"))
    if not np.array_equal(id_offsets, len_offsets):
        row = int(np.argmax(id_offsets != len_offsets)) - 1
        raise VerifyError(f"{path} row {first_row + row}: segment_doc_ids and segment_lengths have "
                          "different numbers of segments")
    return _Block(path, first_row, batch.column("chunk_index").to_numpy(),
                  flat.to_numpy().reshape(batch.num_rows, c), id_offsets, seg_ids, seg_lens)


def _list_column(column: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets from 0, values)`` of a (possibly sliced) list column."""
    offsets = column.offsets.to_numpy().astype(np.int64)
    start, stop = int(offsets[0]), int(offsets[-1])
    return offsets - start, column.values.slice(start, stop - start).to_numpy()


# ----------------------------------------------------------------------------- 2. structure


class _Piece(NamedTuple):
    """A stretch of a token stream. tokens: (k,); doc_ids: (k,) int64 dense; ``where(i)`` names position i."""

    tokens: np.ndarray
    doc_ids: np.ndarray
    where: Callable[[int], str]


class _Structure:
    """Checks blocks in global order and carries what spans them (last doc id, counts)."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        self.context_length = manifest["context_length"]
        self.pad_token = manifest["pad_token"]
        self.num_chunks = sum(entry["num_chunks"] for entry in manifest["files"])
        self.next_chunk = 0
        self.last_doc_id = -1
        self.last_split_id = -1
        self.num_tokens = self.num_padding = self.num_split = self.num_segments = 0

    def pieces(self, block: _Block) -> Sequence[_Piece]:
        """Check one block; return the stream pieces it completes (concat: exactly its own)."""
        return (self.check(block),)

    def flush(self) -> Sequence[_Piece]:
        """Pieces still held back after the last block (concat: none)."""
        return ()

    def check(self, block: _Block) -> _Piece:
        """Check one block; return its non-padding tokens with their dense doc ids."""
        self._check_chunk_indices(block)
        self._check_lengths(block)
        num_real = self._check_padding(block)
        ids = block.segment_doc_ids[:num_real]
        previous = np.concatenate([[self.last_doc_id], ids[:-1]])
        is_first = np.zeros(num_real, dtype=bool)
        is_first[block.segment_offsets[:-1][block.segment_offsets[:-1] < num_real]] = True
        self._check_order(block, ids, previous, is_first)
        num_pad = int(block.segment_lengths[num_real:].sum())
        self._count(block, ids, ids[(ids == previous) & is_first], num_pad)
        tokens = block.input_ids.reshape(-1)[: block.input_ids.size - num_pad]
        dense = np.repeat(ids, block.segment_lengths[:num_real])
        first_position = int(block.chunk_indices[0]) * self.context_length
        return _Piece(tokens, dense, lambda i: self._where(block, first_position + i))

    def _where(self, block: _Block, position: int) -> str:
        c = self.context_length
        return f"output chunk {position // c} position {position % c} ({posixpath.basename(block.path)})"

    def _row_label(self, block: _Block, row: int) -> str:
        return f"{block.path} row {block.first_row + row} (chunk {self.next_chunk + row})"

    def _check_chunk_indices(self, block: _Block) -> None:
        expected = np.arange(self.next_chunk, self.next_chunk + block.chunk_indices.size, dtype=np.int64)
        if not np.array_equal(block.chunk_indices, expected):
            row = int(np.argmax(block.chunk_indices != expected))
            raise VerifyError(f"{block.path} row {block.first_row + row}: chunk_index="
                              f"{int(block.chunk_indices[row])}, expected {int(expected[row])}")

    def _check_lengths(self, block: _Block) -> None:
        lengths = block.segment_lengths
        if lengths.size and lengths.min() < 1:
            k = int(np.argmax(lengths < 1))
            row = _row_of_segment(block, k)
            raise VerifyError(f"{self._row_label(block, row)}: segment {k - int(block.segment_offsets[row])} has "
                              f"length {int(lengths[k])}; segment lengths must be >= 1")
        ends = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=ends[1:])
        sums = np.diff(ends[block.segment_offsets])
        if (sums != self.context_length).any():
            row = int(np.argmax(sums != self.context_length))
            raise VerifyError(f"{self._row_label(block, row)}: segment lengths sum to {int(sums[row])}, "
                              f"expected the context length {self.context_length}")

    def _check_padding(self, block: _Block) -> int:
        """Raise unless padding is only the last segment of the last chunk; return non-padding segments."""
        ids = block.segment_doc_ids
        negative = ids < 0
        if not negative.any():
            return ids.size
        k = int(np.argmax(negative))
        row = _row_of_segment(block, k)
        place = self._where(block, (self.next_chunk + row) * self.context_length + _segment_start(block, k, row))
        if ids[k] != -1:
            raise VerifyError(f"{place}: doc id {int(ids[k])} is negative; doc ids are >= 0 and -1 marks padding")
        last_chunk = self.next_chunk + row == self.num_chunks - 1
        if k != ids.size - 1 or not last_chunk:
            raise VerifyError(f"{place}: padding (doc id -1) in chunk {self.next_chunk + row} segment "
                              f"{k - int(block.segment_offsets[row])}; padding may only be the last segment "
                              f"of the last chunk ({self.num_chunks - 1})")
        if k == block.segment_offsets[row]:
            raise VerifyError(f"{place}: chunk {self.next_chunk + row} is all padding; only the last chunk's "
                              "end may be padded")
        self._check_pad_tokens(block, place, int(block.segment_lengths[k]))
        return k

    def _check_pad_tokens(self, block: _Block, place: str, num_pad: int) -> None:
        pads = block.input_ids[-1, self.context_length - num_pad:]
        if (pads != self.pad_token).any():
            i = int(np.argmax(pads != self.pad_token))
            chunk = int(block.chunk_indices[-1])
            raise VerifyError(f"output chunk {chunk} position {self.context_length - num_pad + i} "
                              f"({posixpath.basename(block.path)}): padding token {int(pads[i])}, "
                              f"expected pad_token {self.pad_token}")

    def _check_order(self, block: _Block, ids: np.ndarray, previous: np.ndarray, is_first: np.ndarray) -> None:
        """Strictly increasing, except a chunk's first segment may repeat the previous segment's id."""
        bad = (ids < previous) | ((ids == previous) & ~is_first)
        if bad.any():
            k = int(np.argmax(bad))
            row = _row_of_segment(block, k)
            position = (self.next_chunk + row) * self.context_length + _segment_start(block, k, row)
            raise VerifyError(f"{self._where(block, position)}: segment doc id {int(ids[k])} follows doc id "
                              f"{int(previous[k])}; doc ids must increase along the output (a repeat is "
                              "allowed only as a chunk's first segment, continuing the previous chunk's last document)")

    def _count(self, block: _Block, ids: np.ndarray, repeats: np.ndarray, num_pad: int) -> None:
        """Advance the counts. A split document is one repeated across >= 1 chunk boundary, counted once."""
        if repeats.size:
            self.num_split += int(np.count_nonzero(repeats != np.concatenate([[self.last_split_id], repeats[:-1]])))
            self.last_split_id = int(repeats[-1])
        self.num_tokens += block.input_ids.size - num_pad
        self.num_padding += num_pad
        self.num_segments += block.segment_doc_ids.size
        if ids.size:
            self.last_doc_id = int(ids[-1])
        self.next_chunk += block.chunk_indices.size

    def finish(self, manifest: dict[str, Any], where: str) -> None:
        """The manifest's counts against what was read; ``where`` names the manifest."""
        counts = manifest["counts"]
        found = {"chunks": self.next_chunk, "tokens": self.num_tokens,
                 "padding_positions": self.num_padding, "split_documents": self.num_split}
        for key, value in found.items():
            if counts[key] != value:
                raise VerifyError(f"{where}: counts.{key}={counts[key]} but the chunk files hold {value}")
        if counts["documents"] < self.last_doc_id + 1:
            raise VerifyError(f"{where}: counts.documents={counts['documents']} but the output holds doc id "
                              f"{self.last_doc_id}; documents must be >= max doc id + 1 = {self.last_doc_id + 1}")


def _row_of_segment(block: _Block, k: int) -> int:
    return int(np.searchsorted(block.segment_offsets, k, side="right")) - 1


def _segment_start(block: _Block, k: int, row: int) -> int:
    """Position of segment ``k`` inside its chunk ``row``."""
    first = int(block.segment_offsets[row])
    return int(block.segment_lengths[first:k].sum())


def _output_pieces(fs: pafs.FileSystem, base: str, manifest: dict[str, Any], structure: _Structure,
                   batch_chunks: int) -> Iterator[_Piece]:
    """The output's non-padding stream, checked block by block; the counts are checked at its end."""
    for entry in manifest["files"]:
        for block in _iter_blocks(fs, base, entry, manifest, batch_chunks):
            yield from structure.pieces(block)
    yield from structure.flush()
    structure.finish(manifest, posixpath.join(base, MANIFEST_NAME))


# ----------------------------------------------------------------------------- 2. best_fit structure


class _Part(NamedTuple):
    """Consecutive chunks held back until their window is complete (copies, not file views).

    windows: (n,) global window id per chunk. tokens: (n, C), or None when inputs are not compared.
    """

    first_chunk: int
    windows: np.ndarray
    segment_counts: np.ndarray
    segment_doc_ids: np.ndarray
    segment_lengths: np.ndarray
    tokens: np.ndarray | None


class _Segments(NamedTuple):
    """Per segment of some consecutive chunks: its chunk row, global chunk, start inside the chunk."""

    rows: np.ndarray
    chunks: np.ndarray
    starts: np.ndarray
    is_first: np.ndarray
    is_last: np.ndarray


def _segment_places(first_chunk: int, counts: np.ndarray, lengths: np.ndarray, c: int) -> _Segments:
    """Where each segment is, given segments per chunk (each chunk's lengths summing to ``c``)."""
    rows = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    starts = np.cumsum(lengths, dtype=np.int64) - lengths - rows * c
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    is_first = np.zeros(lengths.size, dtype=bool)
    is_last = np.zeros(lengths.size, dtype=bool)
    is_first[offsets[:-1][counts > 0]] = True
    is_last[offsets[1:][counts > 0] - 1] = True
    return _Segments(rows, rows + first_chunk, starts, is_first, is_last)


class _BestFitStructure(_Structure):
    """best_fit: per-chunk checks on each block, per-window checks once a window's chunks are read.

    A window's chunks are held back (segments; tokens too when ``keep_tokens``) until a chunk of a
    later window, or the end, shows the window is complete; then its documents are checked and,
    put back in doc id order, handed on as one piece of the stream compared with the inputs.
    """

    def __init__(self, manifest: dict[str, Any], *, keep_tokens: bool) -> None:
        super().__init__(manifest)
        self.window = manifest["best_fit_window"]
        self.keep_tokens = keep_tokens
        files = manifest["files"]
        self._file_first = np.array([f["first_chunk"] for f in files], dtype=np.int64)
        self._file_names = [f["path"] for f in files]
        shards = manifest["shards"]
        self._shard_paths = [e["path"] for e in shards]
        self._doc_offsets = np.array([e["doc_offset"] for e in shards], dtype=np.int64)
        self._shard_docs = np.array([e["num_docs"] for e in shards], dtype=np.int64)
        self._shard_first = np.array([e["first_chunk"] for e in shards], dtype=np.int64)
        self._shard_chunks = np.array([e["num_chunks"] for e in shards], dtype=np.int64)
        self._recorded_tokens = np.array([e["num_tokens"] for e in shards], dtype=np.int64)
        self._shard_tokens = np.zeros(len(shards), dtype=np.int64)
        n = self.window
        windows = -(-self._shard_docs // n) if n else (self._shard_docs > 0).astype(np.int64)
        self._window_base = np.concatenate([[0], np.cumsum(windows)[:-1]]).astype(np.int64)
        self._total_docs = int(self._shard_docs.sum())
        self.last_window = -1
        self._pending: list[_Part] = []

    # --------------------------------------------------------------- naming places

    def _place(self, chunk: int, position: int) -> str:
        k = int(np.searchsorted(self._file_first, chunk, side="right")) - 1
        return f"output chunk {chunk} position {position} ({self._file_names[k]} row {chunk - int(self._file_first[k])})"

    def _shard_of_docs(self, doc_ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._doc_offsets, doc_ids, side="right") - 1

    def _windows_of(self, doc_ids: np.ndarray) -> np.ndarray:
        """Global window id of each doc id (ids within the shards)."""
        shard = self._shard_of_docs(doc_ids)
        local = (doc_ids - self._doc_offsets[shard]) // self.window if self.window else 0
        return self._window_base[shard] + local

    def _doc(self, doc_id: int) -> str:
        k = int(self._shard_of_docs(np.int64(doc_id)))
        if not 0 <= doc_id < self._total_docs:
            return f"doc id {doc_id} (in no shard: they hold doc ids 0..{self._total_docs - 1})"
        return f"doc id {doc_id} (shard {k} {self._shard_paths[k]} row {doc_id - int(self._doc_offsets[k])})"

    def _window_rows(self, w: int) -> tuple[int, int, int]:
        """(shard, first row, end row) of global window ``w``."""
        k = int(np.searchsorted(self._window_base, w, side="right")) - 1
        j = w - int(self._window_base[k])
        docs = int(self._shard_docs[k])
        return (k, j * self.window, min((j + 1) * self.window, docs)) if self.window else (k, 0, docs)

    def _window_label(self, w: int) -> str:
        k, r0, r1 = self._window_rows(w)
        off = int(self._doc_offsets[k])
        return (f"window {(r0 // self.window) if self.window else 0} of shard {k} ({self._shard_paths[k]} rows "
                f"{r0}..{r1 - 1}, doc ids {off + r0}..{off + r1 - 1}; best_fit_window={self.window})")

    def _chunk_shard_label(self, chunk: int) -> str:
        j = int(np.searchsorted(self._shard_first, chunk, side="right")) - 1
        first, n = int(self._shard_first[j]), int(self._shard_chunks[j])
        return f"shard {j}'s chunk range {first}..{first + n - 1} ({self._shard_paths[j]})"

    # --------------------------------------------------------------- per block

    def pieces(self, block: _Block) -> Sequence[_Piece]:
        self._check_chunk_indices(block)
        self._check_lengths(block)
        segs = _segment_places(self.next_chunk, np.diff(block.segment_offsets), block.segment_lengths,
                               self.context_length)
        real = self._check_chunk_padding(block, segs)
        self._check_chunk_documents(block, segs, real)
        windows = self._check_shards_and_windows(block, segs, real)
        num_pad = int(block.segment_lengths[~real].sum())
        self.num_tokens += block.input_ids.size - num_pad
        self.num_padding += num_pad
        self.num_segments += block.segment_doc_ids.size
        if real.any():
            self.last_doc_id = max(self.last_doc_id, int(block.segment_doc_ids[real].max()))
        self.next_chunk += block.chunk_indices.size
        return self._advance(block, windows)

    def _check_chunk_padding(self, block: _Block, segs: _Segments) -> np.ndarray:
        """Padding only as a chunk's last segment, never alone, holding pad_token; return the non-padding mask."""
        ids, c = block.segment_doc_ids, self.context_length
        if (ids < -1).any():
            k = int(np.argmax(ids < -1))
            raise VerifyError(f"{self._place(int(segs.chunks[k]), int(segs.starts[k]))}: doc id {int(ids[k])} is "
                              "negative; doc ids are >= 0 and -1 marks padding")
        pad = ids == -1
        inside = pad & ~segs.is_last
        if inside.any():
            k = int(np.argmax(inside))
            chunk, row = int(segs.chunks[k]), int(segs.rows[k])
            num = int(block.segment_offsets[row + 1] - block.segment_offsets[row])
            raise VerifyError(f"{self._place(chunk, int(segs.starts[k]))}: padding (doc id -1) in chunk {chunk} "
                              f"segment {k - int(block.segment_offsets[row])} of {num}, before "
                              f"{self._doc(int(ids[k + 1]))}; a best_fit chunk holds its documents first and "
                              "padding only as its last segment")
        alone = pad & segs.is_first
        if alone.any():
            k = int(np.argmax(alone))
            raise VerifyError(f"{self._place(int(segs.chunks[k]), 0)}: chunk {int(segs.chunks[k])} is all padding "
                              "(doc id -1); best_fit never emits a chunk without a document")
        if pad.any():
            wrong = np.repeat(pad, block.segment_lengths).reshape(-1, c) & (block.input_ids != self.pad_token)
            if wrong.any():
                row, position = divmod(int(np.argmax(wrong)), c)
                raise VerifyError(f"{self._place(self.next_chunk + row, position)}: doc id -1 (padding) holds token "
                                  f"{int(block.input_ids[row, position])}, expected pad_token {self.pad_token}")
        return ~pad

    def _check_chunk_documents(self, block: _Block, segs: _Segments, real: np.ndarray) -> None:
        """Inside each chunk: no doc id twice, doc ids increasing."""
        ids = block.segment_doc_ids
        index = np.flatnonzero(real)
        by_chunk = index[np.lexsort((ids[index], segs.rows[index]))]
        same = (segs.rows[by_chunk[1:]] == segs.rows[by_chunk[:-1]]) & (ids[by_chunk[1:]] == ids[by_chunk[:-1]])
        if same.any():
            j = int(np.argmax(same))
            a, b = sorted((int(by_chunk[j]), int(by_chunk[j + 1])))
            chunk = int(segs.chunks[b])
            raise VerifyError(f"{self._place(chunk, int(segs.starts[b]))}: {self._doc(int(ids[b]))} appears twice in "
                              f"chunk {chunk} (segments at positions {int(segs.starts[a])} and {int(segs.starts[b])}); "
                              "a best_fit chunk holds each document at most once")
        previous = np.concatenate([[-1], ids[:-1]])
        bad = real & ~segs.is_first & (ids < previous)
        if bad.any():
            k = int(np.argmax(bad))
            chunk = int(segs.chunks[k])
            raise VerifyError(f"{self._place(chunk, int(segs.starts[k]))}: segment {self._doc(int(ids[k]))} follows "
                              f"doc id {int(previous[k])} in chunk {chunk}; a best_fit chunk lays out its documents in "
                              "increasing doc id order")

    def _check_shards_and_windows(self, block: _Block, segs: _Segments, real: np.ndarray) -> np.ndarray:
        """Doc ids in the chunk's shard and all in one window; windows never go back. Return each chunk's window."""
        ids = block.segment_doc_ids
        beyond = real & (ids >= self._total_docs)
        if beyond.any():
            k = int(np.argmax(beyond))
            raise VerifyError(f"{self._place(int(segs.chunks[k]), int(segs.starts[k]))}: doc id {int(ids[k])} is in no "
                              f"shard; the shards hold counts.documents={self._total_docs} documents (doc ids "
                              f"0..{self._total_docs - 1})")
        index = np.flatnonzero(real)
        real_ids = ids[index]
        doc_shard = self._shard_of_docs(real_ids)
        chunk_shard = np.searchsorted(self._shard_first, segs.chunks[index], side="right") - 1
        if (doc_shard != chunk_shard).any():
            k = int(index[np.argmax(doc_shard != chunk_shard)])
            chunk = int(segs.chunks[k])
            raise VerifyError(f"{self._place(chunk, int(segs.starts[k]))}: {self._doc(int(ids[k]))} is in chunk "
                              f"{chunk}, which lies in {self._chunk_shard_label(chunk)}; a shard's chunks hold only "
                              "its own documents (windows never span shards)")
        windows = np.full(ids.size, -1, dtype=np.int64)
        windows[index] = self._windows_of(real_ids)
        chunk_windows = windows[block.segment_offsets[:-1]]  # every chunk starts with a document
        mixed = real & (windows != chunk_windows[segs.rows])
        if mixed.any():
            k = int(np.argmax(mixed))
            chunk, first = int(segs.chunks[k]), int(ids[block.segment_offsets[segs.rows[k]]])
            raise VerifyError(f"{self._place(chunk, int(segs.starts[k]))}: {self._doc(int(ids[k]))} is in "
                              f"{self._window_label(int(windows[k]))}, but chunk {chunk} also holds {self._doc(first)} "
                              f"of {self._window_label(int(chunk_windows[segs.rows[k]]))}; a best_fit chunk holds "
                              "documents of one window")
        previous = np.concatenate([[self.last_window], chunk_windows[:-1]])
        back = chunk_windows < previous
        if back.any():
            row = int(np.argmax(back))
            chunk = self.next_chunk + row
            first = int(ids[block.segment_offsets[row]])
            raise VerifyError(f"{self._place(chunk, 0)}: {self._doc(first)} of {self._window_label(int(chunk_windows[row]))} "
                              f"comes after chunk {chunk - 1}, which holds {self._window_label(int(previous[row]))}; "
                              "windows are packed one after another, each into its own consecutive chunks")
        if chunk_windows.size:
            self.last_window = int(chunk_windows[-1])
        return chunk_windows

    def _advance(self, block: _Block, windows: np.ndarray) -> list[_Piece]:
        """Hold back the block's last window; check (and return the pieces of) the windows it completes."""
        n = windows.size
        if n == 0:
            return []
        last_start = int(np.searchsorted(windows, windows[-1]))  # windows never decrease along the chunks
        done: list[_Part] = []
        if self._pending and (last_start > 0 or self._pending[-1].windows[-1] < windows[0]):
            done, self._pending = self._pending, []
        if last_start > 0:
            done.append(self._part(block, 0, last_start, windows))
        self._pending.append(self._part(block, last_start, n, windows))
        piece = self._check_windows(done) if done else None
        return [piece] if piece is not None else []

    def _part(self, block: _Block, start: int, stop: int, windows: np.ndarray) -> _Part:
        lo, hi = int(block.segment_offsets[start]), int(block.segment_offsets[stop])
        return _Part(int(block.chunk_indices[start]), windows[start:stop].copy(),
                     np.diff(block.segment_offsets[start:stop + 1]), block.segment_doc_ids[lo:hi].copy(),
                     block.segment_lengths[lo:hi].copy(),
                     block.input_ids[start:stop].copy() if self.keep_tokens else None)

    def flush(self) -> Sequence[_Piece]:
        done, self._pending = self._pending, []
        piece = self._check_windows(done) if done else None
        return [piece] if piece is not None else []

    # --------------------------------------------------------------- per window

    def _check_windows(self, parts: list[_Part]) -> _Piece | None:
        """Check complete windows (consecutive chunks); return their tokens in doc id order (if kept)."""
        c = self.context_length
        first_chunk = parts[0].first_chunk
        windows = np.concatenate([p.windows for p in parts])
        counts = np.concatenate([p.segment_counts for p in parts])
        ids = np.concatenate([p.segment_doc_ids for p in parts])
        lengths = np.concatenate([p.segment_lengths for p in parts]).astype(np.int64)
        segs = _segment_places(first_chunk, counts, lengths, c)
        real = ids >= 0
        # documents, segments of one document in chunk order (segments are in chunk order)
        ids, lengths, chunks, starts = ids[real], lengths[real], segs.chunks[real], segs.starts[real]
        order = np.argsort(ids, kind="stable")
        doc_ids, doc_lengths = ids[order], lengths[order]
        new_doc = np.ones(doc_ids.size, dtype=bool)
        new_doc[1:] = doc_ids[1:] != doc_ids[:-1]
        doc_first = np.flatnonzero(new_doc)
        docs, totals = doc_ids[doc_first], np.add.reduceat(doc_lengths, doc_first) if doc_ids.size else doc_lengths
        self._check_document_pieces(order, new_doc, doc_ids, doc_lengths, totals, chunks, starts)
        self.num_split += int(np.count_nonzero(totals > c))
        self._check_best_fit(windows, first_chunk, segs.rows[real], ids, lengths, starts, docs, totals)
        if not self.keep_tokens:
            return None
        return self._doc_order_piece(parts, first_chunk, order, doc_ids, doc_lengths, chunks, starts)

    def _check_document_pieces(self, order: np.ndarray, new_doc: np.ndarray, doc_ids: np.ndarray,
                               doc_lengths: np.ndarray, totals: np.ndarray, chunks: np.ndarray,
                               starts: np.ndarray) -> None:
        """In chunk order, every segment of a document but its last is a full chunk of C tokens."""
        c = self.context_length
        last = np.ones(doc_ids.size, dtype=bool)
        last[:-1] = new_doc[1:]
        bad = ~last & (doc_lengths != c)
        if not bad.any():
            return
        j = int(np.argmax(bad))
        here, there = int(order[j]), int(order[j + 1])
        total = int(totals[np.cumsum(new_doc)[j] - 1])
        place = self._place(int(chunks[here]), int(starts[here]))
        then = f"chunk {int(chunks[there])} position {int(starts[there])}"
        doc = self._doc(int(doc_ids[j]))
        if total <= c:
            raise VerifyError(f"{place}: {doc} holds {total} <= C={c} tokens but is cut: {int(doc_lengths[j])} of "
                              f"them here, {int(doc_lengths[j + 1])} in {then}; best_fit never cuts a document that "
                              "fits one chunk")
        raise VerifyError(f"{place}: {doc} holds {total} > C={c} tokens; its segment here holds {int(doc_lengths[j])} "
                          f"tokens and another follows in {then}: a document longer than C is its full {c}-token "
                          f"pieces, then its remainder of {total % c or c} tokens, in chunk order")

    def _check_best_fit(self, windows: np.ndarray, first_chunk: int, rows: np.ndarray, ids: np.ndarray,
                        lengths: np.ndarray, starts: np.ndarray, docs: np.ndarray, totals: np.ndarray) -> None:
        """Per window, best-fit decreasing over its document lengths gives its chunks, fills and segments.

        ``windows``: per chunk of the group. ``rows``/``ids``/``lengths``/``starts``: its document
        segments in chunk order (rows from 0). ``docs``/``totals``: its documents, sorted, and their lengths.
        best_fit_decreasing runs once per window, except for windows of one piece or whose pieces all
        exceed C/2 (one chunk each, longest first): those, and every comparison, are vectorised.
        """
        c = self.context_length
        bounds = np.flatnonzero(np.diff(windows)) + 1
        chunk_starts = np.concatenate([[0], bounds]).astype(np.int64)
        chunk_stops = np.concatenate([bounds, [windows.size]]).astype(np.int64)
        run_windows = windows[chunk_starts]
        items = split_items(totals, c)  # in stream order: each window's items are contiguous
        item_windows = self._windows_of(docs)[items.doc_index]
        item_starts = np.searchsorted(item_windows, run_windows)  # every window here holds a document
        item_counts = np.diff(np.append(item_starts, item_windows.size))
        run_of_item = np.repeat(np.arange(run_windows.size), item_counts)
        bins = np.empty(items.lengths.size, dtype=np.int64)
        num_bins = item_counts.copy()
        all_long = np.logical_and.reduceat(2 * items.lengths > c, item_starts) | (item_counts == 1)
        fast = np.flatnonzero(all_long[run_of_item])
        by_length = fast[np.lexsort((-items.lengths[fast], run_of_item[fast]))]  # stable: ties in stream order
        fast_counts = np.bincount(run_of_item[fast], minlength=run_windows.size)
        bins[by_length] = np.arange(by_length.size) - (np.cumsum(fast_counts) - fast_counts)[run_of_item[by_length]]
        for r in np.flatnonzero(~all_long).tolist():
            s0, s1 = int(item_starts[r]), int(item_starts[r] + item_counts[r])
            bins[s0:s1], num_bins[r] = best_fit_decreasing(items.lengths[s0:s1], c)
        found_chunks = chunk_stops - chunk_starts
        if (num_bins != found_chunks).any():
            r = int(np.argmax(num_bins != found_chunks))
            a, b = int(chunk_starts[r]), int(chunk_stops[r])
            tokens = int(items.lengths[item_starts[r]:item_starts[r] + item_counts[r]].sum())
            raise VerifyError(f"{self._place(first_chunk + a, 0)}: {self._window_label(int(run_windows[r]))} fills chunks "
                              f"{first_chunk + a}..{first_chunk + b - 1} ({b - a} chunks, {tokens} tokens), but best-fit "
                              f"decreasing packs its {int(item_counts[r])} pieces into {int(num_bins[r])}: not best-fit")
        expected_rows = chunk_starts[run_of_item] + bins
        found_fills = np.bincount(rows, weights=lengths, minlength=windows.size).astype(np.int64)
        expected_fills = np.bincount(expected_rows, weights=items.lengths, minlength=windows.size).astype(np.int64)
        if not np.array_equal(found_fills, expected_fills):
            i = int(np.argmax(found_fills != expected_fills))
            chunk = first_chunk + i
            raise VerifyError(f"{self._place(chunk, int(found_fills[i]))}: chunk {chunk} holds {int(found_fills[i])} "
                              f"tokens (doc ids {ids[rows == i].tolist()}) of {self._window_label(int(windows[i]))}; "
                              f"best-fit decreasing fills it with {int(expected_fills[i])}: not best-fit")
        order = np.argsort(expected_rows, kind="stable")  # by chunk, then doc id
        expected = (expected_rows[order], docs[items.doc_index[order]], items.lengths[order])
        found = (rows, ids, lengths)
        if any(not np.array_equal(f, e) for f, e in zip(found, expected)):
            m = min(rows.size, order.size)  # equal when every document passed _check_document_pieces
            differ = np.logical_or.reduce([f[:m] != e[:m] for f, e in zip(found, expected)])
            i = int(np.argmax(differ)) if differ.any() else m - 1
            raise VerifyError(f"{self._place(first_chunk + int(rows[i]), int(starts[i]))}: {self._doc(int(ids[i]))} "
                              f"({int(lengths[i])} tokens) is here, where best-fit decreasing over "
                              f"{self._window_label(int(windows[rows[i]]))} puts doc id {int(expected[1][i])} "
                              f"({int(expected[2][i])} tokens) in chunk {first_chunk + int(expected[0][i])}: not best-fit")
        self._shard_tokens += np.bincount(self._shard_of_docs(ids), weights=lengths,
                                          minlength=self._shard_tokens.size).astype(np.int64)

    def _doc_order_piece(self, parts: list[_Part], first_chunk: int, order: np.ndarray, doc_ids: np.ndarray,
                         doc_lengths: np.ndarray, chunks: np.ndarray, starts: np.ndarray) -> _Piece:
        """The windows' tokens in doc id order (a document's segments in chunk order), with dense doc ids."""
        c = self.context_length
        flat = np.concatenate([p.tokens for p in parts]).reshape(-1)
        sources = (chunks[order] - first_chunk) * c + starts[order]
        ends = np.cumsum(doc_lengths)
        targets = ends - doc_lengths
        gather = np.repeat(sources - targets, doc_lengths) + np.arange(int(ends[-1]) if ends.size else 0)
        segment_chunks, segment_starts = chunks[order], starts[order]

        def where(i: int) -> str:
            j = int(np.searchsorted(ends, i, side="right"))
            return self._place(int(segment_chunks[j]), int(segment_starts[j]) + i - int(targets[j]))

        return _Piece(flat[gather], np.repeat(doc_ids, doc_lengths), where)

    def finish(self, manifest: dict[str, Any], where: str) -> None:
        super().finish(manifest, where)
        wrong = self._shard_tokens != self._recorded_tokens
        if wrong.any():
            k = int(np.argmax(wrong))
            first, n = int(self._shard_first[k]), int(self._shard_chunks[k])
            raise VerifyError(f"{where}: shards[{k}] ({self._shard_paths[k]}): num_tokens={int(self._recorded_tokens[k])} "
                              f"but its chunks {first}..{first + n - 1} hold {int(self._shard_tokens[k])} tokens")


# ----------------------------------------------------------------------------- 3. inputs


class _Shard(NamedTuple):
    path: str
    format: str
    recorded: dict[str, Any] | None
    """The manifest's entry for this shard, when the inputs are the manifest's shards."""


def _resolve_inputs(manifest: dict[str, Any], inputs: Sequence[str] | None, where: str) -> list[_Shard] | None:
    """The shards to compare with, or None to skip the comparison. ``where`` names the manifest.

    Default (``inputs`` None): the manifest's shards, but only absolute paths or URIs with a known
    shard suffix and no ``..`` (else InputError: pass --input), and only when all still exist.
    """
    recorded = manifest.get("shards") or []
    if inputs is None:
        if not recorded:
            log.info("verify: the manifest lists no shards; inputs not compared")
            return None
        for k, entry in enumerate(recorded):
            _check_default_input(entry, k, where)
        missing = [e["path"] for e in recorded if not _exists(e["path"])]
        if missing:
            log.warning("verify: %d of the manifest's shards are gone (e.g. %s); inputs not compared",
                        len(missing), missing[0])
            return None
        return [_Shard(e["path"], e.get("format") or shard_format(e["path"]), e) for e in recorded]
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs:
        return None
    paths = discover_shards(list(inputs))
    same = paths == [e["path"] for e in recorded]
    return [_Shard(p, shard_format(p), recorded[k] if same else None) for k, p in enumerate(paths)]


_SHARD_FORMATS = frozenset(SHARD_SUFFIXES.values())


def _check_default_input(entry: dict[str, Any], k: int, where: str) -> None:
    """Refuse to read a manifest's shard path unless it is an absolute local path or a URI with a
    known shard suffix and no ``..`` component, in a known format (the manifest is untrusted)."""
    path, fmt = entry["path"], entry.get("format")
    is_uri = "://" in path
    parts = (path.split("://", 1)[1] if is_uri else path).split("/")
    if (not (is_uri or os.path.isabs(path)) or ".." in parts or shard_format(path) is None
            or (fmt is not None and fmt not in _SHARD_FORMATS) or any(c in path for c in "\n\r\0")):
        raise InputError(f"{where}: shards[{k}]: path={path!r} (format={fmt!r}) is not an absolute path or URI of a "
                         f"shard file ({', '.join(SHARD_SUFFIXES)}) without '..'; verify does not read it: pass "
                         "the inputs with --input (or --no-inputs)")


def _exists(path: str) -> bool:
    try:
        fs, fs_path = resolve_filesystem(path)
        return fs.get_file_info(fs_path).type == pafs.FileType.File
    except (InputError, OSError, pa.ArrowException):
        return False


@dataclass
class _InputTotals:
    num_docs: int = 0
    """Documents in the shards read so far: the global id of the next shard's first document."""


def _input_pieces(shards: list[_Shard], column: str, totals: _InputTotals) -> Iterator[_Piece]:
    """The inputs' token stream, each token labelled with its document's global id."""
    for shard in shards:
        num_docs, num_tokens = 0, 0
        try:
            for first_row, lists in iter_token_batches(shard.path, shard.format, column, INPUT_BATCH_DOCS):
                tokens, lengths = flatten_documents(lists)
                doc_ids = np.arange(totals.num_docs + first_row, totals.num_docs + first_row + lengths.size)
                yield _Piece(tokens, np.repeat(doc_ids, lengths), _input_locator(shard.path, first_row, doc_ids, lengths))
                num_docs, num_tokens = first_row + lengths.size, num_tokens + tokens.size
        except InputError as e:
            raise VerifyError(f"input {e}") from e
        _check_recorded(shard, num_docs, num_tokens)
        totals.num_docs += num_docs


def _input_locator(path: str, first_row: int, doc_ids: np.ndarray, lengths: np.ndarray) -> Callable[[int], str]:
    def where(i: int) -> str:
        ends = np.cumsum(lengths)
        row = int(np.searchsorted(ends, i, side="right"))
        offset = i - (int(ends[row - 1]) if row else 0)
        return (f"input shard {path} row {first_row + row} (doc id {int(doc_ids[row])}, "
                f"token {offset} of {int(lengths[row])})")

    return where


def _check_recorded(shard: _Shard, num_docs: int, num_tokens: int) -> None:
    if shard.recorded is None:
        return
    recorded = (shard.recorded["num_docs"], shard.recorded["num_tokens"])
    if (num_docs, num_tokens) != recorded:
        raise VerifyError(f"input shard {shard.path}: holds {num_docs} documents / {num_tokens} tokens, the manifest "
                          f"recorded {recorded[0]} / {recorded[1]} at packing; it changed after packing")


class _Cursor:
    """Walks a stream of pieces; ``take(n)`` views the next n positions of the current piece."""

    def __init__(self, pieces: Iterator[_Piece]) -> None:
        self._pieces = pieces
        self.piece: _Piece | None = None
        self.offset = 0

    def current(self) -> _Piece | None:
        """The piece holding the next position (skipping empty ones), None at the end."""
        while self.piece is None or self.offset == self.piece.tokens.size:
            self.piece, self.offset = next(self._pieces, None), 0
            if self.piece is None:
                return None
        return self.piece

    def remaining(self) -> int:
        return self.piece.tokens.size - self.offset

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        start, self.offset = self.offset, self.offset + n
        return self.piece.tokens[start:self.offset], self.piece.doc_ids[start:self.offset]


def _compare_with_inputs(output: Iterator[_Piece], shards: list[_Shard], column: str, manifest: dict[str, Any],
                         manifest_path: str) -> None:
    """Walk the output and input streams together; raise at the first position where they differ."""
    totals = _InputTotals()
    found, expected = _Cursor(output), _Cursor(_input_pieces(shards, column, totals))
    while found.current() is not None and expected.current() is not None:
        n = min(found.remaining(), expected.remaining())
        start_found, start_expected = found.offset, expected.offset
        found_tokens, found_ids = found.take(n)
        expected_tokens, expected_ids = expected.take(n)
        bad = (found_ids != expected_ids) | (found_tokens != expected_tokens)
        if bad.any():
            i = int(np.argmax(bad))
            raise VerifyError(
                f"{found.piece.where(start_found + i)}: found doc id {int(found_ids[i])} token "
                f"{int(found_tokens[i])}; {expected.piece.where(start_expected + i)}: expected doc id "
                f"{int(expected_ids[i])} token {int(expected_tokens[i])}"
            )
    if found.current() is not None:
        raise VerifyError(f"{found.piece.where(found.offset)}: the output continues (doc id "
                          f"{int(found.piece.doc_ids[found.offset])}) but the inputs end there; tokens not conserved")
    if expected.current() is not None:
        raise VerifyError(f"{expected.piece.where(expected.offset)}: not in the output, which ends after "
                          f"{manifest['counts']['tokens']} tokens; tokens not conserved")
    if totals.num_docs != manifest["counts"]["documents"]:
        raise VerifyError(f"{manifest_path}: counts.documents={manifest['counts']['documents']} but the inputs "
                          f"hold {totals.num_docs} documents")
