"""Documents holding characters newer than Python's Unicode tables get the reference library's ids
(raypack.tokenize.backends.new_characters): a fast backend and the reference take character
properties from different Unicode versions, and split such text differently."""

from __future__ import annotations

import unicodedata

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.tokenize.backends import BACKENDS, load_backed_tokenizer
from raypack.tokenize.backends.new_characters import (
    documents_with_new_characters,
    encode_new_characters,
    new_character_table,
)
from raypack.tokenize.backends.unassigned import UNASSIGNED
from raypack.tokenize.tokenizers import FlatIds, load_tokenizer

from helpers import CORPUS, train_byte_level_bpe

FAST_INSTALLED = [pytest.param(name, marks=pytest.mark.skipif(BACKENDS[name].version() is None,
                                                              reason=f"{name} is not installed"))
                  for name in BACKENDS if name != "reference"]
NEW = "\U00011db6"
"""Unassigned in Unicode 14.0; assigned later (17.0). gigatoken 0.10 and tiktoken cut
``NEW + "'S"`` differently (found by a hostile-input trial)."""


def _is_new(text: str) -> bool:
    """Naive: some character of ``text`` falls in a range of the Unicode 14.0 unassigned table."""
    return any(first <= ord(ch) <= last for ch in text for first, last in UNASSIGNED)


ALPHABET = st.sampled_from(["a", " ", "'", "é", "\u0301", "中", "😀", "\U0001FAE8", NEW, "\u088f", "\uffff",
                            "\U000e0001", "\U0010fffd", "\u0378", "\U00050000", "x\u036f"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ALPHABET, max_size=6).map("".join), max_size=12), st.integers(0, 3), st.booleans())
def test_the_documents_found_are_those_holding_an_unassigned_code_point(texts, cut, large):
    """Against a naive reference (unicodedata per character), on sliced and large_string arrays."""
    array = pa.array(["pad"] * cut + texts, pa.large_string() if large else pa.string())[cut:]
    want = [k for k, text in enumerate(texts) if _is_new(text)]
    assert documents_with_new_characters(array).tolist() == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(ALPHABET, max_size=6).map("".join), max_size=12), st.integers(1, 9))
def test_the_scan_in_small_blocks_finds_the_same(texts, block):
    """Blocks of a few bytes: characters straddle the blocks' edges."""
    from raypack.tokenize.backends import new_characters

    want = [k for k, text in enumerate(texts) if _is_new(text)]
    saved, new_characters.SCAN_BLOCK = new_characters.SCAN_BLOCK, block
    try:
        assert documents_with_new_characters(pa.array(texts, pa.string())).tolist() == want
    finally:
        new_characters.SCAN_BLOCK = saved


@pytest.mark.skipif(unicodedata.unidata_version != "14.0.0", reason="this Python's tables are not Unicode 14.0")
def test_the_table_is_unicode_14_cn():
    """Every code point: the fixed table is what Python 3.11's unicodedata (Unicode 14.0) calls Cn."""
    table = new_character_table()
    cn = np.array([unicodedata.category(chr(cp)) == "Cn" and not 0xD800 <= cp <= 0xDFFF for cp in range(0x110000)])
    assert np.array_equal(table, cn)


def test_the_prefix_table_is_every_new_characters_first_two_bytes():
    from raypack.tokenize.backends.new_characters import prefixes_of

    table = new_character_table()
    slow = np.zeros(1 << 16, dtype=bool)
    for cp in np.flatnonzero(table).tolist():
        if cp >= 0x80:
            encoded = chr(cp).encode("utf-8")
            slow[encoded[0] << 8 | encoded[1]] = True
    assert np.array_equal(prefixes_of(table), slow)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(ALPHABET, max_size=5).map("".join), max_size=10))
def test_the_found_documents_take_the_references_ids(texts):
    """A backend giving [1] per character, a reference giving [2, 2] per character: the new
    characters' documents must hold the reference's ids, the others the backend's, in order."""
    array = pa.array(texts, pa.string())

    def ids(texts_array, per):
        lengths = [len(t) * len(per) for t in texts_array.to_pylist()]
        return FlatIds(np.array([v for t in texts_array.to_pylist() for _ in t for v in per], np.uint32),
                       np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    got = encode_new_characters(array, ids(array, [1]), lambda sub: ids(sub, [2, 2]))
    want = [[2, 2] * len(t) if _is_new(t) else [1] * len(t) for t in texts]
    assert [got.values[got.offsets[k]:got.offsets[k + 1]].tolist() for k in range(len(texts))] == want


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_byte_level_bpe(CORPUS, 600).save(str(path))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("backend", FAST_INSTALLED)
@pytest.mark.parametrize("spec", ["byte-level", "tiktoken:cl100k_base"])
def test_every_code_point_of_the_first_four_planes_gets_the_references_ids(backend, spec, byte_level):
    """Each code point in the context where gigatoken 0.10 and the references part (``c + "'s"``):
    4,657 unassigned code points (of Unicode 17) differed for both references; every assigned one
    agreed. Through the backed tokenizer, all equal the reference."""
    spec = byte_level if spec == "byte-level" else spec
    texts = pa.array([f"{chr(cp)}'s" for cp in range(4 << 16) if not 0xD800 <= cp <= 0xDFFF])
    reference = load_tokenizer(spec).encode_flat(texts)
    got = load_backed_tokenizer(spec, backend).encode_flat(texts)
    assert np.array_equal(got.offsets, reference.offsets)
    assert np.array_equal(got.values, reference.values)


@pytest.mark.skipif(BACKENDS["gigatoken"].version() is None, reason="gigatoken is not installed")
def test_gigatoken_alone_cuts_a_new_character_otherwise():
    """What the routing is for (so the test above can fail): gigatoken's own ids differ here."""
    texts = pa.array([f"{NEW}'S"])
    tokenizer = load_backed_tokenizer("tiktoken:cl100k_base", "gigatoken")
    raw = tokenizer.encoder.encode_flat(texts)
    reference = load_tokenizer("tiktoken:cl100k_base").encode_flat(texts)
    assert raw.values.tolist() != reference.values.tolist()
    assert tokenizer.encode_flat(texts).values.tolist() == reference.values.tolist()
