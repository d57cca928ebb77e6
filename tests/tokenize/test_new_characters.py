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
from raypack.tokenize.tokenizers import FlatIds, load_tokenizer

from helpers import CORPUS, train_byte_level_bpe

FAST_INSTALLED = [pytest.param(name, marks=pytest.mark.skipif(BACKENDS[name].version() is None,
                                                              reason=f"{name} is not installed"))
                  for name in BACKENDS if name != "reference"]
NEW = "\U00011db6"
"""Unassigned in Python 3.11's tables (Unicode 14); assigned later. gigatoken 0.10 and tiktoken cut
``NEW + "'S"`` differently (found by a hostile-input trial)."""


def _is_new(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cn" for ch in text)


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


def test_the_table_is_unicodedata_cn():
    table = new_character_table()
    for cp in [0x41, 0x378, 0x88F, 0x11DB6, 0x1FAE8, 0x50000, 0xE0001, 0xF0000, 0x10FFFF, 0xFFFF, 0xD7FF]:
        assert table[cp] == (unicodedata.category(chr(cp)) == "Cn"), hex(cp)


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
