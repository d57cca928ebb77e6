"""Issue 7: best-fit-decreasing packing (``raypack.strategies.best_fit.rules``) against concat and TRL's bfd.

    python bench/bench_best_fit.py                       # 20M tokens, C=2048: about 1-2 minutes here
    /work/benchvenv/bin/python bench/bench_best_fit.py --json /tmp/bfbench/best_fit.json
    python bench/bench_best_fit.py --tokens 200e6 --repeats 3

Corpus: the one ``bench/bench_peers.py`` packs, made by the same code (its ``make_corpus``:
``raypack.sample.write_sample_corpus``, 16 Parquet shards, seed 0, lognormal lengths with
sigma 1 and mean C/3), so the figures here line up with BENCHMARKS.md. It is read back into
one Arrow ``list<int32>`` array; everything below runs in memory, in this one process.

Quality (exact; counted from the document lengths and checked on real packed output):
  concat        raypack's default: concatenate, cut at multiples of C, pad the last chunk
                only. From lengths: chunks = ceil(T/C), padding = chunks*C - T, split
                documents = those a multiple of C falls strictly inside. Checked against
                StreamPacker's output.
  best_fit      windows of 1,000 / 4,096 / 16,384 / 65,536 documents and 0 (whole corpus):
                ``best_fit_stats`` from lengths, then checked against ``BestFitPacker``'s real
                output (fed 8192-document Arrow slices): chunk count, padding, split documents,
                every document of <= C tokens in exactly one segment, every document rebuilt
                token for token from its segments, doc ids increasing inside a chunk, padding
                only at a chunk's end, and the chunk of every item equal to an independent
                best-fit-decreasing written here (a plain loop over numpy rooms).
  TRL bfd / bfd_split  ``trl.pack_dataset(ds, seq_length=C, strategy=...)`` on a
                ``datasets.Dataset`` of the same documents (1,000-document map batches, its
                default). Rows are ragged (<= C); padding = positions a collator pads to make
                every row C long. bfd truncates documents longer than C (tokens dropped);
                bfd_split cuts them into C-token pieces. Checked: the multiset of output
                segments, fingerprinted by (length, first token, token sum), equals the
                expected items (truncated documents, resp. pieces).
  Padding % = padding positions / (rows * C); split % = split documents / documents.

Throughput (in memory, tokens of the corpus / second): BestFitPacker fed Arrow list slices of
8192 documents as the job feeds it, each push's chunks kept as returned (every window above),
StreamPacker (concat, for reference), TRL bfd and bfd_split, all in this one process. Every
candidate is warmed up once (that "first" call is kept too), then ``--repeats`` rounds run them
all, each round in a new seeded order; within a round a candidate is called until ``--budget``
seconds are spent (1 to 20 calls) and the round keeps their median. Reported: the median over
rounds, the min-max spread of the rounds, the CPU time per call (user + sys; wall time above it
means the process waited for a core), its kernel (sys) part, minor page faults per call, and
the load average after every round. On a shared VM much of the spread is the kernel (page
faults, transparent-huge-page compaction after another candidate freed its memory) and other
jobs taking the cores: the CPU and sys columns show which. Without TRL and datasets installed,
their rows are skipped with a note.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any, Callable, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
sys.path[:0] = [BENCH_DIR, REPO]  # bench_peers (the corpus), raypack from this checkout

from raypack.rules.core import Chunks, concat_chunks  # noqa: E402
from raypack.strategies.best_fit.rules import BestFitPacker, best_fit_stats  # noqa: E402

import bench_peers as peers  # noqa: E402

PAD_TOKEN = 0
BATCH_DOCS = 8192  # documents per Arrow slice fed to the packers (as bench_peers feeds StreamPacker)
WINDOWS = (1000, 4096, 16384, 65536, 0)
HF_MAP_BATCH = peers.HF_MAP_BATCH  # 1000: datasets.map's default batch, TRL's bfd window
GOAL_PADDING_PCT = 2.0


# ----------------------------------------------------------------------------- packers


def pack_best_fit_parts(documents: pa.ListArray, c: int, window: int) -> list[Chunks]:
    """What the job does per shard: push 8192-document Arrow slices, keep each push's chunks."""
    packer = BestFitPacker(c, PAD_TOKEN, window=window, dtype=np.int32)
    parts = [packer.push(documents.slice(start, BATCH_DOCS)) for start in range(0, len(documents), BATCH_DOCS)]
    parts.append(packer.finish())
    return parts


def pack_best_fit_stream(documents: pa.ListArray, c: int, window: int) -> Chunks:
    return concat_chunks(pack_best_fit_parts(documents, c, window), c, np.int32)


def pack_concat_stream(documents: pa.ListArray, c: int) -> Chunks:
    return concat_chunks(peers.raypack_stream(documents, c), c, np.int32)


def trl_available() -> str | None:
    """None if TRL and datasets import, else why not."""
    import importlib

    try:
        importlib.import_module("datasets")
        importlib.import_module("trl").pack_dataset
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


# ----------------------------------------------------------------------------- quality from lengths


def concat_stats(lengths: npt.NDArray[np.int64], c: int) -> dict:
    """concat's exact figures from the lengths alone."""
    total = int(lengths.sum())
    chunks = -(-total // c)
    starts = np.cumsum(lengths) - lengths
    ends = starts + lengths  # exclusive
    split = (lengths > 0) & (starts // c != (ends - 1) // c)
    return {"chunks": chunks, "padding": chunks * c - total, "split_docs": int(split.sum()),
            "split_docs_le_C": int((split & (lengths <= c)).sum())}


def items_of(lengths: npt.NDArray[np.int64], c: int) -> tuple[np.ndarray, np.ndarray]:
    """Rule 2, written independently: per document L // C pieces of C, then L % C if any."""
    full = lengths // c
    rem = lengths % c
    count = full + (rem > 0)
    doc = np.repeat(np.arange(lengths.size), count)
    first = np.cumsum(count) - count
    piece = np.arange(doc.size) - first[doc]
    length = np.where(piece < full[doc], c, rem[doc])
    return doc, length.astype(np.int64)


def reference_bfd(lengths: npt.NDArray[np.int64], c: int, window: int) -> tuple[np.ndarray, np.ndarray, int]:
    """An independent best-fit decreasing: (doc, chunk) of every item, and the chunk count.

    Per window: items longest first (ties: stream order); each goes to the open chunk with
    the least room that holds it (ties: the chunk opened first, np.argmin's first minimum),
    else to a new chunk. Chunks are numbered in opening order, windows one after another.
    """
    step = window or max(1, lengths.size)
    docs_out, chunks_out, base = [], [], 0
    for w0 in range(0, lengths.size, step):
        doc, length = items_of(lengths[w0:w0 + step], c)
        order = np.argsort(-length, kind="stable")
        rooms = np.empty(order.size, dtype=np.int64)
        chunk_of = np.empty(order.size, dtype=np.int64)
        opened = 0
        for k, size in zip(order.tolist(), length[order].tolist()):
            j = -1
            if opened:
                open_rooms = rooms[:opened]
                cand = int(np.argmin(np.where(open_rooms >= size, open_rooms, c + 1)))
                if open_rooms[cand] >= size:
                    j = cand
            if j < 0:
                j, opened = opened, opened + 1
                rooms[j] = c
            rooms[j] -= size
            chunk_of[k] = j
        docs_out.append(doc + w0)
        chunks_out.append(chunk_of + base)
        base += opened
    return np.concatenate(docs_out), np.concatenate(chunks_out), base


# ----------------------------------------------------------------------------- quality from packed output


def audit_chunks(chunks: Chunks, tokens: np.ndarray, lengths: npt.NDArray[np.int64], c: int,
                 *, best_fit: bool) -> dict:
    """What real packed output holds, and whether it is a faithful packing of the documents.

    With ``best_fit`` also required: doc ids strictly increasing inside a chunk (rule 4) and
    every document of 1..C tokens in exactly one segment (concat cuts them, by design).
    """
    n = chunks.num_chunks
    seg_docs = chunks.segment_doc_ids
    seg_lens = chunks.segment_lengths.astype(np.int64)
    seg_count = np.diff(chunks.segment_offsets)
    seg_chunk = np.repeat(np.arange(n), seg_count)
    flat_start = np.cumsum(seg_lens) - seg_lens  # chunks' segments sum to C: a flat position
    problems = []
    if chunks.input_ids.shape != (n, c):
        problems.append(f"input_ids shape {chunks.input_ids.shape}")
    sums = np.add.reduceat(seg_lens, chunks.segment_offsets[:-1]) if n else np.zeros(0, np.int64)
    if n and (seg_count.min() < 1 or not np.all(sums == c)):
        problems.append("a chunk's segments do not sum to C")
    pad = seg_docs == -1
    padding = int(seg_lens[pad].sum())
    last_in_chunk = np.zeros(seg_docs.size, bool)
    last_in_chunk[chunks.segment_offsets[1:] - 1] = True
    if np.any(pad & ~last_in_chunk):
        problems.append("padding segment not at the end of its chunk")
    flat = chunks.input_ids.reshape(-1)
    pad_pos = np.repeat(flat_start[pad], seg_lens[pad]) + _ramp(seg_lens[pad])
    if np.any(flat[pad_pos] != PAD_TOKEN):
        problems.append("padding position holds a non-pad token")
    real = ~pad
    d, ln, ch, st = seg_docs[real], seg_lens[real], seg_chunk[real], flat_start[real]
    same_chunk = ch[1:] == ch[:-1]
    if best_fit and np.any(same_chunk & (d[1:] <= d[:-1])):
        problems.append("doc ids not strictly increasing inside a chunk")
    seg_per_doc = np.bincount(d, minlength=lengths.size)
    tokens_per_doc = np.bincount(d, weights=ln, minlength=lengths.size).astype(np.int64)
    if not np.array_equal(tokens_per_doc, lengths):
        problems.append("tokens per doc id differ from the document lengths")
    short = (lengths >= 1) & (lengths <= c)
    whole = bool(np.all(seg_per_doc[short] == 1))
    if best_fit and not whole:
        problems.append(f"{int(np.sum(seg_per_doc[short] != 1))} documents of <= C tokens not in exactly one segment")
    order = np.argsort(d, kind="stable")  # per document, its segments in chunk order
    gather = np.repeat(st[order], ln[order]) + _ramp(ln[order])
    if not np.array_equal(flat[gather], tokens):
        problems.append("documents rebuilt from their segments differ from the input")
    split = seg_per_doc > 1
    return {"chunks": n, "padding": padding, "split_docs": int(split.sum()),
            "split_docs_le_C": int((split & (lengths <= c)).sum()),
            "docs_le_C_in_one_segment": whole, "problems": problems,
            "pairs": (d, ch)}


def same_pairs(a_docs: np.ndarray, a_chunks: np.ndarray, b_docs: np.ndarray, b_chunks: np.ndarray) -> bool:
    """The same set of (doc id, chunk) pairs, i.e. every item in the same chunk."""
    if a_docs.size != b_docs.size:
        return False
    a, b = np.lexsort((a_chunks, a_docs)), np.lexsort((b_chunks, b_docs))
    return bool(np.array_equal(a_docs[a], b_docs[b]) and np.array_equal(a_chunks[a], b_chunks[b]))


def _ramp(run_lengths: np.ndarray) -> np.ndarray:
    """0..l-1 for each run, concatenated."""
    run_lengths = np.asarray(run_lengths, np.int64)
    total = int(run_lengths.sum())
    starts = np.cumsum(run_lengths) - run_lengths
    return np.arange(total, dtype=np.int64) - np.repeat(starts, run_lengths)


def audit_trl(out_ds, tokens: np.ndarray, lengths: npt.NDArray[np.int64], c: int, split: bool) -> dict:
    """TRL bfd / bfd_split output: rows, padding to fill C, tokens dropped, segment check."""
    import pyarrow.compute as pc

    table = out_ds.data
    ids = table.column("input_ids").combine_chunks()
    rows = pc.list_value_length(ids).to_numpy().astype(np.int64)
    values = ids.flatten().to_numpy()
    seg = table.column("seq_lengths").combine_chunks().flatten().to_numpy().astype(np.int64)
    tokens_out = int(rows.sum())
    problems = []
    if rows.size and rows.max() > c:
        problems.append("a row longer than C")
    if seg.sum() != tokens_out:
        problems.append("seq_lengths do not sum to the rows")
    # expected items, in stream order: (length, first token, token sum)
    doc_starts = np.cumsum(lengths) - lengths
    if split:
        doc, length = items_of(lengths, c)
        piece = np.arange(doc.size) - (np.cumsum(np.bincount(doc, minlength=lengths.size)) -
                                       np.bincount(doc, minlength=lengths.size))[doc]
        start = doc_starts[doc] + piece * c
    else:
        keep = lengths > 0
        doc, length = np.flatnonzero(keep), np.minimum(lengths[keep], c)
        start = doc_starts[doc]
    want = _fingerprints(tokens, start, length)
    got = _fingerprints(values, np.cumsum(seg) - seg, seg)
    same = want.shape == got.shape and np.array_equal(np.sort(want.view("i8,i8,i8"), axis=0),
                                                      np.sort(got.view("i8,i8,i8"), axis=0))
    if not same:
        problems.append("output segments differ from the expected items")
    too_long = lengths > c
    return {"rows": int(rows.size), "padding": int(rows.size * c - tokens_out),
            "tokens_out": tokens_out, "tokens_dropped": int(lengths.sum()) - tokens_out,
            "expected_dropped": 0 if split else int((lengths[too_long] - c).sum()),
            "truncated_docs": 0 if split else int(too_long.sum()),
            "split_docs": int(too_long.sum()) if split else 0, "split_docs_le_C": 0,
            "rows_shorter_than_C": int(np.count_nonzero(rows < c)), "segments_match_items": same,
            "problems": problems}


def _fingerprints(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(k, 3) int64: length, first token, token sum of each run (empty runs are excluded)."""
    values = values.astype(np.int64)
    csum = np.concatenate([[0], np.cumsum(values)])
    sums = csum[starts + lengths] - csum[starts]
    return np.ascontiguousarray(np.stack([lengths, values[starts], sums], axis=1))


# ----------------------------------------------------------------------------- timing


class Call(NamedTuple):
    wall_s: float
    user_s: float
    sys_s: float  # kernel CPU time: page faults, transparent-huge-page compaction
    minor_faults: int


def timed_call(run: Callable[[], Any]) -> Call:
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    out = run()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    del out
    return Call(wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime,
                after.ru_minflt - before.ru_minflt)


def time_rounds(candidates: dict[str, Callable[[], Any]], repeats: int,
                budget_s: float) -> tuple[dict[str, Call], dict[str, list[list[Call]]], list[str]]:
    """One warm-up call each (kept as ``first``), then ``repeats`` rounds.

    Each round runs every candidate in a fresh seeded order (a rotation alone would keep the
    same neighbours, and a packer run right after TRL frees its memory pays for page faults);
    within a round a candidate is called until ``budget_s`` is spent (1 to 20 calls), as
    bench_peers' warm runs. Returns the first calls, every call per round, the loads.
    """
    names = list(candidates)
    first = {name: timed_call(candidates[name]) for name in names}
    calls: dict[str, list[list[Call]]] = {name: [] for name in names}
    loads = []
    for r in range(repeats):
        order = [names[i] for i in np.random.default_rng(r).permutation(len(names))]
        for name in order:
            runs: list[Call] = []
            while not runs or (sum(c.wall_s for c in runs) < budget_s and len(runs) < 20):
                runs.append(timed_call(candidates[name]))
            calls[name].append(runs)
        loads.append(peers.load_avg())
        print(f"  round {r + 1}/{repeats} done, load average {loads[-1]}", flush=True)
    return first, calls, loads


# ----------------------------------------------------------------------------- report


def pct(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


def code_identity() -> dict:
    """What raypack code was measured: commit, dirty files under raypack/, hash of best_fit.py."""
    found = peers.git_state()
    try:
        status = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "raypack"],
                                capture_output=True, text=True).stdout.splitlines()
    except OSError:
        status = []
    found["raypack_status"] = status
    for name in ("best_fit.py", "core.py"):
        with open(os.path.join(REPO, "raypack", name), "rb") as f:
            found[f"sha256_{name}"] = hashlib.sha256(f.read()).hexdigest()
    return found


def quality_table(rows: list[dict]) -> str:
    lines = ["| packing | chunks/rows | padding | padding % | split docs | split % | split docs <= C | tokens dropped "
             "| check |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['chunks']:,} | {r['padding']:,} | {r['padding_pct']:.3f} | "
                     f"{r['split_docs']:,} | {r['split_pct']:.2f} | {r['split_docs_le_C']:,} | "
                     f"{r.get('tokens_dropped', 0):,} | {r['check']} |")
    return "\n".join(lines)


def speed_table(rows: list[dict]) -> str:
    lines = ["| candidate | M tokens/s (median) | spread (min-max of rounds) | x TRL bfd | median s "
             "| CPU s/call (user+sys) | sys s/call | minor faults/call | first call M tokens/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = "-" if r.get("x_trl_bfd") is None else f"{r['x_trl_bfd']:.2f}"
        lines.append(f"| {r['label']} | {r['rate'] / 1e6:,.1f} | "
                     f"{r['rate_min'] / 1e6:,.1f}-{r['rate_max'] / 1e6:,.1f} | {ratio} | {r['median_s']:.3f} | "
                     f"{r['cpu_s']:.3f} | {r['sys_s']:.3f} | {r['minor_faults']:,.0f} | {r['first_rate'] / 1e6:,.1f} |")
    return "\n".join(lines)


def window_label(window: int) -> str:
    return "whole corpus" if window == 0 else f"{window:,} docs"


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=float, default=20e6, help="corpus size in tokens (default 20e6)")
    parser.add_argument("--context-length", type=int, default=2048, help="C, tokens per chunk (default 2048)")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds over all candidates (default 7)")
    parser.add_argument("--budget", type=float, default=0.5,
                        help="seconds of calls per candidate per round (1 to 20 calls; default 0.5)")
    parser.add_argument("--json", default="bench/results/best_fit.json", help="where to write every figure")
    parser.add_argument("--shards", type=int, default=16, help="corpus shards (default 16, as bench_peers)")
    parser.add_argument("--workdir", default=None, help="scratch directory for the corpus (default: a temporary one)")
    parser.add_argument("--no-trl", action="store_true", help="skip TRL even if it is installed")
    args = parser.parse_args(argv)
    if args.tokens < args.context_length or args.repeats < 1 or args.shards < 1 or args.context_length < 1:
        parser.error("need --tokens >= --context-length >= 1, --repeats >= 1 and --shards >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    c = args.context_length
    work = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="raypack-bestfit-"))
    os.makedirs(work, exist_ok=True)
    report: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable), os.path.relpath(__file__)] + sys.argv[1:]),
        "machine": peers.machine(), "versions": peers.versions(), "code": code_identity(),
        "load_before": peers.load_avg(),
        "corpus_generator": "bench/bench_peers.py make_corpus -> raypack.sample.write_sample_corpus (seed 0)",
    }
    trl_missing = "skipped (--no-trl)" if args.no_trl else trl_available()
    report["trl"] = "measured" if trl_missing is None else f"skipped: {trl_missing}"

    corpus_args = SimpleNamespace(context_length=c, tokens=args.tokens, shards=args.shards,
                                  corpus_dir=os.path.join(work, "corpus"))
    report["corpus"] = peers.make_corpus(corpus_args)
    documents = peers.load_documents(corpus_args.corpus_dir)
    tokens = documents.flatten().to_numpy()
    lengths = peers.doc_lengths(documents)
    num_docs, num_tokens = int(lengths.size), int(lengths.sum())
    print(f"# corpus: {report['corpus']}", flush=True)
    print(f"# load average before: {report['load_before']}", flush=True)

    # ------------------------------------------------------------------ quality
    quality: list[dict] = []
    problems: list[str] = []

    def add_row(key: str, label: str, found: dict, check: str) -> dict:
        rows = found["chunks"]
        row = {"key": key, "label": label, **{k: v for k, v in found.items() if k != "pairs"},
               "padding_pct": pct(found["padding"], rows * c), "split_pct": pct(found["split_docs"], num_docs),
               "check": check}
        quality.append(row)
        return row

    want = concat_stats(lengths, c)
    got = audit_chunks(pack_concat_stream(documents, c), tokens, lengths, c, best_fit=False)
    agree = all(want[k] == got[k] for k in want) and not got["problems"]
    if not agree:
        problems.append(f"concat: from lengths {want}, StreamPacker output "
                        f"{ {k: got[k] for k in want} } {'; '.join(got['problems'])}")
    add_row("concat", "concat (raypack default)", want,
            "= StreamPacker output" if agree else "DIFFERS from StreamPacker output: " + "; ".join(got["problems"]))

    stats_time = {}
    for window in WINDOWS:
        start = time.perf_counter()
        stats = best_fit_stats(lengths, c, window=window)
        stats_time[window] = time.perf_counter() - start
        from_stats = {"chunks": stats.num_chunks, "padding": stats.padding_positions,
                      "split_docs": stats.split_documents}
        packed = audit_chunks(pack_best_fit_stream(documents, c, window), tokens, lengths, c, best_fit=True)
        ref_docs, ref_chunks, ref_n = reference_bfd(lengths, c, window)
        out_docs, out_chunks = packed.pop("pairs")
        same_place = ref_n == packed["chunks"] and same_pairs(ref_docs, ref_chunks, out_docs, out_chunks)
        mismatch = [k for k in from_stats if from_stats[k] != packed[k]]
        notes = []
        if mismatch:
            notes.append("best_fit_stats vs output differ in " + ", ".join(
                f"{k} {from_stats[k]:,} != {packed[k]:,}" for k in mismatch))
        notes += packed["problems"]
        if ref_n != packed["chunks"]:
            notes.append(f"reference BFD gives {ref_n:,} chunks")
        elif not same_place:
            notes.append("item placement differs from the reference BFD")
        check = ("stats = output = reference BFD; docs rebuilt" if not notes else "MISMATCH: " + "; ".join(notes))
        if notes:
            problems.append(f"best_fit window={window}: " + "; ".join(notes))
        row = add_row(f"best_fit_w{window}", f"best_fit, window {window_label(window)}",
                      {**packed, "stats": from_stats, "reference_chunks": ref_n,
                       "placement_equals_reference": bool(same_place)},
                      check)
        row["best_fit_stats_s"] = stats_time[window]
        print(f"# quality best_fit window={window}: {check}", flush=True)

    trl_ds = None
    if trl_missing is None:
        from trl import pack_dataset

        trl_ds = peers.hf_dataset(documents)
        for strategy in ("bfd", "bfd_split"):
            found = audit_trl(pack_dataset(trl_ds, seq_length=c, strategy=strategy), tokens, lengths, c,
                              split=strategy == "bfd_split")
            found["chunks"] = found.pop("rows")
            notes = list(found["problems"])
            if found["tokens_dropped"] != found["expected_dropped"]:
                notes.append(f"dropped {found['tokens_dropped']:,} != expected {found['expected_dropped']:,}")
            if strategy == "bfd":
                check = f"truncates {found['truncated_docs']:,} docs > C; segments = truncated docs"
            else:
                check = "splits only docs > C into C-token pieces; segments = pieces"
                bf1000 = next(r for r in quality if r["key"] == "best_fit_w1000")
                same = bf1000["chunks"] == found["chunks"] and bf1000["padding"] == found["padding"]
                check += "; rows = best_fit window 1,000 chunks" if same else "; rows != best_fit window 1,000"
                if not same:
                    notes.append(f"TRL bfd_split rows {found['chunks']:,} != raypack best_fit window=1000 "
                                 f"chunks {bf1000['chunks']:,} (same items, same 1,000-document windows)")
            if notes:
                check = "MISMATCH: " + "; ".join(notes)
                problems.append(f"TRL {strategy}: " + "; ".join(notes))
            add_row(f"trl_{strategy}", f"TRL pack_dataset {strategy} (1,000-doc map batches)", found, check)

    # ------------------------------------------------------------------ throughput
    candidates: dict[str, Callable[[], Any]] = {}
    labels: dict[str, str] = {}
    for window in WINDOWS:
        key = f"best_fit_w{window}"
        candidates[key] = (lambda w=window: pack_best_fit_parts(documents, c, w))
        labels[key] = f"raypack BestFitPacker, window {window_label(window)}"
    candidates["concat_stream"] = lambda: peers.raypack_stream(documents, c)
    labels["concat_stream"] = "raypack StreamPacker (concat), reference"
    if trl_ds is not None:
        from trl import pack_dataset

        for strategy in ("bfd", "bfd_split"):
            candidates[f"trl_{strategy}"] = (lambda s=strategy: pack_dataset(trl_ds, seq_length=c, strategy=s))
            labels[f"trl_{strategy}"] = f"TRL pack_dataset {strategy}"
    print(f"# throughput: {len(candidates)} candidates, 1 warm-up + {args.repeats} rounds", flush=True)
    first, calls, loads = time_rounds(candidates, args.repeats, args.budget)
    speed = []
    for key in candidates:
        per_round = [statistics.median(c.wall_s for c in runs) for runs in calls[key]]
        every = [c for runs in calls[key] for c in runs]
        med = statistics.median(per_round)
        speed.append({"key": key, "label": labels[key], "round_median_s": per_round, "median_s": med,
                      "calls": [[c._asdict() for c in runs] for runs in calls[key]],
                      "rate": num_tokens / med, "rate_min": num_tokens / max(per_round),
                      "rate_max": num_tokens / min(per_round),
                      "sys_s": statistics.median(c.sys_s for c in every),
                      "cpu_s": statistics.median(c.user_s + c.sys_s for c in every),
                      "minor_faults": statistics.median(c.minor_faults for c in every),
                      "first_s": first[key].wall_s, "first_rate": num_tokens / first[key].wall_s,
                      "first_sys_s": first[key].sys_s})
    trl_bfd = next((r for r in speed if r["key"] == "trl_bfd"), None)
    for r in speed:
        r["x_trl_bfd"] = None if trl_bfd is None else r["rate"] / trl_bfd["rate"]

    # ------------------------------------------------------------------ goals
    bf_rows = [r for r in quality if r["key"].startswith("best_fit")]
    goals = {
        "split_le_C_zero": all(r["split_docs_le_C"] == 0 and r["stats"]["split_docs"] == r["split_docs"]
                               and r["docs_le_C_in_one_segment"] for r in bf_rows),
        "padding_le_2pct": {r["key"]: r["padding_pct"] <= GOAL_PADDING_PCT for r in bf_rows},
        "throughput_ge_trl_bfd": None if trl_bfd is None else {
            r["key"]: r["rate"] >= trl_bfd["rate"] for r in speed if r["key"].startswith("best_fit")},
        "checks_passed": not problems,
    }
    report.update(quality=quality, throughput=speed, goals=goals, problems=problems,
                  load_after_each_round=loads, load_after=peers.load_avg(),
                  best_fit_stats_s={str(k): v for k, v in stats_time.items()},
                  settings={"batch_docs": BATCH_DOCS, "pad_token": PAD_TOKEN, "repeats": args.repeats,
                            "budget_s": args.budget,
                            "trl_map_batch": HF_MAP_BATCH},
                  wall_s=round(time.perf_counter() - started, 1))

    corpus = report["corpus"]
    print()
    print(f"corpus: {corpus['docs']:,} documents, {corpus['tokens']:,} tokens, C = {c}, mean length "
          f"{corpus['mean_doc_len']} (median {corpus['median_doc_len']}, max {corpus['max_doc_len']:,}); "
          f"{corpus['docs_longer_than_C']:,} documents longer than C "
          f"({pct(corpus['docs_longer_than_C'], num_docs):.2f}%) "
          f"hold {corpus['tokens_beyond_C']:,} tokens beyond their first C")
    print()
    print("Quality (exact)")
    print(quality_table(quality))
    print()
    print(f"Throughput (in memory, {num_tokens / 1e6:.1f}M tokens; per round the median of the calls within "
          f"{args.budget:g} s, then the median of {args.repeats} interleaved rounds)")
    print(speed_table(speed))
    if trl_missing is not None:
        print(f"\nTRL rows skipped: {trl_missing} (run with /work/benchvenv/bin/python, which has trl and datasets)")
    print("\nbest_fit_stats from lengths alone: "
          + ", ".join(f"window {window_label(w)} {s * 1e3:.0f} ms" for w, s in stats_time.items()))
    print(f"load average: before {report['load_before']}; after each round {loads}")
    print("\nGoals")
    print(f"  split documents of length <= C = 0 (every best_fit window, stats and output): "
          f"{'MET' if goals['split_le_C_zero'] else 'NOT MET'}")
    print("  padding <= 2%: " + ", ".join(f"{r['label'].split(', ')[1]} {r['padding_pct']:.3f}% "
                                          f"{'MET' if r['padding_pct'] <= GOAL_PADDING_PCT else 'NOT MET'}"
                                          for r in bf_rows))
    if trl_bfd is None:
        print("  throughput >= TRL bfd: not measured (TRL missing)")
    else:
        print(f"  throughput >= TRL bfd ({trl_bfd['rate'] / 1e6:.1f}M tokens/s): " + ", ".join(
            f"{r['label'].split(', ')[1]} {r['rate'] / 1e6:.1f}M = {r['x_trl_bfd']:.2f}x "
            f"{'MET' if r['rate'] >= trl_bfd['rate'] else 'NOT MET'}"
            for r in speed if r["key"].startswith("best_fit")))
    print(f"  every check passed: {'yes' if not problems else 'NO'}")
    for p in problems:
        print(f"    PROBLEM {p}")
    print(f"\nwhole run: {report['wall_s']:.0f}s")

    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=_json_default)
        print(f"wrote {args.json}")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if problems else 0


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


if __name__ == "__main__":
    sys.exit(main())
