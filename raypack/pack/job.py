"""One packing run, start to finish: lock, plan, pack the shards, stitch, publish.

How the output is locked, written and published (a local directory or an object-store
prefix) is :mod:`raypack.pack.publish`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from raypack.engine.session import connect_ray, engine, on_ray
from raypack.errors import InputError
from raypack.io.progress import Progress
from raypack.pack.assemble import check_coverage, count_stats, stitch_boundaries, write_boundaries
from raypack.pack.config import PackConfig
from raypack.pack.local import run_tasks
from raypack.pack.packer import count_task, local_publisher, local_run_base, pack_shard
from raypack.pack.plan import (
    Plan,
    check_inputs_before_start,
    check_output_outside_inputs,
    make_plan,
    place_counts,
    settings_for,
)
from raypack.pack.publish import (
    LocalOutput,
    ObjectStoreOutput,
    check_free_before_start,
    plan_before_start,
    run_published,
)
from raypack.pack.resume import load_verified_result, say_inputs_gone
from raypack.pack.tasks import PackSettings, ShardResult, TaskCounts
from raypack.packed.manifest import Manifest, PackedCounts, backend_label, build_manifest, load_manifest, write_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Summary:
    output: str
    manifest: Manifest
    seconds: float
    """Wall time of planning, packing and publishing (Ray start-up excluded)."""
    peak_worker_rss_bytes: int = 0
    """The largest peak resident memory of a packer actor while packing a shard; with the local
    engine, the most packing added to this process's resident memory."""
    pack_seconds: float = 0.0
    """From the first task's start to the last task's end (excludes engine start-up)."""
    engine: str = "ray"
    kept: tuple[int, int] = (0, 0)
    """Tasks, and their tokens, kept from an interrupted run's records (``--resume``): not in the rate."""
    finished_publish: bool = False
    """A ``--resume`` that found the interrupted run's output complete and published it: nothing was
    packed (no time, rate or memory to show)."""

    def lines(self) -> list[str]:
        c = self.manifest.counts
        positions = c.chunks * self.manifest.context_length
        pad_pct = 100.0 * c.padding_positions / positions if positions else 0.0
        split_pct = 100.0 * c.split_documents / c.documents if c.documents else 0.0
        rate = (c.tokens - self.kept[1]) / self.seconds if self.seconds > 0 else 0.0
        strategy = self.manifest.strategy.describe()
        done = "finished the interrupted publish of" if self.finished_publish else "packed"
        counts = [
            f"{done} {self.output} ({strategy})",
            f"  documents        {c.documents:>14,}",
            f"  tokens           {c.tokens:>14,}",
            f"  chunks           {c.chunks:>14,}  of {self.manifest.context_length} tokens",
            f"  padding          {c.padding_positions:>14,}  ({pad_pct:.3f}% of positions)",
            f"  split documents  {c.split_documents:>14,}  ({split_pct:.2f}% of documents)",
            *_cut_lines(c),
            *_tokenizer_lines(self.manifest),
            f"  files            {len(self.manifest.files):>14,}",
        ]
        if self.finished_publish:
            return counts
        return [
            *counts,
            f"  time             {self.seconds:>14.2f}s  ({rate / 1e6:,.1f}M tokens/s, start-up included"
            + (f"; {self.kept[0]:,} tasks, {self.kept[1]:,} tokens, kept from the run before)" if self.kept[0]
               else ")"),
            f"  packing          {self.pack_seconds:>14.2f}s  (first task start to last task end)",
            f"  peak packer RSS  {self.peak_worker_rss_bytes / 2**20:>14,.0f} MiB"
            + ("  (added to this process)" if self.engine == "local" else ""),
        ]


def _tokenizer_lines(manifest: Manifest) -> list[str]:
    """For an output packed from text: the tokenizer and the backend(s) that computed its ids."""
    record = manifest.tokenizer_record
    if record is None:
        return []
    identity = record["identity"]
    name = f"tiktoken:{identity.get('name')}" if identity.get("kind") == "tiktoken" else identity.get("file", "?")
    listed = record.get("backends")
    backends = [b for b in listed if isinstance(b, dict)] if isinstance(listed, list) else []
    by = ", ".join(backend_label(b) for b in backends)
    vocab = identity.get("vocab_size")
    ids = f"{vocab:,}" if isinstance(vocab, int) else "?"  # as recorded: an input's manifest may say anything
    return [f"  tokenizer        {name} ({ids} ids)" + (f", ids by {by}" if by else "")]


def _cut_lines(counts: PackedCounts) -> list[str]:
    """What ``long_docs`` truncate / drop left out (no line under split)."""
    lines = []
    if counts.documents_truncated:
        lines.append(f"  truncated        {counts.documents_truncated:>14,}  documents "
                     f"({counts.tokens_truncated:,} tokens cut off)")
    if counts.documents_dropped:
        lines.append(f"  dropped          {counts.documents_dropped:>14,}  documents "
                     f"({counts.tokens_dropped:,} tokens)")
    return lines


def run_pack(config: PackConfig, *, engine: str = "ray", resume: bool = False, text=None,
             verbose: bool | None = None) -> Summary:
    """Pack ``config.inputs`` into ``config.output``. ``engine``: "ray" or "local" (one process).

    ``text`` (a :class:`raypack.tokenize.job.TextOptions`): the inputs are text, tokenized and
    packed in one pass (:func:`raypack.tokenize.job.pack_text`, raypack.tokenize.onepass). On Ray, connects
    first (before any lock or staging directory); ``verbose`` shows Ray's own logs too.
    Ctrl-C raises :class:`raypack.errors.Interrupted` naming the kept work directory.
    """
    start = time.perf_counter()
    if engine not in ("ray", "local"):
        raise ValueError(f"engine={engine!r} must be 'ray' or 'local'")
    if not config.output:
        raise InputError("no output given: pass --output DIR")
    early: Plan | None = None
    early_tasks = None  # the text tasks, planned before Ray starts
    if engine == "ray":
        if text is not None:
            from raypack.tokenize.job import check_before_ray

            check_before_ray(config.inputs, text, config)  # inputs, tokenizer, ids: one line before Ray starts
        else:
            check_inputs_before_start(config)  # a mistyped input or a text file: one line before Ray starts
        if not (check_free_before_start(config.output, overwrite=config.overwrite, resume=resume) and resume):
            if text is None:  # every shard's footer: a bad one is one line before Ray starts, not after
                early = plan_before_start(config.output, resume=resume, plan=lambda: make_plan(config))
            else:  # every text file's footer, its text column: the same
                from raypack.tokenize.job import plan_text_tasks

                early_tasks = plan_before_start(config.output, resume=resume,
                                                plan=lambda: plan_text_tasks(config.inputs, text))
            connect_ray(config.address, verbose=verbose, worker_num_cpus=config.worker_num_cpus)
        # else an interrupted publish, which run_published finishes with no engine

    def plan() -> Plan | None:
        if engine == "ray":  # connected above, unless the output looked finished there; idempotent
            connect_ray(config.address, verbose=verbose, worker_num_cpus=config.worker_num_cpus)
        if text is not None:
            return None  # counts come from the tokenizing packers (raypack.tokenize.onepass)
        planned = early if early is not None else make_plan(config)
        check_output_outside_inputs(config.output, planned, config.inputs)
        return planned

    def write(target, planned: Plan | None):
        if planned is None:
            from raypack.tokenize.job import pack_text

            planned, settings, results = pack_text(target.work_dir, config, text, engine, resume,
                                                         tasks=early_tasks)
            return _finish(target, config, planned, settings, results)
        return _pack_into(target, config, planned, engine, resume)

    outcome = run_published(config.output, overwrite=config.overwrite, resume=resume, plan=plan, write=write,
                            finished=lambda: None)
    if outcome is None:  # --resume of a run interrupted while publishing: its publish finished
        return Summary(config.output, load_manifest(config.output), time.perf_counter() - start, engine=engine,
                       finished_publish=True)
    manifest, results = outcome
    kept = [r for r in results if not r.finished_at]  # a resume record's result (raypack.pack.resume)
    return Summary(config.output, manifest, time.perf_counter() - start,
                   max((r.peak_rss_bytes for r in results if r.finished_at), default=0), _pack_seconds(results), engine,
                   (len(kept), sum(r.num_tokens for r in kept)))


def _pack_seconds(results: list[ShardResult]) -> float:
    timed = [r for r in results if r.finished_at]
    return max(r.finished_at for r in timed) - min(r.started_at for r in timed) if timed else 0.0


def _pack_into(target: LocalOutput | ObjectStoreOutput, config: PackConfig, plan: Plan, engine: str,
               resume: bool) -> tuple[dict, list[ShardResult]]:
    settings = settings_for(config, plan, target.work_dir)
    base = local_run_base() if engine == "local" else None  # the first pass's peak is the run's too
    if plan.needs_counting_pass:
        plan = place_counts(plan, _count_tasks(plan, settings, config, engine))
    return _finish(target, config, plan, settings, _pack_shards(plan, settings, config, engine, resume, base))


def _finish(target: LocalOutput | ObjectStoreOutput, config: PackConfig, plan: Plan, settings: PackSettings,
            results: list[ShardResult]) -> tuple[dict, list[ShardResult]]:
    """Stitch the chunks at the tasks' edges, sweep, write the manifest (the commit)."""
    boundary_runs = stitch_boundaries(results, plan, settings)
    files = [r.file for r in results if r.file is not None] + write_boundaries(boundary_runs, settings)
    files = check_coverage(files, plan.num_chunks)
    target.sweep(keep={f.path for f in files})
    manifest = build_manifest(config, plan, files, count_stats(results, plan))
    if not plan.num_docs:  # a glob that matched only empty files made an empty output without a word
        log.warning("the inputs hold no documents (%d file%s, every one empty): the output holds no chunks; "
                    "check the inputs", len({s.path for s in plan.shards}), "" if len(plan.shards) == 1 else "s")
    write_manifest(target.work_dir, manifest)
    return manifest, results


def _pack_shards(plan: Plan, settings: PackSettings, config: PackConfig, engine: str, resume: bool,
                 base: int | None = None) -> list[ShardResult]:
    if resume:  # before this run's records take the task numbers of the runs before
        say_inputs_gone(settings.out_dir, (t.path for t in plan.tasks))
    kept = {t.task_index: r for t in plan.tasks if resume and (r := load_verified_result(t, settings))}
    todo = [t for t in plan.tasks if t.task_index not in kept]
    if kept:
        log.info("resume: %d of %d %s kept (verified), %d to pack", len(kept), len(plan.tasks),
                 _unit(plan), len(todo))
    if engine == "local" or not todo:
        packed = _pack_locally(todo, settings, config.num_workers, _unit(plan), base)
    else:
        packed = _pack_with_ray(todo, settings, config, _unit(plan))
    return sorted([*kept.values(), *packed], key=lambda r: r.task_index)


def _unit(plan: Plan) -> str:
    """What the progress lines count: shards, or tasks when a shard was split into several."""
    n = len(plan.shards)
    return "shards" if len(plan.tasks) == n else f"tasks ({n} shard{'' if n == 1 else 's'})"


def _count_tasks(plan: Plan, settings: PackSettings, config: PackConfig, engine: str) -> list[TaskCounts]:
    """The first pass: each task's chunk count (if its strategy counts) and long_docs' cuts, from
    document lengths alone."""
    if engine == "local" or not plan.tasks:
        return run_tasks(lambda task, stop: count_task(task, settings, stop), plan.tasks, config.num_workers)
    return _on_ray(config, lambda pipeline: pipeline.count_chunks(
        plan.tasks, settings, num_workers=config.num_workers, worker_num_cpus=config.worker_num_cpus),
        "a chunk counter (the first pass)")


def _pack_locally(tasks, settings: PackSettings, workers: int, unit: str = "shards",
                  base: int | None = None) -> list[ShardResult]:
    """This process, ``workers`` tasks at a time on threads (raypack.pack.local), with a progress line
    at most once a second. Each result's ``peak_rss_bytes`` is what this process grew by, at its
    peak, from the run's start to the task's end (:func:`raypack.pack.packer.local_run_base`). The chunk files
    are published (fsync, rename, resume record) on a background thread while the packers go on
    (:func:`raypack.pack.packer.local_publisher`), all of them before this returns (BENCHMARKS.md,
    2026-12-04: the fsyncs had left the cores idle). ``base``: :func:`local_run_base` taken before a first
    pass (best_fit, ``long_docs``), whose peak is the run's too (the summary left it out: a hostile trial)."""
    progress = Progress("packed", len(tasks), unit)
    base = local_run_base() if base is None else base
    with local_publisher(workers) as committer:
        results = run_tasks(lambda task, stop: pack_shard(task, settings, stop, committer), tasks, workers,
                            on_result=lambda r: progress.add(r.num_tokens))
    return [replace(r, peak_rss_bytes=max(0, r.peak_rss_bytes - base)) for r in results]


def _pack_with_ray(tasks, settings: PackSettings, config: PackConfig, unit: str = "shards") -> list[ShardResult]:
    progress = Progress("packed", len(tasks), unit)
    return _on_ray(config, lambda pipeline: pipeline.pack_shards(
        tasks, settings, num_workers=config.num_workers, worker_num_cpus=config.worker_num_cpus,
        on_result=lambda r: progress.add(r.num_tokens)), "a packer")


def _on_ray(config: PackConfig, run, what: str):
    """``run(pipeline)`` on Ray. Bad input and OSError come out unwrapped; any other failure of
    ``what`` (a worker that died, ...) as one :class:`WorkerError` line naming Ray's log directory."""
    engine().init_ray(config.address)
    return on_ray(run, what)
