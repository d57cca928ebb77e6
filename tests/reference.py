"""A naive packer written from the rules alone, token by token, for tests to compare against.

The rules: documents are concatenated end to end, in order; the stream is cut into chunks
of ``context_length`` (C) tokens at positions 0, C, 2C, ...; only the final chunk of the
whole stream is padded with ``pad_token``. Each position carries the index of its document,
-1 on padding; an empty document takes an index and no positions.

Deliberately slow and obvious: one Python loop iteration per token, no numpy tricks.
Also here: :func:`naive_content_sha256`, a packed output's content digest from docs/FORMAT.md.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def naive_best_fit(
    docs: Any, context_length: int, pad_token: int, window: int = 0, dtype: npt.DTypeLike | None = None
) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]]:
    """Best-fit pack ``docs`` by the rules of the ``best_fit`` strategy, one item at a time.

    Windows of ``window`` documents (0: all); a document is cut into pieces of C tokens from its
    start, the last piece possibly shorter; pieces go longest first (ties: earlier piece first)
    into the open chunk with the least room that holds them (ties: the chunk opened first), else
    into a new chunk; chunks in opening order, pieces inside by doc id, then padding.
    Returns ``(input_ids, doc_ids)``, both (n_chunks, C).
    """
    dtype = token_dtype(docs) if dtype is None else np.dtype(dtype)
    docs = _as_python_docs(docs)
    c = context_length
    step = window or max(1, len(docs))
    rows_tokens: list[list[int]] = []
    rows_ids: list[list[int]] = []
    for first in range(0, len(docs), step):
        pieces = [(doc_id, docs[doc_id][at:at + c])
                  for doc_id in range(first, min(len(docs), first + step))
                  for at in range(0, len(docs[doc_id]), c)]
        order = sorted(range(len(pieces)), key=lambda k: (-len(pieces[k][1]), k))
        chunks: list[list[int]] = []  # piece numbers per chunk, in opening order
        for k in order:
            rooms = [c - sum(len(pieces[j][1]) for j in chunk) for chunk in chunks]
            fitting = [(room, index) for index, room in enumerate(rooms) if room >= len(pieces[k][1])]
            if fitting:
                chunks[min(fitting)[1]].append(k)
            else:
                chunks.append([k])
        for chunk in chunks:
            tokens: list[int] = []
            ids: list[int] = []
            for k in sorted(chunk, key=lambda j: pieces[j][0]):
                tokens += pieces[k][1]
                ids += [pieces[k][0]] * len(pieces[k][1])
            rows_tokens.append(tokens + [pad_token] * (c - len(tokens)))
            rows_ids.append(ids + [-1] * (c - len(ids)))
    return (np.array(rows_tokens, dtype=dtype).reshape(-1, c), np.array(rows_ids, dtype=np.int64).reshape(-1, c))


def naive_content_sha256(out: str) -> str:
    """``content_sha256`` of output directory ``out`` from docs/FORMAT.md alone (format version 3):
    every chunk of the files the manifest lists read with plain pyarrow, one row at a time, hashed
    as the format says."""
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    dtype, c, g = np.dtype(manifest["token_dtype"]), manifest["context_length"], manifest["content_group_chunks"]
    rows = [row for entry in manifest["files"]
            for row in pa.ipc.open_file(os.path.join(out, entry["path"])).read_all().to_pylist()]
    chunk_digests = [hashlib.sha256(np.array(row["input_ids"], dtype.newbyteorder("<")).tobytes()
                                    + np.array(row["segment_doc_ids"], "<i8").tobytes()
                                    + np.array(row["segment_lengths"], "<i4").tobytes()).digest() for row in rows]
    group_digests = [hashlib.sha256(b"".join(chunk_digests[k: k + g])).digest() for k in range(0, len(rows), g)]
    header = f"raypack-content-v3\ntoken_dtype={dtype.name}\ncontext_length={c}\nchunks={len(rows)}\ngroup_chunks={g}\n"
    return hashlib.sha256(header.encode("ascii") + b"".join(group_digests)).hexdigest()
