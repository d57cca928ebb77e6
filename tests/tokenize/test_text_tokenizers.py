"""raypack.tokenize.tokenizers: ids equal the tokenizer's own encode, token for token; errors."""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.errors import InputError, install_extra
from raypack.tokenize import tokenizers as text_tokenizers
from raypack.tokenize.tokenizers import (
    TIKTOKEN_ENCODINGS,
    ids_to_list_array,
    load_rank_file,
    load_tokenizer,
    tiktoken_rank_file,
    token_dtype_for,
)

tokenizers = pytest.importorskip("tokenizers")
tiktoken = pytest.importorskip("tiktoken")

from helpers import CORPUS, train_byte_level_bpe  # noqa: E402

TEXTS = [
    *CORPUS,
    "",
    " ",
    "\n\t  \r\n",
    "a",
    "mixed: abc 東京 😀 مرحبا שלום 123",
    "<eos> written in the text",
    "\u200f\u200e\u202e RTL marks \ufeff BOM \x00 NUL",
]


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """(reference Tokenizer, path of its tokenizer.json): a byte-level BPE of ~600 ids."""
    tok = train_byte_level_bpe(CORPUS * 20, 600)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return tok, path


@pytest.fixture(scope="module")
def cl100k():
    return load_tokenizer("tiktoken:cl100k_base")


def reference_ids(tok, texts):
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


# ---------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json


def test_a_relative_tokenizer_path_is_recorded_absolute(hf, monkeypatch):
    """Manifests name the file itself, not the path as typed in some working directory."""
    _, path = hf
    monkeypatch.chdir(path.parent.parent)
    identity = load_tokenizer(f"{path.parent.name}/{path.name}").identity()
    assert identity["file"] == str(path) and identity["file"].startswith("/")


def test_hf_vocab_is_bigger_than_a_byte(hf):
    tok, path = hf
    assert 300 < tok.get_vocab_size() <= 600  # merges happened, and ids need uint16


def test_hf_equals_encode_token_for_token(hf):
    tok, path = hf
    out = load_tokenizer(str(path)).encode_batch(pa.array(TEXTS))
    assert out.type == pa.list_(pa.uint16())
    assert out.to_pylist() == reference_ids(tok, TEXTS)
    assert out.to_pylist()[TEXTS.index("")] == []
    assert all(out.to_pylist()[TEXTS.index(t)] for t in (" ", "\n\t  \r\n"))  # whitespace is tokens


def test_hf_large_string_input(hf):
    tok, path = hf
    out = load_tokenizer(str(path)).encode_batch(pa.array(TEXTS, pa.large_string()))
    assert out.to_pylist() == reference_ids(tok, TEXTS)


def test_hf_very_long_text(hf):
    tok, path = hf
    long_text = ("".join(CORPUS) * 2000)[: 1 << 20]
    out = load_tokenizer(str(path)).encode_batch(pa.array(["x", long_text, ""]))
    assert out.to_pylist() == reference_ids(tok, ["x", long_text, ""])
    assert len(out[1]) > 100_000


def test_hf_directory_spec(hf):
    tok, path = hf
    loaded = load_tokenizer(str(path.parent))
    assert loaded.kind == "hf" and loaded.vocab_size == tok.get_vocab_size(with_added_tokens=True)


def test_hf_ignores_post_processor_padding_and_truncation(hf, tmp_path):
    tok, path = hf
    tok2 = tokenizers.Tokenizer.from_file(str(path))
    tok2.post_processor = tokenizers.processors.TemplateProcessing(
        single="<bos> $A <eos>", special_tokens=[("<bos>", 0), ("<eos>", 1)]
    )
    tok2.enable_padding(pad_id=1, pad_token="<eos>")
    tok2.enable_truncation(max_length=5)
    tok2.save(str(tmp_path / "tokenizer.json"))
    out = load_tokenizer(str(tmp_path)).encode_batch(pa.array(TEXTS)).to_pylist()
    assert out == reference_ids(tok, TEXTS)
    assert tok2.encode(TEXTS[0]).ids[0] == 0 and len(tok2.encode(TEXTS[0]).ids) == 5  # the file really does both


def test_hf_bos_eos_by_string_and_by_id(hf):
    tok, path = hf
    loaded = load_tokenizer(str(path))
    texts = pa.array(["hello 東京", "", "😀"])
    expected = [[0, *ids, 1] for ids in reference_ids(tok, texts.to_pylist())]
    bos_id, eos_id = loaded.token_id("<bos>"), loaded.token_id("<eos>")
    assert loaded.encode_batch(texts, bos_id=bos_id, eos_id=eos_id).to_pylist() == expected
    assert loaded.encode_batch(texts, bos_id=0, eos_id=1).to_pylist() == expected
    with_eos = [[*ids, 1] for ids in reference_ids(tok, texts.to_pylist())]
    assert loaded.encode_batch(texts, eos_id="<eos>").to_pylist() == with_eos
    assert loaded.encode_batch(texts, bos_id=1).to_pylist()[1] == [1]


def test_hf_token_id_errors(hf):
    _, path = hf
    loaded = load_tokenizer(str(path))
    with pytest.raises(InputError, match=r"token '<s>' is not in the vocabulary of .*tokenizer.json; give a token it "
                                         r"holds \(its special tokens: <bos>, <eos>\) or an integer id below"):
        loaded.token_id("<s>")  # a new user's trial: it said "e.g. one of its special tokens", and not which
    with pytest.raises(InputError, match=rf"token id {loaded.vocab_size} \(--bos/--eos, bos/eos in a config\) is "
                                         r"outside the vocabulary"):
        loaded.token_id(loaded.vocab_size)
    with pytest.raises(InputError, match=r"token id -1 \(--bos/--eos, bos/eos in a config\) is outside"):
        loaded.encode_batch(pa.array(["a"]), eos_id=-1)
    with pytest.raises(TypeError):
        loaded.token_id(True)


def test_null_text_is_an_input_error(hf):
    _, path = hf
    with pytest.raises(InputError, match=r"text row 1 is null"):
        load_tokenizer(str(path)).encode_batch(pa.array(["a", None]))


@pytest.mark.slow  # > 5 s
@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(), max_size=6))
def test_hf_random_unicode_equals_encode(hf, texts):
    tok, path = hf
    out = _hf_loaded(path).encode_batch(pa.array(texts, pa.string()))
    assert out.to_pylist() == reference_ids(tok, texts)


_LOADED = {}


def _hf_loaded(path):
    return _LOADED.setdefault(path, load_tokenizer(str(path)))


# ---------------------------------------------------------------------------------------------
# Spec errors


@pytest.mark.parametrize(("spec", "fix"), [
    ("cl100k_base", "for the tiktoken encoding, give tiktoken:cl100k_base"),
    ("gpt2", "never downloads a tokenizer: if gpt2 is a Hugging Face Hub model, download its tokenizer.json"),
    ("meta-llama/Meta-Llama-3-8B", "if meta-llama/Meta-Llama-3-8B is a Hugging Face Hub model, download"),
    ("tok.json", "give a tokenizer.json file, a directory holding one, or tiktoken:NAME"),
    ("here/tok", "give a tokenizer.json file, a directory holding one, or tiktoken:NAME"),  # here/ exists
    ("a/b/c", "give a tokenizer.json file, a directory holding one, or tiktoken:NAME"),
])
def test_a_missing_tokenizer_names_the_fix_for_what_it_looks_like(tmp_path, monkeypatch, spec, fix):
    """An encoding's name without tiktoken:, or a Hub name, said only "not found" (a new user's trial)."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as e:
        load_tokenizer(spec)
    assert str(e.value).startswith(f"tokenizer {spec} not found (looked for ") and fix in str(e.value), e.value
    assert "\n" not in str(e.value)


def test_missing_path(tmp_path):
    with pytest.raises(InputError, match=r"tokenizer .*nope\.json not found"):
        load_tokenizer(str(tmp_path / "nope.json"))
    with pytest.raises(InputError, match=r"looked for .*tokenizer\.json"):
        load_tokenizer(str(tmp_path))  # a directory without tokenizer.json
    os.mkfifo(tmp_path / "fifo.json")  # a hostile trial: a FIFO and /dev/null were "not found"
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    for spec in (str(tmp_path / "fifo.json"), "/dev/null", str(tmp_path / "loop.json")):
        with pytest.raises(InputError, match=r" is not a regular file \(a FIFO, a device, a broken link\?\)"):
            load_tokenizer(spec)


@pytest.mark.parametrize("content", ['{"vocab": {"a": 0}}', '{"hello": 1}', "[1, 2]", "not json at all", "",
                                     '{"model": {"type": "BPE"}'])
def test_file_that_is_not_a_tokenizer(tmp_path, content):
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(InputError, match=r"is not a Hugging Face tokenizer\.json \(.+\); give") as caught:
        load_tokenizer(str(path))
    # JSON that is no tokenizer is said so, not with the parser's position (as if the JSON were broken)
    assert ('it is JSON, but not an object with a "model"' in str(caught.value)) == content.startswith(("{\"v", "{\"h",
                                                                                                        "["))


def test_unknown_tiktoken_name_lists_known():
    with pytest.raises(InputError, match=r"unknown tokenizer tiktoken:gpt5; known: tiktoken:cl100k_base, "
                                         r"tiktoken:o200k_base"):
        load_tokenizer("tiktoken:gpt5")


@pytest.mark.parametrize("module, spec", [("tokenizers", "PATH"), ("tiktoken", "tiktoken:cl100k_base")])
def test_missing_library_names_the_extra(hf, monkeypatch, module, spec):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(InputError, match=rf"needs the '{module}' package.*" + re.escape(install_extra("text"))):
        load_tokenizer(str(hf[1]) if spec == "PATH" else spec)


def test_missing_rank_files_name_the_extra(monkeypatch):
    monkeypatch.setattr(text_tokenizers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(InputError, match=r"'bpe-openai' package, which is not installed; pip install"):
        load_tokenizer("tiktoken:o200k_base")


# ---------------------------------------------------------------------------------------------
# Token dtype and the Arrow result


@pytest.mark.parametrize(
    "vocab_size, dtype",
    [(1, "uint8"), (256, "uint8"), (257, "uint16"), (65536, "uint16"), (65537, "uint32"), (2**32, "uint32")]
)
def test_token_dtype_for(vocab_size, dtype):
    assert token_dtype_for(vocab_size) == np.dtype(dtype)
    assert token_dtype_for(vocab_size, dtype) == np.dtype(dtype)


def test_token_dtype_too_narrow_or_unknown():
    with pytest.raises(InputError, match=r"--token-dtype uint16 holds ids up to 65535, but .* 100277 ids; use "
                                         r"--token-dtype uint32"):
        token_dtype_for(100277, "uint16")
    with pytest.raises(InputError, match=r"--token-dtype 'int8' is not one of auto, uint8, uint16, uint32"):
        token_dtype_for(10, "int8")


def test_ids_to_list_array_literal():
    out = ids_to_list_array([[5, 6], [], [7]], np.dtype(np.uint8), bos_id=1, eos_id=2)
    assert out.type == pa.list_(pa.uint8())
    assert out.to_pylist() == [[1, 5, 6, 2], [1, 2], [1, 7, 2]]
    assert ids_to_list_array([[5, 6], [], [7]], np.dtype(np.uint32)).to_pylist() == [[5, 6], [], [7]]
    assert ids_to_list_array([], np.dtype(np.uint16), eos_id=2).to_pylist() == []
    assert ids_to_list_array([[], []], np.dtype(np.uint16), bos_id=3).to_pylist() == [[3], [3]]


@settings(max_examples=100, deadline=None)
@given(
    id_lists=st.lists(st.lists(st.integers(0, 65535), max_size=5), max_size=6),
    bos=st.none() | st.integers(0, 65535),
    eos=st.none() | st.integers(0, 65535),
)
def test_ids_to_list_array_matches_naive(id_lists, bos, eos):
    expected = [([bos] if bos is not None else []) + ids + ([eos] if eos is not None else []) for ids in id_lists]
    assert ids_to_list_array(id_lists, np.dtype(np.uint16), bos_id=bos, eos_id=eos).to_pylist() == expected


# ---------------------------------------------------------------------------------------------
# tiktoken, offline


def test_tiktoken_known_ids_and_round_trip(cl100k):
    assert cl100k.kind == "tiktoken" and cl100k.vocab_size == 100277
    out = cl100k.encode_batch(pa.array(["hello world", "", *TEXTS]))
    assert out.type == pa.list_(pa.uint32())
    assert out.to_pylist()[:2] == [[15339, 1917], []]  # the published cl100k ids of "hello world"
    decode = cl100k._encoding.decode
    assert [decode(ids) for ids in out.to_pylist()[2:]] == TEXTS
    assert 100257 not in out.to_pylist()[2 + TEXTS.index("<eos> written in the text")]


def test_tiktoken_special_text_is_ordinary_text(cl100k):
    ids = cl100k.encode_batch(pa.array(["a<|endoftext|>b"])).to_pylist()[0]
    assert 100257 not in ids and cl100k._encoding.decode(ids) == "a<|endoftext|>b"


def test_tiktoken_bos_eos(cl100k):
    assert cl100k.token_id("<|endoftext|>") == 100257
    assert cl100k.token_id("hello") == 15339
    out = cl100k.encode_batch(pa.array(["hello world", ""]), bos_id="<|endoftext|>", eos_id=100276)
    assert out.to_pylist() == [[100257, 15339, 1917, 100276], [100257, 100276]]
    with pytest.raises(InputError, match=r"token '<s>' is not one token of tiktoken:cl100k_base; give one of "
                                         r"<\|endoftext\|>"):
        cl100k.token_id("<s>")
    with pytest.raises(InputError, match=r"token id 100277 \(--bos/--eos, bos/eos in a config\) is outside the "
                                         r"vocabulary \[0, 100277\)"):
        cl100k.token_id(100277)


@pytest.mark.slow  # > 5 s
@pytest.mark.parametrize("name", sorted(TIKTOKEN_ENCODINGS))
def test_tiktoken_built_like_openai_public(name, monkeypatch):
    """Our Encoding == tiktoken's own constructor fed the same ranks instead of a download."""
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    params = TIKTOKEN_ENCODINGS[name]
    ranks = load_rank_file(tiktoken_rank_file(name), params["rank_sha256"])
    hashes = []
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe",
                        lambda url, expected_hash: hashes.append(expected_hash) or ranks)
    official = getattr(openai_public, name)()
    assert hashes == [params["rank_sha256"]]
    assert official["pat_str"] == params["pat_str"]
    assert official["special_tokens"] == params["special_tokens"]
    reference = tiktoken.Encoding(**official)
    ours = load_tokenizer(f"tiktoken:{name}")
    assert ours.vocab_size == reference.n_vocab
    assert ours.encode_batch(pa.array(TEXTS)).to_pylist() == [reference.encode_ordinary(t) for t in TEXTS]


def test_rank_file_parsed_like_load_tiktoken_bpe(tmp_path, monkeypatch):
    path = tiktoken_rank_file("cl100k_base")
    plain = tmp_path / "cl100k_base.tiktoken"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # no cache: read the local file as is
    tiktoken_load = pytest.importorskip("tiktoken.load")  # a submodule: imported here, not by an earlier test
    expected = tiktoken_load.load_tiktoken_bpe(str(plain), TIKTOKEN_ENCODINGS["cl100k_base"]["rank_sha256"])
    assert load_rank_file(path, TIKTOKEN_ENCODINGS["cl100k_base"]["rank_sha256"]) == expected
    assert load_rank_file(plain, TIKTOKEN_ENCODINGS["cl100k_base"]["rank_sha256"]) == expected


def test_rank_file_with_wrong_hash(tmp_path):
    path = tmp_path / "x.tiktoken.gz"
    path.write_bytes(gzip.compress(b"YQ== 0\n"))
    with pytest.raises(InputError, match=r"rank file .*x\.tiktoken\.gz has sha256 [0-9a-f]{64}, not tiktoken's"):
        load_rank_file(path, "0" * 64)


@pytest.mark.parametrize("damage", ["not gzip", "truncated"])
def test_a_damaged_rank_file_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys, damage):
    """A damaged install (bpe-openai's rank file not gzip, or cut short): a hostile trial got a traceback,
    exit 1, and a staging directory kept 'for --resume'."""
    import os

    from raypack.cli import main

    real = tiktoken_rank_file("cl100k_base").read_bytes()
    bad = tmp_path / "cl100k_base.tiktoken.gz"
    bad.write_bytes(b"notgzip" if damage == "not gzip" else real[: len(real) // 2])
    monkeypatch.setattr(text_tokenizers, "tiktoken_rank_file", lambda name: bad)
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["some text"]}), tmp_path / "in" / "a.parquet")
    code = main(["pack", "--local", "--tokenizer", "tiktoken:cl100k_base", "--context-length", "8", "--input",
                 str(tmp_path / "in"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"raypack: error: rank file {bad} cannot be read (") and "reinstall bpe-openai" in err[0]
    assert sorted(os.listdir(tmp_path)) == ["cl100k_base.tiktoken.gz", "in"]


@pytest.mark.slow  # > 5 s
def test_tiktoken_loads_with_no_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("tried to use the network")

    tiktoken_load = pytest.importorskip("tiktoken.load")  # a submodule: `tiktoken.load` exists only once imported
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(tiktoken_load, "read_file", no_network)
    monkeypatch.setattr(tiktoken_load, "read_file_cached", no_network)
    loaded = load_tokenizer("tiktoken:o200k_base")
    assert loaded.encode_batch(pa.array(["hello world"])).to_pylist()[0] == [24912, 2375]
    identity = loaded.identity()
    assert identity["name"] == "o200k_base" and identity["sha256"] == TIKTOKEN_ENCODINGS["o200k_base"]["rank_sha256"]


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(), max_size=6))
def test_tiktoken_random_unicode_round_trips(cl100k, texts):
    out = cl100k.encode_batch(pa.array(texts, pa.string())).to_pylist()
    assert out == [cl100k._encoding.encode_ordinary(t) for t in texts]
    assert [cl100k._encoding.decode(ids) for ids in out] == texts


def test_hf_identity(hf):
    _, path = hf
    identity = load_tokenizer(str(path)).identity()
    import hashlib

    assert identity == {
        "kind": "hf",
        "file": str(path),
        "vocab_size": hf[0].get_vocab_size(with_added_tokens=True),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    assert json.dumps(identity)  # JSON-ready for a manifest


def test_tokenizers_pickle_and_encode_alike(hf, cl100k):
    """Ray ships task arguments by pickle; a tiktoken one must not look its ranks up online."""
    import pickle

    texts = pa.array(TEXTS)
    for loaded in (load_tokenizer(str(hf[1])), cl100k):
        copy = pickle.loads(pickle.dumps(loaded))
        assert copy.encode_batch(texts, eos_id=1).to_pylist() == loaded.encode_batch(texts, eos_id=1).to_pylist()


def _long_fourth_document(tmp_path, fmt: str, long_text: str, newline: str = "\n") -> tuple[str, str]:
    """A text directory whose fourth document is ``long_text``: Parquet (row groups of 2 rows) or
    JSON Lines (a blank line before it); and the place an error must name ("p.jsonl line 5")."""
    import json

    (tmp_path / "text").mkdir()
    texts = ["short", "short", "short", long_text, "short"]
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), tmp_path / "text" / "p.parquet", row_group_size=2)
        return str(tmp_path / "text"), "p.parquet row 3"
    lines = [json.dumps({"text": t}) for t in texts]
    (tmp_path / "text" / "p.jsonl").write_text(newline.join([*lines[:3], "", *lines[3:]]) + newline)
    return str(tmp_path / "text"), "p.jsonl line 5"


@pytest.mark.parametrize("command", ["tokenize", "pack"])
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_text_over_max_document_bytes_is_one_line_naming_it(tmp_path, capsys, command, fmt):
    """Refused before it is encoded (a 100 MB document took the HF tokenizer to 12.6 GB, then an abort).
    Named by its place in the file: the row of a later row group, the line past a blank one (it said
    "document 1 of bytes [N, M) (tokenize task 2)")."""
    from raypack.cli import main

    text_dir, place = _long_fourth_document(tmp_path, fmt, "x" * 5000)
    base = ["pack", "--context-length", "8"] if command == "pack" else ["tokenize"]
    args = [*base, "--local", "--input", text_dir, "--tokenizer", "tiktoken:cl100k_base",
            "--task-rows", "2", "--task-bytes", "40"]
    assert main([*args, "--output", str(tmp_path / "o1"), "--max-document-bytes", "4096"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{place} holds 5,000 bytes" in err[0] and "--max-document-bytes" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text"]
    assert main([*args, "--output", str(tmp_path / "o2")]) == 0  # the default (16 MiB) takes it


@pytest.mark.parametrize("dictionary", [False, True])
@pytest.mark.parametrize("command", ["tokenize", "pack"])
def test_a_parquet_text_the_footer_shows_too_long_is_refused_before_its_page_is_read(tmp_path, capsys, monkeypatch,
                                                                                   command, dictionary):
    """A Parquet page is decoded whole: one 200 MB text (18 KB of zstd on disk) took 806 MB to refuse (a
    hostile trial). Where the footer gives a row group's text column more bytes than its rows can hold at
    max_document_bytes, it is refused at planning, one line naming the row group; no page is read. With a
    dictionary page (which may hold texts no row of the group uses), its page header says it instead."""
    from raypack.cli import main

    (tmp_path / "text").mkdir()
    path = tmp_path / "text" / "p.parquet"
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "text" / "a.parquet")
    pq.write_table(pa.table({"text": ["small", "word " * 600_000, "after", "x", "y"]}), path, row_group_size=3,
                   compression="zstd", use_dictionary=dictionary)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", lambda *a, **k: pytest.fail("a page was read"))
    base = ["pack", "--context-length", "8"] if command == "pack" else ["tokenize"]
    args = [*base, "--local", "--input", str(tmp_path / "text"), "--tokenizer", "tiktoken:cl100k_base"]
    assert main([*args, "--output", str(tmp_path / "o"), "--max-document-bytes", "100000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = "a page of its 'text' column holds 3,000,0" if dictionary else "its 'text' column holds 3,000,0"
    assert len(err) == 1 and err[0].startswith(f"raypack: error: text file {path} row group 0: {said}"), err
    assert ("for 3 values, more than 3 texts" if dictionary else "for 3 rows, more than 3 texts") in err[0], err
    assert "of max_document_bytes=100,000 take" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text"]


@pytest.mark.parametrize("command", ["tokenize", "pack"])
def test_a_categorical_text_column_within_the_limit_is_read(tmp_path, capsys, command):
    """A categorical column (pandas Categorical, polars Enum, an Arrow dictionary array) keeps every category
    in each row group's dictionary page: 150 categories of 10 KB with row groups of 10 rows were refused at
    max_document_bytes=10,000, the longest document, "so a document there is longer" (a trial with other
    writers). The footer cannot bound such a row group; its dictionary page's header can."""
    from raypack.cli import main

    categories = [f"{k:03d} " + "text of a category " * 525 for k in range(150)]  # 9,979 bytes each
    rows = [(k * 7) % 150 for k in range(20)]
    column = pa.DictionaryArray.from_arrays(pa.array(rows, pa.int32()), pa.array(categories))
    (tmp_path / "text").mkdir()
    pq.write_table(pa.table({"text": column}), tmp_path / "text" / "c.parquet", row_group_size=10,
                   compression="zstd")
    base = ["pack", "--context-length", "64"] if command == "pack" else ["tokenize"]
    args = [*base, "--local", "--input", str(tmp_path / "text"), "--tokenizer", "tiktoken:cl100k_base"]
    assert main([*args, "--output", str(tmp_path / "o"), "--max-document-bytes", "10000"]) == 0
    capsys.readouterr()
    assert main([*args, "--output", str(tmp_path / "o2"), "--max-document-bytes", "9000"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"raypack: error: text file {tmp_path / 'text' / 'c.parquet'} row 0 holds 9,979 bytes of text, more than "
        "max_document_bytes=9,000 (a tokenizer's memory grows with the document); raise --max-document-bytes if "
        "the workers have the memory (BENCHMARKS.md: bytes per byte), or split the document upstream"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_document_over_max_document_tokens_is_named_by_its_place_in_the_file(tmp_path, capsys, fmt):
    """``pack --tokenizer`` named it by its row in its task ("row 1451" for line 34716)."""
    from raypack.cli import main

    text_dir, place = _long_fourth_document(tmp_path, fmt, "word " * 200, newline="\r\n")
    args = ["pack", "--context-length", "8", "--local", "--input", text_dir, "--tokenizer",
            "tiktoken:cl100k_base", "--task-rows", "2", "--task-bytes", "40", "--max-document-tokens", "100"]
    assert main([*args, "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{place}: the document holds" in err[0] and "max_document_tokens=100" in err[0], err


@pytest.mark.parametrize("compressed", [False, True])
def test_a_json_line_too_long_for_max_document_bytes_is_refused_as_it_is_read(tmp_path, capsys, monkeypatch,
                                                                             compressed):
    """A JSON line was held whole and parsed before its text was measured: one 1 GiB line of a 1 MB
    .jsonl.gz took 4.3 GB. Now a line past 6 bytes a byte of max_document_bytes (+ 1 MiB) is refused
    while it is read, after one 16 MiB read block of it, never joined whole (40 MiB here). Named by
    its line in the file, blank lines counted (it said "document 1 of bytes [0, N)")."""
    from raypack.cli import main
    from raypack.inputs import jsonl

    (tmp_path / "text").mkdir()
    lines = b'{"text": "short"}\n\n{"text": "' + b"y" * (40 << 20) + b'"}\n{"text": "short"}\n'
    name = "t.jsonl.gz" if compressed else "t.jsonl"
    (tmp_path / "text" / name).write_bytes(gzip.compress(lines, 1) if compressed else lines)
    held = []
    real = jsonl._split_lines

    def watched(*args):
        for block in real(*args):
            held.append(len(block.data))
            yield block

    monkeypatch.setattr(jsonl, "_split_lines", watched)
    args = ["pack", "--context-length", "8", "--local", "--input", str(tmp_path / "text"), "--tokenizer",
            "tiktoken:cl100k_base", "--output", str(tmp_path / "o"), "--max-document-bytes", "1000"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{name}: line 3 is longer than 1,054,576 bytes, more than a text of " in err[0], err
    assert "max_document_bytes=1,000" in err[0], err
    assert max(held) < 1 << 20  # only the first line was ever handed on whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text"]


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(0, 5), st.integers(250, 700)), max_size=12),
       bos=st.sampled_from([None, 0, 65535]), eos=st.sampled_from([None, 1, 65534]),
       dtype=st.sampled_from(["uint16", "uint32", "int64"]), seed=st.integers(0, 2**16))
def test_flat_ids_with_bos_eos_equal_a_naive_spread(lengths, bos, eos, dtype, seed):
    """Both ways of spreading (a slice per document for long documents, one mask for short ones)
    give [bos] + ids + [eos] per document, cast to the dtype."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 65536, n).astype(np.uint32) for n in lengths]
    flat = text_tokenizers.FlatIds(np.concatenate([np.zeros(0, np.uint32), *docs]),
                                   np.cumsum([0, *lengths]).astype(np.int64))
    got = text_tokenizers.flat_to_list_array(flat, np.dtype(dtype), bos_id=bos, eos_id=eos)
    expected = [([bos] if bos is not None else []) + d.tolist() + ([eos] if eos is not None else []) for d in docs]
    assert got.to_pylist() == expected
    assert got.type.value_type == pa.from_numpy_dtype(np.dtype(dtype))


def test_a_tokenizer_not_found_says_where_it_looked_and_names_a_slow_tokenizer_s_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=f"looked for tok/tokenizer.json, from {re.escape(str(tmp_path))}"):
        load_tokenizer("tok/tokenizer.json")
    (tmp_path / "slow").mkdir()
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / "slow" / name).write_text("{}")
    with pytest.raises(InputError, match="slow holds vocab.json, merges.txt but no tokenizer.json"):
        load_tokenizer("slow")
