"""Random access over a mix against random access over a plain packed output of the same chunks.

    PYTHONPATH=. .venv/bin/python bench/bench_mix.py [--tokens 6000000] [--lookups 20000] [--repeats 7]

Packs three corpora (lognormal document lengths, int32 tokens, C = 1024) with the local engine
into three outputs and, from the same shards, one plain output holding all of them; makes a mix
of the three with weights equal to their chunk counts and N = the plain output's chunk count
(one pass over each, shuffled). Then times ``ds[i]`` for the same ``--lookups`` random
positions over both, warmed (every file opened, every record batch decoded), interleaved in
rotating rounds (bench/timing.py), and prints µs per item and the ratio. Goal: the mix within
1.5x of the plain output. Also prints the order's own cost (``MixOrder.locate``) per item.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.mix.dataset import load_mix_config, run_mix
from raypack.outputs import read_packed
from raypack.pack.config import make_config
from raypack.pack.job import run_pack

from timing import time_interleaved

GOAL_RATIO = 1.5
CONTEXT_LENGTH = 1024


def write_corpus(directory: str, num_tokens: int, seed: int) -> None:
    """Two Parquet shards of lognormal-length documents (mean ~C/3) holding ~``num_tokens`` tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(CONTEXT_LENGTH / 3) - 0.5, 1.0, num_tokens // 200).astype(np.int64))
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), num_tokens) + 1]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(tokens))
    os.makedirs(directory)
    half = len(lengths) // 2
    pq.write_table(pa.table({"input_ids": column.slice(0, half)}), os.path.join(directory, "part-0.parquet"))
    pq.write_table(pa.table({"input_ids": column.slice(half)}), os.path.join(directory, "part-1.parquet"))


def pack(inputs: list[str], output: str) -> None:
    run_pack(make_config({"inputs": inputs, "output": output, "context_length": CONTEXT_LENGTH, "pad_token": 0}),
             engine="local")


def warm(ds, indices: list[int]) -> None:
    for i in indices:
        ds[i]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=6_000_000, help="tokens in all (split over three sources)")
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mix-") as root:
        corpora = [os.path.join(root, f"corpus-{k}") for k in range(3)]
        for k, corpus in enumerate(corpora):
            write_corpus(corpus, args.tokens // 3, args.seed + k)
        for k, corpus in enumerate(corpora):
            pack([corpus], os.path.join(root, f"source-{k}"))
        pack(corpora, os.path.join(root, "plain"))
        plain = read_packed(os.path.join(root, "plain"))
        sources = [(os.path.join(root, f"source-{k}"), len(read_packed(os.path.join(root, f"source-{k}"))))
                   for k in range(3)]
        run_mix(load_mix_config(None, sources=sources, output=os.path.join(root, "mix"), num_chunks=len(plain),
                                seed=args.seed))
        mixed = read_packed(os.path.join(root, "mix"))
        indices = np.random.default_rng(args.seed).integers(0, len(plain), args.lookups).tolist()
        warm(plain, range(len(plain)))
        warm(mixed, range(len(mixed)))
        order = mixed.order
        times = time_interleaved({
            "plain ds[i]": lambda: [plain[i] for i in indices],
            "mix ds[i]": lambda: [mixed[i] for i in indices],
            "mix order alone": lambda: [order.locate(i) for i in indices],
        }, args.repeats)
    medians = {name: statistics.median(t) / args.lookups * 1e6 for name, t in times.items()}
    print(f"{len(plain):,} chunks of {CONTEXT_LENGTH} tokens; mix of {len(sources)} sources "
          f"({', '.join(f'{n:,}' for _, n in sources)} chunks), {args.lookups:,} random lookups, "
          f"median of {args.repeats}")
    for name, micros in medians.items():
        print(f"  {name:<18} {micros:8.2f} µs/item")
    ratio = medians["mix ds[i]"] / medians["plain ds[i]"]
    print(f"  ratio mix / plain  {ratio:8.2f}x  (goal <= {GOAL_RATIO}x: {'met' if ratio <= GOAL_RATIO else 'MISSED'})")
    print(f"  load average       {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
