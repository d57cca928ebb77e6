"""Tokens/s of each tokenizer backend (raypack.tokenize.backends), in memory and in ``raypack tokenize``.

    PYTHONPATH=. .venv/bin/python bench/bench_backends.py [--mb 4] [--vocab 16000] [--repeats 3]

Text: the Python standard library's .py files (sorted paths, one document each, real text) up
to ``--mb`` MB, plus the same bytes again as one JSONL corpus for the job runs. Tokenizers: a
byte-level BPE of ``--vocab`` ids trained on that text in this run (not timed), and tiktoken
cl100k_base. Figures, every backend over the same texts:

  1. in memory: ``encode_flat`` on batches of 1 MiB of text (what a tokenize task does), all
     cores (the backends' Rayon pools), interleaved rounds, median;
  2. ``raypack tokenize --local`` (a subprocess, so start-up is counted once each): the marginal
     rate, (tokens of a big run - tokens of a tiny run) / (time of big - time of tiny);
  3. the guard's share of the gigatoken run: the bytes it re-encoded with the reference, at the
     reference's in-memory rate, over the run's time.

Each identical-ids check is asserted: every backend's ids equal the reference's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenize import stdlib_texts, train_bpe  # noqa: E402

from raypack.tokenize.backends import BACKENDS, load_backed_tokenizer  # noqa: E402
from raypack.tokenize.guard import BYTES_SHARE, FREE_BYTES  # noqa: E402

from timing import time_interleaved  # noqa: E402


def batches(texts: list[str], max_bytes: int = 1 << 20) -> list[pa.Array]:
    out, start, size = [], 0, 0
    for k, text in enumerate(texts):
        size += len(text.encode())
        if size >= max_bytes or k == len(texts) - 1:
            out.append(pa.array(texts[start:k + 1]))
            start, size = k + 1, 0
    return out


def in_memory(spec: str, texts: list[str], repeats: int) -> dict[str, float]:
    pieces = batches(texts)
    names = [b for b in BACKENDS if BACKENDS[b].version() is not None]
    tokenizers = {b: load_backed_tokenizer(spec, b) for b in names}
    ids = {b: [t.encode_flat(p) for p in pieces] for b, t in tokenizers.items()}
    for b in names:
        assert all(np.array_equal(x.values, y.values) for x, y in zip(ids[b], ids["reference"])), b
    num_tokens = sum(int(f.values.size) for f in ids["reference"])
    times = time_interleaved({b: (lambda t=t: [t.encode_flat(p) for p in pieces]) for b, t in tokenizers.items()},
                             repeats)
    return {b: num_tokens / statistics.median(times[b]) for b in names} | {"tokens": num_tokens}


def run_cli(spec: str, corpus: Path, out: Path, backend: str) -> tuple[float, int, dict]:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "raypack.cli", "tokenize", "--local", "--overwrite", "--input", str(corpus),
                    "--output", str(out), "--tokenizer", spec, "--tokenizer-backend", backend],
                   check=True, capture_output=True, env={**os.environ, "RAYPACK_NO_PROGRESS": "1"})
    seconds = time.perf_counter() - start
    manifest = json.loads((out / "manifest.json").read_text())
    return seconds, manifest["counts"]["tokens"], manifest


def write_jsonl(texts: list[str], path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=4)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--job-copies", type=int, default=6, help="the job's big run: the text this many times")
    args = parser.parse_args()
    texts = stdlib_texts(int(args.mb * 1e6))
    work = Path(tempfile.mkdtemp(prefix="raypack-bench-backends-"))
    train_bpe(texts, args.vocab, work / "tok.json")
    print(f"cores {os.cpu_count()}, RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', 'unset')}; "
          f"text {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB, {len(texts)} documents")
    big, tiny = work / "big" / "in.jsonl", work / "tiny" / "in.jsonl"
    big_bytes, tiny_bytes = write_jsonl(texts * args.job_copies, big), write_jsonl(texts[:3], tiny)
    specs = ((f"byte-level BPE {args.vocab:,}", str(work / "tok.json")), ("cl100k_base", "tiktoken:cl100k_base"))
    for label, spec in specs:
        rates = in_memory(spec, texts, args.repeats)
        print(f"\n{label}: in memory, {rates.pop('tokens'):,} tokens, M tokens/s: "
              + ", ".join(f"{b} {r / 1e6:.2f}" for b, r in rates.items()))
        for backend in rates:
            t_big, n_big, manifest = run_cli(spec, big, work / f"o_{backend}", backend)
            t_tiny, n_tiny, _ = run_cli(spec, tiny, work / f"t_{backend}", backend)
            marginal = (n_big - n_tiny) / max(t_big - t_tiny, 1e-9)
            line = (f"  raypack tokenize --local --tokenizer-backend {backend}: {t_big:.2f} s big, "
                    f"{t_tiny:.2f} s tiny, marginal {marginal / 1e6:.2f} M tokens/s; "
                    f"content_sha256 {manifest['content_sha256'][:12]}")
            if backend != "reference":
                num_tasks = manifest["counts"]["shards"]
                checked = min(big_bytes, num_tasks * FREE_BYTES + BYTES_SHARE * big_bytes)  # the bound
                ref_bytes_per_s = rates["reference"] * big_bytes / n_big
                line += (f"; guard <= {checked / 1e3:.0f} kB re-encoded = {checked / ref_bytes_per_s:.3f} s at the "
                         f"reference's rate ({100 * checked / ref_bytes_per_s / (t_big - t_tiny):.1f}% of the run; "
                         f"the share alone: {100 * BYTES_SHARE * marginal / rates['reference']:.1f}%)")
            print(line)
    print(f"\n(big run: {big_bytes / 1e6:.1f} MB JSONL, tiny run: {tiny_bytes / 1e3:.0f} kB; work dir {work})")


if __name__ == "__main__":
    main()
