"""Packer memory with one long document vs a normal corpus of the same size: what a document costs.

    python bench/bench_long_doc.py --tokens 2000000,8000000 --sides 0,1 --formats parquet   # BENCHMARKS.md
    python bench/bench_long_doc.py --tokens 5000000 --dtypes int32,uint16 --strategies concat

Each case packs one shard with :func:`raypack.pack.packer.pack_shard` in a fresh child process
(``--child``): the shard holds either ONE document of ``--tokens`` tokens ("long") or documents
of 1..2*mean tokens (mean ``--mean-len``) summing to the same total ("normal"). The child
imports everything, builds the task, resets
its peak RSS (``/proc/self/clear_refs``), packs, and reports (best_fit's counting pass runs in
a child of its own before):

  * added: peak RSS while packing minus the RSS just before (VmHWM - VmRSS);
  * peak: the absolute peak RSS of packing (VmHWM after the reset);
  * reader: added peak RSS of only reading the shard with the same read batches (no packing,
    ``iter_document_batches`` as the packer reads), measured the same way in the same kind of
    child: what the format reader itself holds.

A document is read whole (pyarrow), so ``added`` of the long shard over its tokens is what one
document costs a packer, in bytes per token (``B/token``; ``--sides 1`` adds a side column
``loss_mask`` of int8, one value per token, packed with the tokens). The ratio is long/normal of
``added``; ``seconds``, ``cpu s``: wall and CPU time of
packing (both load-dependent, wall much more). Input token type = output token type (--dtypes).
``--compression``: the Parquet codec(s);
``--values phrases``: tokens drawn as repeated random phrases (copy-heavy for the codec, as real
text is) instead of independent random tokens (incompressible).
Arrow IPC inputs are memory-mapped: the pages of the file a child touches count in its RSS.
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

import numpy as np
import pyarrow as pa
import pyarrow.ipc as paipc
import pyarrow.parquet as pq

C = 2048


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss() -> int:
    """Reset VmHWM to the current RSS (Linux >= 4.0); return the current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_bytes("VmRSS")


# ----------------------------------------------------------------------------- inputs


def doc_lengths(kind: str, num_tokens: int, mean_len: int, seed: int = 0) -> np.ndarray:
    if kind == "long":
        return np.array([num_tokens], np.int64)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * mean_len, size=2 * num_tokens // mean_len + 16)
    ends = np.cumsum(lengths)
    n = int(np.searchsorted(ends, num_tokens)) + 1
    lengths = lengths[:n]
    lengths[-1] -= int(ends[n - 1]) - num_tokens
    return lengths[lengths > 0] if lengths[-1] <= 0 else lengths


def token_values(values: str, num_tokens: int, dtype: str) -> np.ndarray:
    """``random``: independent uniform tokens < 50,000; ``phrases``: a sequence of 20,000 random
    phrases of 1..8 tokens drawn Zipf(1.2) (repeats a compressor finds, like text: snappy makes
    ~0.2 elements per token of it, ~0.3 for word-split Python source)."""
    rng = np.random.default_rng(1)
    if values == "random":
        return rng.integers(0, 50_000, size=num_tokens).astype(dtype)
    phrase_lens = rng.integers(1, 9, size=20_000)
    phrase_ends = np.cumsum(phrase_lens)
    book = rng.integers(0, 50_000, size=int(phrase_ends[-1]))
    picks = (rng.zipf(1.2, size=num_tokens // 4 + 16) - 1) % phrase_lens.size
    starts = (phrase_ends - phrase_lens)[picks]
    offsets = np.repeat(starts - np.cumsum(phrase_lens[picks]) + phrase_lens[picks], phrase_lens[picks])
    positions = np.arange(offsets.size) + offsets
    return book[positions[:num_tokens]].astype(dtype)


def write_shard(path: str, kind: str, fmt: str, dtype: str, num_tokens: int, mean_len: int, values: str = "random",
                compression: str = "snappy", sides: int = 0) -> None:
    lengths = doc_lengths(kind, num_tokens, mean_len)
    values = token_values(values, num_tokens, dtype)
    offsets = np.zeros(lengths.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    lists = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    columns = {"input_ids": lists}
    if sides:
        mask = (np.arange(num_tokens) % 3 != 0).astype(np.int8)
        columns["loss_mask"] = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(mask))
    table = pa.table(columns)
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=65536, compression=compression)
    else:
        with paipc.new_file(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=65536)


# ----------------------------------------------------------------------------- child


def child(args: argparse.Namespace) -> dict:
    from raypack.inputs.reading import inspect_shard, iter_document_batches
    from raypack.pack.packer import count_shard_chunks, pack_shard, read_batch_rows
    from raypack.pack.tasks import PackSettings, ShardTask
    from raypack.rules.side_columns import SideColumn

    info = inspect_shard(args.path, "input_ids")
    sides = (SideColumn("loss_mask", "int8"),) if int(args.sides) else ()
    settings = PackSettings(out_dir=args.out, context_length=C, pad_token=0, token_dtype=args.dtype,
                            token_column="input_ids", read_batch_size=0, read_batch_tokens=args.read_batch_tokens,
                            chunks_per_record_batch=512, strategy=args.strategy,
                            strategy_options={"best_fit_window": args.window} if args.strategy == "best_fit" else {},
                            extra_columns=sides)
    task = ShardTask(0, args.path, info.format, 0, 0, info.num_docs, info.num_tokens)
    if args.count:
        return {"num_chunks": count_shard_chunks(task, settings)}
    if args.strategy == "best_fit":
        task = ShardTask(0, args.path, info.format, 0, 0, info.num_docs, info.num_tokens, 0, args.num_chunks)
    before = reset_peak_rss()
    start, start_cpu = time.perf_counter(), time.process_time()
    if args.read_only:
        for batch in iter_document_batches(task.path, task.format, "input_ids", read_batch_rows(task, settings),
                                           extra_columns=tuple(c.name for c in sides)):
            del batch
    else:
        pack_shard(task, settings)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    peak = _status_bytes("VmHWM")
    return {"before": before, "peak": peak, "added": peak - before, "arrow_now": pa.total_allocated_bytes(),
            "seconds": seconds, "cpu_seconds": cpu_seconds}


def run_child(path: str, out: str, dtype: str, strategy: str, args: argparse.Namespace, *, mode: str = "pack",
              num_chunks: int = -1) -> dict:
    cmd = [sys.executable, __file__, "--child", "--path", path, "--out", out, "--dtype", dtype,
           "--strategy", strategy, "--window", str(args.window), "--read-batch-tokens", str(args.read_batch_tokens),
           "--num-chunks", str(num_chunks), "--sides", str(args.sides)]
    if mode != "pack":
        cmd.append(f"--{mode}")
    env = dict(os.environ, **({"ARROW_DEFAULT_MEMORY_POOL": args.arrow_pool} if args.arrow_pool else {}))
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="8000000", help="tokens per shard, comma-separated sizes")
    parser.add_argument("--sides", default="0", help="side columns: 0 (none), 1 (an int8 loss_mask), or 0,1")
    parser.add_argument("--mean-len", type=int, default=683)
    parser.add_argument("--dtypes", default="int32")
    parser.add_argument("--strategies", default="concat,best_fit")
    parser.add_argument("--formats", default="parquet,arrow")
    parser.add_argument("--compression", default="snappy",
                        help="Parquet codec(s), comma-separated (snappy, zstd, none, ...)")
    parser.add_argument("--values", default="random", choices=["random", "phrases"])
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--read-batch-tokens", type=int, default=1 << 20)
    parser.add_argument("--cast-to", default="", help="output token_dtype when it differs from the input's "
                        "(e.g. uint16 for int32 inputs: the packer casts every token)")
    parser.add_argument("--arrow-pool", default="", help="ARROW_DEFAULT_MEMORY_POOL for the children "
                        "(jemalloc, mimalloc, system; default: pyarrow's choice)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--read-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num-chunks", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    print(f"one shard of {args.tokens} tokens; C={C}; read_batch_tokens={args.read_batch_tokens:,}; "
          f"best_fit window {args.window:,}; Arrow pool {args.arrow_pool or pa.default_memory_pool().backend_name}; "
          f"{args.values} tokens; load average {os.getloadavg()[0]:.2f}")
    print(f"{'tokens':>10} {'format':14} {'dtype':8} {'sides':5} {'strategy':9} {'corpus':7} {'reader MiB':>10} "
          f"{'added MiB':>10} {'B/token':>7} {'peak MiB':>9} {'ratio':>6} {'seconds':>7} {'cpu s':>6}")
    for num_tokens in map(int, args.tokens.split(",")):
        for sides in map(int, args.sides.split(",")):
            run_size(argparse.Namespace(**{**vars(args), "tokens": num_tokens, "sides": sides}))


def run_size(args: argparse.Namespace) -> None:
    mib = 1 << 20
    formats = [(fmt, codec) for fmt in args.formats.split(",")
               for codec in (args.compression.split(",") if fmt == "parquet" else [""])]
    with tempfile.TemporaryDirectory() as tmp:
        for fmt, codec in formats:
            for dtype in args.dtypes.split(","):
                paths = {}
                for kind in ("normal", "long"):
                    paths[kind] = os.path.join(tmp, f"{kind}-{dtype}.{'parquet' if fmt == 'parquet' else 'arrow'}")
                    write_shard(paths[kind], kind, fmt, dtype, args.tokens, args.mean_len, args.values, codec,
                                args.sides)
                for strategy in args.strategies.split(","):
                    added = {}
                    for kind in ("normal", "long"):
                        out = os.path.join(tmp, f"out-{kind}-{strategy}")
                        os.makedirs(out)
                        out_dtype = args.cast_to or dtype
                        reader = run_child(paths[kind], out, out_dtype, strategy, args, mode="read-only")
                        num_chunks = -1
                        if strategy == "best_fit":  # the counting pass, in its own process
                            counted = run_child(paths[kind], out, out_dtype, strategy, args, mode="count")
                            num_chunks = counted["num_chunks"]
                        packed = run_child(paths[kind], out, out_dtype, strategy, args, num_chunks=num_chunks)
                        added[kind] = packed["added"]
                        ratio = f"{added['long'] / added['normal']:.2f}x" if kind == "long" else ""
                        label = f"{dtype}>{args.cast_to}" if args.cast_to else dtype
                        name = f"{fmt}/{codec}" if codec else fmt
                        print(f"{args.tokens:10,} {name:14} {label:8} {args.sides:5} {strategy:9} {kind:7} "
                              f"{reader['added'] / mib:10.0f} {packed['added'] / mib:10.0f} "
                              f"{packed['added'] / args.tokens:7.1f} {packed['peak'] / mib:9.0f} {ratio:>6} "
                              f"{packed['seconds']:7.1f} {packed['cpu_seconds']:6.1f}", flush=True)
                        shutil.rmtree(out)
                for path in paths.values():
                    os.remove(path)


if __name__ == "__main__":
    main()
