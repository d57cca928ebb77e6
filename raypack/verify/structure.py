"""Check 2, the structure: what every strategy's check shares, and the loop that drives one.

A structure check is a class built as ``Check(manifest, *, keep_tokens)`` from a manifest that
passed :func:`raypack.packed.manifest.load_manifest` (``keep_tokens``: the pieces it returns will be
compared with the inputs, so a check that holds chunks back must keep their tokens too). It is fed
every block in global order by :func:`output_pieces` and turns them into the output's non-padding
stream of :class:`~raypack.verify.blocks.Piece` s, in doc id order:

  ``pieces(block)``  check one block; return the pieces it completes;
  ``flush()``        the pieces still held back after the last block;
  ``finish(manifest, where)``  compare the manifest's counts with what was read.

It counts as it goes: ``next_chunk`` (chunks read), ``num_tokens``, ``num_padding``,
``num_split``, ``num_segments``, ``last_doc_id``; ``report_note()`` is what the report shows
beside the strategy's name (e.g. its options as read). :class:`Structure` is the base: those
counts, the checks every strategy makes per block (chunk indices ``0..n-1``; segment lengths > 0
summing to C per chunk) and the final count check. A strategy's check subclasses it in the
strategy's folder (``raypack/strategies/NAME/verify.py``), named by the strategy
(``PackingStrategy.verify_structure``); this module knows none of them.
"""

from __future__ import annotations

import posixpath
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow.fs as pafs

from raypack.packed.manifest import Manifest, side_columns_of
from raypack.packed.writer import MANIFEST_NAME
from raypack.rules.side_columns import pad_record
from raypack.verify.blocks import Block, Piece, iter_blocks, row_of_segment
from raypack.verify.content import ContentCheck
from raypack.verify.report import VerifyError

__all__ = ["Structure", "output_pieces"]


class Structure:
    """Counts and per-block checks shared by every strategy; subclasses define ``pieces`` and ``flush``."""

    def __init__(self, manifest: dict[str, Any], *, keep_tokens: bool = False) -> None:
        manifest = Manifest.of(manifest)
        self.context_length = manifest.context_length
        columns = side_columns_of(manifest)
        self.pad_token = pad_record(manifest.pad_token, columns, manifest.token_dtype.name) if columns \
            else manifest.pad_token
        """The pad token, or with side columns the padding's record (raypack.rules.side_columns)."""
        self.keep_tokens = keep_tokens
        self.num_chunks = sum(entry["num_chunks"] for entry in manifest.files)
        self.next_chunk = 0
        self.last_doc_id = -1
        self.num_tokens = self.num_padding = self.num_split = self.num_segments = 0

    def pieces(self, block: Block) -> Sequence[Piece]:
        """Check one block; return the stream pieces it completes."""
        raise NotImplementedError

    def flush(self) -> Sequence[Piece]:
        """Pieces still held back after the last block."""
        return ()

    def report_note(self) -> str:
        """What verify's report shows beside the strategy's name ("": nothing)."""
        return ""

    def _row_label(self, block: Block, row: int) -> str:
        return f"{block.path} row {block.first_row + row} (chunk {self.next_chunk + row})"

    def _check_chunk_indices(self, block: Block) -> None:
        expected = np.arange(self.next_chunk, self.next_chunk + block.chunk_indices.size, dtype=np.int64)
        if not np.array_equal(block.chunk_indices, expected):
            row = int(np.argmax(block.chunk_indices != expected))
            raise VerifyError(f"{block.path} row {block.first_row + row}: chunk_index="
                              f"{int(block.chunk_indices[row])}, expected {int(expected[row])}")

    def _check_lengths(self, block: Block) -> None:
        lengths = block.segment_lengths
        if lengths.size and lengths.min() < 1:
            k = int(np.argmax(lengths < 1))
            row = row_of_segment(block, k)
            raise VerifyError(f"{self._row_label(block, row)}: segment {k - int(block.segment_offsets[row])} has "
                              f"length {int(lengths[k])}; segment lengths must be >= 1")
        ends = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=ends[1:])
        sums = np.diff(ends[block.segment_offsets])
        if (sums != self.context_length).any():
            row = int(np.argmax(sums != self.context_length))
            raise VerifyError(f"{self._row_label(block, row)}: segment lengths sum to {int(sums[row])}, "
                              f"expected the context length {self.context_length}")

    def finish(self, manifest: dict[str, Any], where: str) -> None:
        """The manifest's counts against what was read; ``where`` names the manifest."""
        counts = manifest.counts
        found = {"chunks": self.next_chunk, "tokens": self.num_tokens,
                 "padding_positions": self.num_padding, "split_documents": self.num_split}
        for key, value in found.items():
            if getattr(counts, key) != value:
                raise VerifyError(f"{where}: counts.{key}={getattr(counts, key)} but the chunk files hold {value}")
        if counts.documents < self.last_doc_id + 1:
            raise VerifyError(f"{where}: counts.documents={counts.documents} but the output holds doc id "
                              f"{self.last_doc_id}; documents must be >= max doc id + 1 = {self.last_doc_id + 1}")


def output_pieces(fs: pafs.FileSystem, base: str, manifest: dict[str, Any], structure: Structure,
                  batch_chunks: int) -> Iterator[Piece]:
    """The output's non-padding stream, checked block by block; the counts and (format version 3)
    the content digest are checked at its end."""
    manifest = Manifest.of(manifest)
    content = ContentCheck(manifest) if manifest.format_version >= 3 else None
    for entry in manifest.files:
        for block in iter_blocks(fs, base, entry, manifest, batch_chunks):
            yield from structure.pieces(block)
            if content is not None:
                content.add(block)
    yield from structure.flush()
    where = posixpath.join(base, MANIFEST_NAME)
    structure.finish(manifest, where)
    if content is not None:
        content.finish(where)
