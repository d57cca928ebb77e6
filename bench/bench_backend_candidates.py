"""Candidate fast tokenizers against the reference, on the one-pass corpus: ids, then tokens/s.

The issue asks that a backend be chosen by measurement, and others tried the same way. This runs
each candidate's batch encode on every text of the corpus at once, in memory, on all cores, with
a fresh tokenizer per call (as ``bench_onepass.py``'s floor does), and counts the documents whose
ids differ from the reference library's (``tokenizers`` for a tokenizer.json; ``tiktoken``'s
``encode_ordinary`` for cl100k_base). Rounds interleave the candidates; round 0 is a cold process.

The candidates are not raypack's dependencies, so they run in a scratch venv:

    python3 -m venv /tmp/cand && /tmp/cand/bin/pip install gigatoken fastokens tokie kitoken \\
        bpe-openai rs-bpe tokenizers tiktoken pyarrow numpy awkward
    PYTHONPATH=. .venv/bin/python bench/bench_backend_candidates.py --write-corpus /tmp/cand/corpus
    /tmp/cand/bin/python bench/bench_backend_candidates.py --corpus /tmp/cand/corpus --mode hf
    /tmp/cand/bin/python bench/bench_backend_candidates.py --corpus /tmp/cand/corpus --mode cl100k

``--write-corpus`` (the project's venv) writes the corpus of BENCHMARKS.md's one pass: the
installed sources, 16 Parquet shards, and a byte-level BPE of 16,000 ids trained on 8 MB of the
standard library. The reference's ids are computed once (about 2 minutes for tokenizers on
2 cores) and kept beside the corpus.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

Flat = tuple[np.ndarray, np.ndarray]  # all ids end to end (uint32), and each document's count (int64)
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                  r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")


def write_corpus(root: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_onepass import write_shards
    from bench_tokenize import installed_texts, stdlib_texts, train_bpe

    root.mkdir(parents=True, exist_ok=True)
    train_bpe(stdlib_texts(int(8e6)), 16000, root / "tokenizer.json")
    write_shards(installed_texts(), root / "text", 16)


def from_lists(lists) -> Flat:
    counts = np.fromiter((len(x) for x in lists), np.int64, len(lists))
    ids = np.concatenate([np.asarray(x, np.uint32) for x in lists]) if len(lists) else np.zeros(0, np.uint32)
    return ids, counts


def from_awkward(array) -> Flat:
    import awkward as ak

    layout = ak.to_layout(array).to_ListOffsetArray64(True)
    return np.asarray(layout.content.data), np.diff(np.asarray(layout.offsets.data)).astype(np.int64)


def hf_candidates(tokenizer: str) -> tuple[Callable, dict[str, Callable]]:
    def reference(texts):
        import tokenizers

        t = tokenizers.Tokenizer.from_file(tokenizer)
        return from_lists([e.ids for e in t.encode_batch_fast(texts, add_special_tokens=False)])

    def gigatoken():
        import gigatoken

        t = gigatoken.Tokenizer(tokenizer)
        return lambda texts: from_awkward(t.encode_batch(texts, parallel=True))

    def fastokens():
        import fastokens

        t = fastokens.Tokenizer.from_file(tokenizer)
        t.no_truncation()

        def run(texts):
            ids, offsets = t.encode_batch_flat(texts)
            return np.frombuffer(ids, np.uint32), np.diff(np.frombuffer(offsets, np.uint64)).astype(np.int64)
        return run

    def tokie():
        import tokie

        t = tokie.Tokenizer.from_json(tokenizer)

        def run(texts):
            ids, counts = t.encode_batch_flat(texts, add_special_tokens=False)
            return ids, counts.astype(np.int64)
        return run

    def kitoken():
        import kitoken

        t = kitoken.Kitoken.from_tokenizers_file(tokenizer)
        return lambda texts: from_lists(t.encode_all(texts))

    return reference, {"gigatoken": gigatoken, "fastokens": fastokens, "tokie": tokie, "kitoken": kitoken}


def cl100k_candidates(workdir: Path) -> tuple[Callable, dict[str, Callable]]:
    import bpe_openai

    packed = Path(bpe_openai.__file__).parent / "data" / "cl100k_base.tiktoken.gz"
    raw = gzip.decompress(packed.read_bytes())
    rank_file = workdir / "cl100k_base.tiktoken"
    rank_file.write_bytes(raw)

    def reference(texts):
        import tiktoken

        ranks = {base64.b64decode(a): int(b) for a, b in (line.split() for line in raw.splitlines() if line)}
        enc = tiktoken.Encoding("cl100k_base", pat_str=CL100K_PATTERN, mergeable_ranks=ranks,
                                special_tokens={"<|endoftext|>": 100257})
        return from_lists(enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1))

    def gigatoken():
        import gigatoken

        t = gigatoken.Tokenizer.from_tiktoken(str(rank_file), "gpt4", {})
        return lambda texts: from_awkward(t.encode_batch(texts, parallel=True))

    def fastokens():
        import fastokens

        t = fastokens.Tokenizer.from_tiktoken(str(rank_file), encoding="cl100k_base")

        def run(texts):  # split_special_tokens: "<|endoftext|>" in a text is ordinary text (encode_ordinary)
            ids, offsets = t.encode_batch_flat(texts, split_special_tokens=True)
            return np.frombuffer(ids, np.uint32), np.diff(np.frombuffer(offsets, np.uint64)).astype(np.int64)
        return run

    def bpe_openai_():
        enc = bpe_openai.get_encoding("cl100k_base")
        return lambda texts: from_lists(enc.encode_ordinary_batch(texts, num_threads=os.cpu_count() or 1))

    def kitoken():
        import kitoken

        t = kitoken.Kitoken.from_tiktoken_file(str(rank_file))
        return lambda texts: from_lists(t.encode_all(texts))

    return reference, {"gigatoken": gigatoken, "fastokens": fastokens, "bpe_openai": bpe_openai_,
                       "kitoken": kitoken}


def documents_differing(got: Flat, want: Flat) -> int:
    (ids, counts), (ref_ids, ref_counts) = got, want
    if counts.size != ref_counts.size:
        return -1
    starts, ref_starts = np.concatenate([[0], np.cumsum(counts)]), np.concatenate([[0], np.cumsum(ref_counts)])
    same_count = counts == ref_counts
    if ids.size == ref_ids.size and same_count.all():
        return int(np.unique(np.searchsorted(ref_starts, np.flatnonzero(ids != ref_ids), side="right")).size)
    return sum(not (same_count[k] and np.array_equal(ids[starts[k]:starts[k + 1]],
                                                     ref_ids[ref_starts[k]:ref_starts[k + 1]]))
               for k in range(counts.size))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-corpus", type=Path, help="write the corpus and tokenizer here, then stop")
    parser.add_argument("--corpus", type=Path, help="a directory --write-corpus wrote")
    parser.add_argument("--mode", choices=("hf", "cl100k"), default="hf")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated candidates (default: all)")
    args = parser.parse_args()
    if args.write_corpus:
        write_corpus(args.write_corpus)
        return
    if not args.corpus:
        parser.error("give --corpus DIR (or --write-corpus DIR first)")
    import pyarrow.parquet as pq

    texts = [s for f in sorted((args.corpus / "text").glob("*.parquet"))
             for s in pq.read_table(f, columns=["text"]).column("text").to_pylist()]
    print(f"{len(texts)} documents, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB", flush=True)
    reference, candidates = (hf_candidates(str(args.corpus / "tokenizer.json")) if args.mode == "hf"
                             else cl100k_candidates(args.corpus))
    cached = args.corpus / f"reference-{args.mode}.npz"
    if cached.exists():
        z = np.load(cached)
        want = (z["ids"], z["counts"])
    else:
        start = time.perf_counter()
        want = reference(texts)
        took = time.perf_counter() - start
        print(f"reference: {want[0].size} tokens, {took:.1f} s, {want[0].size / took / 1e6:.2f}M tok/s", flush=True)
        np.savez(cached, ids=want[0], counts=want[1])
    names = [n for n in (args.only.split(",") if args.only else candidates)]
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            try:
                encode = candidates[name]()
                start, cpu = time.perf_counter(), time.process_time()
                got = encode(texts)
                took, cpu = time.perf_counter() - start, time.process_time() - cpu
            except Exception as e:  # a candidate that refuses the corpus is a result too
                print(f"round {r} {name:10s} refused: {type(e).__name__}: {' '.join(str(e).split())[:100]}", flush=True)
                continue
            differ = documents_differing(got, want) if r == 0 else "-"
            rates[name].append(got[0].size / took / 1e6)
            print(f"round {r} {name:10s} {got[0].size / took / 1e6:7.2f}M tok/s {took:6.2f} s {cpu:6.2f} CPU-s  "
                  f"documents differing: {differ}", flush=True)
    print(json.dumps({n: [round(v, 1) for v in vs] for n, vs in rates.items()}))


if __name__ == "__main__":
    main()
