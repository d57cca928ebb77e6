"""Tokenizer backends (raypack.tokenize.backends): every backend gives the reference library's ids,
token for token; auto, its fallback and the refusals; the run-time guard (raypack.tokenize.guard).

Lone surrogates: a Python str holding one cannot be written as UTF-8, so neither a JSONL line
nor a Parquet string (both UTF-8) can carry one; Arrow bytes that encode one (CESU-8 style) are
refused as invalid UTF-8 with the row named (test_invalid_utf8_is_one_line_naming_the_row).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.cli import main
from raypack.errors import BackendError, InputError, install_extra
from raypack.tokenize import backends as backends_module
from raypack.tokenize.backends import (
    AUTO_ORDER,
    BACKENDS,
    BackedTokenizer,
    Unsupported,
    load_backed_tokenizer,
    select_encoder,
)
from raypack.tokenize.backends.fastokens import FastokensBackend
from raypack.tokenize.backends.gigatoken import MAX_ID, GigatokenBackend, GigatokenEncoder, pool_threads
from raypack.tokenize.guard import BYTES_SHARE, FREE_BYTES, ReferenceGuard, candidates
from raypack.tokenize.job import TextOptions, TokenizeConfig, run_tokenize
from raypack.tokenize.tokenizers import TIKTOKEN_ENCODINGS, FlatIds, load_tokenizer

from helpers import DEEPSEEK, LLAMA3, O200K, train_byte_level_bpe, train_sentencepiece_style_bpe

FAST = [name for name in BACKENDS if name != "reference"]
FAST_INSTALLED = [pytest.param(name, marks=pytest.mark.skipif(BACKENDS[name].version() is None,
                                                             reason=f"{name} is not installed (the text extra)"))
                  for name in FAST]
needs_gigatoken = pytest.mark.skipif(GigatokenBackend().version() is None,
                                     reason="gigatoken is not installed (the text extra)")
needs_fastokens = pytest.mark.skipif(FastokensBackend().version() is None,
                                     reason="fastokens is not installed (the text extra, on x86_64)")


# --------------------------------------------------------------------------------------- corpus


def varied_corpus(seed: int = 0) -> list[str]:
    """Documents of every kind the backends must agree on (a 1 MB one among them)."""
    rng = random.Random(seed)
    words = ["the", "packing", "of", "tokens", "isn't", "it's", "we'll", "Hello", "WORLD", "123", "4567", "3.14",
             "naïve", "café", "Straße", "ǅemal", "x86_64", "__init__", "e-mail", "http://a.b/c?d=e"]
    scripts = ["日本語のテキストです。", "中文文本，标点！", "한국어 문장", "مرحبا بالعالم، كيف حالك؟", "שלום עולם"]
    scripts += ["👩‍👩‍👧‍👦 family", "🏳️‍🌈🇺🇳 flags", "👍🏽👍🏿", "e\u0301 combining",
                "\u200bzero\u200dwidth", "Ωmega ∑ ∫ √"]
    specials = ["<|endoftext|>", "<|fim_prefix|>", "<|endofprompt|>", "<s>", "</s>", "<unk>", "<bos>", "<eos>",
                "<0x41>"]
    spaces = [" ", "  ", "\t", "\n", "\r\n", "\n\n\n", "   \t ", "\u00a0", "\u3000", "\x0b", "\x0c"]
    docs = ["", " ", "\n", "   \n\t  ", "\n\n\n\n", "\x00", "a\x00b", "\x00\x00 \x00", "<|endoftext|>", "<s></s>"]
    for _ in range(300):
        parts = [rng.choice([rng.choice(words), rng.choice(scripts), rng.choice(specials), rng.choice(spaces),
                             chr(rng.randrange(0x20, 0x2FFF)), str(rng.randrange(10**6))])
                 for _ in range(rng.randrange(1, 40))]
        docs.append("".join(p + rng.choice(["", " ", " ", "\n"]) for p in parts))
    prose = " ".join(rng.choice(words + scripts) for _ in range(40000))
    docs.append((prose * (1 + (1 << 20) // len(prose)))[: 1 << 20])  # a 1 MB document
    return docs


CORPUS = varied_corpus()
assert max(len(d.encode()) for d in CORPUS) >= 1 << 20 and "" in CORPUS


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory):
    """spec by name: byte-level BPE (with an <|endoftext|> added special), SentencePiece-style BPE
    with byte fallback, cl100k_base, o200k_base."""
    root = tmp_path_factory.mktemp("toks")
    train = [d for d in CORPUS if len(d) < 5000][:200]
    byte_level = train_byte_level_bpe(train, 600)
    byte_level.add_special_tokens(["<|endoftext|>"])
    byte_level.save(str(root / "byte_level.json"))
    train_sentencepiece_style_bpe(train, 800).save(str(root / "sp_byte_fallback.json"))
    return {"byte_level": str(root / "byte_level.json"), "sp_byte_fallback": str(root / "sp_byte_fallback.json"),
            "cl100k_base": "tiktoken:cl100k_base", "o200k_base": "tiktoken:o200k_base"}


def assert_same_ids(got: FlatIds, want: FlatIds, texts: list[str]) -> None:
    assert got.offsets.shape == want.offsets.shape
    for k, text in enumerate(texts):
        a = got.values[got.offsets[k]:got.offsets[k + 1]]
        b = want.values[want.offsets[k]:want.offsets[k + 1]]
        assert np.array_equal(a, b), f"document {k} ({text[:60]!r}): {a[:20]} vs {b[:20]}"


# ------------------------------------------------------------------------------ token for token


@pytest.mark.parametrize("backend", FAST_INSTALLED)
@pytest.mark.parametrize("name", ["byte_level", "sp_byte_fallback", "cl100k_base", "o200k_base"])
def test_every_backend_gives_the_reference_ids(tokenizer_files, name, backend):
    reference = load_tokenizer(tokenizer_files[name])
    encoder = BACKENDS[backend].encoder(reference)
    long_doc = CORPUS[-1]
    if name == "sp_byte_fallback":  # no pre-tokenizer: the reference merges the whole text at once (slow)
        long_doc = long_doc[:100_000]
    texts = CORPUS[:-1] + [long_doc]
    got = FlatIds(np.zeros(0, np.uint32), np.zeros(1, np.int64))
    for start in range(0, len(texts), 97):  # batches, and an Arrow slice that does not start at 0
        batch = pa.array(["pad"] + texts[start:start + 97]).slice(1)
        part, want = encoder.encode_flat(batch), reference.encode_flat(batch)
        assert_same_ids(part, want, texts[start:start + 97])
        got = FlatIds(np.concatenate([got.values, part.values]),
                      np.concatenate([got.offsets, got.offsets[-1] + part.offsets[1:]]))
    assert got.offsets[-1] > 100_000  # not vacuous: real ids were compared
    large = encoder.encode_flat(pa.array(texts[:50], type=pa.large_string()))
    assert_same_ids(large, reference.encode_flat(pa.array(texts[:50])), texts[:50])


@needs_gigatoken
@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=60), max_size=8))
def test_random_unicode_gives_the_reference_ids(texts):
    for reference, encoder in _hypothesis_pairs():
        got = encoder.encode_flat(pa.array(texts, type=pa.string()))
        assert_same_ids(got, reference.encode_flat(pa.array(texts, type=pa.string())), texts)


_PAIRS: list = []


def _hypothesis_pairs() -> list:
    """(reference, encoder) of every installed fast backend for a byte-level BPE and cl100k_base,
    loaded once (fixtures do not mix with @given)."""
    if not _PAIRS:
        import tempfile

        path = tempfile.mkdtemp(prefix="raypack-hyp-") + "/tok.json"
        train_byte_level_bpe(CORPUS[:200], 500).save(path)
        for spec in (path, "tiktoken:cl100k_base"):
            reference = load_tokenizer(spec)
            for backend in FAST:
                if BACKENDS[backend].version() is not None:
                    _PAIRS.append((reference, BACKENDS[backend].encoder(reference)))
    return _PAIRS


@needs_gigatoken
def test_ids_come_out_as_numpy_without_python_lists(tokenizer_files, monkeypatch):
    reference = load_tokenizer(tokenizer_files["byte_level"])
    encoder = GigatokenBackend().encoder(reference)
    monkeypatch.setattr(type(encoder.tokenizer.backend), "encode_batch_list", None, raising=False)
    flat = encoder.encode_flat(pa.array(CORPUS[:20]))
    assert flat.values.dtype == np.uint32 and flat.offsets.dtype == np.int64 and flat.offsets[0] == 0
    assert flat.values.base is not None  # a view of the backend's buffer, not a copy


@needs_gigatoken
@pytest.mark.parametrize("name", ["byte_level", "cl100k_base"])
@pytest.mark.parametrize("threads, parallel", [("1", False), ("2", None), ("", None)])
def test_a_one_thread_pool_encodes_on_the_calling_thread_with_the_same_ids(tokenizer_files, monkeypatch, name,
                                                                             threads, parallel):
    """A Ray actor given one CPU (RAYON_NUM_THREADS=1) encodes on its own thread: the cheaper path,
    the same ids; with a pool of threads to share, gigatoken's rule (None) stays."""
    monkeypatch.setenv("RAYON_NUM_THREADS", threads)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    reference = load_tokenizer(tokenizer_files[name])
    encoder = GigatokenBackend().encoder(reference)
    calls, encode_batch = [], encoder.tokenizer.encode_batch

    def recorded(inputs, *, parallel=None):
        calls.append(parallel)
        return encode_batch(inputs, parallel=parallel)

    monkeypatch.setattr(encoder.tokenizer, "encode_batch", recorded)
    texts = CORPUS[:-1]
    got = encoder.encode_flat(pa.array(texts))
    assert calls == [parallel]
    assert_same_ids(got, reference.encode_flat(pa.array(texts)), texts)
    assert got.offsets[-1] > 10_000


def test_the_pool_size_follows_rayons_rule(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    for value, want in (("1", 1), ("4", 4), ("", 3), ("0", 3), ("x", 3)):
        monkeypatch.setenv("RAYON_NUM_THREADS", value)
        assert pool_threads() == want, value
    monkeypatch.delenv("RAYON_NUM_THREADS")
    assert pool_threads() == 3


def _random_words(num_words: int, seed: int) -> str:
    """Distinct 10-character words: every one a new short pretoken for gigatoken's table."""
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8)
    words = np.full((num_words, 11), ord(" "), np.uint8)
    words[:, 1:] = alphabet[np.random.default_rng(seed).integers(0, alphabet.size, size=(num_words, 10))]
    return words.tobytes().decode()


@needs_gigatoken
@pytest.mark.parametrize("name", ["byte_level", "cl100k_base"])
def test_the_pretoken_table_is_replaced_past_its_budget_from_the_bytes_first_loaded(tokenizer_files, tmp_path,
                                                                                     name):
    """Past cache_budget of growth a fresh tokenizer is loaded (from the bytes read at the start,
    though the file is gone), and the ids do not change."""
    path = tmp_path / "tok.json"
    if name == "byte_level":
        path.write_bytes(open(tokenizer_files[name], "rb").read())
    reference = load_tokenizer(str(path) if name == "byte_level" else tokenizer_files[name])
    grown = itertools.count(0, 10 << 20)  # 10 MiB more at every look
    fresh = BACKENDS["gigatoken"].encoder(reference)
    encoder = GigatokenEncoder(BACKENDS["gigatoken"].encoder(reference)._load, cache_budget=25 << 20,
                               rss=lambda: 1 + next(grown))
    if name == "byte_level":
        path.unlink()
    texts = [_random_words(200, seed) for seed in range(6)] + CORPUS[:40]
    for k in range(0, len(texts), 4):
        piece = pa.array(texts[k:k + 4], pa.large_string())
        assert_same_ids(encoder.encode_flat(piece), fresh.encode_flat(piece), texts[k:k + 4])
    assert encoder.reloads == 3  # 12 encodes: the first sets the baseline, then every third is 30 MiB past it


_TABLE_CHILD = r"""
import json, sys
import pyarrow as pa
from raypack.tokenize.backends import BACKENDS
from raypack.tokenize.backends.gigatoken import resident_bytes
from raypack.tokenize.tokenizers import load_tokenizer
encoder = BACKENDS["gigatoken"].encoder(load_tokenizer(sys.argv[1]))
encoder.cache_budget = int(sys.argv[2])
start, grown = resident_bytes(), []
reader = pa.ipc.open_file(pa.OSFile(sys.argv[3]))  # each batch read into memory, freed after its call
for k in range(reader.num_record_batches):  # one call per batch of words never seen before
    encoder.encode_flat(reader.get_batch(k).column(0))
    grown.append(resident_bytes() - start)
print(json.dumps({"reloads": encoder.reloads, "grown": grown}))
"""


@needs_gigatoken
def test_the_pretoken_table_is_freed_when_replaced(tokenizer_files, tmp_path):
    """The real thing, in a fresh process: distinct random words grow it by ~6 bytes a byte of text;
    with a 32 MiB budget it replaces its tokenizer and stays within the budget plus one call's growth
    (and the allocator's slack) of where its first call left it. With no budget it grows past that."""
    import subprocess
    import sys

    from raypack.tokenize.backends.gigatoken import resident_bytes

    if not resident_bytes():
        pytest.skip("no /proc/self/statm here")
    words = tmp_path / "words.arrow"  # 16 calls of 4 texts, 2.2 MB of distinct words each
    schema = pa.schema([("text", pa.large_string())])
    with pa.OSFile(str(words), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for seed in range(16):
            text = _random_words(200_000, seed)
            writer.write_batch(pa.record_batch([pa.array([text[k::4] for k in range(4)], pa.large_string())],
                                               schema=schema))
    runs = {}
    for budget in (32 << 20, 1 << 40):
        done = subprocess.run([sys.executable, "-c", _TABLE_CHILD, tokenizer_files["byte_level"], str(budget),
                               str(words)], capture_output=True, text=True, check=True)
        runs[budget] = json.loads(done.stdout.splitlines()[-1])
    bounded, unbounded = runs[32 << 20], runs[1 << 40]
    assert bounded["reloads"] >= 2 and unbounded["reloads"] == 0
    # within the budget plus one call's growth (6 bytes a byte of 2.2 MB) and slack, of the first call
    assert max(bounded["grown"]) < bounded["grown"][0] + (32 + 6 * 2.2 + 32) * 2**20
    assert max(unbounded["grown"]) > max(bounded["grown"]) + 64 * 2**20


# ------------------------------------------------------------------------- auto, fallback, refusals


def _unsupported_tokenizer(tmp_path, kind: str) -> str:
    texts = CORPUS[10:200]
    if kind == "nfkc":
        tok = train_byte_level_bpe(texts, 400)
        tok.normalizer = tokenizers.normalizers.NFKC()
    elif kind == "wordpiece":
        tok = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
        tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
        tok.train_from_iterator(texts, tokenizers.trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    else:  # an added token gigatoken loads but matches differently
        tok = train_byte_level_bpe(texts, 400)
        tok.add_tokens([tokenizers.AddedToken("<x>", single_word=True)])
    path = tmp_path / f"{kind}.json"
    tok.save(str(path))
    return str(path)


@needs_gigatoken
def test_auto_takes_the_fast_backend_and_records_it(tokenizer_files):
    tokenizer = load_backed_tokenizer(tokenizer_files["byte_level"])
    assert AUTO_ORDER[0] == "gigatoken" and tokenizer.backend == "gigatoken"
    assert isinstance(tokenizer.encoder, GigatokenEncoder)
    assert tokenizer.backend_record() == {"name": "gigatoken", "version": GigatokenBackend().version()}
    reference = load_backed_tokenizer(tokenizer_files["byte_level"], "reference")
    assert reference.backend_record() == {"name": "reference", "library": "tokenizers",
                                          "version": tokenizers.__version__}


@needs_gigatoken
@needs_fastokens
@pytest.mark.parametrize("kind, lacks", [("nfkc", "NFKC"), ("wordpiece", "WordPiece")])
def test_auto_falls_back_to_the_reference_with_one_info_line(tmp_path, caplog, kind, lacks):
    path = _unsupported_tokenizer(tmp_path, kind)
    with caplog.at_level(logging.INFO, logger="raypack.tokenize.backends"):
        tokenizer = load_backed_tokenizer(path)
    assert tokenizer.backend == "reference" and tokenizer.encoder is tokenizer.reference
    lines = [r.getMessage() for r in caplog.records if r.name == "raypack.tokenize.backends"]
    assert len(lines) == 1 and "\n" not in lines[0] and lacks in lines[0] and "tokenizers" in lines[0]
    assert "gigatoken cannot" in lines[0] and "fastokens cannot" in lines[0]
    assert "pip install" not in lines[0]  # both are installed: the install hint misled (a new user's trial)


@needs_gigatoken
def test_a_token_id_far_past_the_vocabulary_is_not_given_to_gigatoken(tmp_path, caplog, capsys):
    """A hostile trial: a vocabulary entry with id 4294967294 (a u32, which tokenizers loads and encodes with)
    made gigatoken ask for 64 GiB and abort the process, no line, exit 134. Such a file goes to the next
    backend under auto, and an explicit gigatoken is refused in one line."""
    config = json.loads(train_byte_level_bpe(CORPUS[10:200], 400).to_str())
    vocab = config["model"]["vocab"]
    vocab[max(vocab, key=vocab.get)] = MAX_ID  # past the bound, yet small enough for the code before to load
    path = tmp_path / "sparse.json"
    path.write_text(json.dumps(config))
    with pytest.raises(Unsupported, match=rf"its largest token id {MAX_ID:,}: gigatoken allocates a table entry"):
        GigatokenBackend().encoder(load_tokenizer(str(path)))
    with caplog.at_level(logging.INFO, logger="raypack.tokenize.backends"):
        assert load_backed_tokenizer(str(path)).backend != "gigatoken"
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"text": "some text"}\n')
    assert main(["pack", "--local", "--input", str(jsonl), "--output", str(tmp_path / "o"), "--context-length", "8",
                 "--tokenizer", str(path), "--tokenizer-backend", "gigatoken"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"its largest token id {MAX_ID:,}" in err, err


@needs_gigatoken
def test_autos_line_is_said_once_per_tokenizer_though_a_run_loads_it_twice(tmp_path, caplog):
    path = _unsupported_tokenizer(tmp_path, "nfkc")
    other = tmp_path / "copy" / "nfkc.json"
    other.parent.mkdir()
    other.write_bytes(open(path, "rb").read())
    with caplog.at_level(logging.INFO, logger="raypack.tokenize.backends"):
        for spec in (path, path, str(other)):
            assert load_backed_tokenizer(spec).backend == "reference"
    lines = [r.getMessage() for r in caplog.records if r.name == "raypack.tokenize.backends"]
    assert len(lines) == 2 and lines[0] == lines[1] and "NFKC" in lines[0]


@needs_gigatoken
@needs_fastokens
def test_auto_takes_the_next_backend_that_takes_the_tokenizer_with_one_info_line(tmp_path, caplog):
    path = _unsupported_tokenizer(tmp_path, "single_word")
    with caplog.at_level(logging.INFO, logger="raypack.tokenize.backends"):
        tokenizer = load_backed_tokenizer(path)
    assert tokenizer.backend == "fastokens" and tokenizer.backend_record()["name"] == "fastokens"
    lines = [r.getMessage() for r in caplog.records if r.name == "raypack.tokenize.backends"]
    assert len(lines) == 1 and "gigatoken cannot" in lines[0] and "single_word" in lines[0]
    assert lines[0].endswith("using fastokens")
    texts = pa.array(["Hello <x>world  <x> ok<x>", *CORPUS[:50]])
    assert_same_ids(tokenizer.encode_flat(texts), tokenizer.reference.encode_flat(texts), texts.to_pylist())


@needs_gigatoken
@needs_fastokens
@pytest.mark.parametrize("shape, picked", [
    ("sp Prepend+Replace", "fastokens"), ("sp Replace only", "fastokens"), ("sp no normalizer", "fastokens"),
    ("sp Metaspace always, no split", "gigatoken"),  # fastokens refuses Metaspace
    ("sp Metaspace", "gigatoken"), ("gpt2", "gigatoken"), ("llama3", "gigatoken")])
def test_auto_takes_fastokens_first_for_a_bpe_over_whole_documents(shape_files, shape, picked, caplog, monkeypatch):
    """No pre-tokenizer (Llama 2's SentencePiece-style tokenizer.json): gigatoken merges over each
    whole document at about half fastokens' speed (BENCHMARKS.md, stop 51), so auto takes fastokens
    there, and gigatoken where fastokens is not installed (Linux aarch64) or refuses the tokenizer."""
    import raypack.tokenize.backends as backends

    monkeypatch.setattr(backends, "_SAID", set())
    with caplog.at_level(logging.INFO, logger="raypack.tokenize.backends"):
        tokenizer = load_backed_tokenizer(str(shape_files[shape]))
    assert tokenizer.backend == picked
    lines = [r.getMessage() for r in caplog.records if r.name == "raypack.tokenize.backends"]
    if shape in ("sp Metaspace", "gpt2", "llama3"):
        assert lines == []
    elif picked == "fastokens":
        assert len(lines) == 1 and "gigatoken is slower for this tokenizer (its BPE merges over whole documents" \
            in lines[0] and lines[0].endswith("using fastokens")
        monkeypatch.setattr(FastokensBackend, "version", lambda self: None)
        assert load_backed_tokenizer(str(shape_files[shape])).backend == "gigatoken"
    else:
        assert len(lines) == 1 and "fastokens cannot do this tokenizer" in lines[0] and "slower" not in lines[0]
    got = tokenizer.encode_flat(pa.array(SHAPE_TEXTS))
    assert_same_ids(got, _reference_ids(shape_files[shape]), SHAPE_TEXTS)


@needs_gigatoken
@needs_fastokens
def test_a_model_without_a_type_goes_to_the_reference(tmp_path, caplog):
    """A tokenizer.json whose model has no ``type``: ``tokenizers`` still loads it (as a BPE), and the
    backends' checks, which go by the type, passed over it. A
    hostile trial: an untyped model with a single_word added token went to gigatoken, which got 20 of 21
    documents wrong, and the guard's sample missed them. auto now takes the reference (one line), an
    explicit backend is refused, and the ids are the reference's."""
    config = json.loads(train_byte_level_bpe(CORPUS[10:200], 400).to_str())
    config["added_tokens"].append({"id": max(config["model"]["vocab"].values()) + 1, "content": "<z>",
                                   "single_word": True, "lstrip": False, "rstrip": False, "normalized": False,
                                   "special": False})
    del config["model"]["type"]
    path = tmp_path / "untyped.json"
    path.write_text(json.dumps(config))
    reference = tokenizers.Tokenizer.from_file(str(path))
    with caplog.at_level(logging.INFO, logger="raypack.tokenize.backends"):
        tokenizer = load_backed_tokenizer(str(path))
    assert tokenizer.backend == "reference"
    lines = [r.getMessage() for r in caplog.records if r.name == "raypack.tokenize.backends"]
    assert len(lines) == 1 and 'has no "type"' in lines[0], lines
    for backend in ("gigatoken", "fastokens"):
        with pytest.raises(InputError, match=f"--tokenizer-backend {backend} .tokenizer_backend .* cannot encode"):
            select_encoder(load_tokenizer(str(path)), backend)
    texts = ["the<z>the cat 0 a<z> sat", *CORPUS[:20]]
    got = tokenizer.encode_flat(pa.array(texts))
    want = [reference.encode(t, add_special_tokens=False).ids for t in texts]
    assert [got.values[got.offsets[k]:got.offsets[k + 1]].tolist() for k in range(len(texts))] == want


@needs_gigatoken
def test_an_explicit_backend_that_cannot_do_the_tokenizer_is_refused(tmp_path, capsys):
    path = _unsupported_tokenizer(tmp_path, "nfkc")
    with pytest.raises(InputError, match=r"--tokenizer-backend gigatoken \(tokenizer_backend in a config\) cannot "
                                         r"encode this tokenizer exactly \(.*NFKC"):
        select_encoder(load_tokenizer(path), "gigatoken")
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["a b c", "d e"]}), tmp_path / "in" / "in.parquet")
    code = main(["tokenize", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                 "--tokenizer", path, "--tokenizer-backend", "gigatoken", "--local"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "NFKC" in err
    assert f"the tokenizer {os.path.abspath(path)})" in err  # it did not name the file (a new user's trial)


def test_a_backend_that_is_not_installed_names_the_extra(tokenizer_files, monkeypatch, caplog):
    monkeypatch.setattr(GigatokenBackend, "version", lambda self: None)
    with pytest.raises(InputError, match=r"'gigatoken' package is not installed; " + re.escape(install_extra("text"))):
        load_backed_tokenizer(tokenizer_files["cl100k_base"], "gigatoken")
    monkeypatch.setattr(FastokensBackend, "version", lambda self: None)
    with caplog.at_level(logging.INFO, logger="raypack.tokenize.backends"):
        assert load_backed_tokenizer(tokenizer_files["cl100k_base"]).backend == "reference"
    lines = [r.getMessage() for r in caplog.records if r.name == "raypack.tokenize.backends"]
    assert len(lines) == 1 and "gigatoken is not installed; fastokens is not installed" in lines[0]
    assert install_extra("text") in lines[0]


def test_an_unknown_backend_is_refused(capsys):
    with pytest.raises(InputError, match=r"--tokenizer-backend \(tokenizer_backend in a config\) 'fastest' is not one "
                                         "of auto, gigatoken, fastokens, reference"):
        TextOptions(tokenizer="tiktoken:cl100k_base", tokenizer_backend="fastest")
    with pytest.raises(SystemExit) as exit_info:
        main(["tokenize", "--input", "x", "--output", "y", "--tokenizer", "t", "--tokenizer-backend", "fastest"])
    assert exit_info.value.code == 2


def test_pack_refuses_a_backend_without_a_tokenizer(tmp_path, capsys):
    code = main(["pack", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--context-length", "8",
                 "--tokenizer-backend", "reference", "--local"])
    assert code == 2 and "--tokenizer-backend needs --tokenizer" in capsys.readouterr().err


def test_invalid_utf8_is_one_line_naming_the_row(tokenizer_files):
    with pytest.raises(UnicodeEncodeError):
        pa.array(["lone \ud800 surrogate"])  # a str with a lone surrogate cannot become UTF-8 at all
    data = b"ok" + b"\xed\xa0\x80" + b"zz"  # the CESU-8 bytes of a lone surrogate
    texts = pa.StringArray.from_buffers(3, pa.py_buffer(np.array([0, 2, 5, 7], np.int32).tobytes()), pa.py_buffer(data))
    for backend in ["reference", *([n for n in FAST if BACKENDS[n].version()])]:
        with pytest.raises(InputError, match="text row 1 is not valid UTF-8"):
            load_backed_tokenizer(tokenizer_files["cl100k_base"], backend).encode_flat(texts)


# ------------------------------------------------------------- the shapes of tokenizer.json a backend takes

SHAPE_TEXTS = [*CORPUS[:-1], "abc123def 4567 x9", "<x> a<x>b <x>  <y>z", " <y> ", "  leading", "trailing  ",
               "ÀÉÎõü ﬁ ① ２ Ⅻ", "İstanbul ǅ ß", "a\u0301\u0302", "<s>hi</s>", "▁under▁score", "tab\there",
               "a hello hello", "x\u036f\u089ay \u07fd\u036f\u08d2", "<x>\u0338 call <x>\u0338<|im_start|>",
               "caf\u00e9 cafe\u0301 e\u0301\u0323", "a b a  b xa b <x> a b<x>", "<a> <A> x<A>",
               "\u13e3\u13b3\u13a9 \uab70 \u13a0 caf\u00e9 th\u13a0e wor\u13a0ld he\u13a0llo", "x<a>y <a> x<a>yx<a>y",
               "<a>\n<b> <a> \n<b><a>\n<b>",
               # a hostile trial: runs of 4+ digits, and whitespace ending a document, under two Split regexes
               *["order 12345 shipped 1234567 x 1234", "line \n ", "x\r  ", " \n  ", "x \n \t", "end \n\n "] * 3,
               # another: a BOM first, whitespace beside stripping tokens, a text an added token's leading space fits
               "\ufeffHello world", "\ufeff", "a\n\nb", "\n\n", "the", "the cat sat", "\nthe", "x\n<mask>",
               "fill in\n<mask> here", "<mask>\nx"]


def _dense(vocab: dict) -> dict:
    """``vocab`` renumbered 0.. in its order (a vocabulary with entries taken out, no gaps)."""
    return {t: k for k, t in enumerate(sorted(vocab, key=vocab.get))}


def _bl(prefix=False, regex=True):
    return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True, "use_regex": regex}


def _split(pattern=LLAMA3, behavior="Isolated", invert=False):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": invert}


def _seq(*parts):
    return {"type": "Sequence", "pretokenizers": list(parts)}


QWEN_MARKS = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_PLAIN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
               r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_SPLIT = r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
CL100K_PLUS = (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$"
               r"|\s*[\r\n]|\s+(?!\S)|\s+")
_DIGITS = {"type": "Digits", "individual_digits": True}
_METASPACE = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
_LLAMA3 = _seq(_split(), _bl(regex=False))

# name: (base, {top-level key or model.KEY: value}, added tokens (content, flags)): a catalogue written
# from what real tokenizer.json files hold (GPT-2, Llama 3, Qwen 2, o200k-style, Llama 2 / Mistral
# style SentencePiece), and the neighbours of each shape that gigatoken loads but encodes otherwise.
SHAPES = {
    "gpt2": ("bl", {}, []),
    "gpt2 prefix space": ("bl", {"pre_tokenizer": _bl(prefix=True)}, []),
    "gpt2 NFC": ("bl", {"normalizer": {"type": "NFC"}}, []),
    "gpt2 Sequence[NFC]": ("bl", {"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]}}, []),
    "gpt2 ignore_merges": ("bl", {"model.ignore_merges": True}, []),
    "gpt2 unk_token fuse_unk": ("bl", {"model.unk_token": "<bos>", "model.fuse_unk": True}, []),
    "gpt2 truncation and padding in the file": ("bl", {
        "truncation": {"direction": "Right", "max_length": 5, "strategy": "LongestFirst", "stride": 0},
        "padding": {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
                    "pad_type_id": 0, "pad_token": "<bos>"}}, []),
    "gpt2 added tokens": ("bl", {}, [("<x>", {}), ("<y>", {"special": True, "lstrip": True, "rstrip": True})]),
    "gpt2 added normalized": ("bl", {}, [("<x>", {"normalized": True}), ("<y>", {"rstrip": True})]),
    "llama3": ("bl", {"pre_tokenizer": _LLAMA3, "model.ignore_merges": True}, [("<x>", {"special": True})]),
    "o200k-style": ("bl", {"pre_tokenizer": _seq(_split(O200K), _bl(regex=False))}, []),
    "sp Prepend+Replace": ("sp", {}, [("<x>", {"special": True})]),
    "sp Replace only": ("sp", {"normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}}, []),
    "sp no normalizer": ("sp", {"normalizer": None}, []),
    "sp Metaspace": ("sp", {"normalizer": None, "pre_tokenizer": _METASPACE}, []),
    "sp Metaspace always, no split": ("sp", {"normalizer": None, "pre_tokenizer": {
        **_METASPACE, "prepend_scheme": "always", "split": False}}, []),
    "sp ignore_merges, no fuse_unk": ("sp", {"model.ignore_merges": True, "model.fuse_unk": False}, []),
    # gigatoken loads these and gives other ids (test_gigatoken_misencodes_the_shapes_it_is_refused):
    "ByteLevel without its regex": ("bl", {"pre_tokenizer": _bl(regex=False)}, []),
    "no pre-tokenizer, byte-level": ("bl", {"pre_tokenizer": None}, []),
    "Split then ByteLevel with its regex": ("bl", {"pre_tokenizer": _seq(_split(), _bl(regex=True))}, []),
    "Split then ByteLevel with prefix space": ("bl", {"pre_tokenizer": _seq(_split(), _bl(True, False))}, []),
    "Split Removed": ("bl", {"pre_tokenizer": _seq(_split(behavior="Removed"), _bl(regex=False))}, []),
    "Split Contiguous": ("bl", {"pre_tokenizer": _seq(_split(behavior="Contiguous"), _bl(regex=False))}, []),
    "Split alone": ("bl", {"pre_tokenizer": _split()}, []),
    "Digits, Split, ByteLevel": ("bl", {"pre_tokenizer": _seq(_DIGITS, _split(), _bl(regex=False))}, []),
    "Split, Digits, ByteLevel": ("bl", {"pre_tokenizer": _seq(_split(), _DIGITS, _bl(regex=False))}, []),
    "Split, Punctuation, ByteLevel": ("bl", {"pre_tokenizer": _seq(
        _split(), {"type": "Punctuation", "behavior": "Isolated"}, _bl(regex=False))}, []),
    "end_of_word_suffix": ("bl", {"model.end_of_word_suffix": "</w>"}, []),
    "sp continuing_subword_prefix": ("sp", {"model.continuing_subword_prefix": "##"}, []),
    "single_word added token": ("bl", {}, [("<x>", {"single_word": True})]),
    "added token with a leading space, rstrip": ("bl", {}, [(" hello", {"rstrip": True})]),
    "an added token's id past a gap": ("bl", {}, [("<x>", {"gap": 2})]),
    # refused, though gigatoken's ids happened to match here: outside the proven shapes
    "Split MergedWithPrevious": ("bl", {"pre_tokenizer": _seq(_split(behavior="MergedWithPrevious"),
                                                              _bl(regex=False))}, []),
    "Split inverted": ("bl", {"pre_tokenizer": _seq(_split(invert=True), _bl(regex=False))}, []),
    # gigatoken refuses these itself
    "two Splits": ("bl", {"pre_tokenizer": _seq(_split(), _split(r"\p{N}{1,3}"), _bl(regex=False))}, []),
    # fastokens refuses regexes it is not proven on: Oniguruma reads cl100k's \p{N}{1,3}+ as a repeated
    # interval (any run of digits), (?m) as dot-all
    "cl100k-style Split": ("bl", {"pre_tokenizer": _seq(_split(TIKTOKEN_ENCODINGS["cl100k_base"]["pat_str"]),
                                                        _bl(regex=False))}, []),
    "(?m) Split": ("bl", {"pre_tokenizer": _seq(_split(r"(?m)\S.+|\s+"), _bl(regex=False))}, []),
    # DeepSeek V3's three Splits: fastokens takes them (gigatoken refuses the Sequence)
    "deepseek": ("bl", {"pre_tokenizer": _seq(*(_split(p) for p in DEEPSEEK), _bl(regex=False))}, []),
    "Digits then ByteLevel": ("bl", {"pre_tokenizer": _seq(_DIGITS, _bl())}, []),
    "gpt2 Lowercase": ("bl", {"normalizer": {"type": "Lowercase"}}, []),
    "sp Replace by a regex": ("sp", {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"Regex": " +"}, "content": "\u2581"}]}}, []),
    "sp NFKC": ("sp", {"normalizer": {"type": "NFKC"}}, []),
    # found by a hostile trial of gigatoken: it matches these added tokens, and ranks these merges, otherwise
    "gpt2, overlapping added tokens, one normalized": ("bl", {}, [("<a>", {}), ("x<a>y", {"normalized": True})]),
    "gpt2, rstrip beside a token that begins with a newline": ("bl", {}, [("<a>", {"rstrip": True}), ("\n<b>", {})]),
    "gpt2, merges listed twice": ("bl", {"model.merges": lambda merges: merges + merges[:50]}, []),
    # found by a hostile trial: tokenizers drops a byte the vocabulary cannot hold and merges across it
    "sp without byte tokens 0x80-0xFF, no unk": ("sp", {"model.unk_token": None, "model.vocab": lambda vocab: _dense(
        {t: i for t, i in vocab.items() if not (t.startswith("<0x") and int(t[3:5], 16) >= 0x80)})}, []),
    "gpt2 without the byte character of a space": ("bl", {"model.vocab": lambda vocab: _dense(
        {t: i for t, i in vocab.items() if "\u0120" not in t}), "model.merges": lambda merges: [
        m for m in merges if "\u0120" not in (m if isinstance(m, str) else " ".join(m))]}, []),
    "sp Prepend+Replace, normalized added tokens": ("sp", {}, [("a b", {"normalized": True}),
                                                              ("<x>", {"normalized": True})]),
    "sp Metaspace, normalized added tokens": ("sp", {"normalizer": None, "pre_tokenizer": _METASPACE},
                                              [("a b", {"normalized": True}), ("<x>", {"normalized": True})]),
    "sp NFC, Prepend, Replace": ("sp", {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}}, []),
    "qwen2 NFC": ("bl", {"normalizer": {"type": "NFC"},
                         "pre_tokenizer": _seq(_split(LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")), _bl(regex=False))},
                  [("<|im_start|>", {"special": True}), ("<x>", {})]),
    # tokenizers matches a normalized added token in the NFC text ("<x>" + U+0338 is "<x≯"), gigatoken as written
    "gpt2 NFC, a normalized added token": ("bl", {"normalizer": {"type": "NFC"}}, [("<x>", {"normalized": True})]),
    "gpt2 NFC, a normalized added token with a mark": ("bl", {"normalizer": {"type": "NFC"}},
                                                       [("e\u0301", {"normalized": True})]),
    "sp Digits": ("sp", {"pre_tokenizer": _DIGITS}, []),
    # gigatoken's other known regexes (a hostile trial found its list in the library): taken, proven here
    "qwen marks": ("bl", {"pre_tokenizer": _seq(_split(QWEN_MARKS), _bl(regex=False))}, []),
    "o200k without contractions": ("bl", {"pre_tokenizer": _seq(_split(O200K_PLAIN), _bl(regex=False))}, []),
    "gpt2 as a Split": ("bl", {"pre_tokenizer": _seq(_split(GPT2_SPLIT), _bl(regex=False))}, []),
    # ... and two it knows but reads otherwise than tokenizers (Oniguruma): any run of 4+ digits under
    # cl100k's \p{N}{1,3}+; whitespace ending a document under Llama 3's regex with one newline
    "cl100k Split ending in \\s+": ("bl", {"pre_tokenizer": _seq(_split(CL100K_PLUS), _bl(regex=False))}, []),
    "llama3 with one newline": ("bl", {"pre_tokenizer": _seq(_split(LLAMA3.replace(r"\s*[\r\n]+", r"\s*[\r\n]")),
                                                             _bl(regex=False))}, []),
    # a second exactness fuzz: gigatoken prepends Metaspace's "first" replacement where tokenizers does not (the
    # text's first characters deleted), and adds ByteLevel's prefix space before it matches added tokens
    "sp Metaspace first, a BOM replaced by nothing": ("sp", {"pre_tokenizer": _METASPACE, "normalizer": {
        "type": "Replace", "pattern": {"String": "\ufeff"}, "content": ""}}, []),
    "sp Metaspace first, Strip": ("sp", {"pre_tokenizer": _METASPACE, "normalizer": {
        "type": "Strip", "strip_left": True, "strip_right": True}}, []),
    "sp Metaspace first, a Replace by a character": ("sp", {"pre_tokenizer": _METASPACE, "normalizer": {
        "type": "Replace", "pattern": {"String": "\ufeff"}, "content": "_"}}, []),
    "gpt2 prefix space, an added token with a leading space": ("bl", {"pre_tokenizer": _bl(prefix=True)},
                                                               [(" the", {})]),
    # ... and fastokens matches whitespace beside a stripping added token otherwise
    "gpt2, a newline token that strips both sides": ("bl", {}, [("\n", {"lstrip": True, "rstrip": True})]),
    "gpt2, lstrip beside a normalized newline token": ("bl", {}, [("<mask>", {"lstrip": True}),
                                                                  ("\n", {"normalized": True})]),
    # ... and fastokens fails on a byte_fallback vocabulary under ByteLevel, which lacks the byte characters
    "sp under ByteLevel": ("sp", {"normalizer": None, "pre_tokenizer": _bl(regex=True)}, []),
}
GIGATOKEN_TAKES = {"gpt2", "gpt2 prefix space", "gpt2 ignore_merges",
                   "gpt2 unk_token fuse_unk", "gpt2 truncation and padding in the file", "gpt2 added tokens",
                   "gpt2 added normalized", "llama3", "o200k-style", "sp Prepend+Replace", "sp Replace only",
                   "sp no normalizer", "sp Metaspace", "sp Metaspace always, no split",
                   "gpt2 NFC", "gpt2 Sequence[NFC]", "qwen2 NFC",
                   "sp Prepend+Replace, normalized added tokens", "sp Metaspace, normalized added tokens",
                   "qwen marks", "o200k without contractions", "gpt2 as a Split",
                   "sp Metaspace first, a Replace by a character"}
GIGATOKEN_ROUTES = ["gpt2 NFC", "gpt2 Sequence[NFC]", "qwen2 NFC"]
"""Taken, though the library itself encodes some texts otherwise: those holding a code point of its
encoder's ``misread`` go to the reference (gigatoken's NFC_MISREAD)."""
GIGATOKEN_MISENCODES = ["ByteLevel without its regex", "no pre-tokenizer, byte-level",
                        "Split then ByteLevel with its regex", "Split then ByteLevel with prefix space",
                        "Split Removed", "Split Contiguous", "Split alone", "Digits, Split, ByteLevel",
                        "Split, Digits, ByteLevel",
                        "Split, Punctuation, ByteLevel", "end_of_word_suffix", "sp continuing_subword_prefix",
                        "single_word added token", "an added token's id past a gap",
                        "added token with a leading space, rstrip", "gpt2 NFC, a normalized added token",
                        "gpt2 NFC, a normalized added token with a mark",
                        "gpt2, overlapping added tokens, one normalized",
                        "gpt2, rstrip beside a token that begins with a newline", "gpt2, merges listed twice",
                        "cl100k Split ending in \\s+", "llama3 with one newline",
                        "sp Metaspace first, a BOM replaced by nothing", "sp Metaspace first, Strip",
                        "gpt2 prefix space, an added token with a leading space"]


@pytest.fixture(scope="module")
def shape_files(tmp_path_factory):
    """SHAPES as tokenizer.json files, edited from one byte-level and one SentencePiece-style BPE."""
    root = tmp_path_factory.mktemp("shapes")
    train = [d for d in SHAPE_TEXTS if len(d) < 5000][:220]
    bases = {"bl": json.loads(train_byte_level_bpe(train, 700).to_str()),
             "sp": json.loads(train_sentencepiece_style_bpe(train, 900).to_str())}
    files = {}
    for k, (name, (base, edits, added)) in enumerate(SHAPES.items()):
        config = json.loads(json.dumps(bases[base]))
        for key, value in edits.items():
            where, field = (config["model"], key[6:]) if key.startswith("model.") else (config, key)
            where[field] = value(where.get(field)) if callable(value) else value
        next_id = max(config["model"]["vocab"].values()) + 1
        for content, flags in added:
            next_id += flags.get("gap", 0)
            config["added_tokens"].append({"id": next_id, "content": content, "single_word": False, "lstrip": False,
                                           "rstrip": False, "normalized": False, "special": False,
                                           **{f: v for f, v in flags.items() if f != "gap"}})
            next_id += 1
        files[name] = root / f"shape{k}.json"
        files[name].write_text(json.dumps(config))
    return files


def _reference_ids(path) -> FlatIds:
    return load_tokenizer(str(path)).encode_flat(pa.array(SHAPE_TEXTS))


FASTOKENS_REFUSES = {"sp Metaspace", "sp Metaspace, normalized added tokens", "sp Metaspace always, no split",
                     "no pre-tokenizer, byte-level", "Split alone", "Split, Punctuation, ByteLevel", "sp NFKC",
                     "an added token's id past a gap", "cl100k-style Split", "(?m) Split",
                     "sp without byte tokens 0x80-0xFF, no unk", "gpt2 without the byte character of a space",
                     "gpt2, overlapping added tokens, one normalized", "o200k without contractions", "gpt2 as a Split",
                     "cl100k Split ending in \\s+", "llama3 with one newline",
                     "sp Metaspace first, a BOM replaced by nothing", "sp Metaspace first, Strip",
                     "sp Metaspace first, a Replace by a character", "sp under ByteLevel",
                     "added token with a leading space, rstrip",
                     "gpt2, rstrip beside a token that begins with a newline",
                     "gpt2, a newline token that strips both sides", "gpt2, lstrip beside a normalized newline token"}
TAKES = {"gigatoken": GIGATOKEN_TAKES, "fastokens": set(SHAPES) - FASTOKENS_REFUSES}
MISENCODES = {"gigatoken": GIGATOKEN_MISENCODES,
              "fastokens": ["no pre-tokenizer, byte-level", "Split alone", "an added token's id past a gap",
                            "cl100k-style Split", "(?m) Split", "gpt2, overlapping added tokens, one normalized",
                            "gpt2, a newline token that strips both sides",
                            "gpt2, lstrip beside a normalized newline token"]}


@pytest.mark.parametrize("backend", FAST_INSTALLED)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_backend_takes_a_tokenizer_only_in_a_shape_it_encodes_exactly(shape_files, shape, backend):
    """Taken: the reference's ids on every text. Refused: one line naming why (auto's INFO line)."""
    reference = load_tokenizer(str(shape_files[shape]))
    try:
        encoder = BACKENDS[backend].encoder(reference)
    except Unsupported as e:
        assert shape not in TAKES[backend], f"{shape} was refused: {e}"
        assert "\n" not in str(e) and str(e)
        return
    assert shape in TAKES[backend], f"{shape} was taken"
    got = BackedTokenizer(reference, backend, encoder).encode_flat(pa.array(SHAPE_TEXTS))  # as a job encodes
    assert_same_ids(got, _reference_ids(shape_files[shape]), SHAPE_TEXTS)
    assert got.offsets[-1] > (0 if shape == "Split Removed" else 10_000)  # not vacuous (Removed drops the text)


def _raw_ids(backend: str, path) -> list[list[int]]:
    """The library's own ids for SHAPE_TEXTS from the file, without the backend's refusals."""
    if backend == "gigatoken":
        from gigatoken.gigatoken_rs import load_hf_json

        return [list(ids) for ids in load_hf_json(path.read_bytes()).encode_batch(SHAPE_TEXTS).tolist()]
    import fastokens

    tok = fastokens.Tokenizer.from_file(str(path))
    tok.no_truncation()
    ids, offsets = tok.encode_batch_flat(SHAPE_TEXTS)
    ids, offsets = np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64)
    return [ids[offsets[k]:offsets[k + 1]].tolist() for k in range(len(SHAPE_TEXTS))]


@pytest.mark.parametrize("backend, shape", [pytest.param(b, shape, marks=p.marks) for p in FAST_INSTALLED
                                            for b in p.values for shape in MISENCODES[b]])
def test_a_backend_misencodes_the_shapes_it_is_refused(shape_files, backend, shape):
    """The library itself loads each of these and gives other ids: why the backend refuses them."""
    raw = _raw_ids(backend, shape_files[shape])
    want = _reference_ids(shape_files[shape])
    differ = [k for k, ids in enumerate(raw) if ids != want.values[want.offsets[k]:want.offsets[k + 1]].tolist()]
    assert differ, f"{backend} now encodes {shape} exactly: it may be taken"


@needs_gigatoken
@pytest.mark.parametrize("shape", GIGATOKEN_ROUTES)
def test_gigatoken_reads_some_marks_otherwise_under_nfc_and_those_documents_go_to_the_reference(shape_files, shape):
    """gigatoken's NFC orders marks that tokenizers' older tables do not know (U+1ABF, U+07FD, ...): its
    own ids differ on those texts, and only on texts holding a code point of NFC_MISREAD."""
    from raypack.tokenize.backends.gigatoken import NFC_MISREAD
    from raypack.tokenize.backends.new_characters import documents_with_new_characters

    raw = _raw_ids("gigatoken", shape_files[shape])
    want = _reference_ids(shape_files[shape])
    differ = [k for k, ids in enumerate(raw) if ids != want.values[want.offsets[k]:want.offsets[k + 1]].tolist()]
    assert differ, "gigatoken now normalizes NFC as tokenizers does: NFC_MISREAD may be dropped"
    routed = set(documents_with_new_characters(pa.array(SHAPE_TEXTS), NFC_MISREAD).tolist())
    assert set(differ) <= routed
    encoder = BACKENDS["gigatoken"].encoder(load_tokenizer(str(shape_files[shape])))
    assert encoder.misread == NFC_MISREAD
    backed = load_backed_tokenizer(str(shape_files[shape]), "gigatoken")
    assert_same_ids(backed.encode_flat(pa.array(SHAPE_TEXTS)), want, SHAPE_TEXTS)


class _Panic(BaseException):
    """What pyo3 raises for a Rust panic (pyo3_runtime.PanicException derives from BaseException)."""


class _FailsOn:
    """An encoder that fails the way a library does on any batch holding ``bad``."""

    def __init__(self, bad: str, error: BaseException) -> None:
        self.bad, self.error, self.calls = bad, error, 0

    def encode_flat(self, texts):
        self.calls += 1
        if any(self.bad in t for t in texts.to_pylist()):
            raise self.error
        return FlatIds(np.zeros(len(texts), np.uint32), np.arange(len(texts) + 1, dtype=np.int64))


@pytest.mark.parametrize("error", [ValueError("PCRE2: error matching: match limit exceeded\nmore"),
                                   _Panic("Onig: Regex search error: retry-limit-in-match over")])
def test_a_document_the_library_fails_on_is_one_line_naming_it(error):
    from raypack.tokenize.tokenizers import encode_naming

    texts = pa.array(["a", "bb", "BOOM" + "x" * 50, "ccc", "BOOM"])
    with pytest.raises(InputError) as raised:
        encode_naming(_FailsOn("BOOM", error), texts, lambda k: f"doc {k + 10}")
    line = str(raised.value)
    assert line.startswith("doc 12 (54 bytes of text) cannot be encoded by the tokenizer: ") and "\n" not in line
    assert str(error).split("\n")[0] in line and "the tokenizer itself fails" in line  # short: not its length
    assert "--max-document-bytes" not in line
    long = pa.array(["a", "BOOM" + "x" * (1 << 16)])
    with pytest.raises(InputError) as raised:
        encode_naming(_FailsOn("BOOM", error), long, lambda k: f"doc {k}")
    assert "(65,540 bytes of text)" in str(raised.value) and "--max-document-bytes" in str(raised.value)
    assert "itself" not in str(raised.value)
    one = _FailsOn("BOOM", error)  # a batch of one is not encoded again (a panic prints each time)
    with pytest.raises(InputError, match="^doc 0 "):
        encode_naming(one, pa.array(["BOOM"]), lambda k: f"doc {k}")
    assert one.calls == 1
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C is not a document's fault
        encode_naming(_FailsOn("BOOM", KeyboardInterrupt()), texts, str)
    with pytest.raises(BackendError, match="^the backend is wrong$"):  # nor a backend's bug (its own message)
        encode_naming(_FailsOn("BOOM", BackendError("the backend is wrong")), texts, str)
    fine = encode_naming(_FailsOn("BOOM", error), pa.array(["a", "b"]), str)
    assert fine.offsets.tolist() == [0, 1, 2]


@needs_fastokens
@pytest.mark.parametrize("command", ["tokenize", "pack"])
def test_a_document_past_fastokens_regex_limit_is_one_line_and_nothing_is_written(shape_files, tmp_path, capsys,
                                                                                   command):
    """12 MB of spaces exceed PCRE2's match limit in the Split of a Digits+Split+ByteLevel tokenizer."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["hello world", " " * (12 << 20), "bye"]}), tmp_path / "in" / "in.parquet")
    args = [command, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer",
            str(shape_files["Digits, Split, ByteLevel"]), "--tokenizer-backend", "fastokens", "--local"]
    code = main(args + (["--context-length", "64"] if command == "pack" else []))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (tmp_path / "out").exists()
    assert "in.parquet row 1 " in err[0] and "12,582,912 bytes" in err[0]
    assert "cannot be encoded by the tokenizer: " in err[0] and "match limit" in err[0]


def test_a_tokenizer_that_panics_on_any_text_is_one_line_that_blames_the_tokenizer(tmp_path, capsys):
    """tokenizers panics on a Replace normalizer whose regex matches the empty string (index out of
    bounds): the one line names the first document and says the tokenizer, not the text's length, fails."""
    config = json.loads(train_byte_level_bpe(CORPUS[10:200], 400).to_str())
    config["normalizer"] = {"type": "Replace", "pattern": {"Regex": "x*"}, "content": "y"}
    (tmp_path / "broken.json").write_text(json.dumps(config))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["hello world", "bye"]}), tmp_path / "in" / "in.parquet")
    code = main(["tokenize", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer",
                 str(tmp_path / "broken.json"), "--tokenizer-backend", "reference", "--local"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("raypack: error:")]
    assert code == 2 and len(err) == 1 and not (tmp_path / "out").exists(), err
    assert "in.parquet row " in err[0] and "cannot be encoded by the tokenizer: " in err[0]
    assert "the tokenizer itself fails on it" in err[0] and "--max-document-bytes" not in err[0]


_TINY_BPE = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None, "post_processor": None,
             "decoder": None, "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                                        "byte_fallback": True, "vocab": {"a": 0, "b": 1, "ab": 2},
                                        "merges": [["a", "b"]]}}


@pytest.mark.parametrize("backend", FAST_INSTALLED)
def test_a_vocabulary_missing_byte_tokens_is_refused_by_the_fast_backends(tmp_path, backend):
    """byte_fallback without the <0xXX> tokens: tokenizers drops a byte it cannot hold and merges across
    it ("a b" is "ab"), fastokens does not (a hostile trial: 440 of 2,050 texts of a Llama 2-style
    tokenizer without <0x80>-<0xFF>). A ByteLevel vocabulary without a byte's character: fastokens
    fails the whole batch, tokenizers drops the byte."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(_TINY_BPE))
    reference = load_tokenizer(str(path))
    assert reference.encode_flat(pa.array(["a b"])).values.tolist() == [2]
    if backend == "fastokens":
        import fastokens

        assert fastokens.Tokenizer.from_file(str(path)).encode("a b").ids == [0, 1]  # so this test can fail
    with pytest.raises(Unsupported, match="byte_fallback without the byte token <0x00>"):
        BACKENDS[backend].encoder(reference)
    byte_level = {**_TINY_BPE, "pre_tokenizer": _bl(), "model": {**_TINY_BPE["model"], "byte_fallback": False}}
    path.write_text(json.dumps(byte_level))
    with pytest.raises(Unsupported):
        BACKENDS[backend].encoder(load_tokenizer(str(path)))


def _tiny_sp(vocab: list[str], merges: list[list[str]], **model) -> dict:
    """A SentencePiece-style BPE (Llama 2's normalizer, byte fallback) over ``vocab`` after the specials and bytes."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *vocab]
    prepend_and_replace = [{"type": "Prepend", "prepend": "\u2581"},
                           {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
    return {"version": "1.0", "normalizer": {"type": "Sequence", "normalizers": prepend_and_replace},
        "pre_tokenizer": None, "post_processor": None, "decoder": None,
        "added_tokens": [{"id": k, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for k, t in enumerate(tokens[:3])],
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                  "vocab": {t: k for k, t in enumerate(tokens)}, "merges": merges, **model}}


@pytest.mark.parametrize("backend", FAST_INSTALLED)
def test_text_that_spells_a_byte_token_gets_the_references_ids(tmp_path, backend):
    """A hostile trial: a Llama 2-shaped file (its <0xNN> byte tokens in the vocabulary, not added tokens) and the
    text "a<0x41>b": tokenizers encodes the characters, fastokens took "<0x41>" for the byte token, and auto chose
    fastokens for that shape (1,060 of 20,000 such documents wrong, the guard's sample saw none). Every backend
    that takes the file gives the reference's ids; fastokens by sending the documents that hold "<0x" to the
    reference (it is twice gigatoken's speed on this shape: it keeps it)."""
    path = tmp_path / "llama2.json"
    path.write_text(json.dumps(_tiny_sp(["a", "b", "\u2581", "\u2581a"], [["\u2581", "a"]])))
    reference = load_tokenizer(str(path))
    texts = pa.array(["a<0x41>b", "ab a", "<0x41>", "x <0xFF> <0x4", "", "a <0X41> <0x41"])
    want = reference.encode_flat(texts)
    if backend == "fastokens":
        import fastokens

        assert fastokens.Tokenizer.from_file(str(path)).encode("a<0x41>b").ids != want.values[:9].tolist()  # can fail
    encoder = BACKENDS[backend].encoder(reference)
    got = BackedTokenizer(reference, backend, encoder).encode_flat(texts)
    assert_same_ids(got, want, texts.to_pylist())
    if backend == "fastokens":
        assert load_backed_tokenizer(str(path)).backend == "fastokens"  # auto's choice for this shape stays


@needs_fastokens
@pytest.mark.parametrize("case", ["a token over a character that is no token", "a normalized special token",
                                  "an unnormalized special token under Lowercase", "a single_word special token",
                                  "an unnormalized special token"])
def test_fastokens_is_refused_a_byte_fallback_token_whose_characters_are_not_tokens(tmp_path, case):
    """A third fuzz (real-world shapes): with byte_fallback, tokenizers encodes a character that is no token of its
    own as its byte tokens and never merges across it; fastokens took the whole vocabulary token holding it ("日本"
    without "日"; "<s>" without "<" where the text reached the model: a normalized or single_word special token,
    or Lowercase making "<s>" of "<S>"). Wrong ids in a real run, auto's choice. Refused now, unless the text is
    always taken as an added token first (an unnormalized one, which Llama 2's normalizer cannot make)."""
    import fastokens

    config = _tiny_sp(["\u2581", "a", "b", "x", "y", "s", "S"], [])
    if case == "a token over a character that is no token":
        config["model"]["vocab"]["\u65e5\u672c"] = len(config["model"]["vocab"])
    if case == "a normalized special token":
        config["added_tokens"][1]["normalized"] = True
    if case == "an unnormalized special token under Lowercase":
        config["normalizer"]["normalizers"].append({"type": "Lowercase"})
    if case == "a single_word special token":  # not taken inside a word: "x<s>y" reaches the model
        config["added_tokens"][1]["single_word"] = True
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(config))
    reference = load_tokenizer(str(path))
    texts = ["\u65e5\u672c", "x\u65e5\u672c b", "x<s>y", "<s><s>", "<S>", "a</s>", "x <S> y"]
    want = reference.encode_flat(pa.array(texts))
    if case == "an unnormalized special token":  # "<s>" is always taken as the added token: the model never sees it
        got = BackedTokenizer(reference, "fastokens", BACKENDS["fastokens"].encoder(reference))
        assert_same_ids(got.encode_flat(pa.array(texts)), want, texts)
        return
    raw = fastokens.Tokenizer.from_file(str(path))
    ids, offsets = raw.encode_batch_flat(texts)
    ids, offsets = np.frombuffer(ids, np.uint32), np.frombuffer(offsets, np.uint64)
    assert [t for k, t in enumerate(texts)  # the library's own misreading: why it is refused (can fail)
            if ids[offsets[k]:offsets[k + 1]].tolist() != want.values[want.offsets[k]:want.offsets[k + 1]].tolist()]
    with pytest.raises(Unsupported, match="which is no token of its own"):
        BACKENDS["fastokens"].encoder(reference)
    if GigatokenBackend().version() is None:
        return
    try:  # what auto takes then, where it takes the tokenizer (not Lowercase, nor single_word)
        got = BackedTokenizer(reference, "gigatoken", BACKENDS["gigatoken"].encoder(reference))
    except Unsupported:
        assert case in ("an unnormalized special token under Lowercase", "a single_word special token")
        return
    assert_same_ids(got.encode_flat(pa.array(texts)), want, texts)


@needs_gigatoken
@pytest.mark.parametrize("case, text", [
    ("ignore_merges", "ab"),  # tokenizers takes a word in the vocabulary whole ("\u2581ab"); gigatoken merges it
    ("merges listed twice", "abc"),  # tokenizers ranks a merge by its last place, gigatoken by its first
])
def test_gigatoken_refuses_a_sentencepiece_style_bpe_it_ranks_otherwise(tmp_path, case, text):
    """Found by a hostile trial of gigatoken; each case's own ids differ from the reference's."""
    from gigatoken.gigatoken_rs import load_hf_json

    if case == "ignore_merges":
        config = _tiny_sp(["\u2581", "a", "b", "c", "\u2581ab"], [], ignore_merges=True)
    else:
        config = _tiny_sp(["\u2581", "a", "b", "c", "ab", "bc"], [["a", "b"], ["b", "c"], ["a", "b"]])
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(config))
    reference = load_tokenizer(str(path))
    want = reference.encode_flat(pa.array([text])).values.tolist()
    assert list(load_hf_json(path.read_bytes()).encode_batch([text]).tolist()[0]) != want  # so this test can fail
    with pytest.raises(Unsupported, match="ignore_merges" if case == "ignore_merges" else "listed twice"):
        BACKENDS["gigatoken"].encoder(reference)


@pytest.mark.parametrize("backend", FAST_INSTALLED)
def test_a_normalized_added_token_the_normalizer_empties_is_refused(tmp_path, backend):
    """Replace(">", "") and the normalized added token ">": gigatoken asked for 8-15 GB and aborted the
    process (a hostile trial); tokenizers encodes the text. Not run through the library here."""
    config = _tiny_sp(["\u2581", "a", "b", "c", *"<>/unks"], [])  # every character of "<unk>" a token: this reason only
    config["normalizer"] = {"type": "Replace", "pattern": {"String": ">"}, "content": ""}
    config["added_tokens"].append({"id": len(config["model"]["vocab"]), "content": ">", "single_word": False,
                                   "lstrip": False, "rstrip": False, "normalized": True, "special": False})
    path = tmp_path / "tok.json"
    path.write_text(json.dumps(config))
    reference = load_tokenizer(str(path))
    assert reference.encode_flat(pa.array(["a"])).values.size > 0
    with pytest.raises(Unsupported, match="normalized to nothing"):
        BACKENDS[backend].encoder(reference)


def test_added_tokens_one_normalizer_makes_equal_are_refused_with_one_line(tmp_path, capsys):
    """Under Lowercase, normalized "<a>" and "<A>" both match "<A>" in the text, and tokenizers gives it one
    id or the other from one process to the next (found by a hostile trial): no run would be reproducible."""
    config = json.loads(train_byte_level_bpe(CORPUS[10:200], 400).to_str())
    config["normalizer"] = {"type": "Lowercase"}
    next_id = max(config["model"]["vocab"].values()) + 1
    config["added_tokens"] += [{"id": next_id + k, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                                "normalized": True, "special": False} for k, c in enumerate(["<a>", "<A>"])]
    (tmp_path / "tok.json").write_text(json.dumps(config))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["x <A> y"]}), tmp_path / "in" / "in.parquet")
    code = main(["tokenize", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer",
                 str(tmp_path / "tok.json"), "--local"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not (tmp_path / "out").exists(), err
    assert "added tokens '<a>' (id " in err[0] and "'<A>'" in err[0] and '"normalized": false' in err[0]
    config["added_tokens"][-1]["normalized"] = False  # matched in the text as written: one id, always
    (tmp_path / "tok.json").write_text(json.dumps(config))
    assert main(["tokenize", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer",
                 str(tmp_path / "tok.json"), "--local"]) == 0


def test_a_bpe_with_dropout_is_refused_with_one_line(tmp_path, capsys):
    """Dropout draws other merges at every call, so no run could be reproduced (any backend)."""
    tok = train_byte_level_bpe(CORPUS[10:200], 400)
    config = json.loads(tok.to_str())
    config["model"]["dropout"] = 0.25
    path = tmp_path / "dropout.json"
    path.write_text(json.dumps(config))
    again = tokenizers.Tokenizer.from_file(str(path))
    text = " ".join(CORPUS[10:60])
    assert len({tuple(again.encode(text).ids) for _ in range(4)}) > 1  # not vacuous: the ids are random
    with pytest.raises(InputError, match=r"BPE dropout 0\.25, so its ids would change from run to run; "
                                         r"give a tokenizer.json whose model has \"dropout\": null"):
        load_tokenizer(str(path))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["a b c", "d e"]}), tmp_path / "in" / "in.parquet")
    code = main(["tokenize", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                 "--tokenizer", str(path), "--local"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "dropout" in err and not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------- in a tokenize run


def _tokenize(tmp_path, name: str, spec: str, backend: str, docs: list[str]):
    source = tmp_path / "text"
    source.mkdir(exist_ok=True)
    if not (source / "in.parquet").exists():
        pq.write_table(pa.table({"text": docs}), source / "in.parquet", row_group_size=64)
    text = TextOptions(tokenizer=spec, eos="0", tokenizer_backend=backend, task_rows=128, batch_bytes=4096)
    return run_tokenize(TokenizeConfig(inputs=(str(source),), output=str(tmp_path / name), text=text), engine="local")


@needs_gigatoken
def test_the_ids_and_content_sha256_do_not_depend_on_the_backend(tmp_path, tokenizer_files):
    docs = [d for d in CORPUS if len(d) < 20000]
    backends = ["reference", *[b for b in FAST if BACKENDS[b].version() is not None]]
    runs = {b: _tokenize(tmp_path, b, tokenizer_files["byte_level"], b, docs) for b in backends}
    ref = runs["reference"].manifest
    assert ref["backend"]["name"] == "reference" and len(backends) > 1
    for backend in backends[1:]:
        fast = runs[backend].manifest
        assert fast["backend"]["name"] == backend
        assert fast["content_sha256"] == ref["content_sha256"] and len(fast["shards"]) > 1
        for a, b in zip(ref["shards"], fast["shards"]):
            assert (tmp_path / "reference" / a["path"]).read_bytes() == (tmp_path / backend / b["path"]).read_bytes()
        assert {k for k in ref if ref[k] != fast[k]} == {"backend"}


def _reverse_the_first_document_once(monkeypatch, first_text: str) -> None:
    """gigatoken's encoder, wrong once: the run's first document's ids in reverse order (ids of the
    vocabulary, so only the guard can tell). Found by its text (``first_text``), not as the first call:
    with two calls in flight (raypack.tokenize.pieces.encode_pieces) the second piece's call may start first."""
    real, calls = GigatokenEncoder.encode_flat, []

    def reversed_first(self, texts):
        flat = real(self, texts)
        if calls or not len(texts) or texts[0].as_py() != first_text:
            return flat
        calls.append(len(texts))
        values = flat.values.copy()
        first = slice(int(flat.offsets[0]), int(flat.offsets[1]))
        values[first] = values[first][::-1]
        assert not np.array_equal(values[first], flat.values[first])
        return FlatIds(values, flat.offsets)

    monkeypatch.setattr(GigatokenEncoder, "encode_flat", reversed_first)


GUARD_REFUSAL = (r"in\.parquet row 0 \(text .*\): the gigatoken "
                 r"tokenizer backend gives")


@needs_gigatoken
def test_the_guard_refuses_a_backend_that_differs_naming_the_document(tmp_path, tokenizer_files, monkeypatch):
    _reverse_the_first_document_once(monkeypatch, "first doc")
    with pytest.raises(InputError, match=GUARD_REFUSAL):
        _tokenize(tmp_path, "out", tokenizer_files["byte_level"], "gigatoken", ["first doc", *CORPUS[10:300]])
    assert not (tmp_path / "out").exists()


def _source_documents(size: int, count: int) -> list[str]:
    """``count`` documents of ~``size`` bytes of real Python source (indented lines), each starting anywhere
    in a line."""
    import inspect
    import json.decoder
    import logging.handlers

    text = "".join(inspect.getsource(m) for m in (json.decoder, logging.handlers, random))
    step = max(1, (len(text) - size) // count)
    return [text[k * step + k % 7: k * step + k % 7 + size] for k in range(count)]


@needs_gigatoken
@pytest.mark.parametrize("name", ["byte_level", "cl100k_base"])
def test_the_guard_checks_long_documents_on_a_prefix(tokenizer_files, name):
    """Documents all longer than the guard's budget (source files, books): each candidate is checked on its
    text up to its last indented line's cut within the budget, whose reference ids begin the backend's. A
    hostile trial: the guard checked nothing in a task of documents over 1 KiB, so a backend wrong on every
    one of them went unsaid. The right ids pass; ids wrong in a prefix are refused, naming the document."""
    tokenizer = load_backed_tokenizer(tokenizer_files[name], "gigatoken")
    assert tokenizer.cut_rule is not None
    docs = _source_documents(3000, 3000)
    texts = pa.array(docs)
    flat = tokenizer.encode_flat(texts)
    guard = ReferenceGuard(tokenizer, lambda k: f"in.parquet row {k}")
    for start in range(0, len(docs), 500):  # in batches, as a task's
        batch = texts.slice(start, 500)
        guard.check(batch, FlatIds(flat.values, flat.offsets[start:start + 501]))
    assert guard.num_checked_docs >= 2 and 0 < guard.num_checked_bytes <= FREE_BYTES + BYTES_SHARE * guard.num_bytes
    guard.finish()  # the backend's ids are right: no refusal
    wrong = flat.values.copy()
    for k in range(len(docs)):  # every document's first ids out of order
        first = slice(int(flat.offsets[k]), int(flat.offsets[k]) + 8)
        wrong[first] = wrong[first][::-1]
    guard = ReferenceGuard(tokenizer, lambda k: f"in.parquet row {k}")
    guard.check(texts, FlatIds(wrong, flat.offsets))
    with pytest.raises(InputError, match=r"^in\.parquet row 0 \(text .*\): the gigatoken tokenizer backend gives "
                                         r"\d+ ids for its first \d+ bytes, the reference"):
        guard.finish()


@needs_gigatoken
def test_the_guard_refuses_a_backend_wrong_on_long_documents_in_a_run(tmp_path, tokenizer_files, monkeypatch):
    """The same, end to end: every document over 1 KiB, the first one's ids wrong."""
    documents = _source_documents(1500, 40)
    _reverse_the_first_document_once(monkeypatch, documents[0])
    with pytest.raises(InputError, match=GUARD_REFUSAL + r" \d+ ids for its first \d+ bytes"):
        _tokenize(tmp_path, "out", tokenizer_files["byte_level"], "gigatoken", documents)
    assert not (tmp_path / "out").exists()


def test_a_reference_that_fails_on_the_guards_sample_is_one_line_naming_the_document():
    """The reference re-encodes the sample at the task's end; where it panics (a broken tokenizer.json the
    backend takes, e.g. a Replace of the empty string), the run ended in a traceback, exit 1 (a hostile trial)."""

    class Reference:
        library = "tokenizers"

        def encode_flat(self, texts):
            if any("BOOM" in t for t in texts.to_pylist()):
                raise _Panic("index out of bounds: the len is 7 but the index is 7")
            return FlatIds(np.zeros(len(texts), np.uint32), np.arange(len(texts) + 1, dtype=np.int64))

    class Backed:
        reference, backend, encoder = Reference(), "fastokens", object()

    guard = ReferenceGuard(Backed(), lambda k: f"in.parquet row {k}")
    texts = pa.array(["BOOM a", "b"])
    guard.check(texts, FlatIds(np.zeros(2, np.uint32), np.arange(3, dtype=np.int64)))
    with pytest.raises(InputError) as raised:
        guard.finish()
    assert str(raised.value).startswith("in.parquet row 0 (6 bytes of text) cannot be encoded by the tokenizer: index")
    assert "the tokenizer itself fails" in str(raised.value)


@needs_gigatoken
def test_the_guard_refuses_in_the_one_pass_before_anything_is_published(tmp_path, tokenizer_files, monkeypatch):
    """The sample is checked once, at the task's end: the refusal still comes before the task is
    packed, with the same line, and no output is left."""
    from raypack.pack.config import make_config
    from raypack.pack.job import run_pack

    source = tmp_path / "text"
    source.mkdir()
    pq.write_table(pa.table({"text": ["first doc", *CORPUS[10:300]]}), source / "in.parquet", row_group_size=64)
    _reverse_the_first_document_once(monkeypatch, "first doc")
    text = TextOptions(tokenizer=tokenizer_files["byte_level"], tokenizer_backend="gigatoken", task_rows=128,
                       batch_bytes=4096)
    config = make_config(dict(inputs=[str(source)], output=str(tmp_path / "packed"), context_length=64))
    with pytest.raises(InputError, match=GUARD_REFUSAL):
        run_pack(config, engine="local", text=text)
    assert not (tmp_path / "packed").exists()


class _Reference:
    library = "ref"

    def __init__(self):
        self.calls = []

    def encode_flat(self, texts):
        self.calls.append(texts.to_pylist())
        lens = np.array([len(t.encode()) for t in texts.to_pylist()], dtype=np.int64)
        return FlatIds(np.zeros(int(lens.sum()), np.uint32), np.concatenate([[0], np.cumsum(lens)]))


class _Backed:
    backend = "fake"

    def __init__(self):
        self.reference = _Reference()
        self.encoder = object()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=3000), st.lists(st.integers(1, 400), max_size=12))
def test_the_guard_sample_is_the_same_however_the_task_is_batched_and_stays_in_budget(lens, cuts):
    """The sample depends on the document sequence only; its bytes stay within FREE_BYTES + BYTES_SHARE of the text."""
    texts = ["x" * n for n in lens]
    whole = pa.array(texts)
    samples = []
    for batch_cuts in ([], cuts):
        tokenizer = _Backed()
        guard = ReferenceGuard(tokenizer, str)
        bounds = sorted({0, len(texts), *(c % len(texts) for c in batch_cuts)})
        for start, end in zip(bounds, bounds[1:]):
            batch = whole.slice(start, end - start)  # a slice: the byte count reads its offsets
            lengths = np.array(lens[start:end], dtype=np.int64)
            flat = FlatIds(np.zeros(int(lengths.sum()), np.uint32), np.concatenate([[0], np.cumsum(lengths)]))
            guard.check(batch, flat)
        assert tokenizer.reference.calls == []  # the batches only take their sample
        guard.finish()
        assert len(tokenizer.reference.calls) == (guard.num_checked_docs > 0)  # at most one call for the task
        samples.append(tokenizer.reference.calls[0] if tokenizer.reference.calls else [])
        assert guard.num_checked_bytes <= FREE_BYTES + BYTES_SHARE * sum(lens)
        assert guard.num_docs == len(texts) and guard.num_bytes == sum(lens)
    assert samples[0] == samples[1]
    if lens[0] <= FREE_BYTES:
        assert samples[0][0] == texts[0]  # document 0 is always checked when it is small


def test_the_guard_samples_about_one_document_in_2048():
    rate = candidates(np.arange(1 << 20, dtype=np.int64)).mean()
    assert 0.9 / 2048 < rate < 1.1 / 2048
    assert json.dumps(candidates(np.arange(5)).tolist()) == "[true, false, false, false, false]"


def test_the_reference_backend_is_not_checked(tokenizer_files):
    tokenizer = load_backed_tokenizer(tokenizer_files["cl100k_base"], "reference")
    assert ReferenceGuard(tokenizer, str).reference is None


def test_backends_module_registers_in_one_place():
    assert list(BACKENDS) == ["gigatoken", "fastokens", "reference"] and backends_module.backend_names()[0] == "auto"
    assert AUTO_ORDER == ("gigatoken", "fastokens")


def test_every_backend_pool_is_sized_before_its_first_encode(monkeypatch):
    for name in ("RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS"):
        monkeypatch.delenv(name, raising=False)
    backends_module.set_thread_env(0)
    assert "RAYON_NUM_THREADS" not in os.environ
    backends_module.set_thread_env(3)
    assert os.environ["RAYON_NUM_THREADS"] == "3" and os.environ["FASTOKENS_BPE_THREADS"] == "3"


@pytest.mark.parametrize("backend", ["gigatoken", "reference"])
def test_text_is_encoded_in_the_backends_pieces_unless_told(tokenizer_files, tmp_path, backend):
    """batch_bytes None takes the backend's (gigatoken's flat ids allow 16 MiB pieces; HF's per-token
    objects 1 MiB); an explicit value wins. Neither changes an id (tests/tokenize/test_tokenize_job.py)."""
    from raypack.tokenize.job import _text_settings

    tokenizer = load_backed_tokenizer(tokenizer_files["cl100k_base"], backend)
    assert tokenizer.batch_bytes == BACKENDS[backend].batch_bytes
    assert BACKENDS["gigatoken"].batch_bytes > BACKENDS["reference"].batch_bytes
    default, _ = _text_settings(str(tmp_path), TextOptions(tokenizer=tokenizer_files["cl100k_base"]), tokenizer, [])
    told, _ = _text_settings(str(tmp_path), TextOptions(tokenizer="x", batch_bytes=4096), tokenizer, [])
    assert (default.batch_bytes, told.batch_bytes) == (BACKENDS[backend].batch_bytes, 4096)
    with pytest.raises(InputError, match="batch_bytes=0 must be an integer >= 1"):
        TextOptions(tokenizer="x", batch_bytes=0)
