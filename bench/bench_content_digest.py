"""What the content digest (format version 3's content_sha256) costs a pack.

    PYTHONPATH=$PWD python bench/bench_content_digest.py job --corpus DIR --old-tree /work/main --repeats 3
    PYTHONPATH=$PWD python bench/bench_content_digest.py direct --tokens 50000000

``job``: the whole ``raypack pack --local`` CLI (one process, no Ray) on DIR, the old tree (no
chunk digests) and this tree interleaved (old, new, old, new, ...): wall time and CPU time
(user + sys of the child, less sensitive to other jobs on the machine) of each process; medians
and the load average before and after. ``direct``: this tree only, in one process: the chunk
digests and the range digests of ``--tokens`` random int32 tokens in chunks of 2048, the way a
chunk file's writer computes them, CPU time (best of 3).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def job(args) -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"old": args.old_tree, "new": here}
    times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    print(f"load average before: {os.getloadavg()}")
    for rep in range(args.repeats):
        for name, tree in trees.items():
            out = os.path.join(args.workdir, f"out-{name}")
            cmd = [sys.executable, "-m", "raypack.cli", "pack", "--input", args.corpus, "--output", out,
                   "--context-length", "2048", "--pad-token", "0", "--local", "--overwrite"]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            p = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True)
            wall = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode:
                raise SystemExit(p.stderr)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            times[name].append((wall, cpu))
            tokens = [line.strip() for line in p.stdout.splitlines() if line.strip().startswith("tokens")]
            print(f"rep {rep} {name}: {wall:.2f}s wall, {cpu:.2f}s cpu; {tokens[0] if tokens else ''}; "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"load average after: {os.getloadavg()}")
    for name, ts in times.items():
        walls, cpus = [w for w, _ in ts], [c for _, c in ts]
        print(f"{name}: median {statistics.median(walls):.2f}s wall {[round(w, 2) for w in walls]}, "
              f"median {statistics.median(cpus):.2f}s cpu {[round(c, 2) for c in cpus]}")


def direct(args) -> None:
    import numpy as np

    from raypack.rules.content_digest import RangeDigester

    c, batch = 2048, 512
    n = args.tokens // c
    rng = np.random.default_rng(0)
    input_ids = rng.integers(0, 50_000, size=(n, c), dtype=np.int32)
    lengths = np.full(n * 2, c // 2, np.int32)  # two segments per chunk
    doc_ids = np.arange(n * 2, dtype=np.int64)
    offsets = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        digester = RangeDigester(0)
        for start in range(0, n, batch):
            end = min(n, start + batch)
            digester.add(input_ids[start:end], offsets[start:end + 1], doc_ids, lengths)
        digester.hex()
        best = min(best, time.process_time() - t)
    print(f"{n} chunks of {c} int32 tokens ({n * c / 1e6:.1f}M tokens): range digests in {best:.3f}s cpu "
          f"({n * c * 4 / best / 1e9:.2f} GB/s, {best / n * 1e6:.1f} us per chunk); load {os.getloadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("job")
    p.add_argument("--corpus", required=True)
    p.add_argument("--old-tree", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workdir", default="/tmp")
    p = sub.add_parser("direct")
    p.add_argument("--tokens", type=int, default=50_000_000)
    args = parser.parse_args()
    {"job": job, "direct": direct}[args.mode](args)


if __name__ == "__main__":
    main()
