"""Peak memory and time of each reader of a packed output's manifest at the size cap (issue
"Hostile files": a manifest padded under the 256 MiB cap took read_packed to 6.6 GB over 37 s and
stats/verify to 12.6 GB).

    PYTHONPATH=. .venv/bin/python bench/bench_manifest.py [--mb 250] [--work DIR]

Builds a small real packed output (raypack.sample, 2 shards), then two manifests of ``--mb`` MB:

  * padded: the real manifest with ``"x": [{}, {}, ...]`` added (json.loads builds ~25x that);
  * plausible: the real manifest whose ``shards`` list is repeated until the size is reached
    (long, realistic entries: a parse builds a few times the bytes; the manifest is then refused
    by its checks, since the counts no longer add up);
  * densest: the real manifest with ``"x": [["abcdefghijklmn", ...x8], ...]``: as many values
    (one per 17 bytes) and containers (one per 137 bytes) as the pre-scan's density caps let
    through, the most a parse of a document of that size can be made to build;

and runs each reader on each in a fresh child process, printing its exit code, the first line of
its error, its peak RSS (VmHWM, reset at its start) and its wall time: ``read_packed`` (Python API), ``raypack
stats``, ``raypack verify``, ``raypack export --format megatron``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import sys, time
open("/proc/self/clear_refs", "w").write("5")  # VmHWM from here (ru_maxrss survives exec: the parent's)
start = time.perf_counter()
what = sys.argv[1]
rc, line = 0, ""
try:
    if what == "read_packed":
        from raypack import read_packed
        read_packed(sys.argv[2])
    else:
        from raypack.cli import main
        rc = main(sys.argv[2:])
except Exception as e:  # noqa: BLE001 - reported
    rc, line = 1, f"{type(e).__name__}: {e}"
peak = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM"))
print(f"RESULT {rc} {peak} {time.perf_counter() - start:.2f} {line[:200]}")
"""


def build(work: Path, mb: float) -> list[Path]:
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack
    from raypack.sample import write_sample_corpus

    write_sample_corpus(str(work / "in"), num_shards=2, docs_per_shard=200, mean_doc_len=100)
    run_pack(make_config(dict(inputs=[str(work / "in")], output=str(work / "base"), context_length=64,
                              pad_token=0)), engine="local")
    manifest = json.loads((work / "base" / "manifest.json").read_text())
    target = int(mb * 1e6)
    outputs = []
    for kind in ("padded", "plausible", "densest"):
        out = work / kind
        shutil.copytree(work / "base", out)
        if kind == "padded":
            n = target // 4
            head = json.dumps(manifest, indent=2)[:-2]  # without the closing "\n}"
            (out / "manifest.json").write_text(head + ',\n  "x": [' + ", ".join(["{}"] * n) + "]\n}\n")
        elif kind == "densest":  # as many values and lists as the density caps let through: 17 B a value
            head = json.dumps(manifest, indent=2)[:-2]
            row = "[" + ",".join(['"abcdefghijklmn"'] * 8) + "]"
            rows = ",".join([row] * (target // (len(row) + 1)))
            (out / "manifest.json").write_text(head + ',\n  "x": [' + rows + "]\n}\n")
        else:
            entry = json.dumps(manifest["shards"], indent=2)
            copies = max(1, int(target / len(entry) * 0.9))
            padded = dict(manifest, shards=manifest["shards"] * copies)
            (out / "manifest.json").write_text(json.dumps(padded, indent=2))
        outputs.append(out)
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=250)
    parser.add_argument("--work")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="raypack-manifest-"))
    for out in build(work, args.mb):
        size = (out / "manifest.json").stat().st_size
        print(f"{out.name}: manifest {size / 1e6:.1f} MB")
        readers = {"read_packed": [str(out)], "stats": ["stats", str(out)], "verify": ["verify", str(out)],
                   "export": ["export", str(out), "--format", "megatron", "--output", str(work / f"exp-{out.name}")]}
        for name, argv in readers.items():
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", _CHILD, name, *argv], capture_output=True, text=True)
            result = next((line for line in done.stdout.splitlines() if line.startswith("RESULT")), None)
            err = (done.stderr.strip().splitlines() or [""])[-1]
            if result is None:
                print(f"  {name}: no result (rc {done.returncode}): {err[:200]}")
                continue
            _, rc, rss_kib, seconds, *line = result.split(" ", 4)
            print(f"  {name:12s} rc {rc}  peak RSS {int(rss_kib) / 1024:7.0f} MiB  {float(seconds):6.2f} s "
                  f"(child {time.perf_counter() - start:.2f} s)  {(' '.join(line) or err)[:160]}")
    if not args.work:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
