"""``long_docs`` split|truncate|drop: a document longer than C is packed whole, cut to its first C
tokens, or left out, under its own doc id (its input row), whatever the strategy and however the
work is split (shards for concat, tasks, read batches, pages); the manifest counts what was cut
or dropped, in all and per shard, and verify re-reads the inputs with the policy."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.cli import main
from raypack.cli.stats import packing_stats
from raypack.errors import InputError
from raypack.pack.config import make_config
from raypack.rules.long_docs import CutCounts, count_cut, keep_prefixes, kept_lengths
from raypack.verify import VerifyError, verify_output

from helpers import pack, read_output, write_shards
from reference import naive_best_fit, naive_pack

C = 8
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture])


# ----------------------------------------------------------------------------- the naive reference


def kept_docs(docs: list[list[int]], long_docs: str, c: int = C) -> list[list[int]]:
    """Each document as packed, by the rule, one document at a time (a dropped one: empty)."""
    if long_docs == "truncate":
        return [doc[:c] for doc in docs]
    if long_docs == "drop":
        return [[] if len(doc) > c else doc for doc in docs]
    return [list(doc) for doc in docs]


def cut_counts(docs: list[list[int]], long_docs: str, c: int = C) -> dict[str, int]:
    counts = {"documents_truncated": 0, "tokens_truncated": 0, "documents_dropped": 0, "tokens_dropped": 0}
    for doc in docs:
        if len(doc) > c and long_docs == "truncate":
            counts["documents_truncated"] += 1
            counts["tokens_truncated"] += len(doc) - c
        elif len(doc) > c and long_docs == "drop":
            counts["documents_dropped"] += 1
            counts["tokens_dropped"] += len(doc)
    return counts


def expected_chunks(docs, cuts, long_docs, strategy, window=2):
    """(input_ids, doc_ids) the rules give for the kept documents (best_fit: per shard)."""
    kept = kept_docs(docs, long_docs)
    if strategy == "concat":
        return naive_pack(kept, C, 0, dtype=np.int32)
    rows_tokens, rows_ids = [np.zeros((0, C), np.int32)], [np.zeros((0, C), np.int64)]
    bounds = [0, *cuts, len(docs)]
    for start, end in zip(bounds, bounds[1:]):
        tokens, ids = naive_best_fit(kept[start:end], C, 0, window=window, dtype=np.int32)
        rows_tokens.append(tokens)
        rows_ids.append(np.where(ids >= 0, ids + start, -1))
    return np.concatenate(rows_tokens), np.concatenate(rows_ids)


# ----------------------------------------------------------------------------- the pure functions


def test_kept_lengths_and_counts_literal():
    lengths = np.array([0, 3, 8, 9, 20])
    assert kept_lengths(lengths, "split", 8).tolist() == [0, 3, 8, 9, 20]
    assert kept_lengths(lengths, "truncate", 8).tolist() == [0, 3, 8, 8, 8]
    assert kept_lengths(lengths, "drop", 8).tolist() == [0, 3, 8, 0, 0]
    assert count_cut(lengths, "split", 8) == CutCounts(0, 0, 0, 0)
    assert count_cut(lengths, "truncate", 8) == CutCounts(2, 1 + 12, 0, 0)
    assert count_cut(lengths, "drop", 8) == CutCounts(0, 0, 2, 29)


def test_keep_prefixes_any_dtype():
    side = np.zeros(7, dtype=[("token", np.int32), ("loss", np.float32)])  # a structured array of side values
    side["token"] = np.arange(7)
    side["loss"] = np.arange(7) / 2
    got = keep_prefixes(side, np.array([3, 0, 4]), np.array([2, 0, 0]))
    assert got.dtype == side.dtype and got["token"].tolist() == [0, 1] and got["loss"].tolist() == [0.0, 0.5]
    plain = np.arange(5)
    assert keep_prefixes(plain, np.array([2, 3]), np.array([2, 3])) is plain  # nothing cut: no copy


# ----------------------------------------------------------------------------- the job


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("long_docs", ["truncate", "drop"])
def test_counts_literal(tmp_path, strategy, long_docs):
    docs = [list(range(100 * i, 100 * i + n)) for i, n in enumerate([3, 20, 5, 9, 0, 8, 17, 2])]
    shard_dir = write_shards(tmp_path, docs, [3, 5])
    summary = pack(tmp_path, shard_dir, strategy=strategy, long_docs=long_docs, best_fit_window=2)
    m = summary.manifest
    kept = 3 + 5 + 0 + 8 + 2 + (8 + 8 + 8 if long_docs == "truncate" else 0)
    cut = ({"documents_truncated": 3, "tokens_truncated": 12 + 1 + 9, "documents_dropped": 0, "tokens_dropped": 0}
           if long_docs == "truncate" else
           {"documents_truncated": 0, "tokens_truncated": 0, "documents_dropped": 3, "tokens_dropped": 20 + 9 + 17})
    assert m["long_docs"] == long_docs
    assert {k: m["counts"][k] for k in ("documents", "tokens", *cut)} == {"documents": 8, "tokens": kept, **cut}
    assert m["counts"]["padding_positions"] == m["counts"]["chunks"] * C - kept
    shard_cut = [cut_counts(docs[a:b], long_docs) for a, b in ((0, 3), (3, 5), (5, 8))]
    assert [{k: s[k] for k in cut} for s in m["shards"]] == shard_cut
    assert [s["num_tokens"] for s in m["shards"]] == [sum(map(len, kept_docs(docs[a:b], long_docs)))
                                                       for a, b in ((0, 3), (3, 5), (5, 8))]
    assert [s["token_offset"] for s in m["shards"]] == [0, m["shards"][0]["num_tokens"],
                                                         m["shards"][0]["num_tokens"] + m["shards"][1]["num_tokens"]]
    report = verify_output(str(tmp_path / "out"))
    kind = "truncated" if long_docs == "truncate" else "dropped"
    left_out = (cut[f"documents_{kind}"], cut[f"tokens_{kind}"])
    assert (report.long_docs, report.long_doc_counts) == (long_docs, left_out)
    assert f"unpack(pack(x)) == {long_docs}(x)" in "\n".join(report.lines())
    assert packing_stats(str(tmp_path / "out")).long_docs == (long_docs, *left_out)


def test_split_leaves_the_manifest_as_it_was(tmp_path):
    docs = [list(range(n)) for n in (3, 20, 5)]
    shard_dir = write_shards(tmp_path, docs, [1])
    default = pack(tmp_path, shard_dir, name="default").manifest
    split = pack(tmp_path, shard_dir, name="split", long_docs="split").manifest
    assert "long_docs" not in default and "documents_truncated" not in default["counts"]
    assert {k: v for k, v in split.items() if k != "config"} == {k: v for k, v in default.items() if k != "config"}
    assert "documents_dropped" not in default["shards"][0]


SPLITS = [  # (task_tokens, row_group_size, read_batch_size, read_batch_tokens): how the work is cut
    (0, None, 3, 1 << 20),
    (1, 2, 1, 1 << 20),  # one task per row group of two documents (best_fit: window 2 starts there)
    (0, None, 0, 5),  # long documents fed to the packer in slices of at most 5 tokens
    (1, 2, 0, 3),
]


@SETTINGS
@given(corpus=st.lists(st.sampled_from([0, 1, 3, 7, 8, 9, 15, 16, 17, 30]), max_size=14),
       cuts=st.lists(st.integers(0, 14), max_size=3), seed=st.integers(0, 2**16),
       strategy=st.sampled_from(["concat", "best_fit"]), long_docs=st.sampled_from(["truncate", "drop", "split"]),
       splits=st.lists(st.sampled_from(SPLITS), min_size=2, max_size=2, unique=True))
def test_every_document_comes_back_kept_exactly(tmp_path_factory, corpus, cuts, seed, strategy, long_docs, splits):
    """The output equals the naive packer's over the naively kept documents (so every document's
    tokens come back intact, truncated exactly or not at all), for two ways of splitting the work."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, 1000, size=n).tolist() for n in corpus]
    cuts = sorted({min(c, len(docs)) for c in cuts})
    want_tokens, want_ids = expected_chunks(docs, cuts, long_docs, strategy)
    digests = set()
    for task_tokens, row_group_size, batch_size, batch_tokens in splits:
        root = tmp_path_factory.mktemp("case")
        shard_dir = write_shards(root, docs, cuts, row_group_size=row_group_size)
        summary = pack(root, shard_dir, strategy=strategy, long_docs=long_docs, best_fit_window=2,
                       task_tokens=task_tokens, read_batch_size=batch_size, read_batch_tokens=batch_tokens)
        tokens, ids, manifest = read_output(str(root / "out"))
        assert np.array_equal(ids, want_ids) and np.array_equal(tokens, want_tokens)
        counts = manifest["counts"]
        assert counts["documents"] == len(docs) and counts["tokens"] == sum(map(len, kept_docs(docs, long_docs)))
        if long_docs != "split":
            assert {k: counts[k] for k in CutCounts._fields} == cut_counts(docs, long_docs)
        if not digests:
            verify_output(str(root / "out"))  # with the inputs, re-read with the policy
        digests.add(summary.manifest["content_sha256"])
    assert len(digests) == 1


def test_concat_output_does_not_depend_on_the_shards(tmp_path):
    docs = [list(range(1, n + 1)) for n in (9, 3, 17, 0, 8, 30, 2, 9)]
    digests = set()
    for k, cuts in enumerate(([], [1, 2, 3], [5], [2, 6, 7])):
        shard_dir = write_shards(tmp_path / f"in{k}", docs, cuts)
        digests.add(pack(tmp_path, shard_dir, name=f"out{k}", long_docs="truncate").manifest["content_sha256"])
    assert len(digests) == 1


# ----------------------------------------------------------------------------- verify


def _rewrite_input(shard_dir: str, docs: list[list[int]]) -> None:
    path = os.path.join(shard_dir, "part-0000.parquet")
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), path)


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_verify_reads_inputs_with_the_policy(tmp_path, strategy):
    docs = [list(range(1, n + 1)) for n in (3, 20, 5)]
    shard_dir = write_shards(tmp_path, docs, [])
    pack(tmp_path, shard_dir, strategy=strategy, long_docs="truncate")
    verify_output(str(tmp_path / "out"))
    _rewrite_input(shard_dir, [list(range(1, n + 1)) for n in (3, 21, 5)])  # one more token past C: cut the same
    with pytest.raises(VerifyError, match="tokens_truncated"):
        verify_output(str(tmp_path / "out"))


def test_verify_refuses_a_document_longer_than_c_under_truncate(tmp_path):
    docs = [list(range(1, n + 1)) for n in (3, 20, 5)]
    shard_dir = write_shards(tmp_path, docs, [])
    pack(tmp_path, shard_dir, name="split")
    pack(tmp_path, shard_dir, name="out", long_docs="truncate")
    manifest = json.loads((tmp_path / "split" / "manifest.json").read_text())
    manifest["long_docs"] = "truncate"  # a split output that claims to be truncated
    for entry in [manifest["counts"], *manifest["shards"]]:
        entry.update(dict.fromkeys(CutCounts._fields, 0))
    (tmp_path / "split" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(VerifyError, match=r"chunk 0 position 3 .*: doc id 1 has more than 8 tokens, but the "
                                          r"manifest says long_docs=truncate"):
        verify_output(str(tmp_path / "split"), [])


# ----------------------------------------------------------------------------- configuration


def test_bad_long_docs_is_one_line(tmp_path, capsys):
    with pytest.raises(InputError, match=r"long_docs='cut' must be one of split, truncate, drop"):
        make_config({"long_docs": "cut"})
    shard_dir = write_shards(tmp_path, [[1, 2]], [])
    code = main(["pack", "--input", shard_dir, "--output", str(tmp_path / "o"), "--context-length", "8",
                 "--long-docs", "cut", "--local"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--long-docs cut: must be one of split, truncate, drop" in err


def test_resume_with_another_policy_repacks(tmp_path):
    """A task's record holds its settings: a resume under another policy reuses none of it."""
    from raypack.pack.packer import count_task, pack_shard
    from raypack.pack.plan import make_plan, place_counts, settings_for
    from raypack.pack.resume import load_verified_result

    docs = [list(range(1, n + 1)) for n in (3, 20, 5)]
    shard_dir = write_shards(tmp_path, docs, [])
    results = {}
    for long_docs in ("truncate", "drop"):
        config = make_config({"inputs": [shard_dir], "output": str(tmp_path / "o"), "context_length": C,
                              "long_docs": long_docs})
        plan = make_plan(config)
        settings = settings_for(config, plan, str(tmp_path / "work"))
        plan = place_counts(plan, [count_task(t, settings) for t in plan.tasks])
        results[long_docs] = (plan.tasks[0], settings)
    os.makedirs(tmp_path / "work")
    pack_shard(*results["truncate"])
    assert load_verified_result(*results["truncate"]) is not None
    assert load_verified_result(*results["drop"]) is None


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("long_docs", ["truncate", "drop"])
def test_long_documents_fed_in_slices(tmp_path, monkeypatch, strategy, long_docs):
    """Documents longer than C and than read_batch_tokens, fed to the packer in slices: the policy holds."""
    import raypack.pack.packer as shard_pack

    slices, original = [], shard_pack.iter_run_slices

    def spy(tokens, *args):
        for piece in original(tokens, *args):
            slices.append(int(piece[0].size))
            yield piece
    monkeypatch.setattr(shard_pack, "iter_run_slices", spy)
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, 1000, size=n).tolist() for n in (20, 5, 0, 17, 8, 31, 3)]
    shard_dir = write_shards(tmp_path, docs, [3])
    pack(tmp_path, shard_dir, strategy=strategy, long_docs=long_docs, read_batch_size=0, read_batch_tokens=3,
         best_fit_window=2)
    assert len(slices) >= 10 and max(slices) <= 3  # really fed in slices, long documents across them
    tokens, ids, _ = read_output(str(tmp_path / "out"))
    want_tokens, want_ids = expected_chunks(docs, [3], long_docs, strategy)
    assert np.array_equal(ids, want_ids) and np.array_equal(tokens, want_tokens)


def test_summary_and_dry_run_say_what_was_left_out(tmp_path):
    from raypack.pack.dry_run import dry_run

    docs = [list(range(1, n + 1)) for n in (3, 20, 5, 9)]
    shard_dir = write_shards(tmp_path, docs, [])
    lines = pack(tmp_path, shard_dir, long_docs="truncate").lines()
    assert "  truncated                     2  documents (13 tokens cut off)" in lines
    config = make_config({"inputs": [shard_dir], "context_length": C, "long_docs": "drop"})
    report = "\n".join(dry_run(config, sample_docs=0).lines())
    assert "documents longer than C: 2 (50.000%); long_docs=drop leaves them out (29 tokens)" in report
    assert "  concat                             1      0.000%" in report  # 3 + 5 tokens kept: one chunk


def test_ray_engine_equals_local_bytes(ray_session, tmp_path, strategy="concat"):
    """The counting pass and the packers on Ray (actors, tasks split by task_tokens) give the local bytes.
    (best_fit with truncate on Ray, with side columns too: test_side_columns.py::test_ray_engine_matches_local.)"""
    rng = np.random.default_rng(7)
    docs = [rng.integers(1, 1000, size=n).tolist() for n in rng.integers(0, 20, size=120)]
    shard_dir = write_shards(tmp_path, docs, [30, 31, 90], row_group_size=10)
    options = dict(strategy=strategy, long_docs="truncate", best_fit_window=10, task_tokens=60)
    pack(tmp_path, shard_dir, name="ray", engine="ray", num_workers=2, **options)
    pack(tmp_path, shard_dir, name="local", engine="local", read_batch_size=7, **options)
    ray_out, local_out = (read_output(str(tmp_path / name)) for name in ("ray", "local"))
    assert all(np.array_equal(a, b) for a, b in zip(ray_out[:2], local_out[:2])) and ray_out[2] == local_out[2]
    assert ray_out[2]["counts"]["documents_truncated"] > 0 and len(os.listdir(tmp_path / "ray")) > 5  # several tasks
