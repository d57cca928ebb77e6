"""Stream one shard's documents as validated token batches. pyarrow/numpy only, no Ray.

``iter_token_batches`` reads a shard in file order with bounded memory and yields
``(first_row, tokens)``: ``tokens`` is a list/large_list array of integer token ids holding at
most ``batch_size`` documents, ``first_row`` the shard-local index of its first document.
Every batch is checked before it is yielded (vectorised, O(tokens) at numpy speed):

  * no null documents (an empty document is ``[]``, not null);
  * no null tokens inside a document;
  * no negative token ids.

``check_tokens_fit`` adds the one check that depends on the output: every token id fits the
output token dtype. Each failure raises ``InputError`` naming the shard, the row and the value.
"""

from __future__ import annotations

import logging
from typing import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from raypack.errors import InputError
from raypack.shards import (
    JSON_BLOCK_SIZE,
    iter_ipc_batches,
    iter_jsonl_lists,
    open_input_file,
    open_parquet,
    resolve_filesystem,
    token_value_type,
)

__all__ = ["check_tokens_fit", "iter_token_batches", "validate_token_batch"]

logger = logging.getLogger(__name__)

FORMATS = ("parquet", "jsonl", "arrow")


def iter_token_batches(
    path: str,
    fmt: str,
    column: str = "input_ids",
    batch_size: int = 8192,
    *,
    json_block_size: int = JSON_BLOCK_SIZE,
    validate: bool = True,
) -> Iterator[tuple[int, pa.ListArray | pa.LargeListArray]]:
    """Yield ``(first_row, tokens)`` for ``path`` in file order, each batch validated.

    tokens: list<int*> or large_list<int*> array of 1..batch_size documents (zero-copy slices
    of what the format reader produced; JSONL gives list<int64>). Consecutive batches are
    contiguous: ``first_row`` of the next batch is this one's ``first_row + len(tokens)``.
    Memory: one Parquet batch, one JSON block or one IPC record batch at a time.
    ``validate=False`` skips the token checks (for a pass that reads only document lengths).
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} must be one of {', '.join(FORMATS)}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1")
    fs, fs_path = resolve_filesystem(path)
    if fmt == "parquet":
        lists_iter = _parquet_lists(fs, fs_path, path, column, batch_size)
    elif fmt == "arrow":
        lists_iter = _ipc_lists(fs, fs_path, path, column)
    else:
        lists_iter = iter_jsonl_lists(fs, fs_path, path, column, block_size=json_block_size)
    first_row = 0
    for lists in lists_iter:
        for start in range(0, len(lists), batch_size):
            tokens = lists.slice(start, batch_size)
            if validate:
                validate_token_batch(tokens, path=path, first_row=first_row)
            yield first_row, tokens
            first_row += len(tokens)


def _parquet_lists(fs, fs_path: str, path: str, column: str, batch_size: int):
    with open_input_file(fs, fs_path, path) as source:
        parquet_file = open_parquet(source, path)
        token_value_type(parquet_file.schema_arrow, column, path)
        batches = parquet_file.iter_batches(batch_size=batch_size, columns=[column])
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as e:
                raise InputError(
                    f"shard {path}: cannot read Parquet data ({_msg(e)}); re-write the file"
                ) from e
            if batch is None:
                return
            yield batch.column(0)


def _ipc_lists(fs, fs_path: str, path: str, column: str):
    for schema, batch in iter_ipc_batches(fs, fs_path, path):
        if batch is None:
            token_value_type(schema, column, path)
            continue
        yield batch.column(schema.get_field_index(column))


def validate_token_batch(tokens: pa.Array, *, path: str, first_row: int) -> None:
    """Raise InputError unless ``tokens`` is a list array of non-null, non-negative integers.

    tokens: list/large_list array (may be a slice); ``first_row`` is the shard-local row of
    ``tokens[0]``, used only in messages. Reads values through ``flatten()``, never through
    the raw ``.values`` child, so slices are checked exactly.
    """
    if not (pa.types.is_list(tokens.type) or pa.types.is_large_list(tokens.type)):
        raise InputError(
            f"shard {path}: token column has type {tokens.type}; it must be a list of integers"
        )
    if not pa.types.is_integer(tokens.type.value_type):
        raise InputError(
            f"shard {path}: token ids have type {tokens.type.value_type}; they must be integers"
        )
    if tokens.null_count:
        row = int(np.flatnonzero(tokens.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(
            f"shard {path} row {first_row + row}: the document is null; every document must be "
            "a list of token ids (write [] for an empty document)"
        )
    values = tokens.flatten()
    if values.null_count:
        at = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        row = _row_of(tokens, at)
        raise InputError(
            f"shard {path} row {first_row + row}: token {at - _row_start(tokens, row)} of the "
            "document is null; token ids must be non-null integers"
        )
    if pa.types.is_signed_integer(values.type) and len(values):
        array = values.to_numpy()
        if array.min() < 0:
            at = int(np.argmax(array < 0))
            raise InputError(
                f"shard {path} row {first_row + _row_of(tokens, at)}: token {int(array[at])} is "
                "negative; token ids must be >= 0"
            )


def check_tokens_fit(
    tokens: npt.NDArray[np.integer],
    lengths: npt.NDArray[np.integer],
    dtype: npt.DTypeLike | pa.DataType,
    *,
    path: str,
    first_row: int,
) -> None:
    """Raise InputError if a token id does not fit ``dtype`` (the output token dtype).

    tokens: (T,) flat token ids of a batch; lengths: (n,) document lengths summing to T
    (as from ``raypack.core.flatten_documents``); ``first_row`` is the shard-local row of
    the batch's first document. Costs one min and one max unless a token is out of range.
    """
    target = np.dtype(dtype.to_pandas_dtype()) if isinstance(dtype, pa.DataType) else np.dtype(dtype)
    if target.kind not in "iu":
        raise ValueError(f"dtype={target} must be an integer dtype")
    tokens = np.asarray(tokens)
    if tokens.size == 0 or np.can_cast(tokens.dtype, target, casting="safe"):
        return
    info = np.iinfo(target)
    too_low, too_high = int(tokens.min()) < info.min, int(tokens.max()) > info.max
    if not (too_low or too_high):
        return
    bad = tokens < tokens.dtype.type(info.min) if too_low else tokens > tokens.dtype.type(info.max)
    at = int(np.argmax(bad))
    row = int(np.searchsorted(np.cumsum(lengths), at, side="right"))
    raise InputError(
        f"shard {path} row {first_row + row}: token {int(tokens[at])} does not fit the output "
        f"token dtype {target} ({info.min}..{info.max}); set token_dtype to a wider type or 'auto'"
    )


def _row_of(tokens: pa.Array, flat_index: int) -> int:
    """The row (within ``tokens``) holding flattened value ``flat_index``; no null rows."""
    starts = _relative_offsets(tokens)
    return int(np.searchsorted(starts, flat_index, side="right")) - 1


def _row_start(tokens: pa.Array, row: int) -> int:
    return int(_relative_offsets(tokens)[row])


def _relative_offsets(tokens: pa.Array) -> np.ndarray:
    offsets = tokens.offsets.to_numpy()
    return offsets - offsets[0]


def _msg(error: BaseException) -> str:
    return " ".join(str(error).split())
