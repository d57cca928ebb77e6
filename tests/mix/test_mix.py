"""raypack mix: the order's rules as properties (raypack.mix.order, pure), then the mix output end to end
(raypack.mix.dataset: read_packed, batches, torch, verify, stats, CLI refusals) over tiny packed outputs."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.cli import main
from raypack.errors import InputError
from raypack.mix.dataset import MixedDataset, load_mix_config, run_mix
from raypack.mix.order import MixOrder, apportion, permute, permute_array, round_keys
from raypack.outputs import read_packed

from helpers import pack, read_output, write_shards

PROPERTY = settings(max_examples=40, deadline=None)


# ----------------------------------------------------------------------------- the rules, pure


def naive_apportion(weights, total):
    """Largest remainder by the book: exact quotas, floors, leftovers to the largest remainders
    (ties: lowest index)."""
    quotas = [Fraction(total) * Fraction(repr(w) if isinstance(w, float) else w) for w in weights]
    whole = sum(Fraction(repr(w) if isinstance(w, float) else w) for w in weights)
    quotas = [q / whole for q in quotas]
    shares = [q.numerator // q.denominator for q in quotas]
    order = sorted(range(len(weights)), key=lambda k: (shares[k] - quotas[k], k))
    for k in order[: total - sum(shares)]:
        shares[k] += 1
    return shares


def test_apportion_literal_cases():
    assert apportion([1, 1, 1], 10) == [4, 3, 3]          # tie: the lowest index gets the leftover
    assert apportion([0.1, 0.2, 0.7], 7) == [1, 1, 5]     # quotas 0.7, 1.4, 4.9: leftovers to .9 then .7
    assert apportion([1, 1, 1], 2) == [1, 1, 0]           # N smaller than the number of sources
    assert apportion([5], 3) == [3]
    assert apportion([0.1, 0.1, 0.1], 3) == [1, 1, 1]     # 0.1 is 1/10 exactly, not its binary float


weights_st = st.lists(st.one_of(st.integers(1, 1000), st.floats(1e-3, 1e3, allow_nan=False)), min_size=1, max_size=6)


@PROPERTY
@given(weights=weights_st, total=st.integers(1, 10_000))
def test_apportion_is_the_largest_remainder(weights, total):
    shares = apportion(weights, total)
    assert shares == naive_apportion(weights, total)
    assert sum(shares) == total
    whole = sum(Fraction(repr(w) if isinstance(w, float) else w) for w in weights)
    for w, m in zip(weights, shares):
        quota = total * Fraction(repr(w) if isinstance(w, float) else w) / whole
        assert math.floor(quota) <= m <= math.ceil(quota)


@PROPERTY
@given(weights=st.lists(st.integers(1, 100), min_size=1, max_size=6), scale=st.integers(2, 50),
       total=st.integers(1, 5000))
def test_weights_need_not_sum_to_one(weights, scale, total):
    assert apportion([w * scale for w in weights], total) == apportion(weights, total)
    assert apportion([w / 4 for w in weights], total) == apportion(weights, total)  # w / 4 is exact in binary


@PROPERTY
@given(n=st.integers(1, 600), seed=st.integers(0, 2**64 - 1), stream=st.integers(0, 10))
def test_permute_is_a_bijection_and_the_scalar_path_equals_the_vector_one(n, seed, stream):
    keys = round_keys(seed, (stream,))
    scalar = [permute(x, n, keys) for x in range(n)]
    assert sorted(scalar) == list(range(n))
    assert permute_array(np.arange(n), n, keys).tolist() == scalar


def test_order_is_pinned():
    """The rules are the format: these values must never change (any machine, any numpy)."""
    keys = round_keys(42, (0,))
    assert [permute(x, 10, keys) for x in range(10)] == [3, 0, 8, 4, 5, 1, 6, 9, 2, 7]
    order = MixOrder(7, [5, 3], [2, 4])
    assert [order.locate(i) for i in range(8)] == [(1, 3), (0, 0), (1, 1), (0, 0), (0, 0), (0, 1), (0, 1), (1, 0)]


order_st = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 25)), min_size=1, max_size=4)


def order_of(pairs, seed):
    shares = [m for m, _ in pairs]
    if sum(shares) == 0:
        shares[0] = 1
    return MixOrder(seed, shares, [n for _, n in pairs])


@PROPERTY
@given(pairs=order_st, seed=st.integers(0, 2**64 - 1))
def test_counts_passes_and_remainders(pairs, seed):
    order = order_of(pairs, seed)
    draws = order.locate_array(np.arange(len(order)))
    assert np.bincount(draws.sources, minlength=len(pairs)).tolist() == list(order.shares)
    for k, (m, n) in enumerate(zip(order.shares, order.source_chunks)):
        passes, rem = divmod(m, n)
        for p in range(passes):   # every whole pass reads each chunk once
            assert sorted(order.draw_chunk(k, p * n + r) for r in range(n)) == list(range(n))
        last = [order.draw_chunk(k, passes * n + r) for r in range(rem)]
        assert len(set(last)) == rem   # the partial pass: distinct chunks
        counts = Counter(draws.chunks[draws.sources == k].tolist())
        assert sorted(counts.values()) == sorted([passes] * (n - rem) + [passes + 1] * rem if passes
                                                 else [1] * rem)


@PROPERTY
@given(pairs=order_st, seed=st.integers(0, 2**64 - 1), data=st.data())
def test_item_i_alone_equals_the_ith_of_the_whole_order(pairs, seed, data):
    order = order_of(pairs, seed)
    whole = order.locate_array(np.arange(len(order)))
    picks = data.draw(st.lists(st.integers(0, len(order) - 1), max_size=20))
    for i in picks:
        assert order.locate(i) == (whole.sources[i], whole.chunks[i])
    again = MixOrder(seed, order.shares, order.source_chunks).locate_array(np.array(picks[::-1], np.int64))
    assert again.sources.tolist() == whole.sources[picks[::-1]].tolist()
    assert again.chunks.tolist() == whole.chunks[picks[::-1]].tolist()


@PROPERTY
@given(seed=st.integers(0, 2**64 - 2), other=st.integers(1, 2**32))
def test_another_seed_gives_another_order(seed, other):
    a = MixOrder(seed, [40, 30], [25, 30]).locate_array(np.arange(70))
    b = MixOrder((seed + other) % 2**64, [40, 30], [25, 30]).locate_array(np.arange(70))
    assert (a.sources.tolist(), a.chunks.tolist()) != (b.sources.tolist(), b.chunks.tolist())


# ----------------------------------------------------------------------------- sources on disk


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Tiny packed outputs (C = 8): two concat and a best_fit one alike, and three that differ."""
    root = tmp_path_factory.mktemp("mix")
    rng = np.random.default_rng(3)
    made = {}
    for name, extra, seed in (("a", {}, 0), ("b", {}, 1), ("fit", {"strategy": "best_fit"}, 2),
                              ("c16", {"context_length": 16}, 3), ("i64", {"token_dtype": "int64"}, 4),
                              ("pad7", {"pad_token": 7}, 5)):
        docs = [rng.integers(1, 500, size=int(n)).tolist() for n in rng.integers(1, 20, size=30 + 10 * seed)]
        shard_dir = write_shards(root / f"in-{name}", docs, [len(docs) // 2])
        pack(root, shard_dir, name=name, **extra)
        made[name] = str(root / name)
    return made


def mix(tmp_path, sources, num_chunks, seed=0, name="mix", **extra):
    config = load_mix_config(None, sources=sources, output=str(tmp_path / name), num_chunks=num_chunks,
                             seed=seed, **extra)
    run_mix(config)
    return str(tmp_path / name)


def source_chunks(path):
    input_ids, doc_ids, _ = read_output(path)
    return input_ids, doc_ids


def test_read_packed_of_a_mix_gives_the_sources_chunks(tmp_path, outputs):
    paths = [outputs["a"], outputs["b"], outputs["fit"]]
    out = mix(tmp_path, [(paths[0], 2), (paths[1], 0.5), (paths[2], 1.5)], num_chunks=300, seed=11)
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    assert sorted(os.listdir(out)) == ["manifest.json"]   # index only: no chunk copied
    ds = read_packed(out)
    assert isinstance(ds, MixedDataset) and len(ds) == 300
    chunks = [source_chunks(p) for p in paths]
    assert [s["num_chunks"] for s in manifest["sources"]] == [len(c[0]) for c in chunks]
    assert manifest["sources"][0]["passes"] >= 1   # a source repeated: its chunks come back whole passes
    order = MixOrder(11, [s["share"] for s in manifest["sources"]], [len(c[0]) for c in chunks])
    seen = Counter()
    for i in range(len(ds)):
        item = ds[i]
        k, j = order.locate(i)
        assert item["source"] == k
        np.testing.assert_array_equal(item["input_ids"], chunks[k][0][j])
        np.testing.assert_array_equal(item["doc_ids"], chunks[k][1][j])
        seen[k] += 1
    assert [seen[k] for k in range(3)] == [s["share"] for s in manifest["sources"]] == apportion([2, 0.5, 1.5], 300)
    batch = ds.get_batch(17, 90)
    for key in ("input_ids", "doc_ids"):
        np.testing.assert_array_equal(batch[key], np.stack([ds[i][key] for i in range(17, 90)]))
    assert batch["source"].tolist() == [ds[i]["source"] for i in range(17, 90)]
    batches = list(ds.iter_batches(64, with_mask=True))
    assert [len(b["source"]) for b in batches] == [64] * 4 + [44]
    np.testing.assert_array_equal(np.concatenate([b["input_ids"] for b in batches]), ds.get_batch(0, 300)["input_ids"])
    np.testing.assert_array_equal(batches[1]["attention_mask"][3], ds.mask(67))
    assert ds[-1]["source"] == ds[299]["source"]
    clone = pickle.loads(pickle.dumps(ds))   # DataLoader workers: pickled without open files
    np.testing.assert_array_equal(clone.get_batch(5, 9)["input_ids"], ds.get_batch(5, 9)["input_ids"])
    with pytest.raises(IndexError):
        ds[300]
    with pytest.raises(IndexError, match="out of range"):
        ds.take([0, 300])
    picked = ds.take([299, 3, 3])
    assert picked["source"].tolist() == [ds[299]["source"], ds[3]["source"], ds[3]["source"]]
    np.testing.assert_array_equal(picked["doc_ids"][0], ds[299]["doc_ids"])


def test_torch_dataset_and_collate_over_a_mix(tmp_path, outputs):
    torch = pytest.importorskip("torch")
    from raypack.torch_data import PackedTorchDataset, make_collate_fn

    out = mix(tmp_path, [(outputs["a"], 1), (outputs["fit"], 1)], num_chunks=40, seed=5)
    ds = PackedTorchDataset(out)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, collate_fn=make_collate_fn("varlen"))
    batch = next(iter(loader))
    expected = read_packed(out).get_batch(0, 8)
    assert torch.equal(batch["input_ids"], torch.as_tensor(expected["input_ids"].astype(np.int64)))
    assert torch.equal(batch["doc_ids"], torch.as_tensor(expected["doc_ids"]))
    assert PackedTorchDataset(read_packed(out))[3]["source"] == read_packed(out)[3]["source"]
    # the batch keeps each chunk's source (a loss per source): the collate dropped it (a training team's trial)
    assert batch["source"].dtype == torch.int64 and batch["source"].tolist() == expected["source"].tolist()
    assert set(expected["source"].tolist()) == {0, 1}
    assert "source" not in make_collate_fn("varlen")([PackedTorchDataset(outputs["a"])[0]])  # a plain output


def test_to_ray_dataset_over_a_mix(ray_session, tmp_path, outputs):
    out = mix(tmp_path, [(outputs["a"], 3), (outputs["b"], 1)], num_chunks=50, seed=2)
    ds = read_packed(out)
    table = ds.to_ray_dataset(batch_rows=16).to_arrow_refs()
    import ray

    rows = [r for ref in table for r in ray.get(ref).to_pylist()]
    expected = ds.get_batch(0, 50)
    assert [r["source"] for r in rows] == expected["source"].tolist()
    np.testing.assert_array_equal(np.array([r["input_ids"] for r in rows]), expected["input_ids"])
    np.testing.assert_array_equal(np.array([r["doc_ids"] for r in rows]), expected["doc_ids"])
    pytest.importorskip("torch")
    from raypack.torch_data import iter_ray_batches

    first = next(iter_ray_batches(ds, 16, "varlen"))
    np.testing.assert_array_equal(first["input_ids"].numpy(), expected["input_ids"][:16])
    assert first["source"].tolist() == expected["source"][:16].tolist()


def test_one_source_and_fewer_items_than_sources(tmp_path, outputs):
    n = len(read_packed(outputs["a"]))
    one = read_packed(mix(tmp_path, [(outputs["a"], 0.3)], num_chunks=2 * n + 3, name="one"))
    counts = Counter(int(np.flatnonzero((source_chunks(outputs["a"])[0] == one[i]["input_ids"]).all(1))[0])
                     for i in range(len(one)))
    assert sorted(counts.values()) == [2] * (n - 3) + [3] * 3
    few = read_packed(mix(tmp_path, [(outputs["a"], 1), (outputs["b"], 1), (outputs["fit"], 1)], num_chunks=2,
                          name="few"))
    assert len(few) == 2 and sorted(few[i]["source"] for i in range(2)) == [0, 1]
    assert [s["share"] for s in few.manifest["sources"]] == [1, 1, 0]


def test_same_seed_same_items_another_seed_another_order(tmp_path, outputs):
    sources = [(outputs["a"], 1), (outputs["b"], 2)]
    first = read_packed(mix(tmp_path, sources, 60, seed=9, name="m1")).get_batch(0, 60)
    again = read_packed(mix(tmp_path, sources, 60, seed=9, name="m2")).get_batch(0, 60)
    other = read_packed(mix(tmp_path, sources, 60, seed=10, name="m3")).get_batch(0, 60)
    np.testing.assert_array_equal(first["input_ids"], again["input_ids"])
    assert not np.array_equal(first["input_ids"], other["input_ids"])


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("other, what", [("c16", "context_length=16"), ("i64", "token_dtype=int64"),
                                         ("pad7", "pad_token=7")])
def test_sources_that_differ_are_refused(capsys, tmp_path, outputs, other, what):
    code, _, err = run_cli(capsys, "mix", "--source", outputs["a"], "--weight", "1", "--source", outputs[other],
                           "--weight", "1", "--num-chunks", "10", "--output", str(tmp_path / "m"))
    assert code == 2 and err.count("\n") == 1
    assert f"source 1 ({outputs[other]}) has {what}" in err and f"source 0 ({outputs['a']})" in err
    assert not os.path.exists(tmp_path / "m")


@pytest.mark.parametrize("weight", ["0", "-1", "nan", "inf", "x"])
def test_bad_weights_are_refused(capsys, tmp_path, outputs, weight):
    code, _, err = run_cli(capsys, "mix", "--source", outputs["a"], "--weight", "1", "--source", outputs["b"],
                           "--weight", weight, "--num-chunks", "10", "--output", str(tmp_path / "m"))
    assert code == 2 and err.count("\n") == 1 and ("weight" in err)
    assert not os.path.exists(tmp_path / "m")


@pytest.mark.parametrize("argv, message", [
    (["--weight", "1", "--num-chunks", "5"], "1 --source but 2 --weight"),
    (["--num-chunks", "0"], "num_chunks=0"),
    (["--num-chunks", "5", "--seed", "-1"], "seed=-1"),
])
def test_bad_mix_flags_are_refused(capsys, tmp_path, outputs, argv, message):
    code, _, err = run_cli(capsys, "mix", "--source", outputs["a"], "--weight", "1", *argv,
                           "--output", str(tmp_path / "m"))
    assert code == 2 and message in err and err.count("\n") == 1


def test_output_over_a_source_and_a_mix_of_mixes_are_refused(tmp_path, outputs):
    for output in (outputs["a"], os.path.join(outputs["a"], "m")):
        with pytest.raises(InputError, match="overlap"):
            run_mix(load_mix_config(None, sources=[(outputs["a"], 1)], output=output, num_chunks=5, overwrite=True))
    assert read_packed(outputs["a"]).manifest["content_sha256"]
    inner = mix(tmp_path, [(outputs["a"], 1)], 5, name="inner")
    with pytest.raises(InputError, match="itself a mix"):
        mix(tmp_path, [(inner, 1)], 5, name="outer")


def test_toml_config_and_stats(capsys, tmp_path, outputs):
    config = tmp_path / "mix.toml"
    config.write_text(f'output = "{tmp_path / "m"}"\nnum_chunks = 100\nseed = 4\n'
                      f'[[sources]]\npath = "{outputs["a"]}"\nweight = 3\n'
                      f'[[sources]]\npath = "{outputs["fit"]}"\nweight = 1\n')
    code, out, _ = run_cli(capsys, "mix", "--config", str(config))
    assert code == 0 and "100 chunks" in out
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert manifest["seed"] == 4 and [s["share"] for s in manifest["sources"]] == [75, 25]
    assert manifest["sources"][0]["path"] == os.path.relpath(outputs["a"], tmp_path / "m")  # relative to the mix
    code, out, _ = run_cli(capsys, "stats", str(tmp_path / "m"))
    n_a = manifest["sources"][0]["num_chunks"]
    assert code == 0
    assert f"{75 // n_a} + {75 % n_a}/{n_a}" in out and "0.7500" in out and "0.2500" in out
    config.write_text("shuffle = true\n" + config.read_text())
    code, _, err = run_cli(capsys, "mix", "--config", str(config), "--overwrite")
    assert code == 2 and "unknown key(s) shuffle" in err


def test_a_mix_moved_with_its_sources_still_reads(tmp_path, outputs):
    tree = tmp_path / "tree"
    shutil.copytree(outputs["a"], tree / "a")
    out = mix(tmp_path, [(str(tree / "a"), 1)], 7, name="tree/m")
    expected = read_packed(out).get_batch(0, 7)["input_ids"]
    shutil.move(str(tree), str(tmp_path / "moved"))
    np.testing.assert_array_equal(read_packed(str(tmp_path / "moved" / "m")).get_batch(0, 7)["input_ids"], expected)


def test_verify_passes_then_refuses_a_changed_source(capsys, tmp_path, outputs):
    source = tmp_path / "src"
    shutil.copytree(outputs["b"], source)
    out = mix(tmp_path, [(outputs["a"], 1), (str(source), 1)], 30)
    code, printed, _ = run_cli(capsys, "verify", out)
    assert code == 0 and "verified mix" in printed
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 500, size=9).tolist() for _ in range(40)]
    pack(tmp_path, write_shards(tmp_path / "new", docs, []), name="src", overwrite=True)
    code, _, err = run_cli(capsys, "verify", out)
    assert code == 1 and err.count("\n") == 1
    assert f"source 1 ({source}) changed since the mix was made: content_sha256=" in err
    with pytest.raises(InputError, match="changed since the mix was made"):
        read_packed(out)


def test_verify_hashes_the_sources_bytes(capsys, tmp_path, outputs):
    source = tmp_path / "src"
    shutil.copytree(outputs["a"], source)
    out = mix(tmp_path, [(str(source), 1)], 10)
    name = sorted(p for p in os.listdir(source) if p.endswith(".arrow"))[0]
    data = bytearray((source / name).read_bytes())
    data[-200] ^= 1   # same size, same manifest: only hashing sees it
    (source / name).write_bytes(bytes(data))
    code, _, err = run_cli(capsys, "verify", out)
    assert code == 1 and "source 0 of the mix" in err and name in err


def test_a_tampered_mix_manifest_is_refused(tmp_path, outputs):
    out = mix(tmp_path, [(outputs["a"], 1), (outputs["b"], 1)], 10)
    path = os.path.join(out, "manifest.json")
    manifest = json.loads(open(path).read())
    manifest["sources"][0]["share"] += 1
    open(path, "w").write(json.dumps(manifest))
    with pytest.raises(InputError, match="the weights give share=5"):
        read_packed(out)
    manifest["sources"][0].update(share=5, weight=-1)
    open(path, "w").write(json.dumps(manifest))
    with pytest.raises(InputError, match="weight=-1"):
        read_packed(out)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_shuffle_spreads_each_source_over_the_order(seed):
    """Guard against a degenerate interleave: in the first 1,000 of 10,000 items of two equal
    sources, source 0's count is within 5 sigma of 500 (hypergeometric, sigma ~15), and so is the
    count of chunk ranks from the first half of a pass."""
    order = MixOrder(seed, [5000, 5000], [5000, 5000])
    draws = order.locate_array(np.arange(1000))
    assert abs(int((draws.sources == 0).sum()) - 500) < 75
    assert abs(int((draws.chunks < 2500).sum()) - 500) < 75


def test_each_pass_has_its_own_permutation():
    order = MixOrder(5, [60], [30])
    first, second = ([order.draw_chunk(0, p * 30 + r) for r in range(30)] for p in (0, 1))
    assert sorted(first) == sorted(second) == list(range(30)) and first != second


def test_readers_of_packed_outputs_only_refuse_a_mix_in_one_line(capsys, tmp_path, outputs):
    from raypack.packed.manifest import load_manifest

    out = mix(tmp_path, [(outputs["a"], 1)], 5)
    with pytest.raises(InputError, match="a mix .* not a packed output"):
        load_manifest(out)
    code, _, err = run_cli(capsys, "export", out, "--format", "megatron", "--output", str(tmp_path / "x"))
    assert code == 2 and "not a packed output" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "stats", out, "--plot", str(tmp_path / "p.png"))
    assert code == 2 and "is a mix" in err
    code, _, err = run_cli(capsys, "verify", out, "--input", outputs["a"])
    assert code == 2 and "has no inputs of its own" in err


def test_sources_of_different_tokenizers_are_refused_unless_allowed(tmp_path, capsys):
    """A cl100k output and an o200k output: their ids mean different tokens (it was exit 0)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raypack.cli import main

    (tmp_path / "text").mkdir()
    texts = pa.table({"text": [f"document {i}, some words" for i in range(40)]})
    pq.write_table(texts, tmp_path / "text" / "p.parquet")
    for name in ("cl100k_base", "o200k_base"):
        assert main(["pack", "--local", "--input", str(tmp_path / "text"), "--output", str(tmp_path / name),
                     "--context-length", "16", "--tokenizer", f"tiktoken:{name}"]) == 0
    capsys.readouterr()
    mix = ["mix", "--num-chunks", "10", "--source", str(tmp_path / "cl100k_base"), "--weight", "1"]
    assert main([*mix, "--source", str(tmp_path / "o200k_base"), "--weight", "1", "--output", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "o200k_base" in err[0] and "cl100k_base" in err[0] and "--allow-mixed-tokenizers" in err[0]
    assert not (tmp_path / "m").exists()
    assert main([*mix, "--source", str(tmp_path / "o200k_base"), "--weight", "1", "--output", str(tmp_path / "m"),
                 "--allow-mixed-tokenizers"]) == 0
    import shutil

    shutil.copytree(tmp_path / "cl100k_base", tmp_path / "cl100k_copy")  # another output, the same tokenizer
    same = [*mix, "--source", str(tmp_path / "cl100k_copy"), "--weight", "1", "--output", str(tmp_path / "m2")]
    assert main(same) == 0


def test_a_mix_listing_one_output_many_times_opens_it_once(tmp_path, monkeypatch):
    """A hostile (or careless) mix of 2,000 entries naming one output reads that manifest once."""
    import raypack.mix.dataset as dataset

    pack(tmp_path, write_shards(tmp_path, [[1, 2, 3, 4, 5]] * 30, [10]))
    pack(tmp_path, write_shards(tmp_path, [[1, 2, 3, 4, 5]] * 30, [10]), name="other")
    run_mix(load_mix_config(sources=((str(tmp_path / "out"), 1), (str(tmp_path / "other"), 1)),
                            output=str(tmp_path / "m"), num_chunks=4000))
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())  # raypack mix refuses a source twice
    one = manifest["sources"][0]
    manifest["sources"] = [dict(one, share=2, passes=2 // one["num_chunks"]) for _ in range(2000)]
    (tmp_path / "m" / "manifest.json").write_text(json.dumps(manifest))
    reads = []
    real = dataset.read_manifest_json
    monkeypatch.setattr(dataset, "read_manifest_json", lambda path: reads.append(path) or real(path))
    mixed = read_packed(str(tmp_path / "m"))
    assert len(mixed) == 4000 and len(reads) == 1
    assert {int(mixed[i]["source"]) for i in range(0, 4000, 97)} <= set(range(2000))


def test_sources_with_other_side_columns_or_listed_twice_are_refused(tmp_path, outputs):
    """A new user's trial: a source with --extra-columns loss_mask mixed with one without read uninitialised
    memory as the other rows' loss_mask (and a collate dropped the column for all); one output listed twice
    under two spellings repeated chunks within what read as one pass."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "side").mkdir()
    docs = [[1, 2, 3, 4, 5], [6, 7, 8]] * 10
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32())),
                             "loss_mask": pa.array([[1] * len(d) for d in docs], pa.list_(pa.int8()))}),
                   tmp_path / "side" / "p.parquet")
    pack(tmp_path, str(tmp_path / "side"), name="with_mask", extra_columns=["loss_mask"])
    with pytest.raises(InputError, match=r"source 1 \(.*with_mask\) has side columns loss_mask \(int8\) but source 0 "
                                         r"\(.*\) has none; mix outputs packed with the same --extra-columns$"):
        mix(tmp_path, [(outputs["a"], 1), (str(tmp_path / "with_mask"), 1)], 10)
    spelled = outputs["a"].replace("/mix", "//mix", 1) + "/"
    with pytest.raises(InputError, match=r"source 2 \(.*\) is source 0 \(.*\) again; list it once, with the sum of "
                                         r"its weights \(3\)$"):
        mix(tmp_path, [(outputs["a"], 1), (outputs["b"], 1), (spelled, 2)], 10)
    assert not (tmp_path / "mix").exists()
    # a mix made before mix refused it is refused as it is opened
    made = mix(tmp_path, [(outputs["a"], 1), (outputs["b"], 1)], 10)
    manifest = json.loads(open(os.path.join(made, "manifest.json")).read())
    with_mask = read_packed(str(tmp_path / "with_mask"))
    manifest["sources"][1].update(path=os.path.relpath(tmp_path / "with_mask", made), num_chunks=len(with_mask),
                                  content_sha256=with_mask.manifest.content_sha256)
    manifest["sources"][1]["passes"] = manifest["sources"][1]["share"] // len(with_mask)
    open(os.path.join(made, "manifest.json"), "w").write(json.dumps(manifest))
    with pytest.raises(InputError, match=r"manifest\.json: source 1 \(.*\) has side columns loss_mask \(int8\)"):
        read_packed(made)


def test_a_mix_reached_through_a_symbolic_link_finds_its_sources(tmp_path, outputs):
    """'..' in a source's recorded path is the mix directory's real parent, not the link's (a trial: stats of
    a linked mix said its source was 'no such output directory')."""
    made = mix(tmp_path, [(outputs["a"], 1), (outputs["b"], 1)], 10, name="real/m")
    (tmp_path / "elsewhere" / "deeper").mkdir(parents=True)  # another depth: a lexical '..' goes elsewhere
    (tmp_path / "elsewhere" / "deeper" / "link").symlink_to(made)
    linked = read_packed(str(tmp_path / "elsewhere" / "deeper" / "link"))
    assert linked.content_sha256 == read_packed(made).content_sha256


def test_a_mix_moved_away_from_its_sources_says_how_it_names_them(tmp_path, outputs):
    """A mix copied elsewhere said only "PATH: no such output directory" of the source it could not find."""
    import shutil

    made = mix(tmp_path, [(outputs["a"], 1), (outputs["b"], 1)], 10, name="here/m")
    shutil.copytree(made, tmp_path / "deeper" / "still" / "m")
    with pytest.raises(InputError, match=r"manifest\.json: source 0 is not there: .* \(the mix records it as "
                                         r"'\.\./.*', relative to the mix: a mix and its sources move together\); "
                                         r"put it back, or make the mix again from where the sources are now$"):
        read_packed(str(tmp_path / "deeper" / "still" / "m"))
