"""Side columns (``--extra-columns``): per-token list columns packed with the tokens.

Layers: literal tiny cases with exact chunks; hypothesis against a naive pure-Python reference
(concat: concatenate (token, side values) records and chop; best_fit: the rules, record by
record) over random documents, shard splits, tasks and read batches; the packed output read back
(read_packed, verify, stats, the torch collate); every bad input with its one-line message; one
Ray-engine run byte-equal to the local engine.
"""

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
from raypack.outputs import read_packed
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.packed.manifest import check_manifest
from raypack.verify import VerifyError, verify_output

from helpers import file_digests

C = 8
PAD = 0

# ----------------------------------------------------------------------------- fixtures


def write_side_shards(root, docs, masks, cuts, *, labels=None, mask_type=pa.int8(), row_group_size=None,
                      name="shards") -> str:
    """Parquet shards of ``input_ids`` + ``loss_mask`` (+ ``labels``), split at ``cuts``."""
    shard_dir = os.path.join(root, name)
    os.makedirs(shard_dir, exist_ok=True)
    bounds = [0, *cuts, len(docs)]
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        columns = {"input_ids": pa.array(docs[a:b], pa.list_(pa.int32())),
                   "loss_mask": pa.array(masks[a:b], pa.list_(mask_type))}
        if labels is not None:
            columns["labels"] = pa.array(labels[a:b], pa.list_(pa.int64()))
        pq.write_table(pa.table(columns), os.path.join(shard_dir, f"part-{k:04d}.parquet"),
                       row_group_size=row_group_size)
    return shard_dir


def pack_sides(tmp_path, shard_dir, name="out", engine="local", **overrides):
    values = dict(inputs=[shard_dir], output=str(tmp_path / name), context_length=C, pad_token=PAD,
                  read_batch_size=3, chunks_per_record_batch=2, extra_columns=["loss_mask"])
    values.update(overrides)
    return run_pack(make_config(values), engine=engine)


def read_columns(out: str) -> dict[str, np.ndarray]:
    """Plain pyarrow: every column of the files, (n, C) each, and dense doc ids."""
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    tables = [pa.ipc.open_file(os.path.join(out, f["path"])).read_all() for f in manifest["files"]]
    table = pa.concat_tables(tables)
    out_columns = {}
    for name in ["input_ids"] + [c["name"] for c in manifest.get("extra_columns", [])]:
        values = table.column(name).combine_chunks().flatten().to_numpy(zero_copy_only=False)
        out_columns[name] = values.reshape(-1, C)
    seg_ids = table.column("segment_doc_ids").combine_chunks().flatten().to_numpy()
    seg_lens = table.column("segment_lengths").combine_chunks().flatten().to_numpy()
    out_columns["doc_ids"] = np.repeat(seg_ids, seg_lens).reshape(-1, C)
    return out_columns


# ----------------------------------------------------------------------------- naive references


def naive_concat(records: list[list[tuple]], c: int, pad: tuple) -> list[list[tuple]]:
    """Concatenate the documents' (token, side...) records, chop every c, pad the last chunk."""
    stream = [(doc_id, record) for doc_id, doc in enumerate(records) for record in doc]
    chunks = [stream[i:i + c] for i in range(0, len(stream), c)]
    if chunks:
        chunks[-1] = chunks[-1] + [(-1, pad)] * (c - len(chunks[-1]))
    return chunks


def naive_best_fit(records: list[list[tuple]], shard_bounds: list[int], window: int, c: int,
                   pad: tuple) -> list[list[tuple]]:
    """best_fit's rules record by record: per shard, windows of ``window`` documents (0: the shard);
    pieces of c from each document's start; longest first into the fullest chunk that holds them
    (ties: opened first), else a new one; pieces inside a chunk by doc id, then padding."""
    out = []
    for lo, hi in zip(shard_bounds[:-1], shard_bounds[1:]):
        step = window or max(1, hi - lo)
        for first in range(lo, hi, step):
            pieces = [(d, records[d][at:at + c]) for d in range(first, min(hi, first + step))
                      for at in range(0, len(records[d]), c)]
            chunks: list[list[int]] = []
            for k in sorted(range(len(pieces)), key=lambda k: (-len(pieces[k][1]), k)):
                rooms = [(c - sum(len(pieces[j][1]) for j in chunk), i) for i, chunk in enumerate(chunks)]
                fits = [r for r in rooms if r[0] >= len(pieces[k][1])]
                if fits:
                    chunks[min(fits)[1]].append(k)
                else:
                    chunks.append([k])
            for chunk in chunks:
                row = [(pieces[j][0], record) for j in sorted(chunk, key=lambda j: pieces[j][0])
                       for record in pieces[j][1]]
                out.append(row + [(-1, pad)] * (c - len(row)))
    return out


def as_rows(columns: dict[str, np.ndarray], names: list[str]) -> list[list[tuple]]:
    """The output as the references give it: per chunk, (doc id, (token, side...)) per position."""
    rows = []
    for r in range(columns["input_ids"].shape[0]):
        rows.append([(int(columns["doc_ids"][r, i]), tuple(int(columns[n][r, i]) for n in ["input_ids", *names]))
                     for i in range(C)])
    return rows


# ----------------------------------------------------------------------------- literal cases


def test_concat_literal(tmp_path):
    docs = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]
    masks = [[0, 1, 1], [1, 0, 1, 0, 1, 0], [1]]
    shards = write_side_shards(tmp_path, docs, masks, [1])
    pack_sides(tmp_path, shards, extra_columns=["loss_mask=-1"])
    got = read_columns(str(tmp_path / "out"))
    assert got["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 0, 0, 0, 0, 0, 0]]
    assert got["loss_mask"].tolist() == [[0, 1, 1, 1, 0, 1, 0, 1], [0, 1, -1, -1, -1, -1, -1, -1]]
    assert got["loss_mask"].dtype == np.int8


def test_best_fit_literal_bool_column(tmp_path):
    docs = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12, 13, 14]]
    masks = [[True, False, True, False, True], [False, False, True], [True] * 6]
    shards = write_side_shards(tmp_path, docs, masks, [], mask_type=pa.bool_())
    pack_sides(tmp_path, shards, strategy="best_fit")
    got = read_columns(str(tmp_path / "out"))
    # best-fit decreasing: [14 (6)] opens chunk 0, [1..5] (5) opens chunk 1, [6 7 8] (3) fits chunk 1
    assert got["input_ids"].tolist() == [[9, 10, 11, 12, 13, 14, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8]]
    assert got["loss_mask"].tolist() == [[True] * 6 + [False] * 2,
                                         [True, False, True, False, True, False, False, True]]
    manifest = json.load(open(tmp_path / "out" / "manifest.json"))
    assert manifest["extra_columns"] == [{"name": "loss_mask", "type": "bool", "fill": 0}]


def test_tokens_only_output_has_no_side_traces(tmp_path):
    docs, masks = [[1, 2, 3]] * 5, [[1, 1, 1]] * 5
    shards = write_side_shards(tmp_path, docs, masks, [2])
    pack_sides(tmp_path, shards, name="plain", extra_columns=[])
    pack_sides(tmp_path, shards, name="sides")
    plain = json.load(open(tmp_path / "plain" / "manifest.json"))
    sides = json.load(open(tmp_path / "sides" / "manifest.json"))
    assert "extra_columns" not in plain
    assert pa.ipc.open_file(next((tmp_path / "plain").glob("chunks-*.arrow"))).schema.names == [
        "chunk_index", "input_ids", "segment_doc_ids", "segment_lengths"]
    assert plain["content_sha256"] != sides["content_sha256"]  # side values are part of the content


# ----------------------------------------------------------------------------- properties


@st.composite
def side_corpora(draw):
    lengths = draw(st.lists(st.one_of(st.integers(0, 3), st.integers(0, 20), st.sampled_from([7, 8, 9, 17])),
                            min_size=1, max_size=18))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    docs = [rng.integers(1, 1000, size=n).tolist() for n in lengths]
    masks = [rng.integers(-3, 4, size=n).tolist() for n in lengths]
    labels = [rng.integers(-100, 50_000, size=n).tolist() for n in lengths]
    cuts = sorted(draw(st.lists(st.integers(0, len(docs)), max_size=3)))
    return docs, masks, labels, cuts


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus=side_corpora(), strategy=st.sampled_from(["concat", "best_fit"]), read_batch_size=st.integers(1, 7),
       task_tokens=st.sampled_from([0, 10, 40]), window=st.sampled_from([0, 2, 3]), fill=st.integers(-128, 127),
       read_batch_tokens=st.sampled_from([5, 1 << 20]), long_docs=st.sampled_from(["split", "truncate", "drop"]))
def test_matches_naive_reference(tmp_path_factory, corpus, strategy, read_batch_size, task_tokens, window, fill,
                                 read_batch_tokens, long_docs):
    docs, masks, labels, cuts = corpus
    root = tmp_path_factory.mktemp("prop")
    shards = write_side_shards(root, docs, masks, cuts, labels=labels, row_group_size=2)
    pack_sides(root, shards, strategy=strategy, read_batch_size=read_batch_size, task_tokens=task_tokens,
               best_fit_window=window, read_batch_tokens=read_batch_tokens,
               extra_columns=[f"loss_mask={fill}", "labels=-100"], long_docs=long_docs)
    names = ["loss_mask", "labels"]
    records = [list(zip(d, m, lab)) for d, m, lab in zip(docs, masks, labels)]
    if long_docs == "truncate":  # every column of a longer document keeps its first C records
        records = [doc[:C] for doc in records]
    elif long_docs == "drop":
        records = [doc if len(doc) <= C else [] for doc in records]
    pad = (PAD, fill, -100)
    if strategy == "concat":
        expected = naive_concat(records, C, pad)
    else:
        expected = naive_best_fit(records, [0, *cuts, len(docs)], window, C, pad)
    out = str(root / "out")
    got = read_columns(out) if expected else None
    assert (as_rows(got, names) if got else []) == expected
    ds = read_packed(out)
    assert [c.name for c in ds.extra_columns] == names
    if len(ds):
        last = ds[len(ds) - 1]
        assert last["labels"].tolist() == got["labels"][-1].tolist()
        assert ds.get_batch(0, len(ds))["loss_mask"].tolist() == got["loss_mask"].tolist()


def test_the_property_test_splits_documents_and_shards(tmp_path):
    """Guard against a vacuous pass: the generated shapes do cut documents across chunks, files and tasks."""
    docs = [[5] * 9, [6] * 17, [7] * 3, [8] * 8]
    masks = [[1] * 9, [0] * 17, [1] * 3, [1] * 8]
    shards = write_side_shards(tmp_path, docs, masks, [1, 3], row_group_size=1)
    summary = pack_sides(tmp_path, shards, task_tokens=10)
    manifest = summary.manifest
    assert manifest["counts"]["split_documents"] >= 2 and len(manifest["files"]) >= 3


def test_jsonl_and_arrow_inputs(tmp_path):
    shard_dir = tmp_path / "mixed"
    shard_dir.mkdir()
    with open(shard_dir / "a.jsonl", "w") as f:
        f.write(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) + "\n")
        f.write(json.dumps({"input_ids": [4, 5], "loss_mask": [1, 0]}) + "\n")
    table = pa.table({"input_ids": pa.array([[6, 7, 8, 9]], pa.list_(pa.int32())),
                      "loss_mask": pa.array([[1, 1, 0, 1]], pa.list_(pa.int8()))})
    with pa.ipc.new_file(str(shard_dir / "b.arrow"), table.schema) as writer:
        writer.write_table(table)
    pack_sides(tmp_path, str(shard_dir), extra_columns=["loss_mask=7"])
    got = read_columns(str(tmp_path / "out"))
    assert got["loss_mask"].tolist() == [[0, 1, 1, 1, 0, 1, 1, 0], [1, 7, 7, 7, 7, 7, 7, 7]]
    assert got["loss_mask"].dtype == np.int64  # JSON numbers are int64; promoted with the Arrow shard's int8
    verify_output(str(tmp_path / "out"), [str(shard_dir)])


# ----------------------------------------------------------------------------- reading back


def test_verify_checks_side_columns_against_inputs(tmp_path):
    docs = [list(range(1, 12)), [20, 21, 22], list(range(30, 40))]
    masks = [[1] * 11, [0, 1, 0], [1, 0] * 5]
    shards = write_side_shards(tmp_path, docs, masks, [2])
    for strategy in ("concat", "best_fit"):
        out = str(tmp_path / strategy)
        pack_sides(tmp_path, shards, name=strategy, strategy=strategy)
        assert "  side columns     loss_mask int8 fill=0" in verify_output(out, [shards]).lines()
    changed = write_side_shards(tmp_path, docs, [[1] * 11, [0, 1, 1], [1, 0] * 5], [2], name="changed")
    for strategy in ("concat", "best_fit"):
        with pytest.raises(VerifyError, match=r"found doc id 1 token \(22, 0\).*expected doc id 1 token \(22, 1\)"):
            verify_output(str(tmp_path / strategy), [changed])


def test_verify_finds_a_changed_fill(tmp_path):
    shards = write_side_shards(tmp_path, [[1, 2, 3]], [[1, 1, 1]], [])
    pack_sides(tmp_path, shards)
    manifest_path = tmp_path / "out" / "manifest.json"
    manifest = json.load(open(manifest_path))
    manifest["extra_columns"][0]["fill"] = 5
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(VerifyError, match="raypack.extra_columns"):
        verify_output(str(tmp_path / "out"), [])


def test_verify_structure_checks_the_fill_on_padding(tmp_path):
    """A side value other than the fill on a padding position is named (the file's bytes and hash aside)."""
    from raypack.packed.manifest import load_manifest, resolve_output
    from raypack.verify import structure_class
    from raypack.verify.blocks import iter_blocks

    shards = write_side_shards(tmp_path, [[1, 2, 3], [4, 5, 6, 7, 8, 9]], [[1, 1, 1], [0] * 6], [])
    for strategy in ("concat", "best_fit"):
        pack_sides(tmp_path, shards, name=strategy, strategy=strategy, extra_columns=["loss_mask=-1"])
        out = str(tmp_path / strategy)
        manifest = load_manifest(out)
        fs, base = resolve_output(out)
        blocks = [b for entry in manifest["files"] for b in iter_blocks(fs, base, entry, manifest, 1024)]
        structure = structure_class(manifest)(manifest)
        for block in blocks[:-1]:
            structure.pieces(block)
        records = blocks[-1].input_ids.copy()
        records[-1, -1]["loss_mask"] = 0  # the last position is padding in both layouts
        with pytest.raises(VerifyError, match=r"token \(0, 0\), expected pad_token \(0, -1\)"):
            structure.pieces(blocks[-1]._replace(input_ids=records))
            structure.flush()


def test_manifest_extra_columns_are_checked(tmp_path):
    shards = write_side_shards(tmp_path, [[1, 2, 3]], [[1, 1, 1]], [])
    pack_sides(tmp_path, shards)
    manifest = json.load(open(tmp_path / "out" / "manifest.json"))
    check_manifest(manifest, "m")
    bad_entries = [[], [{"name": "input_ids", "type": "int8", "fill": 0}],
                   [{"name": "m", "type": "float32", "fill": 0}],
                   [{"name": "m", "type": "bool", "fill": 2}], [{"name": "m", "type": "int8", "fill": 0, "x": 1}],
                   [{"name": "m", "type": "int8", "fill": 0}, {"name": "m", "type": "int8", "fill": 0}]]
    for entry in bad_entries:
        with pytest.raises(InputError, match="m: extra_columns"):
            check_manifest({**manifest, "extra_columns": entry}, "m")


def test_stats_lists_side_columns(tmp_path):
    shards = write_side_shards(tmp_path, [[1, 2, 3], [4, 5, 6, 7]], [[0, 1, 1], [1, 0, 0, 0]], [])
    pack_sides(tmp_path, shards, extra_columns=["loss_mask=9"])
    lines = packing_stats(str(tmp_path / "out")).lines()
    assert "  loss_mask (int8)  3 (42.86% of tokens)" in lines  # padding (fill 9) not counted


def test_collate_uses_loss_mask_and_labels(tmp_path):
    torch_data = pytest.importorskip("raypack.torch_data")
    docs = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    masks = [[0, 0, 1, 1, 1], [0, 1, 1, 0, 1, 1]]
    labels = [[11, 12, 13, 14, 15], [16, 17, 18, 19, 20, 21]]
    shards = write_side_shards(tmp_path, docs, masks, [], labels=labels)
    pack_sides(tmp_path, shards, name="mask")
    pack_sides(tmp_path, shards, name="both", extra_columns=["loss_mask", "labels=5"])
    ds = read_packed(str(tmp_path / "mask"))
    batch = torch_data.collate_packed([ds[0], ds[1]], attention="varlen")
    assert batch["labels"].tolist() == [[-100, -100, 3, 4, 5, -100, 7, 8], [-100, 10, 11, -100, -100, -100, -100, -100]]
    both = read_packed(str(tmp_path / "both"))
    batch = torch_data.collate_packed([both[0], both[1]], attention="varlen", pad_to_multiple_of=3)
    assert batch["labels"].tolist() == [[-100, -100, 13, 14, 15, -100, 17, 18, -100],
                                        [-100, 20, 21, -100, -100, -100, -100, -100, -100]]
    plain = torch_data.collate_packed([{"input_ids": ds[1]["input_ids"], "doc_ids": ds[1]["doc_ids"]}])
    assert plain["labels"].tolist() == [[9, 10, 11, -100, -100, -100, -100, -100]]  # tokens only: unchanged


# ----------------------------------------------------------------------------- bad input


def test_length_mismatch_names_file_row_and_both_lengths(tmp_path):
    docs = [[1, 2], [3, 4, 5, 6, 7, 8, 9, 10, 11]]
    masks = [[1, 1], [1] * 7]
    shards = write_side_shards(tmp_path, docs, masks, [])
    path = os.path.join(shards, "part-0000.parquet")
    for strategy in ("concat", "best_fit"):
        with pytest.raises(InputError, match=rf"^shard {path} row 1: column loss_mask has 7 values, input_ids has "
                                             r"9; each side column needs one value per token$"):
            pack_sides(tmp_path, shards, name=strategy, strategy=strategy)


def test_null_side_row_and_value(tmp_path):
    shards = write_side_shards(tmp_path, [[1, 2], [3]], [[1, 1], None], [])
    with pytest.raises(InputError, match=r"row 1: column loss_mask has no list \(null\), input_ids has 1"):
        pack_sides(tmp_path, shards)
    shards = write_side_shards(tmp_path, [[1, 2], [3]], [[1, None], [1]], [], name="nullvalue")
    with pytest.raises(InputError, match=r"row 0: column loss_mask holds a null value"):
        pack_sides(tmp_path, shards, name="out2")


def test_jsonl_missing_key_on_a_line(tmp_path):
    (tmp_path / "in").mkdir()
    shard = tmp_path / "in" / "a.jsonl"
    shard.write_text(json.dumps({"input_ids": [1, 2], "loss_mask": [1, 1]}) + "\n" + json.dumps({"input_ids": [3]})
                     + "\n")
    with pytest.raises(InputError, match=rf"shard {shard} row 1: column loss_mask has no list \(null\)"):
        pack_sides(tmp_path, str(shard))


def test_jsonl_booleans_are_refused_in_one_line(tmp_path):
    (tmp_path / "in").mkdir()
    shard = tmp_path / "in" / "a.jsonl"
    shard.write_text(json.dumps({"input_ids": [1, 2], "loss_mask": [True, False]}) + "\n")
    with pytest.raises(InputError, match=r"whose 'input_ids', 'loss_mask' are lists of integers \(int64; write "
                                         r"booleans as 0/1\)") as raised:
        pack_sides(tmp_path, str(shard))
    assert "\n" not in str(raised.value)


def test_non_integer_and_missing_columns_refused_before_packing(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    path = shards / "a.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2]], pa.list_(pa.int32())),
                             "weights": pa.array([[0.5, 1.0]], pa.list_(pa.float32())),
                             "flag": pa.array([1], pa.int8())}), path)
    with pytest.raises(InputError, match=rf"^shard {path} column 'weights' has type list<\w+: float>; an extra "
                                         r"column must be a list of integers or bools"):
        pack_sides(tmp_path, str(shards), extra_columns=["weights"])
    with pytest.raises(InputError, match=r"column 'flag' has type int8"):
        pack_sides(tmp_path, str(shards), extra_columns=["flag"])
    with pytest.raises(InputError, match=rf"^shard {path} has no column 'loss_mask' \(an extra column\)"):
        pack_sides(tmp_path, str(shards))
    assert not (tmp_path / "out").exists()


def test_config_refusals(tmp_path):
    base = dict(inputs=["x"], output=str(tmp_path / "o"), context_length=8)
    for columns, message in [(["a", "a"], "distinct"), (["input_ids"], "other than"), (["doc_ids"], "other than"),
                             (["a=x"], "FILL must be an integer"), ("loss_mask", "must be a list")]:
        with pytest.raises(InputError, match=message):
            make_config({**base, "extra_columns": columns})
    with pytest.raises(InputError, match="text has no per-token columns"):
        make_config({**base, "extra_columns": ["loss_mask"], "tokenizer": "tok.json"})


def test_token_that_does_not_fit_the_token_dtype(tmp_path):
    shards = write_side_shards(tmp_path, [[1, 2], [3, 300]], [[1, 1], [1, 1]], [])
    with pytest.raises(InputError, match=r"row 1: token 300 does not fit the output token dtype uint8"):
        pack_sides(tmp_path, shards, token_dtype="uint8")


def test_fill_must_fit_the_type(tmp_path):
    shards = write_side_shards(tmp_path, [[1, 2]], [[True, False]], [], mask_type=pa.bool_())
    with pytest.raises(InputError, match=r"extra column loss_mask: fill=2 does not fit its type bool \(0\.\.1\)"):
        pack_sides(tmp_path, shards, extra_columns=["loss_mask=2"])


def test_cli_flag_toml_and_refusals(tmp_path, capsys):
    shards = write_side_shards(tmp_path, [[1, 2, 3]], [[1, 0, 1]], [])
    config = tmp_path / "c.toml"
    config.write_text('context_length = 4\nextra_columns = ["loss_mask=3"]\n')
    assert main(["pack", "--config", str(config), "--input", shards, "--output", str(tmp_path / "a"), "--local"]) == 0
    assert main(["pack", "--context-length", "4", "--extra-columns", "loss_mask=3", "--input", shards, "--output",
                 str(tmp_path / "b"), "--local"]) == 0
    assert file_digests(str(tmp_path / "a")) == file_digests(str(tmp_path / "b"))
    assert read_packed(str(tmp_path / "a"))[0]["loss_mask"].tolist() == [1, 0, 1, 3]
    capsys.readouterr()
    assert main(["pack", "--context-length", "4", "--extra-columns", "loss_mask", "--tokenizer", "t.json",
                 "--input", shards, "--output", str(tmp_path / "c"), "--local"]) == 2
    assert "text has no per-token columns" in capsys.readouterr().err
    for fmt in ("megatron", "mds"):
        assert main(["export", str(tmp_path / "a"), "--format", fmt, "--output", str(tmp_path / f"e-{fmt}")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"has side columns (loss_mask); the {fmt} format has no place for them" in err


# ----------------------------------------------------------------------------- resume and transport


def test_resume_treats_other_side_columns_as_another_job():
    from raypack.pack.resume import _fragment_from_dict, _fragment_to_dict, _output_settings
    from raypack.pack.tasks import PackSettings
    from raypack.rules.side_columns import SideColumn, combine, opaque

    base = dict(out_dir="o", context_length=4, pad_token=0, token_dtype="int32", token_column="input_ids",
                read_batch_size=0, read_batch_tokens=8, chunks_per_record_batch=2, strategy="concat")
    plain = PackSettings(**base)
    mask = PackSettings(**base, extra_columns=(SideColumn("loss_mask", "int8", 0),))
    other_fill = PackSettings(**base, extra_columns=(("loss_mask", "int8", 1),))
    assert "extra_columns" not in _output_settings(plain)  # tokens-only records keep their form
    settings = [_output_settings(s) for s in (plain, mask, other_fill)]
    assert len({json.dumps(s, sort_keys=True) for s in settings}) == 3
    assert _output_settings(mask) == json.loads(json.dumps(_output_settings(mask)))  # survives the JSON record
    from raypack.rules.core import Fragment

    tokens = opaque(combine(np.array([5, 6], np.int32), [np.array([1, 0], np.int8)], mask.record_dtype))
    fragment = Fragment(3, tokens, np.array([7], np.int64), np.array([2], np.int32))
    back = _fragment_from_dict(json.loads(json.dumps(_fragment_to_dict(fragment, mask))), mask)
    assert back.input_ids.dtype == mask.packed_dtype
    assert back.input_ids.view(mask.record_dtype).tolist() == [(5, 1), (6, 0)]


def test_fragments_travel_with_their_side_values():
    """A packer's edge fragments reach the driver as one Arrow row (the Ray engine's transport)."""
    from raypack.pack.tasks import ShardResult, result_to_table, table_to_results
    from raypack.rules.core import Fragment
    from raypack.rules.side_columns import SideColumn, combine, opaque, packed_dtype, record_dtype

    columns = [SideColumn("loss_mask", "bool", 0), SideColumn("labels", "int64", -100)]
    record = record_dtype("int32", columns)
    tokens = combine(np.array([5, 6, 7], np.int32), [np.array([True, False, True]), np.array([1, -100, 3])], record)
    head = Fragment(8, opaque(tokens), np.array([2], np.int64), np.array([3], np.int32))
    result = ShardResult(0, None, head, None, 1, 1, 3, 0)
    (back,) = table_to_results(result_to_table(result, pa.int32(), record))
    assert back.tail is None and back.head.input_ids.dtype == packed_dtype("int32", columns)
    assert back.head.input_ids.view(record).tolist() == [(5, True, 1), (6, False, -100), (7, True, 3)]


def test_ray_engine_matches_local(tmp_path, ray_session):
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 100, size=n).tolist() for n in rng.integers(0, 20, size=30)]
    masks = [rng.integers(0, 2, size=len(d)).tolist() for d in docs]
    shards = write_side_shards(tmp_path, docs, masks, [7, 19], row_group_size=4)
    for strategy, long_docs in (("concat", "drop"), ("best_fit", "truncate")):  # with a policy, to cover it too
        options = dict(strategy=strategy, task_tokens=40, long_docs=long_docs)
        pack_sides(tmp_path, shards, name=f"local-{strategy}", **options)
        pack_sides(tmp_path, shards, name=f"ray-{strategy}", engine="ray", **options)
        assert file_digests(str(tmp_path / f"local-{strategy}")) == file_digests(str(tmp_path / f"ray-{strategy}"))
    torch_data = pytest.importorskip("raypack.torch_data")
    ds = read_packed(str(tmp_path / "ray-best_fit"))
    rows = ds.to_ray_dataset().take_all()
    assert [list(r["loss_mask"]) for r in rows] == ds.get_batch(0, len(ds))["loss_mask"].tolist()
    streamed = next(torch_data.iter_ray_batches(ds, batch_size=4, attention="varlen"))
    assert streamed["labels"].tolist() == torch_data.collate_packed([ds[i] for i in range(4)])["labels"].tolist()


def test_training_chat_example(tmp_path, monkeypatch):
    """docs/TRAINING.md's chat example runs as written, with a tokenizer built here (nothing downloaded)."""
    pytest.importorskip("raypack.torch_data")
    tokenizers = pytest.importorskip("tokenizers")
    from helpers import train_byte_level_bpe

    tok = train_byte_level_bpe(["What is 2 + 2? 4. Name a colour. Blue. Green. Say hello. Hello!"] * 4, 300)
    tok.add_special_tokens(["<|user|>", "<|assistant|>", "<|end|>"])
    assert isinstance(tok, tokenizers.Tokenizer)
    tok.save(str(tmp_path / "tokenizer.json"))
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "TRAINING.md")).read()
    section = text.split("## Chat data: train only on the assistant's replies", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/TRAINING.md", "exec"), {"__name__": "training_chat_example"})
    manifest = json.load(open(tmp_path / "packed-chats" / "manifest.json"))
    assert manifest["extra_columns"] == [{"name": "loss_mask", "type": "int8", "fill": 0}]
