"""TRL's bfd packing file to file, to set beside ``bench_job.py --strategy best_fit``.

    .venv-bench/bin/python bench/bench_trl_files.py --input /tmp/bj/corpus --strategy bfd_split

What a TRL user runs to go from Parquet shards to packed data on disk: ``datasets.load_dataset
("parquet")`` (converts into its Arrow cache), ``trl.pack_dataset(seq_length=C, strategy=...)``,
``save_to_disk``. One process, fresh cache each run. Needs the ``bench`` extra (trl, datasets).
The corpus is the one ``bench/bench_job.py --workdir DIR`` writes to ``DIR/corpus``.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="directory of Parquet shards with an input_ids column")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--strategy", choices=("bfd", "bfd_split", "wrapped"), default="bfd_split")
    args = parser.parse_args()

    import datasets
    from trl.data_utils import pack_dataset

    datasets.disable_progress_bars()
    files = sorted(glob.glob(os.path.join(args.input, "*.parquet")))
    work = tempfile.mkdtemp(prefix="trl-files-")
    try:
        start = time.perf_counter()
        ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=os.path.join(work, "cache"))
        loaded = time.perf_counter()
        packed = pack_dataset(ds, seq_length=args.context_length, strategy=args.strategy)
        done = time.perf_counter()
        packed.save_to_disk(os.path.join(work, "out"))
        saved = time.perf_counter()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    tokens = len(ds.data.column("input_ids").combine_chunks().flatten())
    total = saved - start
    print(f"TRL {args.strategy}, {len(files)} Parquet shards, {tokens:,} tokens, C={args.context_length}: "
          f"load {loaded - start:.2f}s, pack {done - loaded:.2f}s, save {saved - done:.2f}s, total {total:.2f}s "
          f"= {tokens / total / 1e6:.1f}M tokens/s file to file "
          f"({tokens / (done - loaded) / 1e6:.1f}M/s packing alone)")


if __name__ == "__main__":
    main()
