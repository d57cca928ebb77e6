"""Issue 16 (MDS part): ``export_mds`` tokens/s against a plain numpy memmap copy of the same tokens.

    PYTHONPATH=$PWD python bench/bench_export_mds.py                      # 20M tokens, C = 2048, uint16
    PYTHONPATH=$PWD python bench/bench_export_mds.py --tokens 50e6 --repeats 5 --workdir /tmp/mdsbench

One process, one run: a sample corpus (``raypack.sample``, lognormal lengths of mean C/3) is
packed once with ``--local`` (concat), then two candidates are timed interleaved (one warm-up
each, then ``--repeats`` rotating rounds), both reading the same packed output from the page
cache and writing a new output: before each call, untimed, the previous output is removed and
``os.sync()`` waits for the disk, so no candidate pays for another's writeback.

  memmap  the floor: ``read_packed`` record batch by record batch, each batch's tokens assigned
          into a ``np.memmap`` of shape (chunks, C) in the token dtype, then ``flush()`` (msync).
          Tokens only: no segments, no format.
  mds     ``raypack.export.mds.export_mds(packed, out)``: one part per packed file, 64 MiB
          shards, each fsynced (AtomicFile), ``index.json`` last.

Reported: tokens (chunks x C positions) per second, median of the rounds, the ratio mds/memmap,
the load average before and after (2 cores shared by other work: read the ratio, not the
absolute figures). The goal of issue 16 is a ratio >= 0.8.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Callable

import numpy as np

from raypack.export.mds import export_mds
from raypack.outputs import read_packed
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.sample import write_sample_corpus


def make_packed(workdir: str, num_tokens: float, context_length: int, dtype: str) -> str:
    """Pack a sample corpus of about ``num_tokens`` into ``workdir/packed`` (kept and reused when there)."""
    corpus, packed = os.path.join(workdir, "corpus"), os.path.join(workdir, "packed")
    if os.path.exists(os.path.join(packed, "manifest.json")):
        return packed
    mean = context_length / 3
    docs_per_shard = max(1, int(num_tokens / mean / 8))
    write_sample_corpus(corpus, num_shards=8, docs_per_shard=docs_per_shard, mean_doc_len=mean, dtype=dtype)
    config = make_config(dict(inputs=[corpus], output=packed, context_length=context_length, pad_token=0,
                              token_dtype=dtype))
    run_pack(config, engine="local")
    return packed


def memmap_copy(packed: str, out: str) -> int:
    if os.path.exists(out):
        os.remove(out)
    ds = read_packed(packed)
    target = np.memmap(out, dtype=ds.token_dtype, mode="w+", shape=(len(ds), ds.context_length))
    start = 0
    for _, chunks in ds.record_batches():
        target[start: start + chunks.num_chunks] = chunks.input_ids
        start += chunks.num_chunks
    target.flush()
    del target
    return start * ds.context_length


def remove(path: str) -> None:
    """Remove an earlier output and wait for the disk, so that no candidate pays for another's writes."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)
    os.sync()


def time_rounds(candidates: dict[str, tuple[Callable[[], object], Callable[[], object]]],
                repeats: int) -> dict[str, list[float]]:
    """Seconds per timed call of each candidate ``(setup, call)``: one warm-up each, then ``repeats``
    rotating rounds; ``setup`` (removing the previous output) runs before every call, untimed."""
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(-1, repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            setup, call = candidates[name]
            setup()
            start = time.perf_counter()
            call()
            if round_index >= 0:
                times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=20e6)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--dtype", default="uint16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="kept when given; a temporary directory otherwise")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="raypack-mds-bench-")
    os.makedirs(workdir, exist_ok=True)
    try:
        print(f"load average before: {os.getloadavg()}", flush=True)
        packed = make_packed(workdir, args.tokens, args.context_length, args.dtype)
        ds = read_packed(packed)
        num_tokens = len(ds) * ds.context_length
        print(f"packed: {len(ds)} chunks x {ds.context_length} = {num_tokens:,} tokens ({ds.token_dtype}), "
              f"{len(ds.file_items())} files", flush=True)
        mds_out, mm_out = os.path.join(workdir, "mds"), os.path.join(workdir, "tokens.npy")
        times = time_rounds({
            "memmap": (lambda: remove(mm_out), lambda: memmap_copy(packed, mm_out)),
            "mds": (lambda: remove(mds_out), lambda: export_mds(packed, mds_out)),
        }, repeats=args.repeats)
        print(f"load average after: {os.getloadavg()}")
        rates = {name: num_tokens / statistics.median(ts) for name, ts in times.items()}
        for name, ts in times.items():
            print(f"{name:7s} {rates[name] / 1e6:8.1f} M tokens/s  (median of {[round(t, 3) for t in ts]} s)")
        remove(mds_out)
        summary = export_mds(packed, mds_out)
        print(f"mds: {summary.num_shards} shards, {summary.num_bytes / num_tokens / ds.token_dtype.itemsize:.4f} "
              "bytes per token byte")
        print(f"ratio mds / memmap: {rates['mds'] / rates['memmap']:.2f}  (goal >= 0.8)")
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
