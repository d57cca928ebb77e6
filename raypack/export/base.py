"""The export seam: what a format module provides (:class:`Exporter`) and the token cast all share.

A format is one module with one :class:`Exporter` subclass, registered by one line in
``raypack/export/__init__.py``. The lifecycle (:func:`raypack.export.job.run_export`) is:

  1. driver: ``cls(output, token_dtype)``; the run refuses outputs whose ``output_paths()`` exist
     (without ``--overwrite``), then calls ``prepare(source)``;
  2. parts, possibly in other processes (the exporter is pickled after ``prepare``):
     ``write_part(part, batches)`` for each source part, by the exporter's ``unit``:
     "documents": a :class:`Part` per source shard, ``batches`` its whole documents in order
     (:class:`DocumentBatch`); "chunks" (packed sources only, any strategy): a :class:`ChunkPart`
     per chunk file, ``batches`` its chunks in order (:class:`raypack.rules.core.Chunks` views, the
     source's dtype). It returns a small picklable result;
  3. driver: ``finalize(results)`` with the results in part order; it publishes the output so that
     nothing is readable until all of it is (the last file written is the commit); on any error
     ``abort()`` instead, which removes everything not yet published;
  4. ``verify(source)`` (``--verify`` / ``--verify-only``) compares a published output with its source
     and returns report lines, raising :class:`ExportMismatch` at the first difference.

Exporters are pure numpy/pyarrow and do their I/O through :mod:`raypack.io.fs` (any filesystem).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Iterator

import numpy as np
import numpy.typing as npt

from raypack.errors import InputError
from raypack.export.sources import ChunkPart, DocumentBatch, Part, Source
from raypack.rules.core import Chunks


class ExportMismatch(Exception):
    """An export differs from its source (``--verify``); the message names where."""


class Exporter(ABC):
    """One output format. Subclasses set the class attributes and the abstract methods."""

    name: ClassVar[str]
    """The ``--format`` value."""
    summary: ClassVar[str]
    """One line for ``raypack export --help``."""
    token_dtypes: ClassVar[tuple[str, ...]]
    """Token dtypes the format can hold (numpy names)."""
    source_kinds: ClassVar[frozenset[str]] = frozenset({"tokenized", "packed"})
    unit: ClassVar[str] = "documents"
    """What a part streams to :meth:`write_part`: "documents" or "chunks" (module docstring)."""
    overwrite_note: ClassVar[str] = "the old output stays readable until the new one is complete"
    """What ``--overwrite`` does to an existing output, for the refusal without it."""

    def __init__(self, output: str, token_dtype: np.dtype) -> None:
        self.output = output
        self.token_dtype = np.dtype(token_dtype)
        self.dtype_given = True
        """False for ``--verify-only`` without ``--token-dtype``: :meth:`verify` takes the export's own."""

    @abstractmethod
    def output_paths(self) -> list[str]:
        """Every path (or URI) the export publishes; any that exists needs ``--overwrite``."""

    def prepare(self, source: Source) -> None:
        """Driver, before any part: make what the parts write into."""

    @abstractmethod
    def write_part(self, part: Part | ChunkPart, batches: Iterator[DocumentBatch] | Iterator[Chunks]) -> Any:
        """Write one part's documents or chunks (cast with :func:`cast_tokens`); return a picklable result."""

    @abstractmethod
    def finalize(self, source: Source, results: list[Any]) -> None:
        """Driver: merge the parts' results (in part order) and publish the output, commit last."""

    def abort(self) -> None:
        """Driver, on failure: remove everything the run wrote that is not published."""

    @abstractmethod
    def verify(self, source: Source) -> list[str]:
        """Compare the published output with ``source``; report lines, or raise ExportMismatch."""

    def describe(self) -> str:
        """What was written, for the summary's first line."""
        return self.output


def resolve_token_dtype(cls: type[Exporter], source: Source, requested: str | None) -> np.dtype:
    """The dtype to write: ``requested``, else the source's; InputError naming a fix when the format cannot hold it."""
    dtype = np.dtype(requested) if requested else source.token_dtype
    if dtype.name in cls.token_dtypes:
        if requested and source.vocab_size is not None and source.vocab_size - 1 > np.iinfo(dtype).max:
            wide = next(np.dtype(d) for d in ("uint16", "int32", "uint32", "int64")
                        if d in cls.token_dtypes and np.iinfo(d).max >= source.vocab_size - 1)
            top = source.vocab_size - 1
            raise InputError(f"--token-dtype {requested} cannot hold the ids of {source.path}: its tokenizer has "
                             f"{source.vocab_size:,} ids (up to {top:,}, and {dtype.name} holds up to "
                             f"{np.iinfo(dtype).max:,}); pass --token-dtype {wide.name}")
        return dtype
    signed = sorted((np.dtype(d) for d in cls.token_dtypes if np.dtype(d).kind == "i"), key=lambda d: d.itemsize)
    fix = next((d for d in signed if d.itemsize >= dtype.itemsize), signed[-1])
    what = f"--token-dtype {requested}" if requested else f"{source.path}: token dtype {dtype.name}"
    raise InputError(f"{what} cannot be held by the {cls.name} format (it holds {', '.join(cls.token_dtypes)}); "
                     f"pass --token-dtype {fix.name} (every id is checked to fit as it is written)")


def cast_tokens(tokens: npt.NDArray[np.integer], dtype: np.dtype, where: str) -> npt.NDArray[np.integer]:
    """``tokens`` as ``dtype`` (no copy when equal); InputError naming the first id that does not fit.
    Cost: a min/max pass and one copy when the dtypes differ."""
    if tokens.dtype == dtype:
        return tokens
    info = np.iinfo(dtype)
    if tokens.size and (int(tokens.min()) < info.min or int(tokens.max()) > info.max):
        bad = int(tokens[(tokens < info.min) | (tokens > info.max)][0])
        raise InputError(f"{where}: token id {bad} does not fit {dtype.name} [{info.min}, {info.max}]; "
                         f"pass a wider --token-dtype")
    return tokens.astype(dtype)
