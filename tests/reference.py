"""A naive packer written from the rules alone, token by token, for tests to compare against.

The rules: documents are concatenated end to end, in order; the stream is cut into chunks
of ``context_length`` (C) tokens at positions 0, C, 2C, ...; only the final chunk of the
whole stream is padded with ``pad_token``. Each position carries the index of its document,
-1 on padding; an empty document takes an index and no positions.

Deliberately slow and obvious: one Python loop iteration per token, no numpy tricks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def token_dtype(docs: Any) -> np.dtype:
    """The token dtype the rules ask for: the Arrow value type, the numpy arrays' dtype, else int64."""
    if isinstance(docs, (pa.Array, pa.ChunkedArray)):
        return np.dtype(docs.type.value_type.to_pandas_dtype())
    dtypes = {doc.dtype for doc in docs if isinstance(doc, np.ndarray)}
    if len(dtypes) > 1:
        raise ValueError(f"reference: mixed numpy dtypes {sorted(map(str, dtypes))} are not modelled")
    return dtypes.pop() if dtypes else np.dtype(np.int64)


def _as_python_docs(docs: Any) -> list[list[int]]:
    if isinstance(docs, (pa.Array, pa.ChunkedArray)):
        return [list(doc) for doc in docs.to_pylist()]
    return [[int(token) for token in doc] for doc in docs]


def naive_pack(
    docs: Any, context_length: int, pad_token: int, dtype: npt.DTypeLike | None = None
) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]]:
    """Pack ``docs`` by the rules. Returns ``(input_ids, doc_ids)``, both (n_chunks, C).

    input_ids has ``dtype`` (default: :func:`token_dtype` of ``docs``); doc_ids is int64.
    """
    dtype = token_dtype(docs) if dtype is None else np.dtype(dtype)
    stream_tokens: list[int] = []
    stream_doc_ids: list[int] = []
    for doc_id, doc in enumerate(_as_python_docs(docs)):
        for token in doc:
            stream_tokens.append(token)
            stream_doc_ids.append(doc_id)

    num_chunks = -(-len(stream_tokens) // context_length)
    input_ids = [[pad_token] * context_length for _ in range(num_chunks)]
    doc_ids = [[-1] * context_length for _ in range(num_chunks)]
    for position, (token, doc_id) in enumerate(zip(stream_tokens, stream_doc_ids)):
        row, column = divmod(position, context_length)
        input_ids[row][column] = token
        doc_ids[row][column] = doc_id

    return (
        np.array(input_ids, dtype=dtype).reshape(num_chunks, context_length),
        np.array(doc_ids, dtype=np.int64).reshape(num_chunks, context_length),
    )


def naive_segments(doc_ids_row: list[int]) -> list[tuple[int, int]]:
    """Maximal runs of one id in a chunk's dense doc ids, as ``(doc_id, length)`` pairs."""
    runs: list[tuple[int, int]] = []
    for doc_id in doc_ids_row:
        if runs and runs[-1][0] == doc_id:
            runs[-1] = (doc_id, runs[-1][1] + 1)
        else:
            runs.append((doc_id, 1))
    return runs
