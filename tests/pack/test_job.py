"""The job end to end: output equals pack_sequences over the concatenated shards, bit for bit,
whatever the sharding, workers, batch sizes or engine. Output is read back with plain pyarrow,
following docs/FORMAT.md, independently of raypack's reader."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.rules.core import pack_sequences

from helpers import file_digests, pack, random_corpus, read_output, sharded_corpora, tree_digest, write_shards

# ----------------------------------------------------------------------------- helpers


def check_equals_reference(out: str, docs, context_length: int, pad_token: int = 0) -> dict:
    input_ids, doc_ids, manifest = read_output(out)
    ref_ids, ref_docs = pack_sequences([np.asarray(d, np.int32) for d in docs], context_length, pad_token)
    assert input_ids.shape == ref_ids.shape
    np.testing.assert_array_equal(input_ids, ref_ids)
    np.testing.assert_array_equal(doc_ids, ref_docs)
    counts = manifest["counts"]
    assert counts["chunks"] == ref_ids.shape[0]
    assert counts["tokens"] == sum(len(d) for d in docs)
    assert counts["documents"] == len(docs)
    assert counts["padding_positions"] == int((ref_docs == -1).sum())
    assert counts["split_documents"] == naive_split_count(docs, context_length)
    return manifest


def naive_split_count(docs, c: int) -> int:
    pos, split = 0, 0
    for d in docs:
        if d and pos // c != (pos + len(d) - 1) // c:
            split += 1
        pos += len(d)
    return split


# ----------------------------------------------------------------------------- strategies

# ----------------------------------------------------------------------------- local engine


@pytest.mark.slow  # > 5 s
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=sharded_corpora(), context_length=st.sampled_from([1, 3, 8]), batch=st.integers(1, 7),
       chunks_per_batch=st.integers(1, 4))
def test_local_engine_equals_pack_sequences(tmp_path_factory, corpus, context_length, batch, chunks_per_batch):
    docs, cuts = corpus
    root = tmp_path_factory.mktemp("c")
    shard_dir = write_shards(root, docs, cuts)
    pack(root, shard_dir, context_length=context_length, read_batch_size=batch,
         chunks_per_record_batch=chunks_per_batch)
    check_equals_reference(str(root / "out"), docs, context_length)


def test_generated_corpora_really_split_documents_across_shards_and_chunks(tmp_path):
    """Guard against a vacuous pass: the cases above do cut documents and straddle shards."""
    docs = [[1] * 5, [2] * 13, [3] * 2, [4] * 20]
    shard_dir = write_shards(tmp_path, docs, [1, 1, 3])  # includes an empty shard
    pack(tmp_path, shard_dir, context_length=8)
    input_ids, doc_ids, manifest = read_output(str(tmp_path / "out"))
    assert manifest["counts"]["split_documents"] == 2
    assert len(manifest["files"]) >= 2  # stitched chunks live beside the shards' own files
    assert doc_ids[0].tolist() == [0] * 5 + [1] * 3


@pytest.mark.parametrize("batch", [1, 2, 5, 1000])
def test_file_bytes_do_not_depend_on_read_batch_size(tmp_path, batch):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 100, size=n).tolist() for n in rng.integers(0, 30, size=60)]
    shard_dir = write_shards(tmp_path, docs, [10, 35])
    pack(tmp_path, shard_dir, name="a", read_batch_size=batch)
    pack(tmp_path, shard_dir, name="b", read_batch_size=7)
    assert file_digests(str(tmp_path / "a")) == file_digests(str(tmp_path / "b"))


def test_empty_corpus_gives_zero_chunks(tmp_path):
    shard_dir = write_shards(tmp_path, [[], []], [1])
    pack(tmp_path, shard_dir)
    input_ids, _, manifest = read_output(str(tmp_path / "out"))
    assert input_ids.shape == (0, 8)
    assert manifest["counts"] == {"documents": 2, "tokens": 0, "chunks": 0, "padding_positions": 0,
                                  "split_documents": 0}
    assert manifest["files"] == []


@pytest.mark.parametrize(
    "docs,cuts",
    [
        ([[5, 6, 7]], []),  # smaller than one chunk
        ([list(range(100))], []),  # one document many chunks long
        ([[1, 2], [], [3] * 30, []], [0, 1, 2, 3, 4]),  # shards with no rows and only empty docs
        ([[1] * 8, [2] * 8], [1]),  # shard boundary on a chunk boundary
    ],
)
def test_edge_corpora(tmp_path, docs, cuts):
    shard_dir = write_shards(tmp_path, docs, cuts)
    pack(tmp_path, shard_dir)
    check_equals_reference(str(tmp_path / "out"), docs, 8)


# ----------------------------------------------------------------------------- Ray engine


@pytest.mark.parametrize("workers,batch", [(1, 7), (2, 3), (2, 64)])
def test_ray_engine_equals_reference_and_local_bytes(ray_session, tmp_path, workers, batch):
    docs = random_corpus(workers * 100 + batch, 300, 40)
    shard_dir = write_shards(tmp_path, docs, [0, 37, 38, 120, 121, 250], row_group_size=17)
    pack(tmp_path, shard_dir, name="ray", engine="ray", num_workers=workers, read_batch_size=batch)
    pack(tmp_path, shard_dir, name="local", engine="local", read_batch_size=5)
    manifest = check_equals_reference(str(tmp_path / "ray"), docs, 8)
    assert file_digests(str(tmp_path / "ray")) == file_digests(str(tmp_path / "local"))
    local = json.load(open(tmp_path / "local" / "manifest.json"))
    assert manifest["content_sha256"] == local["content_sha256"]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=sharded_corpora(), workers=st.sampled_from([1, 2]), batch=st.integers(1, 5))
def test_ray_engine_on_generated_corpora(ray_session, tmp_path_factory, corpus, workers, batch):
    docs, cuts = corpus
    root = tmp_path_factory.mktemp("r")
    shard_dir = write_shards(root, docs, cuts)
    pack(root, shard_dir, engine="ray", num_workers=workers, read_batch_size=batch)
    check_equals_reference(str(root / "out"), docs, 8)


# ----------------------------------------------------------------------------- output handling


def test_non_empty_output_is_refused_then_overwritten(tmp_path):
    from raypack.errors import InputError

    shard_dir = write_shards(tmp_path, [[1, 2, 3]], [])
    out = tmp_path / "out"
    pack(tmp_path, shard_dir, context_length=4)
    with pytest.raises(InputError, match="not empty.*--overwrite"):
        pack(tmp_path, shard_dir)
    pack(tmp_path, shard_dir, overwrite=True)
    check_equals_reference(str(out), [[1, 2, 3]], 8)
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_holding_files_raypack_did_not_write_is_refused(tmp_path, overwrite):
    """--overwrite replaces an output whole: a directory holding anything else (a mistyped --output naming
    a data or home directory) is refused, one line naming a file, and nothing in it is touched (it was
    deleted). Without --overwrite the line no longer says to pass it."""
    from raypack.errors import InputError

    shard_dir = write_shards(tmp_path, [[1, 2, 3]], [])
    out = tmp_path / "out"
    pack(tmp_path, shard_dir)
    (out / "notes.txt").write_text("x")
    (out / "data").mkdir()
    before = tree_digest(out)
    why = r" \(an output is replaced whole, so --overwrite takes only a raypack output\)" if overwrite else ""
    with pytest.raises(InputError, match=rf"output .*out holds 'data' and 1 more, which raypack did not write{why}; "
                                         r"choose another --output, or remove those files first$"):
        pack(tmp_path, shard_dir, overwrite=overwrite)
    assert tree_digest(out) == before and sorted(os.listdir(tmp_path)) == ["out", "shards"]


def test_record_batches_inside_a_read_batch_are_written_without_a_copy(tmp_path, monkeypatch):
    """concat: slices end on record-batch boundaries of the global stream, so the writer takes a record
    batch that lies inside one read batch as one zero-copy part (only those that straddle a read batch
    are concatenated). Same bytes as slices that do not line up (read_batch_tokens below a record batch)."""
    import raypack.packed.writer as writer

    docs = random_corpus(3, 300, 60)
    shard_dir = write_shards(str(tmp_path), docs, [170])  # two shards; the second starts mid-chunk
    real, copied = writer.concat_chunks, []

    def counting(parts, *args):
        copied.append(sum(1 for p in parts if p.num_chunks) > 1)
        return real(parts, *args)

    monkeypatch.setattr(writer, "concat_chunks", counting)
    runs = {}
    for name, read_batch_tokens in (("aligned", 64), ("unaligned", 63)):
        copied.clear()
        pack(tmp_path, shard_dir, name=name, read_batch_size=10_000, read_batch_tokens=read_batch_tokens,
             chunks_per_record_batch=8)  # a record batch: 8 x 8 = 64 tokens; one read batch per shard
        runs[name] = sum(copied), len(copied)
    assert runs["aligned"][0] <= 2  # at most the record batch where a shard's read batch ends, per shard
    assert runs["unaligned"][0] > 10 * runs["aligned"][0] + 10  # the test can tell them apart
    assert file_digests(str(tmp_path / "aligned")) == file_digests(str(tmp_path / "unaligned"))
    check_equals_reference(str(tmp_path / "aligned"), docs, 8)


@pytest.mark.parametrize("overrides", [{"strategy": "best_fit"}, {"long_docs": "truncate"}])
def test_a_local_runs_peak_holds_its_first_pass(tmp_path, monkeypatch, overrides):
    """A hostile trial: best_fit and --long-docs truncate on one 30M-token document said 206-229 MiB added where
    the process grew by ~750 MiB; the first pass ran before the run's peak was measured from."""
    import raypack.pack.job as job

    real = job.count_task

    def heavy(task, settings, stop=None):
        np.ones(300 << 20, dtype=np.uint8)  # 300 MiB touched and freed: the first pass's own peak
        return real(task, settings, stop)

    monkeypatch.setattr(job, "count_task", heavy)
    summary = pack(tmp_path, write_shards(tmp_path, [[1, 2, 3, 4, 5]] * 40, [20]), **overrides)
    assert summary.peak_worker_rss_bytes > 250 << 20, summary.peak_worker_rss_bytes
