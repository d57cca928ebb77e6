"""``raypack pack --dry-run``: what concat and best_fit would give, from document lengths alone.

Reads only document lengths (list offsets) of a sample, the first ``sample_docs`` documents
of the stream with shards in order (0: every document, which gives the exact figures of a
real run), and computes for each strategy the chunks, padding and documents split across
chunks, plus what the best-fit window costs in padding. Writes nothing. No Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from raypack.best_fit import BestFitChunkCounter
from raypack.config import PackConfig
from raypack.core import split_document_mask
from raypack.formats import iter_token_batches
from raypack.plan import make_plan
from raypack.shard_pack import read_batch_rows
from raypack.tasks import PackSettings

WINDOWS = (1024, 4096, 16384, 65536)


@dataclass(frozen=True)
class StrategyFigures:
    name: str
    num_chunks: int
    padding_positions: int
    split_documents: int
    split_short_documents: int
    """Split documents of at most C tokens: the ones best_fit never cuts."""


@dataclass(frozen=True)
class DryRunReport:
    context_length: int
    num_docs: int
    num_tokens: int
    num_shards: int
    corpus_docs: int
    corpus_tokens: int
    long_documents: int
    """Documents longer than C: every strategy has to cut them."""
    strategies: tuple[StrategyFigures, ...]
    window_padding: tuple[tuple[int, int], ...]
    """(best-fit window in documents, 0 = a whole shard; padding positions) on the sample."""

    def lines(self) -> list[str]:
        c = self.context_length
        whole = self.num_docs == self.corpus_docs
        out = [f"dry run: {'all' if whole else 'a sample of'} {self.num_docs:,} documents "
               f"({self.num_tokens:,} tokens, {self.num_shards} shard(s)) of {self.corpus_docs:,} "
               f"({self.corpus_tokens:,} tokens); C={c}; nothing written",
               f"  documents longer than C: {self.long_documents:,} ({_pct(self.long_documents, self.num_docs)})",
               f"  {'strategy':<24}{'chunks':>12}{'padding':>12}{'split docs':>14}{'split docs <= C':>18}"]
        for s in self.strategies:
            out.append(f"  {s.name:<24}{s.num_chunks:>12,}{_pct(s.padding_positions, s.num_chunks * c):>12}"
                       f"{_pct(s.split_documents, self.num_docs):>14}{s.split_short_documents:>18,}")
        out.append("  best_fit padding by window (documents; windows never span shards):")
        for window, padding in self.window_padding:
            chunks = (self.num_tokens + padding) // c
            out.append(f"    {'whole shard' if window == 0 else f'{window:,}':>12}  {_pct(padding, chunks * c)}")
        return out


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.3f}%" if whole else "0.000%"


def dry_run(config: PackConfig, *, sample_docs: int = 100_000) -> DryRunReport:
    """Plan the run, read the sample's document lengths, and compute both strategies' figures."""
    plan = make_plan(config)
    settings = PackSettings("", config.context_length, config.pad_token, plan.token_dtype, config.token_column,
                            config.read_batch_size, config.read_batch_tokens, config.chunks_per_record_batch)
    per_shard = _sample_lengths(plan.tasks, settings, sample_docs)
    lengths = np.concatenate(per_shard) if per_shard else np.zeros(0, np.int64)
    c = config.context_length
    best_fit_windows = sorted({*WINDOWS, config.best_fit_window}, key=lambda w: (w == 0, w))
    window_padding = tuple((w, _best_fit_chunks(per_shard, c, w) * c - int(lengths.sum())) for w in best_fit_windows)
    figures = (_concat_figures(lengths, c),
               _best_fit_figures(lengths, c, config.best_fit_window, dict(window_padding)[config.best_fit_window]))
    return DryRunReport(c, int(lengths.size), int(lengths.sum()), len(per_shard), plan.num_docs, plan.num_tokens,
                        int(np.count_nonzero(lengths > c)), figures, window_padding)


def _sample_lengths(tasks, settings: PackSettings, sample_docs: int) -> list[npt.NDArray[np.int64]]:
    """Document lengths of the first ``sample_docs`` documents (0: all), one array per shard."""
    per_shard, remaining = [], sample_docs or sum(t.num_docs for t in tasks) + 1  # 0: a count never reached
    for task in tasks:
        if remaining == 0:
            break
        parts = []
        for _, docs in iter_token_batches(task.path, task.format, settings.token_column,
                                          read_batch_rows(task, settings), validate=False):
            parts.append(np.diff(docs.offsets.to_numpy()).astype(np.int64)[:remaining])
            remaining -= parts[-1].size
            if remaining == 0:
                break
        per_shard.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return per_shard


def _concat_figures(lengths: np.ndarray, c: int) -> StrategyFigures:
    tokens = int(lengths.sum())
    chunks = -(-tokens // c)
    cut = split_document_mask(lengths, 0, c)
    return StrategyFigures("concat", chunks, chunks * c - tokens, int(cut.sum()),
                           int(np.count_nonzero(cut & (lengths <= c))))


def _best_fit_figures(lengths: np.ndarray, c: int, window: int, padding: int) -> StrategyFigures:
    name = f"best_fit (window {window:,})" if window else "best_fit (whole shard)"
    chunks = (int(lengths.sum()) + padding) // c
    return StrategyFigures(name, chunks, padding, int(np.count_nonzero(lengths > c)), 0)


def _best_fit_chunks(per_shard: list[np.ndarray], c: int, window: int) -> int:
    total = 0
    for lengths in per_shard:
        counter = BestFitChunkCounter(c, window=window)
        counter.push(lengths)
        total += counter.finish()
    return total
