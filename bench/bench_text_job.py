"""Tokens/s of ``raypack pack --tokenizer`` against one process encoding the same texts in memory,
and a tokenize worker's peak memory when its shard grows 10x.

    PYTHONPATH=. .venv/bin/python bench/bench_text_job.py [--mb 20] [--copies 1] [--shards 16] [--vocab 16000]
        [--workers 2] [--repeats 1] [--hf] [--no-stage] [--no-peak]

Text: the Python standard library's .py files (bench_tokenize.stdlib_texts, one document each)
up to ``--mb`` MB, the whole list repeated ``--copies`` times (the stdlib is ~31 MB, ~8.4M
tokens: 6 copies give ~50M), written as ``--shards`` Parquet shards (column ``text``).
Tokenizer: a byte-level BPE of ``--vocab`` ids trained on (at most 8 MB of) that text in this run.
Steps 1, 2 and 5 run ``--repeats`` times each, in turn.

  1. floors: ``Tokenizer.encode_batch(texts, add_special_tokens=False)`` (the issue's floor) and
     ``encode_batch_fast`` (the same ids without character offsets, what raypack calls: the
     stricter floor), in this process over all texts (in memory, all cores, batches of 1024
     documents);
  2. ``run_pack(..., text=TextOptions(...))`` on Ray with ``--workers`` actors, timed after Ray has
     started (init_ray before the clock): read, tokenize, write, plan, pack, publish;
  3. ``run_tokenize`` alone on the same Ray (the tokenize stage, its own publish included);
  4. worker peak RSS: ``tokenize_task`` on shard 0 repeated ``--peak-grow`` times (e.g. 1 and
     10: row groups of the same size) as one task, each in a fresh process with the tokenizer
     threads a job worker gets (CPUs // workers); VmHWM minus the RSS once the tokenizer is loaded.

  5. ``--hf``: the Hugging Face recipe, end to end from the same Parquet shards to a saved packed
     dataset, in a fresh process (imports before the clock): ``load_dataset("parquet")``,
     ``map(tokenize, batched=True, num_proc=workers)`` with the same tokenizer.json through the
     tokenizers library (``encode_batch_fast``, one Rayon thread per process), then
     ``map(group_texts, batched=True, num_proc=workers)`` (run_clm.py's recipe, blocks of 2048,
     the tail of each 1,000-document batch dropped) and ``save_to_disk``. Caches in a temp dir.

Tokens are the tokenizer's own count (the manifest's). Prints the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_text_peers import HF_RECIPE  # noqa: E402  (the run_clm.py recipe, one copy)
from bench_tokenize import stdlib_texts, train_bpe  # noqa: E402

from raypack.pack.config import make_config  # noqa: E402
from raypack.pack.job import run_pack  # noqa: E402
from raypack.tokenize.job import TextOptions  # noqa: E402

_PEAK_SCRIPT = r"""
import json, sys
from raypack.pack.packer import current_rss_bytes
from raypack.tokenize.tasks import TextTask, TokenizeSettings, load_worker_tokenizer, tokenize_task
from raypack.tokenize.backends import set_thread_env
settings = TokenizeSettings(**json.loads(sys.argv[1]))
set_thread_env(settings.num_threads)  # as the job's actor does, before the first encode
tokenizer = load_worker_tokenizer(settings)
base = current_rss_bytes()
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM
import pyarrow.parquet as pq; n = pq.ParquetFile(sys.argv[2]).num_row_groups
result = tokenize_task(TextTask(0, sys.argv[2], "parquet", 0, n), settings, tokenizer)
hwm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"tokens": result.num_tokens, "peak_added": hwm - base}))
"""


def hf_tokens_per_s(text_dir: Path, tokenizer_path: Path, root: Path, workers: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    args = [str(text_dir), str(tokenizer_path), str(root / "hf-out"), str(root / "hf-cache"), str(workers), "2048"]
    done = subprocess.run([sys.executable, "-c", HF_RECIPE, *args], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    shutil.rmtree(root / "hf-out", ignore_errors=True)
    shutil.rmtree(root / "hf-cache", ignore_errors=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_shards(texts: list[str], root: Path, num_shards: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    per = -(-len(texts) // num_shards)
    paths = []
    for k in range(num_shards):
        path = root / f"text-{k:03d}.parquet"
        pq.write_table(pa.table({"text": pa.array(texts[k * per:(k + 1) * per], pa.string())}), path)
        paths.append(path)
    return paths


def floor_tokens_per_s(texts: list[str], tokenizer_path: Path, method: str = "encode_batch") -> tuple[int, float]:
    """One process, ``Tokenizer.<method>`` (all cores) over ``texts`` in memory, batches of 1,024.

    ``encode_batch`` is the issue's floor; ``encode_batch_fast`` (what raypack calls: the same
    ids without the character offsets) is the stricter one."""
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    encode = getattr(tok, method)
    start = time.perf_counter()
    num_tokens = 0
    for k in range(0, len(texts), 1024):
        num_tokens += sum(len(e.ids) for e in encode(texts[k:k + 1024], add_special_tokens=False))
    return num_tokens, time.perf_counter() - start


def job_tokens_per_s(text_dir: Path, tokenizer_path: Path, out: Path, workers: int) -> tuple[int, float]:
    from raypack.engine import pipeline

    pipeline.init_ray(None)
    config = make_config(dict(inputs=[str(text_dir)], output=str(out), context_length=2048, num_workers=workers,
                              overwrite=True))
    summary = run_pack(config, engine="ray", text=TextOptions(tokenizer=str(tokenizer_path)))
    return summary.manifest["counts"]["tokens"], summary.seconds


def worker_peak(shard: Path, repeat: int, root: Path, tokenizer_path: Path, num_threads: int) -> dict:
    base_texts = pq.read_table(shard).column("text").to_pylist()
    path = root / f"grown-{repeat}.parquet"
    pq.write_table(pa.table({"text": base_texts * repeat}), path, row_group_size=len(base_texts))  # one task
    from raypack.tokenize.tokenizers import load_tokenizer

    identity = load_tokenizer(str(tokenizer_path)).identity()
    settings = {"out_dir": str(root / f"peak-{repeat}"), "tokenizer": str(tokenizer_path),
                "tokenizer_sha256": identity["sha256"], "text_column": "text", "token_dtype": "uint16",
                "num_threads": num_threads}
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, json.dumps(settings), str(path)],
                          capture_output=True, text=True, env=env, check=True)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "bytes": sum(len(t.encode()) for t in base_texts) * repeat}


def rate(num_tokens: int, seconds: float) -> str:
    return f"{num_tokens:>12,} tokens {seconds:7.2f}s {num_tokens / seconds / 1e6:6.2f}M tokens/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=20)
    parser.add_argument("--copies", type=int, default=1, help="repeat the whole text list this many times")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--hf", action="store_true", help="also run datasets.map + group_texts (num_proc=workers)")
    parser.add_argument("--no-stage", action="store_true", help="skip the tokenize stage alone")
    parser.add_argument("--no-peak", action="store_true", help="skip the worker peak memory")
    parser.add_argument("--peak-grow", default="1,10", help="shard 0 repeated this many times (one task each)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = stdlib_texts(int(args.mb * 1e6))
        start = time.perf_counter()
        train_bpe(stdlib_texts(int(min(args.mb, 8) * 1e6)), args.vocab, root / "tokenizer.json")
        texts = texts * args.copies
        print(f"{len(texts)} docs, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB ({args.copies} copies); "
              f"BPE {args.vocab} trained in {time.perf_counter() - start:.1f}s")
        shards = write_shards(texts, root / "text", args.shards)
        tokenizer_path = root / "tokenizer.json"
        for repeat in range(args.repeats):
            print(f"-- repeat {repeat + 1}/{args.repeats}, load average {os.getloadavg()}")
            num_tokens, seconds = floor_tokens_per_s(texts, tokenizer_path, "encode_batch")
            floor = num_tokens / seconds
            print(f"floor  encode_batch, one process:        {rate(num_tokens, seconds)}  load {os.getloadavg()[0]:.2f}")
            fast_tokens, fast_seconds = floor_tokens_per_s(texts, tokenizer_path, "encode_batch_fast")
            fast = fast_tokens / fast_seconds
            print(f"floor  encode_batch_fast, one process:   {rate(fast_tokens, fast_seconds)}  load {os.getloadavg()[0]:.2f}")
            job_tokens, job_seconds = job_tokens_per_s(root / "text", tokenizer_path, root / "packed", args.workers)
            print(f"job    pack --tokenizer, {args.workers} workers (Ray up): {rate(job_tokens, job_seconds)} = "
                  f"{job_tokens / job_seconds / floor:.2f}x encode_batch, {job_tokens / job_seconds / fast:.2f}x "
                  f"encode_batch_fast  load {os.getloadavg()[0]:.2f}")
            if args.hf:
                hf = hf_tokens_per_s(root / "text", tokenizer_path, root, args.workers)
                print(f"hf     datasets.map num_proc={args.workers} + group_texts + save: {rate(hf['tokens'], hf['seconds'])} = "
                      f"{hf['tokens'] / hf['seconds'] / floor:.2f}x floor, {hf['windows']:,} windows  "
                      f"load {os.getloadavg()[0]:.2f}")
        if not args.no_stage:
            from raypack.tokenize.job import TokenizeConfig, run_tokenize

            summary = run_tokenize(TokenizeConfig(inputs=(str(root / "text"),), output=str(root / "tok"),
                                                  num_workers=args.workers, text=TextOptions(tokenizer=str(tokenizer_path))))
            print(f"stage  tokenize alone, {args.workers} workers (Ray up):   {rate(job_tokens, summary.seconds)} = "
                  f"{job_tokens / summary.seconds / floor:.2f}x floor")
        if not args.no_peak:
            from raypack.tokenize.tasks import rayon_threads

            threads = rayon_threads(os.cpu_count() or 1, args.workers)  # what each of the job's workers gets
            for grow in map(int, args.peak_grow.split(",")):
                peak = worker_peak(shards[0], grow, root, tokenizer_path, threads)
                print(f"worker shard x{grow:<2}: {peak['bytes'] / 1e6:7.1f} MB text, {peak['tokens']:>11,} tokens, "
                      f"peak RSS added {peak['peak_added'] / 2**20:7.1f} MiB")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
