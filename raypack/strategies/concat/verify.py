"""The concat structure check (manifest ``"strategy": "concat"``, or no strategy).

Per block, in global order, after the checks of :class:`raypack.verify.structure.Structure`: doc
ids never decrease along the output, strictly increasing between segments except where a chunk's
first segment continues the previous chunk's last document; padding (-1) appears only as the last
segment of the last chunk, never filling a chunk, and holds ``pad_token``. A split document is one
repeated across >= 1 chunk boundary, counted once. Each block is handed on at once as one piece
(views of the file): concat holds nothing back. Cost: O(block) numpy work, no Python loop per
token or segment.
"""

from __future__ import annotations

import posixpath
from typing import Any, Sequence

import numpy as np

from raypack.verify.blocks import Block, Piece, row_of_segment, segment_start
from raypack.verify.report import VerifyError
from raypack.verify.structure import Structure

__all__ = ["ConcatStructure"]


class ConcatStructure(Structure):
    """Checks concat blocks in global order and carries what spans them (last doc id, counts).

    ``ConcatStructure(manifest, keep_tokens=...)``: ``manifest`` as loaded by
    :func:`raypack.packed.manifest.load_manifest`; ``keep_tokens`` is accepted for the common constructor
    and changes nothing (every piece is handed on at once, as views of its block).
    """

    def __init__(self, manifest: dict[str, Any], *, keep_tokens: bool = False) -> None:
        super().__init__(manifest, keep_tokens=keep_tokens)
        self.last_split_id = -1

    def pieces(self, block: Block) -> Sequence[Piece]:
        """Check one block; return the stream pieces it completes (concat: exactly its own)."""
        return (self.check(block),)

    def check(self, block: Block) -> Piece:
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
        return Piece(tokens, dense, lambda i: self._where(block, first_position + i))

    def _where(self, block: Block, position: int) -> str:
        c = self.context_length
        return f"output chunk {position // c} position {position % c} ({posixpath.basename(block.path)})"

    def _check_padding(self, block: Block) -> int:
        """Raise unless padding is only the last segment of the last chunk; return non-padding segments."""
        ids = block.segment_doc_ids
        negative = ids < 0
        if not negative.any():
            return ids.size
        k = int(np.argmax(negative))
        row = row_of_segment(block, k)
        place = self._where(block, (self.next_chunk + row) * self.context_length + segment_start(block, k, row))
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

    def _check_pad_tokens(self, block: Block, place: str, num_pad: int) -> None:
        pads = block.input_ids[-1, self.context_length - num_pad:]
        if (pads != self.pad_token).any():
            i = int(np.argmax(pads != self.pad_token))
            chunk = int(block.chunk_indices[-1])
            raise VerifyError(f"output chunk {chunk} position {self.context_length - num_pad + i} "
                              f"({posixpath.basename(block.path)}): padding token {pads[i].item()}, "
                              f"expected pad_token {self.pad_token}")

    def _check_order(self, block: Block, ids: np.ndarray, previous: np.ndarray, is_first: np.ndarray) -> None:
        """Strictly increasing, except a chunk's first segment may repeat the previous segment's id."""
        bad = (ids < previous) | ((ids == previous) & ~is_first)
        if bad.any():
            k = int(np.argmax(bad))
            row = row_of_segment(block, k)
            position = (self.next_chunk + row) * self.context_length + segment_start(block, k, row)
            raise VerifyError(f"{self._where(block, position)}: segment doc id {int(ids[k])} follows doc id "
                              f"{int(previous[k])}; doc ids must increase along the output (a repeat is "
                              "allowed only as a chunk's first segment, continuing the previous chunk's last document)")

    def _count(self, block: Block, ids: np.ndarray, repeats: np.ndarray, num_pad: int) -> None:
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
