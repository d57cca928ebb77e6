"""The job against the I/O floor, and worker memory as shards grow.

    python bench/bench_job.py                      # 200M tokens, 16 Parquet shards, 2 workers
    python bench/bench_job.py --tokens 20e6        # quicker
    python bench/bench_job.py --strategy best_fit  # the best_fit strategy (two passes over each shard)

Runs in one process, side by side on the same generated corpus:
  1. a single-process pyarrow copy: read every shard's token column from Parquet and write it
     to Arrow IPC (the I/O floor a packer cannot beat by much on one machine);
  2. the raypack job with an embedded local Ray and N packer actors, timed after Ray started;
  3. the same job in one process (--local engine);
and reports the whole-process wall time, Ray start included. Then the memory check: peak RSS
of a packer process for shards of S and 10*S tokens.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PROCESS_START = time.perf_counter()

from raypack.pack.config import make_config  # noqa: E402
from raypack.pack.job import run_pack  # noqa: E402
from raypack.sample import write_sample_corpus  # noqa: E402


def pyarrow_copy(shards: list[str], out_dir: str, column: str = "input_ids", *, drop_cache: bool = False) -> float:
    """Parquet read -> Arrow IPC write, one process, batch by batch. Returns seconds.

    ``drop_cache``: every 8 MiB written, ask the kernel to write back the new bytes and drop the
    bytes before them from the page cache (POSIX_FADV_DONTNEED), as raypack's writer does
    (raypack.packed.writer.AtomicFile), so the copy never holds much page cache. Here the plain copy of 2.4 GB
    took 9.7-9.8 s in a fresh process (6.3 s of system CPU) and this one 5.4-5.6 s; of 400 MB, the
    plain copy was the faster (BENCHMARKS.md, 2026-12-05)."""
    os.makedirs(out_dir, exist_ok=True)
    start = time.perf_counter()
    for k, path in enumerate(shards):
        reader = pq.ParquetFile(path)
        schema = reader.schema_arrow
        name = os.path.join(out_dir, f"copy-{k:05d}.arrow")
        with (pa.PythonFile(_DroppingFile(name), mode="w") if drop_cache else pa.OSFile(name, "wb")) as sink:
            with pa.ipc.new_file(sink, pa.schema([schema.field(column)])) as writer:
                for batch in reader.iter_batches(batch_size=8192, columns=[column]):
                    writer.write_batch(batch)
    return time.perf_counter() - start


class _DroppingFile:
    """A file written in 8 MiB steps: each step starts the writeback of its bytes and drops the
    step before it (already written back) from the page cache."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "wb")
        self._written = self._step = self._dropped = 0

    def write(self, data) -> int:
        n = self._file.write(data)
        self._written += n
        if self._written - self._step >= 8 << 20 and hasattr(os, "posix_fadvise"):  # Linux; elsewhere a plain copy
            self._file.flush()
            os.posix_fadvise(self._file.fileno(), self._dropped, self._written - self._dropped,
                             os.POSIX_FADV_DONTNEED)
            self._dropped, self._step = self._step, self._written
        return n

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    @property
    def closed(self) -> bool:
        return self._file.closed

    def writable(self) -> bool:
        return True


STRATEGY: dict = {}
"""``strategy`` / ``best_fit_window`` for every run, from the command line."""


def run_job(shards_dir: str, out: str, *, context_length: int, workers: int, engine: str):
    config = make_config(dict(inputs=[shards_dir], output=out, context_length=context_length, pad_token=0,
                              num_workers=workers, overwrite=True, **STRATEGY))
    return run_pack(config, engine=engine)


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, "*")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=200e6)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--reuse", action="store_true", help="reuse the corpus in --workdir if it is there")
    parser.add_argument("--strategy", choices=("concat", "best_fit"), default="concat")
    parser.add_argument("--best-fit-window", type=int, default=8192)
    args = parser.parse_args()
    STRATEGY.update(strategy=args.strategy)
    if args.strategy == "best_fit":
        STRATEGY.update(best_fit_window=args.best_fit_window)

    work = args.workdir or tempfile.mkdtemp(prefix="raypack-bench-")
    c = args.context_length
    mean = c / 3
    docs_per_shard = int(args.tokens / args.shards / mean)
    t = time.perf_counter()
    corpus = os.path.join(work, "corpus")
    shards = sorted(glob.glob(os.path.join(corpus, "shard-*.parquet")))
    if len(shards) != args.shards or not args.reuse:  # --reuse: keep a corpus made by an earlier run
        shutil.rmtree(corpus, ignore_errors=True)
        shards = write_sample_corpus(corpus, num_shards=args.shards, docs_per_shard=docs_per_shard, mean_doc_len=mean)
    gen_s = time.perf_counter() - t
    print(f"# corpus: {len(shards)} Parquet shards x {docs_per_shard:,} docs, C={c} (generated in {gen_s:.1f}s); "
          f"raypack {STRATEGY}")
    print(f"# machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}, pyarrow {pa.__version__}, numpy {np.__version__}")

    from raypack.engine import pipeline

    t = time.perf_counter()
    pipeline.init_ray(None)
    ray_start = time.perf_counter() - t

    rows = []
    for rep in range(args.repeats):
        copy_s = pyarrow_copy(shards, os.path.join(work, "copy"))
        ray_sum = run_job(corpus, os.path.join(work, "out-ray"), context_length=c, workers=args.workers, engine="ray")
        local_sum = run_job(corpus, os.path.join(work, "out-local"), context_length=c, workers=1, engine="local")
        rows.append((copy_s, ray_sum.seconds, local_sum.seconds))
        tokens = ray_sum.manifest["counts"]["tokens"]
        print(f"rep {rep}: pyarrow copy {copy_s:.2f}s, raypack ray x{args.workers} {ray_sum.seconds:.2f}s "
              f"(shards packed in {ray_sum.pack_seconds:.2f}s from first start to last end), "
              f"raypack local {local_sum.seconds:.2f}s")
    assert ray_sum.manifest["content_sha256"] == local_sum.manifest["content_sha256"]
    copy_s, ray_s, local_s = (min(col) for col in zip(*rows))
    input_bytes = tokens * 4
    out_bytes = dir_bytes(os.path.join(work, "out-ray"))
    print()
    print(f"| what | seconds (best of {args.repeats}) | M tokens/s | vs pyarrow copy |")
    print("|---|---|---|---|")
    for name, s in (("pyarrow Parquet->IPC copy, 1 process", copy_s),
                    (f"raypack job, Ray, {args.workers} workers (after Ray start)", ray_s),
                    ("raypack job, one process (--local)", local_s)):
        print(f"| {name} | {s:.2f} | {tokens / s / 1e6:.1f} | {copy_s / s:.2f}x |")
    print(f"\nRay start: {ray_start:.2f}s. Output bytes / input token bytes: {out_bytes / input_bytes:.4f}"
          f" ({out_bytes:,} / {input_bytes:,}). Whole process so far: {time.perf_counter() - PROCESS_START:.1f}s")

    if not args.skip_memory:
        memory_check(work, c, args)
    print(f"\nwhole-process wall time: {time.perf_counter() - PROCESS_START:.1f}s (Ray start included)")


def memory_check(work: str, c: int, args) -> None:
    """Peak RSS of a packer for shards of S and 10*S tokens (2 shards each, fresh actors).

    S is the main corpus's shard size, so even the small shards span many read batches
    (a shard smaller than one read batch would measure the batch, not the shard)."""
    print("\n| shard tokens | peak packer RSS (MiB) |")
    print("|---|---|")
    peaks = []
    for scale in (1, 10):
        docs = int(args.tokens / args.shards / (c / 3) * scale)
        corpus = os.path.join(work, f"mem-{scale}")
        shutil.rmtree(corpus, ignore_errors=True)
        write_sample_corpus(corpus, num_shards=2, docs_per_shard=docs, mean_doc_len=c / 3, seed=scale)
        summary = run_job(corpus, os.path.join(work, f"out-mem-{scale}"), context_length=c, workers=2, engine="ray")
        peaks.append(summary.peak_worker_rss_bytes)
        print(f"| {summary.manifest['counts']['tokens'] // 2:,} | {summary.peak_worker_rss_bytes / 2**20:.0f} |")
    print(f"ratio 10x shard / 1x shard: {peaks[1] / peaks[0]:.2f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
