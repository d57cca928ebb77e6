"""``concat``: the exact rules (concatenate, cut every C tokens, pad only the last chunk).

A shard owns every chunk that lies entirely inside its slice ``[token_offset, token_offset +
num_tokens)`` of the global stream; the tokens before its first chunk boundary (its *head*) and
after its last one (its *tail*) belong to chunks shared with neighbours and go back to the
driver as :class:`~raypack.rules.core.Fragment` s to stitch. The token math is raypack.rules.core's
(shared by every strategy); the verify structure check is :mod:`raypack.strategies.concat.verify`.
The plan's chunk count is the protocol's default (tokens / C rounded up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from raypack.rules.core import Chunks, StreamPacker, split_document_mask
from raypack.strategies.base import PackingStrategy, StrategyFigures

if TYPE_CHECKING:
    from raypack.pack.tasks import PackSettings, ShardTask


@dataclass(frozen=True, kw_only=True)
class Concat(PackingStrategy):
    """No options: chunk boundaries follow from token offsets alone."""

    name = "concat"
    summary = "the exact rules: concatenate, cut every C tokens, pad only the last chunk"
    verify_structure_name = "raypack.strategies.concat.verify:ConcatStructure"
    keeps_document_order = True

    def make_shard_packer(self, task: ShardTask, settings: PackSettings) -> ConcatShardPacker:
        return ConcatShardPacker(task, settings)

    def make_split_finder(self, context_length: int) -> ConcatSplits:
        return ConcatSplits()

    def dry_run_figures(self, per_shard_lengths: list[np.ndarray], context_length: int) -> StrategyFigures:
        lengths = np.concatenate(per_shard_lengths) if per_shard_lengths else np.zeros(0, np.int64)
        tokens, c = int(lengths.sum()), context_length
        chunks = -(-tokens // c)
        cut = split_document_mask(lengths, 0, c)
        return StrategyFigures(self.name, chunks, chunks * c - tokens, int(cut.sum()),
                               int(np.count_nonzero(cut & (lengths <= c))))


class ConcatShardPacker:
    """The shard's slice of the global stream; edges kept as head/tail fragments."""

    def __init__(self, task: ShardTask, settings: PackSettings) -> None:
        c = settings.context_length
        self.context_length = c
        self.first_chunk = first_owned_chunk(task.token_offset, c)
        self._packer = StreamPacker(c, settings.pad_value, start_position=task.token_offset,
                                    dtype=settings.packed_dtype)
        self.head = self.tail = None

    def push_runs_parts(self, tokens: np.ndarray, run_lengths: np.ndarray, first_doc_id: int) -> list[Chunks]:
        """Runs of documents from ``first_doc_id`` (the first may continue the last one pushed);
        full chunks as consecutive parts, the tokens never copied in bulk (StreamPacker.push_runs_parts)."""
        doc_ids = np.arange(first_doc_id, first_doc_id + run_lengths.size, dtype=np.int64)
        return self._packer.push_runs_parts(tokens, run_lengths, doc_ids)

    @property
    def stream_position(self) -> int:
        return self._packer.position

    def count_split(self, lengths: np.ndarray) -> int:
        """Call before ``push_runs_parts``: documents of this batch that cross a chunk boundary."""
        return count_split_documents(lengths, self._packer.position, self.context_length)

    def finish(self) -> Chunks:
        last = self._packer.finish(pad=False)
        self.head, self.tail = self._packer.head, self._packer.tail
        return last

    def check_num_chunks(self, task: ShardTask, num_chunks: int) -> None:
        pass  # decided by token offsets alone


class ConcatSplits:
    """A document is split where a chunk starts with the id the previous chunk ended with."""

    def __init__(self) -> None:
        self._ids: list[np.ndarray] = []
        self._previous_last = -1

    def add(self, seg_ids: np.ndarray, seg_lens: np.ndarray, offsets: np.ndarray) -> None:
        first, last = seg_ids[offsets[:-1]], seg_ids[offsets[1:] - 1]
        before = np.concatenate([[self._previous_last], last[:-1]])
        self._ids.append(np.unique(first[(first == before) & (first >= 0)]))
        self._previous_last = int(last[-1])

    def split_ids(self) -> np.ndarray:
        return np.unique(np.concatenate(self._ids)) if self._ids else np.zeros(0, np.int64)


def first_owned_chunk(token_offset: int, context_length: int) -> int:
    return -(-token_offset // context_length)


def count_split_documents(lengths: np.ndarray, start: int, context_length: int) -> int:
    """Documents (laid end to end from global position ``start``) that cross a chunk boundary."""
    return int(np.count_nonzero(split_document_mask(lengths, start, context_length)))
