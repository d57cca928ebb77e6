"""Tokens/s of ``raypack export --format megatron`` against a single-process memmap copy and
Megatron-Core's own IndexedDatasetBuilder, on the same documents, in one run.

    PYTHONPATH=. .venv/bin/python bench/bench_export.py [--tokens 50e6] [--shards 8] [--repeats 3]

Corpus: a tokenized corpus (``raypack tokenize``'s layout: ``part-NNNNNN.parquet``, zstd, one
``input_ids`` list<uint16> column, its manifest) of ``--shards`` parts, lognormal document
lengths (mean 700, sigma 1), ids uniform below 50,000; and the same documents packed (concat,
C = 2048, ``--local``) for the packed-source rows. Everything sits in the page cache after the
warm-up: the figures are decoding and copying, not disk. Candidates, interleaved rounds
(bench/timing.py), median of ``--repeats``:

  1. floor: one process reads the same Parquet files (same batches) and copies every token into
     a ``numpy.memmap`` of the final size, then ``flush()`` (msync);
  2. ``run_export(tokenized, "megatron", workers=1)`` (fsync of .bin and .idx included);
  3. the same with ``workers=2`` (spawned processes: start-up included);
  4. ``run_export(packed, "megatron", workers=1)``: documents recovered from the chunks;
  5. Megatron's route: ``IndexedDatasetBuilder(bin, dtype=uint16)`` fed from Python with
     ``add_document(torch.from_numpy(doc), [len])`` per document (what its
     tools/preprocess_data.py does), then ``finalize(idx)``; reading as in 1 (no fsync).
     Needs megatron-core (``pip install megatron-core==0.16.1``); skipped, with a line, without it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from raypack.export.job import run_export  # noqa: E402
from raypack.export.sources import BATCH_TOKENS  # noqa: E402
from raypack.pack.config import make_config  # noqa: E402
from raypack.pack.job import run_pack  # noqa: E402
from raypack.tokenize.corpus import (  # noqa: E402
    build_tokenized_manifest,
    load_tokenized_manifest,
    part_file_name,
    save_tokenized_manifest,
)

from timing import time_interleaved  # noqa: E402


def write_corpus(out: Path, num_tokens: int, num_shards: int, seed: int = 0) -> list[int]:
    """The tokenized corpus; returns the document lengths."""
    rng = np.random.default_rng(seed)
    lens = np.maximum(1, rng.lognormal(np.log(700) - 0.5, 1.0, size=int(num_tokens / 700 * 1.2))).astype(np.int64)
    lens = lens[: int(np.searchsorted(np.cumsum(lens), num_tokens)) + 1]
    tokens = rng.integers(0, 50_000, size=int(lens.sum()), dtype=np.uint16)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    out.mkdir(parents=True)
    bounds, shards = np.linspace(0, lens.size, num_shards + 1).astype(int), []
    for k in range(num_shards):
        d0, d1 = bounds[k], bounds[k + 1]
        column = pa.ListArray.from_arrays(pa.array(offsets[d0:d1 + 1] - offsets[d0], pa.int32()),
                                          pa.array(tokens[offsets[d0]:offsets[d1]]))
        path = out / part_file_name(k)
        pq.write_table(pa.table({"input_ids": column}), path, compression="zstd", use_dictionary=False)
        data = path.read_bytes()
        shards.append({"path": path.name, "num_docs": int(d1 - d0), "num_tokens": int(offsets[d1] - offsets[d0]),
                       "num_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "source": {}})
    save_tokenized_manifest(str(out), build_tokenized_manifest(shards, "uint16", {"kind": "bench"}, {}))
    return lens.tolist()


def parquet_batches(src: Path):
    """Each part's ``input_ids`` in batches of about BATCH_TOKENS tokens, as raypack reads them."""
    for shard in load_tokenized_manifest(str(src))["shards"]:
        rows = max(1, BATCH_TOKENS * shard["num_docs"] // max(1, shard["num_tokens"]))
        for batch in pq.ParquetFile(src / shard["path"]).iter_batches(batch_size=rows, columns=["input_ids"]):
            yield batch.column(0)


def memmap_copy(src: Path, out: Path, num_tokens: int) -> None:
    dest = np.memmap(out, dtype=np.uint16, mode="w+", shape=(num_tokens,))
    position = 0
    for column in parquet_batches(src):
        values = column.values.to_numpy(zero_copy_only=True)
        dest[position: position + values.size] = values
        position += values.size
    dest.flush()
    del dest


def megatron_builder(src: Path, prefix: Path) -> None:
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for column in parquet_batches(src):
        offsets = column.offsets.to_numpy()
        values = torch.from_numpy(column.values.to_numpy(zero_copy_only=True).astype(np.int64))
        for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            builder.add_document(values[start:end], [end - start])
    builder.finalize(f"{prefix}.idx")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=float, default=50e6)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed)")
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-export-"))
    print(f"load average before: {os.getloadavg()}")
    lens = write_corpus(root / "tokens", int(args.tokens), args.shards)
    num_tokens = int(sum(lens))
    run_pack(make_config(dict(inputs=[str(root / "tokens")], output=str(root / "packed"), context_length=2048,
                              pad_token=0)), engine="local")
    print(f"corpus: {len(lens):,} documents, {num_tokens:,} uint16 tokens, {args.shards} shards")

    def fresh(name: str) -> str:
        for ext in (".bin", ".idx"):
            Path(root, name + ext).unlink(missing_ok=True)
        return str(root / name)

    candidates = {
        "floor: Parquet -> numpy.memmap, 1 process": lambda: memmap_copy(root / "tokens", root / "floor.bin",
                                                                           num_tokens),
        "raypack export, tokenized, 1 worker": lambda: run_export(str(root / "tokens"), "megatron", fresh("w1")),
        "raypack export, tokenized, 2 workers": lambda: run_export(str(root / "tokens"), "megatron", fresh("w2"),
                                                                   workers=2),
        "raypack export, packed (concat), 1 worker": lambda: run_export(str(root / "packed"), "megatron",
                                                                        fresh("p1")),
    }
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core.datasets.indexed_dataset  # noqa: F401
        candidates["Megatron IndexedDatasetBuilder, add_document per doc"] = \
            lambda: megatron_builder(root / "tokens", Path(fresh("mt")))
    except ImportError as e:
        print(f"Megatron's builder skipped: {e}")
    times = time_interleaved(candidates, args.repeats)
    floor = statistics.median(times[next(iter(times))])
    print(f"load average after: {os.getloadavg()}\n")
    print("| candidate | M tokens/s | x floor | spread (s) |\n|---|---:|---:|---:|")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {name} | {num_tokens / median / 1e6:,.1f} | {floor / median:.2f} | "
              f"{min(seconds):.2f}-{max(seconds):.2f} |")
    for name in ("w2", "p1"):
        for ext in (".bin", ".idx"):
            assert Path(root, name + ext).read_bytes() == Path(root, "w1" + ext).read_bytes(), name + ext
    if Path(root, "mt.bin").exists():
        assert Path(root, "mt.bin").read_bytes() == Path(root, "w1.bin").read_bytes()
        assert Path(root, "mt.idx").read_bytes() == Path(root, "w1.idx").read_bytes()
        print("\nMegatron's builder and raypack export wrote the same .bin and .idx bytes")
    if not args.dir:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
