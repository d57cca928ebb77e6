"""Peak RSS of ``pack --tokenizer --local`` on text that never repeats a word, with gigatoken's
pretoken table bounded (the default, ``CACHE_BUDGET`` 1 GiB of growth) and unbounded.

    PYTHONPATH=. .venv/bin/python bench/bench_pretoken_table.py [--mb 400] [--shards 8] [--vocab 16000]

Text: ``--mb`` MB of distinct random 10-character words (a-z, 0-9), one space before each, as
documents of 1 MB in ``--shards`` Parquet shards: every word is a short pretoken gigatoken has
not seen, so its table grows with the text (real text repeats its words: BENCHMARKS.md). Tokenizer:
a byte-level BPE of ``--vocab`` ids trained on 8 MB of the stdlib. Each run is a fresh process
(``raypack.cli pack --local``), its peak RSS GNU time's ``%M``; the unbounded run sets
``CACHE_BUDGET`` to 2**60 before the job starts. The packed outputs of both runs are compared
(``content_sha256``).
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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenize import stdlib_texts, train_bpe  # noqa: E402

_RUN = r"""
import sys
import raypack.tokenize.backends.gigatoken as gigatoken_backend
gigatoken_backend.CACHE_BUDGET = int(sys.argv[1])
from raypack.cli import main
sys.exit(main(sys.argv[2:]))
"""


def random_words(num_bytes: int, seed: int) -> str:
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8)
    n = num_bytes // 11
    words = np.full((n, 11), ord(" "), np.uint8)
    words[:, 1:] = alphabet[np.random.default_rng(seed).integers(0, alphabet.size, size=(n, 10))]
    return words.tobytes().decode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=400)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=16000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tokenizer = root / "tokenizer.json"
        train_bpe(stdlib_texts(8 * 10**6), args.vocab, tokenizer)
        shards = root / "words"
        shards.mkdir()
        per_shard = args.mb // args.shards
        for k in range(args.shards):
            docs = [random_words(10**6, k * per_shard + d) for d in range(per_shard)]
            pq.write_table(pa.table({"text": pa.array(docs, pa.string())}), shards / f"text-{k:03d}.parquet")
        print(f"{args.mb} MB of distinct random words in {args.shards} shards; tokenizer {args.vocab:,} ids")
        env = {**os.environ, "RAYPACK_NO_PROGRESS": "1"}
        for label, budget in (("bounded (CACHE_BUDGET 1 GiB, the default)", 1 << 30), ("unbounded", 1 << 60)):
            out = root / f"out-{budget}"
            command = ["/usr/bin/time", "-f", "%M", sys.executable, "-c", _RUN, str(budget), "pack", "--input",
                       str(shards), "--output", str(out), "--local", "--context-length", "2048", "--tokenizer",
                       str(tokenizer), "--tokenizer-backend", "gigatoken"]
            start = time.perf_counter()
            done = subprocess.run(command, env=env, cwd=tmp, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            reloads = done.stderr.count("loading a fresh one")
            manifest = json.loads((out / "manifest.json").read_text())
            print(f"{label}: peak RSS {int(done.stderr.split()[-1]) // 1024:,} MiB, {seconds:.1f} s, "
                  f"{reloads} fresh tokenizers, {manifest['counts']['tokens']:,} tokens, "
                  f"content_sha256 {manifest['content_sha256'][:16]}", flush=True)


if __name__ == "__main__":
    main()
