"""The content digest of a packed output (the manifest's ``content_sha256``, format version 3).

It is a function of the chunks alone, so the same chunks give the same digest whatever files,
shards or tasks they were written in. Definition (docs/FORMAT.md), for ``n`` chunks of ``C``
tokens and group size ``G`` (the manifest's ``content_group_chunks``)::

    d_i = sha256(chunk i's C tokens as little-endian token_dtype
                 || its segment_doc_ids as little-endian int64
                 || its segment_lengths as little-endian int32)
    D_g = sha256(d_{gG} || d_{gG+1} || ... || d_{min((g+1)G, n) - 1})      (raw 32-byte digests)
    content_sha256 = hex(sha256(header || D_0 || ... || D_{m-1})),  m = ceil(n / G)
    header = ASCII "raypack-content-v3\\ntoken_dtype={dtype}\\ncontext_length={C}\\nchunks={n}\\ngroup_chunks={G}\\n"

With side columns (``extra_columns``), ``d_i`` also hashes each side column's C values of chunk
i (little-endian, its type; bool as one byte 0/1), in the manifest's order, right after the
tokens; and the header gets the line ``extra_columns={name}:{type}:{fill},...`` after
``token_dtype``. Without them, nothing changes.

A run of consecutive chunks ``[start, end)`` (one chunk file) is summed up on its own by its
*range digests*: in chunk order, the chunk digests of its chunks before the first multiple of G,
the group digests of the groups lying wholly inside it, and the chunk digests of its chunks from
the last multiple of G on (:func:`range_layout` gives the three counts). A file's writer computes
them as it writes (:class:`RangeDigester`); the driver joins the files' range digests in order
(:class:`ContentHasher`), completing the groups that straddle files. So any split of the chunks
gives the same digest.

Cost: every chunk's bytes hashed once more (the file's own sha256 is the other pass) plus three
hashlib calls per chunk; a writer holds at most G chunk digests, a file's range digests are
``32 * (2G + num_chunks / G)`` bytes at most, the driver's hasher O(1).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["CONTENT_GROUP_CHUNKS", "ContentHasher", "RangeDigester", "RangeLayout", "chunk_digests",
           "content_header", "is_range_digests", "range_layout"]

CONTENT_GROUP_CHUNKS = 1024
"""G: chunk digests per group digest. Recorded in the manifest (``content_group_chunks``)."""
DIGEST_BYTES = 32
HEX_CHARS = 2 * DIGEST_BYTES
_HEX_RE = re.compile(r"[0-9a-f]*")


def chunk_digests(input_ids: npt.NDArray[np.integer], segment_offsets: npt.NDArray[np.int64],
                  segment_doc_ids: npt.NDArray[np.int64], segment_lengths: npt.NDArray[np.int32],
                  sides: Sequence[np.ndarray] = ()) -> list[bytes]:
    """``d_i`` (32 raw bytes) of each of ``n`` chunks: ``input_ids`` (n, C), chunk i's segments
    ``[segment_offsets[i], segment_offsets[i+1])`` of the segment arrays, ``sides`` the side
    columns' (n, C) values in manifest order. Cost: the chunks' bytes hashed once, three hashlib
    calls per chunk (plus one per side column), no copy on a little-endian machine."""
    n = int(input_ids.shape[0])
    if n == 0:
        return []
    ids = _le_bytes(input_ids, input_ids.dtype)
    side_bytes = [_le_bytes(side, np.uint8 if side.dtype == np.bool_ else side.dtype) for side in sides]
    doc_ids = _le_bytes(segment_doc_ids, np.dtype(np.int64))
    lengths = _le_bytes(segment_lengths, np.dtype(np.int32))
    row = len(ids) // n
    side_rows = [len(b) // n for b in side_bytes]
    offsets = segment_offsets.tolist()
    digests = []
    for i in range(n):
        start, end = offsets[i], offsets[i + 1]
        digest = hashlib.sha256(ids[i * row: (i + 1) * row])
        for values, side_row in zip(side_bytes, side_rows):
            digest.update(values[i * side_row: (i + 1) * side_row])
        digest.update(doc_ids[start * 8: end * 8])
        digest.update(lengths[start * 4: end * 4])
        digests.append(digest.digest())
    return digests


def _le_bytes(values: np.ndarray, dtype: np.dtype) -> memoryview:
    """``values`` as a flat byte view in little-endian ``dtype`` (a copy only when it is not already)."""
    array = np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<"))
    return memoryview(array.reshape(-1)).cast("B")


def content_header(token_dtype: str, context_length: int, num_chunks: int, group_chunks: int,
                   extra_columns: Sequence[Any] = ()) -> bytes:
    """The bytes hashed before the group digests (see the module docstring); ``extra_columns``:
    (name, type, fill) of each side column."""
    sides = ",".join(f"{name}:{type_name}:{fill}" for name, type_name, fill in extra_columns)
    return (f"raypack-content-v3\ntoken_dtype={np.dtype(token_dtype).name}\n"
            + (f"extra_columns={sides}\n" if sides else "")
            + f"context_length={context_length}\nchunks={num_chunks}\ngroup_chunks={group_chunks}\n").encode("utf-8")


class RangeLayout(NamedTuple):
    """What the range digests of chunks ``[start, end)`` hold, in order: ``head`` chunk digests,
    ``groups`` group digests, ``tail`` chunk digests."""

    head: int
    groups: int
    tail: int

    @property
    def num_digests(self) -> int:
        return self.head + self.groups + self.tail


def range_layout(start: int, end: int, group_chunks: int) -> RangeLayout:
    """The layout of the range digests of chunks ``[start, end)`` (half-open, ``start <= end``)."""
    g = group_chunks
    head_end = min(end, -(-start // g) * g)
    tail_start = max(head_end, end // g * g)
    return RangeLayout(head_end - start, (tail_start - head_end) // g, end - tail_start)


class RangeDigester:
    """The range digests of chunks written in order from ``start``, computed as they are written.
    Memory: at most ``group_chunks`` chunk digests pending plus the finished digests."""

    def __init__(self, start: int, group_chunks: int = CONTENT_GROUP_CHUNKS) -> None:
        self.start = self.next_chunk = start
        self.group_chunks = group_chunks
        self._pending: list[bytes] = []
        self._done: list[bytes] = []

    def add(self, input_ids, segment_offsets, segment_doc_ids, segment_lengths, sides=()) -> None:
        """Digest the next chunks (the arrays as in :func:`chunk_digests`)."""
        for digest in chunk_digests(input_ids, segment_offsets, segment_doc_ids, segment_lengths, sides):
            self._pending.append(digest)
            self.next_chunk += 1
            if self.next_chunk % self.group_chunks == 0:
                self._close_group()

    def _close_group(self) -> None:
        if self.next_chunk - self.group_chunks >= self.start:  # the whole group is in this range
            self._done.append(hashlib.sha256(b"".join(self._pending)).digest())
        else:
            self._done.extend(self._pending)
        self._pending = []

    def hex(self) -> str:
        """The range digests so far, as one string of 64 hex digits per digest."""
        return b"".join(self._done + self._pending).hex()


class ContentHasher:
    """``content_sha256`` of ``num_chunks`` chunks fed in order: as range digests
    (:meth:`add_range`, the driver) or as chunks (:meth:`add_chunks`, verify). O(1) memory."""

    def __init__(self, token_dtype: str, context_length: int, num_chunks: int,
                 group_chunks: int = CONTENT_GROUP_CHUNKS, *, extra_columns: Sequence[Any] = ()) -> None:
        self.num_chunks = num_chunks
        self.group_chunks = group_chunks
        self.next_chunk = 0
        header = content_header(token_dtype, context_length, num_chunks, group_chunks, extra_columns)
        self._outer = hashlib.sha256(header)
        self._group = hashlib.sha256()

    def add_chunks(self, input_ids, segment_offsets, segment_doc_ids, segment_lengths, sides=()) -> None:
        """The next chunks themselves (the arrays as in :func:`chunk_digests`)."""
        self.add_chunk_digests(chunk_digests(input_ids, segment_offsets, segment_doc_ids, segment_lengths, sides))

    def add_chunk_digests(self, digests: Iterable[bytes]) -> None:
        for digest in digests:
            self._group.update(digest)
            self.next_chunk += 1
            if self.next_chunk % self.group_chunks == 0:
                self._outer.update(self._group.digest())
                self._group = hashlib.sha256()

    def add_range(self, start: int, num_chunks: int, digests_hex: str) -> None:
        """The range digests of chunks ``[start, start + num_chunks)``, the next ones.
        Raises ValueError when the range is not the next one or the digests do not fit it."""
        layout = range_layout(start, start + num_chunks, self.group_chunks)
        if start != self.next_chunk or start + num_chunks > self.num_chunks:
            raise ValueError(f"chunks {start}..{start + num_chunks - 1} do not follow chunk {self.next_chunk - 1} "
                             f"inside {self.num_chunks} chunks")
        if not is_range_digests(digests_hex, layout):
            raise ValueError(f"chunks {start}..{start + num_chunks - 1}: {len(digests_hex)} hex digits of range "
                             f"digests, expected {layout.num_digests * HEX_CHARS}")
        raw = bytes.fromhex(digests_hex)
        items = [raw[k: k + DIGEST_BYTES] for k in range(0, len(raw), DIGEST_BYTES)]
        self.add_chunk_digests(items[:layout.head])
        for group_digest in items[layout.head: layout.head + layout.groups]:
            self._outer.update(group_digest)
            self.next_chunk += self.group_chunks
        self.add_chunk_digests(items[layout.head + layout.groups:])

    def hexdigest(self) -> str:
        """``content_sha256``, once all ``num_chunks`` chunks were fed (ValueError otherwise)."""
        if self.next_chunk != self.num_chunks:
            raise ValueError(f"fed {self.next_chunk} chunks, expected {self.num_chunks}")
        outer = self._outer.copy()
        if self.next_chunk % self.group_chunks:
            outer.update(self._group.digest())
        return outer.hexdigest()


def is_range_digests(digests_hex: object, layout: RangeLayout) -> bool:
    """Whether ``digests_hex`` is a string of lowercase hex digits, 64 per digest of ``layout``."""
    return (isinstance(digests_hex, str) and len(digests_hex) == layout.num_digests * HEX_CHARS
            and _HEX_RE.fullmatch(digests_hex) is not None)
