"""Tokens/s of each tokenizer backend (raypack.tokenize.backends), in memory and in ``raypack tokenize``.

    PYTHONPATH=. .venv/bin/python bench/bench_backends.py [--mb 4] [--vocab 16000] [--repeats 3]
        [--shape deepseek-like|starcoder-like|sentencepiece-like]

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

from raypack.errors import InputError  # noqa: E402
from raypack.tokenize.backends import BACKENDS, load_backed_tokenizer  # noqa: E402
from raypack.tokenize.guard import BYTES_SHARE, FREE_BYTES  # noqa: E402

from timing import time_interleaved  # noqa: E402

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def _split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


SHAPES = {
    "as-trained": None,  # GPT-2's ByteLevel with its regex: gigatoken's shape
    # DeepSeek-V3's shape: digits in threes, CJK runs, then a word regex, each its own Split
    "deepseek-like": {"type": "Sequence", "pretokenizers": [
        _split(r"\p{N}{1,3}"), _split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"), _split(LLAMA3_SPLIT),
        BYTE_LEVEL]},
    # StarCoder's shape: every digit alone, then GPT-2's ByteLevel with its regex
    "starcoder-like": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, {**BYTE_LEVEL, "use_regex": True}]},
}
"""Pre-tokenizers of real models that gigatoken does not take (``--shape``)."""
SENTENCEPIECE_LIKE = "sentencepiece-like"
"""Llama 2's and Mistral's shape (``--shape sentencepiece-like``): a BPE with byte fallback trained
in this run, a Prepend and Replace normalizer of "\u2581", no pre-tokenizer, so its merges run over
each whole document (where auto takes fastokens first: BENCHMARKS.md, stop 51)."""


def train_sentencepiece_like(texts: list[str], vocab_size: int, path: Path) -> None:
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = tokenizers.normalizers.Sequence(
        [tokenizers.normalizers.Prepend("\u2581"), tokenizers.normalizers.Replace(" ", "\u2581")])
    special = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    tok.train_from_iterator(texts, tokenizers.trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special))
    tok.save(str(path))


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
    tokenizers = {}
    for b in BACKENDS:
        try:
            tokenizers[b] = load_backed_tokenizer(spec, b)
        except InputError as e:  # not installed, or does not take this tokenizer: said, then left out
            print(f"  {b}: {e}")
    names = list(tokenizers)
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
    parser.add_argument("--shape", choices=sorted([*SHAPES, SENTENCEPIECE_LIKE]), default="as-trained",
                        help="the byte-level BPE's pre-tokenizer rewritten to a real model's shape (no cl100k run)")
    args = parser.parse_args()
    texts = stdlib_texts(int(args.mb * 1e6))
    work = Path(tempfile.mkdtemp(prefix="raypack-bench-backends-"))
    if args.shape == SENTENCEPIECE_LIKE:
        train_sentencepiece_like(texts, args.vocab, work / "tok.json")
    else:
        train_bpe(texts, args.vocab, work / "tok.json")
    if SHAPES.get(args.shape) is not None:
        config = json.loads((work / "tok.json").read_text())
        config["pre_tokenizer"] = SHAPES[args.shape]
        (work / "tok.json").write_text(json.dumps(config))
    print(f"cores {os.cpu_count()}, RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', 'unset')}; "
          f"text {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB, {len(texts)} documents")
    big, tiny = work / "big" / "in.jsonl", work / "tiny" / "in.jsonl"
    big_bytes, tiny_bytes = write_jsonl(texts * args.job_copies, big), write_jsonl(texts[:3], tiny)
    specs = ((f"BPE {args.vocab:,}, {args.shape}", str(work / "tok.json")),
             ("cl100k_base", "tiktoken:cl100k_base"))[:2 if args.shape == "as-trained" else 1]
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
