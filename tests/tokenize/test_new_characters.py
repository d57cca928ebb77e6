"""Documents holding characters newer than Python's Unicode tables get the reference library's ids
(raypack.tokenize.backends.new_characters): a fast backend and the reference take character
properties from different Unicode versions, and split such text differently."""

from __future__ import annotations

import unicodedata

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from raypack.tokenize.backends import BACKENDS, load_backed_tokenizer
from raypack.tokenize.backends.new_characters import (
    CutRule,
    documents_with_new_characters,
    encode_new_characters,
    new_character_table,
)
from raypack.tokenize.backends.unassigned import UNASSIGNED
from raypack.tokenize.tokenizers import TIKTOKEN_ENCODINGS, FlatIds, load_tokenizer

from helpers import CORPUS, LLAMA3, O200K, train_byte_level_bpe

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

FAST_INSTALLED = [pytest.param(name, marks=pytest.mark.skipif(BACKENDS[name].version() is None,
                                                              reason=f"{name} is not installed"))
                  for name in BACKENDS if name != "reference"]
NEW = "\U00011db6"
"""Unassigned in Unicode 14.0; assigned later (17.0). gigatoken 0.10 and tiktoken cut
``NEW + "'S"`` differently (found by a hostile-input trial)."""


def _is_new(text: str, misread=()) -> bool:
    """Naive: some character of ``text`` falls in a range of the Unicode 14.0 unassigned table or of
    ``misread``."""
    return any(first <= ord(ch) <= last for ch in text for first, last in (*UNASSIGNED, *misread))


ALPHABET = st.sampled_from(["a", " ", "'", "é", "\u0301", "中", "😀", "\U0001FAE8", NEW, "\u088f", "\uffff",
                            "\u180e", "ſ", "\U000e0001", "\U0010fffd", "\u0378", "\U00050000", "x\u036f"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ALPHABET, max_size=6).map("".join), max_size=12), st.integers(0, 3), st.booleans(),
       st.sampled_from([(), BACKENDS["fastokens"].misread, ((0x4E2D, 0x4E2D),)]))
def test_the_documents_found_are_those_holding_an_unassigned_code_point(texts, cut, large, misread):
    """Against a naive reference (a per-character look-up in the ranges), on sliced and large_string
    arrays, with and without a backend's misread code points."""
    array = pa.array(["pad"] * cut + texts, pa.large_string() if large else pa.string())[cut:]
    want = [k for k, text in enumerate(texts) if _is_new(text, misread)]
    assert documents_with_new_characters(array, misread).tolist() == want


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
@pytest.mark.parametrize("spec", ["byte-level", "tiktoken:cl100k_base"])
def test_every_code_point_of_the_first_four_planes_gets_the_references_ids(spec, byte_level):
    """Each code point in the context where gigatoken 0.10 and the references part (``c + "'s"``):
    4,657 unassigned code points (of Unicode 17) differed for both references; every assigned one
    agreed. Through the backed tokenizer, all equal the reference, for every installed fast backend
    (one test per tokenizer, so that the reference's encode, most of its time, runs once)."""
    spec = byte_level if spec == "byte-level" else spec
    texts = pa.array([f"{chr(cp)}'s" for cp in range(4 << 16) if not 0xD800 <= cp <= 0xDFFF])
    reference = load_tokenizer(spec).encode_flat(texts)
    installed = [name for name in BACKENDS if name != "reference" and BACKENDS[name].version() is not None]
    if not installed:
        pytest.skip("no fast backend is installed")
    for backend in installed:
        got = load_backed_tokenizer(spec, backend).encode_flat(texts)
        assert np.array_equal(got.offsets, reference.offsets), backend
        assert np.array_equal(got.values, reference.values), backend


@pytest.mark.skipif(BACKENDS["gigatoken"].version() is None, reason="gigatoken is not installed")
def test_gigatoken_alone_cuts_a_new_character_otherwise():
    """What the routing is for (so the test above can fail): gigatoken's own ids differ here."""
    texts = pa.array([f"{NEW}'S"])
    tokenizer = load_backed_tokenizer("tiktoken:cl100k_base", "gigatoken")
    raw = tokenizer.encoder.encode_flat(texts)
    reference = load_tokenizer("tiktoken:cl100k_base").encode_flat(texts)
    assert raw.values.tolist() != reference.values.tolist()
    assert tokenizer.encode_flat(texts).values.tolist() == reference.values.tolist()


# ------------------------------------------------- only the lines around new characters go to the reference

LINES = st.sampled_from(["\n", "\r\n", "\n\n", " ", "  ", "    ", "\t", "a", "Ab", "'s", "1", "234", "(", ")", "/",
                         ".", ",", "é", "中", "\u3000", "\u00a0", "\u0085", NEW, "\u088f", "x\u036f", "<eos>"])


def _naive_cuts(text: bytes, rule=CutRule(b"", False)) -> list[int]:
    """For every p where text[p - 1] and text[p] are spaces in a run of spaces that starts a line (q,
    after a newline), and a visible ASCII character not in ``rule.not_before`` follows text[p]: q if
    ``rule.at_line_start``, else p."""
    cuts = []
    for p in range(1, len(text) - 1):
        if text[p - 1] == text[p] == 0x20 and 0x21 <= text[p + 1] <= 0x7E and text[p + 1] not in rule.not_before:
            q = p
            while q > 0 and text[q - 1] == 0x20:
                q -= 1
            if q > 0 and text[q - 1] == 0x0A:
                cuts.append(q if rule.at_line_start else p)
    return cuts


@settings(max_examples=300, deadline=None)
@given(st.lists(LINES, max_size=40).map("".join))
def test_indent_cuts_are_those_of_a_naive_reference(text):
    from raypack.tokenize.backends.new_characters import indent_cuts

    data = text.encode("utf-8")
    assert indent_cuts(np.frombuffer(data, np.uint8)).tolist() == _naive_cuts(data)
    for rule in (CutRule(b"<(", False), CutRule(b"", True), CutRule(b"(", True)):
        assert indent_cuts(np.frombuffer(data, np.uint8), rule).tolist() == _naive_cuts(data, rule)


CODE = "def f(x):\n    if x:\n        return [\n            1,\n        ]\n\n    return x  \n  \n\tpass\n"
ENDS_INDENTED = "abc\n   "
"""Trained on, with cl100k's regex (whose ``\\s++$`` takes it whole), it makes "\\n   " one token."""


def _split_tokenizer(pattern):
    """A byte-level BPE whose pre-tokenizer is ``Split(pattern, Isolated)`` then
    ``ByteLevel(use_regex=false)`` (Llama 3's and o200k's shape), or GPT-2's ``ByteLevel`` for None."""
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    if pattern is not None:
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
            tokenizers.pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=800, special_tokens=["<bos>", "<eos>"], show_progress=False,
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS + [CODE, ENDS_INDENTED] * 50, trainer)  # merges across newlines and indents
    return tok


def _cuttable_references(tmp_path_factory):
    """(name, tokenizer spec) for every pattern of CUTTABLE_PATTERNS."""

    from raypack.tokenize.backends.new_characters import CUTTABLE_PATTERNS

    directory = tmp_path_factory.mktemp("cuttable")
    specs = {}
    cl100k = TIKTOKEN_ENCODINGS["cl100k_base"]["pat_str"]
    for name, pattern in (("gpt2", None), ("llama3", LLAMA3), ("o200k split", O200K), ("cl100k split", cl100k)):
        path = directory / f"{name.replace(' ', '_')}.json"
        _split_tokenizer(pattern).save(str(path))
        specs[name] = str(path)
    specs["cl100k"], specs["o200k"] = "tiktoken:cl100k_base", "tiktoken:o200k_base"
    assert len(CUTTABLE_PATTERNS) == 4  # each is tested here (o200k's Split regex is tiktoken's pattern)
    return specs


@pytest.fixture(scope="module")
def cuttable(tmp_path_factory):
    """name: (reference tokenizer, the bytes that may not follow a cut)."""
    from raypack.tokenize.backends.new_characters import indent_cut_rule

    specs = _cuttable_references(tmp_path_factory)
    tokenizers = {name: load_tokenizer(spec) for name, spec in specs.items()}
    rules = {name: indent_cut_rule(tokenizer) for name, tokenizer in tokenizers.items()}
    assert rules == {"gpt2": CutRule(b"<", False), "llama3": CutRule(b"<", True),  # <bos>, <eos>
                     "o200k split": CutRule(b"<", True), "cl100k split": CutRule(b"<", True),
                     "cl100k": CutRule(b"", True), "o200k": CutRule(b"", True)}
    return {name: (tokenizer, rules[name]) for name, tokenizer in tokenizers.items()}


def _cut_at(text: str, cuts: list[int]) -> list[str]:
    data = text.encode("utf-8")
    edges = [0, *cuts, len(data)]
    return [data[a:b].decode("utf-8") for a, b in zip(edges[:-1], edges[1:])]


@settings(max_examples=400, deadline=None)
@given(st.lists(LINES, max_size=40).map("".join))
@example("\n  <eos>")  # an added token right after the cut: tokenizers' regex sees the spaces end a text
@example("a\n    (\n  b  \n\t\n   x")
@example("abc\n    def")  # cl100k's \s++$ (found by a hostile trial, when cl100k's cut was before the last space)
def test_each_cuttable_pattern_gives_the_same_ids_cut_at_indents(cuttable, text):
    """The claim the routing rests on, against the libraries themselves: for every pattern of
    CUTTABLE_PATTERNS, the reference's ids of a text equal those of its pieces cut at indent_cuts."""
    for name, (tokenizer, rule) in cuttable.items():
        pieces = _cut_at(text, _naive_cuts(text.encode("utf-8"), rule))
        whole = tokenizer.encode_flat(pa.array([text])).values.tolist()
        apart = tokenizer.encode_flat(pa.array(pieces)).values.tolist()
        assert apart == whole, (name, pieces)


@pytest.mark.parametrize("name", ["cl100k", "o200k"])
def test_cutting_at_every_line_start_would_change_the_ids(cuttable, name):
    """So the test above can fail: the obvious cut, after every newline, splits cl100k's and
    o200k's ``\\s*[\\r\\n]+`` ("\\n\\n" is one token of both); an indented line's start does not."""
    text = "x = 1\n\n    y = 2\n"
    data = text.encode("utf-8")
    line_starts = [p + 1 for p in range(len(data) - 1) if data[p] == 0x0A]
    tokenizer = cuttable[name][0]
    whole = tokenizer.encode_flat(pa.array([text])).values.tolist()
    assert tokenizer.encode_flat(pa.array(_cut_at(text, line_starts))).values.tolist() != whole
    assert tokenizer.encode_flat(pa.array(_cut_at(text, _naive_cuts(data, cuttable[name][1])))).values.tolist() == whole


@pytest.mark.parametrize("name, text", [("gpt2", "x = 1\n    y = 2\n"), ("cl100k split", "abc\n    def")])
def test_the_other_place_in_the_line_would_change_the_ids(cuttable, name, text):
    """Each pattern's place matters: GPT-2's ``\\s+(?!\\S)`` takes the newline with the spaces, so a
    cut at the line's start splits its token; cl100k's ``\\s++$`` takes ``"\\n   "`` whole at the end
    of a piece cut before the last space, which a vocabulary holding that token encodes otherwise
    (a hostile trial found it; tiktoken's own cl100k_base has no such token)."""
    tokenizer, rule = cuttable[name]
    data = text.encode("utf-8")
    whole = tokenizer.encode_flat(pa.array([text])).values.tolist()
    other = _naive_cuts(data, rule._replace(at_line_start=not rule.at_line_start))
    assert other and tokenizer.encode_flat(pa.array(_cut_at(text, other))).values.tolist() != whole
    assert tokenizer.encode_flat(pa.array(_cut_at(text, _naive_cuts(data, rule)))).values.tolist() == whole


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(LINES, max_size=30).map("".join), max_size=6), st.sampled_from([1024, 3]), st.booleans(),
       st.sampled_from([(), ((ord("é"), ord("é")),)]))
def test_the_stretches_holding_new_characters_take_the_references_ids(texts, max_runs, at_line_start, misread):
    """A backend giving [1] per character, a reference [2, 2]: in a document holding a new character,
    each run of stretches between indent cuts holding one has the reference's ids, the rest the
    backend's (a naive cut and split, per document)."""
    from raypack.tokenize.backends import new_characters

    array = pa.array(texts, pa.string())

    def ids(texts_array, per):
        lengths = [len(t) * len(per) for t in texts_array.to_pylist()]
        return FlatIds(np.array([v for t in texts_array.to_pylist() for _ in t for v in per], np.uint32),
                       np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))

    saved, new_characters.MAX_RUNS = new_characters.MAX_RUNS, max_runs
    try:
        got = encode_new_characters(array, ids(array, [1]), lambda sub: ids(sub, [2, 2]), lambda sub: ids(sub, [1]),
                                    CutRule(b"(", at_line_start), misread)
    finally:
        new_characters.MAX_RUNS = saved
    want = []
    for text in texts:
        cuts = _naive_cuts(text.encode("utf-8"), CutRule(b"(", at_line_start))
        stretches = _cut_at(text, cuts) if _is_new(text, misread) else [text]
        runs = 1 + sum(_is_new(a, misread) != _is_new(b, misread) for a, b in zip(stretches, stretches[1:]))
        if runs > max_runs:
            stretches = [text]  # many runs: the whole document to the reference
        want.append([v for s in stretches for _ in s for v in ([2, 2] if _is_new(s, misread) else [1])])
    assert [got.values[got.offsets[k]:got.offsets[k + 1]].tolist() for k in range(len(texts))] == want


INDENTED = ("def table():\n    return [\n    (0x1C89, 'M', '\u1c8a'),\n    (0x1C8A, 'V'),\n"
            f"    ('{NEW}'S', \"{NEW}'s\"),\n    # x{NEW}y\n]\n\n  plain  text\n    more\n")


@pytest.mark.parametrize("backend", FAST_INSTALLED)
@pytest.mark.parametrize("spec", ["byte-level", "tiktoken:cl100k_base", "tiktoken:o200k_base"])
def test_indented_documents_with_new_characters_get_the_references_ids(backend, spec, byte_level):
    """Through the backed tokenizer, documents cut into stretches (indented code holding new
    characters on some lines, as Unicode tables do) equal the reference, with others around them."""
    spec = byte_level if spec == "byte-level" else spec
    texts = pa.array(["plain", INDENTED, INDENTED * 3 + NEW, f"{NEW}'S", "", INDENTED.replace("    ", "  \t  ")])
    tokenizer = load_backed_tokenizer(spec, backend)
    assert tokenizer.cut_rule is not None
    reference = load_tokenizer(spec).encode_flat(texts)
    got = tokenizer.encode_flat(texts)
    assert np.array_equal(got.offsets, reference.offsets)
    assert np.array_equal(got.values, reference.values)


def _config(**changes):
    config = {"normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
              "added_tokens": [{"content": "<|eos|>", "id": 5, "special": True, "lstrip": False, "rstrip": False}]}
    config.update(changes)
    return config


def _split(pattern, split=None):
    split = split or {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    return {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        split, {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}}


@pytest.mark.parametrize("changes, rule", [
    ({}, CutRule(b"<", False)),
    (_split(TIKTOKEN_ENCODINGS["cl100k_base"]["pat_str"]), CutRule(b"<", True)),
    (_split(TIKTOKEN_ENCODINGS["o200k_base"]["pat_str"]), CutRule(b"<", True)),
    ({"added_tokens": []}, CutRule(b"", False)),
    ({"added_tokens": [{"content": "<x>", "id": 5}, {"content": "[y]", "id": 6}]}, CutRule(b"<[", False)),
    ({"normalizer": {"type": "NFC"}}, None),
    ({"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}}, None),
    ({"pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}}, None),
    ({"pre_tokenizer": None}, None),
    ({"added_tokens": [{"content": "    ", "id": 5}]}, None),
    ({"added_tokens": [{"content": "\n", "id": 5}]}, None),
    ({"added_tokens": [{"content": "<x>", "id": 5, "lstrip": True}]}, None),
    ({"added_tokens": [{"content": "<x>", "id": 5, "rstrip": True}]}, None),
    (_split(r"\s+|\S+"), None),
    (_split(TIKTOKEN_ENCODINGS["cl100k_base"]["pat_str"], {**_split("x")["pre_tokenizer"]["pretokenizers"][0],
                                                          "behavior": "Removed"}), None),
    (_split(None, "Split"), None),
])
def test_only_the_proven_shapes_are_cut(changes, rule):
    from raypack.tokenize.backends.new_characters import cut_rule_of

    assert cut_rule_of(_config(**changes)) == rule


@pytest.mark.skipif(BACKENDS["fastokens"].version() is None, reason="fastokens is not installed")
def test_u180e_is_routed_where_fastokens_and_tokenizers_part(tmp_path):
    """U+180E (out of White_Space since Unicode 6.3): fastokens' regex engine for the split regexes it
    has no built-in matcher for (GPT-2's as a Split, here) counts it as ``\\s``, ``tokenizers``'
    Oniguruma does not (a hostile trial found it; the only code point of planes 0-3 and 14 where
    they part). Trained with GPT-2's ByteLevel, so that the vocabulary joins it to what follows."""
    import tokenizers

    tok = train_byte_level_bpe(CORPUS + ["(.\u180e<x> 1\u180e's a\u180e<b"] * 50, 700)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(GPT2_SPLIT), "isolated"),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = pa.array(["(\u180e<", "\u180e<x", "1\u180e's", "plain", "\n    (\u180e<x>\n    a\n"])
    backed = load_backed_tokenizer(str(tmp_path / "tokenizer.json"), "fastokens")
    reference = load_tokenizer(str(tmp_path / "tokenizer.json")).encode_flat(texts)
    assert backed.encoder.encode_flat(texts).values.tolist() != reference.values.tolist()  # so this test can fail
    got = backed.encode_flat(texts)
    assert np.array_equal(got.offsets, reference.offsets) and np.array_equal(got.values, reference.values)


@pytest.mark.skipif(BACKENDS["fastokens"].version() is None, reason="fastokens is not installed")
@pytest.mark.parametrize("shape", ["llama3", "qwen2 NFC"])
def test_long_s_is_routed_where_fastokens_and_tokenizers_part(tmp_path, shape):
    """U+017F: Oniguruma's ``(?i:'s)`` takes ``'ſ`` (ſ folds to s), fastokens' Llama 3 and Qwen 2 matchers do
    not, so ``"'ſſ"`` is cut otherwise (found probing every code point; Qwen 2 is fastokens' in ``auto``)."""
    import tokenizers

    pattern = LLAMA3 if shape == "llama3" else LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
    tok = train_byte_level_bpe(CORPUS + ["it'ſſ 'ſt x'ſ"] * 50, 700)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([
        tokenizers.pre_tokenizers.Split(tokenizers.Regex(pattern), "isolated"),
        tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    if shape == "qwen2 NFC":
        tok.normalizer = tokenizers.normalizers.NFC()
    tok.save(str(tmp_path / "tokenizer.json"))
    texts = pa.array(["'ſſ", "it'ſſ here", "plain", "'ſ"])
    backed = load_backed_tokenizer(str(tmp_path / "tokenizer.json"), "fastokens")
    reference = load_tokenizer(str(tmp_path / "tokenizer.json")).encode_flat(texts)
    assert backed.encoder.encode_flat(texts).values.tolist() != reference.values.tolist()  # so this test can fail
    got = backed.encode_flat(texts)
    assert np.array_equal(got.offsets, reference.offsets) and np.array_equal(got.values, reference.values)
