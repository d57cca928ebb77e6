"""What travels between the driver and the packers: tasks, settings, results, and the
one-row Arrow form a result takes on its way back (no pickled objects)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from raypack.inputs.base import DEFAULT_MAX_DOCUMENT_TOKENS
from raypack.packed.writer import WrittenFile
from raypack.rules.arrays import arrow_array, binary_array, numpy_values
from raypack.rules.core import Fragment
from raypack.rules.long_docs import DEFAULT_LONG_DOCS, CutCounts
from raypack.rules.side_columns import SideColumn, from_fields, packed_dtype, pad_value, record_dtype, split_fields

if TYPE_CHECKING:
    from raypack.strategies import PackingStrategy


@dataclass(frozen=True)
class ShardTask:
    """What a packer needs to pack one shard, or one range of a shard's row groups (Parquet) or
    record batches (Arrow IPC file); decided by the driver before any packing (raypack.pack.plan).

    The counts and offsets are the task's: its documents are the shard's rows ``[row_start,
    row_start + num_docs)``, global doc ids from ``doc_offset``, tokens at global stream
    positions from ``token_offset``.
    """

    shard_index: int
    path: str
    format: str
    doc_offset: int
    token_offset: int
    num_docs: int
    num_tokens: int
    first_chunk: int = -1
    """Strategies with a counting pass only: the global index of the task's first chunk."""
    num_chunks: int = -1
    """Strategies with a counting pass only: the chunks the task packs into."""
    task_index: int = -1
    """Position in the plan's task list (names the resume record); -1 means ``shard_index``."""
    row_start: int = 0
    """The shard-local row of the task's first document."""
    unit_start: int = 0
    """First row group or record batch read."""
    unit_end: int = -1
    """End (exclusive) of the row groups or record batches read; -1: the whole file is read."""
    unit_first_row: int = 0
    """The shard-local row of ``unit_start``'s first row."""
    documents_truncated: int = 0
    tokens_truncated: int = 0
    documents_dropped: int = 0
    tokens_dropped: int = 0
    """What ``long_docs`` leaves out of the task's documents (raypack.rules.long_docs.CutCounts), from the
    counting pass; ``token_offset`` then counts kept tokens only. All 0 under ``split``."""
    planned: str = ""
    """The shard's identity when the run planned its tasks (raypack.pack.resume.file_mark); the task
    refuses a file that is no longer that one, when it starts and when its reads end ("": not checked)."""

    def __post_init__(self) -> None:
        if self.task_index < 0:
            object.__setattr__(self, "task_index", self.shard_index)

    @property
    def cut(self) -> CutCounts:
        return CutCounts(self.documents_truncated, self.tokens_truncated, self.documents_dropped,
                         self.tokens_dropped)

    @property
    def num_kept_tokens(self) -> int:
        """Tokens the task packs: ``num_tokens`` (as read) less those ``long_docs`` leaves out."""
        return self.num_tokens - self.cut.num_tokens_left_out

    @property
    def is_whole_shard(self) -> bool:
        return self.unit_end < 0

    def read_range(self) -> dict[str, Any]:
        """Keyword arguments of :func:`raypack.inputs.reading.iter_token_batches` that read this task's rows."""
        if self.is_whole_shard:
            return {}
        return {"units": (self.unit_start, self.unit_end), "first_row": self.unit_first_row,
                "rows": (self.row_start, self.row_start + self.num_docs)}

    def describe(self) -> str:
        """``shard PATH (shard k)`` or, for part of a shard, ``shard PATH rows a..b (shard k, task t)``."""
        if self.is_whole_shard:
            return f"shard {self.path} (shard {self.shard_index})"
        return (f"shard {self.path} rows {self.row_start}..{self.row_start + self.num_docs - 1} "
                f"(shard {self.shard_index}, task {self.task_index})")


@dataclass(frozen=True, kw_only=True)
class PackSettings:
    """The run-wide settings every packer shares; built by :func:`raypack.pack.plan.settings_for` alone.
    Plain values only, so that it travels to Ray actors (and resume records) as a dict."""

    out_dir: str
    context_length: int
    pad_token: int
    token_dtype: str
    token_column: str
    read_batch_size: int
    read_batch_tokens: int
    chunks_per_record_batch: int
    strategy: str
    """The registered strategy's name (raypack.strategies)."""
    strategy_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The strategy's options by key (``{"best_fit_window": 8192}``); see :attr:`packing`."""
    long_docs: str = DEFAULT_LONG_DOCS
    """What happens to a document longer than ``context_length`` (raypack.rules.long_docs)."""
    verify_inputs: bool = False
    """Resume records also hold each input's full sha256 (PackConfig.verify_inputs); no effect on output."""
    progress_timeout_s: float = 0.0
    """Report a shard with no progress for this long (raypack.pack.watchdog); no effect on output."""
    restart_stalled: bool = False
    """End a stalled packer's process (Ray restarts it); no effect on output."""
    max_document_tokens: int = DEFAULT_MAX_DOCUMENT_TOKENS
    """A longer document is refused (PackConfig.max_document_tokens); no effect on output, but a resume record
    made with another limit is not kept (raypack.pack.resume)."""
    extra_columns: tuple[SideColumn, ...] = ()
    """Side columns packed with the tokens (raypack.rules.side_columns), their types resolved by the plan."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_columns", tuple(SideColumn(*c) for c in self.extra_columns))

    @property
    def packed_dtype(self) -> np.dtype:
        """What the packers move: the token dtype, or opaque records of :attr:`record_dtype`."""
        return packed_dtype(self.token_dtype, self.extra_columns)

    @property
    def record_dtype(self) -> np.dtype:
        """One position's token and side values, structured (raypack.rules.side_columns.record_dtype)."""
        return record_dtype(self.token_dtype, self.extra_columns)

    @property
    def pad_value(self) -> int | np.void:
        """What fills a padding position in :attr:`packed_dtype` (raypack.rules.side_columns.pad_value)."""
        return pad_value(self.pad_token, self.extra_columns, self.token_dtype)

    @property
    def packing(self) -> PackingStrategy:
        """The strategy object (registry: raypack.strategies), built from ``strategy`` and its options."""
        from raypack.strategies import configured_strategy  # the strategies import this module

        return configured_strategy(self.strategy, self.strategy_options)


class TaskCounts(NamedTuple):
    """What the counting pass finds in one task, from its document lengths alone."""

    num_chunks: int
    """The chunks it packs into; -1 when its strategy has no counting pass (concat)."""
    cut: CutCounts
    """What ``long_docs`` leaves out of it."""


def read_batch_rows(task: ShardTask, settings: PackSettings) -> int:
    """Documents per read batch: the configured number, or enough for ~read_batch_tokens tokens."""
    if settings.read_batch_size:
        return settings.read_batch_size
    mean_len = task.num_tokens / task.num_docs if task.num_docs else 1.0
    return int(min(1 << 20, max(1, settings.read_batch_tokens / max(mean_len, 1.0))))


@dataclass(frozen=True)
class ShardResult:
    """What packing one task gave (one shard, or a range of one)."""

    shard_index: int
    file: WrittenFile | None
    head: Fragment | None
    tail: Fragment | None
    num_docs: int
    num_nonempty_docs: int
    """Documents with tokens in the output (a dropped one has none)."""
    num_tokens: int
    """Tokens read (before ``long_docs``)."""
    num_split_docs: int
    """Documents that cross at least one chunk boundary."""
    peak_rss_bytes: int = 0
    started_at: float = 0.0
    """Wall-clock start and end of packing this shard (for the summary, not the output)."""
    finished_at: float = 0.0
    """The packing process's peak resident memory after this shard (for benchmarks)."""
    task_index: int = -1
    """The task's position in the plan (-1 means ``shard_index``)."""

    def __post_init__(self) -> None:
        if self.task_index < 0:
            object.__setattr__(self, "task_index", self.shard_index)


# ----------------------------------------------------------------------------- transport
# A result travels from a packer actor to the driver as one Arrow row.

_FRAGMENT_FIELDS = ("start", "input_ids", "segment_doc_ids", "segment_lengths")
_SIDE_INFIX = "_side_"
"""A fragment's side column travels as ``{head|tail}_side_{name}`` (its tokens as ``*_input_ids``)."""


def result_to_table(result: ShardResult, token_type: pa.DataType, record: np.dtype | None = None) -> pa.Table:
    """``result`` as one Arrow row; ``record``: the fragments' record dtype when they hold side columns.
    Built from buffers with explicit types (raypack.rules.arrays: no pandas in a packer actor), so every
    row has the same schema, a missing file or fragment a null of its type."""
    row: dict[str, pa.Array] = {name: arrow_array(np.array([getattr(result, name)], dtype=np.int64)) for name in (
        "shard_index", "task_index", "num_docs", "num_nonempty_docs", "num_tokens", "num_split_docs",
        "peak_rss_bytes")}
    row.update({name: arrow_array(np.array([getattr(result, name)], dtype=np.float64))
                for name in ("started_at", "finished_at")})
    row["file"] = _file_array(result.file)
    for name, frag in (("head", result.head), ("tail", result.tail)):
        row[f"{name}_start"] = pa.nulls(1, pa.int64()) if frag is None else arrow_array(np.array([frag.start],
                                                                                                 dtype=np.int64))
        tokens, sides = (None, ()) if frag is None else split_fields(frag.input_ids, record)
        arrays = {"input_ids": tokens, "segment_doc_ids": None if frag is None else frag.segment_doc_ids,
                  "segment_lengths": None if frag is None else frag.segment_lengths}
        for field, typ in (("input_ids", token_type), ("segment_doc_ids", pa.int64()), ("segment_lengths", pa.int32())):
            row[f"{name}_{field}"] = pa.nulls(1, pa.list_(typ)) if frag is None else _one_list(arrays[field], typ)
        for side_name, values in zip(record.names[1:] if sides else (), sides):
            row[f"{name}{_SIDE_INFIX}{side_name}"] = _one_list(values)
    return pa.table(row)


_FILE_TYPES = {"path": pa.string(), "first_chunk": pa.int64(), "num_chunks": pa.int64(), "num_bytes": pa.int64(),
               "sha256": pa.string(), "digests": pa.string()}
"""The Arrow type of each WrittenFile field (a field added without one is a KeyError in every test that packs)."""


def _file_array(file: WrittenFile | None) -> pa.Array:
    """One row: ``file``'s fields as a struct, or a null of that struct."""
    children = []
    for name in WrittenFile._fields:
        value = None if file is None else getattr(file, name)
        if _FILE_TYPES[name] == pa.string():
            children.append(binary_array([(value or "").encode()], pa.string()))
        else:
            children.append(arrow_array(np.array([value or 0], dtype=np.int64)))
    return pa.StructArray.from_arrays(children, names=list(WrittenFile._fields),
                                      mask=arrow_array(np.array([file is None])))


def _one_list(values: np.ndarray, typ: pa.DataType | None = None) -> pa.Array:
    """One row: ``values`` as a list (of ``typ``, else of their own type)."""
    return pa.ListArray.from_arrays(arrow_array(np.array([0, values.size], dtype=np.int32)), arrow_array(values, typ))


def asdict_file(file: WrittenFile | None) -> dict[str, Any] | None:
    return None if file is None else file._asdict()


def table_to_results(table: pa.Table) -> Iterator[ShardResult]:
    for row in range(table.num_rows):
        get = lambda name: table.column(name)[row]  # noqa: E731
        frags = {}
        for name in ("head", "tail"):
            start = get(f"{name}_start").as_py()
            frags[name] = None if start is None else Fragment(
                start,
                *(_list_scalar_to_numpy(get(f"{name}_{field}")) for field in _FRAGMENT_FIELDS[1:]),
            )
            side_columns = [c for c in table.column_names if c.startswith(name + _SIDE_INFIX)]
            if frags[name] is not None and side_columns:
                sides = {c[len(name + _SIDE_INFIX):]: _list_scalar_to_numpy(get(c)) for c in side_columns}
                frags[name] = frags[name]._replace(input_ids=from_fields(frags[name].input_ids, sides))
        file = get("file").as_py()
        yield ShardResult(
            shard_index=get("shard_index").as_py(),
            file=None if file is None else WrittenFile(**file),
            head=frags["head"],
            tail=frags["tail"],
            num_docs=get("num_docs").as_py(),
            num_nonempty_docs=get("num_nonempty_docs").as_py(),
            num_tokens=get("num_tokens").as_py(),
            num_split_docs=get("num_split_docs").as_py(),
            peak_rss_bytes=get("peak_rss_bytes").as_py(),
            started_at=get("started_at").as_py(),
            finished_at=get("finished_at").as_py(),
            task_index=get("task_index").as_py(),
        )


def _list_scalar_to_numpy(scalar: pa.ListScalar) -> np.ndarray:
    return numpy_values(scalar.values)
