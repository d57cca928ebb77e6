"""One packing run, start to finish: plan, pack the shards, stitch, publish.

Where the output lives decides how it is published (:func:`output_target`):

A local directory (:class:`LocalOutput`): everything is written into a staging directory
beside the output, ``.<name>.raypack-staging-partial``, and published by renaming it into
place only after the manifest is written. So:
  * bad input (found while planning or while packing) and a full disk leave nothing behind;
  * ``overwrite`` replaces the old output only once the new one is complete;
  * a run that dies for any other reason (a crash, a lost cluster, Ctrl-C) keeps its staging
    directory, and ``resume`` finishes it: shards whose recorded result and file still verify
    are kept, the rest are packed again. The result is byte-identical to a clean run.

An object-store prefix such as ``s3://bucket/out`` (:class:`ObjectStoreOutput`; any
non-local filesystem): there is no rename, so the manifest is the commit marker. Data objects
are written straight under the prefix (each appears only once its upload completes), the
resume records under ``_results/``; then every object the new manifest does not list is
deleted, and ``manifest.json`` is written last. Readers refuse a prefix without a manifest.
``overwrite`` deletes the old manifest before packing starts, so the old output stops being
readable before any of its objects is replaced. Bad input deletes everything under the
prefix; any other failure keeps the work (no manifest) for ``resume``, exactly as locally.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import logging
import os
import posixpath
import shutil
import time
from dataclasses import dataclass

import pyarrow.fs as pafs

from raypack.assemble import build_manifest, check_coverage, count_stats, stitch_boundaries, write_boundaries
from raypack.config import PackConfig
from raypack.errors import InputError
from raypack.output import MANIFEST_NAME, TMP_PREFIX, write_manifest
from raypack.plan import Plan, check_output_outside_inputs, make_plan, place_chunks, settings_for
from raypack.resume import RESULTS_DIR, load_verified_result
from raypack.shard_pack import count_shard_chunks, pack_shard
from raypack.shards import bucket_of, check_bucket, resolve_filesystem
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
        strategy = self.manifest.get("strategy", "concat")
        if strategy == "best_fit":
            strategy += f", windows of {self.manifest['best_fit_window']:,} documents" if self.manifest["best_fit_window"] else ", whole-shard windows"
        return [
            f"packed {self.output} ({strategy})",
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
    if engine not in ("ray", "local"):
        raise ValueError(f"engine={engine!r} must be 'ray' or 'local'")
    if not config.output:
        raise InputError("no output given: pass --output DIR")
    target = output_target(config.output)
    target.check_free(overwrite=config.overwrite, resume=resume)
    plan = make_plan(config)
    check_output_outside_inputs(config.output, plan)
    target.prepare(fresh=config.overwrite and not resume)
    try:
        manifest, results = _pack_into(target, config, plan, engine, resume)
        target.publish()
    except BaseException as e:
        target.after_failure(e)
        raise
    return Summary(config.output, manifest, time.perf_counter() - start,
                   max((r.peak_rss_bytes for r in results), default=0), _pack_seconds(results))


def _pack_seconds(results: list[ShardResult]) -> float:
    timed = [r for r in results if r.finished_at]
    return max(r.finished_at for r in timed) - min(r.started_at for r in timed) if timed else 0.0


def _pack_into(target: LocalOutput | ObjectStoreOutput, config: PackConfig, plan: Plan, engine: str,
               resume: bool) -> tuple[dict, list[ShardResult]]:
    settings = settings_for(config, plan, target.work_dir)
    if config.strategy == "best_fit":
        plan = place_chunks(plan, _count_chunks(plan, settings, config, engine))
    results = _pack_shards(plan, settings, config, engine, resume)
    boundary_runs = stitch_boundaries(results, plan, settings)
    files = [r.file for r in results if r.file is not None] + write_boundaries(boundary_runs, settings)
    files = check_coverage(files, plan.num_chunks)
    target.sweep(keep={f.path for f in files})
    manifest = build_manifest(config, plan, files, count_stats(results, plan))
    write_manifest(target.work_dir, manifest)
    return manifest, results


def _pack_shards(plan: Plan, settings: PackSettings, config: PackConfig, engine: str, resume: bool) -> list[ShardResult]:
    kept = {t.shard_index: r for t in plan.tasks if resume and (r := load_verified_result(t, settings))}
    todo = [t for t in plan.tasks if t.shard_index not in kept]
    if kept:
        log.info("resume: %d of %d shards kept (verified), %d to pack", len(kept), len(plan.tasks), len(todo))
    if engine == "local" or not todo:
        packed = _pack_locally(todo, settings)
    else:
        packed = _pack_with_ray(todo, settings, config)
    return sorted([*kept.values(), *packed], key=lambda r: r.shard_index)


def _count_chunks(plan: Plan, settings: PackSettings, config: PackConfig, engine: str) -> list[int]:
    """best_fit's first pass: each shard's chunk count, from document lengths alone."""
    if engine == "local" or not plan.tasks:
        return [count_shard_chunks(t, settings) for t in plan.tasks]
    return _on_ray(config, lambda pipeline: pipeline.count_chunks(
        plan.tasks, settings, num_workers=config.num_workers, worker_num_cpus=config.worker_num_cpus))


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
    return _on_ray(config, lambda pipeline: pipeline.pack_shards(
        tasks, settings, num_workers=config.num_workers, worker_num_cpus=config.worker_num_cpus))


def _on_ray(config: PackConfig, run):
    """``run(pipeline)`` on Ray; the user's InputError/OSError comes out unwrapped."""
    from raypack import pipeline

    pipeline.init_ray(config.address)
    try:
        return run(pipeline)
    except Exception as e:
        cause = pipeline.original_error(e)
        if isinstance(cause, (InputError, OSError)):
            raise cause from e
        raise


def staging_dir(output: str) -> str:
    parent, name = os.path.split(os.path.abspath(output))
    return os.path.join(parent, f".{name}.raypack-staging-partial")


def output_target(output: str) -> LocalOutput | ObjectStoreOutput:
    """How ``output`` (a local path or a URI) is written and published."""
    if "://" not in output:
        return LocalOutput(output)
    fs, base = resolve_filesystem(output)
    if isinstance(fs, pafs.LocalFileSystem):
        return LocalOutput(base)
    return ObjectStoreOutput(output.rstrip("/"), fs, base)


class LocalOutput:
    """A local directory, published by renaming a complete staging directory into its place."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.work_dir = staging_dir(output)
        """Where the run writes: the staging directory."""

    def check_free(self, *, overwrite: bool, resume: bool) -> None:
        out, staging = self.output, self.work_dir
        if os.path.exists(out) and not os.path.isdir(out):
            raise InputError(f"output {out} exists and is not a directory")
        if os.path.isdir(staging) and not (resume or overwrite):
            raise InputError(f"an earlier run into {out} did not finish (its work is in {staging}); "
                             f"pass --resume to finish it or --overwrite to start over")
        if os.path.isdir(out) and os.listdir(out) and not overwrite:
            if resume and os.path.exists(os.path.join(out, MANIFEST_NAME)) and not os.path.isdir(staging):
                raise InputError(f"output {out} is already complete; nothing to resume")
            raise InputError(f"output directory {out} is not empty; pass --overwrite to replace it "
                             f"(the old output is removed only after the new one is complete)")

    def prepare(self, *, fresh: bool) -> None:
        if fresh:
            shutil.rmtree(self.work_dir, ignore_errors=True)
        os.makedirs(self.work_dir, exist_ok=True)

    def sweep(self, keep: set[str]) -> None:
        """Drop what killed attempts left (temporary files) and the resume records."""
        for path in glob.glob(os.path.join(self.work_dir, f"{TMP_PREFIX}*")):
            os.remove(path)
        shutil.rmtree(os.path.join(self.work_dir, RESULTS_DIR), ignore_errors=True)

    def publish(self) -> None:
        """Move the complete staging directory to the output, replacing what was there."""
        staging, output = self.work_dir, self.output
        old = None
        if os.path.exists(output):
            old = f"{staging[:-len('-partial')]}-old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(output, old)
        os.replace(staging, output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def after_failure(self, error: BaseException) -> None:
        """Bad input and a full disk leave nothing; anything else keeps the work for --resume."""
        staging = self.work_dir
        if isinstance(error, InputError) or (isinstance(error, OSError) and error.errno == errno.ENOSPC):
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(error, OSError):
                raise InputError(f"writing the output failed: {error.strerror} ({error.filename or staging}); "
                                 f"nothing was published; free space and run again") from error
        else:
            log.error("the run failed; its finished shards are kept in %s: rerun with --resume to finish it", staging)


class ObjectStoreOutput:
    """A prefix of an object store (any non-local filesystem). No rename: the manifest is the commit."""

    def __init__(self, output: str, fs: pafs.FileSystem, base: str) -> None:
        self.output = output
        self.work_dir = output
        """Where the run writes: the output prefix itself."""
        self._fs = fs
        self._base = base.rstrip("/")

    def check_free(self, *, overwrite: bool, resume: bool) -> None:
        out = self.output
        if self._base.strip("/") in ("", bucket_of(self._fs, self._base)):
            raise InputError(f"output {out} is the root of a bucket or filesystem; give a prefix inside it "
                             f"(e.g. {out.rstrip('/')}/packed), which the run may empty")
        try:
            check_bucket(self._fs, self._base, f"output {out}")
            if self._fs.get_file_info(self._base).type == pafs.FileType.File:
                raise InputError(f"output {out} exists and is an object, not a prefix")
            names = self._names()
        except OSError as e:
            raise InputError(f"cannot list the output {out} ({e}); check the credentials and the endpoint") from e
        if not names or overwrite:
            return
        complete = MANIFEST_NAME in names
        ours = all(_is_run_object(n) for n in names)
        if resume and complete:
            raise InputError(f"output {out} is already complete; nothing to resume")
        if ours and not complete:
            if resume:
                return
            raise InputError(f"an earlier run into {out} did not finish (its objects are there, without a "
                             f"{MANIFEST_NAME}); pass --resume to finish it or --overwrite to start over")
        raise InputError(f"output {out} is not empty (it holds {names[0]}, ...); pass --overwrite to replace it "
                         f"(on an object store the old {MANIFEST_NAME} is deleted when packing starts, and "
                         f"the old objects just before the new manifest is written)")

    def prepare(self, *, fresh: bool) -> None:
        if fresh:  # the old output stops being readable before any of its objects is replaced
            self._delete([n for n in self._names() if n == MANIFEST_NAME or n.startswith(f"{RESULTS_DIR}/")])

    def sweep(self, keep: set[str]) -> None:
        """Delete every object the new manifest will not list: resume records, leftovers, an old output."""
        self._delete([n for n in self._names() if n not in keep])

    def publish(self) -> None:
        """Nothing to do: the manifest, written last, published the output."""

    def after_failure(self, error: BaseException) -> None:
        """Bad input leaves nothing (everything under the prefix is deleted); anything else keeps the work."""
        if isinstance(error, InputError):
            try:
                self._fs.delete_dir(self._base)
            except FileNotFoundError:
                pass
        else:
            log.error("the run failed; its finished shards are kept under %s (no %s, so nothing is readable): "
                      "rerun with --resume to finish it", self.output, MANIFEST_NAME)

    def _names(self) -> list[str]:
        """Every object under the prefix, relative to it, sorted."""
        selector = pafs.FileSelector(self._base, recursive=True, allow_not_found=True)
        return sorted(posixpath.relpath(i.path, self._base) for i in self._fs.get_file_info(selector)
                      if i.type == pafs.FileType.File)

    def _delete(self, names: list[str]) -> None:
        if any(n.startswith(f"{RESULTS_DIR}/") for n in names):  # one bulk delete for the records
            try:
                self._fs.delete_dir(posixpath.join(self._base, RESULTS_DIR))
            except FileNotFoundError:
                pass
        for name in names:
            if not name.startswith(f"{RESULTS_DIR}/"):
                try:
                    self._fs.delete_file(posixpath.join(self._base, name))
                except FileNotFoundError:
                    pass


def _is_run_object(name: str) -> bool:
    """An object a raypack run writes under its output prefix."""
    return (name == MANIFEST_NAME or name.startswith(f"{RESULTS_DIR}/")
            or ("/" not in name and fnmatch.fnmatchcase(name, "chunks-*.arrow")))
