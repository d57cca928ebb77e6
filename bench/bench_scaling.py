"""What the driver and the workers cost as a job grows: shard count and shard size.

    python bench/bench_scaling.py                                # 10..10000 shards, a few minutes on 2 CPUs
    python bench/bench_scaling.py --shards 10,100,1000 --skip-worker-memory   # about a minute

Four measurements, each in a fresh child process (``--child``) so that memory numbers are not
left over from an earlier one; results are printed as markdown tables (docs/SCALING.md):

  1. planning: ``raypack.pack.plan.make_plan`` over N tiny Parquet shards (4 documents each; the N
     files are hard links into one pool): wall time (best of --repeats; listing alone too),
     tracemalloc peak, bytes the Plan keeps, peak RSS growth of the process.
  2. stitching: ``raypack.pack.assemble.stitch_boundaries`` on N synthetic ShardResults whose head
     and tail fragments hold C/2 tokens each (C=2048; int32), so every shard boundary is a
     chunk made of two fragments; then ``write_boundaries`` (one file per boundary chunk, each
     fsynced) and the JSON size of the manifest ``build_manifest`` makes for N shards and 2N
     files.
  3. the whole job over the tiny corpora of (1): one process (``engine="local"``) for every N,
     and an embedded Ray with 2 packers for N <= --ray-max-shards, each after a warm-up job on
     one shard (Ray start, imports and the first pipeline excluded).
  4. worker memory: a Ray job over 2 shards of S tokens, then 2 shards of 10*S tokens
     (``Summary.peak_worker_rss_bytes``: the largest peak RSS of any packer process).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

C = 2048
DOCS_PER_TINY_SHARD = 4


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes() -> int:
    return _status_kib("VmRSS")


def reset_peak_rss() -> int:
    """Reset this process's peak RSS (Linux: clear_refs 5 resets VmHWM); return the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_bytes()


def peak_rss_bytes() -> int:
    """Peak RSS since the last reset_peak_rss (VmHWM)."""
    return _status_kib("VmHWM")


# ----------------------------------------------------------------------------- corpora


def write_tiny_pool(pool: str, count: int) -> None:
    """``count`` Parquet shards of 4 short documents each (8-40 tokens), written with pyarrow."""
    os.makedirs(pool, exist_ok=True)
    rng = np.random.default_rng(0)
    for k in range(count):
        path = os.path.join(pool, f"shard-{k:06d}.parquet")
        if os.path.exists(path):
            continue
        lengths = rng.integers(8, 41, size=DOCS_PER_TINY_SHARD)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        tokens = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.int32)
        docs = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))
        pq.write_table(pa.table({"input_ids": docs}), path)


def link_corpus(pool: str, corpus: str, count: int) -> None:
    """A directory of the pool's first ``count`` shards, as hard links (no copying)."""
    shutil.rmtree(corpus, ignore_errors=True)
    os.makedirs(corpus)
    for k in range(count):
        name = f"shard-{k:06d}.parquet"
        os.link(os.path.join(pool, name), os.path.join(corpus, name))


# ----------------------------------------------------------------------------- children


def child_plan(corpus: str, repeats: int) -> dict:
    from raypack.inputs.shards import discover_shards
    from raypack.pack.config import make_config
    from raypack.pack.plan import make_plan

    config = make_config(dict(inputs=[corpus], output=corpus + "-out", context_length=C, pad_token=0))
    # Warm up on up to 8 shards first: libraries, and the 8 threads' allocator arenas (~35 MiB here).
    firsts = [os.path.join(corpus, name) for name in sorted(os.listdir(corpus))[:8]]
    make_plan(make_config(dict(inputs=firsts, context_length=C)))
    rss_start = reset_peak_rss()
    list_s, plan_s = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        discover_shards([corpus])
        list_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        plan = make_plan(config)
        plan_s.append(time.perf_counter() - t)
    del plan
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    plan = make_plan(config)
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"shards": len(plan.tasks), "tokens": plan.num_tokens, "list_s": min(list_s), "plan_s": min(plan_s),
            "tracemalloc_peak": peak - base, "plan_kept": kept - base,
            "rss_growth": peak_rss_bytes() - rss_start}


def synthetic_results(num_shards: int, context_length: int):
    """ShardResults whose head and tail fragments hold C/2 tokens each.

    Shard 0 spans [0, 3.5C) (tail only); shard k >= 1 spans 3C tokens starting at C/2 past a
    chunk boundary, so it has a head and a tail of C/2 and owns two whole chunks.
    """
    from raypack.pack.tasks import ShardResult
    from raypack.rules.core import Fragment

    half = context_length // 2
    results, start, frag_id = [], 0, 0

    def fragment(position: int) -> Fragment:
        nonlocal frag_id
        frag_id += 1
        return Fragment(position, np.full(half, frag_id % 50_000, np.int32), np.array([frag_id], np.int64),
                        np.array([half], np.int32))

    for k in range(num_shards):
        length = 3 * context_length + (half if k == 0 else 0)
        head = None if k == 0 else fragment(start)
        tail = fragment(start + length - half)
        results.append(ShardResult(k, None, head, tail, 1, 1, length, 0))
        start += length
    return results, start


def child_stitch(num_shards: int, out_dir: str, write: bool, repeats: int) -> dict:
    from raypack.inputs.base import ShardInfo
    from raypack.pack.assemble import count_stats, stitch_boundaries, write_boundaries
    from raypack.pack.config import make_config
    from raypack.pack.plan import Plan
    from raypack.pack.tasks import PackSettings, ShardTask
    from raypack.packed.manifest import build_manifest
    from raypack.packed.writer import WrittenFile

    results, num_tokens = synthetic_results(num_shards, C)
    fragment_bytes = sum(f.input_ids.nbytes + f.segment_doc_ids.nbytes + f.segment_lengths.nbytes
                         for r in results for f in (r.head, r.tail) if f is not None)
    num_fragments = sum(f is not None for r in results for f in (r.head, r.tail))
    paths = [f"/mnt/shared/corpus/part-{k:06d}.parquet" for k in range(num_shards)]
    infos = tuple(ShardInfo(p, "parquet", 1, r.num_tokens, "int32", "parquet-footer") for p, r in zip(paths, results))
    offsets = np.concatenate([[0], np.cumsum([r.num_tokens for r in results])])
    tasks = tuple(ShardTask(k, p, "parquet", k, int(offsets[k]), 1, r.num_tokens)
                  for k, (p, r) in enumerate(zip(paths, results)))
    plan = Plan(infos, tasks, "int32", num_shards, num_tokens, C)
    settings = PackSettings(out_dir=out_dir, context_length=C, pad_token=0, token_dtype="int32",
                            token_column="input_ids", read_batch_size=0, read_batch_tokens=1 << 20,
                            chunks_per_record_batch=512, strategy=plan.packing.name)

    stitch_s = []
    for _ in range(repeats):
        t = time.perf_counter()
        runs = stitch_boundaries(results, plan, settings)
        stitch_s.append(time.perf_counter() - t)
        del runs
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    runs = stitch_boundaries(results, plan, settings)
    kept, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out = {"shards": num_shards, "fragments": num_fragments, "fragment_bytes": fragment_bytes,
           "stitched_chunks": sum(c.num_chunks for _, c in runs), "boundary_runs": len(runs),
           "stitch_s": min(stitch_s), "stitch_tracemalloc_peak": peak - base, "stitched_kept": kept - base}
    if write:
        os.makedirs(out_dir, exist_ok=True)
        t = time.perf_counter()
        files = write_boundaries(runs, settings)
        out["write_boundaries_s"] = time.perf_counter() - t
    else:
        files = [WrittenFile(f"chunks-{first:012d}.arrow", first, c.num_chunks, 0, "0" * 64) for first, c in runs]
    # One owned-chunks file per shard (shards here own 2 chunks each) plus the boundary files.
    owned = [WrittenFile(f"chunks-{int(-(-t.token_offset // C)):012d}.arrow", int(-(-t.token_offset // C)), 2,
                         0, "f" * 64) for t in tasks]
    config = make_config(dict(inputs=["/mnt/shared/corpus"], output="/mnt/shared/packed", context_length=C,
                              pad_token=0))
    all_files = sorted(owned + files, key=lambda f: f.first_chunk)
    manifest = build_manifest(config, plan, all_files, count_stats(results, plan))
    out["manifest_files"] = len(all_files)
    out["manifest_bytes"] = len(json.dumps(manifest, indent=2))
    return out


def child_job(corpus: str, engine: str, out: str) -> dict:
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack

    config = make_config(dict(inputs=[corpus], output=out, context_length=C, pad_token=0, num_workers=2,
                              overwrite=True))
    if engine == "ray":
        from raypack.engine import pipeline

        pipeline.init_ray(None)
    # Warm up on one shard (imports, first Ray Data pipeline) so the numbers below are the job's own.
    first = os.path.join(corpus, sorted(os.listdir(corpus))[0])
    run_pack(make_config(dict(inputs=[first], output=out + "-warmup", context_length=C, pad_token=0, overwrite=True)),
             engine=engine)
    shutil.rmtree(out + "-warmup", ignore_errors=True)
    rss_start = reset_peak_rss()
    cpu_start = time.process_time()
    summary = run_pack(config, engine=engine)
    driver_cpu_s = time.process_time() - cpu_start
    manifest_bytes = os.path.getsize(os.path.join(out, "manifest.json"))
    return {"engine": engine, "shards": len(summary.manifest["shards"]), "seconds": summary.seconds,
            "files": len(summary.manifest["files"]), "chunks": summary.manifest["counts"]["chunks"],
            "manifest_bytes": manifest_bytes, "driver_rss_growth": peak_rss_bytes() - rss_start,
            "driver_cpu_s": driver_cpu_s}


def child_worker_memory(work: str, shard_tokens: int, seed: int, read_batch_size: int) -> dict:
    from raypack.engine import pipeline
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack
    from raypack.sample import write_sample_corpus

    corpus = os.path.join(work, f"mem-{shard_tokens}")
    shutil.rmtree(corpus, ignore_errors=True)
    write_sample_corpus(corpus, num_shards=2, docs_per_shard=int(shard_tokens / (C / 3)), mean_doc_len=C / 3, seed=seed)
    pipeline.init_ray(None)
    config = make_config(dict(inputs=[corpus], output=corpus + "-out", context_length=C, pad_token=0,
                              num_workers=2, overwrite=True, read_batch_size=read_batch_size))
    summary = run_pack(config, engine="ray")
    shutil.rmtree(corpus, ignore_errors=True)
    shutil.rmtree(corpus + "-out", ignore_errors=True)
    return {"shard_tokens": summary.manifest["counts"]["tokens"] // 2, "peak_worker_rss": summary.peak_worker_rss_bytes,
            "seconds": summary.seconds, "read_batch_size": read_batch_size,
            "docs_per_shard": summary.manifest["counts"]["documents"] // 2}


def run_child(*args: str) -> dict:
    """Run one measurement in a fresh interpreter; its last stdout line is the JSON result."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- report


def mib(n: float) -> str:
    return f"{n / 2**20:,.2f}"


def plan_table(counts: list[int], work: str, args, results: dict) -> None:
    print("\n## 1. planning (make_plan: list + Parquet footers + offsets)\n")
    print("| shards | list s | plan s (list incl.) | per shard ms | tracemalloc peak MiB | Plan kept MiB "
          "| kept per shard B | RSS growth MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in counts:
        corpus = os.path.join(work, f"tiny-{n}")
        r = run_child("plan", corpus, str(args.repeats))
        results["plan"].append(r)
        print(f"| {n:,} | {r['list_s']:.3f} | {r['plan_s']:.3f} | {1e3 * r['plan_s'] / n:.3f} "
              f"| {mib(r['tracemalloc_peak'])} "
              f"| {mib(r['plan_kept'])} | {r['plan_kept'] / n:,.0f} | {mib(r['rss_growth'])} |")


def stitch_table(counts: list[int], work: str, args, results: dict) -> None:
    print(f"\n## 2. stitching (stitch_boundaries; head + tail fragments of C/2 = {C // 2} int32 tokens per shard)\n")
    print("| shards | fragments | fragment MiB | stitch s | per shard ms | stitch tracemalloc peak MiB "
          "| write_boundaries s (files) | manifest files | manifest MiB | manifest B per shard |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in counts:
        write = n <= args.write_max_shards
        out_dir = os.path.join(work, f"stitch-{n}")
        r = run_child("stitch", str(n), out_dir, "write" if write else "nowrite", str(args.repeats))
        shutil.rmtree(out_dir, ignore_errors=True)
        results["stitch"].append(r)
        written = f"{r['write_boundaries_s']:.2f} ({r['boundary_runs']:,})" if write else "not run"
        print(f"| {n:,} | {r['fragments']:,} | {mib(r['fragment_bytes'])} | {r['stitch_s']:.3f} "
              f"| {1e3 * r['stitch_s'] / n:.3f} | {mib(r['stitch_tracemalloc_peak'])} | {written} "
              f"| {r['manifest_files']:,} | {mib(r['manifest_bytes'])} "
              f"| {r['manifest_bytes'] / n:,.0f} |")


def job_table(counts: list[int], work: str, args, results: dict) -> None:
    print("\n## 3. the whole job over the tiny corpora (time after Ray start)\n")
    print("| shards | engine | seconds | per shard ms | driver CPU s | chunks | files | manifest KiB "
          "| driver RSS growth MiB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in counts:
        corpus = os.path.join(work, f"tiny-{n}")
        for engine in ("local", "ray"):
            if engine == "ray" and n > args.ray_max_shards:
                continue
            r = run_child("job", corpus, engine, os.path.join(work, f"out-{engine}-{n}"))
            shutil.rmtree(os.path.join(work, f"out-{engine}-{n}"), ignore_errors=True)
            results["job"].append(r)
            print(f"| {n:,} | {engine} | {r['seconds']:.2f} | {1e3 * r['seconds'] / n:.2f} | {r['driver_cpu_s']:.2f} "
                  f"| {r['chunks']:,} | {r['files']:,} "
                  f"| {r['manifest_bytes'] / 1024:,.0f} | {mib(r['driver_rss_growth'])} |")


def memory_table(work: str, args, results: dict) -> None:
    print("\n## 4. worker memory vs shard size (Ray, 2 packers, 2 shards; mean document C/3 tokens)\n")
    print("| read batch (docs) | tokens per shard | read batches per shard | peak packer RSS MiB | job seconds |")
    print("|---:|---:|---:|---:|---:|")
    for read_batch_size in (int(b) for b in args.worker_read_batch_sizes.split(",")):
        pair = []
        for scale in (1, 10):
            r = run_child("memory", work, str(int(args.worker_shard_tokens * scale)), str(scale), str(read_batch_size))
            results["memory"].append(r)
            pair.append(r)
            print(f"| {read_batch_size:,} | {r['shard_tokens']:,} | {r['docs_per_shard'] / read_batch_size:.1f} "
                  f"| {mib(r['peak_worker_rss'])} | {r['seconds']:.1f} |")
        print(f"| | | | ratio 10x / 1x: {pair[1]['peak_worker_rss'] / pair[0]['peak_worker_rss']:.2f} | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", default="10,100,1000,10000", help="shard counts, comma separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write-max-shards", type=int, default=10000,
                        help="largest N for which the boundary files are really written (one fsync each)")
    parser.add_argument("--ray-max-shards", type=int, default=1000, help="largest N for the Ray job over tiny shards")
    parser.add_argument("--worker-shard-tokens", type=float, default=2e6, help="S for the worker memory check")
    parser.add_argument("--worker-read-batch-sizes", default="8192,1024",
                        help="read_batch_size values (documents) for the worker memory check")
    parser.add_argument("--sections", default="plan,stitch,job,memory", help="which measurements to run")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None, help="also write every result to this file")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        result = {"plan": lambda: child_plan(rest[0], int(rest[1])),
                  "stitch": lambda: child_stitch(int(rest[0]), rest[1], rest[2] == "write", int(rest[3])),
                  "job": lambda: child_job(rest[0], rest[1], rest[2]),
                  "memory": lambda: child_worker_memory(rest[0], int(rest[1]), int(rest[2]), int(rest[3]))}[kind]()
        print(json.dumps(result))
        return

    counts = [int(n) for n in args.shards.split(",")]
    sections = set(args.sections.split(","))
    work = args.workdir or tempfile.mkdtemp(prefix="raypack-scaling-")
    print(f"# machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
          f"pyarrow {pa.__version__}, numpy {np.__version__}; C={C}; workdir {work}")
    pool = os.path.join(work, "pool")
    results: dict[str, list] = {"plan": [], "stitch": [], "job": [], "memory": []}
    if sections & {"plan", "job"}:
        t = time.perf_counter()
        write_tiny_pool(pool, max(counts))
        print(f"# {max(counts)} tiny Parquet shards ({DOCS_PER_TINY_SHARD} docs of 8-40 tokens) "
              f"in {time.perf_counter() - t:.1f}s")
        for n in counts:
            link_corpus(pool, os.path.join(work, f"tiny-{n}"), n)

    if "plan" in sections:
        plan_table(counts, work, args, results)
    if "stitch" in sections:
        stitch_table(counts, work, args, results)
    if "job" in sections:
        job_table(counts, work, args, results)
    if "memory" in sections:
        memory_table(work, args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
