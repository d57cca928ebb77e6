"""datatrove's DocumentTokenizer over the Parquet text shards of bench_text_job.py (a peer, run in
its own venv: ``python -m venv /tmp/dtvenv && /tmp/dtvenv/bin/pip install datatrove tokenizers pyarrow``).

    /tmp/dtvenv/bin/python bench/bench_text_datatrove.py TEXT_DIR TOKENIZER_JSON OUT_DIR [--workers 2]

One datatrove task per shard (``tasks`` = shards), ``workers`` processes, documents not shuffled;
timed from the executor's start to its end (imports before the clock). datatrove writes
``.ds`` token files and an index, not packed windows (its reader cuts windows at load time).
"""

from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("text_dir")
    parser.add_argument("tokenizer")
    parser.add_argument("out")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    num_shards = len([f for f in os.listdir(args.text_dir) if f.endswith(".parquet")])
    executor = LocalPipelineExecutor(
        pipeline=[ParquetReader(args.text_dir, glob_pattern="*.parquet"),
                  DocumentTokenizer(args.out, tokenizer_name_or_path=args.tokenizer, shuffle_documents=False)],
        tasks=num_shards, workers=args.workers, logging_dir=os.path.join(args.out, "_logs"))
    print(f"load average before: {os.getloadavg()}")
    start = time.perf_counter()
    executor.run()
    seconds = time.perf_counter() - start
    num_bytes = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out) if f.endswith(".ds"))
    print(f"datatrove DocumentTokenizer, {args.workers} workers: {seconds:.2f}s, {num_bytes:,} bytes of .ds "
          f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
