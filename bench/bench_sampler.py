"""GlobalBatchSampler: its cost per batch at 10^9 chunks, and DataLoader batches/s with each attention form.

    PYTHONPATH=. .venv/bin/python bench/bench_sampler.py [--batches 2000] [--loader-batches 40] [--repeats 5]

1. The order alone: for 10^9 chunks (no output: the sampler takes a length), time a rank's share
   of ``--batches`` global batches at random steps of random epochs, per global batch size G and
   world size W, as ``iter`` gives it (numpy indices -> list of ints). Also the restart:
   ``load_state_dict`` and the first batch after it. Nothing of size 10^9 is made.
2. The loader: a sample corpus packed at C = 512 (raypack.sample, local engine), one
   ``DataLoader(PackedTorchDataset, batch_sampler=GlobalBatchSampler(G=64, W=8), collate_fn=...)``
   per attention form, ``num_workers=0``: batches/s of the loader alone, and of the loader plus
   one attention forward over the batch (H = 4, D = 32, float32, random q/k/v): SDPA with the
   additive mask, SDPA with the bool mask, ``flex_attention`` (uncompiled) with the BlockMask, and
   torch's ``varlen_attn`` with ``cu_seqlens`` where it runs (flash-attn kernels: CUDA only).
Medians of ``--repeats`` interleaved rounds (bench/timing.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.sample import write_sample_corpus
from raypack.torch_data import ATTENTION_FORMS, GlobalBatchSampler, PackedTorchDataset, make_collate_fn

from timing import time_interleaved

LENGTH = 10**9
HEADS, HEAD_DIM = 4, 32
CONTEXT_LENGTH = 512


def order_cost(batches: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    print(f"1. sampler cost per batch, {LENGTH:,} chunks, {batches} global batches at random (epoch, step)")
    print(f"   {'G':>6} {'W':>4} {'items/rank':>10} {'µs/batch':>10} {'µs/item':>8}")
    for global_batch_size in (256, 1024, 4096):
        for world_size in (1, 8, 64):
            sampler = GlobalBatchSampler(LENGTH, global_batch_size=global_batch_size, rank=world_size - 1,
                                         world_size=world_size, seed=17)
            epochs = rng.integers(0, 100, batches).tolist()
            steps = rng.integers(0, sampler.num_steps, batches).tolist()

            def shares(sampler=sampler, epochs=epochs, steps=steps) -> None:
                for epoch, step in zip(epochs, steps):
                    sampler.order.share(epoch, step, sampler.rank, sampler.world_size).tolist()

            seconds = statistics.median(time_interleaved({"shares": shares}, repeats)["shares"])
            per_batch = seconds / batches * 1e6
            print(f"   {global_batch_size:>6} {world_size:>4} {sampler.local_batch_size:>10} {per_batch:>10.1f} "
                  f"{per_batch / sampler.local_batch_size:>8.3f}")
    sampler = GlobalBatchSampler(LENGTH, global_batch_size=1024, rank=3, world_size=8, seed=17)
    state = {**sampler.state_dict(), "epoch": 41, "step": 123_456}

    def restart() -> None:
        fresh = GlobalBatchSampler(LENGTH, global_batch_size=1024, rank=1, world_size=4, seed=17)
        fresh.load_state_dict(state)
        next(iter(fresh))

    seconds = statistics.median(time_interleaved({"restart": restart}, repeats * 20)["restart"])
    print(f"   restart at epoch 41 step 123,456 (new sampler, load_state_dict, first batch, W 8 -> 4): "
          f"{seconds * 1e6:.0f} µs")


def attention(form: str, batch: dict, q: torch.Tensor) -> torch.Tensor | None:
    """One attention forward of the batch's form over (B, H, L, D) ``q`` (= k = v); None where it cannot run."""
    if form in ("additive", "bool"):
        return F.scaled_dot_product_attention(q, q, q, attn_mask=batch["attention_mask"][:, None])
    if form == "flex":
        return flex_attention(q, q, q, block_mask=batch["block_mask"])
    from torch.nn.attention.varlen import varlen_attn

    flat = q.transpose(1, 2).flatten(0, 1)                  # (B * L, H, D)
    cu = batch["cu_seqlens"]
    return varlen_attn(flat, flat, flat, cu, cu, batch["max_seqlen"], batch["max_seqlen"])


def loader_rates(loader_batches: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_sample_corpus(os.path.join(tmp, "in"), num_shards=4, docs_per_shard=500, mean_doc_len=300, seed=1)
        out = os.path.join(tmp, "out")
        run_pack(make_config({"inputs": [os.path.join(tmp, "in")], "output": out, "context_length": CONTEXT_LENGTH}),
                 engine="local")
        dataset = PackedTorchDataset(out)
        sampler = GlobalBatchSampler(dataset, global_batch_size=64, rank=0, world_size=8, seed=3)
        print(f"2. DataLoader over {len(dataset):,} chunks of {CONTEXT_LENGTH} (G = 64, W = 8: 8 chunks per batch, "
              f"num_workers=0), {loader_batches} batches, torch {torch.__version__}, {torch.get_num_threads()} "
              "threads")
        candidates, runnable = {}, {}
        for form in ATTENTION_FORMS:
            options = {"padding_attends_self": True} if form in ("additive", "bool") else {}
            loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=make_collate_fn(form,
                                                                                                          **options))
            q = torch.randn(8, HEADS, CONTEXT_LENGTH, HEAD_DIM)
            try:
                attention(form, next(iter(loader)), q)
                runnable[form] = True
            except (NotImplementedError, RuntimeError) as e:
                runnable[form] = False
                print(f"   {form}: its attention does not run here ({type(e).__name__}: {str(e).split(' with ')[0]})")

            def load(loader=loader) -> None:
                for _, batch in zip(range(loader_batches), loader):
                    pass

            def load_and_attend(loader=loader, form=form, q=q) -> None:
                for _, batch in zip(range(loader_batches), loader):
                    attention(form, batch, q)

            candidates[f"{form} loader"] = load
            if runnable[form]:
                candidates[f"{form} loader + attention"] = load_and_attend
        times = time_interleaved(candidates, repeats)
        print(f"   {'form':<10} {'loader batches/s':>17} {'+ attention batches/s':>22}")
        for form in ATTENTION_FORMS:
            alone = loader_batches / statistics.median(times[f"{form} loader"])
            key = f"{form} loader + attention"
            both = f"{loader_batches / statistics.median(times[key]):>22.1f}" if key in times else f"{'n/a':>22}"
            print(f"   {form:<10} {alone:>17.1f} {both}")


def main() -> None:
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--loader-batches", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    order_cost(args.batches, args.repeats)
    loader_rates(args.loader_batches, args.repeats)


if __name__ == "__main__":
    main()
