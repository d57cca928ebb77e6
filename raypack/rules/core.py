"""Packing: documents in, fixed-length chunks out. Pure numpy/pyarrow, no Ray, no I/O.

The rules (exact):
  * Documents are concatenated end to end, in order, into one token stream.
  * The stream is cut into chunks of ``context_length`` tokens at global positions
    0, C, 2C, ...; only the final chunk of the whole stream is padded (with ``pad_token``).
  * Each position carries the global index of the document it came from (``doc_ids``),
    ``-1`` on padding. An empty document takes an index and no positions. A document cut by
    a chunk boundary continues in the next chunk with the same id.

Chunks are held compactly: the token matrix plus, per chunk, its *segments* (maximal runs of
one doc id: the pieces of documents that fall in that chunk, and a final padding run).
``Chunks.doc_ids()`` expands them to the dense per-position form. Because doc ids strictly
increase along the stream, segments are canonical: two runs of the same id never touch.

Cost: O(documents + chunks) index work per batch, and no bulk copy of the tokens with
``push_parts``: full chunks are a zero-copy (n, C) view of the batch's tokens, except the one
chunk that completes the partial chunk carried from the batch before (``push`` joins the
parts, which copies them when there are two).
"""

from __future__ import annotations

import numbers
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from raypack.rules.arrays import numpy_values

__all__ = [
    "Chunks",
    "Fragment",
    "StreamPacker",
    "cast_tokens",
    "concat_chunks",
    "flatten_documents",
    "iter_run_slices",
    "pack_sequences",
    "split_document_mask",
    "stitch_fragments",
    "validate_context_length",
    "validate_pad_token",
]

_EMPTY_I64 = np.zeros(0, dtype=np.int64)
_EMPTY_I32 = np.zeros(0, dtype=np.int32)


class Chunks(NamedTuple):
    """``n`` complete chunks of ``C`` tokens, with their segments.

    input_ids:        (n, C) token dtype.
    segment_offsets:  (n + 1,) int64; chunk i's segments are ``[offsets[i], offsets[i+1])``.
    segment_doc_ids:  (S,) int64; the doc id of each segment, -1 for padding.
    segment_lengths:  (S,) int32; each chunk's segment lengths sum to C.
    sides:            side columns as read back (raypack.packed.reader): (n, C) each, in the manifest's
                      order. Packers leave it empty: they carry side values inside ``input_ids``,
                      whose dtype is then a record dtype (raypack.rules.side_columns).
    """

    input_ids: npt.NDArray[np.integer]
    segment_offsets: npt.NDArray[np.int64]
    segment_doc_ids: npt.NDArray[np.int64]
    segment_lengths: npt.NDArray[np.int32]
    sides: tuple[np.ndarray, ...] = ()

    @property
    def num_chunks(self) -> int:
        return int(self.input_ids.shape[0])

    def doc_ids(self) -> npt.NDArray[np.int64]:
        """Dense doc ids, shape (n, C) int64, -1 on padding."""
        dense = np.repeat(self.segment_doc_ids, self.segment_lengths)
        return dense.reshape(self.input_ids.shape)

    @classmethod
    def empty(cls, context_length: int, dtype: npt.DTypeLike) -> Chunks:
        return cls(np.zeros((0, context_length), dtype=dtype), np.zeros(1, np.int64), _EMPTY_I64, _EMPTY_I32)


class Fragment(NamedTuple):
    """A piece of a chunk that one packer could not complete on its own.

    start:            global stream position of its first token.
    input_ids:        (k,) tokens, 0 < k < C.
    segment_doc_ids:  (s,) int64 doc id of each run.
    segment_lengths:  (s,) int32, summing to k.
    """

    start: int
    input_ids: npt.NDArray[np.integer]
    segment_doc_ids: npt.NDArray[np.int64]
    segment_lengths: npt.NDArray[np.int32]


# ----------------------------------------------------------------------------- validation


MAX_CONTEXT_LENGTH = 1 << 24
"""The longest chunk raypack writes or reads: far beyond any model's context, and small enough
that positions, mask sizes and ``chunk * context_length`` stay well inside int64."""


def validate_context_length(context_length: Any) -> int:
    """Return ``context_length`` as an int, or raise naming the value."""
    if isinstance(context_length, bool) or not isinstance(context_length, numbers.Integral):
        raise TypeError(f"context_length={context_length!r} must be an integer >= 1")
    if not 1 <= context_length <= MAX_CONTEXT_LENGTH:
        raise ValueError(f"context_length={context_length} must be in 1..{MAX_CONTEXT_LENGTH} (2**24)")
    return int(context_length)


def validate_pad_token(pad_token: Any, dtype: npt.DTypeLike) -> int | np.void:
    """Return ``pad_token`` as an int if the token dtype can hold it, else raise naming both.

    With side columns (raypack.rules.side_columns) ``dtype`` is a record dtype (opaque ``V{n}``, or
    structured) and ``pad_token`` a scalar of it (the pad token, then each column's fill),
    returned as it is (a structured one's token field is checked)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "V":
        if not isinstance(pad_token, np.void) or pad_token.dtype != dtype:
            raise TypeError(f"pad_token={pad_token!r} must be a scalar of the packed dtype {dtype}")
        if dtype.names:
            validate_pad_token(int(pad_token[0]), dtype[0])
        return pad_token
    if isinstance(pad_token, bool) or not isinstance(pad_token, numbers.Integral):
        raise TypeError(f"pad_token={pad_token!r} must be an integer")
    info = np.iinfo(dtype)
    if not info.min <= pad_token <= info.max:
        raise ValueError(
            f"pad_token={pad_token} does not fit the token dtype {np.dtype(dtype).name} "
            f"(ids {max(int(info.min), 0)}..{info.max}); choose a pad token in that range"
        )
    return int(pad_token)


def cast_tokens(tokens: npt.NDArray[np.integer], dtype: np.dtype) -> npt.NDArray[np.integer]:
    """``tokens`` as ``dtype`` (no copy if already), or ValueError naming a token that does not fit.
    Records (side columns, raypack.rules.side_columns) are never cast: they must have ``dtype``."""
    if tokens.dtype == dtype:
        return tokens
    if tokens.dtype.kind == "V" or np.dtype(dtype).kind == "V":
        raise TypeError(f"tokens of dtype {tokens.dtype} cannot become {dtype}; side columns are combined "
                        "in the packed dtype before packing")
    if not np.can_cast(tokens.dtype, dtype, "safe") and tokens.size:
        info = np.iinfo(dtype)
        low, high = tokens.min(), tokens.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise ValueError(f"token {bad} does not fit the token dtype {dtype.name}")
    return tokens.astype(dtype)


def _check_integer_dtype(dtype: np.dtype, what: str) -> None:
    """Tokens are integers; records (side columns, raypack.rules.side_columns: opaque or structured)
    hold tokens checked when they were made."""
    if dtype.kind == "V":
        return
    if dtype.kind not in "iu":
        raise TypeError(f"{what} have dtype {dtype}; tokens must be integers")


# ----------------------------------------------------------------------------- input forms


def flatten_documents(documents: Any) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]]:
    """Documents as ``(tokens, lengths)``: all tokens flat, in order, and one length per document.

    Accepts an Arrow list/large_list array (sliced too) or chunked array, or a sequence of
    sequences / 1-D integer arrays. Arrow input is read zero-copy through its offsets.
    Python ints become int64; numpy inputs keep their common integer dtype.
    """
    if isinstance(documents, pa.ChunkedArray):
        documents = documents.combine_chunks() if documents.num_chunks != 1 else documents.chunk(0)
    if isinstance(documents, (pa.ListArray, pa.LargeListArray)):
        return _flatten_arrow(documents)
    if isinstance(documents, pa.Array):
        raise TypeError(f"documents of Arrow type {documents.type} must be a list of integers")
    return _flatten_python(documents)


def _flatten_arrow(documents: pa.ListArray | pa.LargeListArray) -> tuple[np.ndarray, np.ndarray]:
    value_type = documents.type.value_type
    if not pa.types.is_integer(value_type):
        raise TypeError(f"documents of Arrow type {documents.type}: tokens must be integers")
    if documents.null_count:
        row = int(np.flatnonzero(documents.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"document {row} is null; every document must be a list (empty is fine)")
    values = documents.flatten()
    if values.null_count:
        raise ValueError("a document holds a null token; tokens must be integers")
    offsets = numpy_values(documents.offsets)
    lengths = np.diff(offsets).astype(np.int64, copy=False)
    return numpy_values(values), lengths


def _flatten_python(documents: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    arrays, typed = zip(*(_as_token_array(doc, i) for i, doc in enumerate(documents))) if len(documents) else ((), ())
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
    dtypes = [a.dtype for a, t in zip(arrays, typed) if t]
    dtype = np.result_type(*dtypes) if dtypes else np.dtype(np.int64)
    if dtype.kind == "f":  # uint64 with a signed type: numpy would promote to float64
        raise TypeError("documents mix uint64 with signed integer dtypes; no integer dtype holds both")
    if not arrays:
        return np.zeros(0, dtype=dtype), lengths
    return np.concatenate(arrays).astype(dtype, copy=False), lengths


def _as_token_array(doc: Any, index: int) -> tuple[np.ndarray, bool]:
    """One document as a 1-D integer array, and whether its dtype should shape the output's.

    numpy arrays keep their dtype (empty ones too); Python sequences become int64, and an
    empty one does not take part in choosing the dtype.
    """
    if isinstance(doc, np.ndarray):
        if doc.ndim != 1:
            raise TypeError(f"document {index} has shape {doc.shape}; each document must be a flat sequence of ints")
        if doc.dtype.kind not in "iu":
            raise TypeError(f"document {index} has tokens of dtype {doc.dtype} (e.g. {_first_bad_token(doc)!r}); "
                            f"tokens must be integers")
        return doc, True
    try:
        array = np.asarray(doc)
    except ValueError as e:  # ragged nesting
        raise TypeError(f"document {index} is not a flat sequence of ints: {e}") from e
    if array.ndim != 1:
        raise TypeError(f"document {index} has shape {array.shape}; each document must be a flat sequence of ints")
    if array.size == 0:
        return np.zeros(0, np.int64), False
    if array.dtype.kind not in "iu" or array.dtype == np.uint64:
        bad = _first_bad_token(doc)
        if isinstance(bad, numbers.Integral) and not isinstance(bad, (bool, np.bool_)):
            raise ValueError(f"document {index} holds token {bad}, which does not fit int64")
        raise TypeError(f"document {index} holds token {bad!r} of type {type(bad).__name__}; tokens must be integers")
    return array.astype(np.int64, copy=False), True


def _first_bad_token(doc: Any) -> Any:
    """The first element that is not an int64-sized integer (error path only)."""
    int64 = np.iinfo(np.int64)
    for token in doc:
        if isinstance(token, (bool, np.bool_)) or not isinstance(token, numbers.Integral):
            return token
        if not int64.min <= token <= int64.max:
            return token
    return doc[0]


def iter_run_slices(
    tokens: npt.NDArray[np.integer], lengths: npt.NDArray[np.integer], first_doc_id: int, max_tokens: int,
    first: int | None = None,
) -> Iterator[tuple[npt.NDArray[np.integer], npt.NDArray[np.int64], int]]:
    """Cut flat documents into consecutive slices of at most ``max_tokens`` tokens.

    Yields ``(tokens, run_lengths, first_doc_id)`` per slice: a zero-copy view of the tokens,
    the (n,) int64 lengths of the runs of consecutive documents it holds, and the id of its
    first run's document. A document cut by a slice boundary ends one slice and starts the
    next with the same id; an empty document goes with the slice holding its position (the
    last one at the end). Always at least one slice. ``first`` (1..max_tokens): the first slice
    holds at most that many tokens and the next ones ``max_tokens`` each, so a caller chooses
    where the boundaries fall. Cost: O(documents + slices).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    if first is not None and not 1 <= first <= max_tokens:
        raise ValueError(f"first={first} must be in [1, max_tokens={max_tokens}]")
    shift = 0 if first is None else max_tokens - first  # slices cut the positions [shift, shift + size)
    size = int(tokens.size)
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths) + shift
    starts = ends - lengths
    num_slices = max(1, -(-(size + shift) // max_tokens))
    first_slice = np.minimum(starts // max_tokens, num_slices - 1)
    last_slice = np.minimum(np.maximum(starts, ends - 1) // max_tokens, num_slices - 1)
    for k in range(num_slices):
        lo = int(np.searchsorted(last_slice, k, side="left"))
        hi = int(np.searchsorted(first_slice, k, side="right"))
        start, end = max(k * max_tokens, shift), min((k + 1) * max_tokens, size + shift)
        run_lengths = np.clip(ends[lo:hi], start, end) - np.clip(starts[lo:hi], start, end)
        yield tokens[start - shift:end - shift], run_lengths, first_doc_id + lo


# ----------------------------------------------------------------------------- segments


def _merge_runs(doc_ids: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop zero lengths and merge consecutive equal ids, so runs are canonical."""
    keep = lengths > 0
    doc_ids, lengths = doc_ids[keep], lengths[keep]
    if doc_ids.size < 2 or np.all(doc_ids[1:] != doc_ids[:-1]):
        return doc_ids, lengths
    starts = np.flatnonzero(np.r_[True, doc_ids[1:] != doc_ids[:-1]])
    return doc_ids[starts], np.add.reduceat(lengths, starts)


def _cut_segments(
    doc_ids: np.ndarray, lengths: np.ndarray, context_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split non-empty runs (the first starting on a chunk boundary) at every multiple of C.

    Returns ``(segment_starts, segment_doc_ids, segment_lengths)`` over the local stream, in
    order; starts are int64 positions from 0. O(runs + segments), no sort: run r starting at
    s in chunk a and ending in chunk b becomes pieces starting at s, (a+1)C, ..., bC.
    """
    ends = np.cumsum(lengths)
    starts = ends - lengths
    first_chunk = starts // context_length
    pieces = (ends - 1) // context_length - first_chunk + 1
    run_of_piece = np.repeat(np.arange(lengths.size), pieces)
    piece_in_run = np.arange(run_of_piece.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    seg_starts = np.where(piece_in_run == 0, starts[run_of_piece],
                          (first_chunk[run_of_piece] + piece_in_run) * context_length)
    seg_ends = np.minimum(ends[run_of_piece], (seg_starts // context_length + 1) * context_length)
    return seg_starts, doc_ids[run_of_piece], (seg_ends - seg_starts).astype(np.int32)


def split_document_mask(lengths: npt.NDArray[np.integer], start: int, context_length: int) -> npt.NDArray[np.bool_]:
    """(n,) bool: which documents, laid end to end from stream position ``start``, cross a chunk boundary.

    concat's rule: chunk k holds positions ``[k*C, (k+1)*C)``; an empty document crosses none.
    O(n).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = start + np.cumsum(lengths)
    starts = ends - lengths
    return (lengths > 0) & (starts // context_length != (ends - 1) // context_length)


# ----------------------------------------------------------------------------- streaming


class StreamPacker:
    """Packs a stream of documents fed in batches, carrying the partial chunk between them.

    ``start_position`` is where this stream begins in the global stream. When it is not a
    multiple of C, the first ``C - start_position % C`` tokens finish a chunk begun by an
    earlier stream: they are kept apart as ``head`` (a :class:`Fragment`), never padded.
    ``finish(pad=False)`` keeps the incomplete last chunk as ``tail`` for a driver to stitch
    with its neighbour's ``head``; ``finish(pad=True)`` pads it (the end of the whole stream).

    Feeding the same documents split into batches in any way gives identical output.
    """

    def __init__(
        self,
        context_length: int,
        pad_token: int,
        *,
        start_position: int = 0,
        dtype: npt.DTypeLike | None = None,
    ) -> None:
        self.context_length = validate_context_length(context_length)
        self.pad_token = pad_token
        self.position = int(start_position)
        self.dtype = None if dtype is None else np.dtype(dtype)
        if self.dtype is not None:
            _check_integer_dtype(self.dtype, "the token dtype")
            validate_pad_token(pad_token, self.dtype)
        self._head_space = (-self.position) % self.context_length
        self._head_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._carry: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.head: Fragment | None = None
        self.tail: Fragment | None = None
        self._head_start = self.position

    # -- public

    def push(self, documents: Any, first_doc_id: int) -> Chunks:
        """Add a batch of documents whose first has global id ``first_doc_id``; return full chunks."""
        return _join(self.push_parts(documents, first_doc_id), self.context_length)

    def push_parts(self, documents: Any, first_doc_id: int) -> list[Chunks]:
        """Like :meth:`push`, but the full chunks come as up to two consecutive parts, so the
        tokens are never copied in bulk: the chunk completing the carried partial one (copied,
        one chunk), then the rest as a zero-copy (n, C) view of the batch's tokens."""
        tokens, lengths = flatten_documents(documents)
        doc_ids = np.arange(first_doc_id, first_doc_id + lengths.size, dtype=np.int64)
        return self.push_runs_parts(tokens, lengths, doc_ids)

    def push_runs(self, tokens: np.ndarray, lengths: np.ndarray, doc_ids: np.ndarray) -> Chunks:
        """Add flat tokens in runs of ``lengths`` labelled ``doc_ids``; return full chunks."""
        return _join(self.push_runs_parts(tokens, lengths, doc_ids), self.context_length)

    def push_runs_parts(self, tokens: np.ndarray, lengths: np.ndarray, doc_ids: np.ndarray) -> list[Chunks]:
        """:meth:`push_runs` as consecutive parts (see :meth:`push_parts`)."""
        tokens = self._to_dtype(tokens)
        doc_ids, lengths = _merge_runs(np.asarray(doc_ids, np.int64), np.asarray(lengths, np.int64))
        self.position += tokens.size
        if self._head_space:
            tokens, doc_ids, lengths = self._fill_head(tokens, doc_ids, lengths)
        parts = []
        if self._carry is not None:
            need = self.context_length - self._carry[0].size
            if tokens.size < need:  # the batch does not complete the carried chunk
                return [self._emit(*self._prepend_carry(tokens, doc_ids, lengths))]
            (f_ids, f_lens), (doc_ids, lengths) = _split_runs(doc_ids, lengths, need)
            parts.append(self._emit(*self._prepend_carry(tokens[:need], f_ids, f_lens)))
            tokens = tokens[need:]
        parts.append(self._emit(tokens, doc_ids, lengths))
        return parts

    def finish(self, *, pad: bool = True) -> Chunks:
        """End the stream. With ``pad`` the last partial chunk is padded and returned."""
        self._close_head()
        dtype = self.dtype or np.dtype(np.int64)
        carry, self._carry = self._carry, None
        if carry is None:
            return Chunks.empty(self.context_length, dtype)
        tokens, doc_ids, lengths = carry
        start = self.position - tokens.size
        if not pad:
            self.tail = Fragment(start, tokens, doc_ids, lengths.astype(np.int32))
            return Chunks.empty(self.context_length, dtype)
        return _pad_chunk(tokens, doc_ids, lengths, self.context_length, validate_pad_token(self.pad_token, dtype))

    # -- internals

    def _to_dtype(self, tokens: np.ndarray) -> np.ndarray:
        _check_integer_dtype(tokens.dtype, "tokens")
        if self.dtype is None and tokens.size == 0:
            return tokens  # an empty batch does not decide the dtype
        if self.dtype is None:
            self.dtype = tokens.dtype
            validate_pad_token(self.pad_token, self.dtype)
        return cast_tokens(tokens, self.dtype)

    def _fill_head(self, tokens, doc_ids, lengths):
        take = min(self._head_space, tokens.size)
        (h_ids, h_lens), (r_ids, r_lens) = _split_runs(doc_ids, lengths, take)
        self._head_parts.append((tokens[:take].copy(), h_ids, h_lens))
        self._head_space -= take
        if self._head_space == 0:
            self._close_head()
        return tokens[take:], r_ids, r_lens

    def _close_head(self) -> None:
        if not self._head_parts:
            self._head_space = 0
            return
        tokens = np.concatenate([p[0] for p in self._head_parts])
        ids, lens = _merge_runs(np.concatenate([p[1] for p in self._head_parts]),
                                np.concatenate([p[2] for p in self._head_parts]))
        self._head_parts = []
        self._head_space = 0
        if tokens.size:
            self.head = Fragment(self._head_start, tokens, ids, lens.astype(np.int32))

    def _prepend_carry(self, tokens, doc_ids, lengths):
        c_tokens, c_ids, c_lens = self._carry
        self._carry = None
        ids, lens = _merge_runs(np.concatenate([c_ids, doc_ids]), np.concatenate([c_lens, lengths]))
        return _concat_tokens(c_tokens, tokens), ids, lens

    def _emit(self, tokens, doc_ids, lengths) -> Chunks:
        c = self.context_length
        num_full = tokens.size // c
        full_len = num_full * c
        starts, seg_ids, seg_lens = _cut_segments(doc_ids, lengths, c)
        num_full_segs = int(np.searchsorted(starts, full_len))
        if tokens.size > full_len:
            self._carry = (tokens[full_len:].copy(), seg_ids[num_full_segs:],
                           seg_lens[num_full_segs:].astype(np.int64))
        offsets = np.searchsorted(starts[:num_full_segs], np.arange(num_full + 1, dtype=np.int64) * c)
        return Chunks(tokens[:full_len].reshape(num_full, c), offsets.astype(np.int64),
                      seg_ids[:num_full_segs], seg_lens[:num_full_segs])


def _join(parts: list[Chunks], context_length: int) -> Chunks:
    """Consecutive parts as one Chunks (no copy unless two parts hold chunks)."""
    full = [p for p in parts if p.num_chunks]
    if len(full) > 1:
        return concat_chunks(full, context_length, full[0].input_ids.dtype)
    return full[0] if full else parts[-1]


def _split_runs(doc_ids: np.ndarray, lengths: np.ndarray, at: int):
    """Split runs at token position ``at``: ((ids, lens) before, (ids, lens) after)."""
    ends = np.cumsum(lengths)
    k = int(np.searchsorted(ends, at, side="left"))  # run containing position at-1 (or first after)
    if k >= lengths.size:
        return (doc_ids, lengths), (doc_ids[:0], lengths[:0])
    before_in_k = at - (int(ends[k - 1]) if k else 0)
    head_ids, head_lens = doc_ids[: k + 1].copy(), lengths[: k + 1].copy()
    head_lens[-1] = before_in_k
    rest_ids, rest_lens = doc_ids[k:].copy(), lengths[k:].copy()
    rest_lens[0] -= before_in_k
    return _merge_runs(head_ids, head_lens), _merge_runs(rest_ids, rest_lens)


def _concat_tokens(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    out = np.empty(first.size + second.size, dtype=first.dtype)
    out[: first.size] = first
    out[first.size:] = second
    return out


def _pad_chunk(tokens, doc_ids, lengths, context_length: int, pad_token: int) -> Chunks:
    num_pad = context_length - tokens.size
    chunk = np.full(context_length, pad_token, dtype=tokens.dtype)
    chunk[: tokens.size] = tokens
    seg_ids = np.append(doc_ids, -1) if num_pad else doc_ids
    seg_lens = np.append(lengths, num_pad) if num_pad else lengths
    return Chunks(chunk.reshape(1, context_length), np.array([0, seg_ids.size], np.int64),
                  seg_ids.astype(np.int64), seg_lens.astype(np.int32))


# ----------------------------------------------------------------------------- assembling


def concat_chunks(parts: Sequence[Chunks], context_length: int, dtype: npt.DTypeLike) -> Chunks:
    """Concatenate chunk batches in order."""
    parts = [p for p in parts if p.num_chunks]
    if not parts:
        return Chunks.empty(context_length, dtype)
    if len(parts) == 1:
        return parts[0]
    seg_counts = np.array([p.segment_doc_ids.size for p in parts], np.int64)
    bases = np.concatenate([[0], np.cumsum(seg_counts)[:-1]])
    offsets = np.concatenate([parts[0].segment_offsets[:1]] + [p.segment_offsets[1:] + b for p, b in zip(parts, bases)])
    return Chunks(
        np.concatenate([p.input_ids for p in parts]),
        offsets,
        np.concatenate([p.segment_doc_ids for p in parts]),
        np.concatenate([p.segment_lengths for p in parts]),
        tuple(np.concatenate(columns) for columns in zip(*(p.sides for p in parts))),
    )


def stitch_fragments(
    fragments: Sequence[Fragment], context_length: int, pad_token: int, *, pad: bool, dtype: npt.DTypeLike
) -> Chunks:
    """Join contiguous fragments (the pieces of chunks that straddle streams) into chunks.

    The first fragment must start on a chunk boundary and each next one where the previous
    ended. With ``pad`` (the end of the whole stream) a last partial chunk is padded; without
    it the fragments must fill whole chunks.
    """
    if not fragments:
        return Chunks.empty(context_length, dtype)
    if fragments[0].start % context_length:
        raise RuntimeError(f"stitching starts mid-chunk at position {fragments[0].start}")
    packer = StreamPacker(context_length, pad_token, start_position=fragments[0].start, dtype=dtype)
    out = []
    position = fragments[0].start
    for frag in fragments:
        if frag.start != position:
            raise RuntimeError(f"fragments are not contiguous: expected position {position}, got {frag.start}")
        position += frag.input_ids.size
        out.append(packer.push_runs(frag.input_ids, frag.segment_lengths, frag.segment_doc_ids))
    out.append(packer.finish(pad=pad))
    if packer.tail is not None:
        raise RuntimeError(f"stitched fragments end mid-chunk at position {position}")
    return concat_chunks(out, context_length, dtype)


def pack_sequences(
    examples: Any, context_length: int, pad_token: int
) -> tuple[npt.NDArray[np.integer], npt.NDArray[np.int64]]:
    """Pack documents into ``ceil(total_tokens / C)`` chunks; pad only the final chunk.

    Returns ``(input_ids, doc_ids)``, both of shape (n_chunks, C): input_ids in the examples'
    integer dtype (int64 for Python ints), doc_ids int64 with each example's index, -1 on padding.
    """
    context_length = validate_context_length(context_length)
    tokens, lengths = flatten_documents(examples)
    validate_pad_token(pad_token, tokens.dtype)
    packer = StreamPacker(context_length, pad_token, dtype=tokens.dtype)
    doc_ids = np.arange(lengths.size, dtype=np.int64)
    chunks = concat_chunks(
        [packer.push_runs(tokens, lengths, doc_ids), packer.finish(pad=True)], context_length, tokens.dtype
    )
    input_ids = chunks.input_ids if chunks.input_ids.flags.writeable else chunks.input_ids.copy()
    return input_ids, chunks.doc_ids()
