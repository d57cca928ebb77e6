"""Audit a packed output directory against docs/FORMAT.md and, optionally, its inputs.

``verify_output(out, inputs)`` streams the output with bounded memory and stops at the FIRST
discrepancy, raising :class:`VerifyError` with a message naming it (file, chunk, position,
doc id, expected vs found). numpy and pyarrow only, no Ray; the output is read with plain
pyarrow, independently of ``raypack.reader``. Checks, in this order:

  1. Files. ``manifest.json`` is present, valid JSON, format version 1, with well-typed keys;
     the file list tiles chunks ``0..n-1`` contiguously, each named ``chunks-{first:012d}.arrow``;
     every listed file exists and no unlisted ``chunks-*.arrow`` does; each file's size and
     sha256 (hashed streaming) equal the manifest's; ``content_sha256`` is the sha256 of the
     files' digests, one per line, in order. Hashing comes first, so nothing below decodes a
     file whose bytes are not the ones the manifest vouches for.
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
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import numbers
import posixpath
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.core import flatten_documents
from raypack.errors import InputError
from raypack.output import FORMAT_VERSION, MANIFEST_NAME, chunk_file_name, content_sha256
from raypack.readers import iter_token_batches
from raypack.shards import discover_shards, resolve_filesystem, shard_format

__all__ = ["INPUT_BATCH_DOCS", "VerifyError", "VerifyReport", "verify_output"]

log = logging.getLogger(__name__)

INPUT_BATCH_DOCS = 2048
"""Input documents read per batch when comparing with the inputs."""
HASH_BLOCK_BYTES = 8 << 20
"""Bytes read at a time when hashing a chunk file."""
COUNT_KEYS = ("documents", "tokens", "chunks", "padding_positions", "split_documents")
FILE_KEYS = ("path", "first_chunk", "num_chunks", "num_bytes", "sha256")
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

    def lines(self) -> list[str]:
        rate = self.num_tokens / self.seconds if self.seconds > 0 else 0.0
        inputs = (f"{self.num_shards} shard(s), {self.num_documents:,} documents: unpack(pack(x)) == x"
                  if self.inputs_compared else "not compared")
        return [
            f"verified {self.output}",
            f"  files            {self.num_files:>14,}  ({self.num_bytes:,} bytes, sha256 ok)",
            f"  chunks           {self.num_chunks:>14,}  of {self.context_length} tokens",
            f"  tokens           {self.num_tokens:>14,}",
            f"  padding          {self.num_padding_positions:>14,}",
            f"  documents        {self.num_documents:>14,}",
            f"  split documents  {self.num_split_documents:>14,}",
            f"  inputs           {inputs}",
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
    None compares with the manifest's shards when every one of them still exists, ``[]`` skips
    the comparison. token_column: the inputs' token column (default: the manifest's config, else
    ``input_ids``). batch_chunks: chunks decoded at a time (bounds memory).
    Raises InputError for unusable arguments (an input path that does not exist).
    """
    start = time.perf_counter()
    if isinstance(batch_chunks, bool) or not isinstance(batch_chunks, int) or batch_chunks < 1:
        raise ValueError(f"batch_chunks={batch_chunks!r} must be an integer >= 1")
    fs, base = resolve_filesystem(out)
    manifest = _load_manifest(fs, base, out)
    num_bytes = _check_files(fs, base, manifest)
    shards = _resolve_inputs(manifest, inputs)
    structure = _Structure(manifest)
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
        seconds=time.perf_counter() - start,
    )


# ----------------------------------------------------------------------------- 1. manifest


def _load_manifest(fs: pafs.FileSystem, base: str, out: str) -> dict[str, Any]:
    path = posixpath.join(base, MANIFEST_NAME)
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        if fs.get_file_info(base).type != pafs.FileType.Directory:
            raise VerifyError(f"{out}: no such output directory")
        raise VerifyError(f"{out}: no {MANIFEST_NAME}; the output is incomplete (the job did not finish)")
    try:
        with fs.open_input_stream(path) as f:
            manifest = json.loads(f.read())
    except (OSError, pa.ArrowException) as e:
        raise VerifyError(f"{path}: unreadable ({e})") from e
    except ValueError as e:
        raise VerifyError(f"{path}: not valid JSON ({e})") from e
    _check_manifest(manifest, path)
    return manifest


def _check_manifest(manifest: Any, where: str) -> None:
    if not isinstance(manifest, dict):
        raise VerifyError(f"{where}: expected a JSON object, found {type(manifest).__name__}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise VerifyError(f"{where}: format_version={manifest.get('format_version')!r}, expected {FORMAT_VERSION}")
    _int_field(manifest, "context_length", where, minimum=1)
    _int_field(manifest, "pad_token", where, minimum=None)
    if not _is_integer_dtype(manifest.get("token_dtype")):
        raise VerifyError(f"{where}: token_dtype={manifest.get('token_dtype')!r} is not an integer dtype")
    counts = manifest.get("counts")
    if not isinstance(counts, dict):
        raise VerifyError(f"{where}: counts={counts!r}, expected an object with {', '.join(COUNT_KEYS)}")
    for key in COUNT_KEYS:
        _int_field(counts, key, f"{where}: counts", minimum=0)
    if not isinstance(manifest.get("content_sha256"), str):
        raise VerifyError(f"{where}: content_sha256={manifest.get('content_sha256')!r}, expected a hex digest")
    _check_file_entries(manifest.get("files"), where)
    _check_shard_entries(manifest, where)


def _int_field(obj: dict[str, Any], key: str, where: str, *, minimum: int | None) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise VerifyError(f"{where}: {key}={value!r}, expected an integer")
    if minimum is not None and value < minimum:
        raise VerifyError(f"{where}: {key}={value}, expected >= {minimum}")
    return int(value)


def _is_integer_dtype(name: Any) -> bool:
    try:
        return isinstance(name, str) and np.dtype(name).kind in "iu"
    except TypeError:
        return False


def _check_file_entries(files: Any, where: str) -> None:
    """Entries well-typed, tiling chunks 0..n-1 in order, each named after its first chunk."""
    if not isinstance(files, list):
        raise VerifyError(f"{where}: files={files!r}, expected a list")
    next_chunk = 0
    for k, entry in enumerate(files):
        if not isinstance(entry, dict) or any(key not in entry for key in FILE_KEYS):
            raise VerifyError(f"{where}: files[{k}]={entry!r} lacks one of {', '.join(FILE_KEYS)}")
        label = f"{where}: files[{k}] ({entry['path']!r})"
        first = _int_field(entry, "first_chunk", label, minimum=0)
        _int_field(entry, "num_chunks", label, minimum=1)
        _int_field(entry, "num_bytes", label, minimum=0)
        if first != next_chunk:
            raise VerifyError(f"{label}: first_chunk={first}, expected {next_chunk}; the files must "
                              "cover the chunks contiguously from 0, in order")
        if entry["path"] != chunk_file_name(first):
            raise VerifyError(f"{label}: expected the name {chunk_file_name(first)!r} (chunks-{{first_chunk:012d}}.arrow)")
        if not isinstance(entry["sha256"], str):
            raise VerifyError(f"{label}: sha256={entry['sha256']!r}, expected a hex digest")
        next_chunk += entry["num_chunks"]


def _check_shard_entries(manifest: dict[str, Any], where: str) -> None:
    """Optional ``shards``: well-typed, offsets the cumulative sums, totals equal to counts."""
    shards = manifest.get("shards")
    if shards is None:
        return
    if not isinstance(shards, list):
        raise VerifyError(f"{where}: shards={shards!r}, expected a list")
    docs = tokens = 0
    for k, entry in enumerate(shards):
        label = f"{where}: shards[{k}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise VerifyError(f"{label}={entry!r} lacks a path")
        for key, expected in (("doc_offset", docs), ("token_offset", tokens)):
            if _int_field(entry, key, label, minimum=0) != expected:
                raise VerifyError(f"{label} ({entry['path']}): {key}={entry[key]}, expected {expected} "
                                  "(the sum over earlier shards)")
        docs += _int_field(entry, "num_docs", label, minimum=0)
        tokens += _int_field(entry, "num_tokens", label, minimum=0)
    counts = manifest["counts"]
    for key, total in (("documents", docs), ("tokens", tokens)):
        if shards and counts[key] != total:
            raise VerifyError(f"{where}: counts.{key}={counts[key]} but its shards list {total} {key} in all")


# ----------------------------------------------------------------------------- 1. files and hashes


def _check_files(fs: pafs.FileSystem, base: str, manifest: dict[str, Any]) -> int:
    """Listed files present, none unlisted, sizes and sha256 as recorded; return the total bytes."""
    present = {posixpath.basename(i.path): i for i in fs.get_file_info(pafs.FileSelector(base))
               if i.type == pafs.FileType.File}
    files = manifest["files"]
    for entry in files:
        if entry["path"] not in present:
            last = entry["first_chunk"] + entry["num_chunks"] - 1
            raise VerifyError(f"{posixpath.join(base, entry['path'])}: missing (the manifest lists it for "
                              f"chunks {entry['first_chunk']}..{last})")
    listed = {entry["path"] for entry in files}
    unlisted = sorted(n for n in present if fnmatch.fnmatchcase(n, "chunks-*.arrow") and n not in listed)
    if unlisted:
        raise VerifyError(f"{posixpath.join(base, unlisted[0])}: a chunk file the manifest does not list "
                          f"({len(unlisted)} unlisted in all); it is not part of this output")
    for entry in files:
        _check_file_bytes(fs, posixpath.join(base, entry["path"]), entry, present[entry["path"]].size)
    expected = content_sha256(files)
    if manifest["content_sha256"] != expected:
        raise VerifyError(f"{posixpath.join(base, MANIFEST_NAME)}: content_sha256={manifest['content_sha256']}, "
                          f"expected {expected} (sha256 of the files' sha256 digests, one per line)")
    return sum(entry["num_bytes"] for entry in files)


def _check_file_bytes(fs: pafs.FileSystem, path: str, entry: dict[str, Any], size: int | None) -> None:
    if size is not None and size != entry["num_bytes"]:
        raise VerifyError(f"{path}: {size} bytes, the manifest says num_bytes={entry['num_bytes']} "
                          "(truncated or rewritten)")
    digest, num_bytes = _sha256(fs, path)
    if num_bytes != entry["num_bytes"]:
        raise VerifyError(f"{path}: read {num_bytes} bytes, the manifest says num_bytes={entry['num_bytes']}")
    if digest != entry["sha256"]:
        raise VerifyError(f"{path}: sha256 {digest} differs from the manifest's {entry['sha256']}; "
                          "the file's bytes changed after it was written")


def _sha256(fs: pafs.FileSystem, path: str) -> tuple[str, int]:
    """Hex sha256 and size of a file, read in HASH_BLOCK_BYTES blocks."""
    sha, num_bytes = hashlib.sha256(), 0
    with fs.open_input_stream(path) as f:
        while block := f.read(HASH_BLOCK_BYTES):
            sha.update(block)
            num_bytes += len(block)
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


def _iter_blocks(fs: pafs.FileSystem, path: str, entry: dict[str, Any], manifest: dict[str, Any],
                 batch_chunks: int) -> Iterator[_Block]:
    """Every row of one chunk file in ``batch_chunks``-row blocks, after schema and row-count checks."""
    source = pa.memory_map(path, "r") if isinstance(fs, pafs.LocalFileSystem) else fs.open_input_file(path)
    with source:
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
        path = posixpath.join(base, entry["path"])
        for block in _iter_blocks(fs, path, entry, manifest, batch_chunks):
            yield structure.check(block)
    structure.finish(manifest, posixpath.join(base, MANIFEST_NAME))


# ----------------------------------------------------------------------------- 3. inputs


class _Shard(NamedTuple):
    path: str
    format: str
    recorded: dict[str, Any] | None
    """The manifest's entry for this shard, when the inputs are the manifest's shards."""


def _resolve_inputs(manifest: dict[str, Any], inputs: Sequence[str] | None) -> list[_Shard] | None:
    """The shards to compare with, or None to skip the comparison."""
    recorded = manifest.get("shards") or []
    if inputs is None:
        if not recorded:
            log.info("verify: the manifest lists no shards; inputs not compared")
            return None
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
