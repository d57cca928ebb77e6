"""The job with ``strategy = "best_fit"``: output equals the naive best-fit reference run shard
by shard (windows never span shards), bit for bit, for any sharding, workers, read batch
sizes, engine and resume. Output read back with plain pyarrow (test_job.read_output)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.errors import InputError

from helpers import file_digests, pack, random_corpus, read_output, sharded_corpora, write_shards
from reference import naive_best_fit


def expected(docs, cuts, c: int, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference, shard by shard, doc ids shifted by each shard's first document."""
    bounds = [0, *cuts, len(docs)]
    ids, doc_ids = [np.zeros((0, c), np.int32)], [np.zeros((0, c), np.int64)]
    for a, b in zip(bounds, bounds[1:]):
        part_ids, part_docs = naive_best_fit(docs[a:b], c, 0, window, dtype=np.int32)
        ids.append(part_ids)
        doc_ids.append(np.where(part_docs >= 0, part_docs + a, -1))
    return np.concatenate(ids), np.concatenate(doc_ids)


def check_equals_reference(out: str, docs, cuts, c: int, window: int) -> dict:
    input_ids, doc_ids, manifest = read_output(out)
    want_ids, want_docs = expected(docs, cuts, c, window)
    np.testing.assert_array_equal(input_ids, want_ids)
    np.testing.assert_array_equal(doc_ids, want_docs)
    counts = manifest["counts"]
    assert counts["chunks"] == len(want_ids)
    assert counts["padding_positions"] == int((want_docs == -1).sum())
    assert counts["split_documents"] == sum(len(d) > c for d in docs)
    assert manifest["strategy"] == "best_fit" and manifest["best_fit_window"] == window
    assert "strategy" not in manifest["config"] and "best_fit_window" not in manifest["config"]  # stored once
    ranges = [(s["first_chunk"], s["num_chunks"]) for s in manifest["shards"]]
    assert [first for first, _ in ranges] == list(np.cumsum([0] + [n for _, n in ranges])[:-1])
    return manifest


@pytest.mark.slow  # > 5 s
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=sharded_corpora(), context_length=st.sampled_from([1, 3, 8]), batch=st.integers(1, 7),
       window=st.integers(0, 6))
def test_local_engine_equals_reference(tmp_path_factory, corpus, context_length, batch, window):
    docs, cuts = corpus
    root = tmp_path_factory.mktemp("c")
    shard_dir = write_shards(root, docs, cuts)
    pack(root, shard_dir, context_length=context_length, read_batch_size=batch, strategy="best_fit",
         best_fit_window=window)
    check_equals_reference(str(root / "out"), docs, cuts, context_length, window)


def test_short_documents_are_never_cut_where_concat_cuts_them(tmp_path):
    """Guard against a vacuous pass: concat cuts these documents, best_fit does not."""
    docs = [[1] * 5, [2] * 6, [3] * 3, [4] * 20, [5] * 2]
    shard_dir = write_shards(tmp_path, docs, [2])
    pack(tmp_path, shard_dir, name="concat")
    pack(tmp_path, shard_dir, name="best", strategy="best_fit")
    _, concat_doc_ids, concat_manifest = read_output(str(tmp_path / "concat"))
    assert concat_manifest["counts"]["split_documents"] == 2
    assert np.count_nonzero((concat_doc_ids == 1).any(axis=1)) == 2  # concat cuts the 6-token doc 1
    _, doc_ids, manifest = read_output(str(tmp_path / "best"))
    assert manifest["counts"]["split_documents"] == 1  # only the 20-token document (> C = 8)
    for doc_id in (0, 1, 2, 4):
        assert np.count_nonzero((doc_ids == doc_id).any(axis=1)) == 1


@pytest.mark.parametrize("workers,batch", [(1, 7), (2, 3)])
def test_ray_engine_equals_reference_and_local_bytes(ray_session, tmp_path, workers, batch):
    docs = random_corpus(workers * 10 + batch, 300, 20)
    cuts = [0, 37, 38, 120, 121, 250]
    shard_dir = write_shards(tmp_path, docs, cuts, row_group_size=17)
    options = dict(strategy="best_fit", best_fit_window=25)
    pack(tmp_path, shard_dir, name="ray", engine="ray", num_workers=workers, read_batch_size=batch, **options)
    pack(tmp_path, shard_dir, name="local", engine="local", read_batch_size=5, **options)
    check_equals_reference(str(tmp_path / "ray"), docs, cuts, 8, 25)
    assert file_digests(str(tmp_path / "ray")) == file_digests(str(tmp_path / "local"))
    assert open(tmp_path / "ray" / "manifest.json").read() == open(tmp_path / "local" / "manifest.json").read()


def test_resume_finishes_a_best_fit_run_byte_identically(tmp_path, monkeypatch):
    import raypack.pack.job as job

    docs = random_corpus(3, 200, 30)
    shard_dir = write_shards(tmp_path, docs, [50, 100, 150])
    options = dict(strategy="best_fit", best_fit_window=16)
    pack(tmp_path, shard_dir, name="clean", **options)
    real = job.pack_shard
    calls = []

    def dies_on_third(task, settings, stop=None, committer=None):
        calls.append(task.shard_index)
        if len(calls) == 3:
            raise RuntimeError("simulated crash")
        return real(task, settings, stop, committer)

    monkeypatch.setattr(job, "pack_shard", dies_on_third)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pack(tmp_path, shard_dir, name="out", **options)
    monkeypatch.setattr(job, "pack_shard", real)
    from raypack.pack.config import make_config

    config = make_config(dict(inputs=[shard_dir], output=str(tmp_path / "out"), context_length=8, pad_token=0,
                              read_batch_size=3, chunks_per_record_batch=2, **options))
    job.run_pack(config, engine="local", resume=True)
    assert file_digests(str(tmp_path / "out")) == file_digests(str(tmp_path / "clean"))


def test_concat_manifest_says_concat_and_keeps_best_fit_keys_out(tmp_path):
    shard_dir = write_shards(tmp_path, [[1, 2, 3]], [])
    pack(tmp_path, shard_dir, best_fit_window=5)  # the window does not decide concat's bytes
    manifest = json.load(open(tmp_path / "out" / "manifest.json"))
    assert manifest["strategy"] == "concat" and "best_fit_window" not in manifest
    assert "best_fit_window" not in manifest["config"] and "first_chunk" not in manifest["shards"][0]


def test_unknown_strategy_is_refused_with_the_choices(tmp_path):
    shard_dir = write_shards(tmp_path, [[1, 2, 3]], [])
    with pytest.raises(InputError, match="strategy='bestfit' must be one of concat, best_fit"):
        pack(tmp_path, shard_dir, strategy="bestfit")
    with pytest.raises(InputError, match="best_fit_window=-1 must be an integer >= 0"):
        pack(tmp_path, shard_dir, strategy="best_fit", best_fit_window=-1)
    assert not os.path.exists(tmp_path / "out")
