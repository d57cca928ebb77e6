"""raypack against its peers and against the machine's floor, in one command and one run.

    pip install -e '.[bench]'        # after `pip install torch==2.13.0` (see BENCHMARKS.md)
    python bench/bench_peers.py      # 20M tokens, C=2048, 3 repeats: about 6 minutes here
    python bench/bench_peers.py --json docs/benchmarks/peers.json --plot docs/benchmarks/peers.png   # BENCHMARKS.md
    python bench/bench_peers.py --tokens 200e6 --repeats 2 --only raypack_ray1,raypack_local,trl_wrapped_e2e

One corpus is generated first (``raypack.sample.write_sample_corpus``: ``--shards`` Parquet
shards, lognormal document lengths with mean C/3, ``--tokens`` tokens in all). Every candidate
then runs on it, each in a fresh subprocess per repeat (so one candidate's memory, imports
and allocator state never reach another), in a rotating order within each repeat:

  in memory (the corpus already read into one Arrow list array; time the packing only)
    floor_numpy     numpy floor: flat tokens (+ final padding) copied into an (n, C) array
    raypack_stream  raypack core: StreamPacker fed 8192-document slices -> chunks + segments
    raypack_dense   raypack core: pack_sequences -> dense input_ids + per-position doc ids
    trl_wrapped     TRL pack_dataset(strategy="wrapped") on a datasets.Dataset
    trl_bfd         TRL pack_dataset(strategy="bfd")
    trl_bfd_split   TRL pack_dataset(strategy="bfd_split")
    hf_group_texts  datasets.map(group_texts, batched=True): the concatenate-and-chunk recipe
                    of transformers' run_clm.py (input_ids only)
    torchtune       torchtune PackedDataset(split_across_pack=True) on Python lists, over a
                    ``--torchtune-tokens`` prefix (whole corpus by default); rate scaled
  Parquet files in, files out (end to end; the files sit in the page cache)
    floor_io        single-process pyarrow copy: every shard's token column, Parquet -> Arrow IPC
    raypack_ray1    raypack job, embedded local Ray, 1 packer actor (timed after Ray started)
    raypack_ray2    the same with 2 packer actors
    raypack_local   raypack job, --local engine (one process, no Ray)
    trl_wrapped_e2e datasets.load_dataset("parquet") into a fresh cache + TRL "wrapped", cached
                    to disk as a user's script would

Each child runs its candidate once ``cold`` (the first run in a fresh process; the peak memory
is taken here), then ``warm`` (again, output of the previous run dropped, 1 to 20 times within
``--warm-budget`` seconds; the child reports their median). tokens/s come from the median over
``--repeats`` of the children's warm times; the cold median is shown beside it. Every rate is
given as a ratio to both floors measured in the same run. Peak memory: the child's VmHWM
(reset through /proc/self/clear_refs just before the cold run, after freed setup memory was
handed back to the OS) minus its RSS at that moment: what the candidate itself needed, output
included. For the Ray job: the sum of PSS over the driver and every Ray process it started
(gcs, raylet, workers), sampled every 0.1 s, minus the same sum just before the job. On the
first repeat each child also counts what the output keeps (rows, tokens dropped, padding,
split documents) and checks it against raypack's own packing where the semantics agree.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

PAD_TOKEN = 0
STREAM_BATCH_DOCS = 8192
HF_MAP_BATCH = 1000  # datasets.map's default batch_size, which TRL and the recipe inherit


class Spec(NamedTuple):
    key: str
    label: str
    tier: str  # "memory" or "files"
    keeps: str
    padding: str
    splits: str


SPECS = [
    Spec("floor_numpy", "numpy floor (one copy into (n, C))", "memory",
         "nothing", "final row only", "yes"),
    Spec("raypack_stream", "raypack core, StreamPacker -> segments", "memory",
         "per chunk: segments (global doc id + length) -> dense doc ids, cu_seqlens, position ids on demand",
         "final chunk of the corpus only (doc id -1)", "yes; a cut document keeps its id in the next chunk"),
    Spec("raypack_dense", "raypack core, pack_sequences (dense doc ids)", "memory",
         "per position: global doc id (int64)", "final chunk of the corpus only (doc id -1)",
         "yes; a cut document keeps its id in the next chunk"),
    Spec("trl_wrapped", "TRL pack_dataset wrapped", "memory",
         "nothing", "none stored; the last row of every 1000-document map batch is short (ragged)",
         "yes; rows never span two map batches"),
    Spec("trl_bfd", "TRL pack_dataset bfd", "memory",
         "per row: seq_lengths (-> position_ids / cu_seqlens); no doc ids",
         "none stored; rows are ragged (<= C), the collator pads or goes padding-free",
         "no: documents longer than C are truncated, the rest dropped; order changed (sorted by length per batch)"),
    Spec("trl_bfd_split", "TRL pack_dataset bfd_split", "memory",
         "per row: seq_lengths; no doc ids (fragments of one document are unrelated)",
         "none stored; rows are ragged (<= C)",
         "only documents longer than C, into C-token fragments; order changed"),
    Spec("hf_group_texts", "datasets.map concatenate-and-chunk", "memory",
         "nothing", "none; the < C-token tail of every 1000-document map batch is dropped",
         "yes; rows never span two map batches"),
    Spec("torchtune", "torchtune PackedDataset split_across_pack", "memory",
         "per pack: seq_lens (-> block mask) and input_pos (position ids, int64 per position); no doc ids",
         "final pack only (pad tokens, labels -100)",
         "yes; the continuation is a new segment whose input_pos keep counting"),
    Spec("floor_io", "pyarrow Parquet -> IPC copy (I/O floor)", "files",
         "the input's list offsets (nothing is packed)", "n/a", "n/a"),
    Spec("raypack_ray1", "raypack job, Ray, 1 worker", "files",
         "segments, as raypack core, in Arrow IPC + manifest", "final chunk of the corpus only", "yes"),
    Spec("raypack_ray2", "raypack job, Ray, 2 workers", "files",
         "segments, as raypack core, in Arrow IPC + manifest", "final chunk of the corpus only", "yes"),
    Spec("raypack_local", "raypack job, one process (local engine)", "files",
         "segments, as raypack core, in Arrow IPC + manifest", "final chunk of the corpus only", "yes"),
    Spec("trl_wrapped_e2e", "load_dataset(parquet) + TRL wrapped, cached", "files",
         "nothing", "as TRL wrapped", "as TRL wrapped"),
]
SPEC_BY_KEY = {s.key: s for s in SPECS}


# ----------------------------------------------------------------------------- memory


def proc_status_kib(field: str, pid: str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def release_free_memory() -> None:
    """Hand memory freed during setup back to the OS, so it does not hide the candidate's own."""
    import ctypes

    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, from /proc/*/stat parent links."""
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
        except OSError:
            continue
        pid = int(stat.split("/")[2])
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def tree_pss_bytes(root: int) -> int:
    """Sum of PSS (shared pages divided among their users) over ``root``'s process tree."""
    total = 0
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


class TreeSampler:
    """Samples the PSS of this process's tree every ``interval`` seconds; keeps the peak."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss_bytes(os.getpid()))
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_pss_bytes(os.getpid()))


# ----------------------------------------------------------------------------- corpus


def shard_paths(corpus_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(corpus_dir, "shard-*.parquet")))


def load_documents(corpus_dir: str) -> pa.ListArray:
    """Every shard's ``input_ids`` column, in order, as one list<int32> array."""
    table = pq.read_table(shard_paths(corpus_dir), columns=["input_ids"])
    return table.column("input_ids").combine_chunks()


def doc_lengths(documents: pa.ListArray) -> npt.NDArray[np.int64]:
    return np.diff(documents.offsets.to_numpy()).astype(np.int64)


def num_split_docs(lengths: npt.NDArray[np.int64], cuts: npt.NDArray[np.int64]) -> int:
    """Documents (of ``lengths``, end to end) that a cut at a stream position falls inside."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    doc = np.searchsorted(starts, cuts, side="right") - 1
    inside = (cuts > starts[doc]) & (doc < lengths.size)
    return int(np.unique(doc[inside]).size)


def prefix(documents: pa.ListArray, num_tokens: int) -> pa.ListArray:
    """The first documents holding at least ``num_tokens`` tokens (or all of them)."""
    ends = np.cumsum(doc_lengths(documents))
    return documents.slice(0, min(len(documents), int(np.searchsorted(ends, num_tokens)) + 1))


# ----------------------------------------------------------------------------- candidates (in memory)


def numpy_floor(values: npt.NDArray[np.int32], context_length: int) -> npt.NDArray[np.int32]:
    num_chunks = -(-values.size // context_length)
    padding = np.full(num_chunks * context_length - values.size, PAD_TOKEN, dtype=values.dtype)
    return np.concatenate([values, padding]).reshape(num_chunks, context_length)


def raypack_stream(documents: pa.ListArray, context_length: int) -> list:
    from raypack.rules.core import StreamPacker

    packer = StreamPacker(context_length, PAD_TOKEN, dtype=np.int32)
    kept = [packer.push(documents.slice(start, STREAM_BATCH_DOCS), start)
            for start in range(0, len(documents), STREAM_BATCH_DOCS)]
    kept.append(packer.finish())
    return kept


def group_texts_fn(block_size: int) -> Callable[[dict], dict]:
    """transformers' examples/pytorch/language-modeling/run_clm.py ``group_texts``, input_ids only."""
    from itertools import chain

    def group_texts(examples: dict) -> dict:
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        return {k: [t[i: i + block_size] for i in range(0, total_length, block_size)]
                for k, t in concatenated.items()}

    return group_texts


def hf_dataset(documents: pa.ListArray):
    import datasets

    datasets.disable_progress_bars()
    return datasets.Dataset.from_dict({"input_ids": documents})  # zero-copy, in memory


def torchtune_samples(documents: pa.ListArray) -> list[dict]:
    """What a torchtune text-completion dataset yields: Python lists, labels a copy of tokens."""
    return [{"tokens": doc, "labels": doc.copy()} for doc in documents.to_pylist()]


# ----------------------------------------------------------------------------- candidates (files)


def pyarrow_copy(shards: list[str], out_dir: str, column: str = "input_ids") -> None:
    """Parquet read -> Arrow IPC file write, one process, record batch by record batch."""
    os.makedirs(out_dir, exist_ok=True)
    for k, path in enumerate(shards):
        reader = pq.ParquetFile(path)
        schema = pa.schema([reader.schema_arrow.field(column)])
        with pa.OSFile(os.path.join(out_dir, f"copy-{k:05d}.arrow"), "wb") as sink:
            with pa.ipc.new_file(sink, schema) as writer:
                for batch in reader.iter_batches(batch_size=STREAM_BATCH_DOCS, columns=[column]):
                    writer.write_batch(batch)


def raypack_job(corpus_dir: str, out: str, context_length: int, num_workers: int, engine: str):
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack

    config = make_config(dict(inputs=[corpus_dir], output=out, context_length=context_length,
                              pad_token=PAD_TOKEN, num_workers=num_workers, overwrite=True))
    return run_pack(config, engine=engine)


def trl_wrapped_e2e(corpus_dir: str, cache_dir: str, context_length: int):
    import datasets
    from trl import pack_dataset

    datasets.disable_progress_bars()
    ds = datasets.load_dataset("parquet", data_files=shard_paths(corpus_dir), split="train", cache_dir=cache_dir)
    return pack_dataset(ds, context_length, strategy="wrapped")


# ----------------------------------------------------------------------------- what the output keeps


def describe_rows(row_lens: npt.NDArray[np.int64], tokens_in: int, context_length: int, pad_stored: int = 0) -> dict:
    tokens_out = int(row_lens.sum()) - pad_stored
    return {
        "rows": int(row_lens.size),
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_dropped": tokens_in - tokens_out,
        "rows_shorter_than_C": int(np.count_nonzero(row_lens < context_length)),
        "pad_stored": pad_stored,
        "pad_to_fill_C": int(row_lens.size * context_length - tokens_out),
    }


def hf_row_lengths(ds) -> npt.NDArray[np.int64]:
    import pyarrow.compute as pc

    return pc.list_value_length(ds.data.column("input_ids")).to_numpy().astype(np.int64)


def describe_dense(documents, input_ids, doc_ids, context_length: int) -> dict:
    from raypack.rules.core import pack_sequences

    lengths = doc_lengths(documents)
    want_ids, want_docs = pack_sequences(documents, context_length, PAD_TOKEN)
    pad = int(np.count_nonzero(doc_ids == -1))
    out = describe_rows(np.full(input_ids.shape[0], context_length), int(lengths.sum()), context_length, pad)
    out["split_docs"] = num_split_docs(lengths, np.arange(1, input_ids.shape[0]) * context_length)
    same = np.array_equal(input_ids, want_ids) and np.array_equal(doc_ids, want_docs)
    out["check"] = "equal to pack_sequences" if same else "DIFFERS from pack_sequences"
    return out


def describe_wrapped(documents, out_ds, context_length: int) -> dict:
    lengths, rows = doc_lengths(documents), hf_row_lengths(out_ds)
    out = describe_rows(rows, int(lengths.sum()), context_length)
    out["split_docs"] = num_split_docs(lengths, np.cumsum(rows)[:-1])
    stream = out_ds.data.column("input_ids").combine_chunks().flatten().to_numpy()
    same = np.array_equal(stream, documents.flatten().to_numpy())
    out["check"] = "rows concatenate to the input stream" if same else "rows DIFFER from the input stream"
    return out


def describe_bfd(documents, out_ds, context_length: int, split: bool) -> dict:
    lengths, rows = doc_lengths(documents), hf_row_lengths(out_ds)
    out = describe_rows(rows, int(lengths.sum()), context_length)
    too_long = lengths > context_length
    out["split_docs"] = int(np.count_nonzero(too_long)) if split else 0
    out["truncated_docs"] = 0 if split else int(np.count_nonzero(too_long))
    expected_drop = 0 if split else int((lengths[too_long] - context_length).sum())
    seq_lengths = out_ds.data.column("seq_lengths").combine_chunks()
    out["segments_per_row"] = round(len(seq_lengths.flatten()) / max(1, len(rows)), 2)
    out["check"] = (f"dropped tokens = sum(len - C) over docs > C ({expected_drop:,})"
                    if out["tokens_dropped"] == expected_drop
                    else f"dropped {out['tokens_dropped']:,} != {expected_drop:,}")
    return out


def describe_group_texts(documents, out_ds, context_length: int) -> dict:
    lengths, rows = doc_lengths(documents), hf_row_lengths(out_ds)
    out = describe_rows(rows, int(lengths.sum()), context_length)
    cuts, base = [], 0
    for start in range(0, lengths.size, HF_MAP_BATCH):
        batch_len = int(lengths[start:start + HF_MAP_BATCH].sum())
        kept = batch_len // context_length * context_length
        cuts.append(base + np.arange(context_length, kept + 1, context_length))  # incl. the cut before the dropped tail
        base += batch_len
    out["split_docs"] = num_split_docs(lengths, np.concatenate(cuts))
    expected_rows = sum(int(lengths[s:s + HF_MAP_BATCH].sum()) // context_length
                        for s in range(0, lengths.size, HF_MAP_BATCH))
    out["check"] = ("rows as predicted per map batch" if expected_rows == rows.size
                    else "row count DIFFERS from prediction")
    return out


def describe_torchtune(documents, packed, context_length: int) -> dict:
    from raypack.rules.core import pack_sequences
    from raypack.rules.masks import position_ids

    lengths = doc_lengths(documents)
    tokens = np.stack([p["tokens"].numpy() for p in packed.packs])
    pad = int(sum(int((p["labels"] == -100).sum()) for p in packed.packs))
    out = describe_rows(np.full(len(tokens), context_length), int(lengths.sum()), context_length, pad)
    out["split_docs"] = num_split_docs(lengths, np.arange(1, len(tokens)) * context_length)
    want_ids, want_docs = pack_sequences(documents, context_length, PAD_TOKEN)
    input_pos = np.stack([p["input_pos"].numpy() for p in packed.packs])
    differs = (input_pos != position_ids(want_docs)) & (want_docs != -1)
    # positions that continue a document cut at the previous chunk boundary
    continues = np.zeros_like(differs)
    continues[1:] = (want_docs[1:] == want_docs[:-1, -1:]) & (want_docs[1:] != -1)
    out["continuation_tokens"] = int(continues.sum())
    out["input_pos_differs"] = int(differs.sum())
    where = "all of them" if not (differs & ~continues).any() else "NOT only"
    out["check"] = (("tokens equal to raypack pack_sequences" if np.array_equal(tokens, want_ids)
                     else "tokens DIFFER from raypack")
                    + f"; input_pos differs from raypack position_ids at {out['input_pos_differs']:,} positions, "
                    f"{where} in the {out['continuation_tokens']:,} tokens that continue a cut document")
    out["prefix_docs"] = int(lengths.size)
    return out


def describe_job(summary) -> dict:
    counts, c = summary.manifest["counts"], summary.manifest["context_length"]
    return {
        "rows": counts["chunks"], "tokens_in": counts["tokens"], "tokens_out": counts["tokens"],
        "tokens_dropped": 0, "rows_shorter_than_C": 0, "pad_stored": counts["padding_positions"],
        "pad_to_fill_C": counts["chunks"] * c - counts["tokens"], "split_docs": counts["split_documents"],
        "check": f"content_sha256 {summary.manifest['content_sha256'][:12]}",
    }


# ----------------------------------------------------------------------------- child


class Setup(NamedTuple):
    run: Callable[[], Any]
    num_tokens: int
    describe: Callable[[Any], dict] | None
    cleanup: Callable[[], None] = lambda: None


def setup_memory(key: str, args) -> Setup:
    c = args.context_length
    documents = load_documents(args.corpus)
    num_tokens = len(documents.values)
    if key == "floor_numpy":
        values = documents.flatten().to_numpy()
        def describe(out):
            found = describe_rows(np.full(out.shape[0], c), num_tokens, c, out.size - num_tokens)
            found["split_docs"] = num_split_docs(doc_lengths(documents), np.arange(1, out.shape[0]) * c)
            return found
        return Setup(lambda: numpy_floor(values, c), num_tokens, describe)
    if key == "raypack_stream":
        def describe(kept):
            from raypack.rules.core import concat_chunks
            chunks = concat_chunks(kept, c, np.int32)
            return describe_dense(documents, chunks.input_ids, chunks.doc_ids(), c)
        return Setup(lambda: raypack_stream(documents, c), num_tokens, describe)
    if key == "raypack_dense":
        from raypack.rules.core import pack_sequences
        return Setup(lambda: pack_sequences(documents, c, PAD_TOKEN), num_tokens,
                     lambda out: describe_dense(documents, out[0], out[1], c))
    if key.startswith("trl_"):
        from trl import pack_dataset
        ds, strategy = hf_dataset(documents), key[len("trl_"):]
        describe = ((lambda out: describe_wrapped(documents, out, c)) if strategy == "wrapped"
                    else (lambda out: describe_bfd(documents, out, c, split=strategy == "bfd_split")))
        return Setup(lambda: pack_dataset(ds, c, strategy=strategy), num_tokens, describe)
    if key == "hf_group_texts":
        ds, fn = hf_dataset(documents), group_texts_fn(c)
        return Setup(lambda: ds.map(fn, batched=True), num_tokens, lambda out: describe_group_texts(documents, out, c))
    if key == "torchtune":
        from torchtune.datasets import PackedDataset
        head = prefix(documents, args.torchtune_tokens)
        samples = torchtune_samples(head)
        return Setup(lambda: PackedDataset(samples, max_seq_len=c, padding_idx=PAD_TOKEN, split_across_pack=True),
                     len(head.flatten()), lambda out: describe_torchtune(head, out, c))
    raise ValueError(f"unknown in-memory candidate {key!r}")


def setup_files(key: str, args) -> Setup:
    c, work = args.context_length, args.work
    shards = shard_paths(args.corpus)
    num_tokens = args.num_tokens  # counted by the parent; reading the shards here would skew the memory base
    out = os.path.join(work, f"out-{key}")
    if key == "floor_io":
        return Setup(lambda: pyarrow_copy(shards, out), num_tokens, None,
                     lambda: shutil.rmtree(out, ignore_errors=True))
    if key.startswith("raypack_"):
        engine, workers = ("local", 1) if key == "raypack_local" else ("ray", int(key[-1]))
        return Setup(lambda: raypack_job(args.corpus, out, c, workers, engine), num_tokens, describe_job,
                     lambda: shutil.rmtree(out, ignore_errors=True))
    if key == "trl_wrapped_e2e":
        def run():
            shutil.rmtree(out, ignore_errors=True)
            return trl_wrapped_e2e(args.corpus, out, c)
        return Setup(run, num_tokens, lambda ds: describe_wrapped(load_documents(args.corpus), ds, c),
                     lambda: shutil.rmtree(out, ignore_errors=True))
    raise ValueError(f"unknown file candidate {key!r}")


def timed(run: Callable[[], Any]) -> tuple[Any, float]:
    gc.collect()
    start = time.perf_counter()
    out = run()
    return out, time.perf_counter() - start


def child_main(args) -> dict:
    spec = SPEC_BY_KEY[args.child]
    result: dict[str, Any] = {"key": spec.key}
    if spec.key in ("raypack_ray1", "raypack_ray2"):
        from raypack.engine import pipeline
        start = time.perf_counter()
        pipeline.init_ray(None)
        result["ray_start_s"] = time.perf_counter() - start
    setup = setup_memory(spec.key, args) if spec.tier == "memory" else setup_files(spec.key, args)
    result["num_tokens"] = setup.num_tokens
    release_free_memory()
    result["peak_reset"] = reset_peak_rss()
    base_rss = proc_status_kib("VmRSS") * 1024
    tree_before = tree_pss_bytes(os.getpid())
    with TreeSampler() as sampler:
        out, result["cold_s"] = timed(setup.run)
    result["base_rss"] = base_rss
    result["peak_rss"] = proc_status_kib("VmHWM") * 1024
    result["peak_delta"] = result["peak_rss"] - base_rss
    result["tree_base_pss"], result["tree_peak_pss"] = tree_before, sampler.peak
    if spec.key in ("raypack_ray1", "raypack_ray2"):
        result["worker_peak_rss"] = out.peak_worker_rss_bytes  # ru_maxrss of the packer actors
        result["peak_delta"] = sampler.peak - tree_before  # the driver plus every Ray process
        result["tree_pids"] = len(descendants(os.getpid()))
    if args.describe and setup.describe is not None:
        result["describe"] = setup.describe(out)
    del out
    setup.cleanup()
    result["warm_runs_s"] = warm_runs(setup, args.warm_budget)
    result["warm_s"] = statistics.median(result["warm_runs_s"])
    return result


def warm_runs(setup: Setup, budget_s: float, max_runs: int = 20) -> list[float]:
    """Run again, output of the previous run dropped, until ``budget_s`` is spent (1..max_runs runs)."""
    times: list[float] = []
    while not times or (sum(times) < budget_s and len(times) < max_runs):
        out, elapsed = timed(setup.run)
        del out
        setup.cleanup()
        times.append(elapsed)
    return times


# ----------------------------------------------------------------------------- parent


def run_child(key: str, args, describe: bool, log_path: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", key, "--corpus", args.corpus_dir,
           "--work", args.work, "--context-length", str(args.context_length),
           "--torchtune-tokens", str(int(args.torchtune_tokens)), "--num-tokens", str(args.num_tokens),
           "--warm-budget", str(args.warm_budget)]
    if describe:
        cmd.append("--describe")
    env = dict(os.environ, TQDM_DISABLE="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               HF_HOME=os.path.join(args.work, "hf-home"), RAY_DEDUP_LOGS="0")
    env.pop("RAY_ADDRESS", None)
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"candidate {key} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("raypack", "numpy", "pyarrow", "ray", "datasets", "trl", "transformers", "torch", "torchtune",
                 "torchao"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def git_state() -> dict:
    """The commit raypack was measured at, and whether raypack/ differs from it."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "raypack"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None}
    import raypack
    return {"commit": commit.stdout.strip(), "raypack_modified": bool(dirty.stdout.strip()),
            "raypack_imported_from": os.path.dirname(os.path.abspath(raypack.__file__))}


def machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cpu": model, "cpus": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "os": f"{platform.system()} {platform.release()}"}


def make_corpus(args) -> dict:
    from raypack.sample import write_sample_corpus

    mean = args.context_length / 3
    docs_per_shard = max(1, int(args.tokens / args.shards / mean))
    start = time.perf_counter()
    shutil.rmtree(args.corpus_dir, ignore_errors=True)
    write_sample_corpus(args.corpus_dir, num_shards=args.shards, docs_per_shard=docs_per_shard, mean_doc_len=mean)
    documents = load_documents(args.corpus_dir)
    lengths = doc_lengths(documents)
    c = args.context_length
    return {"shards": args.shards, "docs": int(lengths.size), "tokens": int(lengths.sum()),
            "context_length": c, "mean_doc_len": round(float(lengths.mean()), 1),
            "median_doc_len": int(np.median(lengths)), "max_doc_len": int(lengths.max()),
            "docs_longer_than_C": int(np.count_nonzero(lengths > c)),
            "tokens_beyond_C": int((lengths[lengths > c] - c).sum()),
            "generate_s": round(time.perf_counter() - start, 2)}


def summarise(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Median times, rates and memory per candidate, and ratios to the two floors."""
    rows = {}
    for key, results in runs.items():
        n = results[0]["num_tokens"]
        warm = [r["warm_s"] for r in results]
        cold = [r["cold_s"] for r in results]
        rows[key] = {
            "num_tokens": n, "warm_s": warm, "cold_s": cold,
            "rate": n / statistics.median(warm), "cold_rate": n / statistics.median(cold),
            "rate_min": n / max(warm), "rate_max": n / min(warm),
            "peak_delta": statistics.median(r["peak_delta"] for r in results),
            "peak_rss": statistics.median(r["peak_rss"] for r in results),
        }
        for extra in ("ray_start_s", "worker_peak_rss", "tree_peak_pss", "tree_base_pss"):
            if extra in results[0]:
                rows[key][extra] = statistics.median(r[extra] for r in results)
        rows[key]["describe"] = next((r["describe"] for r in results if "describe" in r), None)
    for key, row in rows.items():
        row["x_numpy_floor"] = row["rate"] / rows["floor_numpy"]["rate"]
        row["x_io_floor"] = row["rate"] / rows["floor_io"]["rate"]
    return rows


def fmt_mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.0f}"


def markdown_tables(report: dict) -> str:
    rows = report["results"]
    lines = [
        "| candidate | tier | M tokens/s (warm) | x numpy floor | x I/O floor | M tokens/s (cold) | spread "
        "| peak memory MiB | bytes/token |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    specs = [spec for spec in SPECS if spec.key in rows]
    labels = {spec.key: spec.label + (f" ({rows[spec.key]['num_tokens'] / 1e6:.0f}M-token prefix)"
                                      if rows[spec.key]["num_tokens"] < report["corpus"]["tokens"] else "")
              for spec in specs}
    for spec in specs:
        r = rows[spec.key]
        spread = f"{r['rate_min'] / 1e6:.0f}-{r['rate_max'] / 1e6:.0f}" if r["rate"] > 1e7 else \
            f"{r['rate_min'] / 1e6:.1f}-{r['rate_max'] / 1e6:.1f}"
        label = labels[spec.key]
        lines.append(f"| {label} | {spec.tier} | {r['rate'] / 1e6:,.1f} | {r['x_numpy_floor']:.3f} | "
                     f"{r['x_io_floor']:.2f} | {r['cold_rate'] / 1e6:,.1f} | {spread} | "
                     f"{fmt_mib(r['peak_delta'])} | {r['peak_delta'] / r['num_tokens']:.1f} |")
    lines += ["", "| candidate | boundaries kept | padding | documents split | rows | tokens dropped | rows < C "
                  "| pad stored | pad to fill C | split docs | check |",
              "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for spec in specs:
        d = rows[spec.key]["describe"]
        counts = ("| - " * 6) if d is None else (
            f"| {d['rows']:,} | {d['tokens_dropped']:,} | {d['rows_shorter_than_C']:,} | {d['pad_stored']:,} | "
            f"{d['pad_to_fill_C']:,} | {d['split_docs']:,} ")
        check = "" if d is None else d.get("check", "")
        lines.append(f"| {labels[spec.key]} | {spec.keeps} | {spec.padding} | {spec.splits} {counts}| {check} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=float, default=20e6, help="corpus size in tokens (default 20e6)")
    parser.add_argument("--context-length", type=int, default=2048, help="C, tokens per chunk")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="subprocess runs per candidate (median reported)")
    parser.add_argument("--torchtune-tokens", type=float, default=5e6,
                        help="prefix torchtune packs (its per-token Python loop is slow); the rate is scaled")
    parser.add_argument("--warm-budget", type=float, default=1.0,
                        help="seconds of warm runs per child (1 to 20 runs; their median is the child's warm time)")
    parser.add_argument("--only", default=None, help="comma-separated candidate keys (the two floors always run)")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--json", default="bench/results/peers.json", help="where to write the raw numbers")
    parser.add_argument("--plot", default="bench/results/peers.png", help="where to write the PNG ('' to skip)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--describe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num-tokens", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tokens < args.context_length or args.repeats < 1 or args.shards < 1:
        parser.error("need --tokens >= --context-length, --repeats >= 1 and --shards >= 1")
    return args


def parent_main(args) -> int:
    started = time.perf_counter()
    args.work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="raypack-peers-"))
    args.corpus_dir = os.path.join(args.work, "corpus")
    os.makedirs(os.path.join(args.work, "logs"), exist_ok=True)
    keys = [s.key for s in SPECS]
    if args.only:
        wanted = set(args.only.split(",")) | {"floor_numpy", "floor_io"}
        keys = [k for k in keys if k in wanted]
    report: dict[str, Any] = {"command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
                              "machine": machine(), "versions": versions(), "git": git_state(),
                              "load_before": load_avg()}
    report["corpus"] = make_corpus(args)
    args.num_tokens = report["corpus"]["tokens"]
    print(f"# corpus: {report['corpus']}", flush=True)
    print(f"# load average before: {report['load_before']}", flush=True)
    runs: dict[str, list[dict]] = {k: [] for k in keys}
    loads = []
    for rep in range(args.repeats):
        order = keys[rep % len(keys):] + keys[: rep % len(keys)]
        for key in order:
            log_path = os.path.join(args.work, "logs", f"{key}-{rep}.log")
            result = run_child(key, args, describe=rep == 0, log_path=log_path)
            result["load"] = load_avg()
            runs[key].append(result)
            print(f"rep {rep} {key:<16} cold {result['cold_s']:8.3f}s  warm {result['warm_s']:8.3f}s  "
                  f"peak +{fmt_mib(result['peak_delta'])} MiB  load {result['load']}", flush=True)
        loads.append(load_avg())
    report["results"] = summarise(runs)
    report["runs"] = runs
    report["load_after_each_repeat"] = loads
    report["wall_s"] = round(time.perf_counter() - started, 1)
    print()
    print(markdown_tables(report))
    print(f"\nwhole run: {report['wall_s']:.0f}s; load average after each repeat: {loads}")
    write_outputs(report, args)
    if args.workdir is None:
        shutil.rmtree(args.work, ignore_errors=True)
    return 0


def write_outputs(report: dict, args) -> None:
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=float)
        print(f"wrote {args.json}")
    if args.plot:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from plot_peers import plot_report

        plot_report(report, args.plot)
        print(f"wrote {args.plot}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child_main(args)))
        return 0
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
