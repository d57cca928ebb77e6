"""The packing-strategy protocol: one frozen, keyword-only dataclass per strategy.

A strategy's dataclass fields are its options (e.g. best_fit's ``window``). Outside the
strategy an option is named ``{strategy name}_{field}`` (``best_fit_window``): that one key is
the config key, the manifest key and, with dashes, the CLI flag (``--best-fit-window``), so two
strategies' options never collide with each other or with the job's own keys. A field's metadata
may give ``help``, ``metavar``, ``doc``, ``type`` (the CLI type when the default is None),
``aliases`` (more CLI spellings) and ``only_when_chosen`` (set with another strategy chosen, the
config is refused rather than the option ignored).

What the rest of raypack asks of a strategy, and who asks:
  - the shard packer (:meth:`make_shard_packer`; raypack.pack.packer) and, when
    :attr:`needs_counting_pass`, the first pass that counts a shard's chunks from its document
    lengths (:meth:`make_chunk_counter`; raypack.pack.packer.count_task, run by raypack.pack.job and
    raypack.engine.pipeline);
  - how many chunks a plan makes (:meth:`num_chunks`; raypack.pack.plan) and where a large shard may
    be split into tasks (:meth:`task_starts`; raypack.pack.plan);
  - its manifest fields, written once at top level (:meth:`manifest_fields`), read back
    validated (:meth:`from_manifest`, :meth:`check_manifest`; raypack.packed.manifest), and its extras in
    each ``shards[k]`` row (:meth:`shard_row_extras`; raypack.pack.assemble);
  - the stats splitter (:meth:`make_split_finder`; raypack.cli.stats), the dry-run figures
    (:meth:`dry_run_figures`; raypack.pack.dry_run), the summary's description (:meth:`describe`;
    raypack.pack.job);
  - the verify structure check, named by :attr:`verify_structure_name` and imported on demand
    (:meth:`verify_structure`), so that packing never imports verify. raypack.verify asks
    ``strategy_of_manifest(manifest).verify_structure()`` for the class it builds;
  - a fingerprint of its settings (:meth:`fingerprint`): equal exactly when name and options are.
No Ray here; the per-strategy modules keep the token math in raypack.rules.core / raypack.strategies.best_fit.rules.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

import numpy as np

from raypack.errors import InputError
from raypack.io.untrusted import show

if TYPE_CHECKING:
    from raypack.pack.plan import Plan
    from raypack.pack.tasks import PackSettings, ShardTask
    from raypack.rules.core import Chunks, Fragment

MAX_OPTION_INT = 1 << 53
"""Largest integer option (as :data:`raypack.packed.manifest.MAX_COUNT`): far inside int64 arithmetic."""


class ShardPacker(Protocol):
    """Packs one shard's documents in order (raypack.pack.packer drives it)."""

    first_chunk: int
    """Global index of the first chunk this shard writes."""
    head: Fragment | None
    tail: Fragment | None
    """Edge fragments for the driver to stitch (None when the shard owns all its chunks)."""

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
class PackingStrategy:
    """Base of every strategy; a subclass sets the class attributes and implements the methods."""

    name: ClassVar[str]
    """The registry key, written as the manifest's ``"strategy"``."""
    summary: ClassVar[str]
    """One sentence for ``--help`` and the config docs."""
    needs_counting_pass: ClassVar[bool] = False
    """True when a shard's first chunk is known only after counting every earlier shard's chunks."""
    keeps_document_order: ClassVar[bool] = False
    """True when the chunk stream holds the documents in global doc-id order, each whole across
    consecutive chunks (so its documents can be read back from the chunks, e.g. by an export)."""
    verify_structure_name: ClassVar[str | Callable[[], type]]
    """``"module:attribute"`` (imported only when asked) or a callable returning the verify
    structure class that checks this strategy's layout chunk by chunk."""

    # ------------------------------------------------------------------ options

    @classmethod
    def option_key(cls, field_name: str) -> str:
        """The config / manifest key of option ``field_name`` (``best_fit`` + ``window``)."""
        return f"{cls.name}_{field_name}"

    @classmethod
    def option_keys(cls) -> dict[str, dataclasses.Field]:
        """``{key: field}`` of every option, in field order."""
        return {cls.option_key(f.name): f for f in dataclasses.fields(cls)}

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> PackingStrategy:
        """Built from the keys of ``options`` that are this strategy's (others are ignored);
        a missing option takes its default. ValueError names a bad value by its key."""
        return cls(**{f.name: options[key] for key, f in cls.option_keys().items() if key in options})

    def options(self) -> dict[str, Any]:
        """``{key: value}`` of every option that is set: an option whose default is None (e.g. a
        limit that is off unless asked for) is left out while it is None, so adding one changes no
        existing manifest, fingerprint or resume record."""
        return {self.option_key(f.name): getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None}

    def _check_int(self, field_name: str, least: int) -> None:
        """Raise ValueError naming the option's key unless it is an int (not bool) in ``[least, 2**53]``."""
        value = getattr(self, field_name)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_OPTION_INT:
            raise ValueError(f"{self.option_key(field_name)}={show(value)} must be an integer >= {least} "
                             f"(at most 2**53)")

    def fingerprint(self) -> str:
        """sha256 (hex) of the name and options as canonical JSON: equal exactly when they are."""
        text = json.dumps(self.manifest_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    # ------------------------------------------------------------------ manifest

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's top-level ``strategy`` and option keys (each stored once)."""
        return {"strategy": self.name, **self.options()}

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], where: str) -> PackingStrategy:
        """The strategy a manifest names, its options read back; InputError naming ``where`` when
        one is missing or bad. Then :meth:`check_manifest`."""
        missing = [key for key, f in cls.option_keys().items() if key not in manifest and f.default is not None]
        if missing:
            raise InputError(f"{where}: a {cls.name} manifest needs {', '.join(missing)}; "
                             "the output was replaced or damaged")
        try:
            strategy = cls.from_options(manifest)
        except (TypeError, ValueError) as e:
            raise InputError(f"{where}: {e}; the output was replaced or damaged") from e
        strategy.check_manifest(manifest, where)
        return strategy

    def check_manifest(self, manifest: dict[str, Any], where: str) -> None:
        """Strategy-specific consistency of a manifest already checked by raypack.packed.manifest."""

    def shard_row_extras(self, task: ShardTask) -> dict[str, Any]:
        """Extra keys of the manifest's ``shards[k]`` row for ``task``."""
        return {}

    # ------------------------------------------------------------------ packing

    def make_shard_packer(self, task: ShardTask, settings: PackSettings) -> ShardPacker:
        raise NotImplementedError

    def task_starts(self, unit_first_rows: np.ndarray) -> np.ndarray:
        """Which units (row groups, record batches) a task may start at, given each unit's first
        row in its shard ((n,) int64 -> (n,) bool; unit 0 is always allowed). A task starting
        there must pack exactly like a shard whose documents start there (raypack.pack.plan.shard_tasks).
        Default: every unit (a strategy whose chunks follow token offsets alone)."""
        return np.ones(unit_first_rows.shape, dtype=bool)

    def make_chunk_counter(self, context_length: int) -> ChunkCounter:
        """Counts the chunks a task packs into from its (kept) document lengths, pushed in order
        (only when :attr:`needs_counting_pass`; raypack.pack.packer.count_task reads them)."""
        raise RuntimeError(f"internal error: strategy {self.name} has no counting pass")

    def num_chunks(self, plan: Plan) -> int:
        raise NotImplementedError

    # ------------------------------------------------------------------ reporting

    def describe(self) -> str:
        """The run summary's name for this strategy and its options."""
        return self.name

    def make_split_finder(self, context_length: int) -> SplitFinder:
        raise NotImplementedError

    def dry_run_figures(self, per_shard_lengths: list[np.ndarray], context_length: int) -> StrategyFigures:
        """Figures of packing documents of these lengths (one int64 array per shard, in order)."""
        raise NotImplementedError

    @classmethod
    def verify_structure(cls) -> type:
        """The verify structure class (imports its module now, not before)."""
        target = cls.verify_structure_name
        if callable(target):
            return target()
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module), attribute)
