"""One export run: check, lock, write the parts (here or in a local process pool), publish, verify.

Parallelism: one part per source shard (per chunk file for a chunk exporter); ``workers > 1``
writes parts in a local ``ProcessPoolExecutor`` (spawned processes; the exporter and the source
are pickled to them), ``workers == 1`` in this process. No Ray: exporting is reading and writing
bytes, which a few local processes saturate on one machine; a Ray version would put the pool in
raypack/engine/pipeline.py and keep this lifecycle. There is no ``--resume``: a failed export leaves
nothing and is rerun.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import posixpath
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.export import exporter_class
from raypack.export.base import Exporter, resolve_token_dtype
from raypack.export.sources import ChunkPart, Part, Source, open_source
from raypack.io.fs import resolve_filesystem
from raypack.io.lock import LocalLock
from raypack.io.progress import Progress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportSummary:
    description: str
    format: str
    source: Source
    num_parts: int
    seconds: float
    verify_lines: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        rate = self.source.num_tokens / self.seconds if self.seconds > 0 else 0.0
        return [f"exported {self.source.path} -> {self.description} ({self.format})",
                f"  documents {self.source.num_docs:>14,}",
                f"  tokens    {self.source.num_tokens:>14,}",
                f"  parts     {self.num_parts:>14,}",
                f"  time      {self.seconds:>14.2f}s  ({rate / 1e6:,.1f}M tokens/s)",
                *self.verify_lines]


def run_export(source_path: str, format: str, output: str, *, token_dtype: str | None = None, workers: int = 1,
               overwrite: bool = False, verify: bool = False) -> ExportSummary:
    """Export ``source_path`` (tokenized corpus or packed output) to ``output`` in ``format``."""
    start = time.perf_counter()
    if workers < 1:
        raise InputError(f"--workers {workers}: must be an integer >= 1")
    exporter, source = _open(source_path, format, output, token_dtype)
    lock = _lock(output)
    try:
        _check_free(exporter, overwrite)
        num_parts = _write(exporter, source, workers)
    finally:
        if lock is not None:
            lock.release()
    lines = tuple(exporter.verify(source)) if verify else ()
    return ExportSummary(exporter.describe(), format, source, num_parts, time.perf_counter() - start, lines)


def verify_export(source_path: str, format: str, output: str, *, token_dtype: str | None = None) -> list[str]:
    """Compare an existing export with its source (raises ExportMismatch at the first difference)."""
    exporter, source = _open(source_path, format, output, token_dtype)
    exporter.dtype_given = token_dtype is not None  # else the export's own (it was refused as a mismatch)
    return exporter.verify(source)


def _open(source_path: str, format: str, output: str, token_dtype: str | None) -> tuple[Exporter, Source]:
    cls = exporter_class(format)
    if not output:
        raise InputError("no output given: pass --output PREFIX")
    source = open_source(source_path, cls.unit)
    if source.extra_columns:
        raise InputError(f"{source_path} has side columns ({', '.join(source.extra_columns)}); the {format} format "
                         "has no place for them and exporting only the tokens would drop them: train from the packed "
                         "output (raypack.torch_data) or pack again without --extra-columns to export")
    if source.kind not in cls.source_kinds:
        raise InputError(f"{source_path} is a {source.kind} output; the {format} format exports "
                         f"{' or '.join(sorted(cls.source_kinds))} sources: {_KIND_FIXES[source.kind]}")
    return cls(output, resolve_token_dtype(cls, source, token_dtype)), source


_KIND_FIXES = {"tokenized": "pack it first (raypack pack --input SRC --output PACKED --context-length N), then export "
                            "PACKED",
               "packed": "export the tokenized corpus it was packed from"}


def _lock(output: str) -> LocalLock | None:
    """The local lock beside the output (``.<name>.raypack-lock``); none on an object store."""
    fs, path = resolve_filesystem(output)
    if not isinstance(fs, pafs.LocalFileSystem):
        return None
    parent, name = posixpath.split(path.rstrip("/"))
    lock = LocalLock(posixpath.join(parent, f".{name}.raypack-lock"), what=f"output {output}")
    lock.acquire()
    return lock


def _check_free(exporter: Exporter, overwrite: bool) -> None:
    for path in exporter.output_paths():
        fs, fs_path = resolve_filesystem(path)
        if fs.get_file_info(fs_path).type != pafs.FileType.NotFound and not overwrite:
            raise InputError(f"{path} exists; pass --overwrite to replace it ({exporter.overwrite_note})")


def _write(exporter: Exporter, source: Source, workers: int) -> int:
    """Prepare, write every part, finalize (abort on any error); the number of parts."""
    parts = source.chunk_parts() if exporter.unit == "chunks" else source.parts
    progress = Progress("exported", len(parts), "parts")
    exporter.prepare(source)
    try:
        results = _run_parts(exporter, source, parts, workers, progress)
        exporter.finalize(source, results)
    except BaseException as e:
        exporter.abort()
        if isinstance(e, OSError) and e.errno in _DISK_ERRORS:
            raise InputError(f"writing the export failed: {e.strerror} ({e.filename or exporter.describe()}); "
                             "nothing was published; free space (or fix the permission) and run again") from e
        raise
    return len(parts)


_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES})
"""Errors writing an export that the user fixes on the disk: one line, not a traceback (pack does the same)."""


def _run_parts(exporter: Exporter, source: Source, parts: list[Part] | list[ChunkPart], workers: int,
               progress: Progress) -> list[Any]:
    if workers == 1 or len(parts) <= 1:
        results = []
        for part in parts:
            results.append(write_part(exporter, source, part))
            progress.add(part.num_tokens)
        return results
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(parts)), mp_context=context,
                             initializer=_leave_quietly_on_ctrl_c) as pool:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # the processes start with it blocked
        try:
            futures = [pool.submit(write_part, exporter, source, part) for part in parts]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        try:
            for part, future in zip(parts, futures):
                future.result()
                progress.add(part.num_tokens)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        return [f.result() for f in futures]


def _leave_quietly_on_ctrl_c() -> None:
    """In a pool process: a Ctrl-C (the terminal signals the whole process group) ends it at once,
    without a KeyboardInterrupt traceback; the driver says the one line and removes the parts. The
    process starts with SIGINT blocked (a Ctrl-C while it imports waits until here)."""
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(128 + signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def write_part(exporter: Exporter, source: Source, part: Part | ChunkPart) -> Any:
    """One part (runs in a pool process or here): its documents or chunks, by the exporter's unit."""
    return exporter.write_part(part, source.chunks(part) if exporter.unit == "chunks" else source.batches(part))
