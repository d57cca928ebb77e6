"""Reading shards of any registered format: counts, and validated document batches. No Ray.

  * ``inspect_shard(path)`` counts a shard's documents and tokens as cheaply as its format allows
    and checks its token column's type (raypack.inputs.base.InputFormat.inspect);
  * ``iter_document_batches`` reads a shard in file order and yields :class:`DocumentBatch` es of
    at most ``batch_size`` documents, the side columns alongside (same rows); ``iter_token_batches``
    the tokens alone. Every batch is checked before it is yielded (raypack.rules.token_checks:
    vectorised, O(tokens) at numpy speed): no null documents (an empty document is ``[]``), no
    null tokens, no negative ids, one side value per token; and, with ``max_document_tokens``, no
    document longer than it (from the list offsets, before the values are used; the format may
    refuse it earlier, from a footer or a line's bytes).

A document is read whole: what one costs a packer is in BENCHMARKS.md ("One long document").
Each failure raises ``InputError`` naming the shard, the row and the value. Files are opened
through :mod:`raypack.io.fs`, so every function takes local paths and URIs alike.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa

from raypack.errors import InputError
from raypack.inputs.base import DocumentBatch, ReadLimits, ShardInfo, check_document_lengths, token_value_type
from raypack.inputs.jsonl import JSONL_BLOCK_BYTES
from raypack.inputs.registry import accepted_suffixes, format_named, format_of
from raypack.rules.token_checks import validate_side_batch, validate_token_batch

__all__ = ["DocumentBatch", "JSON_BLOCK_SIZE", "ShardInfo", "inspect_shard", "iter_document_batches",
           "iter_token_batches", "shard_side_types"]

JSON_BLOCK_SIZE = JSONL_BLOCK_BYTES
"""Bytes of JSON Lines parsed at a time (more for a longer line)."""


def inspect_shard(path: str, column: str = "input_ids", *, json_block_size: int = JSON_BLOCK_SIZE,
                  max_document_tokens: int | None = None) -> ShardInfo:
    """Count a shard's documents and tokens, cheaply, and check its token column's type.

    Parquet: footer statistics (a scan of the token column where they are not usable); Arrow
    IPC: list offsets; JSON Lines: a streaming scan (a line too long for ``max_document_tokens``
    is refused here already).
    """
    fmt = format_of(path)
    if fmt is None:
        raise InputError(f"shard {path} has an unknown suffix; accepted: {accepted_suffixes()}")
    return fmt.inspect(path, column, ReadLimits(json_block_size=json_block_size,
                                                max_document_tokens=max_document_tokens))


def check_token_column(path: str, column: str) -> None:
    """InputError (:class:`raypack.inputs.base.HoldsText` for a text file) when ``path``'s schema, where
    its format gives one cheaply, lacks ``column`` as integer lists: checked before Ray starts."""
    fmt = format_of(path)
    schema = fmt.schema(path) if fmt is not None else None
    if schema is not None:
        token_value_type(schema, column, path)


def shard_side_types(path: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The value types of side columns ``names`` in shard ``path`` (its footer or schema; JSON Lines: int64)."""
    fmt = format_of(path)
    if fmt is None:
        raise InputError(f"shard {path} has an unknown suffix; accepted: {accepted_suffixes()}")
    return fmt.side_types(path, names)


def iter_token_batches(
    path: str,
    fmt: str,
    column: str = "input_ids",
    batch_size: int = 8192,
    *,
    units: tuple[int, int] | None = None,
    first_row: int = 0,
    rows: tuple[int, int] | None = None,
    json_block_size: int = JSON_BLOCK_SIZE,
    validate: bool = True,
    max_document_tokens: int | None = None,
) -> Iterator[tuple[int, pa.ListArray | pa.LargeListArray]]:
    """Yield ``(first_row, tokens)`` for ``path`` in file order, each batch validated.

    tokens: list<int*> or large_list<int*> array of 1..batch_size documents (zero-copy slices
    of what the format reader produced; JSONL gives list<int64>). Consecutive batches are
    contiguous: ``first_row`` of the next batch is this one's ``first_row + len(tokens)``.
    Memory: one Parquet batch (one row group per ``iter_batches`` call), one JSON block or one
    IPC record batch at a time. ``units``: read only row groups (Parquet) or record batches
    (Arrow IPC file) ``[start, end)``, whose first row is the shard's row ``first_row`` (rows are
    always shard-local); ``rows``: yield only the shard-local rows ``[start, end)`` of what is read
    (documents outside are decoded and dropped). ``validate=False`` skips the token checks (for a
    pass that reads only document lengths); ``max_document_tokens`` is checked either way.
    """
    for batch in iter_document_batches(path, fmt, column, batch_size, units=units, first_row=first_row, rows=rows,
                                       json_block_size=json_block_size, validate=validate,
                                       max_document_tokens=max_document_tokens):
        yield batch.first_row, batch.tokens


def iter_document_batches(
    path: str,
    fmt: str,
    column: str = "input_ids",
    batch_size: int = 8192,
    *,
    extra_columns: tuple[str, ...] = (),
    units: tuple[int, int] | None = None,
    first_row: int = 0,
    rows: tuple[int, int] | None = None,
    json_block_size: int = JSON_BLOCK_SIZE,
    validate: bool = True,
    max_document_tokens: int | None = None,
) -> Iterator[DocumentBatch]:
    """:func:`iter_token_batches` with the side columns ``extra_columns`` read alongside (same
    rows), each checked to hold one integer/bool value per token (:func:`validate_side_batch`)."""
    shard_format = format_named(fmt)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
    if units is not None and not shard_format.has_units:
        raise ValueError(f"units: a {shard_format.title} shard is read whole")
    limits = ReadLimits(batch_size, json_block_size, max_document_tokens)
    arrays_iter = shard_format.read_columns(path, (column, *extra_columns), units, limits)
    for start, arrays in _clip_rows(arrays_iter, first_row, rows):
        check_document_lengths(arrays[0], max_document_tokens, path=path, first_row=start)
        for offset in range(0, len(arrays[0]), batch_size):
            tokens, *sides = (a.slice(offset, batch_size) for a in arrays)
            if validate:
                validate_token_batch(tokens, path=path, first_row=start + offset)
                validate_side_batch(tokens, sides, extra_columns, column, path=path, first_row=start + offset)
            yield DocumentBatch(start + offset, tokens, tuple(sides))


def _clip_rows(arrays_iter: Iterator[tuple[pa.Array, ...]], first_row: int,
               rows: tuple[int, int] | None) -> Iterator[tuple[int, tuple[pa.Array, ...]]]:
    """``(shard-local first row, arrays)`` of each tuple of equally long arrays, cut to ``rows`` (all when None)."""
    start = first_row
    for arrays in arrays_iter:
        end = start + len(arrays[0])
        if rows is None:
            yield start, arrays
        else:
            low, high = max(start, rows[0]), min(end, rows[1])
            if low < high:
                yield low, tuple(a.slice(low - start, high - low) for a in arrays)
            if end >= rows[1]:
                return
        start = end
