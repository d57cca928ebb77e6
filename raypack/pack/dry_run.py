"""``raypack pack --dry-run``: what every registered strategy would give, from document lengths alone.

Reads only document lengths (list offsets) of a sample, the first ``sample_docs`` documents
of the stream with shards in order (0: every document, which gives the exact figures of a
real run), and asks each strategy (with the config's options for it) for its chunks, padding
and documents split across chunks, plus any notes of its own (best_fit: what the window costs
in padding). With ``long_docs`` truncate or drop the strategies see the kept lengths. Writes
nothing. No Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from raypack.inputs.reading import iter_token_batches
from raypack.pack.config import PackConfig
from raypack.pack.plan import make_plan, settings_for
from raypack.pack.tasks import PackSettings, read_batch_rows
from raypack.rules.arrays import numpy_values
from raypack.rules.long_docs import DEFAULT_LONG_DOCS, CutCounts, count_cut, kept_lengths
from raypack.strategies.base import StrategyFigures, percent


@dataclass(frozen=True)
class DryRunReport:
    context_length: int
    num_docs: int
    num_tokens: int
    num_shards: int
    corpus_docs: int | None
    corpus_tokens: int | None
    """The whole input's, or None where only the sample was tokenized (text inputs)."""
    long_documents: int
    """Documents longer than C: every strategy has to cut them."""
    strategies: tuple[StrategyFigures, ...]
    """One per registered strategy, in registry order."""
    long_docs: str = DEFAULT_LONG_DOCS
    cut: CutCounts = CutCounts()
    """What ``long_docs`` leaves out of the sample (the strategies' figures are of what it keeps)."""

    def lines(self) -> list[str]:
        c = self.context_length
        whole = self.num_docs == self.corpus_docs
        of = ("of the text (tokenized up to the sample)" if self.corpus_docs is None or self.corpus_tokens is None
              else f"of {self.corpus_docs:,} ({self.corpus_tokens:,} tokens)")
        out = [f"dry run: {'all' if whole else 'a sample of'} {self.num_docs:,} documents "
               f"({self.num_tokens:,} tokens, {self.num_shards} shard(s)) {of}; C={c}; nothing written",
               f"  documents longer than C: {self.long_documents:,} ({percent(self.long_documents, self.num_docs)})"
               + self._cut_note(),
               f"  {'strategy':<24}{'chunks':>12}{'padding':>12}{'split docs':>14}{'split docs <= C':>18}"]
        for s in self.strategies:
            out.append(f"  {s.name:<24}{s.num_chunks:>12,}{percent(s.padding_positions, s.num_chunks * c):>12}"
                       f"{percent(s.split_documents, self.num_docs):>14}{s.split_short_documents:>18,}")
        for s in self.strategies:
            out.extend(s.notes)
        return out

    def _cut_note(self) -> str:
        if self.long_docs == "truncate":
            return f"; long_docs=truncate cuts {self.cut.tokens_truncated:,} tokens off them"
        if self.long_docs == "drop":
            return f"; long_docs=drop leaves them out ({self.cut.tokens_dropped:,} tokens)"
        return ""


def dry_run(config: PackConfig, *, sample_docs: int = 100_000) -> DryRunReport:
    """Plan the run, read the sample's document lengths, and ask every strategy for its figures."""
    plan = make_plan(config)
    per_shard = _sample_lengths(plan.whole_shard_tasks(), settings_for(config, plan, ""), sample_docs)
    return report_of(config, per_shard, plan.num_docs, plan.num_tokens)


def report_of(config: PackConfig, per_shard: list[npt.NDArray[np.int64]], corpus_docs: int | None,
              corpus_tokens: int | None) -> DryRunReport:
    """Every strategy's figures for the sample's document lengths, one array per shard (a pack task
    of text inputs) in order."""
    lengths = np.concatenate(per_shard) if per_shard else np.zeros(0, np.int64)
    c = config.context_length
    kept = [kept_lengths(shard_lengths, config.long_docs, c) for shard_lengths in per_shard]
    figures = tuple(strategy.dry_run_figures(kept, c) for strategy in config.strategies())
    return DryRunReport(c, int(lengths.size), int(lengths.sum()), len(per_shard), corpus_docs, corpus_tokens,
                        int(np.count_nonzero(lengths > c)), figures, config.long_docs,
                        count_cut(lengths, config.long_docs, c))


def _sample_lengths(tasks, settings: PackSettings, sample_docs: int) -> list[npt.NDArray[np.int64]]:
    """Document lengths of the first ``sample_docs`` documents (0: all), one array per shard."""
    per_shard, remaining = [], sample_docs or sum(t.num_docs for t in tasks) + 1  # 0: a count never reached
    for task in tasks:
        if remaining == 0:
            break
        parts = []
        for _, docs in iter_token_batches(task.path, task.format, settings.token_column,
                                          read_batch_rows(task, settings), validate=False,
                                          max_document_tokens=settings.max_document_tokens):
            parts.append(np.diff(numpy_values(docs.offsets)).astype(np.int64)[:remaining])
            remaining -= parts[-1].size
            if remaining == 0:
                break
        per_shard.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return per_shard
