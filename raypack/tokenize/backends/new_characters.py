"""Documents holding characters newer than Unicode 14.0 go to the reference library.

A fast backend and the reference library (``tokenizers``, ``tiktoken``) each carry their own copy
of Unicode's character properties, from different Unicode versions: the split regexes' ``\\p{L}``
and ``\\p{N}``, and a normalizer's combining classes, read them. For a character that one side
knows and the other does not, the two can cut a text differently. Measured (every code point in
eight contexts, tests/tokenize/test_new_characters.py): gigatoken 0.10 differs from
``tiktoken.encode_ordinary`` (cl100k_base) and from ``tokenizers`` (a byte-level BPE) on 4,657
code points, all of them unassigned in Unicode 14.0, such as U+11DB6 and U+A7CE (Unicode 17.0); on
every code point assigned in 14.0 they agree.

So every document holding a code point unassigned in Unicode 14.0 (raypack.tokenize.backends.unassigned:
characters of a later Unicode, and noncharacters) is encoded again by the reference library and
its ids replace the backend's. The set is fixed, not this Python's ``unicodedata``, which a newer
Python would make smaller than the backends' own tables. Real text rarely holds such a character
(the newest emoji and scripts, Unicode tables themselves), so the reference's speed costs little.
The ids are the reference's whatever the backend.

Cost: one pass over a piece's UTF-8 bytes (its maximum) when the piece is ASCII; otherwise, in
blocks of SCAN_BLOCK bytes, one more to find the characters past U+007F, whose first two bytes are
looked up in a 64 KiB table of the prefixes new characters have (which rules out whole scripts),
then only those with such a prefix decoded and looked up in a 1.1 MB table (both built once per
process, ~0.02 s). Measured: ~4 GB/s on code, ~1 GB/s on web text, ~0.5 GB/s on CJK. Plus, for the
documents found, the reference's encode and one copy of the ids.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
import pyarrow as pa

from raypack.tokenize.backends.unassigned import UNASSIGNED
from raypack.tokenize.tokenizers import FlatIds, text_offsets

__all__ = ["documents_with_new_characters", "encode_new_characters", "new_character_table"]

SCAN_BLOCK = 1 << 16
"""Bytes scanned at once: whole pieces (16 MiB) made fresh temporaries whose first touch cost more
than the scan (~0.1 s per 386 MB of text on this VM)."""


@functools.cache
def new_character_table() -> np.ndarray:
    """``table[cp]``: code point ``cp`` is unassigned in Unicode 14.0 (raypack.tokenize.backends.unassigned)."""
    table = np.zeros(0x110000, dtype=bool)
    for first, last in UNASSIGNED:
        table[first:last + 1] = True
    return table


@functools.cache
def _prefix_table() -> np.ndarray:
    return prefixes_of(new_character_table())


def prefixes_of(table: np.ndarray) -> np.ndarray:
    """``prefixes[b0 << 8 | b1]``: some code point ``table`` marks is encoded in UTF-8 starting with
    the bytes ``b0 b1`` (both bytes of a 2-byte character; the first two of a longer one). Whole
    blocks (CJK, Latin, ...) have no such prefix, so most text is ruled out by it."""
    points = np.flatnonzero(table)
    points = points[points >= 0x80].astype(np.int64)
    two, three = points < 0x800, (points >= 0x800) & (points < 0x10000)
    b0 = np.where(two, 0xC0 | points >> 6, np.where(three, 0xE0 | points >> 12, 0xF0 | points >> 18))
    b1 = 0x80 | (np.where(two, points, np.where(three, points >> 6, points >> 12)) & 0x3F)
    prefixes = np.zeros(1 << 16, dtype=bool)
    prefixes[b0 << 8 | b1] = True
    return prefixes


def documents_with_new_characters(texts: pa.StringArray | pa.LargeStringArray) -> np.ndarray:
    """The indices (sorted, int64) of the ``texts`` (valid UTF-8) holding a code point
    :func:`new_character_table` marks."""
    offsets = text_offsets(texts)
    data_buffer = texts.buffers()[2]
    if data_buffer is None or len(texts) == 0 or offsets[-1] == offsets[0]:
        return np.zeros(0, dtype=np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    data = np.frombuffer(data_buffer, dtype=np.uint8)[start:end]
    if data.size < 2 or int(data.max()) < 0x80:
        return np.zeros(0, dtype=np.int64)
    table, prefixes = new_character_table(), _prefix_table()
    last = data.size - 1
    found_leads = []
    for block_start in range(0, data.size, SCAN_BLOCK):  # small blocks: their temporaries stay in cache
        block = data[block_start:block_start + SCAN_BLOCK]
        if int(block.max()) < 0xC2:
            continue
        leads = np.flatnonzero(block >= 0xC2)  # the first byte of every character past U+007F
        leads += block_start
        pairs = data[leads].astype(np.uint16) << 8
        pairs |= data[np.minimum(leads + 1, last)]
        found_leads.append(leads[prefixes[pairs]])  # those whose first two bytes a new character may have
    leads = np.concatenate(found_leads) if found_leads else np.zeros(0, dtype=np.int64)
    if leads.size == 0:
        return np.zeros(0, dtype=np.int64)
    b0 = data[leads].astype(np.uint32)
    cont = [data[np.minimum(leads + k, last)].astype(np.uint32) & 0x3F for k in (1, 2, 3)]
    points = np.where(b0 >= 0xF0, ((b0 & 0x07) << 18) | (cont[0] << 12) | (cont[1] << 6) | cont[2],
                      np.where(b0 >= 0xE0, ((b0 & 0x0F) << 12) | (cont[0] << 6) | cont[1],
                               ((b0 & 0x1F) << 6) | cont[0]))
    found = leads[table[np.minimum(points, 0x10FFFF)]]
    if found.size == 0:
        return np.zeros(0, dtype=np.int64)
    rows = np.searchsorted(offsets, found + start, side="right") - 1
    return np.unique(rows).astype(np.int64)


def encode_new_characters(texts: pa.StringArray | pa.LargeStringArray, flat: FlatIds,
                          reference: Callable[[pa.Array], FlatIds]) -> FlatIds:
    """``flat`` (a fast backend's ids of ``texts``) with the documents holding new characters encoded
    by ``reference`` instead. Returns ``flat`` itself when there are none."""
    rows = documents_with_new_characters(texts)
    if rows.size == 0:
        return flat
    redone = reference(texts.take(pa.array(rows)))
    lengths = np.diff(flat.offsets)
    lengths[rows] = np.diff(redone.offsets)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=flat.values.dtype)
    kept_from = 0  # copy the backend's runs of documents between the redone ones, then each redone one
    for k, row in enumerate(rows.tolist()):
        values[offsets[kept_from]:offsets[row]] = flat.values[flat.offsets[kept_from]:flat.offsets[row]]
        values[offsets[row]:offsets[row + 1]] = redone.values[redone.offsets[k]:redone.offsets[k + 1]]
        kept_from = row + 1
    values[offsets[kept_from]:] = flat.values[flat.offsets[kept_from]:]
    return FlatIds(values, offsets)
