"""verify_output: a clean output passes; each corruption is caught by the check that targets it,
with a message naming where. Corruptions are made with plain pyarrow, and the manifest's hashes
are fixed up afterwards whenever the test aims past the hash check."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.errors import InputError
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.packed.writer import chunk_file_name
from raypack.verify import VerifyError, VerifyReport, verify_output

from reference import naive_content_sha256

C = 8

# ----------------------------------------------------------------------------- corpus and output


def make_docs(seed: int = 0, num_docs: int = 60) -> list[list[int]]:
    """Random documents with empty ones and ones spanning 3+ chunks; tokens in 1..999 (never the pad)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 14, size=num_docs)
    lengths[[3, 4, 30]] = 0
    lengths[[10, 45]] = [3 * C + 1, 2 * C + 5]
    return [rng.integers(1, 1000, size=n).tolist() for n in lengths]


def write_shards(root, docs: list[list[int]], cuts: list[int]) -> str:
    shard_dir = os.path.join(root, "shards")
    os.makedirs(shard_dir, exist_ok=True)
    bounds = [0, *cuts, len(docs)]
    for k in range(len(bounds) - 1):
        table = pa.table({"input_ids": pa.array(docs[bounds[k]: bounds[k + 1]], pa.list_(pa.int32()))})
        pq.write_table(table, shard_path(shard_dir, k))
    return shard_dir


def shard_path(shard_dir: str, k: int) -> str:
    return os.path.join(shard_dir, f"part-{k:04d}.parquet")


def pack(tmp_path, docs=None, cuts=(20, 41), **overrides) -> tuple[str, str, list[list[int]]]:
    """Pack ``docs`` (default make_docs()) split into shards at ``cuts``; return (out, shard_dir, docs)."""
    docs = make_docs() if docs is None else docs
    shard_dir = write_shards(tmp_path, docs, list(cuts))
    values = dict(inputs=[shard_dir], output=str(tmp_path / "out"), context_length=C, pad_token=0,
                  read_batch_size=3)
    values.update(overrides)
    run_pack(make_config(values), engine="local")
    return str(tmp_path / "out"), shard_dir, docs


def read_dense(out: str) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, doc_ids), both (n, C), read with plain pyarrow as docs/FORMAT.md describes."""
    paths = sorted(glob.glob(os.path.join(out, "chunks-*.arrow")))
    table = pa.concat_tables(pa.ipc.open_file(p).read_all() for p in paths)
    input_ids = table["input_ids"].combine_chunks().flatten().to_numpy().reshape(-1, C)
    seg_ids = table["segment_doc_ids"].combine_chunks().flatten().to_numpy()
    seg_lens = table["segment_lengths"].combine_chunks().flatten().to_numpy()
    return input_ids, np.repeat(seg_ids, seg_lens).reshape(-1, C)


def segments(out: str) -> list[tuple[list[int], list[int]]]:
    """Per chunk: (segment_doc_ids, segment_lengths)."""
    paths = sorted(glob.glob(os.path.join(out, "chunks-*.arrow")))
    table = pa.concat_tables(pa.ipc.open_file(p).read_all() for p in paths)
    return list(zip(table["segment_doc_ids"].to_pylist(), table["segment_lengths"].to_pylist()))


# ----------------------------------------------------------------------------- corrupting helpers


def load_manifest(out: str) -> dict[str, Any]:
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def save_manifest(out: str, manifest: dict[str, Any]) -> None:
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)


def refresh_hashes(out: str) -> None:
    """Make the manifest vouch for the files as they are now (sha256, num_bytes, content_sha256),
    renamed to their content-addressed names."""
    manifest = load_manifest(out)
    for entry in manifest["files"]:
        data = open(os.path.join(out, entry["path"]), "rb").read()
        entry["sha256"], entry["num_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
        name = chunk_file_name(entry["first_chunk"], entry["sha256"])
        os.replace(os.path.join(out, entry["path"]), os.path.join(out, name))
        entry["path"] = name
    save_manifest(out, manifest)
    manifest["content_sha256"] = naive_content_sha256(out)
    save_manifest(out, manifest)


def file_of_chunk(out: str, chunk: int) -> tuple[str, int]:
    """(file name, row in that file) holding global ``chunk``."""
    for entry in load_manifest(out)["files"]:
        if entry["first_chunk"] <= chunk < entry["first_chunk"] + entry["num_chunks"]:
            return entry["path"], chunk - entry["first_chunk"]
    raise AssertionError(f"no file holds chunk {chunk}")


def edit_chunk(out: str, chunk: int, column: str, edit: Callable[[list], list]) -> None:
    """Rewrite the file holding ``chunk`` with ``edit`` applied to that row's ``column``; fix hashes."""
    name, row = file_of_chunk(out, chunk)
    path = os.path.join(out, name)
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
        schema = table.schema
        columns = {c: table[c].to_pylist() for c in schema.names}  # a copy: the file is overwritten below
    value = columns[column][row]
    columns[column][row] = edit(list(value) if isinstance(value, list) else value)
    new = pa.table({c: pa.array(v, schema.field(c).type) for c, v in columns.items()}, schema=schema)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(new)
    refresh_hashes(out)


def replace_at(values: list, index: int, value) -> list:
    values[index] = value
    return values


# ----------------------------------------------------------------------------- clean output


def test_corpus_is_not_vacuous(tmp_path):
    """The corpus splits documents, spans shards and files, holds empty documents and padding."""
    out, _, docs = pack(tmp_path)
    manifest = load_manifest(out)
    counts = manifest["counts"]
    assert len(manifest["files"]) >= 3 and len(manifest["shards"]) == 3
    assert counts["split_documents"] > 0 and counts["padding_positions"] > 0
    assert any(len(d) == 0 for d in docs) and any(len(d) > 2 * C for d in docs)
    _, doc_ids = read_dense(out)
    spans = [np.unique(np.flatnonzero((doc_ids == i).any(axis=1))).size for i in range(len(docs))]
    assert max(spans) >= 3  # one document runs through three chunks or more


@pytest.mark.parametrize("batch_chunks", [1, 3, 1024])
@pytest.mark.parametrize("chunks_per_record_batch", [2, 512])
def test_clean_output_verifies_with_and_without_inputs(tmp_path, batch_chunks, chunks_per_record_batch):
    out, shard_dir, docs = pack(tmp_path, chunks_per_record_batch=chunks_per_record_batch)
    counts = load_manifest(out)["counts"]
    with_default = verify_output(out, batch_chunks=batch_chunks)
    with_explicit = verify_output(out, [shard_dir], batch_chunks=batch_chunks)
    without = verify_output(out, [], batch_chunks=batch_chunks)
    assert with_default.inputs_compared and with_explicit.inputs_compared and not without.inputs_compared
    assert with_default.num_shards == 3 and without.num_shards == 0
    for report in (with_default, with_explicit, without):
        assert isinstance(report, VerifyReport)
        assert (report.num_chunks, report.num_tokens, report.num_padding_positions,
                report.num_documents, report.num_split_documents) == (
            counts["chunks"], counts["tokens"], counts["padding_positions"],
            counts["documents"], counts["split_documents"])
        assert report.num_tokens == sum(map(len, docs))
        assert report.num_files == len(load_manifest(out)["files"])
    lines = with_default.lines()
    assert lines[0] == f"verified {out}" and any("unpack(pack(x)) == x" in line for line in lines)
    assert any(line.endswith("not compared (--no-inputs)") for line in without.lines())


def test_jsonl_and_arrow_inputs_verify(tmp_path):
    docs = make_docs(1)
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    with open(shard_dir / "a.jsonl", "w") as f:
        f.writelines(json.dumps({"input_ids": d}) + "\n" for d in docs[:25])
    with pa.OSFile(str(shard_dir / "b.arrow"), "wb") as sink:
        table = pa.table({"input_ids": pa.array(docs[25:], pa.list_(pa.uint16()))})
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    run_pack(make_config(dict(inputs=[str(shard_dir)], output=str(tmp_path / "out"), context_length=C,
                              pad_token=0, read_batch_size=3)), engine="local")
    assert verify_output(str(tmp_path / "out")).inputs_compared


def test_output_of_empty_documents_only_verifies(tmp_path):
    out, _, _ = pack(tmp_path, docs=[[], [], []], cuts=[1])
    report = verify_output(out)
    assert report.inputs_compared and (report.num_chunks, report.num_tokens, report.num_documents) == (0, 0, 3)


def test_inputs_gone_are_not_compared_by_default(tmp_path):
    out, shard_dir, _ = pack(tmp_path)
    shutil.rmtree(shard_dir)
    report = verify_output(out)
    assert not report.inputs_compared
    # said in the report's inputs line (it was a warning logged before the checks, above any failure's line)
    line = next(line for line in report.lines() if line.startswith("  inputs "))
    assert line.endswith(f"not compared (3 of the manifest's shards are gone (e.g. {shard_dir}/"
                         f"{os.path.basename(load_manifest(out)['shards'][0]['path'])}); pass --input where they are "
                         "now)"), line


def test_batch_chunks_must_be_positive(tmp_path):
    out, _, _ = pack(tmp_path)
    with pytest.raises(ValueError, match=r"batch_chunks=0 must be an integer >= 1"):
        verify_output(out, batch_chunks=0)


# ----------------------------------------------------------------------------- 1. manifest and files


def test_missing_manifest(tmp_path):
    out, _, _ = pack(tmp_path)
    os.remove(os.path.join(out, "manifest.json"))
    with pytest.raises(VerifyError, match=r"is incomplete: no manifest.json; the job did not finish"):
        verify_output(out)


def test_manifest_not_json(tmp_path):
    out, _, _ = pack(tmp_path)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(VerifyError, match=r"manifest.json: not valid JSON"):
        verify_output(out)


def test_flipped_token_byte_fails_the_hash(tmp_path):
    out, _, _ = pack(tmp_path)
    name = load_manifest(out)["files"][0]["path"]
    path = os.path.join(out, name)
    data = bytearray(open(path, "rb").read())
    input_ids, _ = read_dense(out)
    at = data.find(input_ids[0].astype("<i4").tobytes())  # chunk 0's tokens, in the token buffer
    assert at >= 0
    data[at + 4 * 3] ^= 0x01  # the low byte of chunk 0's token 3
    open(path, "wb").write(bytes(data))
    with pytest.raises(VerifyError, match=rf"{re.escape(name)}: sha256 [0-9a-f]{{64}} differs from the manifest's"):
        verify_output(out)


def test_missing_file(tmp_path):
    out, _, _ = pack(tmp_path)
    entry = load_manifest(out)["files"][1]
    os.remove(os.path.join(out, entry["path"]))
    last = entry["first_chunk"] + entry["num_chunks"] - 1
    with pytest.raises(VerifyError, match=rf"{re.escape(entry['path'])}: missing \(the manifest lists it "
                                          rf"for chunks {entry['first_chunk']}..{last}\)"):
        verify_output(out)


def test_extra_file(tmp_path):
    out, _, _ = pack(tmp_path)
    first = load_manifest(out)["files"][0]["path"]
    shutil.copy(os.path.join(out, first), os.path.join(out, "chunks-000000999999.arrow"))
    with pytest.raises(VerifyError, match=r"chunks-000000999999.arrow: a chunk file the manifest does not list"):
        verify_output(out)


def test_stray_files_in_an_output_are_said_not_failed(tmp_path, caplog):
    """A hostile trial: notes.txt and a folder in an output passed without a word; a published output holds only
    its manifest and files (pack --overwrite refuses the rest), so verify names them, and still passes."""
    out, _, _ = pack(tmp_path)
    verify_output(out)
    assert not [r for r in caplog.records if "does not list" in r.getMessage()]
    open(os.path.join(out, "notes.txt"), "w").write("mine")
    os.mkdir(os.path.join(out, "sub"))
    with caplog.at_level("WARNING", logger="raypack"):
        verify_output(out)
    said = [r.getMessage() for r in caplog.records if "does not list" in r.getMessage()]
    assert said == [f"{out} holds 'notes.txt' and 1 more, which the manifest does not list: a published output holds "
                    "only manifest.json and its files (pack --overwrite refuses what it did not write); move it "
                    "away"], said


def test_wrong_content_sha256(tmp_path):
    out, _, _ = pack(tmp_path)
    manifest = load_manifest(out)
    manifest["content_sha256"] = "0" * 64
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=r"manifest.json: content_sha256=0{64}, but the chunks hash to [0-9a-f]{64}"):
        verify_output(out)


def test_edited_chunk_fails_content_sha256(tmp_path):
    """A token changed and the file's sha256 vouched for again, content_sha256 left: verify fails on
    the content digest (without inputs nothing else can see it)."""
    out, _, _ = pack(tmp_path)
    manifest = load_manifest(out)
    edit_chunk(out, 5, "input_ids", lambda ids: replace_at(ids, 2, ids[2] + 1))
    edited = load_manifest(out)
    assert edited["files"] != manifest["files"] and edited["content_sha256"] != manifest["content_sha256"]
    edited["content_sha256"] = manifest["content_sha256"]
    save_manifest(out, edited)
    with pytest.raises(VerifyError, match="content_sha256=.*but the chunks hash to"):
        verify_output(out, [])


def test_content_sha256_is_the_format_definition(tmp_path):
    """The manifest's content_sha256 equals the naive reference of docs/FORMAT.md, and verify passes."""
    out, _, _ = pack(tmp_path)
    assert load_manifest(out)["content_sha256"] == naive_content_sha256(out)
    verify_output(out)


def test_file_list_must_tile_the_chunks(tmp_path):
    out, _, _ = pack(tmp_path)
    manifest = load_manifest(out)
    manifest["files"][1]["first_chunk"] += 1
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=r"files\[1\].*the name does not match first_chunk=\d+"):
        verify_output(out)
    refresh_hashes(out)  # renamed after its new first chunk
    with pytest.raises(VerifyError, match=r"files\[1\].*first_chunk=\d+, expected \d+"):
        verify_output(out)


@pytest.mark.parametrize("key", ["tokens", "chunks", "padding_positions", "split_documents", "documents"])
def test_manifest_with_a_wrong_count(tmp_path, key):
    out, _, _ = pack(tmp_path)
    manifest = load_manifest(out)
    manifest["counts"][key] += 1
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=rf"counts\.{key}={manifest['counts'][key]} but "):
        verify_output(out, [])


def test_documents_below_the_largest_doc_id(tmp_path):
    out, _, docs = pack(tmp_path)
    manifest = load_manifest(out)
    del manifest["shards"]  # the shard totals would catch it first
    manifest["counts"]["documents"] = len(docs) - 2  # the last document is not empty
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=rf"counts.documents={len(docs) - 2} but the output holds doc id "
                                          rf"{len(docs) - 1}; documents must be >= max doc id \+ 1"):
        verify_output(out)


def test_documents_above_the_inputs(tmp_path):
    out, shard_dir, docs = pack(tmp_path)
    manifest = load_manifest(out)
    del manifest["shards"]
    manifest["counts"]["documents"] += 1
    save_manifest(out, manifest)
    verify_output(out)  # >= max doc id + 1, and no inputs known: fine
    with pytest.raises(VerifyError, match=rf"counts.documents={len(docs) + 1} but the inputs hold {len(docs)}"):
        verify_output(out, [shard_dir])


# ----------------------------------------------------------------------------- 2. structure


def test_token_changed_with_hashes_updated_is_caught_by_the_inputs(tmp_path):
    out, shard_dir, docs = pack(tmp_path)
    chunk, position = 5, 3
    input_ids, doc_ids = read_dense(out)
    old, doc = int(input_ids[chunk, position]), int(doc_ids[chunk, position])
    starts = np.cumsum([0] + [len(d) for d in docs])
    offset = chunk * C + position - int(starts[doc])
    shard, row = (0, doc) if doc < 20 else (1, doc - 20) if doc < 41 else (2, doc - 41)
    assert docs[doc][offset] == old
    edit_chunk(out, chunk, "input_ids", lambda ids: replace_at(ids, position, old + 1))
    verify_output(out, [])  # hashes fixed up, structure intact: only the inputs can tell
    pattern = (rf"output chunk {chunk} position {position} \(chunks-\d+-[0-9a-f]{{16}}\.arrow\): found doc id {doc} token "
               rf"{old + 1}; input shard {re.escape(shard_path(shard_dir, shard))} row {row} \(doc id {doc}, "
               rf"token {offset} of {len(docs[doc])}\): expected doc id {doc} token {old}")
    with pytest.raises(VerifyError, match=pattern):
        verify_output(out)


def test_doc_id_decreasing_within_a_chunk(tmp_path):
    out, _, _ = pack(tmp_path)
    chunk = next(i for i, (ids, _) in enumerate(segments(out)) if len(ids) >= 2 and ids[0] >= 1 and i > 2)
    ids, lens = segments(out)[chunk]
    edit_chunk(out, chunk, "segment_doc_ids", lambda s: replace_at(s, 1, ids[0] - 1))
    with pytest.raises(VerifyError, match=rf"output chunk {chunk} position {lens[0]} .*segment doc id "
                                          rf"{ids[0] - 1} follows doc id {ids[0]}"):
        verify_output(out, [])


def test_doc_id_repeated_within_a_chunk(tmp_path):
    out, _, _ = pack(tmp_path)
    chunk = next(i for i, (ids, _) in enumerate(segments(out)) if len(ids) >= 2 and i > 2)
    ids, lens = segments(out)[chunk]
    edit_chunk(out, chunk, "segment_doc_ids", lambda s: replace_at(s, 1, ids[0]))
    with pytest.raises(VerifyError, match=rf"output chunk {chunk} position {lens[0]} .*segment doc id "
                                          rf"{ids[0]} follows doc id {ids[0]}; .*a repeat is allowed only"):
        verify_output(out, [])


def test_doc_id_decreasing_across_a_chunk_boundary(tmp_path):
    out, _, _ = pack(tmp_path)
    segs = segments(out)
    chunk = next(i for i in range(1, len(segs) - 1) if len(segs[i][0]) == 1 and segs[i - 1][0][-1] >= 1)
    previous = segs[chunk - 1][0][-1]
    edit_chunk(out, chunk, "segment_doc_ids", lambda s: [previous - 1])
    with pytest.raises(VerifyError, match=rf"output chunk {chunk} position 0 .*segment doc id {previous - 1} "
                                          rf"follows doc id {previous}"):
        verify_output(out, [])


def test_padding_in_the_middle(tmp_path):
    out, _, _ = pack(tmp_path)
    chunk = 4
    ids, lens = segments(out)[chunk]
    edit_chunk(out, chunk, "segment_doc_ids", lambda s: replace_at(s, len(s) - 1, -1))
    num_chunks = load_manifest(out)["counts"]["chunks"]
    with pytest.raises(VerifyError, match=rf"output chunk {chunk} position {C - lens[-1]} .*padding \(doc id -1\) "
                                          rf"in chunk {chunk} segment {len(ids) - 1}; padding may only be the "
                                          rf"last segment of the last chunk \({num_chunks - 1}\)"):
        verify_output(out, [])


def test_padding_holds_the_pad_token(tmp_path):
    out, _, _ = pack(tmp_path)
    last = load_manifest(out)["counts"]["chunks"] - 1
    edit_chunk(out, last, "input_ids", lambda ids: replace_at(ids, C - 1, 7))
    with pytest.raises(VerifyError, match=rf"output chunk {last} position {C - 1} .*padding token 7, "
                                          r"expected pad_token 0"):
        verify_output(out, [])


def test_a_chunk_of_padding_only(tmp_path):
    out, _, _ = pack(tmp_path)
    last = load_manifest(out)["counts"]["chunks"] - 1
    edit_chunk(out, last, "segment_doc_ids", lambda _: [-1])
    edit_chunk(out, last, "segment_lengths", lambda _: [C])
    with pytest.raises(VerifyError, match=rf"output chunk {last} position 0 .*chunk {last} is all padding"):
        verify_output(out, [])


def test_negative_doc_id_other_than_padding(tmp_path):
    out, _, _ = pack(tmp_path)
    edit_chunk(out, 2, "segment_doc_ids", lambda s: replace_at(s, 0, -5))
    with pytest.raises(VerifyError, match=r"output chunk 2 position 0 .*doc id -5 is negative"):
        verify_output(out, [])


def test_segment_lengths_must_sum_to_context_length(tmp_path):
    out, _, _ = pack(tmp_path)
    edit_chunk(out, 3, "segment_lengths", lambda s: replace_at(s, 0, s[0] + 1))
    name, row = file_of_chunk(out, 3)
    with pytest.raises(VerifyError, match=rf"{re.escape(name)} row {row} \(chunk 3\): segment lengths sum to "
                                          rf"{C + 1}, expected the context length {C}"):
        verify_output(out, [])


def test_chunk_index_must_run_in_order(tmp_path):
    out, _, _ = pack(tmp_path)
    edit_chunk(out, 3, "chunk_index", lambda _: 7)
    name, row = file_of_chunk(out, 3)
    with pytest.raises(VerifyError, match=rf"{re.escape(name)} row {row}: chunk_index=7, expected 3"):
        verify_output(out, [])


# ----------------------------------------------------------------------------- 3. inputs


def test_input_shard_changed_after_packing(tmp_path):
    out, shard_dir, docs = pack(tmp_path)
    shard, row, offset = 1, 4, 2
    doc = 20 + row
    assert len(docs[doc]) > offset
    changed = [list(d) for d in docs[20:41]]
    old = changed[row][offset]
    changed[row][offset] = old + 1
    pq.write_table(pa.table({"input_ids": pa.array(changed, pa.list_(pa.int32()))}), shard_path(shard_dir, shard))
    position = sum(len(d) for d in docs[:doc]) + offset
    pattern = (rf"output chunk {position // C} position {position % C} .*found doc id {doc} token {old}; "
               rf"input shard {re.escape(shard_path(shard_dir, shard))} row {row} \(doc id {doc}, token {offset} "
               rf"of {len(docs[doc])}\): expected doc id {doc} token {old + 1}")
    with pytest.raises(VerifyError, match=pattern):
        verify_output(out)
    verify_output(out, [])  # the output itself is intact


def test_input_document_added_after_packing(tmp_path):
    out, shard_dir, docs = pack(tmp_path)
    pq.write_table(pa.table({"input_ids": pa.array(docs[41:] + [[5, 6]], pa.list_(pa.int32()))}),
                   shard_path(shard_dir, 2))
    with pytest.raises(VerifyError, match=rf"input shard {re.escape(shard_path(shard_dir, 2))} row "
                                          rf"{len(docs) - 41} \(doc id {len(docs)}, token 0 of 2\): not in the output"):
        verify_output(out)


def test_empty_input_document_added_after_packing(tmp_path):
    """An empty document takes an id and no positions, so the next shard's ids shift by one."""
    out, shard_dir, docs = pack(tmp_path)
    manifest = load_manifest(out)
    del manifest["shards"]  # no recorded shard counts: the shift itself must be caught
    save_manifest(out, manifest)
    pq.write_table(pa.table({"input_ids": pa.array(docs[20:41] + [[]], pa.list_(pa.int32()))}),
                   shard_path(shard_dir, 1))
    first = next(i for i in range(41, len(docs)) if docs[i])  # shard 2's first non-empty document
    position = sum(len(d) for d in docs[:first])
    with pytest.raises(VerifyError, match=rf"output chunk {position // C} position {position % C} .*found doc id "
                                          rf"{first} token \d+; .*part-0002.parquet row {first - 41} \(doc id "
                                          rf"{first + 1}, token 0 of {len(docs[first])}\): expected doc id {first + 1}"):
        verify_output(out, [shard_dir])


def test_fewer_inputs_than_packed(tmp_path):
    out, shard_dir, docs = pack(tmp_path)
    position = sum(len(d) for d in docs[:41])
    with pytest.raises(VerifyError, match=rf"output chunk {position // C} position {position % C} .*: the output "
                                          r"continues \(doc id \d+\) but the inputs end there"):
        verify_output(out, [shard_path(shard_dir, 0), shard_path(shard_dir, 1)])


def test_recorded_shard_counts_are_checked(tmp_path):
    out, shard_dir, docs = pack(tmp_path)
    # append an empty document to the last shard: every token still matches
    pq.write_table(pa.table({"input_ids": pa.array(docs[41:] + [[]], pa.list_(pa.int32()))}),
                   shard_path(shard_dir, 2))
    with pytest.raises(VerifyError, match=rf"input shard {re.escape(shard_path(shard_dir, 2))}: holds "
                                          rf"{len(docs) - 41 + 1} documents / \d+ tokens, the manifest recorded "
                                          rf"{len(docs) - 41} / \d+ at packing; it changed after packing"):
        verify_output(out)



# ============================================================================= best_fit outputs
#
# One corpus, packed once per window size and copied per test: 70 documents (empty ones, one of
# exactly C tokens, one of 2C, several of 3C+), shards of 20, 0 (an empty shard), 21, 22 and 7
# documents, best_fit_window=7 by default (it divides neither the 20- nor the 22-document shard).

BF_CUTS = (20, 20, 41, 63)
BF_WINDOW = 7


def make_best_fit_docs() -> list[list[int]]:
    docs = make_docs(2, num_docs=70)
    rng = np.random.default_rng(7)
    for i, n in ((12, C), (13, 2 * C), (55, 3 * C + 6)):
        docs[i] = rng.integers(1, 1000, size=n).tolist()
    return docs


@pytest.fixture(scope="module")
def best_fit_outputs(tmp_path_factory):
    """``window -> (out, shard_dir, docs)``, packed on first use; tests copy ``out`` before changing it."""
    root = tmp_path_factory.mktemp("best_fit")
    docs = make_best_fit_docs()
    shard_dir = write_shards(root, docs, list(BF_CUTS))
    packed: dict[int, str] = {}

    def get(window: int) -> tuple[str, str, list[list[int]]]:
        if window not in packed:
            out = str(root / f"out-{window}")
            run_pack(make_config(dict(inputs=[shard_dir], output=out, context_length=C, pad_token=0,
                                      read_batch_size=3, strategy="best_fit", best_fit_window=window)),
                     engine="local")
            packed[window] = out
        return packed[window], shard_dir, docs

    return get


@pytest.fixture
def bf(tmp_path, best_fit_outputs):
    """A private copy of the window-7 best_fit output: (out, shard_dir, docs)."""
    out, shard_dir, docs = best_fit_outputs(BF_WINDOW)
    shutil.copytree(out, tmp_path / "out")
    return str(tmp_path / "out"), shard_dir, docs


class Layout:
    """Where things are in a best_fit output (read with plain pyarrow) and in its corpus."""

    def __init__(self, out: str, docs: list[list[int]]) -> None:
        self.out, self.docs = out, docs
        self.manifest = load_manifest(out)
        self.window = self.manifest["best_fit_window"]
        self.segs = segments(out)
        self.input_ids, _ = read_dense(out)

    def shard_of(self, doc: int) -> tuple[int, int]:
        """(shard, row) of a doc id."""
        shards = self.manifest["shards"]
        k = max(k for k, s in enumerate(shards) if s["doc_offset"] <= doc and s["num_docs"])
        return k, doc - shards[k]["doc_offset"]

    def window_of(self, doc: int) -> tuple[int, int]:
        """(shard, window index inside the shard) of a doc id."""
        k, row = self.shard_of(doc)
        return k, row // self.window if self.window else 0

    def chunk_window(self, chunk: int) -> tuple[int, int]:
        return self.window_of(self.segs[chunk][0][0])

    def real(self, chunk: int) -> list[tuple[int, int, int]]:
        """(doc id, start, length) of the chunk's document segments."""
        ids, lens = self.segs[chunk]
        starts = np.cumsum([0] + lens[:-1]).tolist()
        return [(d, s, n) for d, s, n in zip(ids, starts, lens) if d >= 0]

    def padding(self, chunk: int) -> int:
        ids, lens = self.segs[chunk]
        return lens[-1] if ids[-1] == -1 else 0

    def doc_label(self, doc: int) -> str:
        k, row = self.shard_of(doc)
        return rf"doc id {doc} \(shard {k} {re.escape(self.manifest['shards'][k]['path'])} row {row}\)"

    def place(self, chunk: int, position: int) -> str:
        name, row = file_of_chunk(self.out, chunk)
        return rf"output chunk {chunk} position {position} \({re.escape(name)} row {row}\)"

    def window_label(self, shard: int, index: int) -> str:
        return rf"window {index} of shard {shard} \({re.escape(self.manifest['shards'][shard]['path'])} rows "


def set_chunk(out: str, chunk: int, **columns) -> None:
    """Replace whole columns of one chunk (hashes fixed up)."""
    for column, value in columns.items():
        edit_chunk(out, chunk, column, lambda _, v=value: v)


def pad_tail(ids: list[int], num_pad: int) -> list[int]:
    return ids[:C - num_pad] + [0] * num_pad


# ----------------------------------------------------------------------------- best_fit: clean


def test_best_fit_corpus_is_not_vacuous(bf):
    out, _, docs = bf
    layout = Layout(out, docs)
    manifest = layout.manifest
    assert manifest["strategy"] == "best_fit" and manifest["best_fit_window"] == BF_WINDOW
    assert [s["num_docs"] for s in manifest["shards"]] == [20, 0, 21, 22, 7]
    assert any(s["num_docs"] % BF_WINDOW for s in manifest["shards"])
    assert {len(d) for d in docs} >= {0, C, 2 * C, 3 * C + 1, 3 * C + 6}
    assert manifest["counts"]["split_documents"] == sum(len(d) > C for d in docs) > 0
    padded = [i for i in range(len(layout.segs)) if layout.padding(i)]
    assert len(padded) > 5 and padded[0] < len(layout.segs) - 1  # padding in many chunks, not only the last
    assert any(len(layout.real(i)) >= 3 for i in range(len(layout.segs)))


@pytest.mark.parametrize("window", [0, 1, BF_WINDOW])
def test_best_fit_clean_output_verifies_with_and_without_inputs(best_fit_outputs, window):
    out, shard_dir, docs = best_fit_outputs(window)
    counts = load_manifest(out)["counts"]
    for batch_chunks in (1, 3, 1024):
        reports = [verify_output(out, batch_chunks=batch_chunks), verify_output(out, [shard_dir], batch_chunks=batch_chunks),
                   verify_output(out, [], batch_chunks=batch_chunks)]
        assert [r.inputs_compared for r in reports] == [True, True, False]
        for report in reports:
            assert (report.num_chunks, report.num_tokens, report.num_padding_positions, report.num_documents,
                    report.num_split_documents) == (counts["chunks"], counts["tokens"], counts["padding_positions"],
                                                    counts["documents"], counts["split_documents"])
            note = f"windows of {window:,} documents" if window else "windows of a whole shard"
            assert (report.strategy, report.strategy_note) == ("best_fit", note)
    assert reports[0].num_tokens == sum(map(len, docs)) and reports[0].num_shards == 5
    assert any("best_fit" in line for line in reports[0].lines())


def test_best_fit_output_of_empty_documents_only_verifies(tmp_path):
    out, _, _ = pack(tmp_path, docs=[[], [], []], cuts=[1], strategy="best_fit", best_fit_window=2)
    report = verify_output(out)
    assert report.inputs_compared and (report.num_chunks, report.num_tokens, report.num_documents) == (0, 0, 3)


def test_best_fit_verify_streams_window_by_window(best_fit_outputs):
    """With one chunk per block, every piece compared with the inputs is exactly one window."""
    import pyarrow.fs as pafs

    from raypack.strategies.best_fit.verify import BestFitStructure
    from raypack.verify.structure import output_pieces

    out, _, docs = best_fit_outputs(BF_WINDOW)
    manifest = load_manifest(out)
    structure = BestFitStructure(manifest, keep_tokens=True)
    pieces = list(output_pieces(pafs.LocalFileSystem(), out, manifest, structure, 1))
    layout = Layout(out, docs)
    windows = [{layout.window_of(int(d)) for d in np.unique(p.doc_ids)} for p in pieces]
    assert all(len(w) == 1 for w in windows)
    nonempty = {layout.window_of(d) for d in range(len(docs)) if docs[d]}
    assert len(pieces) == len(nonempty) and {w.pop() for w in windows} == nonempty
    for piece in pieces:  # each piece is its documents, in doc id order
        ids = np.unique(piece.doc_ids)
        assert piece.tokens.tolist() == [t for d in ids for t in docs[d]]


def test_best_fit_cli_verify(best_fit_outputs, capsys):
    from raypack.cli import main

    out, _, _ = best_fit_outputs(BF_WINDOW)
    assert main(["verify", out]) == 0
    printed = capsys.readouterr().out
    assert "best_fit" in printed and "unpack(pack(x)) == x" in printed
    assert main(["verify", "--no-inputs", out]) == 0


# ----------------------------------------------------------------------------- best_fit: manifest


def test_manifest_without_strategy_is_concat(tmp_path, bf):
    out, _, _ = bf
    manifest = load_manifest(out)
    del manifest["strategy"]
    manifest["config"].pop("strategy", None)
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=r"padding may only be the last segment of the last chunk"):
        verify_output(out, [])  # read as concat, the best_fit layout is wrong
    concat_out, _, _ = pack(tmp_path / "concat")
    manifest = load_manifest(concat_out)
    manifest.pop("strategy", None)
    manifest["config"].pop("strategy", None)
    save_manifest(concat_out, manifest)
    assert verify_output(concat_out).strategy == "concat"  # an output written before strategies existed


def test_unknown_strategy(bf):
    out, _, _ = bf
    manifest = load_manifest(out)
    manifest["strategy"] = "zigzag"
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=r"manifest.json: strategy='zigzag' is unknown; expected one of concat, best_fit"):
        verify_output(out, [])


def test_strategy_and_its_options_are_stored_once(bf):
    out, _, _ = bf
    manifest = load_manifest(out)
    assert manifest["best_fit_window"] == BF_WINDOW
    assert "strategy" not in manifest["config"] and "best_fit_window" not in manifest["config"]


@pytest.mark.parametrize("key", ["tokens", "chunks", "padding_positions", "split_documents", "documents"])
def test_best_fit_manifest_with_a_wrong_count(bf, key):
    out, _, _ = bf
    manifest = load_manifest(out)
    manifest["counts"][key] += 1
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=rf"counts\.{key}={manifest['counts'][key]} but "):
        verify_output(out, [])


def test_best_fit_split_documents_are_those_longer_than_c(bf):
    """A concat-style count (documents crossing a chunk boundary) would differ: it is caught."""
    out, _, docs = bf
    manifest = load_manifest(out)
    manifest["counts"]["split_documents"] = sum(len(d) > C for d in docs) - 1
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=rf"counts\.split_documents={sum(len(d) > C for d in docs) - 1} but the "
                                          rf"chunk files hold {sum(len(d) > C for d in docs)}"):
        verify_output(out, [])


def test_shard_chunk_ranges_must_tile(bf):
    out, _, _ = bf
    manifest = load_manifest(out)
    first = manifest["shards"][2]["first_chunk"]
    manifest["shards"][2]["first_chunk"] += 1
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=rf"shards\[2\] \(.*part-0002.parquet\): first_chunk={first + 1}, expected "
                                          rf"{first}; best_fit shard chunk ranges tile the chunks in shard order"):
        verify_output(out, [])


def test_shard_chunk_ranges_must_cover_the_files(bf):
    out, _, _ = bf
    manifest = load_manifest(out)
    manifest["shards"][-1]["num_chunks"] -= 1
    save_manifest(out, manifest)
    total = manifest["counts"]["chunks"]
    with pytest.raises(VerifyError, match=rf"the shards' chunk ranges cover chunks 0..{total - 2} \({total - 1} chunks\) "
                                          rf"but the files hold {total}"):
        verify_output(out, [])


def test_chunk_outside_its_shards_range(bf):
    """Shard 0's last chunk handed to the (empty) shard 1 by the manifest: its doc ids are shard 0's."""
    out, _, docs = bf
    manifest = load_manifest(out)
    shards = manifest["shards"]
    assert shards[1]["num_docs"] == 0 and shards[1]["num_chunks"] == 0
    shards[0]["num_chunks"] -= 1
    shards[1]["first_chunk"] -= 1
    shards[1]["num_chunks"] = 1
    save_manifest(out, manifest)
    chunk = shards[1]["first_chunk"]
    layout = Layout(out, docs)
    doc = layout.real(chunk)[0][0]
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, 0)}: {layout.doc_label(doc)} is in chunk {chunk}, "
                                          rf"which lies in shard 1's chunk range {chunk}..{chunk} \(.*part-0001.parquet\); "
                                          r"a shard's chunks hold only its own documents"):
        verify_output(out, [])


def test_shard_tokens_must_match_its_chunks(bf):
    out, _, _ = bf
    manifest = load_manifest(out)
    shards = manifest["shards"]
    shards[2]["num_tokens"] += 1  # shard 3 gives one: the totals and offsets still add up
    shards[3]["num_tokens"] -= 1
    shards[3]["token_offset"] += 1
    save_manifest(out, manifest)
    first, n = shards[2]["first_chunk"], shards[2]["num_chunks"]
    with pytest.raises(VerifyError, match=rf"shards\[2\] \(.*part-0002.parquet\): num_tokens={shards[2]['num_tokens']} "
                                          rf"but its chunks {first}..{first + n - 1} hold {shards[2]['num_tokens'] - 1} tokens"):
        verify_output(out, [])


# ----------------------------------------------------------------------------- best_fit: per chunk


def test_best_fit_padding_moved_inside_a_chunk(bf):
    out, _, docs = bf
    layout = Layout(out, docs)
    chunk = next(i for i in range(len(layout.segs)) if len(layout.segs[i][0]) == 2 and layout.padding(i))
    (doc, _, n), = layout.real(chunk)
    pad = C - n
    tokens = layout.input_ids[chunk].tolist()
    set_chunk(out, chunk, input_ids=[0] * pad + tokens[:n], segment_doc_ids=[-1, doc], segment_lengths=[pad, n])
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, 0)}: padding \(doc id -1\) in chunk {chunk} segment 0 "
                                          rf"of 2, before {layout.doc_label(doc)}; a best_fit chunk holds its "
                                          r"documents first and padding only as its last segment"):
        verify_output(out, [])


def test_best_fit_padding_holds_the_pad_token(bf):
    out, _, docs = bf
    layout = Layout(out, docs)
    chunk = next(i for i in range(len(layout.segs)) if layout.padding(i))
    edit_chunk(out, chunk, "input_ids", lambda ids: replace_at(ids, C - 1, 7))
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, C - 1)}: doc id -1 \(padding\) holds token 7, "
                                          r"expected pad_token 0"):
        verify_output(out, [])


def test_best_fit_chunk_of_padding_only(bf):
    out, _, docs = bf
    layout = Layout(out, docs)
    chunk = 3
    set_chunk(out, chunk, input_ids=[0] * C, segment_doc_ids=[-1], segment_lengths=[C])
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, 0)}: chunk {chunk} is all padding \(doc id -1\); "
                                          r"best_fit never emits a chunk without a document"):
        verify_output(out, [])


def test_best_fit_doc_id_twice_in_a_chunk(bf):
    out, _, docs = bf
    layout = Layout(out, docs)
    chunk = next(i for i in range(len(layout.segs)) if len(layout.real(i)) >= 3)
    (a, _, na), (b, sb, _) = layout.real(chunk)[:2]
    edit_chunk(out, chunk, "segment_doc_ids", lambda s: replace_at(s, 1, a))
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, sb)}: {layout.doc_label(a)} appears twice in chunk "
                                          rf"{chunk} \(segments at positions 0 and {na}\); a best_fit chunk holds each "
                                          r"document at most once"):
        verify_output(out, [])


def test_best_fit_doc_ids_decreasing_in_a_chunk(bf):
    out, _, docs = bf
    layout = Layout(out, docs)
    chunk = next(i for i in range(len(layout.segs)) if len(layout.real(i)) >= 2)
    (a, _, na), (b, _, nb) = layout.real(chunk)[:2]
    edit_chunk(out, chunk, "segment_doc_ids", lambda s: [b, a] + s[2:])
    edit_chunk(out, chunk, "segment_lengths", lambda s: [na, nb] + s[2:])
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, na)}: segment {layout.doc_label(a)} follows doc id "
                                          rf"{b} in chunk {chunk}; a best_fit chunk lays out its documents in "
                                          "increasing doc id order"):
        verify_output(out, [])


def test_best_fit_doc_id_beyond_the_documents(bf):
    out, _, docs = bf
    layout = Layout(out, docs)
    last = len(layout.segs) - 1
    doc, start, _ = layout.real(last)[-1]
    edit_chunk(out, last, "segment_doc_ids", lambda s: replace_at(s, len(layout.real(last)) - 1, len(docs)))
    with pytest.raises(VerifyError, match=rf"{layout.place(last, start)}: doc id {len(docs)} is in no shard; the shards "
                                          rf"hold counts.documents={len(docs)} documents \(doc ids 0..{len(docs) - 1}\)"):
        verify_output(out, [])


# ----------------------------------------------------------------------------- best_fit: documents


def test_best_fit_short_document_cut_across_two_chunks(bf):
    """A document of <= C tokens split by editing segments: its last token moved to another chunk."""
    out, _, docs = bf
    layout = Layout(out, docs)
    chunk, other, doc, n = next(
        (x, y, d, n) for x in range(len(layout.segs)) for (d, _, n) in layout.real(x)[-1:]
        for y in range(x + 1, len(layout.segs))
        if n >= 2 and len(layout.real(x)) >= 2 and layout.padding(y) >= 1
        and layout.chunk_window(y) == layout.chunk_window(x) and d < layout.real(y)[0][0])
    pad = layout.padding(chunk)
    ids, lens = layout.segs[chunk]
    real_x = [(d, m) for d, m in zip(ids, lens) if d >= 0]
    real_x[-1] = (doc, n - 1)
    set_chunk(out, chunk, input_ids=pad_tail(layout.input_ids[chunk].tolist(), pad + 1),
              segment_doc_ids=[d for d, _ in real_x] + [-1], segment_lengths=[m for _, m in real_x] + [pad + 1])
    ids, lens = layout.segs[other]
    q = layout.padding(other)
    set_chunk(out, other, segment_doc_ids=[doc] + ids[:-1] + ([-1] if q > 1 else []),
              segment_lengths=[1] + lens[:-1] + ([q - 1] if q > 1 else []))
    start = C - pad - n
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, start)}: {layout.doc_label(doc)} holds {n} <= C={C} "
                                          rf"tokens but is cut: {n - 1} of them here, 1 in chunk {other} position 0; "
                                          r"best_fit never cuts a document that fits one chunk"):
        verify_output(out, [])


def test_best_fit_long_document_pieces_out_of_order(bf):
    """A full piece of a long document shortened: a short segment now precedes the document's others."""
    out, _, docs = bf
    layout = Layout(out, docs)
    doc = next(d for d in range(len(docs)) if len(docs[d]) > 3 * C)
    chunks = [i for i in range(len(layout.segs)) if doc in layout.segs[i][0]]
    chunk = chunks[0]
    assert layout.segs[chunk] == ([doc], [C])
    set_chunk(out, chunk, input_ids=pad_tail(layout.input_ids[chunk].tolist(), C - 3),
              segment_doc_ids=[doc, -1], segment_lengths=[3, C - 3])
    total = len(docs[doc]) - (C - 3)
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, 0)}: {layout.doc_label(doc)} holds {total} > C={C} "
                                          rf"tokens; its segment here holds 3 tokens and another follows in chunk "
                                          rf"{chunks[1]} position 0: a document longer than C is its full {C}-token "
                                          rf"pieces, then its remainder of {total % C} tokens, in chunk order"):
        verify_output(out, [])


# ----------------------------------------------------------------------------- best_fit: windows


def test_best_fit_chunk_mixing_two_windows(bf):
    out, _, docs = bf
    layout = Layout(out, docs)
    shards = layout.manifest["shards"]

    def next_window_doc(chunk: int) -> int | None:
        k, w = layout.chunk_window(chunk)
        first = shards[k]["doc_offset"] + (w + 1) * BF_WINDOW
        return first if (w + 1) * BF_WINDOW < shards[k]["num_docs"] else None

    chunk = next(i for i in range(len(layout.segs)) if len(layout.real(i)) >= 2 and next_window_doc(i) is not None)
    (a, _, _), (b, sb, _) = layout.real(chunk)[:2]
    e = next_window_doc(chunk)
    k, w = layout.chunk_window(chunk)
    edit_chunk(out, chunk, "segment_doc_ids", lambda s: replace_at(s, 1, e))
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, sb)}: {layout.doc_label(e)} is in "
                                          rf"{layout.window_label(k, w + 1)}.*, but chunk {chunk} also holds "
                                          rf"{layout.doc_label(a)} of {layout.window_label(k, w)}.*; a best_fit chunk "
                                          r"holds documents of one window"):
        verify_output(out, [])


def test_best_fit_windows_out_of_order(bf):
    """The last chunk of one window swapped with the first of the next: window order is violated."""
    out, _, docs = bf
    layout = Layout(out, docs)
    chunk = next(i for i in range(len(layout.segs) - 1)
                 if layout.chunk_window(i)[0] == layout.chunk_window(i + 1)[0]
                 and layout.chunk_window(i) != layout.chunk_window(i + 1))
    for x, y in ((chunk, chunk + 1), (chunk + 1, chunk)):
        ids, lens = layout.segs[y]
        set_chunk(out, x, input_ids=layout.input_ids[y].tolist(), segment_doc_ids=ids, segment_lengths=lens)
    (k, w), (_, w_next) = layout.chunk_window(chunk), layout.chunk_window(chunk + 1)
    first = layout.segs[chunk][0][0]
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk + 1, 0)}: {layout.doc_label(first)} of "
                                          rf"{layout.window_label(k, w)}.* comes after chunk {chunk}, which holds "
                                          rf"{layout.window_label(k, w_next)}.*; windows are packed one after another"):
        verify_output(out, [])


# ----------------------------------------------------------------------------- best_fit: best-fit decreasing


def test_best_fit_swapped_chunks_are_not_best_fit(bf):
    """Two whole chunks of one window swapped: every other rule holds, the layout is not best-fit."""
    out, _, docs = bf
    layout = Layout(out, docs)
    x, y = next((x, y) for x in range(len(layout.segs)) for y in range(x + 1, len(layout.segs))
                if layout.chunk_window(x) == layout.chunk_window(y)
                and layout.segs[x] == ([layout.segs[x][0][0]], [C]) and len(docs[layout.segs[x][0][0]]) == C
                and layout.segs[y] == ([layout.segs[y][0][0]], [C]) and len(docs[layout.segs[y][0][0]]) <= 2 * C
                and layout.segs[x] != layout.segs[y])
    for a, b in ((x, y), (y, x)):
        ids, lens = layout.segs[b]
        set_chunk(out, a, input_ids=layout.input_ids[b].tolist(), segment_doc_ids=ids, segment_lengths=lens)
    dx, dy = layout.segs[x][0][0], layout.segs[y][0][0]
    with pytest.raises(VerifyError, match=rf"{layout.place(x, 0)}: {layout.doc_label(dy)} \({C} tokens\) is here, "
                                          rf"where best-fit decreasing over window .* puts doc id {dx} \({C} tokens\) in "
                                          rf"chunk {x}: not best-fit"):
        verify_output(out, [])


def test_best_fit_equal_chunks_swapped_is_not_best_fit(tmp_path):
    """Every piece longer than C/2, two of equal length: best-fit decreasing breaks the tie in stream
    order, so the two chunks swapped (same fills, same lengths) are caught."""
    rng = np.random.default_rng(4)
    docs = [rng.integers(1, 1000, size=n).tolist() for n in (6, 5, 6, 7)]
    out, _, _ = pack(tmp_path, docs=docs, cuts=[], strategy="best_fit", best_fit_window=0)
    verify_output(out)
    assert [ids for ids, _ in segments(out)] == [[3, -1], [0, -1], [2, -1], [1, -1]]
    input_ids, _ = read_dense(out)
    for a, b in ((1, 2), (2, 1)):
        set_chunk(out, a, input_ids=input_ids[b].tolist(), segment_doc_ids=[2 if a == 1 else 0, -1],
                  segment_lengths=[6, 2])
    with pytest.raises(VerifyError, match=r"output chunk 1 position 0 \(chunks-000000000000-[0-9a-f]{16}.arrow row 1\): doc id 2 "
                                          r"\(shard 0 .*part-0000.parquet row 2\) \(6 tokens\) is here, where best-fit "
                                          r"decreasing over window 0 of shard 0 .* puts doc id 0 \(6 tokens\) in chunk 1: "
                                          "not best-fit"):
        verify_output(out)


def test_best_fit_document_moved_to_another_chunk_is_not_best_fit(bf):
    """A whole short document moved into another chunk of its window with room: the fills differ."""
    out, _, docs = bf
    layout = Layout(out, docs)
    chunk, other, doc, n = next(
        (x, y, d, n) for x in range(len(layout.segs)) for (d, _, n) in layout.real(x)[-1:]
        for y in range(x + 1, len(layout.segs))
        if len(layout.real(x)) >= 2 and layout.padding(y) > n
        and layout.chunk_window(y) == layout.chunk_window(x) and d < layout.real(y)[0][0])
    pad = layout.padding(chunk)
    ids, lens = layout.segs[chunk]
    kept = [(d, m) for d, m in zip(ids, lens) if d >= 0][:-1]
    set_chunk(out, chunk, input_ids=pad_tail(layout.input_ids[chunk].tolist(), pad + n),
              segment_doc_ids=[d for d, _ in kept] + [-1], segment_lengths=[m for _, m in kept] + [pad + n])
    ids, lens = layout.segs[other]
    q = layout.padding(other)
    set_chunk(out, other, segment_doc_ids=[doc] + ids[:-1] + [-1], segment_lengths=[n] + lens[:-1] + [q - n])
    fill = C - pad - n
    with pytest.raises(VerifyError, match=rf"{layout.place(chunk, fill)}: chunk {chunk} holds {fill} tokens \(doc ids "
                                          rf"\[.*\]\) of window .*; best-fit decreasing fills it with {C - pad}: "
                                          "not best-fit"):
        verify_output(out, [])


def test_best_fit_fewer_chunks_than_best_fit_decreasing_is_not_best_fit(tmp_path):
    """Lengths 4,3,3,2,2,2 fit two chunks of 8 ([4,2,2], [3,3,2]) but best-fit decreasing opens three:
    the two-chunk packing is valid in every other way (it even round-trips) and is reported."""
    rng = np.random.default_rng(3)
    docs = [rng.integers(1, 1000, size=n).tolist() for n in (4, 3, 3, 2, 2, 2)]
    out, _, _ = pack(tmp_path, docs=docs, cuts=[], strategy="best_fit", best_fit_window=0)
    assert load_manifest(out)["counts"]["chunks"] == 3
    name = load_manifest(out)["files"][0]["path"]
    path = os.path.join(out, name)
    schema = pa.ipc.open_file(path).schema
    layout = [[0, 3, 4], [1, 2, 5]]
    table = pa.table({
        "chunk_index": pa.array([0, 1], pa.int64()),
        "input_ids": pa.array([[t for d in chunk for t in docs[d]] for chunk in layout], schema.field("input_ids").type),
        "segment_doc_ids": pa.array(layout, pa.list_(pa.int64())),
        "segment_lengths": pa.array([[len(docs[d]) for d in chunk] for chunk in layout], pa.list_(pa.int32())),
    }, schema=schema)
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(table)
    manifest = load_manifest(out)
    manifest["files"][0]["num_chunks"] = manifest["shards"][0]["num_chunks"] = manifest["counts"]["chunks"] = 2
    manifest["counts"]["padding_positions"] = 0
    save_manifest(out, manifest)
    refresh_hashes(out)
    pattern = (rf"output chunk 0 position 0 \(chunks-000000000000-[0-9a-f]{{16}}.arrow row 0\): window 0 of shard 0 \(.*part-0000.parquet rows 0..5, doc "
               r"ids 0..5; best_fit_window=0\) fills chunks 0..1 \(2 chunks, 16 tokens\), but best-fit decreasing "
               r"packs its 6 pieces into 3: not best-fit")
    with pytest.raises(VerifyError, match=pattern):
        verify_output(out, [])
    with pytest.raises(VerifyError, match=pattern):
        verify_output(out)


# ----------------------------------------------------------------------------- best_fit: inputs


def test_best_fit_token_changed_is_caught_by_the_inputs(bf):
    out, shard_dir, docs = bf
    layout = Layout(out, docs)
    shards = layout.manifest["shards"]
    # a short document in shard 3, and the second piece of a long one
    short = next((i, d, s) for i in range(len(layout.segs)) for d, s, n in layout.real(i)
                 if layout.shard_of(d)[0] == 3 and 2 <= len(docs[d]) <= C)
    long_doc = next(d for d in range(len(docs)) if len(docs[d]) > 2 * C)
    second = [i for i in range(len(layout.segs)) if long_doc in layout.segs[i][0]][1]
    for chunk, doc, start, offset in ((short[0], short[1], short[2], 1), (second, long_doc, 0, C + 2)):
        position = start + offset % C
        old = int(layout.input_ids[chunk, position])
        assert docs[doc][offset] == old
        edit_chunk(out, chunk, "input_ids", lambda ids: replace_at(ids, position, old + 1))
        verify_output(out, [])  # hashes fixed up, structure intact: only the inputs can tell
        k, row = layout.shard_of(doc)
        pattern = (rf"{layout.place(chunk, position)}: found doc id {doc} token {old + 1}; input shard "
                   rf"{re.escape(shard_path(shard_dir, k))} row {row} \(doc id {doc}, token {offset} of "
                   rf"{len(docs[doc])}\): expected doc id {doc} token {old}")
        with pytest.raises(VerifyError, match=pattern):
            verify_output(out)
        edit_chunk(out, chunk, "input_ids", lambda ids: replace_at(ids, position, old))
        verify_output(out)
    assert shards[3]["num_docs"] == 22


def test_best_fit_swapped_chunk_tokens_are_caught_by_the_inputs(bf):
    """Two full chunks exchange their tokens (segments unchanged): only the round trip can tell."""
    out, shard_dir, docs = bf
    layout = Layout(out, docs)
    full = [i for i in range(len(layout.segs)) if len(layout.segs[i][0]) == 1]
    x, y = full[1], full[-2]
    dx = layout.segs[x][0][0]
    tx, ty = layout.input_ids[x].tolist(), layout.input_ids[y].tolist()
    set_chunk(out, x, input_ids=ty)
    set_chunk(out, y, input_ids=tx)
    verify_output(out, [])
    i = next(p for p in range(C) if tx[p] != ty[p])
    piece = [j for j in range(len(layout.segs)) if dx in layout.segs[j][0]].index(x)
    k, row = layout.shard_of(dx)
    with pytest.raises(VerifyError, match=rf"{layout.place(x, i)}: found doc id {dx} token {ty[i]}; input shard "
                                          rf"{re.escape(shard_path(shard_dir, k))} row {row} \(doc id {dx}, token "
                                          rf"{piece * C + i} of {len(docs[dx])}\): expected doc id {dx} token {tx[i]}"):
        verify_output(out)


def test_best_fit_input_document_added_after_packing(bf):
    out, shard_dir, docs = bf
    # the shards are shared by the tests: compare against a changed copy
    copy = os.path.join(os.path.dirname(out), "shards-copy")
    shutil.copytree(shard_dir, copy)
    pq.write_table(pa.table({"input_ids": pa.array(docs[63:] + [[5, 6]], pa.list_(pa.int32()))}), shard_path(copy, 4))
    with pytest.raises(VerifyError, match=rf"input shard {re.escape(shard_path(copy, 4))} row 7 \(doc id 70, token 0 "
                                          r"of 2\): not in the output"):
        verify_output(out, [copy])


# ----------------------------------------------------------------------------- one long input document


@pytest.mark.parametrize("long_docs", ["split", "truncate", "drop"])
def test_inputs_compared_a_slice_at_a_time_give_the_same_verdicts(tmp_path, monkeypatch, long_docs):
    """PIECE_POSITIONS (how many input positions verify compares at a time) changes no verdict and no
    message: a clean output verifies, and one changed input token is named the same way."""
    import raypack.verify.inputs as verify_inputs

    docs = make_docs(3)
    out, shard_dir, _ = pack(tmp_path, docs, long_docs=long_docs)
    doc = 10  # 3 * C + 1 tokens: split across chunks, truncated, or dropped
    verdicts = {}
    for positions in (1, 5, C + 1, 1 << 20):
        monkeypatch.setattr(verify_inputs, "PIECE_POSITIONS", positions)
        verify_output(out)
        changed = [list(d) for d in docs]
        changed[doc][2] = changed[doc][2] % 999 + 1
        path = write_shards(tmp_path / f"changed-{positions}", changed, [20, 41])
        if long_docs == "drop":
            verify_output(out, [path])  # the dropped document is not compared
            continue
        with pytest.raises(VerifyError) as e:
            verify_output(out, [path])
        verdicts[positions] = str(e.value).replace(f"changed-{positions}", "changed")
    assert len(set(verdicts.values())) <= 1, verdicts
    if verdicts:
        assert "row 10 (doc id 10, token 2 of" in next(iter(verdicts.values()))


def test_one_long_input_document_costs_verify_a_slice_of_arrays(tmp_path, monkeypatch):
    """verify's own arrays for the input side stay PIECE_POSITIONS long whatever the document's
    length (numpy allocations are what tracemalloc sees; the reader's decode is pyarrow's and is
    bounded by max_document_tokens instead). Before: ~21 bytes a token of the document."""
    import tracemalloc

    import raypack.verify.inputs as verify_inputs

    n = 2_000_000
    docs = [list(range(1, 6)), np.arange(n, dtype=np.int32) % 997 + 1, list(range(1, 4))]
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}), shard_dir / "part-0000.parquet")
    out = str(tmp_path / "out")
    run_pack(make_config(dict(inputs=[str(shard_dir)], output=out, context_length=1024, pad_token=0)), engine="local")
    monkeypatch.setattr(verify_inputs, "PIECE_POSITIONS", 1 << 16)
    tracemalloc.start()
    try:
        verify_output(out, batch_chunks=16)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * n, f"verify's arrays peaked at {peak} bytes for a document of {n} tokens"


def test_an_input_document_over_max_document_tokens_is_one_line(tmp_path, capsys):
    from raypack.cli import main

    out, _, _ = pack(tmp_path)
    assert main(["verify", out, "--max-document-tokens", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "part-0000.parquet row 0: the document holds 11 tokens" in err
    assert "max_document_tokens=10" in err and "--max-document-tokens" in err
    assert verify_output(out, max_document_tokens=25).inputs_compared
    with pytest.raises(InputError, match="must be an integer >= 1"):
        verify_output(out, max_document_tokens=0)
