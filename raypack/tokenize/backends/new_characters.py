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

A backend may name assigned characters it is known to read otherwise too (``misread`` on its
class, raypack.tokenize.backends): documents holding one are routed the same way. fastokens names
two, found by a hostile trial and then by probing every code point of planes 0-3 in contexts:
U+180E MONGOLIAN VOWEL SEPARATOR (out of White_Space since Unicode 6.3; its regex engine for split
regexes it has no built-in matcher for counts it as ``\\s``, ``tokenizers``' Oniguruma does not)
and U+017F LATIN SMALL LETTER LONG S (Oniguruma's ``(?i:'s)`` takes ``'ſ``, fastokens' Llama 3 and
Qwen 2 matchers do not).

Only the lines around the new characters go to the reference where the tokenizer allows it: its
split regex is one of :data:`CUTTABLE_PATTERNS` (GPT-2's ByteLevel, cl100k, Llama 3, o200k), with
no normalizer and no added token that holds whitespace, strips it, or starts right after the cut
(:func:`indent_cut_rule`). Such a regex always cuts an indented line at one place, whatever the
characters around: at its start, or (GPT-2's) before its last leading space; so encoding the text
on either side of that point apart gives the ids of the whole (:func:`indent_cuts`; the tests check
it against the libraries themselves). A routed document is cut at those points, and only the runs
of stretches that hold a new character are encoded by the reference, the rest by the backend.
Without such a cut near its new characters, a document goes to the reference whole.

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
from typing import Any, Callable, NamedTuple

import numpy as np
import pyarrow as pa

from raypack.rules.arrays import arrow_array, binary_array
from raypack.tokenize.backends.base import LLAMA3_SPLIT
from raypack.tokenize.backends.unassigned import UNASSIGNED
from raypack.tokenize.tokenizers import TIKTOKEN_ENCODINGS, FlatIds, TextTokenizer, text_offsets

__all__ = ["CUTTABLE_PATTERNS", "CutRule", "cut_rule_of", "documents_with_new_characters", "encode_new_characters",
           "indent_cut_rule", "indent_cuts", "new_character_table", "replace_documents"]

GPT2 = "ByteLevel"
"""The GPT-2 regex of the ``ByteLevel`` pre-tokenizer with ``use_regex`` (it has no pattern field)."""
_CL100K = TIKTOKEN_ENCODINGS["cl100k_base"]["pat_str"]
_O200K = TIKTOKEN_ENCODINGS["o200k_base"]["pat_str"]  # also o200k's Split regex in a tokenizer.json
CUTTABLE_PATTERNS: dict[str, bool] = {GPT2: False, _CL100K: True, LLAMA3_SPLIT: True, _O200K: True}
"""Split regexes that always cut an indented line (a newline, two or more spaces, a visible ASCII
character) at one place, whatever the characters' properties, and whether that place is the line's
start (True) or before its last space (False):

* each alternative that takes a newline ends at the last newline of its whitespace or takes only
  whitespace, so a token ends at the line's start; nothing looks behind;
* GPT-2's ``\\s+(?!\\S)`` takes the newline and the spaces less the last (``"\\n   "``, ``" x"``),
  so its cut is before the last space;
* cl100k's ``\\s++$`` would take ``"\\n   "`` whole at the end of a piece cut before the last space
  (a vocabulary with such a token gives other ids), so its cut is at the line's start, where the
  piece's trailing whitespace ends with the newline as the whole text's token does."""


class CutRule(NamedTuple):
    """Where a tokenizer's documents may be cut (:func:`indent_cut_rule`)."""

    not_before: bytes
    """Bytes that may not follow the line's spaces: the first bytes of its added tokens, which
    ``tokenizers`` cuts out before the regex sees the text (the regex would see the spaces before one
    as the end of a text)."""
    at_line_start: bool
    """Cut at the line's start, else before its last space (:data:`CUTTABLE_PATTERNS`)."""


SCAN_BLOCK = 1 << 16
"""Bytes scanned at once: whole pieces (16 MiB) made fresh temporaries whose first touch cost more
than the scan (~0.1 s per 386 MB of text on this VM)."""


MAX_RUNS = 1024
"""A routed document cut into more runs of stretches than this (new characters on many lines) goes
to the reference whole: the runs are Python objects, and so is each one's text."""


Ranges = tuple[tuple[int, int], ...]
"""Inclusive code point ranges: a backend's ``misread``."""


@functools.cache
def new_character_table(misread: Ranges = ()) -> np.ndarray:
    """``table[cp]``: code point ``cp`` is unassigned in Unicode 14.0 (raypack.tokenize.backends.unassigned),
    or in one of the ``misread`` ranges."""
    table = np.zeros(0x110000, dtype=bool)
    for first, last in (*UNASSIGNED, *misread):
        table[first:last + 1] = True
    return table


@functools.cache
def _prefix_table(misread: Ranges = ()) -> np.ndarray:
    return prefixes_of(new_character_table(misread))


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


def documents_with_new_characters(texts: pa.StringArray | pa.LargeStringArray, misread: Ranges = ()) -> np.ndarray:
    """The indices (sorted, int64) of the ``texts`` (valid UTF-8) holding a code point
    ``new_character_table(misread)`` marks."""
    offsets = text_offsets(texts)
    if len(texts) == 0 or offsets[-1] == offsets[0]:
        return np.zeros(0, dtype=np.int64)
    start = int(offsets[0])
    found = new_character_bytes(_text_bytes(texts, offsets), misread)
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


def new_character_bytes(data: np.ndarray, misread: Ranges = ()) -> np.ndarray:
    """The positions (sorted, int64) in ``data`` (UTF-8 bytes) of the first byte of each code point
    ``new_character_table(misread)`` marks."""
    if data.size < 2 or int(data.max()) < 0x80:
        return np.zeros(0, dtype=np.int64)
    table, prefixes = new_character_table(misread), _prefix_table(misread)
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


def indent_cut_rule(tokenizer: TextTokenizer) -> CutRule | None:
    """Where ``tokenizer`` (a reference adapter) may cut a document so that encoding the pieces apart
    gives the ids of the whole (:func:`indent_cuts`), or None: a tiktoken encoding raypack knows
    (``encode_ordinary``: no added tokens), or a tokenizer.json with no normalizer, the pre-tokenizer
    ``ByteLevel(use_regex=true, add_prefix_space=false)`` or ``Sequence[Split(PATTERN, Isolated),
    ByteLevel(use_regex=false, add_prefix_space=false)]`` (PATTERN of :data:`CUTTABLE_PATTERNS`),
    and no added token that holds whitespace or strips it beside it."""
    if tokenizer.kind == "tiktoken":
        pattern = TIKTOKEN_ENCODINGS.get(getattr(tokenizer, "name", ""), {}).get("pat_str")
        return CutRule(b"", CUTTABLE_PATTERNS[pattern]) if pattern in CUTTABLE_PATTERNS else None
    path = getattr(tokenizer, "path", None)
    if tokenizer.kind != "hf" or path is None:
        return None
    try:
        config = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return cut_rule_of(config) if isinstance(config, dict) else None


def cut_rule_of(config: dict[str, Any]) -> CutRule | None:
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
    not_before = bytes(sorted(first_bytes))
    pre = config.get("pre_tokenizer")
    if _byte_level(pre, use_regex=True):
        return CutRule(not_before, CUTTABLE_PATTERNS[GPT2])
    parts = pre.get("pretokenizers") if isinstance(pre, dict) and pre.get("type") == "Sequence" else None
    if not isinstance(parts, list) or len(parts) != 2 or not _byte_level(parts[1], use_regex=False):
        return None
    split = parts[0] if isinstance(parts[0], dict) else {}
    pattern = split.get("pattern")
    regex = pattern.get("Regex") if isinstance(pattern, dict) else None
    if (split.get("type") == "Split" and split.get("behavior") == "Isolated" and not split.get("invert")
            and regex in CUTTABLE_PATTERNS and regex != GPT2):
        return CutRule(not_before, CUTTABLE_PATTERNS[regex])
    return None


def _byte_level(part: Any, *, use_regex: bool) -> bool:
    return (isinstance(part, dict) and part.get("type") == "ByteLevel" and part.get("use_regex", True) is use_regex
            and part.get("add_prefix_space", True) is False)


def indent_cuts(data: np.ndarray, rule: CutRule = CutRule(b"", False)) -> np.ndarray:
    """The cuts (sorted int64 positions in ``data``, UTF-8 bytes) of the lines that begin with at
    least two spaces (0x20, right after a newline 0x0A) followed by a visible ASCII character
    (0x21-0x7E) not in ``rule.not_before``: each line's start if ``rule.at_line_start``, else the
    position of its last space. A regex of :data:`CUTTABLE_PATTERNS` splits there."""
    if data.size < 4:
        return np.zeros(0, dtype=np.int64)
    after = data[2:]
    visible = (after >= 0x21) & (after <= 0x7E)
    for byte in rule.not_before:
        visible &= after != byte
    candidates = np.flatnonzero((data[:-2] == 0x20) & (data[1:-1] == 0x20) & visible) + 1
    if candidates.size == 0:
        return candidates.astype(np.int64)
    others = np.flatnonzero(data != 0x20)  # the byte before each run of spaces must be a newline
    before = np.searchsorted(others, candidates) - 1
    keep = before >= 0
    keep[keep] = data[others[before[keep]]] == 0x0A
    if rule.at_line_start:
        return others[before[keep]].astype(np.int64) + 1
    return candidates[keep].astype(np.int64)


def encode_new_characters(texts: pa.StringArray | pa.LargeStringArray, flat: FlatIds,
                          reference: Callable[[pa.Array], FlatIds],
                          backend: Callable[[pa.Array], FlatIds] | None = None, rule: CutRule | None = None,
                          misread: Ranges = ()) -> FlatIds:
    """``flat`` (a fast backend's ids of ``texts``) with the documents holding new characters encoded
    by ``reference`` instead: whole, or, given ``backend`` and ``rule`` (the tokenizer's
    :func:`indent_cut_rule`), the stretches between :func:`indent_cuts` that hold them by
    ``reference`` and the rest by ``backend``. ``misread``: the backend's own (module doc). Returns
    ``flat`` itself when there are none."""
    rows = documents_with_new_characters(texts, misread)
    if rows.size == 0:
        return flat
    routed = texts.take(arrow_array(rows))
    if backend is None or rule is None:
        redone = reference(routed)
    else:
        redone = _encode_in_stretches(routed, reference, backend, rule, misread)
    return replace_documents(flat, rows, redone)


def replace_documents(flat: FlatIds, rows: np.ndarray, redone: FlatIds) -> FlatIds:
    """``flat`` with documents ``rows`` (ascending) replaced by ``redone``'s, in order. O(ids) copies, a
    Python step per replaced document."""
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
                         backend: Callable[[pa.Array], FlatIds], rule: CutRule, misread: Ranges) -> FlatIds:
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
        edges = np.concatenate(([0], indent_cuts(document, rule), [document.size]))
        new = np.zeros(edges.size - 1, dtype=bool)  # stretch j is [edges[j], edges[j + 1])
        new[np.searchsorted(edges, new_character_bytes(document, misread), side="right") - 1] = True
        changes = np.flatnonzero(new[1:] != new[:-1]) + 1  # runs of stretches alike
        bounds = np.concatenate(([0], changes, [new.size]))
        before = len(pieces)
        if bounds.size - 1 > MAX_RUNS:
            pieces.append((start, end, True))
        else:
            pieces += [(start + int(edges[a]), start + int(edges[b]), bool(new[a]))
                       for a, b in zip(bounds[:-1], bounds[1:])]
        per_document.append(len(pieces) - before)
    ids_of: dict[int, np.ndarray] = {}  # piece index: its ids
    for by_reference, encode in ((True, reference), (False, backend)):
        chosen = [i for i, piece in enumerate(pieces) if piece[2] is by_reference]
        if chosen:
            texts_of = [data[pieces[i][0]:pieces[i][1]].tobytes() for i in chosen]
            flat = encode(binary_array(texts_of, pa.large_binary()).cast(pa.large_string()))
            ids_of.update((i, flat.values[flat.offsets[j]:flat.offsets[j + 1]]) for j, i in enumerate(chosen))
    parts = [ids_of[i].astype(np.uint32, copy=False) for i in range(len(pieces))]
    ends = np.cumsum([0, *per_document])  # each document's pieces are parts[ends[k]:ends[k + 1]]
    piece_offsets = np.cumsum([0, *(part.size for part in parts)])
    out = piece_offsets[ends].astype(np.int64)
    return FlatIds(np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32), out)
