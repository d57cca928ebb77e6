"""Issue 17: what one int8 side column (``--extra-columns loss_mask``) costs a pack.

    python bench/bench_side_columns.py                        # 50M tokens, C=2048, concat and best_fit
    python bench/bench_side_columns.py --tokens 10e6 --strategies concat --repeats 1

Corpus: ``--shards`` Parquet shards (zstd, pyarrow defaults) of ``--tokens`` int32 tokens in
documents of lognormal lengths (sigma 1, mean C/3, at least 1 token; seed 0), each with an int8
``loss_mask`` column (one 0/1 value per token). The same files are packed twice per strategy
by the local engine (``run_pack(engine="local")``: one process, no Ray), tokens only and with
``extra_columns=["loss_mask"]``, into a fresh directory each time; the two alternate in order
round after round (``--repeats``), so a noisy machine hits both alike. Reported per strategy:
each run's wall time (planning, packing, publishing), the median of each, and the ratio
side / tokens-only of the medians (the issue's bound: <= 1.5), then the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # raypack from this checkout

from raypack.pack.config import make_config  # noqa: E402
from raypack.pack.job import run_pack  # noqa: E402

BOUND = 1.5


def write_corpus(root: str, num_tokens: int, context_length: int, num_shards: int) -> str:
    """Parquet shards with ``input_ids`` (int32) and ``loss_mask`` (int8) per document; the directory."""
    rng = np.random.default_rng(0)
    mean = context_length / 3
    sigma = 1.0
    lengths = np.maximum(1, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size=int(2 * num_tokens / mean)))
    lengths = lengths.astype(np.int64)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), num_tokens)) + 1]
    shard_dir = os.path.join(root, "shards")
    os.makedirs(shard_dir)
    for k, part in enumerate(np.array_split(lengths, num_shards)):
        offsets = np.concatenate([[0], np.cumsum(part)]).astype(np.int32)
        tokens = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.int32)
        mask = (rng.random(int(offsets[-1])) < 0.7).astype(np.int8)
        table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
                          "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask))})
        pq.write_table(table, os.path.join(shard_dir, f"part-{k:04d}.parquet"))
    return shard_dir


def pack_seconds(shard_dir: str, out: str, context_length: int, strategy: str, extra: list[str]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    config = make_config(dict(inputs=[shard_dir], output=out, context_length=context_length, strategy=strategy,
                              extra_columns=extra))
    start = time.perf_counter()
    run_pack(config, engine="local")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=float, default=50e6)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--strategies", default="concat,best_fit")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workdir", help="where the corpus and outputs go (default: a temporary directory)")
    args = parser.parse_args()
    root = args.workdir or tempfile.mkdtemp(prefix="bench-side-")
    try:
        start = time.perf_counter()
        shard_dir = write_corpus(root, int(args.tokens), args.context_length, args.shards)
        print(f"corpus: {int(args.tokens):,} tokens in {args.shards} shards, C={args.context_length} "
              f"(written in {time.perf_counter() - start:.1f}s)")
        for strategy in args.strategies.split(","):
            runs: dict[str, list[float]] = {"tokens only": [], "+ loss_mask (int8)": []}
            candidates = {"tokens only": [], "+ loss_mask (int8)": ["loss_mask"]}
            for round_index in range(args.repeats):
                names = list(candidates)[::-1] if round_index % 2 else list(candidates)
                for name in names:
                    runs[name].append(pack_seconds(shard_dir, os.path.join(root, "out"), args.context_length,
                                                   strategy, candidates[name]))
            medians = {name: statistics.median(times) for name, times in runs.items()}
            for name, times in runs.items():
                print(f"{strategy:>9}  {name:<20} median {medians[name]:6.2f}s  runs "
                      + " ".join(f"{t:.2f}" for t in times))
            ratio = medians["+ loss_mask (int8)"] / medians["tokens only"]
            print(f"{strategy:>9}  ratio {ratio:.2f}x  (bound {BOUND}x: {'ok' if ratio <= BOUND else 'OVER'})")
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
