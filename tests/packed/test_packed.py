"""raypack.packed.reader: read_packed against output written by hand (docs/FORMAT.md) from pack_sequences, so the
reader is tested independently of the job: every chunk, every range, every batch size."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.errors import InputError
from raypack.outputs import read_packed
from raypack.packed.manifest import load_manifest
from raypack.packed.writer import CHUNK_FILE_VERSION, FORMAT_VERSION, chunk_file_name
from raypack.rules.content_digest import CONTENT_GROUP_CHUNKS
from raypack.rules.core import pack_sequences

from reference import naive_content_sha256

# ----------------------------------------------------------------------------- helpers


def segments(row: np.ndarray) -> tuple[list[int], list[int]]:
    """Maximal runs of one doc id in a chunk: (ids, lengths)."""
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    return row[starts].tolist(), np.diff(np.r_[starts, row.size]).tolist()


def write_packed(out, input_ids, doc_ids, *, file_sizes, batch_sizes=(2, 1, 3), pad_token=0,
                 empty_batch_in_file=None) -> str:
    """Write chunks as FORMAT.md output: files of ``file_sizes`` chunks, record batches cycling
    through ``batch_sizes`` rows (plus a zero-row batch in file ``empty_batch_in_file``)."""
    os.makedirs(out, exist_ok=True)
    n, c = input_ids.shape
    assert sum(file_sizes) == n
    token_type = pa.from_numpy_dtype(input_ids.dtype)
    schema = pa.schema(
        [("chunk_index", pa.int64()), ("input_ids", pa.list_(token_type, c)),
         ("segment_doc_ids", pa.list_(pa.int64())), ("segment_lengths", pa.list_(pa.int32()))],
        metadata={"raypack.format_version": str(CHUNK_FILE_VERSION), "raypack.context_length": str(c),
                  "raypack.pad_token": str(pad_token)},
    )
    files, first = [], 0
    for f, size in enumerate(file_sizes):
        stem = os.path.join(out, "unnamed.arrow")
        with pa.ipc.new_file(stem, schema) as writer:
            start, k = first, 0
            if f == empty_batch_in_file:
                writer.write_batch(record_batch(schema, input_ids, doc_ids, start, start))
            while start < first + size:
                stop = min(start + batch_sizes[k % len(batch_sizes)], first + size)
                writer.write_batch(record_batch(schema, input_ids, doc_ids, start, stop))
                start, k = stop, k + 1
        data = open(stem, "rb").read()
        sha256 = hashlib.sha256(data).hexdigest()
        name = chunk_file_name(first, sha256)
        os.replace(stem, os.path.join(out, name))
        files.append({"path": name, "first_chunk": first, "num_chunks": size, "num_bytes": len(data),
                      "sha256": sha256})
        first += size
    manifest = {"format_version": FORMAT_VERSION, "context_length": c, "pad_token": pad_token,
                "token_dtype": input_ids.dtype.name, "counts": count_stats(doc_ids), "files": files}
    write_vouched_manifest(out, manifest)
    return str(out)


def write_vouched_manifest(out, manifest: dict) -> None:
    """Write ``manifest`` with the content_sha256 of the chunk files it lists (docs/FORMAT.md)."""
    write_manifest(out, {**manifest, "content_sha256": "0" * 64, "content_group_chunks": CONTENT_GROUP_CHUNKS})
    write_manifest(out, {**manifest, "content_sha256": naive_content_sha256(str(out)),
                         "content_group_chunks": CONTENT_GROUP_CHUNKS})


def count_stats(doc_ids: np.ndarray) -> dict[str, int]:
    """The manifest's counts of (n, C) dense doc ids."""
    split = np.unique(doc_ids[1:, 0][(doc_ids[1:, 0] == doc_ids[:-1, -1]) & (doc_ids[1:, 0] >= 0)])
    return {"documents": int(doc_ids.max(initial=-1)) + 1, "tokens": int(np.count_nonzero(doc_ids >= 0)),
            "chunks": int(doc_ids.shape[0]), "padding_positions": int(np.count_nonzero(doc_ids < 0)),
            "split_documents": int(split.size)}


def record_batch(schema, input_ids, doc_ids, start, stop) -> pa.RecordBatch:
    segs = [segments(row) for row in doc_ids[start:stop]]
    c = input_ids.shape[1]
    return pa.record_batch([
        pa.array(np.arange(start, stop, dtype=np.int64)),
        pa.FixedSizeListArray.from_arrays(pa.array(input_ids[start:stop].reshape(-1)), c),
        pa.array([s[0] for s in segs], pa.list_(pa.int64())),
        pa.array([s[1] for s in segs], pa.list_(pa.int32())),
    ], schema=schema)


def write_manifest(out, manifest) -> None:
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def rename_files(out, manifest) -> None:
    """Rename the manifest's files after their (edited) first_chunk and write the manifest."""
    for entry in manifest["files"]:
        name = chunk_file_name(entry["first_chunk"], entry["sha256"])
        os.replace(os.path.join(out, entry["path"]), os.path.join(out, name))
        entry["path"] = name
    write_manifest(out, manifest)


def random_docs(seed: int, num_docs: int, max_len: int, dtype=np.int32) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, size=rng.integers(0, max_len + 1)).astype(dtype) for _ in range(num_docs)]


@pytest.fixture
def packed(tmp_path):
    """About 20 chunks of C=8 in 5 files, docs crossing chunk and file boundaries."""
    docs = random_docs(0, 40, 9) + [np.array([5, 6, 7], np.int32)]  # 179 tokens: the last chunk is padded
    input_ids, doc_ids = pack_sequences(docs, 8, 0)
    sizes = split_sizes(input_ids.shape[0], [3, 1, 6, 4])
    out = write_packed(tmp_path / "out", input_ids, doc_ids, file_sizes=sizes, empty_batch_in_file=1)
    return read_packed(out), input_ids, doc_ids, sizes


def split_sizes(n: int, pattern: list[int]) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(min(pattern[len(sizes) % len(pattern)], n - sum(sizes)))
    return sizes


# ----------------------------------------------------------------------------- lookups


def test_fixture_is_not_trivial(packed):
    ds, input_ids, doc_ids, sizes = packed
    assert len(sizes) >= 4 and input_ids.shape[0] >= 15
    assert (doc_ids == -1).any(), "the last chunk should hold padding"
    crossing = doc_ids[1:, 0] == doc_ids[:-1, -1]
    assert crossing.any(), "some document should cross a chunk boundary"
    boundaries = np.cumsum(sizes)[:-1]
    assert crossing[boundaries - 1].any(), "some document should cross a file boundary"


def test_len_and_every_chunk(packed):
    ds, input_ids, doc_ids, _ = packed
    n = input_ids.shape[0]
    assert len(ds) == n
    assert (ds.context_length, ds.pad_token) == (8, 0)
    assert ds.manifest["counts"]["chunks"] == n
    for i in range(-n, n):
        chunk = ds[i]
        assert chunk["input_ids"].dtype == np.int32 and chunk["doc_ids"].dtype == np.int64
        np.testing.assert_array_equal(chunk["input_ids"], input_ids[i])
        np.testing.assert_array_equal(chunk["doc_ids"], doc_ids[i])


def test_chunk_tokens_are_a_view_of_the_file(packed):
    ds = packed[0]
    tokens = ds[0]["input_ids"]
    assert not tokens.flags.owndata and not tokens.flags.writeable


@pytest.mark.parametrize("index", ["n", "n + 1000", "-n - 1", "-n - 1000"])
def test_index_out_of_range(packed, index):
    ds = packed[0]
    with pytest.raises(IndexError, match="out of range"):
        ds[eval(index, {"n": len(ds)})]


def test_get_batch_every_range(packed):
    ds, input_ids, doc_ids, sizes = packed
    n = len(ds)
    spans = 0
    for start in range(n + 1):
        for stop in range(start, n + 1):
            batch = ds.get_batch(start, stop)
            np.testing.assert_array_equal(batch["input_ids"], input_ids[start:stop])
            np.testing.assert_array_equal(batch["doc_ids"], doc_ids[start:stop])
            assert batch["input_ids"].shape == (stop - start, 8)
            spans += int(np.any((start < np.cumsum(sizes)) & (np.cumsum(sizes) < stop)))
    assert spans > 100, "ranges should span file boundaries"


@pytest.mark.parametrize("start, stop", [(-1, 2), (3, 2), (0, None)])
def test_get_batch_bad_range(packed, start, stop):
    ds = packed[0]
    with pytest.raises(IndexError, match="out of range"):
        ds.get_batch(start, len(ds) + 1 if stop is None else stop)


@pytest.mark.parametrize("batch_size", [1, 3, 7, 22, 23, 64])
def test_iter_batches_covers_everything_in_order(packed, batch_size):
    ds, input_ids, doc_ids, _ = packed
    batches = list(ds.iter_batches(batch_size))
    assert [b["input_ids"].shape[0] for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert len(batches) == -(-len(ds) // batch_size)
    np.testing.assert_array_equal(np.concatenate([b["input_ids"] for b in batches]), input_ids)
    np.testing.assert_array_equal(np.concatenate([b["doc_ids"] for b in batches]), doc_ids)
    assert all("attention_mask" not in b for b in batches)


def test_iter_batches_rejects_bad_batch_size(packed):
    with pytest.raises(ValueError, match="batch_size=0"):
        packed[0].iter_batches(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_masks_are_built_from_doc_ids(packed, dtype):
    masks = pytest.importorskip("raypack.rules.masks")
    ds, _, doc_ids, _ = packed
    batches = list(ds.iter_batches(6, with_mask=True, mask_dtype=dtype))
    mask = np.concatenate([b["attention_mask"] for b in batches])
    assert mask.shape == (len(ds), 8, 8) and mask.dtype == dtype
    np.testing.assert_array_equal(mask, masks.build_intra_document_mask(doc_ids, dtype=dtype))
    for i in (0, 7, -1):
        np.testing.assert_array_equal(ds.mask(i, dtype=dtype), masks.build_intra_document_mask(doc_ids[i], dtype=dtype))


def test_reopens_after_pickling(packed):
    ds, input_ids, _, _ = packed
    ds[5]
    clone = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(clone.get_batch(0, len(ds))["input_ids"], input_ids)


def test_keeps_the_token_dtype(tmp_path):
    input_ids, doc_ids = pack_sequences(random_docs(1, 10, 12, np.uint16), 5, 7)
    out = write_packed(tmp_path / "out", input_ids, doc_ids, file_sizes=split_sizes(len(input_ids), [4]), pad_token=7)
    ds = read_packed(out)
    assert ds.pad_token == 7 and ds.get_batch(0, len(ds))["input_ids"].dtype == np.uint16
    np.testing.assert_array_equal(ds.get_batch(0, len(ds))["input_ids"], input_ids)


@pytest.mark.slow  # > 5 s
@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 20), max_size=25),
    context_length=st.sampled_from([1, 2, 5, 8]),
    file_pattern=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    batch_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    read_batch=st.integers(1, 9),
)
def test_property_reads_back_pack_sequences(lengths, context_length, file_pattern, batch_sizes, read_batch):
    docs = [np.arange(1, n + 1, dtype=np.int64) * (k + 1) for k, n in enumerate(lengths)]
    input_ids, doc_ids = pack_sequences(docs, context_length, 0)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = split_sizes(len(input_ids), file_pattern)
        ds = read_packed(write_packed(tmp, input_ids, doc_ids, file_sizes=sizes, batch_sizes=batch_sizes))
        assert len(ds) == len(input_ids)
        got = list(ds.iter_batches(read_batch))
        if got:
            np.testing.assert_array_equal(np.concatenate([b["input_ids"] for b in got]), input_ids)
            np.testing.assert_array_equal(np.concatenate([b["doc_ids"] for b in got]), doc_ids)
        if len(ds):
            np.testing.assert_array_equal(ds[-1]["doc_ids"], doc_ids[-1])


# ----------------------------------------------------------------------------- empty and damaged output


def test_empty_output(tmp_path):
    out = tmp_path / "out"
    os.makedirs(out)
    write_vouched_manifest(out, {"format_version": FORMAT_VERSION, "context_length": 4, "pad_token": 0,
                                 "token_dtype": "int32", "counts": count_stats(np.zeros((0, 4), np.int64)),
                                 "files": []})
    ds = read_packed(str(out))
    assert len(ds) == 0
    assert list(ds.iter_batches(3)) == []
    batch = ds.get_batch(0, 0)
    assert batch["input_ids"].shape == (0, 4) and batch["input_ids"].dtype == np.int32
    assert batch["doc_ids"].shape == (0, 4) and batch["doc_ids"].dtype == np.int64
    with pytest.raises(IndexError):
        ds[0]


def test_missing_manifest(tmp_path):
    input_ids, doc_ids = pack_sequences(random_docs(2, 5, 6), 4, 0)
    out = write_packed(tmp_path / "out", input_ids, doc_ids, file_sizes=[len(input_ids)])
    os.remove(os.path.join(out, "manifest.json"))
    with pytest.raises(InputError, match="is incomplete: no manifest.json; the job did not finish"):
        read_packed(out)


def test_an_input_directory_given_as_an_output_is_named_for_what_it_is(tmp_path):
    """Not "the job did not finish": it holds input shards and no chunk file."""
    (tmp_path / "in").mkdir()
    for name in ("b.parquet", "a.parquet", "notes.txt"):
        (tmp_path / "in" / name).write_bytes(b"x")
    with pytest.raises(InputError, match=r"in holds no manifest.json and no chunk files, but 2 file\(s\) like "
                                         r"a\.parquet: an input, not a packed output; give the directory raypack "
                                         r"pack wrote \(its --output\)"):
        read_packed(str(tmp_path / "in"))


def test_a_corpus_in_subfolders_an_empty_or_an_unrelated_directory_is_not_an_output(tmp_path):
    """Not "incomplete ... the job did not finish; rerun it" (a new user's trial: a corpus in jsonl/ and pq/,
    an empty folder): only a directory holding a run's files without its manifest is an unfinished run."""
    from raypack.errors import NotAnOutput

    corpus = tmp_path / "corpus"
    for folder, name in (("jsonl", "a.jsonl"), ("pq", "b.parquet")):
        (corpus / folder).mkdir(parents=True)
        (corpus / folder / name).write_bytes(b"x")
    with pytest.raises(NotAnOutput, match=r"corpus holds no manifest.json and no chunk files, but 1 file\(s\) like "
                                          r"jsonl/a\.jsonl: an input, not a packed output"):
        read_packed(str(corpus))
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotAnOutput, match=r"empty is an empty directory, not a packed output; give the directory"):
        read_packed(str(tmp_path / "empty"))
    (tmp_path / "other" / "sub").mkdir(parents=True)
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(NotAnOutput, match=r"other holds no manifest.json and no chunk files \(it holds notes.txt, "
                                          r"\.\.\.\): not a packed output"):
        read_packed(str(tmp_path / "other"))
    (tmp_path / "unfinished" / "_results").mkdir(parents=True)
    (tmp_path / "unfinished" / "_results" / "task-000000.json").write_text("{}")
    (tmp_path / "unfinished" / "notes.parquet").write_text("x")
    with pytest.raises(InputError, match="unfinished is incomplete: no manifest.json; the job did not finish"):
        read_packed(str(tmp_path / "unfinished"))


def test_missing_directory(tmp_path):
    with pytest.raises(InputError, match="no such output directory"):
        read_packed(str(tmp_path / "nowhere"))


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 1, str(FORMAT_VERSION), None])
def test_unknown_format_version(packed, version):
    out = packed[0].path
    manifest = load_manifest(out).to_dict()
    manifest["format_version"] = version
    write_manifest(out, manifest)
    with pytest.raises(InputError, match=f"format_version={version!r} is not supported"):
        read_packed(out)


def test_manifest_missing_key(packed):
    out = packed[0].path
    manifest = load_manifest(out).to_dict()
    del manifest["token_dtype"]
    write_manifest(out, manifest)
    with pytest.raises(InputError, match="token_dtype=None is not an integer dtype"):
        read_packed(out)


def test_manifest_bad_token_dtype(packed):
    out = packed[0].path
    manifest = load_manifest(out).to_dict()
    manifest["token_dtype"] = "float32"
    write_manifest(out, manifest)
    with pytest.raises(InputError, match="token_dtype='float32' is not an integer dtype"):
        read_packed(out)


def test_files_not_contiguous(packed):
    out = packed[0].path
    manifest = load_manifest(out).to_dict()
    manifest["files"][2]["first_chunk"] += 1
    rename_files(out, manifest)
    with pytest.raises(InputError, match=r"files\[2\].*: first_chunk=\d+, expected \d+; the files must cover"):
        read_packed(out)


def test_row_count_mismatch_names_the_file(packed):
    out, sizes = packed[0].path, packed[3]
    manifest = load_manifest(out).to_dict()
    manifest["files"][1]["num_chunks"] += 1
    for entry in manifest["files"][2:]:
        entry["first_chunk"] += 1
    manifest["counts"]["chunks"] += 1
    rename_files(out, manifest)
    ds = read_packed(out)
    ds[0]  # file 0 is fine; files open lazily
    name = manifest["files"][1]["path"]
    expected = f"{name}: holds {sizes[1]} chunks but the manifest says num_chunks={sizes[1] + 1}"
    with pytest.raises(InputError, match=expected):
        ds[sizes[0]]


def test_missing_chunk_file(packed):
    ds = packed[0]
    name = ds.manifest["files"][-1]["path"]
    os.remove(os.path.join(ds.path, name))
    with pytest.raises(InputError, match=f"{name}: listed in the manifest but missing"):
        ds[-1]


def test_wrong_context_length_in_file(packed):
    out = packed[0].path
    manifest = load_manifest(out).to_dict()
    manifest["context_length"] = 16
    write_manifest(out, manifest)
    with pytest.raises(InputError, match="input_ids has type"):
        read_packed(out)[0]


def test_bounded_open_files_and_close(packed, monkeypatch):
    monkeypatch.setattr("raypack.packed.reader.MAX_OPEN_FILES", 2)
    ds, input_ids, doc_ids, sizes = packed
    first = ds[0]["input_ids"]
    open_counts = []
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i]["doc_ids"], doc_ids[i])
        open_counts.append(sum(f.is_open for f in ds._files))
    assert max(open_counts) == 2 and len(sizes) > 2
    ds.close()
    assert not any(f.is_open for f in ds._files)
    np.testing.assert_array_equal(first, input_ids[0])  # views outlive the file handle
    with ds:
        np.testing.assert_array_equal(ds.get_batch(0, len(ds))["input_ids"], input_ids)
    assert not any(f.is_open for f in ds._files)


# ----------------------------------------------------------------------------- Ray


def test_to_ray_dataset_equals_reader(packed, ray_session):
    ds, input_ids, doc_ids, _ = packed
    rds = ds.to_ray_dataset(batch_rows=2)
    schema = rds.schema().base_schema
    assert schema.field("input_ids").type == pa.list_(pa.int32(), 8)
    assert schema.field("doc_ids").type == pa.list_(pa.int64(), 8)
    table = pa.concat_tables(rds.iter_batches(batch_size=None, batch_format="pyarrow"))
    got_ids = table.column("input_ids").combine_chunks().flatten().to_numpy().reshape(-1, 8)
    got_docs = table.column("doc_ids").combine_chunks().flatten().to_numpy().reshape(-1, 8)
    np.testing.assert_array_equal(got_ids, input_ids)
    np.testing.assert_array_equal(got_docs, doc_ids)
    # the docstring's recipe for masks: Ray's numpy format gives fixed_size_list rows as objects
    batch = next(iter(rds.iter_batches(batch_size=5, batch_format="numpy")))
    np.testing.assert_array_equal(np.stack(batch["doc_ids"]), doc_ids[:5])

