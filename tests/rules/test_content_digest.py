"""content_sha256 (format version 3) is a function of the chunks alone: equal whatever shards,
files, workers or batch sizes produced them, equal to a naive reading of docs/FORMAT.md, and a
version 2 output (content_sha256 over the files' digests) is still read and verified."""

from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.errors import InputError
from raypack.outputs import read_packed
from raypack.packed.manifest import load_manifest
from raypack.packed.writer import FORMAT_VERSION, files_sha256
from raypack.rules.content_digest import (
    CONTENT_GROUP_CHUNKS,
    ContentHasher,
    RangeDigester,
    RangeLayout,
    chunk_digests,
    content_header,
    range_layout,
)
from raypack.verify import VerifyError, verify_output

from helpers import file_digests, pack, random_corpus, read_output, sharded_corpora, write_shards
from reference import naive_content_sha256

G = CONTENT_GROUP_CHUNKS

# ----------------------------------------------------------------------------- the pure digest


def test_range_layout_literal():
    assert range_layout(0, 0, 4) == RangeLayout(0, 0, 0)
    assert range_layout(0, 3, 4) == RangeLayout(0, 0, 3)  # the output's last, short group: chunk digests
    assert range_layout(0, 4, 4) == RangeLayout(0, 1, 0)
    assert range_layout(1, 3, 4) == RangeLayout(2, 0, 0)  # inside one group
    assert range_layout(3, 13, 4) == RangeLayout(1, 2, 1)  # chunk 3 | groups 4..7, 8..11 | chunk 12
    assert range_layout(4, 12, 4) == RangeLayout(0, 2, 0)
    assert range_layout(2, 6, 4) == RangeLayout(2, 0, 2)


def random_chunks(rng: np.random.Generator, n: int, c: int, dtype=np.int32):
    """``n`` chunks of ``c`` tokens with 1..3 segments each (input_ids, offsets, doc_ids, lengths)."""
    input_ids = rng.integers(0, 1000, size=(n, c)).astype(dtype)
    counts = rng.integers(1, 4, size=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    cuts = [np.sort(np.concatenate([[0, c], rng.choice(np.arange(1, c), k - 1, replace=False)])) for k in counts]
    lengths = np.concatenate([np.diff(row) for row in cuts] or [[]]).astype(np.int32)
    return input_ids, offsets, rng.integers(-1, 100, size=offsets[-1]).astype(np.int64), lengths


def naive_digest(input_ids, offsets, doc_ids, lengths, group: int) -> str:
    """The definition, chunk by chunk, with the whole run in memory."""
    n, c = input_ids.shape
    digests = [hashlib.sha256(input_ids[i].astype(input_ids.dtype.newbyteorder("<")).tobytes()
                              + doc_ids[offsets[i]:offsets[i + 1]].astype("<i8").tobytes()
                              + lengths[offsets[i]:offsets[i + 1]].astype("<i4").tobytes()).digest() for i in range(n)]
    groups = b"".join(hashlib.sha256(b"".join(digests[k:k + group])).digest() for k in range(0, n, group))
    header = (f"raypack-content-v3\ntoken_dtype={input_ids.dtype.name}\ncontext_length={c}\nchunks={n}\n"
              f"group_chunks={group}\n")
    return hashlib.sha256(header.encode() + groups).hexdigest()


def take(chunks, start: int, end: int):
    input_ids, offsets, doc_ids, lengths = chunks
    return input_ids[start:end], offsets[start:end + 1], doc_ids, lengths  # absolute segment offsets


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_chunks=st.integers(0, 40), group=st.integers(1, 9),
       cuts=st.lists(st.integers(0, 40), max_size=6), batches=st.integers(1, 5),
       dtype=st.sampled_from([np.int32, np.uint16, np.int64, np.dtype(">i4")]))
def test_any_split_gives_the_naive_digest(seed, num_chunks, group, cuts, batches, dtype):
    """Files cut anywhere, each written in batches of any size: the joined range digests give
    the digest of the definition, as does feeding the chunks straight in (verify's way)."""
    chunks = random_chunks(np.random.default_rng(seed), num_chunks, 5, dtype)
    expected = naive_digest(*chunks, group)
    bounds = [0, *sorted(min(c, num_chunks) for c in cuts), num_chunks]
    joined = ContentHasher(np.dtype(dtype).name, 5, num_chunks, group)
    for start, end in zip(bounds[:-1], bounds[1:]):
        digester = RangeDigester(start, group)
        for batch_start in range(start, end, batches):
            digester.add(*take(chunks, batch_start, min(end, batch_start + batches)))
        assert len(digester.hex()) == 64 * range_layout(start, end, group).num_digests
        joined.add_range(start, end - start, digester.hex())
    direct = ContentHasher(np.dtype(dtype).name, 5, num_chunks, group)
    direct.add_chunks(*chunks)
    assert joined.hexdigest() == direct.hexdigest() == expected


def test_digest_depends_on_every_part_of_a_chunk():
    rng = np.random.default_rng(0)
    input_ids, offsets, doc_ids, lengths = random_chunks(rng, 3, 6)
    base = chunk_digests(input_ids, offsets, doc_ids, lengths)
    edits = [(input_ids + (np.arange(input_ids.size).reshape(input_ids.shape) == 7), offsets, doc_ids, lengths),
             (input_ids, offsets, doc_ids + (np.arange(doc_ids.size) == 2), lengths)]
    for edited in edits:
        assert chunk_digests(*edited) != base
    assert len(set(base)) == 3
    assert content_header("int32", 6, 3, 4) != content_header("uint32", 6, 3, 4)


def test_hasher_refuses_ranges_that_do_not_fit():
    hasher = ContentHasher("int32", 4, 10, 4)
    with pytest.raises(ValueError, match="do not follow"):
        hasher.add_range(1, 3, "00" * 32 * 3)
    with pytest.raises(ValueError, match="hex digits of range digests, expected 128"):
        hasher.add_range(0, 2, "00" * 32)
    with pytest.raises(ValueError, match="fed 0 chunks, expected 10"):
        hasher.hexdigest()


# ----------------------------------------------------------------------------- the job: equal across layouts


@pytest.fixture(scope="module")
def docs():
    """Enough chunks of C=4 to cross group boundaries twice; empty and long documents included."""
    corpus = random_corpus(7, 900, 25)
    corpus[10] = list(range(1, 3 * 4 + 2))
    return corpus


def cuts_for(num_docs: int, num_shards: int) -> list[int]:
    return [num_docs * k // num_shards for k in range(1, num_shards)]


def test_same_documents_in_1_3_8_shards_give_one_content_sha256(tmp_path, docs):
    runs = {}
    for num_shards, batch in ((1, 50), (3, 7), (8, 1000)):
        root = tmp_path / f"s{num_shards}"
        shard_dir = write_shards(root, docs, cuts_for(len(docs), num_shards))
        out = str(root / "out")
        pack(root, shard_dir, context_length=4, read_batch_size=batch, chunks_per_record_batch=3)
        runs[num_shards] = (out, *read_output(out))
    (_, ids_1, doc_ids_1, manifest_1) = runs[1]
    assert manifest_1["counts"]["chunks"] > 2 * G  # not vacuous: the chunks span three groups
    assert manifest_1["format_version"] == FORMAT_VERSION == 3 and manifest_1["content_group_chunks"] == G
    for num_shards, (out, ids, doc_ids, manifest) in runs.items():
        np.testing.assert_array_equal(ids, ids_1)
        np.testing.assert_array_equal(doc_ids, doc_ids_1)
        assert manifest["content_sha256"] == manifest_1["content_sha256"] == naive_content_sha256(out)
        assert all("digests" not in f for f in manifest["files"])
    file_lists = [tuple(f["path"] for f in m["files"]) for _, _, _, m in runs.values()]
    assert len(set(file_lists)) == 3  # the files differ, the digest does not
    verify_output(runs[8][0], [])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=sharded_corpora(), context_length=st.sampled_from([1, 3, 8]), batch=st.integers(1, 7))
def test_any_shard_split_gives_the_one_shard_digest(tmp_path_factory, corpus, context_length, batch):
    docs, cuts = corpus
    digests = set()
    for name, shard_cuts in (("one", []), ("cut", cuts)):
        root = tmp_path_factory.mktemp(name)
        summary = pack(root, write_shards(root, docs, shard_cuts), context_length=context_length, read_batch_size=batch)
        assert summary.manifest["content_sha256"] == naive_content_sha256(summary.output)
        digests.add(summary.manifest["content_sha256"])
    assert len(digests) == 1


def test_best_fit_content_sha256_is_the_definition(tmp_path, docs):
    """best_fit's chunks depend on the shards; whatever they are, the digest is of them alone."""
    shard_dir = write_shards(tmp_path, docs, cuts_for(len(docs), 3))
    digests = set()
    for name, batch in (("a", 5), ("b", 400)):
        out = str(tmp_path / name)
        pack(tmp_path, shard_dir, name, context_length=4, read_batch_size=batch, strategy="best_fit",
             best_fit_window=50)
        manifest = json.load(open(os.path.join(out, "manifest.json")))
        assert manifest["content_sha256"] == naive_content_sha256(out)
        digests.add(manifest["content_sha256"])
    assert len(digests) == 1 and manifest["counts"]["chunks"] > G
    verify_output(out, [])


# ----------------------------------------------------------------------------- version 2 outputs


def as_version_2(out: str) -> None:
    """Rewrite ``out``'s manifest as raypack wrote it in format version 2 (chunk files unchanged)."""
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    manifest["format_version"] = 2
    del manifest["content_group_chunks"]
    manifest["content_sha256"] = files_sha256(manifest["files"])
    json.dump(manifest, open(path, "w"))


def test_version_2_output_is_still_read_and_verified(tmp_path, docs):
    shard_dir = write_shards(tmp_path, docs[:100], [40])
    out = str(pack(tmp_path, shard_dir).output)
    before = file_digests(out)
    as_version_2(out)
    assert load_manifest(out).format_version == 2
    assert len(read_packed(out)) == load_manifest(out).num_chunks
    verify_output(out)
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    manifest["content_sha256"] = "0" * 64
    json.dump(manifest, open(path, "w"))
    with pytest.raises(VerifyError, match="content_sha256=0{64}, expected [0-9a-f]{64} .format version 2"):
        verify_output(out)
    assert file_digests(out) == before


@pytest.mark.parametrize("edit", [lambda m: m.pop("content_group_chunks"),
                                  lambda m: m.update(content_group_chunks=0),
                                  lambda m: m.update(content_group_chunks=True)])
def test_version_3_needs_its_group_size(tmp_path, docs, edit):
    shard_dir = write_shards(tmp_path, docs[:50], [])
    out = str(pack(tmp_path, shard_dir).output)
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    edit(manifest)
    json.dump(manifest, open(path, "w"))
    with pytest.raises(InputError, match="content_group_chunks=.*expected an integer"):
        read_packed(out)


def test_format_md_recipe_recomputes_the_manifest(tmp_path, docs, monkeypatch):
    """The snippet in docs/FORMAT.md, run as printed, agrees with the manifest (it asserts so)."""
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "FORMAT.md")).read()
    code = re.search(r"## `content_sha256`.*?```python\n(.*?)```", text, re.S).group(1)
    shard_dir = write_shards(tmp_path, docs[:200], [60])
    pack(tmp_path, shard_dir)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - our own documentation
    assert len(scope["d"]) == json.load(open(tmp_path / "out" / "manifest.json"))["counts"]["chunks"] > 0
