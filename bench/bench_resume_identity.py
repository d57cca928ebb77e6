"""What --resume's input identity costs: the sampled identity (size + first/last MiB + Parquet
footer) and the full sha256 (--verify-inputs) over every shard of a bench_job-style corpus.

    PYTHONPATH=$PWD python bench/bench_resume_identity.py --tokens 200e6   # 16 Parquet shards, like bench_job.py

Each figure is the whole corpus, one process, files read as the packers read them (the
sampled identity right after the full hash: both on a warm page cache, as after generating).
--corpus DIR reuses (or generates into) DIR.
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
import time

from raypack.pack.resume import file_sha256, sampled_identity
from raypack.sample import write_sample_corpus


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=float, default=200e6)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--corpus", help="reuse this directory of shards instead of generating one")
    args = parser.parse_args()
    corpus = args.corpus or tempfile.mkdtemp(prefix="raypack-bench-identity-")
    if not glob.glob(os.path.join(corpus, "shard-*")):
        mean = args.context_length / 3  # as bench/bench_job.py
        write_sample_corpus(corpus, num_shards=args.shards, docs_per_shard=int(args.tokens / args.shards / mean),
                            mean_doc_len=mean)
    shards = sorted(glob.glob(os.path.join(corpus, "shard-*")))
    num_bytes = sum(os.path.getsize(p) for p in shards)
    start = time.perf_counter()
    for path in shards:
        file_sha256(path)
    full_s = time.perf_counter() - start
    start = time.perf_counter()
    for path in shards:
        sampled_identity(path, "parquet")
    sampled_s = time.perf_counter() - start
    print(f"# {len(shards)} shards, {num_bytes / 2**20:.0f} MiB in {corpus}; load average {os.getloadavg()[0]:.1f}")
    print(f"sampled identity, all shards: {sampled_s:.3f} s ({1e3 * sampled_s / len(shards):.1f} ms/shard)")
    print(f"full sha256, all shards:      {full_s:.2f} s ({num_bytes / 2**20 / full_s:.0f} MiB/s)")


if __name__ == "__main__":
    main()
