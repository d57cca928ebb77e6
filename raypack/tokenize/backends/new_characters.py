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

Only the lines around the new characters go to the reference where the tokenizer allows it: its
split regex is one of :data:`CUTTABLE_PATTERNS` (GPT-2's ByteLevel, cl100k, Llama 3, o200k), with
no normalizer and no added token that holds whitespace, strips it, or starts right after the cut
(:func:`indent_cut_rule`). Such a regex cuts the leading spaces of an indented line before the last
one (``"\\n    x"`` is ``"\\n   "`` then ``" x"``, or ``"\\n"``, ``"   "``, ``" x"``), whatever the
characters around, so encoding the text on either side of that point apart gives the ids of the
whole (:func:`indent_cuts`; the tests check it against the libraries themselves). A routed document
is cut at those points, and only the runs of stretches that hold a new character are encoded by
the reference, the rest by the backend. Without such a cut near its new characters, a document goes
to the reference whole.

Cost: one pass over a piece's UTF-8 bytes (its maximum) when the piece is ASCII; otherwise, in
blocks of SCAN_BLOCK bytes, one more to find the characters past U+007F, whose first two bytes are
looked up in a 64 KiB table of the prefixes new characters have (which rules out whole scripts),
then only those with such a prefix decoded and looked up in a 1.1 MB table (both built once per
process, ~0.02 s). Measured: ~4 GB/s on code, ~1 GB/s on web text, ~0.5 GB/s on CJK. Plus, for the
documents found, the reference's encode of the stretches holding new characters (of the whole
document where the regex is not one of CUTTABLE_PATTERNS), the backend's of the rest, and one
copy of the ids.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from raypack.tokenize.backends.unassigned import UNASSIGNED
from raypack.tokenize.tokenizers import TIKTOKEN_ENCODINGS, FlatIds, TextTokenizer, text_offsets

__all__ = ["CUTTABLE_PATTERNS", "cut_rule_of", "documents_with_new_characters", "encode_new_characters",
           "indent_cut_rule", "indent_cuts", "new_character_table"]

GPT2 = "ByteLevel"
"""The GPT-2 regex of the ``ByteLevel`` pre-tokenizer with ``use_regex`` (it has no pattern field)."""
CUTTABLE_PATTERNS = frozenset({
    GPT2,
    *(encoding["pat_str"] for encoding in TIKTOKEN_ENCODINGS.values()),  # cl100k_base, o200k_base
    # Llama 3's Split regex, and o200k's as a tokenizer.json writes it:
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
})
"""Split regexes that cut an indented line's leading spaces before the last one, whatever the
characters' properties (each alternative that takes a newline ends at it or takes only whitespace;
a whitespace run followed by a visible character ends one space early; nothing looks behind)."""

SCAN_BLOCK = 1 << 16
"""Bytes scanned at once: whole pieces (16 MiB) made fresh temporaries whose first touch cost more
than the scan (~0.1 s per 386 MB of text on this VM)."""


MAX_RUNS = 1024
"""A routed document cut into more runs of stretches than this (new characters on many lines) goes
to the reference whole: the runs are Python objects, and so is each one's text."""


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
    if len(texts) == 0 or offsets[-1] == offsets[0]:
        return np.zeros(0, dtype=np.int64)
    start = int(offsets[0])
    found = new_character_bytes(_text_bytes(texts, offsets))
    if found.size == 0:
        return np.zeros(0, dtype=np.int64)
    rows = np.searchsorted(offsets, found + start, side="right") - 1
    return np.unique(rows).astype(np.int64)


def _text_bytes(texts: pa.StringArray | pa.LargeStringArray, offsets: np.ndarray) -> np.ndarray:
    """The UTF-8 bytes of ``texts``, all of them, as one uint8 view (from ``offsets[0]``)."""
    data_buffer = texts.buffers()[2]
    if data_buffer is None:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(data_buffer, dtype=np.uint8)[int(offsets[0]):int(offsets[-1])]


def new_character_bytes(data: np.ndarray) -> np.ndarray:
    """The positions (sorted, int64) in ``data`` (UTF-8 bytes) of the first byte of each code point
    :func:`new_character_table` marks."""
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
    return leads[table[np.minimum(points, 0x10FFFF)]].astype(np.int64)


def indent_cut_rule(tokenizer: TextTokenizer) -> bytes | None:
    """None unless ``tokenizer`` (a reference adapter) splits text by one of :data:`CUTTABLE_PATTERNS`
    alone, so that :func:`indent_cuts` are points where encoding either side apart gives its ids;
    else the bytes that may not follow a cut's space (the first bytes of its added tokens, which
    ``tokenizers`` cuts out before the regex sees the text, so that the regex would see the spaces
    before one as the end of a text). That is: a tiktoken encoding raypack knows (``encode_ordinary``:
    no added tokens), or a tokenizer.json with no normalizer, the pre-tokenizer
    ``ByteLevel(use_regex=true, add_prefix_space=false)`` or ``Sequence[Split(PATTERN, Isolated),
    ByteLevel(use_regex=false, add_prefix_space=false)]``, and no added token that holds whitespace
    or strips it beside it."""
    if tokenizer.kind == "tiktoken":
        pattern = TIKTOKEN_ENCODINGS.get(getattr(tokenizer, "name", ""), {}).get("pat_str")
        return b"" if pattern in CUTTABLE_PATTERNS else None
    path = getattr(tokenizer, "path", None)
    if tokenizer.kind != "hf" or path is None:
        return None
    try:
        config = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return cut_rule_of(config) if isinstance(config, dict) else None


def cut_rule_of(config: dict[str, Any]) -> bytes | None:
    """:func:`indent_cut_rule` of a parsed tokenizer.json."""
    if config.get("normalizer") is not None:
        return None
    first_bytes = set()
    for token in config.get("added_tokens") or []:
        content = token.get("content") if isinstance(token, dict) else None
        if (not isinstance(content, str) or not content or content != "".join(content.split())
                or token.get("lstrip") or token.get("rstrip") or token.get("single_word")):
            return None
        first_bytes.add(content.encode("utf-8")[0])
    pre = config.get("pre_tokenizer")
    rule = bytes(sorted(first_bytes))
    if _byte_level(pre, use_regex=True):
        return rule
    parts = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else None
    if not isinstance(parts, list) or len(parts) != 2 or not _byte_level(parts[1], use_regex=False):
        return None
    split = parts[0]
    if (isinstance(split, dict) and split.get("type") == "Split" and split.get("behavior") == "Isolated"
            and not split.get("invert") and isinstance(split.get("pattern"), dict)
            and split["pattern"].get("Regex") in CUTTABLE_PATTERNS - {GPT2}):
        return rule
    return None


def _byte_level(part: Any, *, use_regex: bool) -> bool:
    return (isinstance(part, dict) and part.get("type") == "ByteLevel" and part.get("use_regex", True) is use_regex
            and part.get("add_prefix_space", True) is False)


def indent_cuts(data: np.ndarray, not_before: bytes = b"") -> np.ndarray:
    """The positions p (sorted, int64) in ``data`` (UTF-8 bytes) where a line begins with at least
    two spaces (0x20, right after a newline 0x0A), ``p`` is the last of them and a visible ASCII
    character (0x21-0x7E) not in ``not_before`` follows it. A regex of :data:`CUTTABLE_PATTERNS`
    splits there."""
    if data.size < 4:
        return np.zeros(0, dtype=np.int64)
    after = data[2:]
    visible = (after >= 0x21) & (after <= 0x7E)
    for byte in not_before:
        visible &= after != byte
    candidates = np.flatnonzero((data[:-2] == 0x20) & (data[1:-1] == 0x20) & visible) + 1
    if candidates.size == 0:
        return candidates.astype(np.int64)
    others = np.flatnonzero(data != 0x20)  # the byte before each run of spaces must be a newline
    before = np.searchsorted(others, candidates) - 1
    keep = before >= 0
    keep[keep] = data[others[before[keep]]] == 0x0A
    return candidates[keep].astype(np.int64)


def encode_new_characters(texts: pa.StringArray | pa.LargeStringArray, flat: FlatIds,
                          reference: Callable[[pa.Array], FlatIds],
                          backend: Callable[[pa.Array], FlatIds] | None = None, not_before: bytes = b"") -> FlatIds:
    """``flat`` (a fast backend's ids of ``texts``) with the documents holding new characters encoded
    by ``reference`` instead: whole, or, given ``backend`` (for a tokenizer whose
    :func:`indent_cut_rule` is ``not_before``), the stretches between :func:`indent_cuts` that hold
    them by ``reference`` and the rest by ``backend``. Returns ``flat`` itself when there are none."""
    rows = documents_with_new_characters(texts)
    if rows.size == 0:
        return flat
    routed = texts.take(pa.array(rows))
    redone = reference(routed) if backend is None else _encode_in_stretches(routed, reference, backend, not_before)
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


def _encode_in_stretches(texts: pa.StringArray | pa.LargeStringArray, reference: Callable[[pa.Array], FlatIds],
                         backend: Callable[[pa.Array], FlatIds], not_before: bytes) -> FlatIds:
    """The ids of ``texts``: each cut at its :func:`indent_cuts` into stretches, runs of stretches
    holding a new character encoded by ``reference``, the runs between by ``backend``."""
    offsets = text_offsets(texts)
    data = _text_bytes(texts, offsets)
    offsets = offsets - offsets[0]
    pieces: list[tuple[int, int, bool]] = []  # (start, end, by the reference), document after document
    per_document = []
    for k in range(len(texts)):
        start, end = int(offsets[k]), int(offsets[k + 1])
        document = data[start:end]
        edges = np.concatenate(([0], indent_cuts(document, not_before), [document.size]))
        new = np.zeros(edges.size - 1, dtype=bool)  # stretch j is [edges[j], edges[j + 1])
        new[np.searchsorted(edges, new_character_bytes(document), side="right") - 1] = True
        changes = np.flatnonzero(new[1:] != new[:-1]) + 1  # runs of stretches alike
        bounds = np.concatenate(([0], changes, [new.size]))
        before = len(pieces)
        if bounds.size - 1 > MAX_RUNS:
            pieces.append((start, end, True))
        else:
            pieces += [(start + int(edges[a]), start + int(edges[b]), bool(new[a]))
                       for a, b in zip(bounds[:-1], bounds[1:])]
        per_document.append(len(pieces) - before)
    encoded = {}
    for by_reference, encode in ((True, reference), (False, backend)):
        chosen = [(a, b) for a, b, r in pieces if r is by_reference]
        if chosen:
            strings = pa.array([data[a:b].tobytes() for a, b in chosen], pa.large_binary()).cast(pa.large_string())
            encoded[by_reference] = (encode(strings), iter(range(len(chosen))))
    parts, lengths = [], []
    for count in per_document:
        size = 0
        for _ in range(count):
            ids, order = encoded[pieces[len(parts)][2]]
            j = next(order)
            parts.append(ids.values[ids.offsets[j]:ids.offsets[j + 1]].astype(np.uint32, copy=False))
            size += parts[-1].size
        lengths.append(size)
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return FlatIds(np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32), out)
