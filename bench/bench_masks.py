"""Benchmark raypack.rules.masks against np.full and the literal broadcasting formula.

    PYTHONPATH=. .venv/bin/python bench/bench_masks.py [--repeats 11] [--seed 0]

(``PYTHONPATH=.`` unless raypack is installed in the venv.)

Fresh large allocations on a VM are dominated by page faults and vary a lot from run to run,
so every candidate is warmed up, the candidates are interleaved within each repeat (in a
rotating order), and the table reports medians plus the ratio to ``np.full`` measured in the
same repeats. Goal: the additive mask within 1.5x of ``np.full((L, L), -inf, float32)``.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
import numpy.typing as npt

from raypack.rules.masks import (
    build_bool_mask,
    build_intra_document_mask,
    cu_seqlens,
    position_ids,
)

from timing import time_interleaved

GOAL_RATIO = 1.5


def packed_doc_ids(context_len: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """(L,) contiguous doc ids: lognormal lengths (mean ~L/3), a padded tail of up to L/10."""
    sigma = 1.0
    mu = np.log(context_len / 3) - sigma**2 / 2
    num_pad = int(rng.integers(1, context_len // 10 + 1))
    lengths = np.maximum(1, rng.lognormal(mu, sigma, size=context_len).astype(np.int64))
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), context_len - num_pad) + 1]
    ids = np.repeat(np.arange(lengths.size, dtype=np.int64), lengths)[: context_len - num_pad]
    return np.concatenate([ids, np.full(num_pad, -1, dtype=np.int64)])


def literal_mask(doc_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
    """The rule broadcast verbatim: np.where over (L, 1) / (1, L) comparisons."""
    index = np.arange(doc_ids.size)
    allowed = (
        (index[None, :] <= index[:, None])
        & (doc_ids[None, :] == doc_ids[:, None])
        & (doc_ids[:, None] != -1)
    )
    return np.where(allowed, np.float32(0.0), np.float32(-np.inf))


def repeats_for(context_len: int, repeats: int) -> int:
    """More rounds where a call is cheap: ``repeats`` at L = 8192, up to 4x that below."""
    return repeats * min(4, max(1, (8192 // context_len) ** 2))


def mask_table(context_lens: list[int], repeats: int, rng: np.random.Generator) -> bool:
    """Print the mask table; return True if the additive mask met the goal at every L."""
    print(f"{'L':>6} {'candidate':<28} {'median ms':>10} {'ratio':>7} {'ratio(paired)':>14}")
    print(f"{'':>6} (ratio: of medians; ratio(paired): median of per-round ratios to np.full)")
    met = True
    for context_len in context_lens:
        ids = packed_doc_ids(context_len, rng)
        np.testing.assert_array_equal(build_intra_document_mask(ids), literal_mask(ids))
        times = time_interleaved(
            {
                "np.full(-inf, float32)": lambda: np.full((context_len,) * 2, -np.inf, np.float32),
                "build_intra_document_mask": lambda: build_intra_document_mask(ids),
                "literal broadcasting": lambda: literal_mask(ids),
            },
            repeats_for(context_len, repeats),
        )
        base = statistics.median(times["np.full(-inf, float32)"])
        for name, seconds in times.items():
            median = statistics.median(seconds)
            paired = statistics.median(
                s / b for s, b in zip(seconds, times["np.full(-inf, float32)"])
            )
            print(f"{context_len:>6} {name:<28} {median * 1e3:>10.2f} {median / base:>7.2f} "
                  f"{paired:>14.2f}")
        num_docs = np.unique(ids[ids != -1]).size
        num_pad = np.count_nonzero(ids == -1)
        print(f"{'':>6} ({num_docs} documents, {num_pad} padding positions, "
              f"{repeats_for(context_len, repeats)} rounds)")
        met &= statistics.median(times["build_intra_document_mask"]) <= GOAL_RATIO * base
    return met


def batch_table(batch_size: int, context_len: int, repeats: int, rng: np.random.Generator) -> None:
    """Print medians of the other forms on a (batch_size, context_len) batch."""
    ids = np.stack([packed_doc_ids(context_len, rng) for _ in range(batch_size)])
    times = time_interleaved(
        {
            "np.full(-inf, float32) BxLxL": lambda: np.full(
                (batch_size, context_len, context_len), -np.inf, np.float32
            ),
            "build_intra_document_mask": lambda: build_intra_document_mask(ids),
            "np.full(False, bool) BxLxL": lambda: np.full(
                (batch_size, context_len, context_len), False
            ),
            "build_bool_mask": lambda: build_bool_mask(ids),
            "cu_seqlens": lambda: cu_seqlens(ids),
            "position_ids": lambda: position_ids(ids),
        },
        repeats,
    )
    print(f"\nbatch {batch_size} x {context_len}")
    print(f"{'candidate':<30} {'median ms':>10}")
    for name, seconds in times.items():
        print(f"{name:<30} {statistics.median(seconds) * 1e3:>10.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    met = mask_table([2048, 8192], args.repeats, rng)
    batch_table(8, 4096, args.repeats, rng)
    verdict = "met" if met else "NOT met"
    print(f"\ngoal (additive mask <= {GOAL_RATIO}x np.full at every L): {verdict}")


if __name__ == "__main__":
    main()
