"""Decide ownership before distributing: list shards, count them, split them, assign offsets.

The driver lists the shards in a fixed order, reads their document and token counts (Parquet
footers, Arrow IPC offsets; JSONL needs a scan), and turns the counts into global doc-id and
token offsets with a cumulative sum. Every packer then receives its offsets as data: nothing
about the result depends on which worker runs what, or when.

Tasks. A shard larger than ``task_tokens`` is packed as several tasks, each a range of whole
row groups (Parquet) or record batches (Arrow IPC file), so that one large file keeps every
worker busy (:func:`split_units`; the strategy says at which units a task may start,
:meth:`raypack.strategies.base.PackingStrategy.task_starts`). The split is a function of the
footers' per-unit counts and ``task_tokens`` alone, never of the workers, so a rerun gives the
same tasks and the same files. A task packs exactly like a shard whose documents start at its
offsets: chunks do not depend on the split, only the files holding them do.
"""

from __future__ import annotations

import os
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
import numpy.typing as npt

from raypack.errors import InputError
from raypack.inputs.base import HoldsText, ShardInfo, mixed_inputs
from raypack.inputs.reading import check_token_column, inspect_shard, shard_side_types
from raypack.inputs.shards import common_token_type, discover_shards, plan_offsets, read_region
from raypack.io.fs import is_uri
from raypack.pack.config import PackConfig
from raypack.pack.resume import file_mark, sampled_identity
from raypack.pack.tasks import PackSettings, ShardTask, TaskCounts
from raypack.rules.core import validate_pad_token
from raypack.rules.long_docs import DEFAULT_LONG_DOCS, CutCounts
from raypack.rules.side_columns import SideColumn, check_fill, common_side_type
from raypack.rules.token_checks import check_pad_in_vocabulary
from raypack.strategies import PackingStrategy, default_strategy
from raypack.tokenize.corpus import tokenized_inputs, tokenizer_record


@dataclass(frozen=True)
class Plan:
    shards: tuple[ShardInfo, ...]
    tasks: tuple[ShardTask, ...]
    token_dtype: str
    num_docs: int
    num_tokens: int
    context_length: int
    packing: PackingStrategy = field(default_factory=default_strategy)
    tokenizer: dict | None = None
    """Tokenized-corpus inputs: their tokenizer identity and text options (the packed manifest's "tokenizer")."""
    text_inputs: bool = False
    """``pack --tokenizer``: the shards are this run's own tokenized parts, gone once it publishes;
    the manifest names the text each came from instead."""
    long_docs: str = DEFAULT_LONG_DOCS
    """What happens to a document longer than ``context_length`` (raypack.rules.long_docs)."""
    cut: CutCounts = CutCounts()
    """What ``long_docs`` leaves out, in all (after :func:`place_counts`)."""
    extra_columns: tuple[SideColumn, ...] = ()
    """Side columns with their types resolved from every shard (:func:`resolve_side_columns`)."""

    def tasks_by_shard(self) -> list[list[ShardTask]]:
        """The tasks of each shard, in shard order (every shard has at least one)."""
        grouped: list[list[ShardTask]] = [[] for _ in self.shards]
        for task in self.tasks:
            grouped[task.shard_index].append(task)
        return grouped

    def whole_shard_tasks(self) -> list[ShardTask]:
        """Each shard as one task (what the manifest's ``shards`` rows describe): its first
        task's offsets, the sums of its tasks' counts (chunks too, once placed)."""
        return [_merged(tasks) for tasks in self.tasks_by_shard()]

    @property
    def num_packed_tokens(self) -> int:
        """Tokens in the chunks: ``num_tokens`` (the inputs') less what ``long_docs`` leaves out."""
        return self.num_tokens - self.cut.num_tokens_left_out

    @property
    def needs_counting_pass(self) -> bool:
        """Whether tasks are counted before packing: the strategy's chunks, or ``long_docs``'s kept tokens."""
        return self.packing.needs_counting_pass or self.long_docs != DEFAULT_LONG_DOCS

    @property
    def num_chunks(self) -> int:
        """Chunks of the whole output, as the strategy counts them (after :func:`place_chunks` if it counts)."""
        return self.packing.num_chunks(self)


def place_chunks(plan: Plan, chunk_counts: Sequence[int]) -> Plan:
    """A strategy with a counting pass: give each task its chunk range from every task's
    counted chunks (a cumsum)."""
    if len(chunk_counts) != len(plan.tasks):
        raise RuntimeError(f"internal error: {len(chunk_counts)} chunk counts for {len(plan.tasks)} tasks")
    firsts = np.concatenate([[0], np.cumsum(np.asarray(chunk_counts, dtype=np.int64))[:-1]])
    tasks = tuple(replace(t, first_chunk=int(first), num_chunks=int(n))
                  for t, first, n in zip(plan.tasks, firsts, chunk_counts))
    return replace(plan, tasks=tasks)


def place_counts(plan: Plan, counts: Sequence[TaskCounts]) -> Plan:
    """The counting pass's results placed: each task's cut counts, its token offset in the kept
    stream (a cumsum of kept tokens) and, when the strategy counts chunks, its chunk range."""
    if len(counts) != len(plan.tasks):
        raise RuntimeError(f"internal error: {len(counts)} task counts for {len(plan.tasks)} tasks")
    tasks = [replace(t, **c.cut.as_dict()) for t, c in zip(plan.tasks, counts)]
    kept = _exclusive_cumsum([t.num_kept_tokens for t in tasks])
    tasks = [replace(t, token_offset=int(offset)) for t, offset in zip(tasks, kept.tolist())]
    cut = sum((t.cut for t in tasks), CutCounts())
    plan = replace(plan, tasks=tuple(tasks), cut=cut)
    return place_chunks(plan, [c.num_chunks for c in counts]) if plan.packing.needs_counting_pass else plan


def check_inputs_before_start(config: PackConfig) -> None:
    """What is cheap to check before Ray takes seconds to start: the inputs are listed, and the first
    shard's schema (a footer, a header) holds the token column, so a text file is one line now."""
    if tokenized_inputs(config.inputs, config.token_column) is None:
        paths = discover_shards(list(config.inputs))
        if paths:
            check_token_column(paths[0], config.token_column)


def make_plan(config: PackConfig, *, max_threads: int = 8) -> Plan:
    """List, count and place every shard. Raises InputError on bad input, before any write."""
    if not config.inputs:
        raise InputError("no input given: pass --input PATH (a shard file, a directory or a glob)")
    infos = tokenized_inputs(config.inputs, config.token_column)  # counts from a tokenized corpus's manifest
    if infos is None:
        paths = discover_shards(list(config.inputs))
        with ThreadPoolExecutor(max_workers=max(1, min(max_threads, len(paths)))) as pool:
            inspected = pool.map(lambda p: inspect_shard(p, config.token_column,
                                                         max_document_tokens=config.max_document_tokens), paths)
            infos = []
            for path in paths:
                try:
                    infos.append(next(inspected))
                except HoldsText as e:
                    if infos:  # the shards before it hold tokens
                        raise mixed_inputs(infos[0].path, path) from e
                    raise
    token_dtype = resolve_token_dtype(config, infos)
    extra_columns = resolve_side_columns(config, [info.path for info in infos], max_threads)
    offsets = plan_offsets(infos)
    with ThreadPoolExecutor(max_workers=max(1, min(max_threads, len(infos)))) as pool:
        # each task checks its shard is still this one, so no output mixes two versions of a file
        marks = list(pool.map(lambda info: file_mark(sampled_identity(info.path, info.format)), infos))
    tasks: list[ShardTask] = []
    for k, info in enumerate(infos):
        whole = ShardTask(k, info.path, info.format, int(offsets.doc_offsets[k]), int(offsets.token_offsets[k]),
                          info.num_docs, info.num_tokens, planned=marks[k])
        tasks += shard_tasks(info, whole, config.task_tokens, len(tasks), config.packing)
    tasks = tuple(tasks)
    record = tokenizer_record(config.inputs)
    vocab_size = record["identity"].get("vocab_size") if record and isinstance(record.get("identity"), dict) else None
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and vocab_size > 0:
        check_pad_in_vocabulary(config.pad_token, vocab_size)  # as pack --tokenizer does (an exactness trial)
    return Plan(tuple(infos), tasks, token_dtype, int(offsets.doc_offsets[-1]),
                int(offsets.token_offsets[-1]), config.context_length, config.packing,
                record, long_docs=config.long_docs, extra_columns=extra_columns)


def resolve_side_columns(config: PackConfig, paths: list[str], max_threads: int = 8) -> tuple[SideColumn, ...]:
    """Each extra column with the one type every shard's values fit (numpy promotion of the
    shards' types; JSON Lines: int64) and its fill, checked to fit. Reads each shard's schema
    (a Parquet footer, an IPC header) once; InputError names the shard, column and type of a
    missing or non-integer column."""
    specs = config.side_specs()
    if not specs or not paths:
        return ()
    names = tuple(name for name, _ in specs)
    with ThreadPoolExecutor(max_workers=max(1, min(max_threads, len(paths)))) as pool:
        per_shard = list(pool.map(lambda p: shard_side_types(p, names), paths))
    columns = []
    for k, (name, fill) in enumerate(specs):
        types = sorted({types[k] for types in per_shard})
        common = common_side_type(types)
        if common is None:
            raise InputError(f"extra column {name} has types {', '.join(types)} across the shards; no integer type "
                             "holds them all (write it as one type)")
        column = SideColumn(name, common, fill)
        try:
            check_fill(column)
        except ValueError as e:
            raise InputError(str(e)) from e
        columns.append(column)
    return tuple(columns)


def _merged(tasks: list[ShardTask]) -> ShardTask:
    num_chunks = sum(t.num_chunks for t in tasks) if all(t.num_chunks >= 0 for t in tasks) else -1
    cut = sum((t.cut for t in tasks), CutCounts())
    return replace(tasks[0], num_docs=sum(t.num_docs for t in tasks), num_tokens=sum(t.num_tokens for t in tasks),
                   num_chunks=num_chunks, task_index=-1, row_start=0, unit_start=0, unit_end=-1, unit_first_row=0,
                   **cut.as_dict())


def split_units(unit_tokens: Sequence[int], target_tokens: int) -> npt.NDArray[np.int64]:
    """Boundaries of a shard's tasks over its units (row groups or record batches).

    Returns (k + 1,) int64 from 0 to ``len(unit_tokens)``: task j reads units ``[b[j], b[j+1])``.
    The rule: from the first unit, a task takes units until it holds at least ``target_tokens``
    tokens (at least one unit), the next task starts after it; the last task takes what is left.
    Cost: one searchsorted per task.
    """
    cum = _exclusive_cumsum(unit_tokens)
    n, bounds = len(unit_tokens), [0]
    while bounds[-1] < n:
        start = bounds[-1]
        end = int(np.searchsorted(cum, cum[start] + target_tokens, side="left"))
        bounds.append(min(max(end, start + 1), n))
    return np.asarray(bounds, dtype=np.int64)


def shard_tasks(info: ShardInfo, whole: ShardTask, target_tokens: int, first_task: int,
                packing: PackingStrategy) -> list[ShardTask]:
    """``whole`` (the shard as one task) split by :func:`split_units` over the units where
    ``packing`` lets a task start (:meth:`PackingStrategy.task_starts`; the units between two
    such starts count as one), task indices from ``first_task``. ``[whole]`` when
    ``target_tokens`` is 0, the shard holds at most that many tokens, it has no per-unit counts
    (JSONL, an IPC stream) or the split gives one task."""
    if not target_tokens or whole.num_tokens <= target_tokens or len(info.unit_tokens) < 2:
        return [replace(whole, task_index=first_task)]
    unit_rows = _exclusive_cumsum(info.unit_docs)
    unit_positions = _exclusive_cumsum(info.unit_tokens)
    starts = np.flatnonzero(packing.task_starts(unit_rows[:-1]) | (np.arange(len(info.unit_docs)) == 0))
    groups = np.append(starts, len(info.unit_docs))  # units [groups[i], groups[i+1]) move together
    bounds = groups[split_units(np.diff(unit_positions[groups]), target_tokens)]
    if len(bounds) <= 2:
        return [replace(whole, task_index=first_task)]
    return [replace(whole, task_index=first_task + j, row_start=int(unit_rows[start]),
                    doc_offset=whole.doc_offset + int(unit_rows[start]),
                    token_offset=whole.token_offset + int(unit_positions[start]),
                    num_docs=int(unit_rows[end] - unit_rows[start]),
                    num_tokens=int(unit_positions[end] - unit_positions[start]),
                    unit_start=int(start), unit_end=int(end), unit_first_row=int(unit_rows[start]))
            for j, (start, end) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist()))]


def _exclusive_cumsum(counts: Sequence[int]) -> npt.NDArray[np.int64]:
    """(n + 1,) int64: 0, then the running sums of ``counts``."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=out[1:])
    return out


def resolve_token_dtype(config: PackConfig, infos: list[ShardInfo]) -> str:
    dtype = common_token_type(infos) if infos else "int32"
    if config.token_dtype != "auto":
        dtype = config.token_dtype  # narrower than the input: every token is range-checked
    try:
        validate_pad_token(config.pad_token, np.dtype(dtype))
    except ValueError as e:
        raise InputError(f"{e} (token dtype chosen from the shards: {dtype}; set token_dtype to widen it)") from e
    return dtype


def settings_for(config: PackConfig, plan: Plan, out_dir: str) -> PackSettings:
    """The one place PackSettings are built: the config's, with the plan's token dtype, writing to ``out_dir``."""
    return PackSettings(out_dir=out_dir, context_length=config.context_length, pad_token=config.pad_token,
                        token_dtype=plan.token_dtype, token_column=config.token_column,
                        read_batch_size=config.read_batch_size, read_batch_tokens=config.read_batch_tokens,
                        chunks_per_record_batch=config.chunks_per_record_batch, strategy=plan.packing.name,
                        strategy_options=plan.packing.options(), verify_inputs=config.verify_inputs,
                        progress_timeout_s=config.progress_timeout_s, restart_stalled=config.restart_stalled,
                        long_docs=plan.long_docs, extra_columns=plan.extra_columns,
                        max_document_tokens=config.max_document_tokens)


def check_output_outside_inputs(output: str, plan: Plan, inputs: Sequence[str] = ()) -> None:
    """Refuse an output directory (or prefix) that holds an input shard (publishing the output, or
    ``--overwrite``, would replace it), or that lies inside an input given as a directory or a
    recursive glob (a run over that input again would read the output's files as shards). An
    output beside an input given as a file, or under a one-level glob's folder, is fine."""
    out = _location(output)
    for info in plan.shards:
        location = _location(info.path)
        if location.startswith(out + "/"):
            raise InputError(f"output directory {output} holds the input shard {info.path}: publishing the output "
                             "would replace it; choose an output outside the inputs")
    for item in inputs:
        region = read_region(item)
        region = None if region is None else _location(region)
        if region is not None and (out == region or out.startswith(region + "/")):
            raise InputError(f"output directory {output} lies inside the input {item}, whose files are read as "
                             "shards; choose an output outside the inputs")


def _location(path: str) -> str:
    """A local path (or file:// URI) made real, or another URI without its query and trailing slash."""
    if path.startswith("file://"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
    if not is_uri(path):
        return os.path.realpath(path)
    return path.split("?", 1)[0].rstrip("/")
