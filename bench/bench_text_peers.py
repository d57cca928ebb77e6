"""Peers of ``raypack pack --tokenizer``, end to end on the same text Parquet shards (column ``text``)
with the same byte-level BPE ``tokenizer.json``: seconds, tokens, M tokens/s and the load average.

    python bench/bench_text_peers.py --setup [--megatron-git-dir DIR]     # once: the three venvs
    python bench/bench_text_peers.py --text-dir TEXT_DIR --tokenizer TOKENIZER_JSON \\
        [--workers 2] [--peers datatrove,hf,megatron] [--repeats 1] [--json OUT.json] [--work DIR] [--keep]

The driver needs only the standard library (any Python 3.11; e.g. .venv/bin/python). Each peer runs
in its own subprocess with its own venv's python, ``TOKENIZERS_PARALLELISM=false`` (one tokenizer
thread per process), in a fresh process whose clock starts after its imports and stops when its
output is on disk (the token count is taken after the clock). The load average (1, 5, 15 min) is
read in that process just before the clock starts and just after it stops. With ``--repeats N``
the peers run in interleaved rounds (datatrove, hf, megatron, datatrove, ...).

Peers:

  1. datatrove: ``LocalPipelineExecutor([ParquetReader(text_dir, glob_pattern="*.parquet"),
     DocumentTokenizer(out, tokenizer_name_or_path=tokenizer.json, shuffle_documents=False)],
     tasks=--dt-tasks (default = --workers; 0 = one per shard, what bench_text_datatrove.py did),
     workers=--workers)``, no EOS (DocumentTokenizer's eos_token=None default). Output: one
     ``NNNNN_<name>.ds`` file of concatenated token ids per task (+ ``.ds.index`` document ends and
     ``.ds.metadata``); not packed windows (datatrove's reader cuts windows at load time).
     Tokens = sum of ``.ds`` bytes / token size (2: uint16 for vocabularies up to 65,536 ids).
  2. hf (the Hugging Face run_clm.py recipe): ``datasets.load_dataset("parquet", data_files=shards,
     split="train", cache_dir=tmp)``, ``.map(tokenize, batched=True, num_proc=workers,
     remove_columns=["text"])`` where tokenize is ``tokenizers.Tokenizer.from_file(tokenizer.json)
     .encode_batch_fast(texts, add_special_tokens=False)`` (loaded once per process), then
     run_clm.py's ``group_texts`` into blocks of ``--block`` (2048) with ``map(batched=True,
     num_proc=workers)`` (each 1,000-document batch's tail under one block is dropped), then
     ``save_to_disk(out, num_proc=workers)``. Output: an Arrow dataset of ``input_ids`` windows.
     Tokens = the tokenizer's count (sum of the tokenized dataset's list lengths, before grouping);
     windows and window tokens (windows x block) are printed too. The Arrow cache (tmp) is inside
     the timed part, as it is in the recipe.
  3. megatron: Megatron-LM's ``tools/preprocess_data.py`` (``main()`` called in-process after its
     imports, with ``--input corpus.jsonl --output-prefix OUT/corpus --tokenizer-type
     HuggingFaceTokenizer --tokenizer-model TOKDIR --workers W --append-eod``; one partition).
     Not timed: the Parquet -> JSONL conversion (one JSON line ``{"text": ...}`` per document, all
     shards into one file, in its own process before the peer's), and writing TOKDIR: a copy of
     tokenizer.json plus a minimal ``tokenizer_config.json`` (``{"tokenizer_class":
     "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}``) so ``AutoTokenizer`` loads it and
     ``--append-eod`` has an EOD id: the token is added after the vocabulary (id = vocab size, e.g.
     16,000), the other ids are the same as the peers'. Output: ``corpus_text_document.bin``
     (token ids, uint16 while the vocabulary is under 65,500 ids) + ``.idx``. Tokens = ``.bin``
     bytes / dtype size, which includes one EOD per non-empty document: the JSON gives
     ``tokens`` (with EOD, what was written) and ``tokens_no_eod`` (= tokens - documents, the count
     comparable to the other peers); M tokens/s uses ``tokens_no_eod``.
     Compatibility shim, not a change to Megatron's code: Megatron-LM's main branch says
     ``requires-python >= 3.12`` and imports ``typing.override`` (3.12+) in
     megatron/training/models/{gpt,hybrid}.py, reached through ``megatron.training.arguments``;
     the torch 2.13.0 CPU wheel here is for CPython 3.11 (PyPI's cp312 torch is the CUDA build,
     several GB), so the wrapper sets ``typing.override = lambda f: f`` before importing
     preprocess_data. All of megatron/ compiles under 3.11 (checked). ``megatron.core`` also imports
     ``triton`` (MoE kernels) at import time: triton is installed (CPU-only import, never run).

Setup (``--setup`` runs these, with the versions installed here; the pip
configuration here points at a local wheel directory holding ``torch-2.13.0+cpu`` for cp311; elsewhere
add ``--index-url https://download.pytorch.org/whl/cpu`` to the torch line)::

    python3.11 -m venv /tmp/peervenv-datatrove
    /tmp/peervenv-datatrove/bin/pip install datatrove==0.10.1 tokenizers==0.23.3 pyarrow==26.0.1
        # + numpy 2.4.6, loguru, huggingface-hub, fsspec 2026.9.0, ...
    python3.11 -m venv /tmp/peervenv-hf
    /tmp/peervenv-hf/bin/pip install datasets==5.2.0 tokenizers==0.23.3 pyarrow==26.0.1
        # + numpy 2.4.6, dill 0.4.1, multiprocess 0.70.19, fsspec 2026.9.0, ...
    python3.11 -m venv /tmp/peervenv-megatron
    /tmp/peervenv-megatron/bin/pip install torch==2.13.0            # 2.13.0+cpu
    /tmp/peervenv-megatron/bin/pip install numpy==2.4.6 packaging==26.4 transformers==5.24.0 \\
        tokenizers==0.23.3 triton==3.9.0 pyarrow==26.0.1
    # Megatron-LM source at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 (main, 2026-08-22):
    git clone https://github.com/NVIDIA/Megatron-LM /tmp/Megatron-LM.git --bare   # or any git dir
    mkdir -p /tmp/megatron-lm && git --git-dir=/tmp/Megatron-LM.git archive \\
        d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron tools pyproject.toml | tar -x -C /tmp/megatron-lm

``--setup --megatron-git-dir DIR`` does the archive step from an existing git dir (no network
here but the package index); without it, it only checks that ``--megatron-src`` holds
tools/preprocess_data.py. pyarrow in the Megatron venv is for the untimed JSONL conversion only.
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
from pathlib import Path

VENVS = {
    "datatrove": Path("/tmp/peervenv-datatrove"),
    "hf": Path("/tmp/peervenv-hf"),
    "megatron": Path("/tmp/peervenv-megatron"),
}
PIP_STEPS = {
    "datatrove": [["datatrove==0.10.1", "tokenizers==0.23.3", "pyarrow==26.0.1"]],
    "hf": [["datasets==5.2.0", "tokenizers==0.23.3", "pyarrow==26.0.1"]],
    "megatron": [
        ["torch==2.13.0"],
        ["numpy==2.4.6", "packaging==26.4", "transformers==5.24.0", "tokenizers==0.23.3", "triton==3.9.0",
         "pyarrow==26.0.1"],
    ],
}
MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
EOD_TOKEN = "<|endoftext|>"

# Each child prints one JSON line last: {"seconds", "tokens", "load_before", "load_after", ...}.
_COMMON = r"""
import json, os, sys, time
from importlib.metadata import version
os.environ["TOKENIZERS_PARALLELISM"] = "false"
def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
"""

_DATATROVE = _COMMON + r"""
text_dir, tokenizer_path, out, logs, tasks, workers = sys.argv[1:7]
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import ParquetReader
from datatrove.pipeline.tokens import DocumentTokenizer
step = DocumentTokenizer(out, tokenizer_name_or_path=tokenizer_path, shuffle_documents=False)
executor = LocalPipelineExecutor(
    pipeline=[ParquetReader(text_dir, glob_pattern="*.parquet"), step],
    tasks=int(tasks), workers=int(workers), logging_dir=logs)
load_before = os.getloadavg()
start = time.perf_counter()
executor.run()
seconds = time.perf_counter() - start
load_after = os.getloadavg()
ds_bytes = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out) if f.endswith(".ds"))
print(json.dumps({"seconds": seconds, "tokens": ds_bytes // step.token_size, "ds_bytes": ds_bytes,
                  "token_size": step.token_size, "ds_files": sorted(f for f in os.listdir(out) if f.endswith(".ds")),
                  "output_bytes": dir_bytes(out), "load_before": load_before, "load_after": load_after,
                  "versions": {p: version(p) for p in ("datatrove", "tokenizers", "pyarrow")}}))
"""

HF_RECIPE = _COMMON + r"""
from itertools import chain
text_dir, tokenizer_path, out, cache, num_proc, block = sys.argv[1:7]
num_proc, block = int(num_proc), int(block)
import datasets, tokenizers
datasets.disable_progress_bars()
_tok = []

def tokenize(examples):
    if not _tok:
        _tok.append(tokenizers.Tokenizer.from_file(tokenizer_path))
    return {"input_ids": [e.ids for e in _tok[0].encode_batch_fast(examples["text"], add_special_tokens=False)]}

def group_texts(examples):
    concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
    total_length = (len(concatenated["input_ids"]) // block) * block
    return {k: [t[i: i + block] for i in range(0, total_length, block)] for k, t in concatenated.items()}

files = sorted(os.path.join(text_dir, f) for f in os.listdir(text_dir) if f.endswith(".parquet"))
load_before = os.getloadavg()
start = time.perf_counter()
ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=cache)
ds = ds.map(tokenize, batched=True, num_proc=num_proc, remove_columns=["text"])
packed = ds.map(group_texts, batched=True, num_proc=num_proc)
packed.save_to_disk(out, num_proc=num_proc)
seconds = time.perf_counter() - start
load_after = os.getloadavg()
import pyarrow.compute as pc
tokens = pc.sum(pc.list_value_length(ds.data.column("input_ids"))).as_py()
print(json.dumps({"seconds": seconds, "tokens": tokens, "windows": len(packed), "window_tokens": len(packed) * block,
                  "output_bytes": dir_bytes(out), "cache_bytes": dir_bytes(cache),
                  "load_before": load_before, "load_after": load_after,
                  "versions": {p: version(p) for p in ("datasets", "tokenizers", "pyarrow")}}))
"""

_TO_JSONL = r"""
import json, os, sys
import pyarrow.parquet as pq
text_dir, out = sys.argv[1:3]
docs = 0
with open(out, "w", encoding="utf-8") as f:
    for name in sorted(n for n in os.listdir(text_dir) if n.endswith(".parquet")):
        for batch in pq.ParquetFile(os.path.join(text_dir, name)).iter_batches(columns=["text"]):
            for text in batch.column(0).to_pylist():
                f.write(json.dumps({"text": text}) + "\n")
                docs += 1
print(json.dumps({"documents": docs, "jsonl_bytes": os.path.getsize(out)}))
"""

_MEGATRON = _COMMON + r"""
import contextlib, io, typing, warnings
warnings.filterwarnings("ignore")
typing.override = getattr(typing, "override", lambda f: f)  # 3.12's typing.override, imported by megatron.training
src, jsonl, tokdir, prefix, workers = sys.argv[1:6]
sys.path[:0] = [src, os.path.join(src, "tools")]
import preprocess_data
from megatron.core.datasets.indexed_dataset import IndexedDataset
sys.argv = ["preprocess_data.py", "--input", jsonl, "--output-prefix", prefix, "--tokenizer-type",
            "HuggingFaceTokenizer", "--tokenizer-model", tokdir, "--workers", workers, "--append-eod",
            "--log-interval", "1000000000"]
load_before = os.getloadavg()
start = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()) as log:
    preprocess_data.main()
seconds = time.perf_counter() - start
load_after = os.getloadavg()
base = prefix + "_text_document"
dataset = IndexedDataset(base)
itemsize = dataset.index.dtype_size
bin_bytes = os.path.getsize(base + ".bin")
tokens = bin_bytes // itemsize
documents = len(dataset.document_indices) - 1
assert tokens == int(dataset.sequence_lengths.sum()), (tokens, dataset.sequence_lengths.sum())
print(json.dumps({"seconds": seconds, "tokens": tokens, "tokens_no_eod": tokens - documents, "documents": documents,
                  "bin_bytes": bin_bytes, "dtype": str(dataset.index.dtype), "log": log.getvalue()[-500:],
                  "output_bytes": bin_bytes + os.path.getsize(base + ".idx"),
                  "load_before": load_before, "load_after": load_after,
                  "versions": {p: version(p) for p in ("torch", "transformers", "tokenizers", "numpy")}}))
"""


def venv_python(peer: str) -> str:
    return str(VENVS[peer] / "bin" / "python")


def run_child(peer: str, script: str, args: list[str]) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([venv_python(peer), "-c", script, *args], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{peer} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_datatrove(args: argparse.Namespace, work: Path, shards: list[Path]) -> dict:
    out, logs = work / "dt-out", work / "dt-logs"
    tasks = args.dt_tasks or len(shards)
    result = run_child("datatrove", _DATATROVE, [str(args.text_dir), str(args.tokenizer), str(out), str(logs),
                                                  str(tasks), str(args.workers)])
    result["what"] = f"datatrove DocumentTokenizer, {tasks} tasks on {args.workers} workers, no shuffle"
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    return result


def run_hf(args: argparse.Namespace, work: Path, shards: list[Path]) -> dict:
    out, cache = work / "hf-out", work / "hf-cache"
    result = run_child("hf", HF_RECIPE, [str(args.text_dir), str(args.tokenizer), str(out), str(cache),
                                    str(args.workers), str(args.block)])
    result["what"] = (f"datasets.map(encode_batch_fast, num_proc={args.workers}) + group_texts({args.block}) "
                      f"+ save_to_disk")
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return result


def prepare_megatron(args: argparse.Namespace, work: Path) -> dict:
    """The untimed inputs: the JSONL copy of the shards and a tokenizer directory AutoTokenizer loads."""
    tokdir = work / "mg-tokenizer"
    tokdir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.tokenizer, tokdir / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOD_TOKEN}
    (tokdir / "tokenizer_config.json").write_text(json.dumps(config))
    jsonl = work / "corpus.jsonl"
    start = time.perf_counter()
    info = run_child("megatron", _TO_JSONL, [str(args.text_dir), str(jsonl)])
    info["convert_seconds_untimed"] = time.perf_counter() - start
    return {"jsonl": jsonl, "tokdir": tokdir, **info}


def run_megatron(args: argparse.Namespace, work: Path, shards: list[Path], prepared: dict) -> dict:
    out = work / "mg-out"
    out.mkdir(parents=True, exist_ok=True)
    result = run_child("megatron", _MEGATRON, [str(args.megatron_src), str(prepared["jsonl"]),
                                                str(prepared["tokdir"]), str(out / "corpus"), str(args.workers)])
    result["what"] = (f"Megatron-LM tools/preprocess_data.py --workers {args.workers} --append-eod "
                      f"(JSONL input; Parquet->JSONL not timed)")
    result["jsonl_documents"] = prepared["documents"]
    result["jsonl_bytes"] = prepared["jsonl_bytes"]
    result["convert_seconds_untimed"] = prepared["convert_seconds_untimed"]
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    return result


def setup(args: argparse.Namespace) -> None:
    base = args.base_python or shutil.which("python3.11") or sys.executable
    for peer in args.peers:
        venv = VENVS[peer]
        if not (venv / "bin" / "python").exists():
            print(f"+ {base} -m venv {venv}", flush=True)
            subprocess.run([base, "-m", "venv", str(venv)], check=True)
        for packages in PIP_STEPS[peer]:
            cmd = [str(venv / "bin" / "pip"), "install", *packages]
            print("+ " + " ".join(cmd), flush=True)
            subprocess.run(cmd, check=True)
    if "megatron" in args.peers:
        src = Path(args.megatron_src)
        if args.megatron_git_dir:
            src.mkdir(parents=True, exist_ok=True)
            archive = subprocess.run(["git", f"--git-dir={args.megatron_git_dir}", "archive", MEGATRON_COMMIT,
                                      "megatron", "tools", "pyproject.toml"], check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
            print(f"Megatron-LM {MEGATRON_COMMIT} -> {src}")
        if not (src / "tools" / "preprocess_data.py").exists():
            print(f"missing {src}/tools/preprocess_data.py: see the docstring (Megatron-LM {MEGATRON_COMMIT})")


def rate(tokens: int, seconds: float) -> float:
    return tokens / seconds / 1e6


def load(values: list[float]) -> str:
    return "/".join(f"{v:.2f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text-dir", type=Path, help="directory of *.parquet shards with a `text` column")
    parser.add_argument("--tokenizer", type=Path, help="byte-level BPE tokenizer.json")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dt-tasks", type=int, default=None, help="datatrove tasks (default --workers; 0 = shards)")
    parser.add_argument("--block", type=int, default=2048, help="group_texts block size (hf)")
    parser.add_argument("--peers", default="datatrove,hf,megatron")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds over the peers")
    parser.add_argument("--work", type=Path, default=None, help="scratch dir (default: a new temp dir, removed)")
    parser.add_argument("--keep", action="store_true", help="keep each peer's output and the scratch dir")
    parser.add_argument("--json", type=Path, default=None, help="write all results here")
    parser.add_argument("--megatron-src", type=Path, default=Path("/tmp/megatron-lm"))
    parser.add_argument("--setup", action="store_true", help="create the venvs (and Megatron source) and exit")
    parser.add_argument("--megatron-git-dir", default=None, help="--setup: git dir to archive Megatron-LM from")
    parser.add_argument("--base-python", default=None, help="--setup: python for the venvs (default python3.11)")
    args = parser.parse_args()
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(args.peers) - set(VENVS)
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}; choose from {list(VENVS)}")
    if args.setup:
        setup(args)
        return
    if not args.text_dir or not args.tokenizer:
        parser.error("--text-dir and --tokenizer are required (or --setup)")
    args.text_dir, args.tokenizer = args.text_dir.resolve(), args.tokenizer.resolve()
    if args.dt_tasks is None:
        args.dt_tasks = args.workers
    shards = sorted(args.text_dir.glob("*.parquet"))
    if not shards:
        parser.error(f"no *.parquet in {args.text_dir}")
    for peer in args.peers:
        if not Path(venv_python(peer)).exists():
            parser.error(f"no venv for {peer} at {VENVS[peer]}: run with --setup first")
    if "megatron" in args.peers and not (args.megatron_src / "tools" / "preprocess_data.py").exists():
        parser.error(f"no Megatron-LM source at {args.megatron_src}: see the docstring")

    work = (args.work or Path(tempfile.mkdtemp(prefix="peer-bench-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    text_bytes = sum(p.stat().st_size for p in shards)
    print(f"{len(shards)} shards, {text_bytes / 1e6:.1f} MB of Parquet in {args.text_dir}; tokenizer {args.tokenizer}; "
          f"workers {args.workers}; cores {os.cpu_count()}; scratch {work}", flush=True)
    prepared = prepare_megatron(args, work) if "megatron" in args.peers else None
    if prepared:
        print(f"megatron input (not timed): {prepared['documents']:,} documents, "
              f"{prepared['jsonl_bytes'] / 1e6:.1f} MB of JSONL in {prepared['convert_seconds_untimed']:.1f}s",
              flush=True)
    results = []
    for round_ in range(args.repeats):
        for peer in args.peers:
            if peer == "datatrove":
                result = run_datatrove(args, work, shards)
            elif peer == "hf":
                result = run_hf(args, work, shards)
            else:
                result = run_megatron(args, work, shards, prepared)
            tokens = result.get("tokens_no_eod", result["tokens"])
            result.update(peer=peer, round=round_, mtok_per_s=rate(tokens, result["seconds"]))
            results.append(result)
            extra = ""
            if peer == "hf":
                extra = f", {result['windows']:,} windows of {args.block}"
            elif peer == "megatron":
                extra = f" (+{result['documents']:,} EOD = {result['tokens']:,} written)"
            print(f"{peer:9s} {result['seconds']:8.2f}s  {tokens:>13,} tokens{extra}  "
                  f"{result['mtok_per_s']:.3f} M tok/s  load {load(result['load_before'])} -> "
                  f"{load(result['load_after'])}  | {result['what']}", flush=True)
    summary = {"text_dir": str(args.text_dir), "tokenizer": str(args.tokenizer), "shards": len(shards),
               "parquet_bytes": text_bytes, "workers": args.workers, "cpu_count": os.cpu_count(),
               "megatron_commit": MEGATRON_COMMIT if "megatron" in args.peers else None, "results": results}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
        print(f"wrote {args.json}")
    if prepared and not args.keep:
        prepared["jsonl"].unlink(missing_ok=True)
    if not args.keep and args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
