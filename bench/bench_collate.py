"""Benchmark raypack.torch_data: loading a batch vs building its attention information.

    .venv/bin/python bench/bench_collate.py [--batch 8] [--context-length 4096] [--repeats 9]

Packs a sample corpus (raypack.sample, log-normal document lengths) with the local engine into
a temporary directory, then times, per batch of ``--batch`` chunks (medians over interleaved
rounds, after one warm-up each, like bench_masks.py):

  * loading: ``PackedTorchDataset`` items of one batch, and ``np.stack`` of them (what the
    collate does before building anything);
  * each attention form alone (``build_intra_document_mask``, ``build_bool_mask``,
    ``cu_seqlens``, ``build_block_mask``), FlexAttention's own ``create_block_mask`` over the
    same mask_mod for comparison, and the whole ``collate_packed`` per form (labels,
    position ids, tensors included).

A second table grows L at a fixed batch on synthetic packed doc ids, to show the cost
order of each form: O(L^2) dense, O(L) varlen, O(L + (L / block)^2) flex from blocks.
Allocation-heavy timings (the dense masks: 8 x 4096 x 4096 is 512 MiB of float32) vary
with the machine's load (page faults: one np.full of 512 MiB took 60 ms to 1.2 s on a shared
2-CPU VM), so the first table gives the median and the minimum, the second the minimum.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from typing import Callable

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask

from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.rules.masks import build_bool_mask, build_intra_document_mask, cu_seqlens
from raypack.sample import lognormal_lengths, write_sample_corpus
from raypack.torch_data import ATTENTION_FORMS, PackedTorchDataset, build_block_mask, collate_packed, document_mask_mod

from timing import time_interleaved

BLOCK_SIZE = 128


def time_median_min(candidates: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(median, min) seconds per call of each candidate, measured interleaved."""
    times = time_interleaved(candidates, repeats)
    return {name: (statistics.median(seconds), min(seconds)) for name, seconds in times.items()}


def pack_corpus(root: str, batch: int, context_len: int, num_batches: int, mean_doc_len: float) -> str:
    """A packed directory of about ``num_batches * batch`` chunks of ``context_len``."""
    tokens = num_batches * batch * context_len
    docs_per_shard = int(tokens / mean_doc_len / 2) + 1
    shards = write_sample_corpus(f"{root}/shards", num_shards=2, docs_per_shard=docs_per_shard,
                                 mean_doc_len=mean_doc_len, seed=0)
    out = f"{root}/packed"
    run_pack(make_config(dict(inputs=shards, output=out, context_length=context_len, pad_token=0)), engine="local")
    return out


def create_block_mask_of(doc_ids: np.ndarray):
    """FlexAttention's create_block_mask over the same mask_mod (evaluates all B * L * L pairs)."""
    size = doc_ids.shape[1]
    mask_mod = document_mask_mod(torch.from_numpy(doc_ids))
    return create_block_mask(mask_mod, len(doc_ids), 1, size, size, device="cpu", BLOCK_SIZE=BLOCK_SIZE)


def form_table(packed: str, batch: int, repeats: int) -> None:
    ds = PackedTorchDataset(packed)
    num_batches = len(ds) // batch
    rounds = iter(range(10**9))
    def indices() -> range:  # a different batch each call, cycling through the file
        start = next(rounds) % num_batches * batch
        return range(start, start + batch)
    samples = [ds[i] for i in indices()]
    doc_ids = np.stack([s["doc_ids"] for s in samples])
    segments = 1 + np.count_nonzero(doc_ids[:, 1:] != doc_ids[:, :-1])
    candidates: dict[str, Callable[[], object]] = {
        "load: dataset items": lambda: [ds[i] for i in indices()],
        "load: items + np.stack": lambda: [np.stack([s[k] for s in (ds[i] for i in indices())])
                                           for k in ("input_ids", "doc_ids")],
        "additive mask alone": lambda: build_intra_document_mask(doc_ids),
        "bool mask alone": lambda: build_bool_mask(doc_ids),
        "varlen cu_seqlens alone": lambda: cu_seqlens(doc_ids),
        "flex build_block_mask alone": lambda: build_block_mask(doc_ids, BLOCK_SIZE),
        "flex create_block_mask (torch)": lambda: create_block_mask_of(doc_ids),
    }
    for form in ATTENTION_FORMS:
        candidates[f"collate_packed {form}"] = lambda form=form: collate_packed(samples, form)
    medians = time_median_min(candidates, repeats)
    length = doc_ids.shape[1]
    print(f"per batch of {batch} chunks x L = {length} ({segments} segments, {len(ds)} chunks packed, "
          f"{repeats} rounds, torch {torch.__version__}, {torch.get_num_threads()} threads)")
    print(f"{'step':<34} {'median ms':>10} {'min ms':>10}")
    for name, (median, best) in medians.items():
        print(f"{name:<34} {median * 1e3:>10.3f} {best * 1e3:>10.3f}")


def synthetic_doc_ids(batch: int, context_len: int, mean_doc_len: float, seed: int) -> np.ndarray:
    """(batch, L) packed doc ids: log-normal documents end to end, the last row's tail padded."""
    lens = lognormal_lengths(2 * batch * context_len // int(mean_doc_len) + 8, mean_doc_len, seed=seed)
    ids = np.repeat(np.arange(lens.size, dtype=np.int64), lens)[: batch * context_len].reshape(batch, context_len)
    ids[-1, -context_len // 10:] = -1
    return ids


def scaling_table(batch: int, context_lens: list[int], mean_doc_len: float, repeats: int) -> None:
    print(f"\ngrowth with L, batch of {batch} (synthetic packed ids, mean document {mean_doc_len:g} tokens)")
    print(f"{'L':>6} {'additive':>10} {'bool':>10} {'varlen':>10} {'flex blocks':>12} "
          f"{'create_block_mask':>18}  (min ms)")
    for context_len in context_lens:
        ids = synthetic_doc_ids(batch, context_len, mean_doc_len, seed=context_len)
        medians = time_median_min({
            "additive": lambda: build_intra_document_mask(ids),
            "bool": lambda: build_bool_mask(ids),
            "varlen": lambda: cu_seqlens(ids),
            "flex": lambda: build_block_mask(ids, BLOCK_SIZE),
            "create_block_mask": lambda: create_block_mask_of(ids),
        }, repeats)
        ms = {k: best * 1e3 for k, (_, best) in medians.items()}
        print(f"{context_len:>6} {ms['additive']:>10.2f} {ms['bool']:>10.2f} {ms['varlen']:>10.3f} "
              f"{ms['flex']:>12.3f} {ms['create_block_mask']:>18.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context-length", type=int, default=4096)
    parser.add_argument("--num-batches", type=int, default=8, help="batches of chunks to pack")
    parser.add_argument("--mean-doc-len", type=float, default=1000.0)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--scaling", default="1024,2048,4096,8192", help="L values of the growth table ('' skips it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        packed = pack_corpus(root, args.batch, args.context_length, args.num_batches, args.mean_doc_len)
        form_table(packed, args.batch, args.repeats)
    if args.scaling:
        lengths = [int(x) for x in args.scaling.split(",")]
        scaling_table(args.batch, lengths, args.mean_doc_len, max(3, args.repeats // 3))


if __name__ == "__main__":
    main()
