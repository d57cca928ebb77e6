"""The token-only job's marginal rate against the I/O floor: a one-process Parquet -> Arrow IPC copy
of the same shards (issue "Text at the speed of the fastest exact tokenizer": goal >= 1.0x).

    PYTHONPATH=. .venv/bin/python bench/bench_token_job.py [--tokens 200e6] [--tiny-tokens 2e6]
        [--shards 16] [--engines local,ray] [--workers 2] [--repeats 3] [--workdir DIR] [--repo DIR ...]

Corpus: ``raypack.sample.write_sample_corpus`` (int32 token lists, lognormal lengths of mean 685),
``--shards`` Parquet shards; a tiny corpus of ``--tiny-tokens`` in 2 shards. Each figure is
marginal: (tokens big - tokens tiny) / (seconds big - seconds tiny), so fixed costs (Ray Data's
pipeline start, actor start, publish) cancel. The floor is the same: bench_job.pyarrow_copy of the
big and the tiny corpus (one process, batch by batch). The marginal CPU seconds per token (this
process's threads; ``--engines local`` only) bound the job on the machine's cores. The jobs run in
one child process per engine (Ray started before the clock), ``--repeats`` x (big, tiny); the first
round of each is printed, the medians are over the later ones (warm). Prints the load average.
``--repo`` (repeatable): run the jobs with PYTHONPATH=DIR, each checkout in turn (an A/B of two
commits on one corpus and one floor; the printed ``cores`` is a big run's CPU over its wall).

Two copies, alternating: the plain copy (the issue's floor), and the same copy starting the
writeback of every 8 MiB it writes and dropping what was written back from the page cache
(``pyarrow_copy(..., drop_cache=True)``), as raypack's writer does. The job is also compared with
the faster of the two in each round. On this VM the plain copy of 2.4 GB
(600M int32 tokens) pays for its dirty page cache (9.7-9.8 s, 6.3 s of it system CPU, in a fresh
process; 4.8-7.7 s back to back) where the other takes 4.4-5.6 s; at 400 MB the plain copy is the
faster one (BENCHMARKS.md, 2026-12-05).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_job import pyarrow_copy  # noqa: E402

from raypack.sample import write_sample_corpus  # noqa: E402

_JOB = r"""
import json, os, resource, shutil, sys, time
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
engine, big, tiny, out, workers, rounds = sys.argv[1:7]
if engine == "ray":
    from raypack.engine import pipeline
    pipeline.init_ray(None)
for _ in range(int(rounds)):
    row = {}
    for name, path in (("big", big), ("tiny", tiny)):
        config = make_config(dict(inputs=[path], output=out, context_length=2048, pad_token=0,
                                  num_workers=int(workers), overwrite=True))
        if os.path.exists(out):
            shutil.rmtree(out)  # into a fresh directory, as the floor copies (deleting 400 MB is ~0.2 s here)
        usage, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        summary = run_pack(config, engine=engine)
        seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime  # this process's threads
        row[name] = (summary.manifest["counts"]["tokens"], seconds, cpu)
    print(json.dumps(row), flush=True)
"""


def corpus(root: Path, tokens: float, shards: int) -> Path:
    mean = 685.0
    docs_per_shard = max(1, int(tokens / mean / shards))
    write_sample_corpus(str(root), num_shards=shards, docs_per_shard=docs_per_shard, mean_doc_len=mean)
    return root


def marginal(big: tuple, tiny: tuple, field: int = 1) -> float:
    """Tokens per second of ``field`` (1: wall, 2: CPU) between the tiny and the big run."""
    return (big[0] - tiny[0]) / (big[field] - tiny[field])


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def copy_run(shards: list[str], out_dir: str, tokens: int, drop_cache: bool) -> tuple[int, float, float]:
    cpu = cpu_seconds()
    seconds = pyarrow_copy(shards, out_dir, drop_cache=drop_cache)
    return tokens, seconds, cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=200e6)
    parser.add_argument("--tiny-tokens", type=float, default=2e6)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--engines", default="local,ray")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", help="keep the corpus here (reused when present)")
    parser.add_argument("--repo", action="append", help="PYTHONPATH of a raypack checkout (default: cwd)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="raypack-token-job-"))
    big, tiny = root / "big", root / "tiny"
    if not big.exists():
        corpus(big, args.tokens, args.shards)
        corpus(tiny, args.tiny_tokens, 2)
    big_shards, tiny_shards = sorted(map(str, big.glob("*.parquet"))), sorted(map(str, tiny.glob("*.parquet")))
    tokens_big, tokens_tiny = (sum(map(shard_tokens, shards)) for shards in (big_shards, tiny_shards))
    floors: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for drop_cache in (False, True):
            run_big = copy_run(big_shards, str(root / "copy"), tokens_big, drop_cache)
            run_tiny = copy_run(tiny_shards, str(root / "copy-tiny"), tokens_tiny, drop_cache)
            floors[drop_cache].append(marginal(run_big, run_tiny))
            print(f"floor (Parquet -> IPC copy{', page cache dropped' if drop_cache else ''}): big {run_big[1]:.2f}s "
                  f"tiny {run_tiny[1]:.2f}s -> marginal {floors[drop_cache][-1] / 1e6:.1f}M tokens/s, "
                  f"{1e8 / marginal(run_big, run_tiny, 2):.2f} CPU-s per 100M tokens  load {os.getloadavg()[0]:.2f}",
                  flush=True)
            shutil.rmtree(root / "copy"), shutil.rmtree(root / "copy-tiny")
    floor = statistics.median(floors[False][1:] or floors[False])
    best = [max(pair) for pair in zip(floors[False], floors[True])]
    strict = statistics.median(best[1:] or best)
    print(f"{tokens_big:,} tokens in {len(big_shards)} shards; floor (warm median) {floor / 1e6:.1f}M tokens/s; "
          f"the faster copy of each round (warm median) {strict / 1e6:.1f}M")
    for repo, engine in ((repo, engine) for repo in args.repo or [os.getcwd()] for engine in args.engines.split(",")):
        env = {**os.environ, "RAYPACK_NO_PROGRESS": "1", "PYTHONPATH": repo}
        done = subprocess.run([sys.executable, "-c", _JOB, engine, str(big), str(tiny), str(root / "out"),
                               str(args.workers), str(args.repeats)], capture_output=True, text=True, env=env,
                              cwd=str(root))
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        rates = []
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                rates.append(marginal(row["big"], row["tiny"]))
                per_cpu = marginal(row["big"], row["tiny"], 2)
                cpu = (f", {1e8 / per_cpu:.2f} CPU-s per 100M tokens: at most {os.cpu_count() * per_cpu / 1e6:.1f}M "
                       f"tokens/s on {os.cpu_count()} cores" if engine == "local" else "")
                cores = f", cores {row['big'][2] / row['big'][1]:.2f}" if engine == "local" else ""
                print(f"  {repo} {engine}: big {row['big'][1]:.2f}s tiny {row['tiny'][1]:.2f}s -> marginal "
                      f"{rates[-1] / 1e6:.1f}M tokens/s{cpu}, whole big run "
                      f"{row['big'][0] / row['big'][1] / 1e6:.1f}M{cores}  load {os.getloadavg()[0]:.2f}", flush=True)
        value = statistics.median(rates[1:] or rates)
        print(f"median {repo} {engine} (warm rounds): {value / 1e6:.1f}M tokens/s = {value / floor:.2f}x the copy "
              f"floor, {value / strict:.2f}x the faster copy")
    print(f"load average after: {os.getloadavg()}")
    if not args.workdir:
        shutil.rmtree(root)


def shard_tokens(path: str) -> int:
    """The tokens of Parquet shard ``path``'s ``input_ids`` column."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    column = pq.read_table(path, columns=["input_ids"]).column(0)
    return int(pc.sum(pc.list_value_length(column)).as_py() or 0)


if __name__ == "__main__":
    main()
