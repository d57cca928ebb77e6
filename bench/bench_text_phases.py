"""CPU seconds of each phase of ``pack --tokenizer``'s one pass, each phase alone, in one process,
over bench_onepass.py's corpus: what bounds the one pass against the in-memory encode floor.

    PYTHONPATH=. .venv/bin/python bench/bench_text_phases.py [--vocab 16000] [--shards 16] [--repeats 2]

Phases, over all shards: the Parquet read (``iter_parquet_texts``: decompression, decoding, the
UTF-8 check), the backend's ``encode_flat`` (all cores), the ids as list arrays, and the Parquet
read's decompression alone (``pyarrow.Codec("snappy")`` over the text bytes). The printed bound is
the best a job on ``os.cpu_count()`` cores can do against the floor if reading and encoding were
all it did and every core stayed busy: encode wall / ((read CPU + encode CPU) / cores).

``--scaling``: instead, how gigatoken's encode scales over the cores (BENCHMARKS.md, "2026-12-03,
evening"): the texts in memory in 16 MiB pieces, a fresh tokenizer per pass, each pass timed
(wall and CPU) on the calling thread (``parallel=False``), on Rayon's pool piece after piece, in
one call, on two Python threads of ``parallel=False`` halves, and in two processes each encoding
half of the pieces (the slower one's wall). A warm-up pass per process comes first.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onepass import write_shards  # noqa: E402
from bench_tokenize import installed_texts, stdlib_texts, train_bpe  # noqa: E402

from raypack.inputs.parquet import iter_parquet_texts  # noqa: E402
from raypack.tokenize.backends import load_backed_tokenizer  # noqa: E402
from raypack.tokenize.tokenizers import flat_to_list_array  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(name: str, fn):
    cpu, wall = cpu_seconds(), time.perf_counter()
    out = fn()
    cpu, wall = cpu_seconds() - cpu, time.perf_counter() - wall
    print(f"  {name:34s} CPU {cpu:5.2f} s  wall {wall:5.2f} s", flush=True)
    return out, cpu, wall


def text_pieces(shards: list[str], piece_bytes: int = 16 << 20) -> tuple[list, object]:
    """The shards' texts as one awkward string array over their Arrow buffers (what the gigatoken
    backend hands the encoder) and as slices of it of ~``piece_bytes`` (the one pass's encode calls)."""
    import awkward as ak

    texts = pa.concat_arrays([t.cast(pa.large_string()) for p in shards
                              for _, t in iter_parquet_texts(p, "text", None, 1 << 20)])
    offsets = np.frombuffer(texts.buffers()[1], np.int64)[texts.offset:texts.offset + len(texts) + 1]
    cuts = np.unique(np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], piece_bytes)))
    bounds = [*cuts[cuts < len(texts)].tolist(), len(texts)]
    whole = ak.from_arrow(texts, generate_bitmasks=False)
    return [whole[a:b] for a, b in zip(bounds, bounds[1:])], whole


def encode_pieces(tokenizer_path: str, pieces: tuple[list, object], how: str) -> None:
    pieces, whole = pieces
    tokenizer = load_backed_tokenizer(tokenizer_path, "gigatoken").encoder.tokenizer  # fresh: a cold cache
    if how == "one call":
        tokenizer.encode_batch(whole, parallel=True)
    elif how == "two threads":
        with ThreadPoolExecutor(2) as pool:
            for piece in pieces:
                half = len(piece) // 2
                list(pool.map(lambda texts: tokenizer.encode_batch(texts, parallel=False),
                              [piece[:half], piece[half:]]))
    else:
        for piece in pieces:
            tokenizer.encode_batch(piece, parallel=how == "rayon")


def scaling(shards: list[str], tokenizer_path: str, repeats: int) -> None:
    pieces = text_pieces(shards)
    encode_pieces(tokenizer_path, pieces, "rayon")  # warm-up
    for _ in range(repeats):
        for name, how in (("parallel=False, the calling thread", "thread"), ("Rayon, piece after piece", "rayon"),
                          ("Rayon, one call", "one call"), ("two threads of parallel=False", "two threads")):
            timed(name, lambda: encode_pieces(tokenizer_path, pieces, how))
        halves = [subprocess.Popen([sys.executable, __file__, "--half", str(k), "--tokenizer", tokenizer_path,
                                    *shards], stdout=subprocess.PIPE, text=True) for k in (0, 1)]
        walls = [float(h.communicate()[0].split()[-1]) for h in halves]
        print(f"  {'two processes, half each (slower)':34s}                wall {max(walls):5.2f} s", flush=True)


def half(k: int, tokenizer_path: str, shards: list[str]) -> None:
    pieces, whole = text_pieces(shards)
    pieces = (pieces[k::2], whole)
    encode_pieces(tokenizer_path, pieces, "thread")  # warm-up
    start = time.perf_counter()
    encode_pieces(tokenizer_path, pieces, "thread")
    print(time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--scaling", action="store_true", help="how the encode scales over the cores (above)")
    parser.add_argument("--half", type=int, help=argparse.SUPPRESS)  # --scaling's child process
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("files", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.half is not None:
        return half(args.half, args.tokenizer, args.files)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = installed_texts()
        tokenizer_path = root / "tokenizer.json"
        train_bpe(stdlib_texts(int(8e6)), args.vocab, tokenizer_path)
        shards = sorted(str(p) for p in write_shards(texts, root / "big", args.shards).glob("*.parquet"))
        size = sum(len(t.encode()) for t in texts)
        print(f"{len(texts)} documents, {size / 1e6:.1f} MB of text in {len(shards)} shards, "
              f"{os.cpu_count()} CPUs")
        if args.scaling:
            return scaling(shards, str(tokenizer_path), args.repeats)
        encoder = load_backed_tokenizer(str(tokenizer_path), "gigatoken").encoder
        encoder.encode_flat(pa.array(texts[:100], pa.large_string()))  # the pool's first call
        for round_ in range(args.repeats):
            print(f"round {round_ + 1}")
            batches, read_cpu, _ = timed("Parquet read (iter_parquet_texts)", lambda: [
                t for p in shards for _, t in iter_parquet_texts(p, "text", None, 8192)])
            flats, encode_cpu, encode_wall = timed("encode_flat (all cores)",
                                                   lambda: [encoder.encode_flat(t) for t in batches])
            timed("ids as list<uint16> arrays", lambda: [flat_to_list_array(f, np.dtype(np.uint16)) for f in flats])
            codec = pa.Codec("snappy")
            packed = [codec.compress(t.buffers()[2]) for t in batches]
            timed("snappy decompression alone", lambda: [
                codec.decompress(c, decompressed_size=t.buffers()[2].size) for c, t in zip(packed, batches)])
            tokens = sum(int(f.offsets[-1]) for f in flats)
            bound = encode_wall / ((read_cpu + encode_cpu) / os.cpu_count())
            print(f"  {tokens:,} tokens; floor {tokens / encode_wall / 1e6:.1f}M tokens/s; read + encode alone "
                  f"bound a job at {bound:.2f}x the floor")


if __name__ == "__main__":
    main()
