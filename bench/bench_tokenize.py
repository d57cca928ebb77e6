"""Tokens/s of raypack.tokenize.tokenizers against the libraries' own batch encoders.

    PYTHONPATH=. .venv/bin/python bench/bench_tokenize.py [--mb 20] [--vocab 16000] [--batch-docs 256]

Text: the Python standard library's .py files (sorted paths, one document each) up to
``--mb`` MB. Tokenizer: a byte-level BPE of ``--vocab`` ids trained on that text in this run
(training time printed, not counted). Candidates, over the same texts in batches of
``--batch-docs`` documents, interleaved rounds (bench/timing.py), median of ``--repeats``:

  1. ``Tokenizer.encode_batch(texts, add_special_tokens=False)`` (Encodings only);
  2. ``Tokenizer.encode_batch_fast`` (no offsets), Encodings only;
  3. raypack ``HFTokenizer.encode_batch``: encode_batch_fast + ids + one list<uint16> array;
  4. the flatten alone: ``[e.ids ...]`` + ``ids_to_list_array`` on precomputed Encodings;
  5. tiktoken cl100k_base, one thread: raypack ``TiktokenTokenizer.encode_batch`` with
     num_threads=1 (encode_ordinary per text, then the same flatten).

1-4 use the tokenizers library's Rayon pool: all cores unless RAYON_NUM_THREADS is set
(printed). 5 runs on one core. Token counts are the tokenizer's own.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raypack.tokenize.tokenizers import HFTokenizer, TiktokenTokenizer, ids_to_list_array, token_dtype_for  # noqa: E402

from timing import time_interleaved  # noqa: E402


def stdlib_texts(max_bytes: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        size += len(text.encode())
        if size >= max_bytes:
            break
    return texts


SOURCE_SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt", ".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh")
LICENCE_PREFIXES = ("LICENSE", "LICENCE", "COPYING")


def installed_texts(max_bytes: int | None = None) -> list[str]:
    """Real text without repeats: the standard library's and the installed packages' sources, stubs,
    headers, docs and licence texts (``SOURCE_SUFFIXES``, files named LICENSE*/COPYING*), each
    distinct file once (by content), sorted by path, files over 4 MB left out. In this repository's
    venv (make test's packages): about 42,000 documents, 386 MB, 100M tokens of a 16,000-id BPE."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    roots = [stdlib, stdlib / "site-packages", Path(sysconfig.get_paths()["purelib"])]
    texts, seen, size = [], set(), 0
    for k, root in enumerate(dict.fromkeys(roots)):
        for path in sorted(root.rglob("*")):
            if not (path.suffix in SOURCE_SUFFIXES or path.name.upper().startswith(LICENCE_PREFIXES)):
                continue
            if (k == 0 and "site-packages" in path.parts) or not path.is_file():
                continue
            try:
                data = path.read_bytes()
                text = data.decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            digest = hashlib.sha256(data).digest()
            if len(data) > 4_000_000 or digest in seen:
                continue
            seen.add(digest)
            texts.append(text)
            size += len(data)
            if max_bytes is not None and size >= max_bytes:
                return texts
    return texts


def train_bpe(texts: list[str], vocab_size: int, path: Path) -> None:
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--batch-docs", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="/tmp/bench_tokenize")
    args = parser.parse_args()

    texts = stdlib_texts(int(args.mb * 1e6))
    batches = [pa.array(texts[i : i + args.batch_docs]) for i in range(0, len(texts), args.batch_docs)]
    num_bytes = sum(len(t.encode()) for t in texts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    train_bpe(texts, args.vocab, out / "tokenizer.json")
    print(f"{len(texts)} docs, {num_bytes / 1e6:.1f} MB; "
          f"trained BPE vocab {args.vocab} in {time.perf_counter() - start:.1f}s")
    print(f"RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', '(unset: all cores)')}, cores={os.cpu_count()}, "
          f"load average {os.getloadavg()[0]:.2f}")

    hf = HFTokenizer(out / "tokenizer.json")
    raw = hf._tokenizer
    lists = [b.to_pylist() for b in batches]
    num_tokens = sum(len(a.values) for a in (hf.encode_batch(b) for b in batches))
    encodings = [raw.encode_batch_fast(x, add_special_tokens=False) for x in lists]
    dtype = token_dtype_for(hf.vocab_size)
    tiktoken = TiktokenTokenizer("cl100k_base", num_threads=1)
    num_cl100k = sum(len(tiktoken.encode_batch(b).values) for b in batches)

    candidates = {
        "1 Tokenizer.encode_batch": lambda: [raw.encode_batch(x, add_special_tokens=False) for x in lists],
        "2 Tokenizer.encode_batch_fast": lambda: [raw.encode_batch_fast(x, add_special_tokens=False) for x in lists],
        "3 raypack HFTokenizer.encode_batch": lambda: [hf.encode_batch(b) for b in batches],
        "4 flatten only (ids + list array)": lambda: [
            ids_to_list_array([e.ids for e in encs], dtype) for encs in encodings
        ],
        "5 raypack tiktoken cl100k, 1 thread": lambda: [tiktoken.encode_batch(b) for b in batches],
    }
    times = time_interleaved(candidates, args.repeats)
    print(f"{num_tokens / 1e6:.2f}M tokens (BPE {args.vocab}), {num_cl100k / 1e6:.2f}M tokens (cl100k)")
    for name, seconds in times.items():
        tokens = num_cl100k if "cl100k" in name else num_tokens
        median = statistics.median(seconds)
        print(f"{name:40s} {median:7.2f}s  {tokens / median / 1e6:6.2f}M tokens/s  (min {min(seconds):.2f}s)")


if __name__ == "__main__":
    main()
