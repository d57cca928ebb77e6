"""A packed output is untrusted input: hostile manifests and directories against the reader,
``raypack stats`` and ``raypack verify`` alike (issue 12). Each must fail with one line naming
what is wrong, fast, without opening anything the manifest should not name."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raypack.packed.manifest as manifest_module
from raypack.cli.stats import packing_stats
from raypack.errors import InputError
from raypack.outputs import read_packed
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.verify import VerifyError, verify_output

C = 8


def write_corpus(root, seed: int, num_shards: int = 3) -> str:
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    for k in range(num_shards):
        docs = [rng.integers(1, 1000, size=n).tolist() for n in rng.integers(1, 20, size=15)]
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}),
                       os.path.join(root, f"part-{k:03d}.parquet"))
    return str(root)


def pack(out, inputs, **overrides) -> str:
    values = dict(inputs=[inputs], output=str(out), context_length=C, pad_token=0, chunks_per_record_batch=4)
    values.update(overrides)
    run_pack(make_config(values), engine="local")
    return str(out)


@pytest.fixture
def out(tmp_path) -> str:
    path = pack(tmp_path / "out", write_corpus(tmp_path / "in", 0))
    assert len(manifest_of(path)["files"]) >= 3  # several files: some open, some not
    return path


def manifest_of(out: str) -> dict[str, Any]:
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def save(out: str, manifest: dict[str, Any]) -> None:
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


def read_all(out: str) -> None:
    ds = read_packed(out)
    for _ in ds.iter_batches(5):
        pass


TOOLS: dict[str, Callable[[str], Any]] = {
    "reader": read_all,
    "stats": packing_stats,
    "verify": lambda out: verify_output(out, []),
}


def fails(tool: str, out: str, match: str) -> str:
    """Run ``tool`` on ``out``; it must raise its one-line error matching ``match``."""
    error = VerifyError if tool == "verify" else InputError
    with pytest.raises(error, match=match) as info:
        TOOLS[tool](out)
    message = str(info.value)
    assert "\n" not in message and len(message) < 600, message
    return message


def first_name(manifest: dict[str, Any]) -> str:
    return manifest["files"][0]["path"]


# ----------------------------------------------------------------------------- hostile manifests


def _set_path(path: str) -> Callable[[dict], None]:
    def edit(m: dict) -> None:
        m["files"][0]["path"] = path.format(name=first_name(m))
    return edit


def _wrong_hash(m: dict) -> None:
    name = first_name(m)
    m["files"][0]["path"] = name[:20] + ("0" if name[20] != "0" else "1") + name[21:]


def _set(keys: tuple, value: Any) -> Callable[[dict], None]:
    def edit(m: dict) -> None:
        target = m
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


def _huge_file(m: dict) -> None:
    extra = 10**11
    m["files"][-1]["num_chunks"] += extra
    m["counts"]["chunks"] += extra


HOSTILE: dict[str, tuple[Callable[[dict], None], str]] = {
    "dotdot": (_set_path("../{name}"), r"files\[0\] \('\.\./chunks-.*path is not a chunk file name"),
    "absolute": (_set_path("/etc/passwd"), r"files\[0\] \('/etc/passwd'\): path is not a chunk file name"),
    "subdir": (_set_path("sub/{name}"), r"files\[0\] \('sub/chunks-.*path is not a chunk file name"),
    "hash_mismatch": (_wrong_hash, r"files\[0\] .*the name does not match first_chunk=0 and sha256="),
    "context_length_2**40": (_set(("context_length",), 2**40),
                             r"context_length=1099511627776, expected an integer in 1\.\."),
    "context_length_bool": (_set(("context_length",), True), r"context_length=True, expected an integer"),
    "num_chunks_bool": (_set(("files", 0, "num_chunks"), True), r"files\[0\] .*num_chunks=True, expected an integer"),
    "num_chunks_float": (_set(("files", 0, "num_chunks"), 3.0), r"num_chunks=3\.0, expected an integer"),
    "negative_count": (_set(("counts", "tokens"), -1), r"counts\.tokens=-1, expected an integer in 0\.\."),
    "huge_count": (_set(("counts", "chunks"), 2**70), r"counts\.chunks=1180591620717411303424, expected an integer"),
    "huge_num_chunks": (_huge_file, r"num_chunks=\d{12} needs at least \d+ bytes of tokens but num_bytes="),
    "pad_token_outside_dtype": (_set(("pad_token",), 2**40), r"pad_token=1099511627776, expected an integer in"),
    "float_dtype": (_set(("token_dtype",), "float32"), r"token_dtype='float32' is not an integer dtype"),
    "not_a_list": (_set(("files",), {"a": 1}), r"files=\{'a': 1\}, expected a list"),
}


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_manifest_is_one_line_naming_the_entry(out, tool, case):
    manifest = manifest_of(out)
    edit, match = HOSTILE[case]
    edit(manifest)
    save(out, manifest)
    message = fails(tool, out, match)
    assert "manifest.json" in message


@pytest.mark.slow  # > 5 s
@pytest.mark.parametrize("tool", TOOLS)
def test_one_file_listed_200000_times_fails_fast(out, tool, monkeypatch):
    """The check stops at the first bad entry: beyond parsing the 38 MB of JSON (O(size), unavoidable),
    it reads a handful of fields, not 200,000 entries' (counted, not timed: a timed bound flaked on a
    loaded CI machine, where the parse alone took 2 s)."""
    manifest = manifest_of(out)
    entry = manifest["files"][0]
    manifest["files"] = [entry] * 200_000
    manifest["counts"]["chunks"] = entry["num_chunks"] * 200_000
    save(out, manifest)
    fields_read = []
    real_int_field = manifest_module.int_field

    def counted_int_field(*args, **kwargs):
        fields_read.append(args[1])
        return real_int_field(*args, **kwargs)

    monkeypatch.setattr(manifest_module, "int_field", counted_int_field)
    fails(tool, out, r"files\[1\] .*first_chunk=0, expected \d+; the files must cover the chunks contiguously")
    assert fields_read.count("first_chunk") == 2  # files[0] and files[1], then the error
    assert len(fields_read) < 50


# ----------------------------------------------------------------------------- hostile directories


@pytest.mark.parametrize("tool", TOOLS)
def test_symlink_out_of_the_directory_is_refused_even_with_the_right_hash(out, tool, tmp_path):
    name = first_name(manifest_of(out))
    outside = tmp_path / "elsewhere.arrow"
    shutil.move(os.path.join(out, name), outside)
    os.symlink(outside, os.path.join(out, name))  # same bytes, so the same sha256
    fails(tool, out, rf"{name}: a symbolic link; only plain files directly inside the output directory are read")


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_fifo_or_directory_is_refused_without_blocking(out, tool, kind):
    path = os.path.join(out, first_name(manifest_of(out)))
    os.remove(path)
    os.mkfifo(path) if kind == "fifo" else os.mkdir(path)
    fails(tool, out, rf"{os.path.basename(path)}: not a plain file \(mode [dp]")


@pytest.mark.parametrize("tool", ["reader", "stats"])
def test_size_is_checked_on_open(out, tool):
    path = os.path.join(out, first_name(manifest_of(out)))
    with open(path, "ab") as f:
        f.write(b"\0")
    fails(tool, out, r"bytes, the manifest says num_bytes=\d+; the output was replaced or damaged")


@pytest.mark.parametrize("tool", ["reader", "stats"])
def test_damaged_chunk_file_is_one_line_naming_it(out, tool):
    name = first_name(manifest_of(out))
    path = os.path.join(out, name)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # same size, garbage bytes: only verify's hash would notice
        f.write(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    fails(tool, out, rf"{name}: ")


def test_stats_counts_come_from_the_data(out):
    manifest = manifest_of(out)
    stats = packing_stats(out)
    assert (stats.num_chunks, stats.num_tokens, stats.padding_positions, stats.split_documents) == (
        manifest["counts"]["chunks"], manifest["counts"]["tokens"], manifest["counts"]["padding_positions"],
        manifest["counts"]["split_documents"])
    for key, delta in (("tokens", 1), ("padding_positions", -1), ("split_documents", 1)):
        edited = json.loads(json.dumps(manifest))
        edited["counts"][key] += delta
        del edited["shards"]  # else the shards' token totals catch it before any file is read
        save(out, edited)
        fails("stats", out, rf"counts\.{key}={manifest['counts'][key] + delta} but the chunk files hold "
                            rf"{manifest['counts'][key]}")
    save(out, manifest)


# ----------------------------------------------------------------------------- verify's default inputs


@pytest.mark.parametrize("path", ["../in/part-000.parquet", "in/part-000.parquet", "/tmp/../etc/x.parquet",
                                  "/etc/passwd", "s3://bucket/a/../b.parquet"])
def test_verify_reads_only_plain_shard_paths_from_the_manifest(out, path):
    manifest = manifest_of(out)
    manifest["shards"][0]["path"] = path
    save(out, manifest)
    with pytest.raises(InputError, match=r"shards\[0\]: path=.* verify does not read it: pass the inputs with --input"):
        verify_output(out)
    verify_output(out, [])  # the output itself is fine


def test_verify_names_the_inputs_it_read(out):
    report = verify_output(out)
    paths = [s["path"] for s in manifest_of(out)["shards"]]
    assert report.inputs_compared and report.input_paths == tuple(paths)
    assert f"    read {paths[0]}" in report.lines()


# ----------------------------------------------------------------------------- --overwrite under a reader


def test_reader_opened_before_an_overwrite_never_sees_the_new_bytes(tmp_path, out):
    with read_packed(out) as first_look:
        old = {i: first_look[i]["input_ids"].copy() for i in range(len(first_look))}
    ds = read_packed(out)
    ds[0]  # opens the first file only
    pack(out, write_corpus(tmp_path / "other", 1), overwrite=True)
    new = read_packed(out)
    assert any(not np.array_equal(new[i]["input_ids"], old[i]) for i in range(min(len(new), len(ds))))
    missing = 0
    for i in range(len(ds)):
        try:
            tokens = ds[i]["input_ids"]
        except InputError as e:
            assert "listed in the manifest but missing; the output was replaced or damaged" in str(e)
            missing += 1
            continue
        np.testing.assert_array_equal(tokens, old[i])  # the chunks it had, never the new output's
    assert missing > 0  # files it had not opened are gone


def test_manifest_is_one_read_only_type_that_loads_checks_and_saves(tmp_path):
    from raypack.packed.manifest import Manifest

    out = tmp_path / "out"
    pack(out, write_corpus(tmp_path / "corpus", seed=1))
    manifest = Manifest.load(str(out))
    assert isinstance(manifest, Manifest) and manifest.context_length == C and manifest.strategy_name == "concat"
    assert manifest.num_chunks == sum(f["num_chunks"] for f in manifest.files)
    with pytest.raises(TypeError):
        manifest["context_length"] = 8  # type: ignore[index]
    edited = manifest.to_dict()
    edited["context_length"] = 2**40
    with pytest.raises(InputError, match="context_length"):
        Manifest.from_dict(edited, "edited.json")
    before = (out / "manifest.json").read_bytes()
    manifest.save(str(out))
    assert (out / "manifest.json").read_bytes() == before


def _patch_list_offsets(out: str, row: int, value: int) -> None:
    """Rewrite the first chunk file with offset ``row`` of both segment columns set to ``value`` (alike,
    so they still agree with each other; unvalidated),
    then make its name, sha256 and size in the manifest match, as an attacker would."""

    def patch(lists: pa.ListArray) -> pa.ListArray:
        offsets = np.array(lists.offsets, dtype=np.int32)
        offsets[row] = value
        return pa.Array.from_buffers(lists.type, len(lists), [None, pa.py_buffer(offsets.tobytes())],
                                     children=[lists.values])

    _patch_segments(out, patch)


def _patch_segments(out: str, patch: Callable[[pa.ListArray], pa.ListArray]) -> None:
    """The first chunk file's segment columns of its first record batch replaced by ``patch(column)``, the
    manifest's name, sha256 and size of it made to match."""
    manifest = manifest_of(out)
    entry = manifest["files"][0]
    path = os.path.join(out, entry["path"])
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source)
        batches = [reader.get_batch(k) for k in range(reader.num_record_batches)]
        schema = reader.schema
    first = batches[0]
    columns = []
    for name in schema.names:
        lists = first.column(name)
        if name in ("segment_doc_ids", "segment_lengths"):
            lists = patch(lists)
        columns.append(lists)
    batches[0] = pa.RecordBatch.from_arrays(columns, schema=schema)
    os.remove(path)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    digest = hashlib.sha256(data).hexdigest()
    entry.update(path=f"chunks-{entry['first_chunk']:012d}-{digest[:16]}.arrow", sha256=digest, num_bytes=len(data))
    with open(os.path.join(out, entry["path"]), "wb") as f:
        f.write(data)
    save(out, manifest)


@pytest.mark.parametrize("tool", ["reader", "stats"])
@pytest.mark.parametrize("row, value", [(1, 10**6), (1, -5)])  # the last offset pyarrow checks itself
def test_patched_list_offsets_are_one_line_naming_the_file(out, tool, row, value):
    """Offsets that index past their values (or go backwards) are refused before they are used
    (they were an IndexError traceback)."""
    _patch_list_offsets(out, row, value)
    name = first_name(manifest_of(out))
    fails(tool, out, rf"{name}: segment_doc_ids: list offsets out of order or past the \d+ values")


@pytest.mark.parametrize("tool", ["reader", "stats"])
def test_a_null_inside_a_segment_list_is_one_line_naming_the_file(out, tool):
    """A null among a segment column's values (its validity bitmap edited): one line, not pyarrow's
    ArrowInvalid traceback (before stop 60) nor NaN read as ids (what a conversion that copies would give)."""

    def patch(lists: pa.ListArray) -> pa.ListArray:
        values = lists.values
        valid = np.ones(values.offset + len(values), dtype=bool)
        valid[values.offset] = False  # the first value of the first list
        bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        with_null = pa.Array.from_buffers(values.type, len(values), [bitmap, values.buffers()[1]], offset=values.offset)
        return pa.Array.from_buffers(lists.type, len(lists), [None, lists.buffers()[1]], offset=lists.offset,
                                     children=[with_null])

    _patch_segments(out, patch)
    fails(tool, out, rf"{first_name(manifest_of(out))}: segment_doc_ids: a list holds null values")


@pytest.mark.parametrize("change, said", [(-1, "its shards list {} tokens in all"), (+1, "its shards list {} tokens")])
def test_counts_that_differ_from_the_shards_name_the_shards_sum(out, change, said):
    """counts.tokens one less than its shards' sum said "its shards list more than N", N being the exact sum (a
    hostile trial); the sum is said as it is, and "at least" only where the check stopped early."""
    manifest = manifest_of(out)
    total = manifest["counts"]["tokens"]
    manifest["counts"]["tokens"] = total + change
    save(out, manifest)
    with pytest.raises(InputError, match=rf"counts\.tokens={total + change} but {said.format(total)}"):
        read_packed(out)


def test_a_footer_whose_rows_do_not_add_up_is_one_plain_line():
    """It said "... its row groups 1000; that is rows in a file of 3001 bytes (at most 1048576)"."""
    from types import SimpleNamespace

    from raypack.inputs.parquet import _check_row_counts

    groups = [SimpleNamespace(num_rows=1000)]
    metadata = SimpleNamespace(num_rows=999, num_row_groups=1, row_group=lambda g: groups[g])
    with pytest.raises(InputError) as raised:
        _check_row_counts(metadata, 3001, "a.parquet")
    assert str(raised.value) == ("shard a.parquet: the footer claims 999 rows and its row groups 1000; its footer is "
                                 "damaged or hostile: re-write or remove the file")
