"""Megatron-Core's indexed dataset: ``PREFIX.bin`` and ``PREFIX.idx``, one entry per document.

``megatron.core.datasets.indexed_dataset.IndexedDataset(PREFIX)[i]`` is document i of the source
(global doc-id order), token for token; Megatron packs and shuffles at training time.

``PREFIX.bin``: the documents' tokens end to end, in the token dtype, nothing else.
``PREFIX.idx`` (little-endian, as ``_IndexWriter`` writes it)::

    b"MMIDIDX\\x00\\x00"   9 bytes, the magic
    <Q 1                  version
    <B code               the token dtype: uint8 1, int8 2, int16 3, int32 4, int64 5, uint16 8
    <Q n                  sequences (= documents here)
    <Q n + 1              entries of the document index
    int32[n]              each sequence's length in tokens
    int64[n]              each sequence's byte offset in .bin
    int64[n + 1]          the document index: document d is sequences [d_idx[d], d_idx[d+1]), here 0..n

A document of zero tokens (a doc id with no tokens) is a zero-length entry; Megatron's reader
returns an empty array for it, and entry i stays document i. A source with no token at all is
refused: Megatron cannot memory-map an empty ``.bin``. uint32/uint64 have no code: pass
``--token-dtype int32`` (or int64); ids are checked as they are written.

Writing in parallel: every part's byte range in ``.bin`` is known before writing
(``token_start * itemsize``, from the source's manifest), so on a local filesystem the driver
makes one staged file of the final size and each part ``pwrite``s its range into it (no merge
copy; the bytes do not depend on how many processes wrote them). On an object store (no random
writes) each part is uploaded as its own object, and ``finalize`` streams them, in order, into
the one ``.bin`` upload, then deletes them. The ``.idx`` is rebuilt from the parts' document
lengths (O(documents) numpy) and written last: it is the commit. With ``--overwrite`` the old
``.idx`` is deleted before the new ``.bin`` takes its name, so no reader ever pairs an old
index with new data. One prefix rather than several prefixes with weights: weights in
Megatron's ``--data-path`` blend datasets by sampling, which is not one dataset in doc-id order.
"""

from __future__ import annotations

import os
import posixpath
import struct
import uuid
from typing import Any, Iterator

import numpy as np
import numpy.typing as npt
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.export.base import Exporter, ExportMismatch, cast_tokens
from raypack.export.sources import DocumentBatch, Part, Source
from raypack.io.fs import is_uri, resolve_filesystem
from raypack.packed.writer import TMP_PREFIX, AtomicFile, write_whole

INDEX_MAGIC = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}
"""Megatron's ``DType`` codes of the integer dtypes (6, 7 are float64, float32)."""
_HEADER = struct.Struct("<9sQBQQ")
MAX_DOC_TOKENS = 2**31 - 1
"""Sequence lengths are int32 in the index."""
COPY_BYTES = 64 << 20


def index_bytes(dtype: np.dtype, doc_lens: npt.NDArray[np.int64]) -> bytes:
    """The ``.idx`` of documents of ``doc_lens`` tokens (one sequence each). O(n) numpy."""
    n = doc_lens.size
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(doc_lens[:-1] * dtype.itemsize, out=pointers[1:])
    return b"".join([_HEADER.pack(INDEX_MAGIC, 1, DTYPE_CODES[dtype.name], n, n + 1),
                     doc_lens.astype("<i4").tobytes(), pointers.astype("<i8").tobytes(),
                     np.arange(n + 1, dtype="<i8").tobytes()])


class MegatronIndex:
    """A parsed, checked ``.idx``: dtype, (n,) int32 lengths, (n,) int64 pointers, (n + 1,) int64 doc index."""

    def __init__(self, data: bytes, where: str) -> None:
        if len(data) < _HEADER.size:
            raise ExportMismatch(f"{where}: {len(data)} bytes, shorter than the header")
        magic, version, code, n, num_doc_index = _HEADER.unpack_from(data)
        codes = {v: k for k, v in DTYPE_CODES.items()}
        if magic != INDEX_MAGIC or version != 1 or code not in codes or num_doc_index < 1:
            raise ExportMismatch(f"{where}: not a Megatron index (magic {magic!r}, version {version}, code {code})")
        if len(data) != _HEADER.size + n * 12 + num_doc_index * 8:
            raise ExportMismatch(f"{where}: {len(data)} bytes, the header says {n} sequences, {num_doc_index} "
                                 "document index entries")
        self.dtype = np.dtype(codes[code])
        self.lengths = np.frombuffer(data, "<i4", n, _HEADER.size)
        self.pointers = np.frombuffer(data, "<i8", n, _HEADER.size + 4 * n)
        self.doc_index = np.frombuffer(data, "<i8", num_doc_index, _HEADER.size + 12 * n)


class MegatronExporter(Exporter):
    name = "megatron"
    summary = "Megatron-Core indexed dataset PREFIX.bin + PREFIX.idx, one entry per document"
    token_dtypes = tuple(DTYPE_CODES)

    def __init__(self, output: str, token_dtype: np.dtype) -> None:
        super().__init__(output, token_dtype)
        if output.endswith("/") or (not is_uri(output) and os.path.isdir(output)):  # it wrote DIR.bin beside DIR
            raise InputError(f"--output {output} names a directory; megatron's --output is a prefix of two files: "
                             f"give e.g. {posixpath.join(output.rstrip('/') or '.', 'corpus')} for corpus.bin and "
                             "corpus.idx in it")
        self._fs, self._prefix = resolve_filesystem(output)
        self._local = isinstance(self._fs, pafs.LocalFileSystem)
        self._dir, self._base = posixpath.split(self._prefix)
        self._dir_uri = _parent(output)
        """The directory holding the output, as given (a URI keeps its scheme), for AtomicFile."""
        self._staged = posixpath.join(self._dir, f"{TMP_PREFIX}{uuid.uuid4().hex}-{self._base}")
        """Local: the staged .bin (``+ ".bin"``); object store: the prefix of the part objects."""

    def output_paths(self) -> list[str]:
        return [f"{self.output}.bin", f"{self.output}.idx"]

    def describe(self) -> str:
        return f"{self.output}.bin + .idx ({self.token_dtype.name})"

    def prepare(self, source: Source) -> None:
        if not source.num_tokens:
            raise InputError(f"{source.path} holds no tokens ({source.num_docs} empty documents); Megatron cannot "
                             "open an empty .bin: export a source with at least one token")
        if self._local:
            os.makedirs(self._dir or ".", exist_ok=True)
            with open(self._staged + ".bin", "wb") as f:
                f.truncate(source.num_tokens * self.token_dtype.itemsize)

    def write_part(self, part: Part, batches: Iterator[DocumentBatch]) -> npt.NDArray[np.int64]:
        """Write the part's tokens at its byte range; return its (num_docs,) int64 document lengths."""
        if self._local:
            fd = os.open(self._staged + ".bin", os.O_WRONLY)
            try:
                return self._write_part(part, batches, lambda data, at: _pwrite_all(fd, data, at))
            finally:
                os.close(fd)
        file = AtomicFile(self._dir_uri, f"{posixpath.basename(self._staged)}-part-{part.index:06d}.bin")
        try:
            doc_lens = self._write_part(part, batches, lambda data, at: file.write(data))
            file.commit()
        except BaseException:
            file.abort()
            raise
        return doc_lens

    def _write_part(self, part: Part, batches: Iterator[DocumentBatch], write) -> npt.NDArray[np.int64]:
        where = f"part {part.index} of the source (documents {part.doc_start}..{part.doc_end})"
        position, lens = part.token_start * self.token_dtype.itemsize, []
        for batch in batches:
            data = cast_tokens(batch.tokens, self.token_dtype, where)
            write(memoryview(np.ascontiguousarray(data)).cast("B"), position)
            position += data.nbytes
            lens.append(batch.doc_lens)
        doc_lens = np.concatenate(lens) if lens else np.zeros(0, np.int64)
        if doc_lens.size != part.num_docs or int(doc_lens.sum()) != part.num_tokens:
            raise InputError(f"{where}: read {doc_lens.size} documents of {int(doc_lens.sum())} tokens, the manifest "
                             f"says {part.num_docs} of {part.num_tokens}; the source changed: make it again")
        if doc_lens.size and int(doc_lens.max()) > MAX_DOC_TOKENS:
            d = part.doc_start + int(np.argmax(doc_lens))
            raise InputError(f"document {d} has {int(doc_lens.max())} tokens; a Megatron index holds at most "
                             f"{MAX_DOC_TOKENS} per document: split it before exporting")
        return doc_lens

    def finalize(self, source: Source, results: list[npt.NDArray[np.int64]]) -> None:
        """Publish ``.bin`` (staged file renamed, or parts concatenated), then ``.idx`` last."""
        doc_lens = np.concatenate(results) if results else np.zeros(0, np.int64)
        self._delete(self._prefix + ".idx")  # an old index never pairs with the new data
        if self._local:
            with open(self._staged + ".bin", "rb+") as f:
                os.fsync(f.fileno())
            os.replace(self._staged + ".bin", self._prefix + ".bin")
        else:
            self._concatenate_parts(len(results))
        write_whole(self._dir_uri, self._base + ".idx", index_bytes(self.token_dtype, doc_lens))

    def _concatenate_parts(self, num_parts: int) -> None:
        file = AtomicFile(self._dir_uri, self._base + ".bin")
        try:
            for k in range(num_parts):
                with self._fs.open_input_stream(self._part_path(k)) as f:
                    while data := f.read(COPY_BYTES):
                        file.write(data)
            file.commit()
        except BaseException:
            file.abort()
            raise
        self.abort()

    def _part_path(self, k: int) -> str:
        return f"{self._staged}-part-{k:06d}.bin"

    def abort(self) -> None:
        if self._local:
            self._delete(self._staged + ".bin")
            return
        selector = pafs.FileSelector(self._dir, allow_not_found=True)
        for info in self._fs.get_file_info(selector):
            if info.path.startswith(self._staged + "-part-"):
                self._delete(info.path)

    def _delete(self, path: str) -> None:
        try:
            self._fs.delete_file(path)
        except FileNotFoundError:
            pass

    def verify(self, source: Source) -> list[str]:
        """The index's structure, the .bin's size, then every document against the source.
        Cost: one read of the source and of the .bin."""
        index = self._read_index()
        if not self.dtype_given:  # --verify-only without --token-dtype: the dtype the export holds
            self.token_dtype = index.dtype
        self._check_index(index, source)
        with self._fs.open_input_file(self._prefix + ".bin") as f:
            if f.size() != source.num_tokens * self.token_dtype.itemsize:
                raise ExportMismatch(f"{self.output}.bin: {f.size()} bytes, the source's {source.num_tokens} tokens "
                                     f"need {source.num_tokens * self.token_dtype.itemsize}")
            for part in source.parts:
                self._compare_part(index, part, source.batches(part), f)
        return [f"verified {self.output}.bin + .idx against {source.path}",
                f"  documents {source.num_docs:>14,}", f"  tokens    {source.num_tokens:>14,}",
                f"  dtype     {self.token_dtype.name:>14}"]

    def _read_index(self) -> MegatronIndex:
        path = self._prefix + ".idx"
        try:
            with self._fs.open_input_stream(path) as f:
                data = f.read()
        except FileNotFoundError as e:
            raise InputError(f"{self.output}.idx: not found; export again") from e
        return MegatronIndex(data, f"{self.output}.idx")

    def _check_index(self, index: MegatronIndex, source: Source) -> None:
        where = f"{self.output}.idx"
        if index.dtype != self.token_dtype:
            raise ExportMismatch(f"{where}: token dtype {index.dtype.name}, expected {self.token_dtype.name}")
        n = index.lengths.size
        if n != source.num_docs or not np.array_equal(index.doc_index, np.arange(n + 1)):
            raise ExportMismatch(f"{where}: {n} entries, the source has {source.num_docs} documents "
                                 "(or the document index is not 0..n)")
        expected = np.zeros(n, np.int64)
        np.cumsum(index.lengths[:-1].astype(np.int64) * index.dtype.itemsize, out=expected[1:])
        if not np.array_equal(index.pointers, expected):
            raise ExportMismatch(f"{where}: the byte offsets are not the running sum of the lengths")

    def _compare_part(self, index: MegatronIndex, part: Part, batches: Iterator[DocumentBatch], f: Any) -> None:
        doc, itemsize = part.doc_start, self.token_dtype.itemsize
        for batch in batches:
            lens = index.lengths[doc: doc + batch.doc_lens.size]
            if not np.array_equal(lens, batch.doc_lens):
                d = doc + int(np.argmax(lens != batch.doc_lens))
                raise ExportMismatch(f"{self.output}.idx: document {d} has {int(index.lengths[d])} tokens, "
                                     f"the source {int(batch.doc_lens[d - doc])}")
            start = int(index.pointers[doc]) if batch.doc_lens.size else 0
            data = np.frombuffer(f.read_at(batch.tokens.size * itemsize, start), self.token_dtype)
            if not np.array_equal(data, batch.tokens):
                first = start // itemsize + int(np.argmax(data != batch.tokens))
                raise ExportMismatch(f"{self.output}.bin: token {first} is {int(data[first - start // itemsize])}, "
                                     f"the source has another")
            doc += batch.doc_lens.size


def _parent(output: str) -> str:
    """The directory of ``output``: a URI stays a URI (its query kept), a local path becomes absolute."""
    if not is_uri(output):
        return os.path.dirname(os.path.abspath(output))
    path, sep, query = output.partition("?")
    return posixpath.dirname(path) + sep + query


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data.nbytes:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
