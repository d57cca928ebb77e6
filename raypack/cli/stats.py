"""How well a corpus packed, read from a packed output alone (no inputs, no Ray).

``raypack stats OUT`` reports padding, documents split across chunk boundaries (in all and per
shard), and a histogram of fragment lengths (a fragment is the piece of one document inside
one chunk: a segment that is not padding). Everything is computed from the segment columns,
streaming over the files' record batches through :meth:`raypack.packed.reader.PackedDataset.record_batches`
(so the manifest is checked by raypack.packed.manifest, files are opened only as plain files inside the
output, and a damaged file is one InputError naming it). The counts reported are the ones read
from the data; each is cross-checked with the manifest's (a mismatch is an InputError naming both).
Memory: one record batch plus the split doc ids.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import numpy.typing as npt

from raypack.errors import InputError
from raypack.mix.dataset import MixStats, is_mix, mix_stats
from raypack.packed.manifest import Manifest, read_manifest_json, resolve_output
from raypack.packed.reader import PackedDataset, open_packed
from raypack.packed.writer import MANIFEST_NAME
from raypack.rules.long_docs import DEFAULT_LONG_DOCS

NUM_BINS = 16


@dataclass(frozen=True)
class PackStats:
    context_length: int
    num_chunks: int
    num_tokens: int
    num_documents: int
    padding_positions: int
    split_documents: int
    fragment_bin_edges: npt.NDArray[np.int64]
    """(NUM_BINS + 1,) edges over fragment lengths 1..C (the last bin includes C)."""
    fragment_counts: npt.NDArray[np.int64]
    """(NUM_BINS,) fragments per bin."""
    shard_paths: tuple[str, ...]
    shard_documents: npt.NDArray[np.int64]
    shard_split_documents: npt.NDArray[np.int64]
    strategy: str
    side_nonzero: tuple[tuple[str, str, int], ...] = ()
    """Per side column (``--extra-columns``): name, type and its nonzero values on tokens (padding excluded)."""
    long_docs: tuple[str, int, int] | None = None
    """``--long-docs`` truncate / drop: the policy and the documents and tokens it left out (the manifest's)."""

    @property
    def padding_percent(self) -> float:
        positions = self.num_chunks * self.context_length
        return 100.0 * self.padding_positions / positions if positions else 0.0

    @property
    def split_percent(self) -> float:
        return 100.0 * self.split_documents / self.num_documents if self.num_documents else 0.0

    def lines(self) -> list[str]:
        out = [
            f"strategy         {self.strategy:>14}",
            f"chunks           {self.num_chunks:>14,}  of {self.context_length} tokens",
            f"tokens           {self.num_tokens:>14,}",
            f"documents        {self.num_documents:>14,}",
            f"padding          {self.padding_positions:>14,}  ({self.padding_percent:.3f}% of positions)",
            f"split documents  {self.split_documents:>14,}  ({self.split_percent:.2f}% of documents)",
        ]
        if self.long_docs:
            policy, docs, tokens = self.long_docs
            out.append(f"long documents   {policy:>14}  ({docs:,} documents, {tokens:,} tokens "
                       f"{'cut off' if policy == 'truncate' else 'left out'})")
        out.append("fragment lengths (pieces of one document in one chunk):")
        total = max(1, int(self.fragment_counts.sum()))
        for lo, hi, n in zip(self.fragment_bin_edges[:-1], self.fragment_bin_edges[1:], self.fragment_counts):
            bar = "#" * int(round(40 * n / total))
            out.append(f"  {lo:>7}-{hi - 1 if hi - 1 >= lo else lo:<7} {n:>10,}  {bar}")
        if self.side_nonzero:
            out.append("side columns: nonzero values on tokens (padding excluded)")
        for name, type_name, nonzero in self.side_nonzero:
            pct = 100.0 * nonzero / self.num_tokens if self.num_tokens else 0.0
            out.append(f"  {name} ({type_name})  {nonzero:,} ({pct:.2f}% of tokens)")
        out.append("per shard: documents, split documents")
        width = max((len(p) for p in self.shard_paths), default=0)
        for path, docs, split in zip(self.shard_paths, self.shard_documents, self.shard_split_documents):
            pct = 100.0 * split / docs if docs else 0.0
            out.append(f"  {path:<{width}}  {docs:>12,}  {split:>12,} ({pct:.2f}%)")
        return out


def packing_stats(out: str) -> PackStats | MixStats:
    """Stream the output's segment columns and count; raise InputError when the data and the
    manifest's counts disagree, or a file is damaged (naming it). A mix gives its sources'
    shares and passes instead (:func:`raypack.mix.dataset.mix_stats`)."""
    data, where = read_manifest_json(out)
    if is_mix(data):
        return mix_stats(out, data, where)
    ds = open_packed(out, data, where)  # the manifest parsed once
    manifest, c = ds.manifest, ds.context_length
    edges = np.unique(np.linspace(1, c + 1, NUM_BINS + 1).astype(np.int64))
    counts = np.zeros(edges.size - 1, np.int64)
    packing = manifest.strategy
    find_split = packing.make_split_finder(c)
    found = {"chunks": 0, "tokens": 0, "padding_positions": 0}
    max_doc_id = -1
    side_nonzero = np.zeros(len(ds.extra_columns), np.int64)
    for seg_ids, seg_lens, offsets, nonzero in _segment_batches(ds):
        side_nonzero += nonzero
        real = seg_ids >= 0
        fragments = seg_lens[real]
        counts += np.histogram(fragments, bins=edges)[0]
        find_split.add(seg_ids, seg_lens, offsets)
        found["chunks"] += offsets.size - 1
        found["tokens"] += int(fragments.sum())
        found["padding_positions"] += int(seg_lens[~real].sum())
        max_doc_id = max(max_doc_id, int(seg_ids.max(initial=-1)))
    split = find_split.split_ids()
    found["split_documents"] = int(split.size)
    _cross_check(manifest, found, max_doc_id, posixpath.join(resolve_output(out)[1], MANIFEST_NAME))
    shards = manifest.shards
    num_docs = manifest.counts.documents
    doc_offsets = np.array([s["doc_offset"] for s in shards] + [num_docs], np.int64)
    per_shard = np.bincount(np.searchsorted(doc_offsets, split, side="right") - 1,
                            minlength=len(shards)) if shards else np.zeros(0, np.int64)
    return PackStats(c, found["chunks"], found["tokens"], num_docs, found["padding_positions"], int(split.size),
                     edges, counts, tuple(s["path"] for s in shards), np.diff(doc_offsets)[: len(shards)],
                     per_shard[: len(shards)], packing.name,
                     tuple((c.name, c.type, int(n)) for c, n in zip(ds.extra_columns, side_nonzero)),
                     _long_docs(manifest))


def _long_docs(manifest: Manifest) -> tuple[str, int, int] | None:
    """(policy, documents, tokens) left out under ``long_docs`` truncate / drop; None under split."""
    policy = manifest.long_docs
    if policy == DEFAULT_LONG_DOCS:
        return None
    cut = manifest.counts.cut
    if policy == "truncate":
        return policy, cut.documents_truncated, cut.tokens_truncated
    return policy, cut.documents_dropped, cut.tokens_dropped


def _cross_check(manifest: Manifest, found: dict[str, int], max_doc_id: int, where: str) -> None:
    """The manifest's counts must equal what was read (documents: at least max doc id + 1)."""
    recorded = manifest.counts
    for key, value in found.items():
        if getattr(recorded, key) != value:
            raise InputError(f"{where}: counts.{key}={getattr(recorded, key)} but the chunk files hold {value}; the "
                             "output is damaged (raypack verify OUT says where)")
    if recorded.documents <= max_doc_id:
        raise InputError(f"{where}: counts.documents={recorded.documents} but the chunk files hold doc id "
                         f"{max_doc_id}; the output is damaged (raypack verify OUT says where)")


def _segment_batches(ds: PackedDataset) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(segment_doc_ids (S,) int64, segment_lengths (S,) int32, offsets (n + 1,) int64 from 0, nonzero
    values of each side column on tokens (k,) int64) per non-empty record batch, in global order,
    each checked by the reader."""
    for _, chunks in ds.record_batches():
        if chunks.num_chunks:
            real = chunks.doc_ids().reshape(-1) >= 0 if chunks.sides else None
            nonzero = np.array([np.count_nonzero(side.reshape(-1)[real]) for side in chunks.sides], np.int64)
            yield chunks.segment_doc_ids, chunks.segment_lengths, chunks.segment_offsets, nonzero


def plot_stats(stats: PackStats, path: str) -> str:
    """Write a PNG (needs matplotlib): the fragment-length histogram as a share of all fragments, the
    overall padding and split rates, and the split rate per shard. Every y axis is fixed at 0-100%
    and the x axis of the histogram at 1..C, so two outputs (a concat and a best_fit one) compare
    at a glance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (hist, overall, shards) = plt.subplots(1, 3, figsize=(14, 4), width_ratios=[3, 1, 2])
    edges = stats.fragment_bin_edges
    shares = 100.0 * stats.fragment_counts / max(1, int(stats.fragment_counts.sum()))
    hist.bar(edges[:-1], shares, width=np.diff(edges), align="edge", edgecolor="black")
    hist.set(xlabel="fragment length (tokens)", ylabel="% of fragments", xlim=(1, stats.context_length + 1),
             ylim=(0, 100), title=f"pieces of documents in chunks (C={stats.context_length})")
    overall.bar(["padding", "split"], [stats.padding_percent, stats.split_percent], edgecolor="black")
    overall.set(ylabel="% of positions / % of documents", ylim=(0, 100),
                title=f"padding {stats.padding_percent:.3f}%\nsplit {stats.split_percent:.2f}%")
    rates = np.divide(100.0 * stats.shard_split_documents, np.maximum(stats.shard_documents, 1))
    shards.bar(np.arange(rates.size), rates, edgecolor="black")
    shards.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    shards.set(xlabel="shard", ylabel="% documents split", ylim=(0, 100), title="split documents per shard")
    fig.suptitle(f"strategy {stats.strategy}: {stats.num_chunks:,} chunks, {stats.num_documents:,} documents")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
