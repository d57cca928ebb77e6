"""Every manifest kind (a packed output's, a tokenized corpus's, a mix's) is read through one bounded
JSON reader (raypack.io.json_doc) and checked as strictly: hostile documents are one InputError line
(exit 2 through the CLI), refused before the parse builds them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tracemalloc
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raypack.io.json_doc as json_doc
from raypack.cli import main
from raypack.errors import InputError
from raypack.export.sources import open_source
from raypack.io.json_doc import MAX_DEPTH, build_caps, parse_json_document, scan_json
from raypack.mix.dataset import MixConfig, run_mix
from raypack.outputs import read_packed
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.tokenize.corpus import (
    build_tokenized_manifest,
    load_tokenized_manifest,
    part_file_name,
    save_tokenized_manifest,
    tokenized_inputs,
)

C = 8


# ----------------------------------------------------------------------------- the scan, against a naive one


def naive_scan(text: str) -> tuple[int, int, int]:
    """(separators, containers, depth) outside strings, one character at a time."""
    separators = containers = depth = max_depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            containers += 1
            depth += 1
            max_depth = max(max_depth, depth)
        elif ch in "]}":
            depth -= 1
        elif ch in ",:":
            separators += 1
    return separators, containers, max_depth


tricky_text = st.text(alphabet='ab[]{},:"\\\n\u00e9', max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(value=json_values, indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans(),
       piece=st.integers(1, 9))
def test_scan_equals_the_naive_scan_however_the_bytes_are_split(value, indent, ascii_only, piece):
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    raw = text.encode()
    whole = scan_json(raw)
    assert whole == naive_scan(text)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(json_doc, "_PIECE", piece)
        assert scan_json(raw) == whole


def test_scan_is_not_vacuous():
    """Brackets, commas and escaped quotes inside strings are not counted; the ones outside are."""
    assert scan_json(b'{"a": "[[{,:\\"]]", "b": [[1, 2], {"c": 3}]}') == (6, 4, 3)


def test_a_real_manifest_is_well_inside_the_caps(tmp_path):
    out = pack(tmp_path / "out", write_corpus(tmp_path / "in"))
    data = open(os.path.join(out, "manifest.json"), "rb").read()
    separators, containers, depth = scan_json(data)
    assert separators * 16 < len(data) and containers * 128 < len(data) and depth <= 4


# ----------------------------------------------------------------------------- factories


def write_corpus(root, num_shards: int = 3) -> str:
    rng = np.random.default_rng(0)
    os.makedirs(root, exist_ok=True)
    for k in range(num_shards):
        docs = [rng.integers(1, 1000, size=n).tolist() for n in rng.integers(1, 20, size=15)]
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}),
                       os.path.join(root, f"part-{k:03d}.parquet"))
    return str(root)


def pack(out, inputs) -> str:
    run_pack(make_config(dict(inputs=[str(inputs)], output=str(out), context_length=C, pad_token=0)), engine="local")
    return str(out)


def write_tokenized(root) -> str:
    """A two-part tokenized corpus (raypack tokenize's layout and manifest)."""
    out = os.path.join(root, "tokens")
    os.makedirs(out)
    shards = []
    for k, docs in enumerate([[[1, 2, 3], [4]], [[5, 6], [7, 8, 9, 10]]]):
        name = part_file_name(k)
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.uint16()))}), os.path.join(out, name))
        data = open(os.path.join(out, name), "rb").read()
        shards.append({"path": name, "num_docs": len(docs), "num_tokens": sum(map(len, docs)),
                       "num_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "source": {}})
    save_tokenized_manifest(out, build_tokenized_manifest(shards, "uint16", {"kind": "test"}, {}))
    return out


@pytest.fixture(scope="module")
def packed_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    corpus = write_corpus(root / "in")
    return pack(root / "a", corpus), pack(root / "b", corpus)


def make_mix(root, sources) -> str:
    out = str(root / "mix")
    run_mix(MixConfig(sources=tuple((s, 1) for s in sources), output=out, num_chunks=10))
    return out


def manifest_of(out: str) -> dict[str, Any]:
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def save(out: str, manifest: dict[str, Any] | str) -> None:
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write(manifest if isinstance(manifest, str) else json.dumps(manifest, indent=2))


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text and len(text) < 400, text
    return text


# ----------------------------------------------------------------------------- the tokenized corpus


def read_tokenized(out: str) -> None:
    """Everything that reads a tokenized corpus's manifest: pack's planning and export."""
    assert load_tokenized_manifest(out) is not None
    tokenized_inputs([out], "input_ids")
    open_source(out)


def test_a_good_tokenized_corpus_reads(tmp_path):
    out = write_tokenized(tmp_path)
    manifest = load_tokenized_manifest(out)
    assert manifest.counts == (4, 10, 2) and manifest.token_dtype == np.dtype("uint16")
    assert [s.num_docs for s in manifest.shards] == [2, 2] and [s.doc_offset for s in manifest.shards] == [0, 2]
    read_tokenized(out)


def set_path(manifest: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    target = manifest
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[int(keys[-1]) if isinstance(target, list) else keys[-1]] = value


TOKENIZED_MUTANTS = [
    ("counts.documents", -1, r"counts\.documents=-1, expected an integer in 0\.\."),
    ("counts.tokens", 10.0, r"counts\.tokens=10\.0, expected an integer"),
    ("counts.tokens", "10", r"counts\.tokens='10', expected an integer"),
    ("counts.shards", True, r"counts\.shards=True, expected an integer"),
    ("counts.documents", 5, r"counts\.documents=5 but its shards hold 4"),
    ("shards.0.num_docs", -2, r"shards\[0\]: num_docs=-2, expected an integer in 0\.\."),
    ("shards.1.num_tokens", 6.0, r"shards\[1\]: num_tokens=6\.0, expected an integer"),
    ("shards.0.num_bytes", False, r"shards\[0\]: num_bytes=False, expected an integer"),
    ("shards.1.doc_offset", 3, r"shards\[1\]: doc_offset=3, expected 2"),
    ("shards.0.sha256", "x" * 64, r"shards\[0\]: sha256='xxx.*expected 64 lowercase hex digits"),
    ("shards.1.path", "part-000000.parquet", r"part-000000\.parquet follows part-000000\.parquet"),
    ("shards.0.path", "../etc/passwd", r"lists '\.\./etc/passwd', which is not a part-NNNNNN\.parquet file"),
    ("shards.0.source", "text", r"shards\[0\]: source='text', expected an object"),
    ("token_dtype", "float64", r"token_dtype='float64' is not an integer dtype"),
    ("token_dtype", "object", r"token_dtype='object' is not an integer dtype"),
    ("token_dtype", "O", r"token_dtype='O' is not an integer dtype"),
    ("token_column", 5, r"token_column=5, expected a non-empty string"),
    ("tokenizer", [], r"tokenizer=\[\], expected an object"),
    ("counts", [1], r"counts=\[1\], expected an object"),
    ("shards", {}, r"shards=\{\}, expected a non-empty list of objects"),
    ("shards", [], r"shards=\[\], expected a non-empty list of objects"),
    ("shards", [7], r"shards\[0\]=7, expected an object with path"),
    ("content_sha256", "0" * 64, r"content_sha256=0000.* is not the digest of its parts' sha256"),
    ("format_version", 2, r"tokenized format_version 2 is not 1; re-run raypack tokenize"),
]


@pytest.mark.parametrize("path, value, message", TOKENIZED_MUTANTS)
def test_a_hostile_tokenized_manifest_is_one_line(tmp_path, path, value, message):
    out = write_tokenized(tmp_path)
    manifest = manifest_of(out)
    set_path(manifest, path, value)
    save(out, manifest)
    for read in (load_tokenized_manifest, lambda o: tokenized_inputs([o], "input_ids"), open_source):
        with pytest.raises(InputError, match=rf"tokens/manifest\.json.*{message}") as e:
            read(out)
        one_line(e)


def test_an_unknown_shard_key_is_refused(tmp_path):
    out = write_tokenized(tmp_path)
    manifest = manifest_of(out)
    manifest["shards"][1]["extra"] = 1
    save(out, manifest)
    with pytest.raises(InputError, match=r"shards\[1\]=.*expected an object with path, num_docs"):
        load_tokenized_manifest(out)


# ----------------------------------------------------------------------------- hostile documents, every kind


def padded(manifest: dict[str, Any], num_bytes: int) -> str:
    """``manifest`` with ``"x": [{}, {}, ...]`` added, about ``num_bytes`` long."""
    text = json.dumps(manifest)
    return text[:-1] + ', "x": [' + ", ".join(["{}"] * max(1, (num_bytes - len(text)) // 4)) + "]}"


def deep(manifest: dict[str, Any], depth: int = 100_000) -> str:
    text = json.dumps(manifest)
    return text[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"


@pytest.fixture
def kinds(tmp_path, packed_pair) -> dict[str, tuple[str, Callable[[str], Any]]]:
    """kind -> (its directory, a reader of it)."""
    a, b = packed_pair
    shutil.copytree(a, tmp_path / "packed")
    return {
        "packed": (str(tmp_path / "packed"), read_packed),
        "tokenized": (write_tokenized(tmp_path), read_tokenized),
        "mix": (make_mix(tmp_path, [a, b]), read_packed),
    }


KINDS = ("packed", "tokenized", "mix")


@pytest.mark.parametrize("kind", KINDS)
def test_deep_nesting_is_refused_unparsed(kinds, kind):
    out, read = kinds[kind]
    save(out, deep(manifest_of(out)))
    with pytest.raises(InputError, match=rf"manifest\.json: JSON nested 100001 levels deep, more than {MAX_DEPTH}"):
        read(out)


@pytest.mark.parametrize("kind", KINDS)
def test_a_padded_document_is_refused_without_building_it(kinds, kind):
    out, read = kinds[kind]
    text = padded(manifest_of(out), 4 << 20)
    save(out, text)
    tracemalloc.start()
    try:
        with pytest.raises(InputError, match=r"manifest\.json: \d+ JSON values and \d+ arrays or objects in \d+ "
                                             r"bytes, more than a raypack manifest of that size holds") as e:
            read(out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_line(e)
    assert peak < 3 * len(text), peak  # json.loads would build ~25x: 100 MB


def loads_peak(text: str) -> int:
    """What ``json.loads(text)`` allocates at its peak (tracemalloc)."""
    tracemalloc.start()
    try:
        json.loads(text)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_padded_document_would_cost_json_loads_far_more():
    """Guards the test above: the same document parsed unchecked builds > 10x its bytes."""
    text = padded({"a": 1}, 1 << 20)
    assert loads_peak(text) > 10 * len(text)
    with pytest.raises(InputError):
        parse_json_document(text.encode(), "m.json")


@pytest.mark.parametrize("kind", KINDS)
def test_an_oversize_manifest_is_refused_reading_at_most_the_cap(kinds, kind, monkeypatch):
    out, read = kinds[kind]
    cap = 4096
    monkeypatch.setattr("raypack.packed.locate.MAX_MANIFEST_BYTES", cap)
    monkeypatch.setattr("raypack.tokenize.corpus.MAX_MANIFEST_BYTES", cap)
    reads = []
    real = json_doc.read_json_document

    def counting(filesystem, path, max_bytes, *args):
        reads.append(max_bytes)
        return real(filesystem, path, max_bytes, *args)

    monkeypatch.setattr("raypack.packed.locate.read_json_document", counting)
    monkeypatch.setattr("raypack.tokenize.corpus.read_json_document", counting)
    save(out, json.dumps(manifest_of(out), indent=2) + " " * (cap + 1))
    with pytest.raises(InputError, match=rf"manifest\.json: larger than {cap} bytes"):
        read(out)
    assert reads and set(reads) == {cap}


@pytest.mark.parametrize("kind, key, value, message", [
    ("packed", "token_dtype", "float64", r"token_dtype='float64' is not an integer dtype"),
    ("packed", "token_dtype", "object", r"token_dtype='object' is not an integer dtype"),
    ("packed", "context_length", True, r"context_length=True, expected an integer"),
    ("packed", "pad_token", -1.5, r"pad_token=-1\.5, expected an integer"),
    ("packed", "counts.chunks", "3", r"counts\.chunks='3', expected an integer"),
    ("packed", "counts.documents", -1, r"counts\.documents=-1, expected an integer in 0\.\."),
    ("packed", "config.token_column", 3, r"config\.token_column=3, expected a column name"),
    ("mix", "token_dtype", "float64", r"token_dtype='float64' is not an integer dtype"),
    ("mix", "num_chunks", 10.0, r"num_chunks=10\.0, expected an integer"),
    ("mix", "seed", -1, r"seed=-1, expected an integer in 0\.\."),
    ("mix", "context_length", False, r"context_length=False, expected an integer"),
    ("mix", "sources", [], r"sources=\[\], expected a list of 1\.\.65536 sources"),
])
def test_bad_fields_of_the_other_kinds_are_one_line(kinds, kind, key, value, message):
    out, read = kinds[kind]
    manifest = manifest_of(out)
    set_path(manifest, key, value)
    save(out, manifest)
    with pytest.raises(InputError, match=rf"manifest\.json: {message}") as e:
        read(out)
    one_line(e)


# ----------------------------------------------------------------------------- through the CLI: exit 2


def cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("raypack: error: "), err
    return err


def test_cli_export_of_a_hostile_tokenized_corpus_exits_2(tmp_path, capsys):
    out = write_tokenized(tmp_path)
    for text, message in [(deep(manifest_of(out)), "levels deep"), (padded(manifest_of(out), 1 << 20), "JSON values"),
                          (json.dumps({**manifest_of(out), "shards": {}}), "shards={}, expected a non-empty list")]:
        save(out, text)
        assert message in cli_error(capsys, ["export", out, "--format", "megatron", "--output",
                                             str(tmp_path / "meg")])
    assert not os.path.exists(tmp_path / "meg.bin")


def pack_argv(inputs: str, output) -> list[str]:
    return ["pack", "--local", "--input", inputs, "--output", str(output), "--context-length", "8"]


def test_cli_pack_of_a_hostile_tokenized_corpus_exits_2(tmp_path, capsys):
    out = write_tokenized(tmp_path)
    manifest = manifest_of(out)
    manifest["counts"]["documents"] = -1
    save(out, manifest)
    err = cli_error(capsys, pack_argv(out, tmp_path / "o"))
    assert "counts.documents=-1, expected an integer in 0.." in err
    manifest["counts"]["documents"] = 4
    save(out, json.dumps({**manifest, "shards": []}))
    err = cli_error(capsys, pack_argv(out, tmp_path / "o"))
    assert "shards=[], expected a non-empty list" in err and not os.path.exists(tmp_path / "o")


def verify_failure(capsys, out: str) -> str:
    """``raypack verify OUT`` fails (exit 1: verify's code for a damaged output) with one line."""
    assert main(["verify", out]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("raypack: verify failed: "), err
    return err


def test_cli_stats_and_verify_of_a_hostile_mix_exit_2_and_1(tmp_path, capsys, packed_pair):
    out = make_mix(tmp_path, list(packed_pair))
    good = manifest_of(out)
    save(out, deep(good))
    assert "levels deep" in cli_error(capsys, ["stats", out]) and "levels deep" in verify_failure(capsys, out)
    save(out, {**good, "token_dtype": "float64"})
    for err in (cli_error(capsys, ["stats", out]), verify_failure(capsys, out)):
        assert "token_dtype='float64' is not an integer dtype" in err


def test_cli_stats_and_verify_of_a_padded_packed_output_exit_2_and_1(tmp_path, capsys, packed_pair):
    out = str(tmp_path / "packed")
    shutil.copytree(packed_pair[0], out)
    save(out, padded(manifest_of(out), 1 << 20))
    for err in (cli_error(capsys, ["stats", out]), verify_failure(capsys, out)):
        assert "more than a raypack manifest of that size holds" in err


def test_the_caps_grow_with_the_document():
    assert build_caps(0) < build_caps(1 << 20) < build_caps(256 << 20)


def densest(manifest: dict[str, Any], num_bytes: int) -> str:
    """``manifest`` with ``"x": [[8 strings of 14 characters], ...]`` added: as many values (one per
    17 bytes) and lists (one per 137) as the pre-scan's density caps let through."""
    text = json.dumps(manifest)
    row = "[" + ",".join(['"abcdefghijklmn"'] * 8) + "]"
    return text[:-1] + ', "x": [' + ",".join([row] * max(1, (num_bytes - len(text)) // (len(row) + 1))) + "]}"


def test_the_densest_document_the_caps_let_through_builds_at_most_5x_its_bytes(packed_pair):
    """The bound behind MAX_MANIFEST_BYTES: a reader at the 128 MiB cap stays under 1 GiB
    (bench/bench_manifest.py measures 841 MiB peak RSS there)."""
    text = densest(manifest_of(packed_pair[0]), 4 << 20)
    parse_json_document(text.encode(), "m.json")  # let through
    peak = loads_peak(text)
    assert 3 * len(text) < peak < 5 * len(text), peak / len(text)
    denser = text.replace('"abcdefghijklmn"', '"abcde"')
    with pytest.raises(InputError, match="more than a raypack manifest of that size holds"):
        parse_json_document(denser.encode(), "m.json")


def test_a_manifest_over_the_cap_is_never_written(tmp_path, monkeypatch):
    from raypack.packed.manifest import write_manifest

    monkeypatch.setattr("raypack.packed.manifest.MAX_MANIFEST_BYTES", 100)
    with pytest.raises(InputError, match="more than the 100 every reader accepts; use fewer, larger shards"):
        write_manifest(str(tmp_path), {"x": "y" * 200})
    assert os.listdir(tmp_path) == []
    write_manifest(str(tmp_path), {"x": "y"})


@pytest.mark.parametrize("command", ["stats", "verify"])
def test_stats_and_verify_parse_the_manifest_once(packed_pair, monkeypatch, capsys, command):
    """Not once to tell a mix from a packed output and again to check it: two parses held together
    doubled a reader's peak at the cap."""
    calls = []
    loads = json_doc._loads
    monkeypatch.setattr(json_doc, "_loads", lambda *a: calls.append(1) or loads(*a))
    assert main([command, packed_pair[0]]) == 0
    assert len(calls) == 1
