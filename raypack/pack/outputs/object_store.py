"""An object-store output (:class:`ObjectStoreOutput`): a prefix such as ``s3://bucket/out`` (any
non-local filesystem). There is no rename, so the manifest is the commit marker.

Data objects are written straight under the prefix (each appears only once its upload completes),
the resume records under ``_results/``; then every object the new manifest does not list is
deleted, and ``manifest.json`` is written last. Readers refuse a prefix without a manifest.
``overwrite`` deletes the old manifest before packing starts, so the old output stops being
readable before any of its objects is replaced. Bad input deletes everything under the prefix;
any other failure keeps the work (no manifest) for ``resume``, exactly as locally.
"""

from __future__ import annotations

import logging
import posixpath

import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.io.fs import bucket_of, check_bucket
from raypack.io.lock import ObjectStoreLock
from raypack.pack.outputs.base import is_run_object, refuse_damaged, refuse_foreign
from raypack.pack.resume import RESULTS_DIR
from raypack.packed.writer import MANIFEST_NAME

__all__ = ["ObjectStoreOutput"]

log = logging.getLogger(__name__)


class ObjectStoreOutput:
    """A prefix of an object store (any non-local filesystem). No rename: the manifest is the commit."""

    def __init__(self, output: str, fs: pafs.FileSystem, base: str) -> None:
        self.output = output
        self.work_dir = output
        """Where the run writes: the output prefix itself."""
        self._fs = fs
        self._base = base.rstrip("/")
        self.lock = ObjectStoreLock(fs, posixpath.join(self._base, ObjectStoreLock.NAME), what=f"output {output}")

    def acquire(self) -> None:
        """Check the prefix can be an output, then take its lock."""
        out = self.output
        if self._base.strip("/") in ("", bucket_of(self._fs, self._base)):
            raise InputError(f"output {out} is the root of a bucket or filesystem; give a prefix inside it "
                             f"(e.g. {out.rstrip('/')}/packed), which the run may empty")
        try:
            check_bucket(self._fs, self._base, f"output {out}")
        except OSError as e:
            raise InputError(f"cannot reach the output {out} ({e}); check the credentials and the endpoint") from e
        self.lock.acquire()

    def check_publishable(self) -> None:
        """Any prefix takes objects."""

    def recover(self, resume: bool = False) -> bool:
        """Nothing to recover: the manifest, written last, is the only commit."""
        return False

    def check_free(self, *, overwrite: bool, resume: bool) -> None:
        out = self.output
        try:
            if self._fs.get_file_info(self._base).type == pafs.FileType.File:
                raise InputError(f"output {out} exists and is an object, not a prefix")
            names = [n for n in self._names() if n != ObjectStoreLock.NAME]
        except OSError as e:
            raise InputError(f"cannot list the output {out} ({e}); check the credentials and the endpoint") from e
        refuse_foreign(out, [n for n in names if not is_run_object(n)], overwrite=overwrite)
        if not names or overwrite:
            return
        complete = MANIFEST_NAME in names
        ours = all(is_run_object(n) for n in names)
        if resume and complete:
            refuse_damaged(out)
            raise InputError(f"output {out} is already complete; nothing to resume (to pack it again, with other "
                             "inputs or settings, pass --overwrite instead of --resume)")
        if ours and not complete:
            if resume:
                return
            raise InputError(f"an earlier run into {out} did not finish (its objects are there, without a "
                             f"{MANIFEST_NAME}); pass --resume to finish it or --overwrite to start over")
        raise InputError(f"output {out} is not empty (it holds {names[0]}, ...); pass --overwrite to replace it "
                         f"(on an object store the old {MANIFEST_NAME} is deleted when packing starts, and "
                         f"the old objects just before the new manifest is written)")

    def holds_finished_work(self) -> bool:
        """Not listed here (a listing can be slow): say there may be some."""
        return True

    def keep_for_resume(self, error: InputError) -> None:
        """Nothing: bad input deletes what is under the prefix (:meth:`after_failure`)."""

    def discard(self) -> None:
        """Nothing: the prefix may hold an old output's objects, and one without a manifest is no output."""

    def prepare(self, *, fresh: bool, resume: bool = False) -> None:
        if fresh:  # the old output stops being readable before any of its objects is replaced
            self._delete([n for n in self._names() if n == MANIFEST_NAME or n.startswith(f"{RESULTS_DIR}/")])

    def sweep(self, keep: set[str]) -> None:
        """Delete every object the new manifest will not list: resume records, leftovers, an old output."""
        self._delete([n for n in self._names() if n not in keep and n != ObjectStoreLock.NAME])

    def publish(self) -> None:
        """Nothing to do: the manifest, written last, published the output."""

    def after_stop(self) -> None:
        """Nothing: a stop does not wait on the store (it may be what stopped answering); the next run clears this
        run's temporary uploads."""

    def after_failure(self, error: BaseException) -> None:
        """Bad input leaves nothing (everything under the prefix is deleted); anything else keeps the work."""
        if isinstance(error, InputError):
            try:
                self._fs.delete_dir(self._base)  # the lock object too: releasing it tolerates that
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

