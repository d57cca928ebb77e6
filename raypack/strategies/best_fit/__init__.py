"""``best_fit``: best-fit decreasing within windows of a shard's documents. A document of at most C
tokens is never cut; every chunk may end with padding.

This folder is the strategy: this module (options, packer hooks, manifest fields, report lines),
its rules and token math (:mod:`.rules`, numpy only), and its verify structure check
(:mod:`.verify`, with :mod:`.windows`, where things lie, and :mod:`.layout`, the layout best-fit
decreasing must produce), imported only by raypack verify.

Windows never span shards, so a shard owns all of its chunks and has no edge fragments; how many
it has is known only after best-fit packing its windows, so the driver first runs its counting
pass on every task (:meth:`BestFit.make_chunk_counter`, from document lengths only;
raypack.pack.packer.count_task) and hands each shard its first chunk index. The manifest stores
``best_fit_window`` (top level) and each shard's ``first_chunk`` / ``num_chunks``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from raypack.errors import InputChanged, InputError
from raypack.io.untrusted import int_field, show
from raypack.rules.core import Chunks
from raypack.strategies.base import PackingStrategy, StrategyFigures, percent
from raypack.strategies.best_fit.rules import BestFitChunkCounter, BestFitPacker
from raypack.strategies.options import check_int_option

if TYPE_CHECKING:
    from raypack.pack.plan import Plan
    from raypack.pack.tasks import PackSettings, ShardTask

DRY_RUN_WINDOWS = (1024, 4096, 16384, 65536)
"""Windows whose padding ``--dry-run`` also reports, beside the configured one."""


@dataclass(frozen=True, kw_only=True)
class BestFit(PackingStrategy):
    window: int = field(default=8192, metadata={
        "metavar": "DOCS", "help": "documents per best-fit window (0: a whole shard; default 8192)",
        "doc": "Documents per best-fit window (0: a whole shard). Windows never span shards; a "
               "packer holds one window of tokens in memory."})
    max_segments: int | None = field(default=None, metadata={
        "metavar": "K", "type": int, "aliases": ("--max-segments",), "only_when_chosen": True,
        "help": "at most K segments per chunk, its padding segment included, so every chunk fits the "
                "collate's max_segments=K (K >= 2; default: no limit)",
        "doc": "At most K segments per chunk (K >= 2), counted as the collate's ``max_segments`` counts "
               "them: documents plus one padding segment unless the chunk is full. Unset: no limit."})

    name = "best_fit"
    summary = "never cut a document that fits a chunk (best-fit decreasing in windows of documents)"
    needs_counting_pass = True
    verify_structure_name = "raypack.strategies.best_fit.verify:BestFitStructure"

    def __post_init__(self) -> None:
        check_int_option(self, "window", 0)
        if self.max_segments is not None:
            check_int_option(self, "max_segments", 2)

    def make_shard_packer(self, task: ShardTask, settings: PackSettings) -> BestFitShardPacker:
        return BestFitShardPacker(task, settings, self.window, self.max_segments)

    def task_starts(self, unit_first_rows: np.ndarray) -> np.ndarray:
        """Units whose first row starts a window (a multiple of ``window`` from the shard's first
        document): a task starting there packs exactly as the whole shard would, since windows
        never span a window boundary. A window of 0 (the whole shard) allows none but unit 0.

        Tasks start only at row-group / record-batch boundaries: a task starting inside a unit
        would have no footer token count for its offsets and would decode that unit twice. So a
        shard splits only where its units end on window boundaries (row groups of a multiple of
        ``window`` documents, e.g. pyarrow's default of 1Mi rows for windows of 8192)."""
        if not self.window:
            return np.arange(unit_first_rows.size) == 0
        return unit_first_rows % self.window == 0

    def make_chunk_counter(self, context_length: int) -> BestFitChunkCounter:
        return BestFitChunkCounter(context_length, window=self.window, max_segments=self.max_segments)

    def num_chunks(self, plan: Plan) -> int:
        if any(t.num_chunks < 0 for t in plan.tasks):
            raise RuntimeError("internal error: best_fit chunk counts not placed yet (call place_chunks)")
        return sum(t.num_chunks for t in plan.tasks)

    def shard_row_extras(self, task: ShardTask) -> dict[str, Any]:
        return {"first_chunk": task.first_chunk, "num_chunks": task.num_chunks}

    def check_manifest(self, manifest: dict[str, Any], where: str) -> None:
        """The shards are listed and their chunk ranges tile ``[0, counts.chunks)`` in shard order."""
        shards = manifest.get("shards")
        if not isinstance(shards, list):
            raise InputError(f"{where}: shards={show(shards)}; a best_fit manifest must list its shards (their "
                             "chunk ranges and windows)")
        next_chunk, num_chunks = 0, manifest["counts"]["chunks"]
        for k, entry in enumerate(shards):
            label = f"{where}: shards[{k}] ({entry['path']})"
            first = int_field(entry, "first_chunk", label)
            count = int_field(entry, "num_chunks", label)
            if first != next_chunk:
                raise InputError(f"{label}: first_chunk={first}, expected {next_chunk}; best_fit shard chunk ranges "
                                 "tile the chunks in shard order (shard k's chunks follow shard k-1's)")
            next_chunk += count
            if next_chunk > num_chunks:
                break
        if next_chunk != num_chunks:
            raise InputError(f"{where}: the shards' chunk ranges cover chunks 0..{next_chunk - 1} ({next_chunk} "
                             f"chunks) but the files hold {num_chunks}; they must tile the same chunks")

    def describe(self) -> str:
        limit = f", at most {self.max_segments} segments per chunk" if self.max_segments is not None else ""
        return (f"{self.name}, " + (f"windows of {self.window:,} documents" if self.window else "whole-shard windows")
                + limit)

    def make_split_finder(self, context_length: int) -> BestFitSplits:
        return BestFitSplits(context_length)

    def dry_run_figures(self, per_shard_lengths: list[np.ndarray], context_length: int) -> BestFitFigures:
        """Figures for the configured window, plus the padding of :data:`DRY_RUN_WINDOWS` as notes."""
        c = context_length
        tokens = sum(int(lengths.sum()) for lengths in per_shard_lengths)
        windows = sorted({*DRY_RUN_WINDOWS, self.window}, key=lambda w: (w == 0, w))
        window_padding = tuple((w, _chunks(per_shard_lengths, c, w, self.max_segments) * c - tokens) for w in windows)
        padding = dict(window_padding)[self.window]
        notes = ["  best_fit padding by window (documents; windows never span shards):"]
        for window, pad in window_padding:
            chunks = (tokens + pad) // c
            notes.append(f"    {'whole shard' if window == 0 else f'{window:,}':>12}  {percent(pad, chunks * c)}")
        name = f"{self.name} (window {self.window:,})" if self.window else f"{self.name} (whole shard)"
        long_docs = sum(int(np.count_nonzero(lengths > c)) for lengths in per_shard_lengths)
        return BestFitFigures(name, (tokens + padding) // c, padding, long_docs, 0, tuple(notes), window_padding)


@dataclass(frozen=True)
class BestFitFigures(StrategyFigures):
    window_padding: tuple[tuple[int, int], ...] = ()
    """(window in documents, 0 = a whole shard; padding positions) on the sample."""


class BestFitShardPacker:
    """Windows of the shard's documents, its chunks from ``task.first_chunk``."""

    def __init__(self, task: ShardTask, settings: PackSettings, window: int, max_segments: int | None = None) -> None:
        if task.first_chunk < 0:
            raise RuntimeError(f"internal error: best_fit shard {task.shard_index} has no first chunk")
        self.context_length = settings.context_length
        self.first_chunk = task.first_chunk
        self._packer = BestFitPacker(settings.context_length, settings.pad_value, window=window,
                                     first_doc_id=task.doc_offset, dtype=settings.packed_dtype,
                                     max_segments=max_segments)
        self.head = self.tail = None
        self.stream_position = None  # chunks are windows of documents, not cut from the stream

    def push_runs_parts(self, tokens: np.ndarray, run_lengths: np.ndarray, first_doc_id: int) -> list[Chunks]:
        """Runs of documents from ``first_doc_id`` (the first may continue the last one pushed)."""
        return self._packer.push_runs_parts(tokens, run_lengths, first_doc_id)

    def count_split(self, lengths: np.ndarray) -> int:
        return int(np.count_nonzero(lengths > self.context_length))

    def finish(self) -> Chunks:
        return self._packer.finish()

    def check_num_chunks(self, task: ShardTask, num_chunks: int) -> None:
        if num_chunks != task.num_chunks:
            raise InputChanged(f"shard {task.path}: counted {task.num_chunks} best_fit chunks but packed "
                             f"{num_chunks}; the file changed during the run (rerun on a stable copy)")


class BestFitSplits:
    """Only a document with a full-chunk piece can have another piece, and its full pieces come
    before its remainder in chunk order; so only segments of such documents are kept."""

    def __init__(self, context_length: int) -> None:
        self.context_length = context_length
        self._candidates = np.zeros(0, np.int64)
        self._hits: list[np.ndarray] = []

    def add(self, seg_ids: np.ndarray, seg_lens: np.ndarray, offsets: np.ndarray) -> None:
        self._candidates = np.union1d(self._candidates, seg_ids[seg_lens == self.context_length])
        self._hits.append(seg_ids[np.isin(seg_ids, self._candidates)])

    def split_ids(self) -> np.ndarray:
        ids, counts = np.unique(np.concatenate(self._hits) if self._hits else np.zeros(0, np.int64),
                                return_counts=True)
        return ids[counts > 1]


def _chunks(per_shard_lengths: list[np.ndarray], c: int, window: int, max_segments: int | None = None) -> int:
    """Chunks best-fit packing makes of these shards' documents (windows never span shards)."""
    total = 0
    for lengths in per_shard_lengths:
        counter = BestFitChunkCounter(c, window=window, max_segments=max_segments)
        counter.push(lengths)
        total += counter.finish()
    return total
