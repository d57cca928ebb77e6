"""What an export reads: the documents of a tokenized corpus or of a concat packed output, in
global doc-id order, as parts (one per source shard) of whole documents. Pure numpy/pyarrow.

A source is opened once in the driver (:func:`open_source`: its manifest read and checked) and
then pickled to the processes that write the parts; :meth:`Source.batches` streams one part.

- Tokenized corpus (``raypack tokenize``'s output): part k is ``part-k.parquet``; each row of
  its ``input_ids`` column is one document.
- Packed output, strategy ``concat``: part k is the packed manifest's shard k, whose documents
  ``[doc_offset, doc_offset + num_docs)`` hold the global tokens ``[token_offset, token_offset +
  num_tokens)``. Document lengths come from the chunks' segments (a first pass over the small
  segment columns); a doc id that never appears is a document of zero tokens, kept as an
  empty document so that entry i of an export is document i. Padding (-1) lies after the last
  token and is never read.
- Packed output, strategy ``best_fit``: refused (documents are reordered across chunks); export
  the tokenized corpus or the pack's inputs instead.

A chunk exporter (``Exporter.unit == "chunks"``, e.g. MDS: one sample per chunk) reads a packed
output of any strategy as chunks instead: :meth:`Source.chunk_parts` (one :class:`ChunkPart` per
chunk file) and :meth:`Source.chunks`; the document totals stay the manifest's.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.inputs.parquet import open_parquet
from raypack.io.fs import error_text, resolve_filesystem
from raypack.packed.manifest import load_manifest
from raypack.packed.writer import MANIFEST_NAME
from raypack.rules.arrays import numpy_values
from raypack.rules.core import Chunks
from raypack.tokenize.corpus import TOKEN_COLUMN, TokenizedManifest, load_tokenized_manifest, tokenized_inputs

BATCH_TOKENS = 4 << 20
"""About this many tokens per :class:`DocumentBatch` (memory); a longer document is one batch."""


class DocumentBatch(NamedTuple):
    """Whole consecutive documents.

    tokens:   (T,) the source's token dtype, the documents end to end (may be a read-only view).
    doc_lens: (D,) int64, each document's length; sums to T. Zero-length documents included.
    """

    tokens: npt.NDArray[np.integer]
    doc_lens: npt.NDArray[np.int64]


class Part(NamedTuple):
    """One unit of parallel work: source shard ``index``, documents ``[doc_start, doc_end)``,
    global tokens ``[token_start, token_end)``."""

    index: int
    doc_start: int
    doc_end: int
    token_start: int
    token_end: int

    @property
    def num_docs(self) -> int:
        return self.doc_end - self.doc_start

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.token_start


class ChunkPart(NamedTuple):
    """One unit of parallel work of a chunk exporter: chunk file ``path`` (``index``-th holding
    chunks) of a packed output, global chunks ``[chunk_start, chunk_end)`` of ``context_length`` tokens."""

    index: int
    path: str
    chunk_start: int
    chunk_end: int
    context_length: int

    @property
    def num_chunks(self) -> int:
        return self.chunk_end - self.chunk_start

    @property
    def num_tokens(self) -> int:
        """Token positions, padding included: chunks x C."""
        return self.num_chunks * self.context_length


class Source:
    """A checked source: ``kind`` ("tokenized" or "packed"), its token dtype and its parts.

    Picklable (paths and numbers only); nothing is opened until :meth:`batches`. ``in_doc_order``
    is False for a packed output whose documents are reordered (best_fit): only its chunks are read."""

    def __init__(self, path: str, kind: str, token_dtype: np.dtype, parts: list[Part], files: list[str], *,
                 in_doc_order: bool = True, extra_columns: tuple[str, ...] = (), vocab_size: int | None = None) -> None:
        self.path, self.kind, self.token_dtype, self.parts, self.files = path, kind, token_dtype, parts, files
        self.in_doc_order = in_doc_order
        self.extra_columns = extra_columns
        """A packed output's side column names (raypack.rules.side_columns), which no export holds."""
        self.vocab_size = vocab_size
        """Its tokenizer's vocabulary size, where its manifest records the tokenizer (ids are below it)."""

    @property
    def num_docs(self) -> int:
        return self.parts[-1].doc_end if self.parts else 0

    @property
    def num_tokens(self) -> int:
        return self.parts[-1].token_end if self.parts else 0

    def batches(self, part: Part) -> Iterator[DocumentBatch]:
        """Part ``part``'s documents in order, as batches of about BATCH_TOKENS tokens."""
        if not self.in_doc_order:
            raise ValueError(f"{self.path}: its documents are reordered across chunks; read its chunks")
        if self.kind == "tokenized":
            return _parquet_batches(self.files[part.index], part)
        return _packed_batches(self.path, part)

    def chunk_parts(self) -> list[ChunkPart]:
        """A packed output's chunk files as parts, in order (reads the manifest, opens no chunk file)."""
        from raypack.outputs import read_packed

        if self.kind != "packed":
            raise ValueError(f"{self.path} is a {self.kind} source; only a packed output has chunks")
        with read_packed(self.path) as ds:
            return [ChunkPart(k, item["path"], item["first_chunk"], item["first_chunk"] + item["num_chunks"],
                              ds.context_length) for k, item in enumerate(ds.file_items())]

    def chunks(self, part: ChunkPart) -> Iterator[Chunks]:
        """Part ``part``'s chunks in order, one :class:`Chunks` view per record batch (the source's dtype)."""
        from raypack.outputs import read_packed

        with read_packed(self.path) as ds:
            yield from ds.pieces(part.chunk_start, part.chunk_end)


def open_source(path: str, unit: str = "documents") -> Source:
    """The source at ``path`` (a tokenized corpus or a packed output directory, local or URI), for an
    exporter reading ``unit`` ("documents" or "chunks").

    Reads the manifest only. Raises InputError for a path without a manifest, a best_fit output
    read as documents, or a manifest that fails its checks."""
    fs, base = resolve_filesystem(path)
    if fs.get_file_info(f"{base.rstrip('/')}/{MANIFEST_NAME}").type != pafs.FileType.File:
        kind = fs.get_file_info(base.rstrip("/") or "/").type
        what = ("does not exist" if kind == pafs.FileType.NotFound else
                "is a file, not an output directory" if kind == pafs.FileType.File else f"holds no {MANIFEST_NAME}")
        from raypack.pack.publish import work_kept

        unfinished = work_kept(path)
        fix = (f"an unfinished run's work is in {unfinished}: finish it with the run's own command and --resume, "
               "then export" if unfinished else
               "give the directory of a finished tokenized corpus (raypack tokenize) or packed output (raypack pack)")
        raise InputError(f"{path} {what}; {fix}")
    manifest = load_tokenized_manifest(path)
    if manifest is not None:
        return _tokenized_source(path, manifest)
    return _packed_source(path, unit)


def _tokenized_source(path: str, manifest: TokenizedManifest) -> Source:
    infos = tokenized_inputs([path], TOKEN_COLUMN)
    parts = _parts([(i.num_docs, i.num_tokens) for i in infos])
    dtype = manifest.token_dtype
    if dtype.name not in ("uint8", "uint16", "uint32", "int32", "int64"):
        raise InputError(f"{path}/{MANIFEST_NAME}: token_dtype {dtype.name!r} is not a token type; re-run raypack "
                         "tokenize")
    return Source(path, "tokenized", dtype, parts, [i.path for i in infos],
                  vocab_size=_vocab_size(manifest.tokenizer))


def _vocab_size(identity: Any) -> int | None:
    """A tokenizer record's ``vocab_size``, where it holds a positive int."""
    size = identity.get("vocab_size") if isinstance(identity, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _packed_source(path: str, unit: str) -> Source:
    manifest = load_manifest(path)
    strategy = manifest.strategy
    if not strategy.keeps_document_order and unit == "documents":
        shards = manifest.shards
        if any(s.get("format") == "text" for s in shards):  # pack --tokenizer: no tokenized corpus to export
            texts = list(dict.fromkeys(s["path"] for s in shards))
            named = ", ".join(texts[:2]) + (", ..." if len(texts) > 2 else "")
            raise InputError(f"{path} was packed with strategy {strategy.name}, which reorders documents across "
                             f"chunks, from text ({named}); raypack tokenize that text (the same --tokenizer and "
                             "--eos), then export the tokenized corpus")
        inputs = ", ".join(s["path"] for s in shards[:2]) + (", ..." if len(shards) > 2 else "")
        raise InputError(f"{path} was packed with strategy {strategy.name}, which reorders documents across chunks; "
                         f"export the tokenized corpus or the pack's inputs instead ({inputs})")
    parts = _parts([(s["num_docs"], s["num_tokens"]) for s in manifest.shards])
    return Source(path, "packed", manifest.token_dtype, parts, [], in_doc_order=strategy.keeps_document_order,
                  extra_columns=tuple(c.name for c in manifest.extra_columns),
                  vocab_size=_vocab_size(manifest.tokenizer_identity))


def _parts(counts: list[tuple[int, int]]) -> list[Part]:
    """One part per shard from (num_docs, num_tokens) in order, with running offsets."""
    parts, docs, tokens = [], 0, 0
    for k, (num_docs, num_tokens) in enumerate(counts):
        parts.append(Part(k, docs, docs + num_docs, tokens, tokens + num_tokens))
        docs, tokens = docs + num_docs, tokens + num_tokens
    return parts


# ----------------------------------------------------------------------------- tokenized corpus


def _parquet_batches(path: str, part: Part) -> Iterator[DocumentBatch]:
    """Rows of the part file's ``input_ids``, about BATCH_TOKENS tokens per batch (from its mean)."""
    fs, fs_path = resolve_filesystem(path)
    rows = max(1, BATCH_TOKENS * max(part.num_docs, 1) // max(part.num_tokens, 1))
    num_docs = 0
    try:
        with fs.open_input_file(fs_path) as f:
            for batch in open_parquet(f, path).iter_batches(batch_size=rows, columns=[TOKEN_COLUMN]):
                yield _list_batch(batch.column(0), path)
                num_docs += batch.num_rows
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{path}: unreadable ({error_text(e, 300)}); re-run raypack tokenize") from e
    if num_docs != part.num_docs:
        raise InputError(f"{path} holds {num_docs} documents, its manifest says {part.num_docs}; "
                         "re-run raypack tokenize")


def _list_batch(column: pa.ListArray, path: str) -> DocumentBatch:
    if column.null_count or column.values.null_count:
        raise InputError(f"{path}: {TOKEN_COLUMN} holds nulls; re-run raypack tokenize")
    offsets = numpy_values(column.offsets).astype(np.int64)
    tokens = numpy_values(column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])))
    return DocumentBatch(tokens, np.diff(offsets))


# ----------------------------------------------------------------------------- packed concat output


def _packed_batches(path: str, part: Part) -> Iterator[DocumentBatch]:
    """The part's documents read from the chunks: lengths from the segments, then the tokens in
    batches cut at document ends. Cost: one pass over the part's segments, one over its tokens."""
    from raypack.outputs import read_packed

    with read_packed(path) as ds:
        doc_lens = _packed_doc_lens(ds, part)
        doc_ends = np.cumsum(doc_lens)
        start_doc = 0
        while start_doc < doc_lens.size:
            start_token = int(doc_ends[start_doc - 1]) if start_doc else 0
            end_doc = max(start_doc + 1, int(np.searchsorted(doc_ends, start_token + BATCH_TOKENS, side="right")))
            tokens = _packed_tokens(ds, part.token_start + start_token, part.token_start + int(doc_ends[end_doc - 1]))
            yield DocumentBatch(tokens, doc_lens[start_doc:end_doc])
            start_doc = end_doc


def _chunk_range(ds: Any, token_start: int, token_end: int) -> tuple[int, int]:
    c = ds.context_length
    return token_start // c, -(-token_end // c)


def _packed_doc_lens(ds: Any, part: Part) -> npt.NDArray[np.int64]:
    """(num_docs,) int64: tokens of each of the part's documents, counted from the segments."""
    doc_lens = np.zeros(part.num_docs, dtype=np.int64)
    if not part.num_tokens:
        return doc_lens
    chunk_start, chunk_end = _chunk_range(ds, part.token_start, part.token_end)
    position = chunk_start * ds.context_length
    for piece in ds.pieces(chunk_start, chunk_end):
        ids, lens = piece.segment_doc_ids, piece.segment_lengths.astype(np.int64)
        ends = position + np.cumsum(lens)
        kept = np.clip(np.minimum(ends, part.token_end) - np.maximum(ends - lens, part.token_start), 0, None)
        inside = (kept > 0) & (ids >= 0)
        rel = ids[inside] - part.doc_start
        if rel.size and (rel.min() < 0 or rel.max() >= part.num_docs):
            raise InputError(f"{ds.path}: tokens [{part.token_start}, {part.token_end}) hold doc ids outside "
                             f"[{part.doc_start}, {part.doc_end}) (shard {part.index}); the output is damaged: rerun "
                             "the pack")
        doc_lens += np.bincount(rel, weights=kept[inside], minlength=part.num_docs).astype(np.int64)
        position += piece.num_chunks * ds.context_length
    if int(doc_lens.sum()) != part.num_tokens:
        raise InputError(f"{ds.path}: shard {part.index}'s segments hold {int(doc_lens.sum())} tokens, the manifest "
                         f"says {part.num_tokens}; the output is damaged: rerun the pack")
    return doc_lens


def _packed_tokens(ds: Any, token_start: int, token_end: int) -> npt.NDArray[np.integer]:
    """Global tokens ``[token_start, token_end)``: a view when they lie in one record batch, else a copy."""
    if token_end == token_start:
        return np.zeros(0, ds.token_dtype)
    chunk_start, chunk_end = _chunk_range(ds, token_start, token_end)
    flats = [piece.input_ids.reshape(-1) for piece in ds.pieces(chunk_start, chunk_end)]
    flat = flats[0] if len(flats) == 1 else np.concatenate(flats)
    offset = token_start - chunk_start * ds.context_length
    return flat[offset: offset + token_end - token_start]
