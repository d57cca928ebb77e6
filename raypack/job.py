"""One packing run, start to finish: plan, pack the shards, stitch, publish.

Everything is written into a staging directory beside the output,
``.<name>.raypack-staging-partial``, and published by renaming it into place only after the
manifest is written. So:
  * bad input (found while planning or while packing) and a full disk leave nothing behind;
  * ``overwrite`` replaces the old output only once the new one is complete;
  * a run that dies for any other reason (a crash, a lost cluster, Ctrl-C) keeps its staging
    directory, and ``resume`` finishes it: shards whose recorded result and file still verify
    are kept, the rest are packed again. The result is byte-identical to a clean run.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import shutil
import time
from dataclasses import dataclass

from raypack.assemble import build_manifest, check_coverage, count_stats, stitch_boundaries, write_boundaries
from raypack.config import PackConfig
from raypack.errors import InputError
from raypack.output import MANIFEST_NAME, TMP_PREFIX, write_manifest
from raypack.plan import Plan, check_output_outside_inputs, make_plan, settings_for
from raypack.resume import RESULTS_DIR, load_verified_result
from raypack.shard_pack import pack_shard
from raypack.tasks import PackSettings, ShardResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Summary:
    output: str
    manifest: dict
    seconds: float
    """Wall time of planning, packing and publishing (Ray start-up excluded)."""
    peak_worker_rss_bytes: int = 0
    """The largest peak resident memory of any packing process."""
    pack_seconds: float = 0.0
    """From the first shard's start to the last shard's end (excludes engine start-up)."""

    def lines(self) -> list[str]:
        c = self.manifest["counts"]
        positions = c["chunks"] * self.manifest["context_length"]
        pad_pct = 100.0 * c["padding_positions"] / positions if positions else 0.0
        split_pct = 100.0 * c["split_documents"] / c["documents"] if c["documents"] else 0.0
        rate = c["tokens"] / self.seconds if self.seconds > 0 else 0.0
        return [
            f"packed {self.output}",
            f"  documents        {c['documents']:>14,}",
            f"  tokens           {c['tokens']:>14,}",
            f"  chunks           {c['chunks']:>14,}  of {self.manifest['context_length']} tokens",
            f"  padding          {c['padding_positions']:>14,}  ({pad_pct:.3f}% of positions)",
            f"  split documents  {c['split_documents']:>14,}  ({split_pct:.2f}% of documents)",
            f"  files            {len(self.manifest['files']):>14,}",
            f"  time             {self.seconds:>14.2f}s  ({rate / 1e6:,.1f}M tokens/s, start-up included)",
            f"  packing          {self.pack_seconds:>14.2f}s  (first shard start to last shard end)",
            f"  peak packer RSS  {self.peak_worker_rss_bytes / 2**20:>14,.0f} MiB",
        ]


def run_pack(config: PackConfig, *, engine: str = "ray", resume: bool = False) -> Summary:
    """Pack ``config.inputs`` into ``config.output``. ``engine``: "ray" or "local" (one process)."""
    start = time.perf_counter()
    if not config.output:
        raise InputError("no output given: pass --output DIR")
    staging = staging_dir(config.output)
    _check_output_free(config, staging, resume)
    plan = make_plan(config)
    check_output_outside_inputs(config.output, plan)
    if config.overwrite and not resume:
        shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging, exist_ok=True)
    try:
        manifest, results = _pack_into(staging, config, plan, engine, resume)
        _publish(staging, config.output)
    except BaseException as e:
        _after_failure(e, staging)
        raise
    return Summary(config.output, manifest, time.perf_counter() - start,
                   max((r.peak_rss_bytes for r in results), default=0), _pack_seconds(results))


def _pack_seconds(results: list[ShardResult]) -> float:
    timed = [r for r in results if r.finished_at]
    return max(r.finished_at for r in timed) - min(r.started_at for r in timed) if timed else 0.0


def _pack_into(staging: str, config: PackConfig, plan: Plan, engine: str, resume: bool) -> tuple[dict, list[ShardResult]]:
    settings = settings_for(config, plan, staging)
    results = _pack_shards(plan, settings, config, engine, resume)
    boundary_runs = stitch_boundaries(results, plan, settings)
    files = [r.file for r in results if r.file is not None] + write_boundaries(boundary_runs, settings)
    files = check_coverage(files, plan.num_chunks)
    _sweep(staging)
    manifest = build_manifest(config, plan, files, count_stats(results, plan))
    write_manifest(staging, manifest)
    return manifest, results


def _pack_shards(plan: Plan, settings: PackSettings, config: PackConfig, engine: str, resume: bool) -> list[ShardResult]:
    kept = {t.shard_index: r for t in plan.tasks if resume and (r := load_verified_result(t, settings))}
    todo = [t for t in plan.tasks if t.shard_index not in kept]
    if kept:
        log.info("resume: %d of %d shards kept (verified), %d to pack", len(kept), len(plan.tasks), len(todo))
    if engine not in ("ray", "local"):
        raise ValueError(f"engine={engine!r} must be 'ray' or 'local'")
    if engine == "local" or not todo:
        packed = _pack_locally(todo, settings)
    else:
        packed = _pack_with_ray(todo, settings, config)
    return sorted([*kept.values(), *packed], key=lambda r: r.shard_index)


def _pack_locally(tasks, settings: PackSettings) -> list[ShardResult]:
    """One process, shard after shard, with a progress line at most once a second."""
    results, last_report = [], time.monotonic()
    for done, task in enumerate(tasks, start=1):
        results.append(pack_shard(task, settings))
        if time.monotonic() - last_report >= 1.0 or done == len(tasks):
            tokens = sum(r.num_tokens for r in results)
            log.info("packed %d/%d shards (%s tokens)", done, len(tasks), f"{tokens:,}")
            last_report = time.monotonic()
    return results


def _pack_with_ray(tasks, settings: PackSettings, config: PackConfig) -> list[ShardResult]:
    from raypack import pipeline

    pipeline.init_ray(config.address)
    try:
        return pipeline.pack_shards(tasks, settings, num_workers=config.num_workers,
                                    worker_num_cpus=config.worker_num_cpus)
    except Exception as e:
        cause = pipeline.original_error(e)
        if isinstance(cause, (InputError, OSError)):
            raise cause from e
        raise


def staging_dir(output: str) -> str:
    parent, name = os.path.split(os.path.abspath(output))
    return os.path.join(parent, f".{name}.raypack-staging-partial")


def _check_output_free(config: PackConfig, staging: str, resume: bool) -> None:
    out = config.output
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"output {out} exists and is not a directory")
    if os.path.isdir(staging) and not (resume or config.overwrite):
        raise InputError(f"an earlier run into {out} did not finish (its work is in {staging}); "
                         f"pass --resume to finish it or --overwrite to start over")
    if os.path.isdir(out) and os.listdir(out) and not config.overwrite:
        if resume and os.path.exists(os.path.join(out, MANIFEST_NAME)) and not os.path.isdir(staging):
            raise InputError(f"output {out} is already complete; nothing to resume")
        raise InputError(f"output directory {out} is not empty; pass --overwrite to replace it "
                         f"(the old output is removed only after the new one is complete)")


def _sweep(staging: str) -> None:
    """Drop what killed attempts left (temporary files) and the resume records."""
    for path in glob.glob(os.path.join(staging, f"{TMP_PREFIX}*")):
        os.remove(path)
    shutil.rmtree(os.path.join(staging, RESULTS_DIR), ignore_errors=True)


def _after_failure(error: BaseException, staging: str) -> None:
    """Bad input and a full disk leave nothing; anything else keeps the work for --resume."""
    if isinstance(error, InputError) or (isinstance(error, OSError) and error.errno == errno.ENOSPC):
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError):
            raise InputError(f"writing the output failed: {error.strerror} ({error.filename or staging}); "
                             f"nothing was published; free space and run again") from error
    else:
        log.error("the run failed; its finished shards are kept in %s: rerun with --resume to finish it", staging)


def _publish(staging: str, output: str) -> None:
    """Move the complete staging directory to ``output``, replacing what was there."""
    old = None
    if os.path.exists(output):
        old = f"{staging[:-len('-partial')]}-old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(output, old)
    os.replace(staging, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
