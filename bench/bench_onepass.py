"""Marginal tokens/s of ``raypack pack --tokenizer`` (local and Ray) against one process calling the
fast backend's batch encode on all cores with the texts in memory.

    PYTHONPATH=. .venv/bin/python bench/bench_onepass.py [--mb 31] [--copies 3] [--tiny-mb 1]
        [--vocab 16000] [--workers 2] [--shards 16] [--engines local,ray] [--repeats 2]
        [--repo DIR ...] [--backend gigatoken] [--batch-mib 0] [--corpus installed|stdlib] [--doc-chars 0]
        [--format parquet|jsonl|jsonl.zst]
        [--rss | --budget | --timeline | --paths]

Text (``--corpus``): ``installed`` (default), every distinct source, header, doc and licence file of
the standard library and the installed packages once (bench_tokenize.installed_texts: ~42,000
documents, 386 MB, ~119M tokens in this repository's venv; no repeated text to flatter a cache), or
``stdlib``, the standard library's .py files up to ``--mb`` MB repeated ``--copies`` times; as
``--shards`` Parquet shards (column ``text``). A tiny run takes the stdlib's first ``--tiny-mb`` MB
(2 shards). ``--doc-chars N`` cuts every text into documents of at most N characters (a corpus of
short documents: chat turns, snippets). Tokenizer: a byte-level BPE of ``--vocab`` ids trained here
on 8 MB of the stdlib.

  floor: ``encode_flat`` of the backend (gigatoken: ``Tokenizer.encode_batch`` over awkward
         strings, ids taken zero-copy) in this process, all cores, over all texts at once;
  paired: the floor again in the job's subprocess, with a freshly loaded tokenizer, just before each
         round (big run, tiny run): the round's ratio to it, so that drift in the machine's speed
         between the floor and the job (this machine is shared) cancels;
  job:   ``run_pack(..., text=TextOptions(...))`` (what ``pack --tokenizer`` runs) in a subprocess
         with PYTHONPATH=REPO (each ``--repo``: e.g. this branch and a checkout of the base) and
         Arrow's pool set as the command sets it (raypack.io.allocator, where REPO has it), Ray
         started once before the clock, then ``--repeats`` x (big run, tiny run); marginal rate =
         (tokens big - tokens tiny) / (seconds big - seconds tiny), so fixed costs (actor start,
         tokenizer load) cancel out.

floor in pieces: the same encode over the job's own pieces (its read batches, cut at the backend's
         ``batch_bytes``), one call after another, a freshly loaded tokenizer each round. The one-call
         floor runs at two speeds on this VM (BENCHMARKS.md, "stop 67": 1.6-1.7 or 2.3-3.0 CPU-s for the same
         call, by whether its hundreds of MB of output and work space land in memory the allocator
         recycled); in pieces it is steady. Printed beside it: the fastest warm one-call floor.

A process's first encode is slow (gigatoken's first call in a process: its pool and allocator
warming, about 2.5x the later calls on unseen text), so the first floor call and the jobs' first
round are printed but the medians are over the later ones ("warm"; use ``--repeats 3`` or more).
Prints the load average (the machine is shared).

``--rss``: instead, the whole-process peak RSS (GNU ``/usr/bin/time -f %M``) of ``raypack pack --tokenizer
--local`` on shard 0 and on its rows repeated 2, 10 and 20 times (one row group per copy, so a
task per copy), repeated 10 times in one row group (one task of 10x the text, whose ids past
``task_bytes / 4`` spill), and "10books": 10x shard 0's bytes of distinct text (shard 0's and the
next shards') joined into ~1 MB documents, in one row group written with pyarrow's defaults (a
book corpus: one task of long texts, all in one dictionary page), and "10bookpages": the same file
written in pages of at most 16 texts (``write_batch_size=16``, ``use_dictionary=False``), a fresh
process per run, ``--repeats`` runs each: the issue's "worker peak RSS when a task's text grows
10x" (goal <= 1.2x).

``--budget``: instead, where a ``--local`` one pass's CPU goes, in one process, ``--repeats``
alternating rounds of four stages over the same shards: ``read`` (the Parquet text reader alone,
every task), ``encode`` (the backend's ``encode_flat`` over the texts in memory, in the job's
pieces of ``batch_bytes``: its tokenizer warm), ``tokenize`` (``tokenize_in_memory``, every task:
read, check, encode, the reference guard, list arrays; nothing packed) and ``job`` (``run_pack``
``--local``). Each: wall seconds, this process's CPU-seconds (all threads), cores used
(CPU-s / wall) and the machine's idle share over it (/proc/stat).

``--timeline``: instead, in one process, ``--repeats`` warm ``--local`` one passes with gigatoken's
``encode_flat`` timed: how long some call was running, two at once, and none between the first and the
last (the gaps, as at the tasks' edges: BENCHMARKS.md, "stop 64"), and the busiest threads' CPU-seconds
(``/proc/self/task``, sampled every 20 ms).

``--paths``: instead, gigatoken's two ways to run a call, over the texts in memory in the job's
pieces (its Parquet read batches, cut at the backend's ``batch_bytes``): on its Rayon pool
(``parallel=True``; the pool's size is RAYON_NUM_THREADS, else the CPUs: run with
``RAYON_NUM_THREADS=1`` for what a Ray actor given one CPU has) and on the calling thread
(``parallel=False``, which holds the GIL), each with a fresh tokenizer (cold: what a job has) and
again with it (warm), ``--repeats`` alternating rounds: wall and this process's CPU-seconds.
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

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tokenize import installed_texts, stdlib_texts, train_bpe  # noqa: E402

from raypack.tokenize.backends import load_backed_tokenizer  # noqa: E402


def write_shards(texts: list[str], root: Path, num_shards: int, file_format: str = "parquet") -> Path:
    """``texts`` in ``num_shards`` files of ``file_format``: Parquet (pyarrow's defaults), JSON Lines
    (``{"text": ...}`` a line, as ``json.dumps`` writes it) or JSON Lines compressed with zstd."""
    root.mkdir(parents=True, exist_ok=True)
    per = -(-len(texts) // num_shards)
    for k in range(num_shards):
        part = texts[k * per:(k + 1) * per]
        if file_format == "parquet":
            pq.write_table(pa.table({"text": pa.array(part, pa.string())}), root / f"text-{k:03d}.parquet")
            continue
        data = "".join(json.dumps({"text": text}) + "\n" for text in part).encode("utf-8")
        if file_format == "jsonl":
            (root / f"text-{k:03d}.jsonl").write_bytes(data)
        else:
            with pa.CompressedOutputStream(str(root / f"text-{k:03d}.jsonl.zst"), "zstd") as sink:
                sink.write(data)
    return root


def floor(texts: list[str], tokenizer_path: Path, backend: str) -> tuple[int, float]:
    encoder = load_backed_tokenizer(str(tokenizer_path), backend).encoder
    array = pa.array(texts, pa.large_string())
    start = time.perf_counter()
    flat = encoder.encode_flat(array)
    return int(flat.offsets[-1]), time.perf_counter() - start


def floor_pieces(big: Path, tokenizer_path: Path, backend: str) -> list[pa.Array]:
    """The job's pieces of the texts under ``big`` (its read batches cut at the backend's ``batch_bytes``)."""
    from raypack.tokenize.job import TextOptions

    tokenizer = load_backed_tokenizer(str(tokenizer_path), backend)
    return job_pieces(big, TextOptions(tokenizer=str(tokenizer_path), tokenizer_backend=backend),
                      tokenizer.batch_bytes)


def floor_in_pieces(pieces: list[pa.Array], tokenizer_path: Path, backend: str) -> tuple[int, float, float]:
    """The floor over the job's pieces, one call each, in order, with a freshly loaded tokenizer (a cold
    cache, as a job's): tokens, wall seconds, this process's CPU-seconds."""
    encoder = load_backed_tokenizer(str(tokenizer_path), backend).encoder
    cpu, start = time.process_time(), time.perf_counter()
    tokens = sum(int(encoder.encode_flat(piece).offsets[-1]) for piece in pieces)
    return tokens, time.perf_counter() - start, time.process_time() - cpu


_JOB_SCRIPT = r"""
import json, os, shutil, sys, time
try:  # what the raypack command sets before pyarrow loads (Arrow's pool hands freed pages back)
    from raypack.io.allocator import purge_freed_pages
    purge_freed_pages()
except ImportError:  # a --repo from before it
    pass
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.tokenize.job import TextOptions
engine, big, tiny, tok, out, workers, rounds, backend, batch_bytes = sys.argv[1:10]
if engine == "ray":
    from raypack.engine import pipeline
    pipeline.init_ray(None)  # before the clock
import glob
import pyarrow as pa, pyarrow.parquet as pq
from raypack.tokenize.backends import load_backed_tokenizer
import pyarrow.json as pajson
def texts_of(p):  # the shards' texts, for the floor: Parquet, JSON Lines, or zstd JSON Lines
    if p.endswith(".parquet"):
        return pq.read_table(p, columns=["text"]).column(0)
    return pajson.read_json(pa.input_stream(p, compression="detect"),
                            read_options=pajson.ReadOptions(block_size=64 << 20)).column("text")
texts = pa.concat_arrays([texts_of(p).combine_chunks().cast(pa.large_string())
                          for p in sorted(glob.glob(big + "/*")) if p.endswith((".parquet", ".jsonl", ".zst"))])
text = TextOptions(tokenizer=tok, tokenizer_backend=backend, batch_bytes=int(batch_bytes) or None)
for _ in range(int(rounds)):
    row = {}
    encoder = load_backed_tokenizer(tok, backend).encoder  # a fresh instance: its cache has seen no text
    start = time.perf_counter()
    flat = encoder.encode_flat(texts)
    row["floor"] = (int(flat.offsets[-1]), time.perf_counter() - start)
    del flat, encoder
    for name, path in (("big", big), ("tiny", tiny)):
        config = make_config(dict(inputs=[path], output=out, context_length=2048, num_workers=int(workers),
                                  overwrite=True))
        if os.path.exists(out):
            shutil.rmtree(out)  # a fresh output, not the other run's deleted on the clock
        start = time.perf_counter()
        summary = run_pack(config, engine=engine, text=text)
        row[name] = (summary.manifest["counts"]["tokens"], time.perf_counter() - start)
    print(json.dumps(row), flush=True)
"""


def job_rounds(repo: str, big: Path, tiny: Path, tokenizer_path: Path, out: Path, engine: str, workers: int,
               backend: str, rounds: int, batch_bytes: int) -> list[dict]:
    """``rounds`` x (big run, tiny run) of ``run_pack(text=...)`` in one subprocess with PYTHONPATH=repo
    (Ray started once, before the clock)."""
    env = {**os.environ, "PYTHONPATH": repo, "RAYPACK_NO_PROGRESS": "1"}
    args = [engine, str(big), str(tiny), str(tokenizer_path), str(out), str(workers), str(rounds), backend,
            str(batch_bytes)]
    done = subprocess.run([sys.executable, "-c", _JOB_SCRIPT, *args], capture_output=True, text=True, env=env,
                          cwd=str(out.parent))
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def peak_rss(shard: Path, root: Path, tokenizer_path: Path, backend: str, repo: str, repeats: int,
             token_dtype: str = "auto") -> None:
    """Whole-process peak RSS of ``raypack pack --tokenizer --local`` (a fresh process per run) on
    ``shard`` and on its rows repeated 2, 10 and 20 times (one row group per copy), and the ratios."""
    table = pq.read_table(shard, columns=["text"])
    peaks: dict[int | str, list[int]] = {}
    cases = (1, 10, 2, 20, "10one", "10books", "10bookpages")
    for copies in cases:
        folder = root / f"rss-x{copies}"
        if not folder.exists():  # written once, for every --repo
            folder.mkdir()
            if copies in ("10books", "10bookpages"):  # distinct text: shard 0's and the next shards', 10x its bytes
                # 10books: pyarrow's defaults (its first 1,024 texts, here all, in one dictionary page);
                # 10bookpages: pages of at most 16 texts, as the run's note on such a file advises
                small_pages = {"write_batch_size": 16, "use_dictionary": False} if copies == "10bookpages" else {}
                pq.write_table(books(distinct_texts(shard, 10 * table.column("text").nbytes)),
                               folder / "shard.parquet", **small_pages)
                continue
            n = 10 if copies == "10one" else copies
            pq.write_table(pa.concat_tables([table] * n), folder / "shard.parquet",
                           row_group_size=table.num_rows * (n if copies == "10one" else 1))
    env = {**os.environ, "PYTHONPATH": repo, "RAYPACK_NO_PROGRESS": "1"}
    for _ in range(repeats):
        for copies in cases:
            # GNU time's %M: the child's own peak (a child forked from this process would start with its RSS)
            command = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "raypack.cli", "pack", "--input",
                       str(root / f"rss-x{copies}"), "--output", str(root / "rss-out"), "--overwrite", "--local",
                       "--context-length", "2048", "--tokenizer", str(tokenizer_path), "--tokenizer-backend", backend,
                       "--token-dtype", token_dtype]
            done = subprocess.run(command, env=env, cwd=str(root), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, check=True)
            peaks.setdefault(copies, []).append(int(done.stderr.split()[-1]) // 1024)
    print(f"peak RSS, MiB, runs of shard {shard.name} ({table.num_rows} documents) "
          f"x1/x10/x2/x20/x10one/x10books/x10bookpages: {peaks}")
    high = {k: max(v) for k, v in peaks.items()}
    print(f"  the largest of each: {high}; x10/x1 {high[10] / high[1]:.2f}, x20/x2 {high[20] / high[2]:.2f} "
          f"(goal <= 1.2); x10 in one row group (one task of 10x the text)/x1 {high['10one'] / high[1]:.2f}; "
          f"x10 as ~1 MB documents in one row group/x1 {high['10books'] / high[1]:.2f}, the same in pages of 16 "
          f"documents/x1 {high['10bookpages'] / high[1]:.2f}")


def job_pieces(big: Path, options, batch_bytes: int) -> list[pa.Array]:
    """The texts of every task under ``big`` in the job's pieces: its read batches (the format's
    ``iter_texts``), cut at ``batch_bytes`` by the job's own cutter (raypack.tokenize.tasks)."""
    from raypack.inputs.registry import format_named
    from raypack.tokenize.job import plan_text_tasks
    from raypack.tokenize.pieces import _byte_pieces

    return [piece for task in plan_text_tasks((str(big),), options)
            for _, texts in format_named(task.format).iter_texts(task.path, "text", task.start, task.end,
                                                                 options.batch_rows)
            for piece in _byte_pieces(texts, batch_bytes)]


def cpu_budget(big: Path, tokenizer_path: Path, backend: str, out: Path, workers: int, rounds: int) -> None:
    """Wall, CPU-s and idle share of the one pass's stages, in this process (see ``--budget``)."""
    import resource

    from raypack.inputs.registry import format_named
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack
    from raypack.tokenize.job import TextOptions, plan_text_tasks
    from raypack.tokenize.tasks import TokenizeSettings, tokenize_in_memory
    from raypack.tokenize.tokenizers import token_dtype_for

    options = TextOptions(tokenizer=str(tokenizer_path), tokenizer_backend=backend)
    tasks = plan_text_tasks((str(big),), options)
    tokenizer = load_backed_tokenizer(str(tokenizer_path), backend)
    dtype = token_dtype_for(tokenizer.vocab_size).name
    settings = TokenizeSettings(str(out), str(tokenizer_path), "", "text", dtype, batch_rows=options.batch_rows,
                                batch_bytes=tokenizer.batch_bytes, tokenizer_backend=tokenizer.backend)

    def texts_of(task):
        return format_named(task.format).iter_texts(task.path, "text", task.start, task.end, settings.batch_rows)

    pieces = job_pieces(big, options, settings.batch_bytes)

    def job() -> int:
        config = make_config(dict(inputs=[str(big)], output=str(out), context_length=2048, num_workers=workers,
                                  overwrite=True))
        return run_pack(config, engine="local", text=options).manifest.counts.tokens

    stages = {
        "read": lambda: sum(len(texts) for task in tasks for _, texts in texts_of(task)),
        "encode": lambda: sum(int(tokenizer.encode_flat(piece).offsets[-1]) for piece in pieces),
        "tokenize": lambda: sum(len(ids.values) for task in tasks for ids in tokenize_in_memory(task, settings,
                                                                                                  tokenizer)),
        "job": job,
    }

    def machine() -> tuple[int, int]:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)  # idle + iowait, all

    rows: dict[str, list[tuple[float, float, float]]] = {}
    for k in range(rounds + 1):  # round 0 warms every stage up and is not counted
        for name, stage in stages.items():
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu0, (idle0, all0), start = usage.ru_utime + usage.ru_stime, machine(), time.perf_counter()
            count = stage()
            wall = time.perf_counter() - start
            usage = resource.getrusage(resource.RUSAGE_SELF)
            cpu, (idle, total) = usage.ru_utime + usage.ru_stime - cpu0, machine()
            idle_share = (idle - idle0) / max(1, total - all0)
            if k:
                rows.setdefault(name, []).append((wall, cpu, idle_share))
            print(f"  round {k} {name:8s} {count:>13,} {'texts' if name == 'read' else 'tokens'} {wall:5.2f}s "
                  f"{cpu:5.2f} CPU-s ({cpu / wall:.2f} cores), machine idle {100 * idle_share:.0f}%", flush=True)
    for name, values in rows.items():
        wall, cpu, idle = (statistics.median(v[i] for v in values) for i in range(3))
        print(f"median {name:8s} {wall:.2f}s wall, {cpu:.2f} CPU-s, {cpu / wall:.2f} cores, machine idle "
              f"{100 * idle:.0f}%")


def encode_paths(big: Path, tokenizer_path: Path, rounds: int) -> None:
    """gigatoken on its pool and on the calling thread, cold and warm (see ``--paths``)."""
    import resource

    from raypack.tokenize.backends.gigatoken import _awkward_strings, pool_threads
    from raypack.tokenize.job import TextOptions

    spec = str(tokenizer_path)
    batch_bytes = load_backed_tokenizer(spec, "gigatoken").batch_bytes
    options = TextOptions(tokenizer=spec, tokenizer_backend="gigatoken")
    pieces = [_awkward_strings(piece) for piece in job_pieces(big, options, batch_bytes)]

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def encode(tokenizer, parallel: bool) -> tuple[int, float, float]:
        cpu0, start = cpu(), time.perf_counter()
        tokens = sum(len(tokenizer.encode_batch(p, parallel=parallel).layout.content) for p in pieces)
        return tokens, time.perf_counter() - start, cpu() - cpu0

    print(f"{len(pieces)} pieces (the job's: read batches cut at {batch_bytes >> 20} MiB); the pool has "
          f"{pool_threads()} threads")
    rows: dict[str, list[tuple[float, float]]] = {}
    for k in range(rounds + 1):  # round 0 warms the process up and is not counted
        for parallel in (True, False) if k % 2 else (False, True):
            tokenizer = load_backed_tokenizer(spec, "gigatoken").encoder.tokenizer
            for state in ("cold", "warm"):
                tokens, wall, cpu_s = encode(tokenizer, parallel)
                name = f"{'pool' if parallel else 'calling thread'}, {state}"
                if k:
                    rows.setdefault(name, []).append((wall, cpu_s))
                print(f"  round {k} {name:20s} {tokens:,} tokens {wall:5.2f}s {cpu_s:5.2f} CPU-s "
                      f"({tokens / wall / 1e6:.0f}M tok/s)", flush=True)
    for name, values in sorted(rows.items()):
        wall, cpu_s = (statistics.median(v[i] for v in values) for i in range(2))
        print(f"median {name:20s} {wall:.2f}s wall, {cpu_s:.2f} CPU-s")


def encode_timeline(big: Path, tokenizer_path: Path, out: Path, workers: int, rounds: int) -> None:
    """When gigatoken's calls run during a ``--local`` one pass, and the threads' CPU (see ``--timeline``)."""
    import threading

    import raypack.tokenize.backends.gigatoken as gigatoken
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack
    from raypack.tokenize.job import TextOptions

    calls: list[tuple[float, float]] = []
    real = gigatoken.GigatokenEncoder.encode_flat

    def timed(self, texts):
        start = time.perf_counter()
        flat = real(self, texts)
        calls.append((start, time.perf_counter()))
        return flat

    gigatoken.GigatokenEncoder.encode_flat = timed
    options = TextOptions(tokenizer=str(tokenizer_path), tokenizer_backend="gigatoken")

    def job() -> None:
        run_pack(make_config(dict(inputs=[str(big)], output=str(out), context_length=2048, num_workers=workers,
                                  overwrite=True)), engine="local", text=options)

    def thread_cpu() -> dict[str, float]:  # each live thread's CPU-seconds, by thread id
        seen = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            seen[tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return seen

    job()  # warm: the tokenizer's pool, the allocator
    for k in range(rounds):
        calls.clear()
        last: dict[str, float] = {}
        base, done = thread_cpu(), threading.Event()

        def sample() -> None:
            while not done.wait(0.02):
                last.update(thread_cpu())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu0, start = time.process_time(), time.perf_counter()
        job()
        wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
        done.set()
        sampler.join()
        points = sorted([(a, 1) for a, _ in calls] + [(b, -1) for _, b in calls])
        running = {1: 0.0, 2: 0.0}
        gaps, level, previous = [], 0, points[0][0]
        for t, step in points:
            for n in running:
                running[n] += (t - previous) if level >= n else 0.0
            if level == 0 and t > previous and previous > points[0][0]:
                gaps.append(t - previous)
            level, previous = level + step, t
        main = str(os.getpid())
        threads = sorted(((cpu - base.get(tid, 0.0), "main" if tid == main else "") for tid, cpu in last.items()),
                         reverse=True)
        busiest = ", ".join(f"{c:.2f}{' (main)' if name else ''}" for c, name in threads[:6] if c >= 0.05)
        print(f"round {k}: {wall:.2f}s, {cpu_s:.2f} CPU-s ({cpu_s / wall:.2f} cores); {len(calls)} calls: some call "
              f"running {running[1]:.2f}s, two {running[2]:.2f}s; none running between them {sum(gaps):.2f}s in "
              f"{sum(g >= 0.005 for g in gaps)} gaps of >= 5 ms (longest {max(gaps, default=0) * 1e3:.0f} ms); "
              f"before the first {points[0][0] - start:.2f}s, after the last {start + wall - points[-1][0]:.2f}s; "
              f"busiest threads' CPU-s {busiest}", flush=True)


def distinct_texts(shard: Path, num_bytes: int) -> list[str]:
    """The texts of ``shard`` and the shards after it, in order, until ``num_bytes`` of them."""
    texts, total = [], 0
    for path in sorted(shard.parent.glob("*.parquet")):
        if path.name < shard.name:
            continue
        for text in pq.read_table(path, columns=["text"]).column("text").to_pylist():
            texts.append(text)
            total += len(text.encode())
            if total >= num_bytes:
                return texts
    return texts


def books(texts: list[str], size: int = 1 << 20) -> pa.Table:
    """``texts`` joined, in order, into documents of about ``size`` characters (a book corpus)."""
    docs, current, length = [], [], 0
    for text in texts:
        current.append(text)
        length += len(text)
        if length >= size:
            docs.append("".join(current))
            current, length = [], 0
    if current:
        docs.append("".join(current))
    return pa.table({"text": docs})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=31)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--tiny-mb", type=float, default=1)
    parser.add_argument("--vocab", type=int, default=16000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--engines", default="local,ray")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--repo", action="append", help="PYTHONPATH of a raypack checkout (default: cwd)")
    parser.add_argument("--backend", default="gigatoken")
    parser.add_argument("--batch-mib", type=float, default=0,
                        help="TextOptions.batch_bytes in MiB (default 0: the backend's)")
    parser.add_argument("--token-dtype", default="auto",
                        help="--rss: the runs' --token-dtype (int64: 8-byte ids, so a task's ids weigh more)")
    parser.add_argument("--rss", action="store_true",
                        help="only the peak RSS of --local runs on shard 0 and on it repeated 2, 10, 20 times")
    parser.add_argument("--budget", action="store_true",
                        help="only where a --local one pass's CPU goes: read, encode, tokenize, job (one process)")
    parser.add_argument("--timeline", action="store_true",
                        help="only when gigatoken's calls run in a --local one pass, and the threads' CPU")
    parser.add_argument("--paths", action="store_true",
                        help="only gigatoken's two ways to run a call (pool, calling thread), cold and warm")
    parser.add_argument("--doc-chars", type=int, default=0,
                        help="cut every text into documents of at most this many characters (0: as they are), "
                             "e.g. 400 for a corpus of short documents")
    parser.add_argument("--format", choices=("parquet", "jsonl", "jsonl.zst"), default="parquet",
                        help="the shards' format (--rss and --budget read Parquet whatever this says)")
    parser.add_argument("--corpus", choices=("installed", "stdlib"), default="installed",
                        help="installed: every distinct source/doc/licence file of the stdlib and the installed "
                             "packages, once (~100M tokens, no repeats); stdlib: its .py files, --copies times")
    args = parser.parse_args()
    repos = args.repo or [os.getcwd()]
    print(f"load average before: {os.getloadavg()}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = installed_texts() if args.corpus == "installed" else stdlib_texts(int(args.mb * 1e6))
        tokenizer_path = root / "tokenizer.json"
        train_bpe(stdlib_texts(int(min(args.mb, 8) * 1e6)), args.vocab, tokenizer_path)
        tiny = stdlib_texts(int(args.tiny_mb * 1e6))
        texts = texts * (args.copies if args.corpus == "stdlib" else 1)
        if args.doc_chars:
            texts = [t[i:i + args.doc_chars] for t in texts for i in range(0, len(t), args.doc_chars)]
        print(f"{len(texts)} docs, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB; tiny {len(tiny)} docs")
        file_format = "parquet" if args.rss or args.budget or args.paths or args.timeline else args.format
        big_dir = write_shards(texts, root / "big", args.shards, file_format)
        tiny_dir = write_shards(tiny, root / "tiny", 2, file_format)
        if args.paths:
            encode_paths(big_dir, tokenizer_path, args.repeats)
            return
        if args.timeline:
            encode_timeline(big_dir, tokenizer_path, root / "out", args.workers, args.repeats)
            return
        if args.budget:
            cpu_budget(big_dir, tokenizer_path, args.backend, root / "out", args.workers, args.repeats)
            return
        if args.rss:
            for repo in repos:
                peak_rss(big_dir / "text-000.parquet", root, tokenizer_path, args.backend, repo, args.repeats,
                         args.token_dtype)
            return
        figures: dict[str, list[float]] = {"floor": []}
        ratios: dict[str, list[float]] = {}
        pieces = floor_pieces(big_dir, tokenizer_path, args.backend)
        in_pieces: list[tuple[float, float]] = []
        for _ in range(args.repeats):
            tokens, seconds = floor(texts, tokenizer_path, args.backend)
            figures["floor"].append(tokens / seconds)
            print(f"floor {args.backend} encode_flat: {tokens:,} tokens {seconds:.2f}s "
                  f"{tokens / seconds / 1e6:.2f}M/s  load {os.getloadavg()[0]:.2f}", flush=True)
            tokens, seconds, cpu = floor_in_pieces(pieces, tokenizer_path, args.backend)
            in_pieces.append((tokens / seconds, cpu))
            print(f"floor {args.backend} encode_flat in the job's {len(pieces)} pieces: {tokens:,} tokens "
                  f"{seconds:.2f}s {tokens / seconds / 1e6:.2f}M/s, {cpu:.2f} CPU-s", flush=True)
        for repo in repos:
            for engine in args.engines.split(","):
                for row in job_rounds(repo, big_dir, tiny_dir, tokenizer_path, root / "out", engine, args.workers,
                                      args.backend, args.repeats, int(args.batch_mib * 2**20)):
                    (tb, sb), (tt, st), (tf, sf) = row["big"], row["tiny"], row["floor"]
                    marginal = (tb - tt) / (sb - st)
                    figures.setdefault(f"{repo} {engine}", []).append(marginal)
                    ratios.setdefault(f"{repo} {engine}", []).append(marginal / (tf / sf))
                    print(f"  {repo} {engine}: big {tb:,} tokens {sb:.2f}s, tiny {tt:,} {st:.2f}s -> marginal "
                          f"{marginal / 1e6:.2f}M tokens/s, whole big run {tb / sb / 1e6:.2f}M tokens/s; this "
                          f"round's floor {tf / sf / 1e6:.2f}M -> {marginal / (tf / sf):.2f}x  "
                          f"load {os.getloadavg()[0]:.2f}", flush=True)
        floors = figures.pop("floor")
        print(f"floor, first call in this process (cold): {floors[0] / 1e6:.2f}M tokens/s")
        base = statistics.median(floors[1:] or floors)
        print(f"median floor (warm) {base / 1e6:.2f}M tokens/s")
        fastest = max(floors[1:] or floors)
        print(f"fastest floor (warm) {fastest / 1e6:.2f}M tokens/s")
        piece_base = statistics.median(rate for rate, _ in in_pieces)
        print(f"median floor in the job's pieces {piece_base / 1e6:.2f}M tokens/s "
              f"({min(r for r, _ in in_pieces) / 1e6:.2f}-{max(r for r, _ in in_pieces) / 1e6:.2f}M), "
              f"{statistics.median(c for _, c in in_pieces):.2f} CPU-s")
        for name, values in figures.items():
            value = statistics.median(values[1:] or values)
            print(f"median {name} (warm rounds): {value / 1e6:.2f}M tokens/s = {value / base:.2f}x floor, "
                  f"{value / fastest:.2f}x the fastest floor, {value / piece_base:.2f}x the floor "
                  f"in pieces; first round {values[0] / 1e6:.2f}M = {values[0] / floors[0]:.2f}x the cold floor")
            paired = ratios[name][1:] or ratios[name]
            print(f"  paired with the floor run just before it in the same process (warm rounds): median "
                  f"{statistics.median(paired):.2f}x, min {min(paired):.2f}, max {max(paired):.2f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
