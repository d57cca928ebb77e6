"""Checks on token lists as they are read: non-null, non-negative integers
(:func:`validate_token_batch`), and ids that fit the output dtype (:func:`check_tokens_fit`),
each failure one InputError naming the shard and row. Vectorized; no Ray.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from raypack.errors import InputError
from raypack.rules.arrays import numpy_values


def check_pad_in_vocabulary(pad_token: int, vocab_size: int) -> None:
    """The pad id must be a row of the model's embedding: ``pack --tokenizer`` and a tokenized corpus's pack
    (its manifest records the vocabulary) refuse it alike."""
    if not 0 <= pad_token < vocab_size:
        raise InputError(f"--pad-token {pad_token} (pad_token in a config) is outside the tokenizer's vocabulary "
                         f"[0, {vocab_size}), so a model's embedding has no row for it; give an id below {vocab_size} "
                         "(the EOS id is usual: padding is masked out)")


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
            f"shard {path} row {first_row + row}: the document is null"
            f"{' (null, or the line has no such key)' if '.json' in str(path) else ''}; every document must be a "
            "list of token ids (write [] for an empty document)"
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
        array = numpy_values(values)
        if array.min() < 0:
            at = int(np.argmax(array < 0))
            raise InputError(
                f"shard {path} row {first_row + _row_of(tokens, at)}: token {int(array[at])} is "
                "negative; token ids must be >= 0"
            )


def validate_side_batch(tokens: pa.Array, sides: Sequence[pa.Array], names: Sequence[str], token_column: str, *,
                        path: str, first_row: int) -> None:
    """Raise InputError unless each side column in ``sides`` (named ``names``) is a list of
    non-null integers or bools holding exactly one value per token of its row of ``tokens``.

    One vectorised comparison of list lengths per column (O(rows)), plus a null count."""
    if not sides:
        return
    token_lens = numpy_values(pc.list_value_length(tokens))
    for name, side in zip(names, sides):
        side_type = side.type
        if not (pa.types.is_list(side_type) or pa.types.is_large_list(side_type)) or not (
                pa.types.is_integer(side_type.value_type) or pa.types.is_boolean(side_type.value_type)):
            raise InputError(f"shard {path}: column {name} has type {side_type}; an extra column must be a list of "
                             "integers or bools (one value per token)")
        side_lens = numpy_values(pc.list_value_length(side))  # null rows: NaN or 0
        bad = side.is_null().to_numpy(zero_copy_only=False) | (side_lens != token_lens)
        if bad.any():
            row = int(np.argmax(bad))
            found = "no list (null)" if side[row].as_py() is None else f"{int(side_lens[row])} values"
            raise InputError(f"shard {path} row {first_row + row}: column {name} has {found}, {token_column} has "
                             f"{int(token_lens[row])}; each side column needs one value per token")
        if side.flatten().null_count:
            at = int(np.flatnonzero(side.flatten().is_null().to_numpy(zero_copy_only=False))[0])
            raise InputError(f"shard {path} row {first_row + _row_of(side, at)}: column {name} holds a null value; "
                             "side column values must be non-null integers or bools")


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
    (as from ``raypack.rules.core.flatten_documents``); ``first_row`` is the shard-local row of
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
    offsets = numpy_values(tokens.offsets)
    return offsets - offsets[0]
