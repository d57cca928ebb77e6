"""One packing run, start to finish: plan, pack the shards, stitch, publish.

Everything is written into a staging directory beside the output and published by renaming
it into place only after the manifest is written, so a failed run leaves no output behind and
``overwrite`` replaces the old output only once the new one is complete.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass

from raypack.assemble import build_manifest, check_coverage, count_stats, stitch_boundaries, write_boundaries
from raypack.config import PackConfig
from raypack.errors import InputError
from raypack.output import write_manifest
from raypack.plan import Plan, check_output_outside_inputs, make_plan, settings_for
from raypack.shard_pack import ShardResult, pack_shard

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Summary:
    output: str
    manifest: dict
    seconds: float
    """Wall time of planning, packing and publishing (Ray start-up excluded)."""
    peak_worker_rss_bytes: int = 0
    """The largest peak resident memory of any packing process."""

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
            f"  time             {self.seconds:>14.2f}s  ({rate / 1e6:,.1f}M tokens/s)",
        ]


def run_pack(config: PackConfig, *, engine: str = "ray") -> Summary:
    """Pack ``config.inputs`` into ``config.output``. ``engine``: "ray" or "local" (one process)."""
    start = time.perf_counter()
    if not config.output:
        raise InputError("no output given: pass --output DIR")
    _check_output_free(config)
    plan = make_plan(config)
    check_output_outside_inputs(config.output, plan)
    staging = _staging_dir(config.output)
    try:
        manifest, results = _pack_into(staging, config, plan, engine)
        _publish(staging, config.output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    peak = max((r.peak_rss_bytes for r in results), default=0)
    return Summary(config.output, manifest, time.perf_counter() - start, peak)


def _pack_into(staging: str, config: PackConfig, plan: Plan, engine: str) -> tuple[dict, list[ShardResult]]:
    settings = settings_for(config, plan, staging)
    results = _pack_shards(plan, settings, config, engine)
    boundary_runs = stitch_boundaries(results, plan, settings)
    files = [r.file for r in results if r.file is not None] + write_boundaries(boundary_runs, settings)
    files = check_coverage(files, plan.num_chunks)
    manifest = build_manifest(config, plan, files, count_stats(results, plan))
    write_manifest(staging, manifest)
    return manifest, results


def _pack_shards(plan: Plan, settings, config: PackConfig, engine: str) -> list[ShardResult]:
    if engine == "local" or not plan.tasks:
        return [pack_shard(task, settings) for task in plan.tasks]
    if engine != "ray":
        raise ValueError(f"engine={engine!r} must be 'ray' or 'local'")
    from raypack import pipeline

    pipeline.init_ray(config.address)
    try:
        return pipeline.pack_shards(plan.tasks, settings, num_workers=config.num_workers,
                                    worker_num_cpus=config.worker_num_cpus)
    except Exception as e:
        cause = pipeline.original_error(e)
        if isinstance(cause, InputError):
            raise InputError(str(cause)) from e
        raise


def _check_output_free(config: PackConfig) -> None:
    out = config.output
    if os.path.exists(out) and not os.path.isdir(out):
        raise InputError(f"output {out} exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out) and not config.overwrite:
        raise InputError(f"output directory {out} is not empty; pass --overwrite to replace it "
                         f"(the old output is removed only after the new one is complete)")


def _staging_dir(output: str) -> str:
    parent, name = os.path.split(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, f".{name}.raypack-staging-{uuid.uuid4().hex[:12]}")
    os.makedirs(staging)
    return staging


def _publish(staging: str, output: str) -> None:
    """Move the complete staging directory to ``output``, replacing what was there."""
    old = None
    if os.path.exists(output):
        old = f"{staging}-old"
        os.replace(output, old)
    os.replace(staging, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
