"""Issue 12 figures: what the lock, the resume-record checksums and the input identity cost.

    PYTHONPATH=$PWD python bench/bench_issue12.py job --corpus DIR --old-tree /tmp/old12 --repeats 3
    PYTHONPATH=$PWD python bench/bench_issue12.py direct --corpus DIR

``job``: the whole ``raypack pack --local`` CLI (one process, no Ray) on DIR, old tree and this
tree interleaved (old, new, old, new, ...), wall time of each process; medians and the load
average before and after. ``direct``: this tree only, in one process: 1000 LocalLock
acquire+release; one ``--local`` run with save_result / identify_input timed per shard; then
each recorded result saved again next to the published output and read back with
load_verified_result (record parse + checksum + input identity + chunk file sha256).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def job(args) -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"old": args.old_tree, "new": here}
    times: dict[str, list[float]] = {"old": [], "new": []}
    print(f"load average before: {os.getloadavg()}")
    for rep in range(args.repeats):
        for name, tree in trees.items():
            out = os.path.join(args.workdir, f"out-{name}")
            cmd = [sys.executable, "-m", "raypack.cli", "pack", "--input", args.corpus, "--output", out,
                   "--context-length", "2048", "--pad-token", "0", "--local", "--overwrite"]
            t = time.perf_counter()
            p = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True)
            s = time.perf_counter() - t
            if p.returncode:
                raise SystemExit(p.stderr)
            times[name].append(s)
            line = [ln for ln in p.stdout.splitlines() if ln.strip().startswith("packing")]
            print(f"rep {rep} {name}: {s:.2f}s wall; {line[0].strip() if line else ''}; load {os.getloadavg()[0]:.2f}",
                  flush=True)
    print(f"load average after: {os.getloadavg()}")
    for name, ts in times.items():
        print(f"{name}: median {statistics.median(ts):.2f}s of {[round(t, 2) for t in ts]}")


def direct(args) -> None:
    from raypack.io.lock import LocalLock
    from raypack.pack import packer as shard_pack
    from raypack.pack import resume
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack

    work = tempfile.mkdtemp(prefix="raypack-issue12-", dir=args.workdir)
    lock = LocalLock(os.path.join(work, ".out.raypack-lock"), what="x")
    t = time.perf_counter()
    for _ in range(1000):
        lock.acquire()
        lock.release()
    print(f"LocalLock acquire+release: {(time.perf_counter() - t):.3f} ms per pair (1000 pairs; total s = ms per pair)")

    saved, ident_s, save_s = [], [], []
    real_save, real_ident = shard_pack.save_result, shard_pack.identify_input

    def timed_save(task, settings, result, identity):
        t = time.perf_counter()
        real_save(task, settings, result, identity)
        save_s.append(time.perf_counter() - t)
        saved.append((task, settings, result, identity))

    def timed_ident(task, settings):
        t = time.perf_counter()
        identity = real_ident(task, settings)
        ident_s.append(time.perf_counter() - t)
        return identity

    shard_pack.save_result, shard_pack.identify_input = timed_save, timed_ident
    out = os.path.join(work, "out")
    summary = run_pack(make_config(dict(inputs=[args.corpus], output=out, context_length=2048, pad_token=0)),
                       engine="local")
    print(f"--local run: {summary.seconds:.2f}s; {len(saved)} shards")
    print(f"identify_input per shard: median {statistics.median(ident_s) * 1e3:.2f} ms, "
          f"sum {sum(ident_s):.3f}s")
    print(f"save_result per shard: median {statistics.median(save_s) * 1e3:.2f} ms, sum {sum(save_s):.3f}s")
    load_s, sizes = [], []
    for task, settings, result, identity in saved:
        settings = dataclasses.replace(settings, out_dir=out)
        real_save(task, settings, result, identity)
        sizes.append(os.path.getsize(os.path.join(out, resume.record_name(task.task_index))))
        t = time.perf_counter()
        assert resume.load_verified_result(task, settings) is not None
        load_s.append(time.perf_counter() - t)
    print(f"record size: median {statistics.median(sizes):,} bytes")
    print(f"load_verified_result per shard (record + checksum + identity + chunk file sha256): median "
          f"{statistics.median(load_s) * 1e3:.2f} ms, sum {sum(load_s):.3f}s")
    shutil.rmtree(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("job", "direct"))
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--old-tree", default="/tmp/old12")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=tempfile.gettempdir())
    args = parser.parse_args()
    job(args) if args.mode == "job" else direct(args)


if __name__ == "__main__":
    main()
