"""Sub-shard tasks (issue 15): one large Parquet shard against the same documents as 8 shards.

    python bench/bench_subshard.py                    # ~200M tokens, Ray with 2 workers and --local
    python bench/bench_subshard.py --tokens 20e6      # quicker

Writes 8 Parquet shards (row groups of --row-group-docs documents), then ONE Parquet file of the
same documents in the same order with the same row-group size, and packs:
  1. the one file with task_tokens=0 (one task: what a one-shard corpus got before issue 15);
  2. the one file with the default task_tokens (tasks of whole row groups);
  3. the 8 shards with the default task_tokens (one task each, as they are smaller);
each with Ray (N workers, timed after Ray started, one warm-up job first) and with --local.
Prints the number of tasks, the packing phase ("first task start to last task end") and the
whole run, and checks the three outputs hold the same chunks.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile
import time

import numpy as np
import pyarrow.parquet as pq

from raypack.outputs import read_packed
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.pack.plan import make_plan
from raypack.sample import write_sample_corpus


def write_corpora(root: str, tokens: float, mean_doc_len: int, row_group_docs: int) -> tuple[str, str]:
    eight = os.path.join(root, "eight")
    docs_per_shard = int(tokens / mean_doc_len / 8)
    paths = write_sample_corpus(eight, num_shards=8, docs_per_shard=docs_per_shard, mean_doc_len=mean_doc_len,
                                seed=15, row_group_size=row_group_docs)
    one = os.path.join(root, "one")
    os.makedirs(one)
    schema = pq.ParquetFile(paths[0]).schema_arrow
    with pq.ParquetWriter(os.path.join(one, "all.parquet"), schema) as writer:
        for path in paths:  # row groups restart per shard: the same documents, one file
            writer.write_table(pq.read_table(path), row_group_size=row_group_docs)
    return eight, one


def run(inputs: str, out: str, *, engine: str, workers: int, context_length: int, task_tokens: int | None):
    values = dict(inputs=[inputs], output=out, context_length=context_length, pad_token=0, num_workers=workers,
                  overwrite=True)
    if task_tokens is not None:
        values["task_tokens"] = task_tokens
    config = make_config(values)
    num_tasks = len(make_plan(config).tasks)
    summary = run_pack(config, engine=engine)
    return num_tasks, summary


def same_chunks(a: str, b: str) -> bool:
    left, right = read_packed(a), read_packed(b)
    if len(left) != len(right):
        return False
    for x, y in zip(left.iter_batches(4096), right.iter_batches(4096)):
        if not (np.array_equal(x["input_ids"], y["input_ids"]) and np.array_equal(x["doc_ids"], y["doc_ids"])):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=200e6)
    parser.add_argument("--mean-doc-len", type=int, default=683)
    parser.add_argument("--row-group-docs", type=int, default=4096)
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engines", default="ray,local")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-subshard-")
    try:
        t0 = time.perf_counter()
        eight, one = write_corpora(root, args.tokens, args.mean_doc_len, args.row_group_docs)
        meta = pq.ParquetFile(os.path.join(one, "all.parquet")).metadata
        print(f"corpus: {meta.num_rows:,} documents, {meta.num_row_groups} row groups in one file "
              f"(written in {time.perf_counter() - t0:.0f}s); load average before: {os.getloadavg()}")
        cases = [("1 file, task_tokens=0", one, 0), ("1 file, default task_tokens", one, None),
                 ("8 files, default task_tokens", eight, None)]
        print("| corpus | engine | tasks | files | packing s | run s | tokens/s (run) | content_sha256 |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        for engine in args.engines.split(","):
            if engine == "ray":  # start Ray and warm the actor pool's imports once
                run(eight, os.path.join(root, "warm"), engine="ray", workers=args.workers,
                    context_length=args.context_length, task_tokens=None)
            outs = []
            for label, inputs, task_tokens in cases:
                out = os.path.join(root, f"out-{engine}-{len(outs)}")
                num_tasks, summary = run(inputs, out, engine=engine, workers=args.workers,
                                         context_length=args.context_length, task_tokens=task_tokens)
                tokens = summary.manifest["counts"]["tokens"]
                print(f"| {label} | {engine}{f', {args.workers} workers' if engine == 'ray' else ''} | {num_tasks} "
                      f"| {len(summary.manifest['files'])} | {summary.pack_seconds:.2f} | {summary.seconds:.2f} "
                      f"| {tokens / summary.seconds / 1e6:.0f}M | {summary.manifest['content_sha256'][:16]}... |",
                      flush=True)
                outs.append(out)
            print(f"same chunks ({engine}): {all(same_chunks(outs[0], o) for o in outs[1:])}", flush=True)
            for out in outs:
                shutil.rmtree(out, ignore_errors=True)
        print(f"load average after: {os.getloadavg()}; files: {len(glob.glob(os.path.join(eight, '*')))} shards")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
