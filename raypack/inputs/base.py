"""The input-format seam: what raypack asks of a shard format. pyarrow/numpy only, no Ray.

An input format is one module holding one :class:`InputFormat` subclass, registered by one line
in :mod:`raypack.inputs.registry` (its ``suffixes`` name its files). Everything else reads
shards through the registry (:mod:`raypack.inputs.reading`) and never branches on a format's name.

What a format provides (the callers in brackets):

  * ``inspect``: a shard's counts, cheaply (footers, offsets, a scan) [the plan];
  * ``read_columns``: the token column and side columns, equally long arrays at a time, in file
    order, over a range of ``units`` (row groups, record batches) when ``has_units`` [packers,
    the counting pass, the dry run, verify]; a document over ``limits.max_document_tokens`` is
    refused before its values are used (each format's docstring says how early);
  * ``side_types``: the side columns' value types from a schema [the plan];
  * ``schema``: the Arrow schema, where it is cheap [the checks made before Ray starts];
  * ``metadata_start``: where trailing metadata (a footer) begins, hashed whole into a resume
    record's identity of the file [resume];
  * ``text_tasks`` / ``iter_texts`` / ``text_row``: for a format that also holds raw text [tokenize];
  * ``write``: a table of list columns as a shard of this format [raypack.sample, tests].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from raypack.errors import InputError
from raypack.rules.arrays import numpy_values

__all__ = ["DEFAULT_MAX_DOCUMENT_TOKENS", "DocumentBatch", "DocumentTooLong", "InputFormat", "ReadLimits", "ShardInfo",
           "check_document_lengths", "check_batch_rows", "too_long", "token_value_type"]

DEFAULT_MAX_DOCUMENT_TOKENS = 1 << 25
"""Tokens a document may hold (``max_document_tokens``): a packer reads a document whole, and one of
2**25 tokens costs it at most a few GiB (BENCHMARKS.md, "One long document")."""


@dataclass(frozen=True)
class ShardInfo:
    """One shard's counts, from ``inspect_shard``."""

    path: str
    format: str
    """The registered format's name: "parquet", "jsonl", "arrow", ..."""
    num_docs: int
    num_tokens: int
    token_type: str
    """Arrow value type of the token lists, e.g. "int32", "int64", "uint16"."""
    count_method: str
    """"parquet-footer", "scan" or "ipc-offsets"."""
    unit_docs: tuple[int, ...] = field(default=(), compare=False)
    """Documents per row group (Parquet) or record batch (Arrow IPC file), in file order; empty
    when the shard can only be read whole (JSONL, an IPC stream, a tokenized corpus's part file)."""
    unit_tokens: tuple[int, ...] = field(default=(), compare=False)
    """Tokens per row group or record batch, as ``unit_docs``."""
    source: dict | None = None
    """A tokenized corpus's part: the text it came from ({"path", "format", "start", "end"})."""


class DocumentBatch(NamedTuple):
    """Consecutive documents of a shard: their tokens and, per side column, their side values."""

    first_row: int
    tokens: pa.ListArray | pa.LargeListArray
    sides: tuple[pa.Array, ...] = ()
    """One list array per side column (raypack.rules.side_columns), one value per token, checked."""


@dataclass(frozen=True)
class ReadLimits:
    """How a format reads: ``batch_size`` documents per batch it hands back (at most; the caller
    re-slices), ``json_block_size`` bytes of JSON Lines parsed at once, and the longest document
    accepted (None: no limit)."""

    batch_size: int = 8192
    json_block_size: int = 16 << 20
    max_document_tokens: int | None = None


class InputFormat:
    """One shard format (module docstring). Subclasses set ``name``, ``suffixes`` and implement
    ``inspect``, ``read_columns`` and ``side_types``; the rest has defaults."""

    name: ClassVar[str]
    """Its name in plans, records and manifests (``ShardInfo.format``)."""
    title: ClassVar[str]
    """Its name in messages ("JSON Lines")."""
    suffixes: ClassVar[tuple[str, ...]]
    """File name suffixes, lower case, with the dot (".parquet"); the longest match wins."""
    text_task_unit: ClassVar[str] = "bytes"
    """What a text task's ``[start, end)`` counts in this format, for messages ("row groups", "bytes")."""
    has_units: ClassVar[bool] = False
    """A shard can be read by ranges of units (row groups, record batches): ``ShardInfo.unit_docs``."""
    holds_text: ClassVar[bool] = False
    """It can hold raw text for ``raypack tokenize`` (``text_tasks``, ``iter_texts``)."""

    def inspect(self, path: str, column: str, limits: ReadLimits) -> ShardInfo:
        """Count ``path``'s documents and tokens and check its token column's type."""
        raise NotImplementedError

    def read_columns(self, path: str, columns: tuple[str, ...], units: tuple[int, int] | None,
                     limits: ReadLimits) -> Iterator[tuple[pa.Array, ...]]:
        """``columns`` (the token column first, then side columns) as equally long list arrays, in
        file order, the schema checked first; ``units``: only units ``[start, end)`` (``has_units``)."""
        raise NotImplementedError

    def side_types(self, path: str, names: tuple[str, ...]) -> tuple[str, ...]:
        """The value type of each side column ``names`` (raypack.rules.side_columns.side_value_types)."""
        raise NotImplementedError

    def schema(self, path: str) -> pa.Schema | None:
        """``path``'s Arrow schema where a footer or header gives it cheaply; None where only a scan would."""
        return None

    def metadata_start(self, size: int, tail: bytes) -> int:
        """Where trailing metadata begins in a file of ``size`` bytes ending with ``tail`` (``size``: none)."""
        return size

    def text_tasks(self, path: str, *, task_rows: int, task_bytes: int) -> list[tuple[int, int, int]]:
        """``(start, end, cost)`` ranges splitting a text file into tasks (``holds_text``)."""
        raise InputError(f"text input {path} is {self.name}; give text as Parquet (a string column) or JSON Lines")

    def text_notes(self, path: str, column: str, max_text_bytes: int | None = None) -> list[str]:
        """Lines for the user about reading ``path``'s text (``holds_text``), from its metadata alone:
        what the file's layout will cost (Parquet: a dictionary page of long texts is read whole).
        InputError where the metadata already shows what a task would refuse: no text ``column`` (or not
        text), a text longer than ``max_text_bytes``."""
        return []

    def iter_texts(self, path: str, column: str, start: int, end: int, batch_rows: int, *,
                   max_text_bytes: int | None = None) -> Iterator[tuple[int, pa.Array]]:
        """``(first_row, texts)`` of one text task (``holds_text``). ``max_text_bytes``: the caller
        refuses longer texts; a format that must hold a text's encoding whole to find it (a JSON line)
        refuses, as it reads, one too long to hold such a text."""
        raise InputError(f"text input {path} is {self.name}; give text as Parquet (a string column) or JSON Lines")

    def text_row(self, path: str, start: int, end: int, k: int) -> str:
        """Where text ``k`` (from 0) of the text task ``[start, end)`` of ``path`` is in the file, for a
        message ("row 157", "line 20001"). Reads what it must (error path)."""
        return f"document {k} of {self.text_task_unit} [{start}, {end})"

    def write(self, path: str, table: pa.Table, rows_per_unit: int | None = None) -> None:
        """Write ``table`` as a shard of this format, ``rows_per_unit`` rows per unit where it has units."""
        raise NotImplementedError(f"{self.name} shards cannot be written")

    def __repr__(self) -> str:
        return f"<input format {self.name}>"


def check_named_once(schema: pa.Schema, names: Iterable[str], path: str) -> None:
    """InputError where a column of ``names`` is named twice in ``schema`` (Parquet and Arrow allow it; a
    column is read by its name, so which one is meant is unsaid: it raised a KeyError, a traceback)."""
    for name in names:
        count = len(schema.get_all_field_indices(name))
        if count > 1:
            raise InputError(f"shard {path} has {count} columns named {name!r}; a column is read by its name: "
                             "rename or drop all but one")


def _is_integer_list(field_type: pa.DataType) -> bool:
    return ((pa.types.is_list(field_type) or pa.types.is_large_list(field_type))
            and pa.types.is_integer(field_type.value_type))


def token_value_type(schema: pa.Schema, column: str, path: str) -> pa.DataType:
    """The integer value type of ``column``, a list/large_list of integers, in ``schema``."""
    texts = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    if column not in schema.names:
        lists = [f.name for f in schema if _is_integer_list(f.type)]
        name = f" {lists[0]}" if len(lists) == 1 and not texts else ""  # the concrete flag, as for a text column
        raise (HoldsText if texts else InputError)(
            f"shard {path} has no column {column!r}; its columns are {schema.names}; "
            f"name the token column with --token-column{name}" + (_text_hint(texts[0]) if texts else "")
        )
    check_named_once(schema, [column], path)
    field_type = schema.field(column).type
    if pa.types.is_fixed_size_list(field_type) and "segment_doc_ids" in schema.names:
        raise InputError(f"shard {path} is a chunk file of a packed raypack output (fixed-length {column!r}, "
                         "'segment_doc_ids'), not a corpus of documents: give the corpus it was packed from (read "
                         "a packed output with raypack.read_packed)")
    if not (pa.types.is_list(field_type) or pa.types.is_large_list(field_type)):
        raise (HoldsText if column in texts else InputError)(
            f"shard {path} column {column!r} has type {field_type}; it must be a list of "
            "integer token ids (list<int32>, large_list<int64>, ...)" + (_text_hint(column) if column in texts else "")
        )
    value_type = field_type.value_type
    if not pa.types.is_integer(value_type):
        raise InputError(
            f"shard {path} column {column!r} has type {field_type}; token ids must be "
            f"integers, not {value_type}"
        )
    return value_type


class HoldsText(InputError):
    """A shard read for token ids holds text (no token column, and a string column)."""


class HoldsTokens(InputError):
    """A file read for text holds token ids (no text column, and a list column)."""


def mixed_inputs(tokens_path: str, text_path: str) -> InputError:
    """The line for inputs that hold token shards and text alike: each kind's error sent the user to the other
    (a new user's trial)."""
    return InputError(f"the inputs mix token shards ({tokens_path}) and text ({text_path}); pack each kind in a run "
                      "of its own (raypack pack for the token shards, raypack pack --tokenizer for the text; raypack "
                      "mix trains on both outputs), or give one kind")


def _text_hint(column: str) -> str:
    """The fix when a shard holds text: tokenize it in the run."""
    return (f"; to pack its text column {column!r}, tokenize it in the run: --tokenizer tokenizer.json "
            f"(or tiktoken:cl100k_base) --text-column {column}")


class DocumentTooLong(InputError):
    """A document over ``max_document_tokens`` (:func:`too_long`): a limit met, not a damaged file."""


def too_long(path: str, row: int | str, num_tokens: int | str, limit: int, where: str | None = None) -> InputError:
    """The one line for a document over ``max_document_tokens`` (``where``: its place, if not ``row`` of ``path``)."""
    return DocumentTooLong(
        f"{where or f'shard {path} row {row}'}: the document holds "
        f"{f'{num_tokens:,}' if isinstance(num_tokens, int) else num_tokens} tokens, more than "
        f"max_document_tokens={limit:,} "
        "(a packer reads a document whole); raise --max-document-tokens if the packers have the memory "
        "(BENCHMARKS.md: bytes per token), or split the document upstream"
    )


def check_document_lengths(lists: pa.Array, limit: int | None, *, path: str, first_row: int,
                           where: Callable[[int], str] | None = None) -> None:
    """InputError (:func:`too_long`) for the first list of ``lists`` longer than ``limit``, from its
    offsets alone (the values are not touched). O(rows) numpy. ``where(row)``: the document's place,
    where ``first_row`` is not a row of the file (a text task's), e.g. "a.jsonl line 20001"."""
    if limit is None or not len(lists):
        return
    offsets = numpy_values(lists.offsets)
    lengths = np.diff(offsets)
    if lengths.size and int(lengths.max()) > limit:
        row = int(np.argmax(lengths > limit))
        raise too_long(path, first_row + row, int(lengths[row]), limit,
                       where(first_row + row) if where is not None else None)


def check_batch_rows(batch_rows: Any) -> None:
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows={batch_rows!r} must be an integer >= 1")
