"""Tokens/s of ``raypack pack --tokenizer`` against one process encoding the same texts in memory,
and a tokenize worker's peak memory when its shard grows 10x.

    PYTHONPATH=. .venv/bin/python bench/bench_text_job.py [--mb 20] [--shards 16] [--vocab 16000] [--workers 2]

Text: the Python standard library's .py files (bench_tokenize.stdlib_texts, one document each)
up to ``--mb`` MB, written as ``--shards`` Parquet shards (column ``text``). Tokenizer: a
byte-level BPE of ``--vocab`` ids trained on (at most 8 MB of) that text in this run.

  1. floor: ``Tokenizer.encode_batch_fast(texts, add_special_tokens=False)`` in this process over
     all texts (in memory, all cores, batches of 1024 documents);
  2. ``run_pack(..., text=TextOptions(...))`` on Ray with ``--workers`` actors, timed after Ray has
     started (init_ray before the clock): read, tokenize, write, plan, pack, publish;
  3. ``run_tokenize`` alone on the same Ray (the tokenize stage, its own publish included);
  4. worker peak RSS: ``tokenize_task`` on shard 0 as one task, then on shard 0 repeated 10x (10
     row groups of the same size) as one task, each in a fresh process; VmHWM minus the RSS
     once the tokenizer is loaded.

Tokens are the tokenizer's own count (the manifest's). Prints the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenize import stdlib_texts, train_bpe  # noqa: E402

from raypack.config import make_config  # noqa: E402
from raypack.job import run_pack  # noqa: E402
from raypack.tokenize_job import TextOptions  # noqa: E402

_PEAK_SCRIPT = r"""
import json, sys
from raypack.shard_pack import current_rss_bytes
from raypack.tokenize_tasks import TextTask, TokenizeSettings, load_worker_tokenizer, tokenize_task
settings = TokenizeSettings(**json.loads(sys.argv[1]))
tokenizer = load_worker_tokenizer(settings)
base = current_rss_bytes()
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM
import pyarrow.parquet as pq; n = pq.ParquetFile(sys.argv[2]).num_row_groups
result = tokenize_task(TextTask(0, sys.argv[2], "parquet", 0, n), settings, tokenizer)
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"tokens": result.num_tokens, "peak_added": hwm - base}))
"""


def write_shards(texts: list[str], root: Path, num_shards: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    per = -(-len(texts) // num_shards)
    paths = []
    for k in range(num_shards):
        path = root / f"text-{k:03d}.parquet"
        pq.write_table(pa.table({"text": pa.array(texts[k * per:(k + 1) * per], pa.string())}), path)
        paths.append(path)
    return paths


def floor_tokens_per_s(texts: list[str], tokenizer_path: Path) -> tuple[int, float]:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    start = time.perf_counter()
    num_tokens = 0
    for k in range(0, len(texts), 1024):
        num_tokens += sum(len(e.ids) for e in tok.encode_batch_fast(texts[k:k + 1024], add_special_tokens=False))
    return num_tokens, time.perf_counter() - start


def job_tokens_per_s(text_dir: Path, tokenizer_path: Path, out: Path, workers: int) -> tuple[int, float]:
    from raypack import pipeline

    pipeline.init_ray(None)
    config = make_config(dict(inputs=[str(text_dir)], output=str(out), context_length=2048, num_workers=workers,
                              overwrite=True))
    summary = run_pack(config, engine="ray", text=TextOptions(tokenizer=str(tokenizer_path)))
    return summary.manifest["counts"]["tokens"], summary.seconds


def worker_peak(shard: Path, repeat: int, root: Path, tokenizer_path: Path) -> dict:
    base_texts = pq.read_table(shard).column("text").to_pylist()
    path = root / f"grown-{repeat}.parquet"
    pq.write_table(pa.table({"text": base_texts * repeat}), path, row_group_size=len(base_texts))  # one task
    from raypack.text_tokenizers import load_tokenizer

    identity = load_tokenizer(str(tokenizer_path)).identity()
    settings = {"out_dir": str(root / f"peak-{repeat}"), "tokenizer": str(tokenizer_path),
                "tokenizer_sha256": identity["sha256"], "text_column": "text", "token_dtype": "uint16"}
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, json.dumps(settings), str(path)],
                          capture_output=True, text=True, env=env, check=True)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "bytes": sum(len(t.encode()) for t in base_texts) * repeat}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=20)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = stdlib_texts(int(args.mb * 1e6))
        start = time.perf_counter()
        train_bpe(stdlib_texts(int(min(args.mb, 8) * 1e6)), args.vocab, root / "tokenizer.json")
        print(f"{len(texts)} docs, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB; "
              f"BPE {args.vocab} trained in {time.perf_counter() - start:.1f}s")
        shards = write_shards(texts, root / "text", args.shards)
        num_tokens, seconds = floor_tokens_per_s(texts, root / "tokenizer.json")
        print(f"floor  encode_batch_fast, one process:   {num_tokens:>12,} tokens {seconds:7.2f}s "
              f"{num_tokens / seconds / 1e6:6.2f}M tokens/s")
        job_tokens, job_seconds = job_tokens_per_s(root / "text", root / "tokenizer.json", root / "packed", args.workers)
        print(f"job    pack --tokenizer, {args.workers} workers (Ray up): {job_tokens:>12,} tokens {job_seconds:7.2f}s "
              f"{job_tokens / job_seconds / 1e6:6.2f}M tokens/s = {job_tokens / job_seconds / (num_tokens / seconds):.2f}x floor")
        from raypack.tokenize_job import TokenizeConfig, run_tokenize

        summary = run_tokenize(TokenizeConfig(inputs=(str(root / "text"),), output=str(root / "tok"), num_workers=args.workers,
                                              text=TextOptions(tokenizer=str(root / "tokenizer.json"))))
        print(f"stage  tokenize alone, {args.workers} workers (Ray up):   {job_tokens:>12,} tokens {summary.seconds:7.2f}s "
              f"{job_tokens / summary.seconds / 1e6:6.2f}M tokens/s = {job_tokens / summary.seconds / (num_tokens / seconds):.2f}x floor")
        for repeat in (1, 10):
            peak = worker_peak(shards[0], repeat, root, root / "tokenizer.json")
            print(f"worker shard x{repeat:<2}: {peak['bytes'] / 1e6:7.1f} MB text, {peak['tokens']:>11,} tokens, "
                  f"peak RSS added {peak['peak_added'] / 2**20:7.1f} MiB")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
