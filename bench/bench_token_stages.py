"""Where the token-only job's CPU goes: the job run with one stage after another switched off.

    PYTHONPATH=. .venv/bin/python bench/bench_token_stages.py --workdir DIR [--workers 2] [--repeats 3]

DIR holds ``big/`` (Parquet token shards), e.g. the corpus ``bench_token_job.py --workdir DIR``
writes. Each variant runs in its own child process (a warm-up run, then ``--repeats`` runs; the
least CPU of them is printed, with its wall time), as CPU-s and wall s per 100M tokens:

  read      pyarrow ``ParquetFile.iter_batches`` over every shard, nothing else (one thread);
  checks    raypack's reader (``iter_document_batches``: the batches validated), one thread;
  pack      the whole ``pack --local`` job, but the chunk files' bytes are dropped unhashed
            (no write, no file sha256, no content digest);
  write     the same, the files written (and fsynced) but not hashed;
  file_sha  the same, plus each file's sha256 (its name, the manifest's ``files``);
  full      the job as shipped (plus the content digest of every chunk: ``content_sha256``).

The differences between consecutive lines are what each stage costs. Variants other than ``full``
write outputs with placeholder hashes: they are for this measurement only.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_token_job import shard_tokens  # noqa: E402

VARIANTS = ("read", "checks", "pack", "write", "file_sha", "full")

_CHILD = r"""
import glob, os, resource, shutil, sys, time
import pyarrow.parquet as pq
variant, big, out, workers, repeats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
shards = sorted(glob.glob(os.path.join(big, "*.parquet")))

class _NoHash:
    def update(self, data): pass
    def hexdigest(self): return "0" * 64

if variant in ("pack", "write", "file_sha"):  # no content digest
    import raypack.packed.manifest as manifest
    import raypack.rules.content_digest as content_digest
    content_digest.RangeDigester.add = lambda self, *args, **kwargs: None
    manifest.content_sha256 = lambda *args, **kwargs: "0" * 64
if variant in ("pack", "write"):  # no file sha256
    import raypack.packed.writer as writer
    _init = writer.HashingSink.__init__
    def _unhashed(self, f, *args, **kwargs):
        _init(self, f, *args, **kwargs)
        self.sha256 = _NoHash()
    writer.HashingSink.__init__ = _unhashed
if variant == "pack":  # bytes dropped
    import raypack.packed.writer as writer
    writer.AtomicFile.write = lambda self, data: memoryview(data).nbytes

def read():
    for path in shards:
        for _ in pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20).iter_batches(
                batch_size=8192, columns=["input_ids"]):
            pass

def checks():
    from raypack.inputs.reading import iter_document_batches
    for path in shards:
        for _ in iter_document_batches(path, "parquet", "input_ids", 8192):
            pass

def job():
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack
    if os.path.exists(out):
        shutil.rmtree(out)
    run_pack(make_config(dict(inputs=[big], output=out, context_length=2048, pad_token=0, num_workers=workers,
                              overwrite=True)), engine="local")

run = {"read": read, "checks": checks}.get(variant, job)
run()
best = None
for _ in range(repeats):
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    run()
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    best = min(best or (cpu, wall), (cpu, wall))
print(best[0], best[1])
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="holds big/, Parquet token shards (bench_token_job.py)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    big = Path(args.workdir) / "big"
    shards = sorted(glob.glob(str(big / "*.parquet")))
    if not shards:
        raise SystemExit(f"no Parquet shards in {big}: run bench/bench_token_job.py --workdir {args.workdir} first")
    tokens = sum(map(shard_tokens, shards))
    print(f"{tokens:,} tokens in {len(shards)} shards, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    env = {**os.environ, "RAYPACK_NO_PROGRESS": "1", "PYTHONPATH": os.getcwd()}
    previous = None
    for variant in VARIANTS:
        done = subprocess.run([sys.executable, "-c", _CHILD, variant, str(big), str(Path(args.workdir) / "stages-out"),
                               str(args.workers), str(args.repeats)], capture_output=True, text=True, env=env)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        cpu, wall = (float(x) for x in done.stdout.split()[-2:])
        per = 1e8 / tokens
        step = "" if previous is None else f"   +{(cpu - previous) * per:.2f} CPU-s"
        print(f"{variant:9s} {cpu * per:5.2f} CPU-s  {wall * per:5.2f} s wall per 100M tokens{step}", flush=True)
        previous = cpu


if __name__ == "__main__":
    main()
