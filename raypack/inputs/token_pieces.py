"""Token pieces: a shard's documents in order, a long document in a Parquet row group cut into
pieces of at most ``max_tokens`` tokens (read page by page by :mod:`raypack.inputs.parquet_pages`).

What the packer and best_fit's counting pass read (:func:`iter_token_pieces`); every other
format, and Parquet row groups of short documents, come whole from
:func:`raypack.inputs.reading.iter_token_batches`.
"""

from __future__ import annotations

import logging
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.errors import InputError
from raypack.inputs.base import token_value_type
from raypack.inputs.parquet import ParquetFormat, open_parquet, token_leaf_index
from raypack.inputs.parquet_pages import TokenPiece, Unsupported, iter_row_group_pieces
from raypack.inputs.reading import JSON_BLOCK_SIZE, iter_document_batches
from raypack.inputs.registry import format_named
from raypack.io.fs import open_input_file, resolve_filesystem
from raypack.rules.token_checks import validate_token_batch

log = logging.getLogger(__name__)

PAGE_READ_MEAN_DIVISOR = 16
"""A row group with a mean document length above max_tokens / this is read page by page."""


def iter_token_pieces(
    path: str,
    fmt: str,
    column: str = "input_ids",
    batch_size: int = 8192,
    max_tokens: int = 1 << 20,
    *,
    units: tuple[int, int] | None = None,
    first_row: int = 0,
    rows: tuple[int, int] | None = None,
    json_block_size: int = JSON_BLOCK_SIZE,
    validate: bool = True,
    extra_columns: tuple[str, ...] = (),
) -> Iterator[TokenPiece]:
    """Like :func:`iter_token_batches`, but a Parquet row group whose documents may be longer
    than ``max_tokens`` is read page by page (raypack.inputs.parquet_pages): pieces of at most
    ``max_tokens`` tokens, a longer document cut across consecutive pieces.

    Each :class:`TokenPiece` carries the full lengths of the documents that start in it, so
    counts need no reassembly. Other inputs, and row groups the page reader does not handle,
    give whole documents (``continued`` False). Memory for a page-read row group: one page,
    one piece and 8 bytes per row of the row group. ``units``, ``first_row``: as
    :func:`iter_token_batches`; ``rows`` must then be the units' whole rows (tasks are whole
    row groups), or other formats are read through :func:`iter_token_batches`.

    ``extra_columns``: side columns read alongside (raypack.rules.side_columns), in each piece's
    ``sides``. With side columns every document comes whole, by pyarrow, whatever its length
    (the page reader reads one column): a long document then costs pyarrow's whole-row decode.
    """
    whole = dict(units=units, first_row=first_row, rows=rows, json_block_size=json_block_size, validate=validate,
                 extra_columns=tuple(extra_columns))
    if not isinstance(format_named(fmt), ParquetFormat) or extra_columns or (rows is not None and rows[0] != first_row):
        yield from _whole_documents(path, fmt, column, batch_size, whole)
        return
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    fs, fs_path = resolve_filesystem(path)
    with open_input_file(fs, fs_path, path) as source:
        parquet_file = open_parquet(source, path)
        token_value_type(parquet_file.schema_arrow, column, path)
        start, end = units if units is not None else (0, parquet_file.metadata.num_row_groups)
        if end > parquet_file.metadata.num_row_groups:
            raise InputError(f"shard {path} has {parquet_file.metadata.num_row_groups} row groups, the plan reads "
                             f"{start}..{end - 1}; the file changed during the run (rerun on a stable copy)")
        span = sum(parquet_file.metadata.row_group(g).num_rows for g in range(start, end))
        if rows is not None and tuple(rows) != (first_row, first_row + span):  # the file changed since planning:
            yield from _whole_documents(path, fmt, column, batch_size, whole)  # read as planned, counts then differ
            return
        for group in range(start, end):
            pieces = _row_group_pieces(source, parquet_file, group, column, first_row, batch_size, max_tokens, path)
            for piece in pieces:
                if validate:
                    validate_token_batch(piece.docs, path=path, first_row=piece.first_row)
                yield piece
            first_row += parquet_file.metadata.row_group(group).num_rows


def reads_by_pages(row_group: pq.RowGroupMetaData, leaf: int | None, max_tokens: int) -> bool:
    """Whether :func:`iter_token_pieces` reads this row group page by page: its token leaf
    holds more than ``max_tokens`` levels and a mean of more than max_tokens / PAGE_READ_MEAN_DIVISOR
    per row (pyarrow decodes a row whole; the page reader is slower on short documents)."""
    if leaf is None or row_group.num_rows == 0:
        return False
    num_levels = row_group.column(leaf).num_values
    return num_levels > max_tokens and num_levels * PAGE_READ_MEAN_DIVISOR > max_tokens * row_group.num_rows


def _row_group_pieces(source: pa.NativeFile, parquet_file: pq.ParquetFile, group: int, column: str,
                      first_row: int, batch_size: int, max_tokens: int, path: str) -> Iterator[TokenPiece]:
    leaf = token_leaf_index(parquet_file.schema, column)
    if reads_by_pages(parquet_file.metadata.row_group(group), leaf, max_tokens):
        pieces = iter_row_group_pieces(source, parquet_file, group, column, first_row, max_tokens, path)
        try:
            first = next(pieces)
        except Unsupported as e:
            log.info("shard %s row group %d: read by pyarrow (page reader: %s)", path, group, e)
        else:
            yield first
            yield from pieces
            return
    for batch in parquet_file.iter_batches(batch_size=batch_size, columns=[column], row_groups=[group]):
        lists = batch.column(0)
        for start in range(0, len(lists), batch_size):
            docs = lists.slice(start, batch_size)
            yield TokenPiece(first_row, docs, False, np.diff(docs.offsets.to_numpy()).astype(np.int64))
            first_row += len(docs)


def _whole_documents(path: str, fmt: str, column: str, batch_size: int, options: dict) -> Iterator[TokenPiece]:
    for batch in iter_document_batches(path, fmt, column, batch_size, **options):
        docs = batch.tokens
        yield TokenPiece(batch.first_row, docs, False, np.diff(docs.offsets.to_numpy()).astype(np.int64), batch.sides)
