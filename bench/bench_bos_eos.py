"""The spread of BOS/EOS into a piece's ids (raypack.tokenize.tokenizers.flat_to_list_array), per
piece of the one pass's size (~2.3M ids: an 8 MiB Parquet read batch), against a checkout's.

    PYTHONPATH=. .venv/bin/python bench/bench_bos_eos.py [--repo DIR ...] [--repeats 15]

Two corpora of 2.3M uint32 ids cut to uint16: 300 long documents (~7,700 ids, source files and
books) and 20,000 short ones (~115 ids, chat turns); without EOS (the cast alone) and with it.
Prints the median milliseconds per piece and the seconds that makes per 119M ids (the one-pass
bench's corpus). Each ``--repo`` runs in its own process (PYTHONPATH=DIR).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = r"""
import sys, time
import numpy as np
from raypack.tokenize.tokenizers import FlatIds, flat_to_list_array
rng = np.random.default_rng(0)
repeats = int(sys.argv[1])
for ndocs, n in ((300, 2_300_000), (20_000, 2_300_000)):
    lengths = rng.integers(1, 2 * n // ndocs, ndocs).astype(np.int64)
    offsets = np.zeros(ndocs + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = FlatIds(rng.integers(0, 16000, int(offsets[-1])).astype(np.uint32), offsets)
    for eos in (None, 7):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            flat_to_list_array(flat, np.dtype(np.uint16), eos_id=eos)
            times.append(time.perf_counter() - t)
        median = float(np.median(times))
        print(f"  {ndocs:>6,} documents, eos {eos!s:>4}: {median * 1e3:.2f} ms a piece, "
              f"{median * 119e6 / offsets[-1]:.3f} s per 119M ids")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", action="append", help="PYTHONPATH of a raypack checkout (default: cwd)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    for repo in args.repo or [os.getcwd()]:
        print(os.path.abspath(repo), flush=True)
        subprocess.run([sys.executable, "-c", CHILD, str(args.repeats)], check=True, cwd=repo,
                       env={**os.environ, "PYTHONPATH": os.path.abspath(repo)})


if __name__ == "__main__":
    main()
