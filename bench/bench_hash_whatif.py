"""What the format's two hashes cost the token-only job, and what another hash would buy (a what-if).

    PYTHONPATH=. .venv/bin/python bench/bench_hash_whatif.py --workdir DIR [--tokens 100e6] [--repeats 3]
        [--modes sha256,blake3,xxh3,none] [--rounds 2]

A packed output's chunk files are named and listed by the sha256 of their bytes, and its
``content_sha256`` is built from a sha256 of each chunk (docs/FORMAT.md): every byte written is
hashed twice. This bench runs the token-only job (``run_pack``, ``--local``, 2 packers) on
``raypack.sample`` int32 shards with both hashes swapped, inside the bench's own child process
only, for:

- ``sha256``: as shipped (format version 3);
- ``blake3``: BLAKE3 (PyPI ``blake3``, cryptographic) for both;
- ``xxh3``: XXH3-128 (PyPI ``xxhash``, not cryptographic) for both, its 16 bytes repeated to fill 32;
- ``none``: no hashing at all (the upper bound).

The outputs of the last three are NOT raypack outputs (their names and digests mean nothing); the
bench deletes them. Each mode runs in its own process, the modes alternating for ``--rounds``;
each process runs the big and a tiny corpus ``--repeats`` times after one warm-up, and prints the
big run's wall and CPU seconds and the marginal rate ((big - tiny) tokens over (big - tiny)
seconds). Beside them, the issue's copy floor (bench_job.pyarrow_copy, plain and dropping its page
cache, ``2 x --rounds`` times each) on the same shards: the ratios are against the median of those
copies and against the fastest one (on this VM a copy's time swings 0.9-1.5 s with the page
cache). A mode whose package is not installed is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_token_job import copy_run, corpus, marginal, shard_tokens  # noqa: E402

MODES = ("sha256", "blake3", "xxh3", "none")

_CHILD = r"""
import hashlib, json, os, shutil, sys, time, types
mode, big, tiny, out, repeats = sys.argv[1:6]
if mode != "sha256":
    import raypack.packed.writer as writer
    import raypack.rules.content_digest as content_digest

    class Other:
        def __init__(self, data=b""):
            if mode == "blake3":
                import blake3
                self.h, self.double = blake3.blake3(), False
            elif mode == "xxh3":
                import xxhash
                self.h, self.double = xxhash.xxh3_128(), True
            else:
                self.h = None
            self.update(data)
        def update(self, data):
            if self.h is not None:
                self.h.update(data)
        def digest(self):
            if self.h is None:
                return bytes(32)
            return self.h.digest() * 2 if self.double else self.h.digest()
        def hexdigest(self):
            return self.digest().hex()

    # the file hash (HashingSink), and the chunk digests (the calls over a chunk's bytes; the small
    # group and header hashes stay sha256, as a format would keep them)
    writer.hashlib = types.SimpleNamespace(sha256=lambda *a: Other(*a) if not a else hashlib.sha256(*a))
    content_digest.hashlib = types.SimpleNamespace(
        sha256=lambda *a: Other(*a) if a and len(a[0]) > 1024 else hashlib.sha256(*a))
from raypack.pack.config import make_config
from raypack.pack.job import run_pack

def run(path):
    if os.path.exists(out):
        shutil.rmtree(out)
    config = make_config(dict(inputs=[path], output=out, context_length=2048, pad_token=0, num_workers=2,
                              overwrite=True))
    start, cpu = time.perf_counter(), time.process_time()
    tokens = run_pack(config, engine="local").manifest["counts"]["tokens"]
    return tokens, time.perf_counter() - start, time.process_time() - cpu

run(big)
rows = []
for _ in range(int(repeats)):
    rows.append([run(big), run(tiny)])
shutil.rmtree(out, ignore_errors=True)
print(json.dumps(rows))
"""


def installed(mode: str) -> bool:
    name = {"blake3": "blake3", "xxh3": "xxhash"}.get(mode)
    if name is None:
        return True
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--tokens", type=float, default=100e6)
    parser.add_argument("--tiny-tokens", type=float, default=2e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
    skipped = [m for m in modes if not installed(m)]
    modes = [m for m in modes if m not in skipped]
    if skipped:
        print(f"skipped (package not installed): {', '.join(skipped)}")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="raypack-hash-whatif-"))
    corpora = {}
    for name, tokens, shards in (("big", args.tokens, 16), ("tiny", args.tiny_tokens, 2)):
        if not (work / name).exists():
            corpus(work / name, tokens, shards)
        corpora[name] = sorted(str(p) for p in (work / name).glob("*.parquet"))

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    results: dict[str, list] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for mode in modes:
            proc = subprocess.run([sys.executable, "-c", _CHILD, mode, str(work / "big"), str(work / "tiny"),
                                   str(work / "out"), str(args.repeats)], env=env, capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{mode}: the job failed:\n{proc.stderr[-2000:]}")
            results[mode] += json.loads(proc.stdout.strip().splitlines()[-1])

    tokens = {name: sum(map(shard_tokens, shards)) for name, shards in corpora.items()}
    floors: dict[str, list[float]] = {"plain": [], "drop": []}
    for _ in range(args.rounds * 2):
        for kind in floors:
            runs = []
            for name in ("big", "tiny"):
                shutil.rmtree(work / "copy", ignore_errors=True)
                runs.append(copy_run(corpora[name], str(work / "copy"), tokens[name], drop_cache=kind == "drop"))
            floors[kind].append(marginal(*runs))
    shutil.rmtree(work / "copy", ignore_errors=True)
    copies = [rate for rates in floors.values() for rate in rates]
    median_copy, best_copy = statistics.median(copies), max(copies)
    for kind, rates in floors.items():
        print(f"copy floor, {kind}: " + ", ".join(f"{r / 1e6:.1f}" for r in sorted(rates)) + "M tok/s (marginal)")
    print(f"{'hashes':8s} {'big run wall s':>16s} {'CPU-s':>12s} {'marginal M tok/s':>18s} "
          f"{'x median copy':>14s} {'x best copy':>12s}")
    for mode in modes:
        rows = results[mode]
        walls = [big[1] for big, _ in rows]
        cpus = [big[2] for big, _ in rows]
        rate = statistics.median(marginal(big, tiny) for big, tiny in rows)
        print(f"{mode:8s} {min(walls):7.2f}-{max(walls):<8.2f} {min(cpus):5.2f}-{max(cpus):<6.2f} "
              f"{rate / 1e6:18.1f} {rate / median_copy:13.2f}x {rate / best_copy:11.2f}x")
    print(f"({tokens['big']:,} and {tokens['tiny']:,} tokens; {args.rounds} rounds x {args.repeats} runs per mode; "
          f"load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
