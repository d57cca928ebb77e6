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

from raypack.config import make_config
from raypack.job import run_pack
from raypack.output import content_sha256
from raypack.verify import VerifyError, VerifyReport, verify_output

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
    """Make the manifest vouch for the files as they are now (sha256, num_bytes, content_sha256)."""
    manifest = load_manifest(out)
    for entry in manifest["files"]:
        data = open(os.path.join(out, entry["path"]), "rb").read()
        entry["sha256"], entry["num_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    manifest["content_sha256"] = content_sha256(manifest["files"])
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
    assert any("not compared" in line for line in without.lines())


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
    assert not verify_output(out).inputs_compared


def test_batch_chunks_must_be_positive(tmp_path):
    out, _, _ = pack(tmp_path)
    with pytest.raises(ValueError, match=r"batch_chunks=0 must be an integer >= 1"):
        verify_output(out, batch_chunks=0)


# ----------------------------------------------------------------------------- 1. manifest and files


def test_missing_manifest(tmp_path):
    out, _, _ = pack(tmp_path)
    os.remove(os.path.join(out, "manifest.json"))
    with pytest.raises(VerifyError, match=r"no manifest.json; the output is incomplete"):
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


def test_wrong_content_sha256(tmp_path):
    out, _, _ = pack(tmp_path)
    manifest = load_manifest(out)
    manifest["content_sha256"] = "0" * 64
    save_manifest(out, manifest)
    with pytest.raises(VerifyError, match=r"content_sha256=0{64}, expected [0-9a-f]{64}"):
        verify_output(out)


def test_file_list_must_tile_the_chunks(tmp_path):
    out, _, _ = pack(tmp_path)
    manifest = load_manifest(out)
    manifest["files"][1]["first_chunk"] += 1
    save_manifest(out, manifest)
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
    pattern = (rf"output chunk {chunk} position {position} \(chunks-\d+\.arrow\): found doc id {doc} token "
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
    name, row = file_of_chunk(out, 3)
    edit_chunk(out, 3, "segment_lengths", lambda s: replace_at(s, 0, s[0] + 1))
    with pytest.raises(VerifyError, match=rf"{re.escape(name)} row {row} \(chunk 3\): segment lengths sum to "
                                          rf"{C + 1}, expected the context length {C}"):
        verify_output(out, [])


def test_chunk_index_must_run_in_order(tmp_path):
    out, _, _ = pack(tmp_path)
    name, row = file_of_chunk(out, 3)
    edit_chunk(out, 3, "chunk_index", lambda _: 7)
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

