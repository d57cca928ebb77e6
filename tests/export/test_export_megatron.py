"""raypack export --format megatron, read back with Megatron-Core's own IndexedDataset (CPU).

Every export here is opened by ``megatron.core.datasets.indexed_dataset.IndexedDataset`` and
compared, entry for entry, with the documents it came from.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import uuid
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.cli import main
from raypack.errors import InputError
from raypack.export import EXPORTERS, ExportMismatch
from raypack.export.job import run_export, verify_export
from raypack.export.megatron import index_bytes
from raypack.io.fs import resolve_filesystem
from raypack.tokenize.corpus import build_tokenized_manifest, part_file_name, save_tokenized_manifest

from helpers import pack, write_shards


def _megatron():
    """Megatron-Core's indexed_dataset module. `make test` installs it (pyproject [test]); in CI a
    missing reader fails the tests, elsewhere it skips them with the reason."""
    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed" on CPU
        warnings.simplefilter("ignore")
        if os.environ.get("CI"):
            import megatron.core.datasets.indexed_dataset as module

            return module
        return pytest.importorskip("megatron.core.datasets.indexed_dataset",
                                   reason="megatron-core is not installed: pip install -e '.[test]' (make test does)")


def read_megatron(prefix: str) -> list[np.ndarray]:
    """Every entry of the export, read by Megatron-Core; also checks its document index is 0..n."""
    ds = _megatron().IndexedDataset(prefix)
    entries = [np.array(ds[i]) for i in range(len(ds))]  # copies: the views die with ds (its __del__ unmaps)
    assert np.array_equal(ds.document_indices, np.arange(len(ds) + 1))
    return entries


def write_tokenized(root, docs: list[list[int]], cuts: list[int], dtype: str = "uint16",
                    tokenizer: dict | None = None) -> str:
    """A tokenized corpus (raypack tokenize's layout and manifest) holding ``docs``, split at ``cuts``."""
    out = os.path.join(root, "tokens")
    os.makedirs(out, exist_ok=True)
    bounds, shards = [0, *cuts, len(docs)], []
    for k in range(len(bounds) - 1):
        name = part_file_name(k)
        part = docs[bounds[k]: bounds[k + 1]]
        pq.write_table(pa.table({"input_ids": pa.array(part, pa.list_(pa.from_numpy_dtype(np.dtype(dtype))))}),
                       os.path.join(out, name), row_group_size=3)
        data = open(os.path.join(out, name), "rb").read()
        shards.append({"path": name, "num_docs": len(part), "num_tokens": sum(map(len, part)),
                       "num_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "source": {}})
    save_tokenized_manifest(out, build_tokenized_manifest(shards, dtype, tokenizer or {"kind": "test"}, {}))
    return out


def assert_entries(prefix: str, docs: list[list[int]], dtype: str) -> None:
    entries = read_megatron(prefix)
    assert len(entries) == len(docs)
    for entry, doc in zip(entries, docs):
        assert entry.dtype == np.dtype(dtype)
        assert entry.tolist() == doc


DOCS = [[1, 2, 3], [], [4, 5, 6, 7, 8, 9, 10, 11, 12, 13], [14], [15, 16], [], [17, 18, 19, 20, 21]]


# ----------------------------------------------------------------------------- literal cases


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: spawned processes
def test_tokenized_corpus_reads_back_document_for_document(tmp_path, workers):
    src = write_tokenized(tmp_path, DOCS, cuts=[2, 5])
    summary = run_export(src, "megatron", str(tmp_path / "out" / "ds"), workers=workers)
    assert_entries(str(tmp_path / "out" / "ds"), DOCS, "uint16")
    assert summary.source.num_docs == 7 and summary.source.num_tokens == 21 and summary.num_parts == 3
    assert sorted(os.listdir(tmp_path / "out")) == ["ds.bin", "ds.idx"]  # nothing staged is left


def test_the_index_bytes_are_megatrons_own(tmp_path):
    """The .idx equals what Megatron's IndexedDatasetBuilder writes for the same documents, byte for byte."""
    mt = _megatron()
    import torch

    builder = mt.IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16)
    for doc in DOCS:
        builder.add_item(torch.tensor(doc, dtype=torch.int64))
        builder.end_document()
    builder.finalize(str(tmp_path / "ref.idx"))
    src = write_tokenized(tmp_path, DOCS, cuts=[4])
    run_export(src, "megatron", str(tmp_path / "ds"))
    assert (tmp_path / "ds.idx").read_bytes() == (tmp_path / "ref.idx").read_bytes()
    assert (tmp_path / "ds.bin").read_bytes() == (tmp_path / "ref.bin").read_bytes()
    assert index_bytes(np.dtype("uint16"), np.array([len(d) for d in DOCS])) == (tmp_path / "ref.idx").read_bytes()


def test_megatrons_gpt_dataset_samples_an_export_with_empty_documents(tmp_path):
    """Zero-length entries (documents without tokens) are accepted by Megatron's training-time
    GPTDataset too: it builds its sample index and returns full sequences of the exported tokens."""
    _megatron()
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    class Tokenizer:  # what GPTDataset asks of a tokenizer
        eod, pad, vocab_size, unique_identifiers = 0, 0, 100, {"class": "Tokenizer"}

    docs = DOCS * 5
    src = write_tokenized(tmp_path, docs, cuts=[10])
    run_export(src, "megatron", str(tmp_path / "ds"))
    config = GPTDatasetConfig(random_seed=1, sequence_length=8, blend=([str(tmp_path / "ds")], None), split="100,0,0",
                              tokenizer=Tokenizer(), reset_position_ids=False, reset_attention_mask=False,
                              eod_mask_loss=False, path_to_cache=str(tmp_path / "cache"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [20, None, None], lambda: True, config).build()
    assert len(train) >= 20
    # documents come shuffled, each whole and in order: every step inside a sample is within a document
    # or from a document's last token to a document's first
    inside = {(a, b) for d in docs for a, b in zip(d, d[1:])}
    across = {(d[-1], e[0]) for d in docs if d for e in docs if e}
    for i in range(len(train)):
        tokens = train[i]["tokens"].tolist()
        assert len(tokens) == 8 and all(step in inside | across for step in zip(tokens, tokens[1:]))


def test_packed_concat_output_gives_back_its_documents(tmp_path):
    """Documents cut across chunks, record batches and files; an empty document; a padded last chunk."""
    shard_dir = write_shards(tmp_path, DOCS, cuts=[2, 5])
    summary = pack(tmp_path, shard_dir, context_length=4, chunks_per_record_batch=2)
    assert summary.manifest["counts"]["split_documents"] > 0 and summary.manifest["counts"]["padding_positions"] > 0
    run_export(str(tmp_path / "out"), "megatron", str(tmp_path / "ds"))
    assert_entries(str(tmp_path / "ds"), DOCS, "int32")


@pytest.mark.slow  # spawned processes
def test_same_bytes_for_any_number_of_workers(tmp_path):
    docs = [list(range(k, k + k % 7)) for k in range(40)]
    src = write_tokenized(tmp_path, docs, cuts=[5, 6, 20, 33])
    run_export(src, "megatron", str(tmp_path / "one"), workers=1)
    run_export(src, "megatron", str(tmp_path / "three"), workers=3)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one{ext}").read_bytes() == (tmp_path / f"three{ext}").read_bytes()


def test_uint32_is_refused_with_the_fix_and_int32_exports_it(tmp_path):
    docs = [[70000, 1], [2]]
    src = write_tokenized(tmp_path, docs, cuts=[], dtype="uint32")
    with pytest.raises(InputError, match="dtype uint32 cannot be held by the megatron format.*--token-dtype int32"):
        run_export(src, "megatron", str(tmp_path / "ds"))
    run_export(src, "megatron", str(tmp_path / "ds"), token_dtype="int32")
    assert_entries(str(tmp_path / "ds"), docs, "int32")


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: spawned processes
def test_a_token_that_does_not_fit_the_asked_dtype_is_named(tmp_path, workers):
    """Found in the last part, after the first was written: nothing is left behind."""
    src = write_tokenized(tmp_path, [[1, 2], [3], [4, 300]], cuts=[1, 2], dtype="uint16")
    with pytest.raises(InputError, match="part 2 of the source.*token id 300 does not fit uint8"):
        run_export(src, "megatron", str(tmp_path / "ds"), token_dtype="uint8", workers=workers)
    assert sorted(os.listdir(tmp_path)) == ["tokens"]


@pytest.mark.parametrize("source", ["tokenized", "packed"])
def test_a_dtype_narrower_than_the_tokenizer_is_refused_before_writing(tmp_path, source):
    """A tokenizer of 300 ids into uint8: refused from the manifest's vocabulary, before any part is
    read (it was found while writing, at the first id over 255), even where no id here reaches it."""
    src = write_tokenized(tmp_path, [[1, 2], [3]], cuts=[], tokenizer={"kind": "test", "vocab_size": 300})
    if source == "packed":
        argv = ["pack", "--local", "--input", src, "--output", str(tmp_path / "out"), "--context-length", "4"]
        assert main(argv) == 0
        src = str(tmp_path / "out")
    with pytest.raises(InputError, match=r"--token-dtype uint8 cannot hold the ids of .*: its tokenizer has 300 ids "
                                         r"\(up to 299, and uint8 holds up to 255\); pass --token-dtype uint16"):
        run_export(src, "megatron", str(tmp_path / "ds"), token_dtype="uint8")
    assert not (tmp_path / "ds.bin").exists()
    run_export(src, "megatron", str(tmp_path / "ds"), token_dtype="uint16")


def test_a_failed_overwrite_keeps_the_old_export(tmp_path):
    src = write_tokenized(tmp_path, [[1, 2], [3], [4, 300]], cuts=[1, 2], dtype="uint16")
    run_export(src, "megatron", str(tmp_path / "ds"))
    before = {name: (tmp_path / name).read_bytes() for name in ("ds.bin", "ds.idx")}
    with pytest.raises(InputError, match="does not fit uint8"):
        run_export(src, "megatron", str(tmp_path / "ds"), token_dtype="uint8", overwrite=True)
    assert {name: (tmp_path / name).read_bytes() for name in ("ds.bin", "ds.idx")} == before
    assert sorted(os.listdir(tmp_path)) == ["ds.bin", "ds.idx", "tokens"]


def test_overwrite_never_pairs_the_old_index_with_new_data(tmp_path, monkeypatch):
    """The old .idx goes before the new .bin takes its name: a crash between them leaves no readable
    pair (Megatron's IndexedDataset.exists needs both), never old lengths over new tokens."""
    import raypack.export.megatron as megatron

    src = write_tokenized(tmp_path, DOCS, cuts=[3])
    run_export(src, "megatron", str(tmp_path / "ds"))
    other = write_tokenized(tmp_path / "other", [[9] * 30], cuts=[])

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(megatron, "write_whole", crash)
    with pytest.raises(KeyboardInterrupt):
        run_export(other, "megatron", str(tmp_path / "ds"), overwrite=True)
    assert not (tmp_path / "ds.idx").exists()
    assert not _megatron().IndexedDataset.exists(str(tmp_path / "ds"))


def _fetch(uri: str, local: str) -> None:
    fs, path = resolve_filesystem(uri)
    with fs.open_input_stream(path) as f, open(local, "wb") as out:
        out.write(f.read())


def test_object_store_output_appears_whole_with_nothing_else(tmp_path):
    """memory:// (fsspec, a non-local filesystem): parts uploaded as objects, concatenated, then deleted."""
    pytest.importorskip("fsspec")
    shard_dir = write_shards(tmp_path, DOCS, cuts=[2, 5])
    pack(tmp_path, shard_dir, context_length=4)
    root = f"memory://raypack-export-{uuid.uuid4().hex}"
    run_export(str(tmp_path / "out"), "megatron", f"{root}/exp/ds", verify=True)
    fs, base = resolve_filesystem(f"{root}/exp")
    names = sorted(posixpath.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(base)))
    assert names == ["ds.bin", "ds.idx"]
    for ext in (".bin", ".idx"):
        _fetch(f"{root}/exp/ds{ext}", str(tmp_path / f"ds{ext}"))
    assert_entries(str(tmp_path / "ds"), DOCS, "int32")
    with pytest.raises(InputError, match="ds.bin exists"):
        run_export(str(tmp_path / "out"), "megatron", f"{root}/exp/ds")


def test_object_store_failure_leaves_no_part_object(tmp_path):
    pytest.importorskip("fsspec")
    src = write_tokenized(tmp_path, [[1, 2], [3], [4, 300]], cuts=[1, 2], dtype="uint16")
    root = f"memory://raypack-export-{uuid.uuid4().hex}"
    with pytest.raises(InputError, match="does not fit uint8"):
        run_export(src, "megatron", f"{root}/exp/ds", token_dtype="uint8")
    fs, base = resolve_filesystem(f"{root}/exp")
    assert [i.path for i in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))] == []


def test_a_source_of_empty_documents_only_is_refused(tmp_path):
    """Megatron's reader cannot memory-map an empty .bin, so such an export would be unreadable."""
    src = write_tokenized(tmp_path, [[], []], cuts=[1])
    with pytest.raises(InputError, match="holds no tokens \\(2 empty documents\\)"):
        run_export(src, "megatron", str(tmp_path / "ds"))
    assert sorted(os.listdir(tmp_path)) == ["tokens"]


# ----------------------------------------------------------------------------- property


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.lists(st.integers(0, 65535), max_size=12), min_size=1, max_size=25),
       data=st.data(), context_length=st.integers(1, 9))
def test_any_concat_pack_exports_its_documents(tmp_path_factory, docs, data, context_length):
    root = tmp_path_factory.mktemp("c")
    cuts = sorted(data.draw(st.sets(st.integers(1, len(docs)), max_size=3)))
    shard_dir = write_shards(root, docs, cuts=[c for c in cuts if c < len(docs)], dtype=pa.uint16())
    pack(root, shard_dir, context_length=context_length)
    if not any(docs):
        with pytest.raises(InputError, match="holds no tokens.*Megatron cannot open an empty .bin"):
            run_export(str(root / "out"), "megatron", str(root / "ds"))
        return
    run_export(str(root / "out"), "megatron", str(root / "ds"), workers=1)
    assert_entries(str(root / "ds"), docs, "uint16")
    assert verify_export(str(root / "out"), "megatron", str(root / "ds"))
    tokens = write_tokenized(root, docs, cuts=[c for c in cuts if c < len(docs)])  # the other source, same bytes
    run_export(tokens, "megatron", str(root / "from-tokens"))
    for ext in (".bin", ".idx"):
        assert (root / f"from-tokens{ext}").read_bytes() == (root / f"ds{ext}").read_bytes()


# ----------------------------------------------------------------------------- bad input, one line, exit 2


def _cli_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("raypack: error: ")
    return err


def test_source_without_a_manifest(tmp_path, capsys):
    os.makedirs(tmp_path / "empty")
    err = _cli_error(capsys, ["export", str(tmp_path / "empty"), "--format", "megatron",
                              "--output", str(tmp_path / "d")])
    assert "holds no manifest.json" in err


def test_unknown_format(tmp_path, capsys):
    src = write_tokenized(tmp_path, DOCS, cuts=[])
    err = _cli_error(capsys, ["export", src, "--format", "tfrecord", "--output", str(tmp_path / "d")])
    assert "unknown export format 'tfrecord'; known: megatron, mds" in err


def test_existing_output_needs_overwrite(tmp_path, capsys):
    src = write_tokenized(tmp_path, DOCS, cuts=[])
    argv = ["export", src, "--format", "megatron", "--output", str(tmp_path / "ds")]
    assert main(argv) == 0
    before = (tmp_path / "ds.idx").read_bytes()
    assert "ds.bin exists; pass --overwrite" in _cli_error(capsys, argv)
    assert (tmp_path / "ds.idx").read_bytes() == before
    assert main([*argv, "--overwrite", "--token-dtype", "int32"]) == 0
    assert_entries(str(tmp_path / "ds"), DOCS, "int32")


@pytest.mark.parametrize("extra, message", [
    (["--verify-only", "--overwrite"], "--verify-only and --overwrite cannot be used together"),
    (["--workers", "0"], "--workers 0: must be an integer >= 1"),
    (["--token-dtype", "uint64"], "--token-dtype uint64 cannot be held by the megatron format"),
])
def test_bad_flags(tmp_path, capsys, extra, message):
    src = write_tokenized(tmp_path, DOCS, cuts=[])
    assert message in _cli_error(capsys, ["export", src, "--format", "megatron", "--output", str(tmp_path / "d"),
                                          *extra])
    assert sorted(os.listdir(tmp_path)) == ["tokens"]


def test_best_fit_output_is_refused_with_the_way_out(tmp_path, capsys):
    shard_dir = write_shards(tmp_path, DOCS, cuts=[3])
    pack(tmp_path, shard_dir, strategy="best_fit")
    err = _cli_error(capsys, ["export", str(tmp_path / "out"), "--format", "megatron", "--output",
                              str(tmp_path / "d")])
    assert "strategy best_fit" in err and "export the tokenized corpus or the pack's inputs instead" in err


def test_best_fit_output_packed_from_text_is_refused_naming_the_text_and_tokenize(tmp_path, capsys):
    """Its inputs are text, which export does not read: the way out is tokenize, then export."""
    (tmp_path / "text").mkdir()
    pq.write_table(pa.table({"text": [f"document {i} " * (i % 4 + 1) for i in range(40)]}),
                   tmp_path / "text" / "a.parquet")
    assert main(["pack", "--local", "--input", str(tmp_path / "text"), "--tokenizer", "tiktoken:cl100k_base",
                 "--context-length", "32", "--strategy", "best_fit", "--output", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    err = _cli_error(capsys, ["export", str(tmp_path / "out"), "--format", "megatron", "--output",
                              str(tmp_path / "d")])
    assert f"from text ({tmp_path / 'text' / 'a.parquet'}); raypack tokenize that text" in err, err
    assert "pack's inputs" not in err


# ----------------------------------------------------------------------------- verify, summary


def test_cli_summary_and_verify(tmp_path, capsys):
    src = write_tokenized(tmp_path, DOCS, cuts=[3])
    assert main(["export", src, "--format", "megatron", "--output", str(tmp_path / "ds"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "exported" in out and "documents              7" in out and "verified" in out


def test_verify_finds_a_changed_token(tmp_path, capsys):
    src = write_tokenized(tmp_path, DOCS, cuts=[3])
    run_export(src, "megatron", str(tmp_path / "ds"))
    data = bytearray((tmp_path / "ds.bin").read_bytes())
    data[10] ^= 1
    (tmp_path / "ds.bin").write_bytes(bytes(data))
    with pytest.raises(ExportMismatch, match="ds.bin: token 5 is"):
        verify_export(src, "megatron", str(tmp_path / "ds"))
    assert main(["export", src, "--format", "megatron", "--output", str(tmp_path / "ds"), "--verify-only"]) == 1
    assert "verify failed" in capsys.readouterr().err


def test_registry_is_the_cli_choice():
    assert set(EXPORTERS) == {"megatron", "mds"}
    assert all(cls.name == name for name, cls in EXPORTERS.items())


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    import errno

    import raypack.export.megatron as megatron

    src = write_tokenized(tmp_path, DOCS, cuts=[3])
    real = megatron.MegatronExporter.write_part

    def full(self, part, batches):
        if part.index == 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "ds.bin"))
        return real(self, part, batches)

    monkeypatch.setattr(megatron.MegatronExporter, "write_part", full)
    assert main(["export", src, "--format", "megatron", "--output", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "nothing was published" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["tokens"]


def _quiet_then_wait(started) -> None:
    import time

    from raypack.export.job import _leave_quietly_on_ctrl_c

    _leave_quietly_on_ctrl_c()
    started.set()
    time.sleep(60)


def test_a_pool_process_leaves_quietly_on_ctrl_c():
    """``export --workers N``: a Ctrl-C (sent to the whole process group) printed a KeyboardInterrupt
    traceback from each pool process above the one line; now such a process ends at once, exit 130."""
    import multiprocessing
    import signal

    context = multiprocessing.get_context("spawn")
    started = context.Event()
    process = context.Process(target=_quiet_then_wait, args=(started,))
    process.start()
    assert started.wait(60)
    os.kill(process.pid, signal.SIGINT)
    process.join(30)
    assert process.exitcode == 130


@pytest.mark.parametrize("given", ["out/", "out"])
def test_an_output_that_names_a_directory_is_one_line(tmp_path, capsys, given):
    """A new user's trial: --output build/megatron/ wrote build/megatron.bin and .idx beside the directory, and
    the summary said "build/megatron/.bin"."""
    src = write_tokenized(tmp_path, DOCS, cuts=[3])
    (tmp_path / "out").mkdir()
    output = str(tmp_path / given)
    assert main(["export", src, "--format", "megatron", "--output", output]) == 2
    assert capsys.readouterr().err == (f"raypack: error: --output {output} names a directory; megatron's --output is "
                                       f"a prefix of two files: give e.g. {tmp_path / 'out' / 'corpus'} for "
                                       "corpus.bin and corpus.idx in it\n")
    assert sorted(os.listdir(tmp_path)) == ["out", "tokens"] and not os.listdir(tmp_path / "out")


def test_verify_only_without_token_dtype_takes_the_exports_own(tmp_path):
    """A new user's trial (docs/MDS.md's three lines): an export made with --token-dtype uint16 was reported as
    damaged ("token dtype uint16, expected int32") by --verify-only without the flag again."""
    src = write_tokenized(tmp_path, DOCS, cuts=[3])
    run_export(src, "megatron", str(tmp_path / "ds"), token_dtype="uint16")
    assert verify_export(src, "megatron", str(tmp_path / "ds"))[-1].split() == ["dtype", "uint16"]
    with pytest.raises(ExportMismatch, match="token dtype uint16, expected int32"):  # asked for: still checked
        verify_export(src, "megatron", str(tmp_path / "ds"), token_dtype="int32")
