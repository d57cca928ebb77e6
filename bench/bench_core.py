"""Benchmark raypack.rules.core packing against a literal Python packer, a numpy copy floor and
TRL-style "wrapped" packing (re-implemented here).

    PYTHONPATH=. .venv/bin/python bench/bench_core.py [--tokens 20000000] [--context-length 2048]

(``PYTHONPATH=.`` unless raypack is installed in the venv.)

Corpus: ``--tokens`` int32 tokens in memory as one pa.ListArray, document lengths lognormal
(sigma 1) with mean about C/3. Candidates, all on one pinned core:

  1. StreamPacker fed record batches of ``--batch-docs`` documents (Arrow slices), output
     compact Chunks (segments), every batch's output kept until the run ends;
     1b. the same, each batch's output dropped at once (a streaming writer's steady state);
  2. the same as 1 plus dense doc ids (``Chunks.doc_ids()``) per batch;
  3. ``pack_sequences`` on the whole corpus (dense input_ids and doc_ids);
  4. a literal pure-Python packer (one loop iteration per token) on a ``--literal-tokens``
     prefix, given Python lists, returning lists; its rate is scaled to tokens/s;
  5. numpy floor: ``np.concatenate`` of the flat values (plus padding) into a new array,
     reshaped to (n, C): the one copy any packer that materialises chunks must make;
  6. TRL-style wrapped packing, re-implemented in numpy from trl.data_utils.pack_dataset:
     per batch, new list offsets every C over the flat values; no copy, no padding, no
     document boundaries recorded. For scale only: it does far less.

Fresh large allocations on a VM are dominated by page faults (a first 80 MB copy can take
0.2 s, a warm one 0.01 s), and timings vary from run to run. So every candidate is warmed up
once, the candidates run interleaved in a rotating order within each repeat, and the table
reports the median and the min over ``--repeats`` runs, plus minor page faults per run.
Requirement reported against: candidate 1 >= 200M tokens/s on one core and >= 100x candidate 4.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from raypack.rules.core import StreamPacker, pack_sequences

GOAL_TOKENS_PER_S = 200e6
GOAL_X_LITERAL = 100.0
PAD_TOKEN = 0


# ----------------------------------------------------------------------------- corpus


def make_corpus(num_tokens: int, context_length: int, seed: int) -> pa.ListArray:
    """``num_tokens`` int32 tokens in documents of lognormal length (mean ~C/3, at least 1)."""
    rng = np.random.default_rng(seed)
    sigma = 1.0
    mu = np.log(context_length / 3) - sigma**2 / 2
    guess = int(num_tokens / (context_length / 3) * 1.5) + 16
    doc_lens = np.maximum(1, rng.lognormal(mu, sigma, size=guess).astype(np.int64))
    ends = np.cumsum(doc_lens)
    while ends[-1] < num_tokens:
        doc_lens = np.concatenate([doc_lens, doc_lens])
        ends = np.cumsum(doc_lens)
    last = int(np.searchsorted(ends, num_tokens))
    doc_lens = doc_lens[: last + 1].copy()
    doc_lens[-1] -= int(ends[last]) - num_tokens
    offsets = np.concatenate([[0], np.cumsum(doc_lens)]).astype(np.int32)
    tokens = rng.integers(0, 50_000, size=num_tokens, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))


def prefix_docs(corpus: pa.ListArray, num_tokens: int) -> list[list[int]]:
    """The first documents holding about ``num_tokens`` tokens, as Python lists."""
    ends = np.cumsum(np.diff(corpus.offsets.to_numpy()))
    num_docs = int(np.searchsorted(ends, num_tokens)) + 1
    return corpus.slice(0, num_docs).to_pylist()


# ----------------------------------------------------------------------------- candidates


def batches(corpus: pa.ListArray, batch_docs: int):
    for start in range(0, len(corpus), batch_docs):
        yield start, corpus.slice(start, batch_docs)


def stream_segments(corpus: pa.ListArray, context_length: int, batch_docs: int, keep: bool = True) -> list:
    packer = StreamPacker(context_length, PAD_TOKEN, dtype=np.int32)
    kept = []
    for start, batch in batches(corpus, batch_docs):
        chunks = packer.push(batch, start)
        if keep:
            kept.append(chunks)
    kept.append(packer.finish())
    return kept


def stream_dense(corpus: pa.ListArray, context_length: int, batch_docs: int) -> list:
    packer = StreamPacker(context_length, PAD_TOKEN, dtype=np.int32)
    kept = []
    for start, batch in batches(corpus, batch_docs):
        chunks = packer.push(batch, start)
        kept.append((chunks.input_ids, chunks.doc_ids()))
    last = packer.finish()
    kept.append((last.input_ids, last.doc_ids()))
    return kept


def literal_pack(docs: list[list[int]], context_length: int, pad_token: int) -> tuple[list, list]:
    """The rules, literally: walk every token, cut every C, pad the last chunk."""
    input_ids: list[list[int]] = []
    doc_ids: list[list[int]] = []
    chunk_tokens: list[int] = []
    chunk_ids: list[int] = []
    for doc_id, doc in enumerate(docs):
        for token in doc:
            chunk_tokens.append(token)
            chunk_ids.append(doc_id)
            if len(chunk_tokens) == context_length:
                input_ids.append(chunk_tokens)
                doc_ids.append(chunk_ids)
                chunk_tokens, chunk_ids = [], []
    if chunk_tokens:
        num_pad = context_length - len(chunk_tokens)
        input_ids.append(chunk_tokens + [pad_token] * num_pad)
        doc_ids.append(chunk_ids + [-1] * num_pad)
    return input_ids, doc_ids


def literal_pack_arrow(prefix: pa.ListArray, context_length: int, pad_token: int):
    """The literal packer with the same contract as the others: Arrow in, numpy arrays out."""
    input_ids, doc_ids = literal_pack(prefix.to_pylist(), context_length, pad_token)
    return np.array(input_ids, dtype=np.int32), np.array(doc_ids, dtype=np.int64)


def numpy_floor(values: npt.NDArray[np.int32], context_length: int) -> npt.NDArray[np.int32]:
    num_chunks = -(-values.size // context_length)
    padding = np.full(num_chunks * context_length - values.size, PAD_TOKEN, dtype=values.dtype)
    return np.concatenate([values, padding]).reshape(num_chunks, context_length)


def trl_wrapped(corpus: pa.ListArray, context_length: int, batch_docs: int) -> list[pa.ListArray]:
    """Re-implementation of TRL's pack_dataset "wrapped" pyarrow path, one call per batch.

    (TRL reads ``column.values``, which ignores a slice's offset; ``flatten()`` is used here
    so that the Arrow slices are packed correctly.)
    """
    out = []
    for _, batch in batches(corpus, batch_docs):
        values = batch.flatten()
        num_values = len(values)
        offsets = np.arange(0, num_values + 1, context_length, dtype=np.int32)
        if offsets[-1] != num_values:
            offsets = np.concatenate((offsets, [num_values])).astype(np.int32)
        out.append(pa.ListArray.from_arrays(pa.array(offsets), values))
    return out


# ----------------------------------------------------------------------------- measuring


class Candidate(NamedTuple):
    key: str
    label: str
    run: Callable[[], Any]
    num_tokens: int


class Result(NamedTuple):
    median_s: float
    min_s: float
    faults: float


def time_once(candidate: Candidate) -> tuple[float, int]:
    gc.collect()
    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    output = candidate.run()
    elapsed = time.perf_counter() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
    del output
    return elapsed, faults


def measure(candidates: list[Candidate], repeats: int) -> dict[str, Result]:
    """Warm up each candidate once, then ``repeats`` interleaved rounds in a rotating order."""
    for candidate in candidates:
        time_once(candidate)
    times: dict[str, list[float]] = {c.key: [] for c in candidates}
    faults: dict[str, list[int]] = {c.key: [] for c in candidates}
    for r in range(repeats):
        shift = r % len(candidates)
        for candidate in candidates[shift:] + candidates[:shift]:
            elapsed, num_faults = time_once(candidate)
            times[candidate.key].append(elapsed)
            faults[candidate.key].append(num_faults)
    return {
        key: Result(statistics.median(times[key]), min(times[key]), statistics.median(faults[key]))
        for key in times
    }


# ----------------------------------------------------------------------------- checks and report


def check_agreement(corpus: pa.ListArray, literal_docs: list[list[int]], context_length: int, batch_docs: int) -> None:
    """Before timing: the candidates that claim to pack by the rules agree with each other."""
    want_ids, want_docs = pack_sequences(corpus, context_length, PAD_TOKEN)
    parts = stream_dense(corpus, context_length, batch_docs)
    if not (np.array_equal(np.concatenate([p[0] for p in parts]), want_ids)
            and np.array_equal(np.concatenate([p[1] for p in parts]), want_docs)):
        raise SystemExit("StreamPacker output differs from pack_sequences")
    if not np.array_equal(numpy_floor(corpus.values.to_numpy(), context_length), want_ids):
        raise SystemExit("numpy floor differs from pack_sequences input_ids")
    lit_ids, lit_docs = literal_pack(literal_docs, context_length, PAD_TOKEN)
    ref_ids, ref_docs = pack_sequences(literal_docs, context_length, PAD_TOKEN)
    if not (np.array_equal(np.array(lit_ids), ref_ids) and np.array_equal(np.array(lit_docs), ref_docs)):
        raise SystemExit("literal packer differs from pack_sequences on the prefix")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def pin_to_one_core(cpu: int | None) -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
    os.sched_setaffinity(0, {cpu})
    pa.set_cpu_count(1)
    return cpu


def print_report(candidates: list[Candidate], results: dict[str, Result], args, cpu: int | None, corpus) -> None:
    rate = {c.key: c.num_tokens / results[c.key].median_s for c in candidates}
    literal_tokens = next(c.num_tokens for c in candidates if c.key == "literal")
    best = {c.key: c.num_tokens / results[c.key].min_s for c in candidates}
    print(f"Python {platform.python_version()}, numpy {np.__version__}, pyarrow {pa.__version__}")
    print(f"CPU: {cpu_model()}; pinned to core {cpu} of {os.cpu_count()}; pyarrow cpu_count=1")
    print(f"corpus: {args.tokens:,} int32 tokens in {len(corpus):,} documents "
          f"(mean length {args.tokens / len(corpus):.0f}), C={args.context_length}, "
          f"batches of {args.batch_docs} documents; literal on a {literal_tokens:,}-token prefix")
    print(f"{args.repeats} interleaved repeats after one warm-up; tokens/s from the median (and min) time\n")
    header = (f"{'candidate':<58} {'median s':>9} {'min s':>8} {'Mtok/s':>8} {'best':>8} "
              f"{'x literal':>10} {'x floor':>8} {'faults':>7}")
    print(header)
    print("-" * len(header))
    for c in candidates:
        r = results[c.key]
        print(f"{c.label:<58} {r.median_s:>9.4f} {r.min_s:>8.4f} {rate[c.key] / 1e6:>8.0f} "
              f"{best[c.key] / 1e6:>8.0f} {rate[c.key] / rate['literal']:>10.1f} "
              f"{rate[c.key] / rate['floor']:>8.2f} {r.faults:>7.0f}")
    stream_rate = rate["stream"]
    print(f"\nrequirement, candidate 1 (StreamPacker, segments): {stream_rate / 1e6:.0f}M tokens/s "
          f"(>= {GOAL_TOKENS_PER_S / 1e6:.0f}M: {'PASS' if stream_rate >= GOAL_TOKENS_PER_S else 'FAIL'})")
    for key, what in (("literal_arrow", "4b, same contract"), ("literal", "4, loop only")):
        x = stream_rate / rate[key]
        print(f"  {x:.0f}x the literal packer ({what}; >= {GOAL_X_LITERAL:.0f}x: "
              f"{'PASS' if x >= GOAL_X_LITERAL else 'FAIL'})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000_000, help="corpus size in tokens")
    parser.add_argument("--context-length", type=int, default=2048, help="C, tokens per chunk")
    parser.add_argument("--batch-docs", type=int, default=8192, help="documents per record batch")
    parser.add_argument("--literal-tokens", type=int, default=1_000_000, help="prefix size for the literal packer")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds after the warm-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the lowest allowed)")
    args = parser.parse_args(argv)
    for name in ("tokens", "context_length", "batch_docs", "literal_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cpu = pin_to_one_core(args.cpu)
    c, b = args.context_length, args.batch_docs
    corpus = make_corpus(args.tokens, c, args.seed)
    values = corpus.values.to_numpy()
    literal_docs = prefix_docs(corpus, min(args.literal_tokens, args.tokens))
    literal_tokens = sum(len(doc) for doc in literal_docs)
    literal_prefix = corpus.slice(0, len(literal_docs))
    check_agreement(corpus, literal_docs, c, b)

    n = args.tokens
    candidates = [
        Candidate("stream", "1  StreamPacker, Arrow batches -> Chunks (segments)",
                  lambda: stream_segments(corpus, c, b), n),
        Candidate("stream_drop", "1b StreamPacker, same, each batch's output dropped",
                  lambda: stream_segments(corpus, c, b, keep=False), n),
        Candidate("stream_dense", "2  StreamPacker + Chunks.doc_ids() (dense)",
                  lambda: stream_dense(corpus, c, b), n),
        Candidate("pack_sequences", "3  pack_sequences (dense input_ids + doc_ids)",
                  lambda: pack_sequences(corpus, c, PAD_TOKEN), n),
        Candidate("literal", "4  literal pure-Python per-token packer (scaled)",
                  lambda: literal_pack(literal_docs, c, PAD_TOKEN), literal_tokens),
        Candidate("literal_arrow", "4b literal packer, Arrow in -> numpy out (as 2, scaled)",
                  lambda: literal_pack_arrow(literal_prefix, c, PAD_TOKEN), literal_tokens),
        Candidate("floor", "5  numpy floor: np.concatenate + reshape (one copy)",
                  lambda: numpy_floor(values, c), n),
        Candidate("trl", "6  TRL-style wrapped, numpy re-impl. (offsets only)",
                  lambda: trl_wrapped(corpus, c, b), n),
    ]
    results = measure(candidates, args.repeats)
    print_report(candidates, results, args, cpu, corpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
