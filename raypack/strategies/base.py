"""The packing-strategy protocol: one frozen, keyword-only dataclass per strategy, in its own folder.

A strategy is its folder (``raypack/strategies/NAME/``: the class in ``__init__.py``, its verify
structure check in ``verify.py``, any rules of its own beside them) plus one line in the registry
(:data:`raypack.strategies.STRATEGIES`). Its dataclass fields are its options; how they are named
outside (``best_fit_window``) and read in and out is :mod:`raypack.strategies.options`, shared by
every strategy.

What the stages ask of a strategy, in four groups (the abstract ones must be given; every other
member has a default, concat's behaviour or none at all):
  - packing (raypack.pack): the shard packer (:meth:`make_shard_packer`, abstract;
    raypack.pack.packer); when :attr:`needs_counting_pass`, the first pass that counts a task's
    chunks from its document lengths (:meth:`make_chunk_counter`; raypack.pack.packer.count_task);
    the plan's chunk count (:meth:`num_chunks`; default: concat's, tokens / C rounded up) and where
    a large shard may be split into tasks (:meth:`task_starts`; default: anywhere; raypack.pack.plan);
    :attr:`keeps_document_order` (raypack.export);
  - manifest fields (raypack.packed.manifest): written once at top level (:meth:`manifest_fields`:
    ``strategy`` and :meth:`options`), read back by the registry's ``strategy_of_manifest`` and
    checked by the strategy (:meth:`check_manifest`; default: nothing more), its extras in each
    ``shards[k]`` row (:meth:`shard_row_extras`; default: none);
  - report lines: the run summary's name for it (:meth:`describe`; raypack.pack.job), the stats
    splitter (:meth:`make_split_finder`, abstract; raypack.cli.stats), the dry-run figures and
    notes (:meth:`dry_run_figures`, abstract; raypack.pack.dry_run); verify's line comes from the
    structure check (``Structure.report_note``);
  - verify structure: the check class, named by :attr:`verify_structure_name` and imported on
    demand (:meth:`verify_structure`) so that packing never imports verify: raypack.verify asks
    ``strategy_of_manifest(manifest).verify_structure()`` for the class it builds.
No Ray here; the token math is in raypack.rules.core and the strategies' own rules.
"""

from __future__ import annotations

import abc
import hashlib
import importlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

import numpy as np

from raypack.strategies.options import options_of

if TYPE_CHECKING:
    from raypack.pack.plan import Plan
    from raypack.pack.tasks import PackSettings, ShardTask
    from raypack.rules.core import Chunks, Fragment


class ShardPacker(Protocol):
    """Packs one shard's documents in order (raypack.pack.packer drives it)."""

    first_chunk: int
    """Global index of the first chunk this shard writes."""
    head: Fragment | None
    tail: Fragment | None
    """Edge fragments for the driver to stitch (None when the shard owns all its chunks)."""
    stream_position: int | None
    """Where chunks are cut from the stream in order (concat): the global position of the next token
    pushed, so the driver can cut its slices at record-batch boundaries and the writer take whole
    record batches as views of the input (raypack.pack.packer); None otherwise."""

    def push_runs_parts(self, tokens: np.ndarray, run_lengths: np.ndarray, first_doc_id: int) -> list[Chunks]: ...
    def count_split(self, lengths: np.ndarray) -> int: ...
    def finish(self) -> Chunks: ...
    def check_num_chunks(self, task: ShardTask, num_chunks: int) -> None: ...


class ChunkCounter(Protocol):
    """A strategy's counting pass over one task: document lengths in order, then the chunk count."""

    def push(self, doc_lengths: np.ndarray) -> None: ...
    def finish(self) -> int: ...


class SplitFinder(Protocol):
    """Finds split documents while raypack.cli.stats streams an output's segment columns."""

    def add(self, seg_ids: np.ndarray, seg_lens: np.ndarray, offsets: np.ndarray) -> None: ...
    def split_ids(self) -> np.ndarray: ...


@dataclass(frozen=True)
class StrategyFigures:
    """One row of ``raypack pack --dry-run``; ``notes``: extra lines the strategy prints below the table."""

    name: str
    num_chunks: int
    padding_positions: int
    split_documents: int
    split_short_documents: int
    """Split documents of at most C tokens."""
    notes: tuple[str, ...] = ()


def percent(part: int, whole: int) -> str:
    """``part`` as a percentage of ``whole`` with 3 decimals (0 when ``whole`` is 0)."""
    return f"{100.0 * part / whole:.3f}%" if whole else "0.000%"


@dataclass(frozen=True, kw_only=True)
class PackingStrategy(abc.ABC):
    """Base of every strategy; a subclass sets the class attributes and gives the abstract methods."""

    name: ClassVar[str]
    """The registry key, written as the manifest's ``"strategy"``."""
    summary: ClassVar[str]
    """One sentence for ``--help`` and the config docs."""

    # ------------------------------------------------------------------ packing

    needs_counting_pass: ClassVar[bool] = False
    """True when a shard's first chunk is known only after counting every earlier shard's chunks."""
    keeps_document_order: ClassVar[bool] = False
    """True when the chunk stream holds the documents in global doc-id order, each whole across
    consecutive chunks (so its documents can be read back from the chunks, e.g. by an export)."""

    @abc.abstractmethod
    def make_shard_packer(self, task: ShardTask, settings: PackSettings) -> ShardPacker:
        """The packer of one task, its chunks from ``task``'s first chunk."""

    def make_chunk_counter(self, context_length: int) -> ChunkCounter:
        """Counts the chunks a task packs into from its (kept) document lengths, pushed in order
        (only when :attr:`needs_counting_pass`; raypack.pack.packer.count_task reads them)."""
        raise RuntimeError(f"internal error: strategy {self.name} has no counting pass")

    def num_chunks(self, plan: Plan) -> int:
        """Chunks of the whole output. Default (concat): the packed tokens cut every C, the last padded."""
        return -(-plan.num_packed_tokens // plan.context_length)

    def task_starts(self, unit_first_rows: np.ndarray) -> np.ndarray:
        """Which units (row groups, record batches) a task may start at, given each unit's first
        row in its shard ((n,) int64 -> (n,) bool; unit 0 is always allowed). A task starting
        there must pack exactly like a shard whose documents start there (raypack.pack.plan.shard_tasks).
        Default: every unit (a strategy whose chunks follow token offsets alone)."""
        return np.ones(unit_first_rows.shape, dtype=bool)

    # ------------------------------------------------------------------ manifest fields

    def options(self) -> dict[str, Any]:
        """``{key: value}`` of every option that is set (:func:`raypack.strategies.options.options_of`)."""
        return options_of(self)

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's top-level ``strategy`` and option keys (each stored once)."""
        return {"strategy": self.name, **self.options()}

    def fingerprint(self) -> str:
        """sha256 (hex) of the name and options as canonical JSON: equal exactly when they are."""
        text = json.dumps(self.manifest_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def check_manifest(self, manifest: dict[str, Any], where: str) -> None:
        """Strategy-specific consistency of a manifest already checked by raypack.packed.manifest,
        this strategy read back from it; InputError naming ``where``. Default: nothing more."""

    def shard_row_extras(self, task: ShardTask) -> dict[str, Any]:
        """Extra keys of the manifest's ``shards[k]`` row for ``task``. Default: none."""
        return {}

    # ------------------------------------------------------------------ report lines

    def describe(self) -> str:
        """The run summary's name for this strategy and its options."""
        return self.name

    @abc.abstractmethod
    def make_split_finder(self, context_length: int) -> SplitFinder:
        """What raypack stats feeds an output's segment columns to find its split documents."""

    @abc.abstractmethod
    def dry_run_figures(self, per_shard_lengths: list[np.ndarray], context_length: int) -> StrategyFigures:
        """Figures of packing documents of these lengths (one int64 array per shard, in order)."""

    # ------------------------------------------------------------------ verify structure

    verify_structure_name: ClassVar[str | Callable[[], type]]
    """``"module:attribute"`` (imported only when asked) or a callable returning the verify
    structure class (a :class:`raypack.verify.structure.Structure`) that checks this strategy's
    layout chunk by chunk and gives verify's report its note."""

    @classmethod
    def verify_structure(cls) -> type:
        """The verify structure class (imports its module now, not before)."""
        target = cls.verify_structure_name
        if callable(target):
            return target()
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)
