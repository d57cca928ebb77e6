"""What a tiny job costs on Ray, per strategy: the fixed cost of its passes (each actor of a pool is a
new process that imports Ray Data before any work; a pass on tasks reuses Ray's task workers).

    PYTHONPATH=. .venv/bin/python bench/bench_ray_fixed_cost.py [--runs 4] [--strategies concat,best_fit]
        [--repo DIR ...]

For each ``--repo`` (default: this checkout), one child process with PYTHONPATH=DIR starts a local
Ray (2 CPUs), then packs a 3-shard, 150-document corpus ``--runs`` times per strategy and prints
each run's wall seconds (the first run of a strategy also starts Ray Data's own actors). The corpus
is too small for packing to count: the figure is the engine's fixed cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, tempfile, time
import ray
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.sample import write_sample_corpus

runs, strategies = int(sys.argv[1]), sys.argv[2].split(",")
root = tempfile.mkdtemp()
write_sample_corpus(root + "/in", num_shards=3, docs_per_shard=50, mean_doc_len=100)
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
context = ray.data.DataContext.get_current()
context.enable_progress_bars = context.print_on_execution_start = False
for strategy in strategies:
    seconds = []
    for k in range(runs):
        config = make_config(dict(inputs=[root + "/in"], output=f"{root}/{strategy}-{k}", context_length=128,
                                  pad_token=0, strategy=strategy))
        start = time.perf_counter()
        run_pack(config, engine="ray")
        seconds.append(round(time.perf_counter() - start, 2))
    print(json.dumps({"strategy": strategy, "seconds": seconds}), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--strategies", default="concat,best_fit")
    parser.add_argument("--repo", action="append", help="a checkout to run (repeatable; default: this one)")
    args = parser.parse_args()
    for repo in args.repo or [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(repo), "RAYPACK_NO_PROGRESS": "1"}
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.runs), args.strategies], env=env,
                              cwd=tempfile.gettempdir(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, check=True)
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                later = sorted(row["seconds"][1:]) or row["seconds"]
                print(f"{repo}: {row['strategy']}: runs {row['seconds']} s; later runs' median "
                      f"{later[len(later) // 2]} s")


if __name__ == "__main__":
    main()
