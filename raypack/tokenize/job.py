"""One tokenize run: text files in, a tokenized corpus out (:mod:`raypack.tokenize.corpus`).

``raypack tokenize`` (:func:`run_tokenize`) locks, stages and publishes its output exactly like
``raypack pack`` (:mod:`raypack.pack.publish`): a corpus tokenized once and packed many ways.
``raypack pack --tokenizer`` (:func:`pack_text`) writes no corpus: each task's ids go from the
tokenizer to the packer in memory (:mod:`raypack.tokenize.onepass`), with the same output as
``tokenize`` then ``pack``.

The driver plans (lists files, reads Parquet footers and JSONL sizes, loads the tokenizer once
for its identity, BOS/EOS ids and vocabulary size); tasks run on the local process or on a Ray
actor pool (:func:`raypack.engine.pipeline.tokenize_texts`, ``pack_texts``); the driver then writes the manifest.
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.inputs.base import HoldsTokens, check_document_lengths, mixed_inputs
from raypack.inputs.registry import format_of
from raypack.inputs.shards import discover_shards, output_kind
from raypack.io.fs import resolve_filesystem
from raypack.io.progress import Progress
from raypack.pack.dry_run import DryRunReport, report_of
from raypack.pack.plan import check_output_outside_inputs
from raypack.pack.publish import check_free_before_start, plan_before_start, run_published
from raypack.pack.resume import file_mark, sampled_identity
from raypack.packed.manifest import backend_label
from raypack.packed.writer import MANIFEST_NAME
from raypack.rules.arrays import numpy_values
from raypack.tokenize.backends import AUTO, check_backend_name, load_backed_tokenizer
from raypack.tokenize.corpus import (
    TokenizedManifest,
    build_tokenized_manifest,
    load_tokenized_manifest,
    save_tokenized_manifest,
)
from raypack.tokenize.onepass import run_onepass
from raypack.tokenize.pieces import EncodeAhead
from raypack.tokenize.tasks import (
    MAX_DOCUMENT_BYTES,
    TextResult,
    TextTask,
    TokenizeSettings,
    load_verified_record,
    say_redone,
    tokenize_in_memory,
    tokenize_task,
)
from raypack.tokenize.tokenizers import check_packed_ids, token_dtype_for

log = logging.getLogger(__name__)


MIN_HELD_TOKENS = 1 << 20
"""``pack --tokenizer`` holds at least this many of a task's ids in memory (2-4 MiB) before it
spills the rest: a tiny ``--task-bytes`` (3: a task per JSON line) made every task spill."""


@dataclass(frozen=True, kw_only=True)
class TextOptions:
    """The options that decide the tokenized corpus (shared by ``tokenize`` and ``pack --tokenizer``)."""

    tokenizer: str
    text_column: str = "text"
    bos: str | int | None = None
    eos: str | int | None = None
    token_dtype: str = "auto"
    task_rows: int = 65536
    """Parquet: consecutive row groups are merged into one task until it holds this many rows."""
    task_bytes: int = 64 << 20
    """Bytes of text per task: JSONL, nominal (compressed JSONL: one task per file); Parquet, row
    groups are merged while they hold at most this many bytes (footer sizes; a larger row group is
    a task alone). ``pack --tokenizer`` holds up to ``task_bytes // 4`` of a task's ids in memory
    (about the ids of that much English text; the rest of a larger row group, or of denser text,
    waits in a spill file: raypack.tokenize.onepass), so this bounds a worker's memory whatever the file."""
    row_group_tokens: int = 1 << 20
    row_group_docs: int = 65536
    batch_rows: int = 8192
    """Texts read at once, at most (memory; a Parquet batch also holds about 8 MiB of text at most,
    raypack.inputs.parquet.TEXT_BATCH_BYTES), and so encoded in one call at most. Each text costs the
    tokenizer a little beside its text, and each call a fixed cost: BENCHMARKS.md, 400-byte texts at
    8,192 against 1,024 a batch ran 1.2-1.6x faster and peaked ~40 MiB higher. No effect on the output."""
    batch_bytes: int | None = None
    """Bytes of text encoded at once (memory); None: the backend's ``batch_bytes``; no effect on the output."""
    tokenizer_backend: str = AUTO
    """Who computes the ids (raypack.tokenize.backends): auto, reference or a backend's name; no
    effect on the output (the manifest records which one ran)."""
    max_document_bytes: int = MAX_DOCUMENT_BYTES
    """A longer text is one line naming it, before it is encoded: a tokenizer's working memory grows
    with the document (BENCHMARKS.md, "One long text document" and "stop 51": about 9-15 bytes per
    byte of real text with gigatoken, up to 44 for one repeated character or a SentencePiece-style
    BPE, 110-230 with HF tokenizers, which also encodes the text around a character gigatoken reads
    otherwise: "stop 66"); no effect on the output of the documents it accepts."""

    def __post_init__(self) -> None:
        if not self.tokenizer:
            raise InputError("no tokenizer given: pass --tokenizer (a tokenizer.json, its directory, or tiktoken:NAME)")
        check_backend_name(self.tokenizer_backend)
        for name in ("task_rows", "task_bytes", "row_group_tokens", "row_group_docs", "batch_rows", "batch_bytes",
                     "max_document_bytes"):
            value = getattr(self, name)
            if value is None and name == "batch_bytes":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name}={value!r} must be an integer >= 1")

    def output_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()
                if k not in ("batch_rows", "batch_bytes", "tokenizer_backend", "max_document_bytes")}


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig:
    inputs: tuple[str, ...]
    output: str
    text: TextOptions
    num_workers: int = 2
    worker_num_cpus: float = 0.5
    overwrite: bool = False
    address: str | None = None


@dataclass(frozen=True)
class TokenizeSummary:
    output: str
    manifest: TokenizedManifest
    seconds: float
    finished_publish: bool = False
    """A ``--resume`` that found the interrupted run's output complete and published it (no time to show)."""
    kept: tuple[int, int] = (0, 0)
    """Tasks and tokens a ``--resume`` kept from the runs before (not counted in the rate)."""

    def lines(self) -> list[str]:
        c, tokenizer = self.manifest.counts, self.manifest.tokenizer
        rate = (c.tokens - self.kept[1]) / self.seconds if self.seconds > 0 else 0.0
        by = backend_label(self.manifest.backend)  # as pack's summary names it: "reference tokenizers 0.23.3"
        done = "finished the interrupted publish of" if self.finished_publish else "tokenized"
        lines = [
            f"{done} {self.output} ({tokenizer['kind']}, vocabulary "
            f"{tokenizer['vocab_size']:,}, {self.manifest.token_dtype.name}, ids by {by})",
            f"  documents  {c.documents:>14,}",
            f"  tokens     {c.tokens:>14,}",
            f"  shards     {c.shards:>14,}",
        ]
        if self.finished_publish:
            return lines
        kept = f"; {self.kept[0]:,} tasks, {self.kept[1]:,} tokens, kept from the run before" if self.kept[0] else ""
        return [*lines, f"  time       {self.seconds:>14.2f}s  ({rate / 1e6:,.2f}M tokens/s, start-up included{kept})"]


def parse_token(value: str | int | None) -> str | int | None:
    """A ``--bos``/``--eos`` value: digits are an id, anything else a token string."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def check_before_ray(inputs: tuple[str, ...] | list[str], text: TextOptions, pack=None) -> None:
    """What is cheap to check, checked before Ray takes seconds to start: the inputs are listed,
    the tokenizer loads (its backend too), BOS and EOS name tokens it has, no input is a raypack output,
    the first file's first read batch has the text column."""
    for item in inputs:
        _refuse_token_output(item)
    paths = discover_shards(list(inputs))
    tokenizer = load_backed_tokenizer(text.tokenizer, text.tokenizer_backend)
    for token in (text.bos, text.eos):
        if token is not None:
            tokenizer.token_id(parse_token(token))
    if pack is not None:
        check_packed_ids(pack.pad_token, pack.token_dtype, tokenizer.vocab_size)
    if paths:  # the text column, where a wrong --text-column shows first: the first file's first read
        fmt = format_of(paths[0])
        ranges = fmt.text_tasks(paths[0], task_rows=text.task_rows, task_bytes=text.task_bytes)
        if ranges:
            first = fmt.iter_texts(paths[0], text.text_column, ranges[0][0], ranges[0][1], 1,
                                   max_text_bytes=text.max_document_bytes)
            try:
                next(iter(first), None)
            finally:
                close = getattr(first, "close", None)
                if close is not None:
                    close()


def run_tokenize(config: TokenizeConfig, *, engine: str = "ray", resume: bool = False,
                 verbose: bool | None = None) -> TokenizeSummary:
    """Tokenize ``config.inputs`` into ``config.output``, published atomically like ``run_pack``.

    On Ray, connects before taking the lock (``verbose``: Ray's own logs too); Ctrl-C raises
    :class:`raypack.errors.Interrupted` naming the kept work directory."""
    start = time.perf_counter()
    if not config.output:
        raise InputError("no output given: pass --output DIR")
    early: list[TextTask] | None = None
    if engine == "ray":
        from raypack.engine.session import connect_ray

        check_before_ray(config.inputs, config.text)
        if not (check_free_before_start(config.output, overwrite=config.overwrite, resume=resume) and resume):
            # every file's footer and text column: a bad one is one line before Ray starts, not after
            early = plan_before_start(config.output, resume=resume,
                                      plan=lambda: plan_text_tasks(config.inputs, config.text))
            connect_ray(config.address, verbose=verbose, worker_num_cpus=config.worker_num_cpus)
        # else an interrupted publish, which run_published finishes with no engine

    def plan() -> list[TextTask]:
        if engine == "ray":  # connected above, unless the output looked finished there; idempotent
            from raypack.engine.session import connect_ray

            connect_ray(config.address, verbose=verbose, worker_num_cpus=config.worker_num_cpus)
        tasks = early if early is not None else plan_text_tasks(config.inputs, config.text)
        _check_outside(config.output, tasks, config.inputs)
        return tasks

    def write(target, tasks: list[TextTask]) -> tuple[TokenizedManifest, tuple[int, int]]:
        manifest, kept = tokenize_into(target.work_dir, config, tasks, engine, resume)
        target.sweep(keep={s.path for s in manifest.shards})
        save_tokenized_manifest(target.work_dir, manifest)
        return manifest, kept

    outcome = run_published(config.output, overwrite=config.overwrite, resume=resume, plan=plan, write=write,
                            finished=lambda: None)
    if outcome is None:  # --resume of a run interrupted while publishing: its publish finished
        return TokenizeSummary(config.output, load_tokenized_manifest(config.output), time.perf_counter() - start,
                               finished_publish=True)
    manifest, kept = outcome
    return TokenizeSummary(config.output, manifest, time.perf_counter() - start, kept=kept)


def pack_text(work_dir: str, pack_config, text: TextOptions, engine: str, resume: bool,
              tasks: list[TextTask] | None = None):
    """``pack --tokenizer`` in one pass (raypack.tokenize.onepass): each text task tokenized into
    memory and packed from there; ``(plan, settings, results)`` for the driver to stitch and publish.
    ``tasks``: :func:`plan_text_tasks`'s, where the caller planned them already (before Ray started).

    Same plan (counts, offsets, token dtype, manifest's tokenizer record) as ``make_plan`` over a
    ``raypack tokenize`` output made with the same options, so the packed output is byte-identical.
    """
    tokenizer = load_backed_tokenizer(text.tokenizer, text.tokenizer_backend)
    check_packed_ids(pack_config.pad_token, pack_config.token_dtype, tokenizer.vocab_size)
    if tasks is None:
        tasks = plan_text_tasks(pack_config.inputs, text)
    _check_outside(pack_config.output, tasks, pack_config.inputs)
    settings, options = _text_settings(work_dir, text, tokenizer, pack_config.inputs)
    manifest = build_tokenized_manifest([], settings.token_dtype, tokenizer.identity(), options,
                                        tokenizer.backend_record())
    record = json.loads(json.dumps({"identity": manifest.tokenizer, "options": manifest.options}))
    if manifest.backend:
        record["backends"] = [json.loads(json.dumps(manifest.backend))]
    progress = Progress("packed", len(tasks), "tasks")
    on_ray = None
    if engine == "ray":
        def on_ray(placer, text_settings, settings):
            return _pack_text_with_ray(placer, text_settings, settings, pack_config, progress)
    return run_onepass(work_dir, pack_config, tasks, settings, record, tokenizer, engine, resume, on_ray, progress)


def _pack_text_with_ray(placer, text_settings: TokenizeSettings, settings, pack_config, progress):
    from raypack.engine.pipeline import init_ray
    from raypack.engine.session import on_ray

    init_ray(pack_config.address)
    return on_ray(lambda pipeline: pipeline.pack_texts(
        placer, text_settings, settings, num_workers=pack_config.num_workers,
        worker_num_cpus=pack_config.worker_num_cpus,
        on_result=lambda r, kept=False: progress.add(r.num_tokens, kept=kept)),
        "a tokenizing packer")


def dry_run_text(pack_config, text: TextOptions, sample_docs: int) -> DryRunReport:
    """``pack --tokenizer --dry-run``: the first ``sample_docs`` documents (0: all) tokenized in
    memory, one pass's tasks in order, and every strategy's figures for them (raypack.pack.dry_run).
    Each text task is a pack task, so best_fit's windows end where a task does, as in the run.
    Writes nothing; no Ray. Cost: tokenizing the sample (and the rest of its last read batch)."""
    tasks = plan_text_tasks(pack_config.inputs, text)
    tokenizer = load_backed_tokenizer(text.tokenizer, text.tokenizer_backend)
    settings, _ = _text_settings("", text, tokenizer, pack_config.inputs)
    limit = sample_docs or None
    per_task, taken, stopped = [], 0, False
    for task in tasks:
        if stopped:
            break
        parts, pieces = [], tokenize_in_memory(task, settings, tokenizer)
        try:
            for ids in pieces:
                check_document_lengths(ids, pack_config.max_document_tokens, path=task.path,
                                       first_row=sum(p.size for p in parts))
                lengths = np.diff(numpy_values(ids.offsets)).astype(np.int64)
                if limit is not None and taken + lengths.size >= limit:
                    lengths, stopped = lengths[:limit - taken], True
                parts.append(lengths)
                taken += lengths.size
                if stopped:
                    break
        finally:
            pieces.close()  # stops its reader's thread when the sample ends inside the task
        per_task.append(np.concatenate(parts) if parts else np.zeros(0, np.int64))
    whole = (None, None) if stopped else (taken, sum(int(p.sum()) for p in per_task))
    return report_of(pack_config, per_task, *whole)


def plan_text_tasks(inputs: tuple[str, ...], text: TextOptions) -> list[TextTask]:
    """Every task, in input order, as each format splits text (Parquet row-group ranges, JSONL byte
    ranges; raypack.inputs.base.InputFormat.text_tasks). Footers and sizes only."""
    if not inputs:
        raise InputError("no input given: pass --input PATH (a text file, a directory or a glob)")
    for item in inputs:
        _refuse_token_output(item)
    def plan_file(path: str):
        fmt = format_of(path)  # discover_shards keeps only registered suffixes
        planned = file_mark(sampled_identity(path, fmt.name))  # each task checks its file is still this one
        ranges = fmt.text_tasks(path, task_rows=text.task_rows, task_bytes=text.task_bytes)
        return fmt, planned, ranges, fmt.text_notes(path, text.text_column, text.max_document_bytes)

    paths = discover_shards(list(inputs))
    tasks: list[TextTask] = []
    # files planned on threads (each a few ranged reads: an object store's latency, not CPU), in input order
    pool = ThreadPoolExecutor(max_workers=max(1, min(PLAN_THREADS, len(paths))))
    try:
        planned_files = pool.map(plan_file, paths)
        for path in paths:
            try:
                fmt, planned, ranges, notes = next(planned_files)
            except HoldsTokens as e:
                if tasks:  # the files before it were text
                    raise mixed_inputs(path, tasks[0].path) from e
                raise
            for note in notes:
                log.info("%s", note)
            first = len(tasks)
            tasks.extend(TextTask(first + k, path, fmt.name, start, end, size, planned)
                         for k, (start, end, size) in enumerate(ranges))
            if text.task_bytes < SMALL_TASK_BYTES and len(tasks) > MANY_SMALL_TASKS:
                raise InputError(f"--task-bytes {text.task_bytes} cuts the text into more than {MANY_SMALL_TASKS:,} "
                                 f"tasks (at {path}), each with a fixed cost (a task, a file); it is a number of "
                                 f"bytes: give e.g. {64 << 20} for 64 MiB (the default)")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a refusal does not wait for the files after it
    return tasks


PLAN_THREADS = 8
"""Text files planned at once (their identities and footers: a few ranged reads each)."""


SMALL_TASK_BYTES = 1 << 20
MANY_SMALL_TASKS = 10_000
"""A plan of more tasks than this, each under SMALL_TASK_BYTES, is refused: ``--task-bytes 64`` meant as
MiB made a task (and a part file) per 64 bytes of a JSON Lines file (a new user's trial: 710 part files for
a 710-byte file at 1)."""


def _refuse_token_output(item: str) -> None:
    """A raypack output (a tokenized corpus, a packed output) holds token ids, not text: one line."""
    if not isinstance(item, str) or not item or any(ch in item for ch in "*?["):
        return
    fs, fs_path = resolve_filesystem(item)
    try:
        if fs.get_file_info(f"{fs_path.rstrip('/')}/{MANIFEST_NAME}").type != pafs.FileType.File:
            return
    except OSError:  # a directory it may not search: listing the input says so, in its own line
        return
    kind = output_kind(fs, fs_path)
    if kind not in ("mix", "packed"):
        raise InputError(f"input {item} is a raypack output (it holds {MANIFEST_NAME}): its documents are token ids "
                         "already, not text; pack it with `raypack pack`, no --tokenizer (nor --text-column, --bos, "
                         "--eos)")
    what = ("a mix (raypack mix's index over packed outputs)", "its sources were") if kind == "mix" else (
        "a packed raypack output (fixed-length chunks of token ids)", "it was")
    raise InputError(f"input {item} is {what[0]}, not text: give the text {what[1]} packed from (read it with "
                     "raypack.read_packed)")


def _check_outside(output: str, tasks: list[TextTask], inputs) -> None:
    shards = tuple(SimpleNamespace(path=p) for p in dict.fromkeys(t.path for t in tasks))
    check_output_outside_inputs(output, SimpleNamespace(shards=shards), inputs)


def tokenize_into(out_dir: str, config: TokenizeConfig, tasks: list[TextTask], engine: str,
                  resume: bool) -> tuple[TokenizedManifest, tuple[int, int]]:
    """Run every task into ``out_dir``; return the corpus manifest (not yet written), and the tasks
    and tokens kept from the runs before (a ``resume``)."""
    tokenizer = load_backed_tokenizer(config.text.tokenizer, config.text.tokenizer_backend)
    settings, options = _text_settings(out_dir, config.text, tokenizer, config.inputs)
    results, kept = _run_tasks(tasks, settings, config, engine, resume, tokenizer)
    shards = [{"path": r.path, "num_docs": r.num_docs, "num_tokens": r.num_tokens, "num_bytes": r.num_bytes,
               "sha256": r.sha256, "source": {"path": t.path, "format": t.format, "start": t.start, "end": t.end}}
              for t, r in zip(tasks, results)]
    return build_tokenized_manifest(shards, settings.token_dtype, tokenizer.identity(), options,
                                    tokenizer.backend_record()), kept


def _text_settings(out_dir: str, text: TextOptions, tokenizer, inputs) -> tuple[TokenizeSettings, dict[str, Any]]:
    """The tokenize settings every task shares, and the options a tokenized manifest records."""
    bos_id, eos_id = (None if t is None else tokenizer.token_id(parse_token(t)) for t in (text.bos, text.eos))
    token_dtype = token_dtype_for(tokenizer.vocab_size, text.token_dtype).name
    settings = TokenizeSettings(out_dir, text.tokenizer, tokenizer.identity()["sha256"], text.text_column,
                                token_dtype, bos_id, eos_id, text.row_group_tokens, text.row_group_docs,
                                text.batch_rows, text.batch_bytes or tokenizer.batch_bytes,
                                tokenizer_backend=tokenizer.backend,
                                tokenizer_backend_version=tokenizer.backend_record()["version"],
                                max_document_bytes=text.max_document_bytes,
                                held_tokens=max(text.task_bytes // 4, MIN_HELD_TOKENS))
    options = {**text.output_dict(), "bos_id": bos_id, "eos_id": eos_id, "inputs": list(inputs)}
    return settings, options


def _run_tasks(tasks: list[TextTask], settings: TokenizeSettings, config: TokenizeConfig, engine: str,
               resume: bool, tokenizer) -> tuple[list[TextResult], tuple[int, int]]:
    redone: dict[str, list[TextTask]] = {}
    kept = {t.task_index: r for t in tasks if resume and (r := load_verified_record(t, settings, redone))}
    say_redone(redone)
    todo = [t for t in tasks if t.task_index not in kept]
    if kept:
        log.info("resume: %d of %d text tasks kept (verified), %d to tokenize", len(kept), len(tasks), len(todo))
    progress = Progress("tokenized", len(tasks), "tasks")  # counts the kept tasks too, as pack's does
    for result in kept.values():
        progress.add(result.num_tokens, kept=True)
    if engine == "local" or not todo:
        done = _tokenize_locally(todo, settings, tokenizer, progress)
    else:
        done = _tokenize_with_ray(todo, settings, config, progress)
    results = sorted([*kept.values(), *done], key=lambda r: r.task_index)
    return results, (len(kept), sum(r.num_tokens for r in kept.values()))


def _tokenize_locally(tasks: list[TextTask], settings: TokenizeSettings, tokenizer,
                      progress: Progress) -> list[TextResult]:
    """One process, task after task, read and encoded ahead across the tasks' edges (EncodeAhead); the
    tokenizer's own threads use every core."""
    results = []
    ahead = EncodeAhead(tasks, settings, tokenizer)
    try:
        for task in tasks:
            results.append(tokenize_task(task, settings, tokenizer, ahead.encoded(task)))
            progress.add(results[-1].num_tokens)
    finally:
        ahead.close()
    return results


def dispatch_order(tasks: list[TextTask]) -> list[TextTask]:
    """The largest tasks first (ties in input order), so the tasks still running when the
    others have finished are short ones and no worker idles long at the end (longest
    processing time first). The output does not depend on the order: each task writes its own
    part file, and results are put back in task order."""
    return sorted(tasks, key=lambda t: (-t.text_bytes, t.task_index))


def _tokenize_with_ray(tasks: list[TextTask], settings: TokenizeSettings, config: TokenizeConfig,
                       progress: Progress) -> list[TextResult]:
    from raypack.engine.session import engine, on_ray

    engine().init_ray(config.address)
    largest_first = dispatch_order(tasks)
    return on_ray(lambda pipeline: pipeline.tokenize_texts(
        largest_first, settings, num_workers=config.num_workers, worker_num_cpus=config.worker_num_cpus,
        on_result=lambda r: progress.add(r.num_tokens)), "a tokenizer")
