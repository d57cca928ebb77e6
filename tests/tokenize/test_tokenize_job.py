"""raypack tokenize and pack --tokenizer end to end: every document's ids are the tokenizer's
own, one run equals two, output bytes do not depend on engine, workers or batch sizes, resume
reuses finished tasks, bad input exits 2 with one line and publishes nothing."""

from __future__ import annotations

import dataclasses
import glob
import gzip
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raypack.pack.packer as packer
import raypack.tokenize.job as tokenize_job
import raypack.tokenize.onepass as onepass
import raypack.tokenize.tasks as text_tasks
from raypack.cli import main
from raypack.errors import InputError
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.pack.plan import make_plan
from raypack.tokenize.job import TextOptions, TokenizeConfig, run_tokenize
from raypack.tokenize.tasks import rayon_threads
from raypack.tokenize.tokenizers import load_tokenizer

from helpers import CORPUS, train_byte_level_bpe
from packing_faults import check_published_before_the_manifest, record_fsyncs

tokenizers = pytest.importorskip("tokenizers")

WORDS = ["the", "quick", "brown", "fox", "東京", "首都", "我爱北京", "😀", "👨‍👩‍👧‍👦", "🇯🇵", "مرحبا", "العربية",
         "שלום", "עברית", "Ωμέγα", "Кириллица", "e\u0301", "\u200f", "def", "return", "42", "\t", "\n"]


def make_texts(num_docs: int, seed: int = 0) -> list[str]:
    """Documents of 0-60 words (non-ASCII, emoji, RTL), empty and whitespace-only ones, one very long."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(0, 60))) for _ in range(num_docs)]
    texts[3], texts[5], texts[8] = "", "   ", "\n\t \r\n"
    texts[num_docs // 2] = " ".join(CORPUS) * 300  # ~ 110k characters, one document
    return texts


TEXTS = make_texts(240)
PARQUET_DOCS = 150  # TEXTS[:150] in a.parquet, the rest in b.jsonl


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """(reference Tokenizer, path of its tokenizer.json): a byte-level BPE of ~600 ids."""
    reference = train_byte_level_bpe(CORPUS * 20 + TEXTS[:50], 600)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    reference.save(str(path))
    return reference, str(path)


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """a.parquet (row groups of 16 rows) then b.jsonl: TEXTS in this order."""
    root = tmp_path_factory.mktemp("text")
    pq.write_table(pa.table({"id": range(PARQUET_DOCS), "text": TEXTS[:PARQUET_DOCS]}), root / "a.parquet",
                   row_group_size=16)
    with open(root / "b.jsonl", "w", encoding="utf-8") as f:
        for text in TEXTS[PARQUET_DOCS:]:
            f.write(json.dumps({"text": text, "n": 1}, ensure_ascii=False) + "\n")
    return str(root)


def options(tok, **kw) -> TextOptions:
    values = dict(tokenizer=tok[1], task_rows=40, task_bytes=3000, row_group_docs=7, batch_rows=5)
    return TextOptions(**{**values, **kw})


def tokenize(tmp_path, text_dir, tok, name="tok", engine="local", workers=2, resume=False, **kw) -> str:
    out = str(tmp_path / name)
    run_tokenize(TokenizeConfig(inputs=(text_dir,), output=out, text=options(tok, **kw), num_workers=workers),
                 engine=engine, resume=resume)
    return out


def read_documents(out: str) -> list[list[int]]:
    parts = sorted(glob.glob(os.path.join(out, "part-*.parquet")))
    return [ids for p in parts for ids in pq.read_table(p).column("input_ids").to_pylist()]


def digests(out: str, pattern: str) -> dict[str, str]:
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in sorted(glob.glob(os.path.join(out, pattern)))}


def manifest_of(out: str) -> dict:
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- token for token


def test_every_document_equals_the_tokenizers_encode(tmp_path, text_dir, tok):
    out = tokenize(tmp_path, text_dir, tok, bos="<bos>", eos="1")
    reference, _ = tok
    bos, eos = reference.token_to_id("<bos>"), 1
    expected = [[bos, *reference.encode(t, add_special_tokens=False).ids, eos] for t in TEXTS]
    documents = read_documents(out)
    assert len(documents) == len(TEXTS)
    for k, (got, want) in enumerate(zip(documents, expected)):
        assert got == want, f"document {k}"
    assert max(map(len, expected)) > 5_000  # the very long text is there
    manifest = manifest_of(out)
    assert manifest["kind"] == "tokenized" and manifest["token_dtype"] == "uint16"
    assert manifest["counts"] == {"documents": len(TEXTS), "tokens": sum(map(len, expected)),
                                  "shards": len(manifest["shards"])}
    assert [s["num_docs"] for s in manifest["shards"]] == [len(pq.read_table(os.path.join(out, s["path"])))
                                                          for s in manifest["shards"]]
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(open(tok[1], "rb").read()).hexdigest()
    assert manifest["options"]["bos_id"] == bos and manifest["options"]["eos_id"] == eos
    assert pq.read_schema(os.path.join(out, "part-000000.parquet")).field("input_ids").type == pa.list_(pa.uint16())
    assert sorted(os.listdir(out)) == sorted(["manifest.json", *(s["path"] for s in manifest["shards"])])


@pytest.mark.parametrize("command, workers", [("pack", 1), ("pack", 2), ("tokenize", 1)])
@pytest.mark.parametrize("when", ["after the plan", "during a task"])
def test_a_text_file_rewritten_during_the_run_is_refused(tmp_path, tok, capsys, monkeypatch, command, workers, when):
    """A JSONL file rewritten in place (its lines in another order, the same size) between its tasks,
    or while one is read: the tasks read two versions, and the output held 306 or 394 documents for
    300 lines, exit 0 (found by a new-user trial). Each task now checks its file before and after; also
    where the next tasks' texts are read ahead (``pack --workers 2``, and ``tokenize``)."""
    from raypack.inputs.jsonl import JsonLinesFormat

    lines = [json.dumps({"text": f"document {i:03d} " + "x" * (i % 7)}) + "\n" for i in range(300)]
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "a.jsonl"
    path.write_text("".join(lines))
    rewrite = lambda: path.write_text("".join(reversed(lines)))  # noqa: E731
    if when == "after the plan":
        import raypack.tokenize.job as job

        planned = job.plan_text_tasks
        monkeypatch.setattr(job, "plan_text_tasks", lambda *a, **k: (planned(*a, **k), rewrite())[0])
    else:
        real = JsonLinesFormat.iter_texts

        def iter_texts(self, *args, **kwargs):
            for k, item in enumerate(real(self, *args, **kwargs)):
                if k == 0 and path.read_text() == "".join(lines):
                    rewrite()
                yield item

        monkeypatch.setattr(JsonLinesFormat, "iter_texts", iter_texts)
    args = ["--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer", tok[1],
            "--task-bytes", "4000", "--workers", str(workers), *(["--context-length", "16"] if command == "pack" else [])]
    code = main([command, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"text file {path} changed during the run (its first or last MiB differ" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("command, workers", [("pack", 1), ("pack", 2), ("tokenize", 1)])
def test_a_text_file_cut_short_while_it_is_read_is_named_as_changed(tmp_path, tok, capsys, monkeypatch, command,
                                                                    workers):
    """A JSONL file cut mid-line while a task reads it: its last line is then half a JSON object, and the
    run said "bad JSON" on that line, as if the file were broken (found by a hostile trial). Now the
    error says the file changed during the run."""
    from raypack.inputs import jsonl

    lines = [json.dumps({"text": f"document {i:03d} " + "x" * (i % 7)}) + "\n" for i in range(300)]
    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "a.jsonl"
    path.write_text("".join(lines))
    real = jsonl._split_lines

    def small_blocks(stream, position, end, block_bytes, max_line_bytes):
        for k, block in enumerate(real(stream, position, end, 1000, max_line_bytes)):
            if k == 0:
                path.write_bytes(path.read_bytes()[:5005])  # mid-line
            yield block

    monkeypatch.setattr(jsonl, "_split_lines", small_blocks)
    args = ["--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer", tok[1],
            "--workers", str(workers), *(["--context-length", "16"] if command == "pack" else [])]
    code = main([command, *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"text file {path} changed during the run (" in err[0] and "5,005 now)" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("flag, said", [
    (["--pad-token", "600"], "--pad-token 600 (pad_token in a config) is outside the tokenizer's vocabulary [0, 600)"),
    (["--pad-token", "-1"], "--pad-token -1: must be a token id >= 0 (padding is marked by doc_ids -1"),
    (["--token-dtype", "uint8"], "--token-dtype uint8 holds ids up to 255, but the tokenizer's vocabulary has 600 ids; "
                                 "use --token-dtype uint16 or auto"),
])
def test_what_pack_writes_must_hold_the_tokenizers_ids(tmp_path, text_dir, tok, capsys, monkeypatch, flag, said):
    """A pad id outside the vocabulary was written into the last chunk (a model's embedding has no row
    for it), exit 0; a token dtype too narrow failed at the first id over it, once tokenizing ran."""
    import raypack.tokenize.job as job

    monkeypatch.setattr(job, "plan_text_tasks", lambda *a, **k: pytest.fail("checked after planning"))
    code = main(["pack", "--local", "--input", text_dir, "--output", str(tmp_path / "out"), "--context-length", "16",
                 "--tokenizer", tok[1], *flag])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_tokenized_corpus_is_packed_with_the_pad_ids_check_of_the_one_pass(tmp_path, text_dir, tok, capsys):
    """An exactness trial: --pad-token 600 outside a 600-id vocabulary was refused by pack --tokenizer and packed by
    tokenize + pack of the same text (exit 0, the last chunk padded with 600). The tokenized corpus's manifest
    records the vocabulary, so that route refuses it alike."""
    out = tokenize(tmp_path, text_dir, tok)
    code = main(["pack", "--local", "--input", out, "--output", str(tmp_path / "packed"), "--context-length", "16",
                 "--pad-token", "600"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--pad-token 600 (pad_token in a config) is outside the tokenizer's " \
        "vocabulary [0, 600)" in err[0], err
    assert not (tmp_path / "packed").exists()
    assert main(["pack", "--local", "--input", out, "--output", str(tmp_path / "packed"), "--context-length", "16",
                 "--pad-token", "599"]) == 0


def test_a_tokenizer_json_that_makes_the_library_panic_is_one_line(tmp_path):
    """tokenizers panics (pyo3's PanicException, a BaseException) on a BPE whose continuing_subword_prefix
    its merges lack: it was a traceback, and the run's staging directory was left."""
    config = json.loads(train_byte_level_bpe(CORPUS * 20, 600).to_str())
    config["model"]["continuing_subword_prefix"] = "##"
    (tmp_path / "tokenizer.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"is not a Hugging Face tokenizer\.json \("):
        load_tokenizer(str(tmp_path / "tokenizer.json"))


def test_token_dtype_wider_than_auto(tmp_path, text_dir, tok):
    out = tokenize(tmp_path, text_dir, tok, token_dtype="uint32")
    assert pq.read_schema(os.path.join(out, "part-000000.parquet")).field("input_ids").type == pa.list_(pa.uint32())
    assert read_documents(out) == [tok[0].encode(t, add_special_tokens=False).ids for t in TEXTS]


def test_tiktoken_through_the_job(tmp_path, text_dir):
    tiktoken = pytest.importorskip("tiktoken")
    from raypack.tokenize.tokenizers import load_tokenizer

    encoding = load_tokenizer("tiktoken:cl100k_base")._encoding
    out = str(tmp_path / "tt")
    run_tokenize(TokenizeConfig(inputs=(text_dir,), output=out, text=TextOptions(tokenizer="tiktoken:cl100k_base",
                                eos="<|endoftext|>", task_rows=40, task_bytes=3000)), engine="local")
    assert isinstance(encoding, tiktoken.Encoding) and manifest_of(out)["token_dtype"] == "uint32"
    assert read_documents(out) == [[*encoding.encode_ordinary(t), 100257] for t in TEXTS]


# ----------------------------------------------------------------------------- one run == two runs


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_pack_with_tokenizer_equals_tokenize_then_pack(tmp_path, text_dir, tok, strategy):
    tokenized = tokenize(tmp_path, text_dir, tok, eos="<eos>")
    common = dict(context_length=32, pad_token=0, strategy=strategy, best_fit_window=16)
    two = run_pack(make_config(dict(inputs=[tokenized], output=str(tmp_path / "two"), **common)), engine="local")
    one = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "one"), **common)), engine="local",
                   text=options(tok, eos="<eos>"))
    assert one.manifest["content_sha256"] == two.manifest["content_sha256"]
    assert digests(tmp_path / "one", "*.arrow") == digests(tmp_path / "two", "*.arrow")
    assert len(digests(tmp_path / "one", "*.arrow")) > 2 and one.manifest["counts"]["split_documents"] > 0
    assert sorted(os.listdir(tmp_path / "one")) == sorted(["manifest.json", *digests(tmp_path / "one", "*.arrow")])
    assert not glob.glob(str(tmp_path / ".one.*"))  # staging gone
    assert main(["verify", str(tmp_path / "two")]) == 0
    assert main(["verify", str(tmp_path / "one")]) == 0


def test_a_local_run_measures_its_peak_from_its_start_not_each_tasks(tmp_path, text_dir, tok, monkeypatch):
    """The kernel's peak counter (VmHWM, and with it ru_maxrss, what /usr/bin/time reads) is reset once
    per local run. A reset at each task's start hid the peaks before it, its tokenizing included, from
    the summary and from any outside measure (a hostile trial: 257 MiB reported, 1.6 GiB used)."""
    resets = []
    monkeypatch.setattr(packer, "reset_peak_rss", lambda: resets.append(1))
    tokenized = tokenize(tmp_path, text_dir, tok)
    common = dict(context_length=32, pad_token=0, num_workers=2)
    two = run_pack(make_config(dict(inputs=[tokenized], output=str(tmp_path / "two"), **common)), engine="local")
    assert len(two.manifest["files"]) > 2 and len(resets) == 1
    one = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "one"), **common)), engine="local",
                   text=options(tok))
    assert len(one.manifest["files"]) > 2 and len(resets) == 2


def test_a_local_one_pass_peak_holds_its_tokenizing(tmp_path, tok):
    """One 3 MB document through the reference library, which needs ~150 bytes a byte of text to
    encode it, where packing its ids needs ~20 MiB: the summary's peak holds the tokenizing."""
    text = " ".join(CORPUS)
    pq.write_table(pa.table({"text": ["short"] * 20 + [text * (3_000_000 // len(text))] + ["short"] * 20}),
                   tmp_path / "a.parquet", row_group_size=10)
    summary = run_pack(make_config(dict(inputs=[str(tmp_path / "a.parquet")], output=str(tmp_path / "out"),
                                        context_length=256, pad_token=0)),
                       engine="local", text=TextOptions(tokenizer=tok[1], tokenizer_backend="reference"))
    assert summary.peak_worker_rss_bytes > 200 << 20


def test_manifests_name_the_text_each_shard_came_from(tmp_path, text_dir, tok, capsys):
    tokenized = tokenize(tmp_path, text_dir, tok)
    common = dict(context_length=32, pad_token=0)
    two = run_pack(make_config(dict(inputs=[tokenized], output=str(tmp_path / "two"), **common)), engine="local")
    one = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "one"), **common)), engine="local",
                   text=options(tok))
    sources = [s["source"] for s in json.load(open(os.path.join(tokenized, "manifest.json")))["shards"]]
    assert [s["source"] for s in two.manifest["shards"]] == sources  # the parts are kept: path is the part
    assert all(s["path"].startswith(tokenized) and s["format"] == "parquet" for s in two.manifest["shards"])
    rows = one.manifest["shards"]  # the parts are gone: the shard is its text range
    assert [(r["path"], r["format"], r["text"]) for r in rows] == [
        (s["path"], "text", {k: s[k] for k in ("format", "start", "end")}) for s in sources]
    assert all(os.path.exists(r["path"]) for r in rows)
    assert [r["num_tokens"] for r in rows] == [r["num_tokens"] for r in two.manifest["shards"]]
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "one")]) == 0
    said = capsys.readouterr().out
    assert "not compared (text, tokenized in the run" in said and "gone" not in said, said


def test_both_routes_record_the_tokenizer_in_the_packed_manifest(tmp_path, text_dir, tok):
    tokenized = tokenize(tmp_path, text_dir, tok, bos="<bos>", eos="<eos>")
    common = dict(context_length=32, pad_token=0)
    two = run_pack(make_config(dict(inputs=[tokenized], output=str(tmp_path / "two"), **common)), engine="local")
    one = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "one"), **common)), engine="local",
                   text=options(tok, bos="<bos>", eos="<eos>"))
    corpus = manifest_of(tokenized)
    expected = {"identity": corpus["tokenizer"], "options": corpus["options"], "backends": [corpus["backend"]]}
    assert corpus["backend"]["name"] in ("gigatoken", "reference")
    assert expected["identity"]["sha256"] == hashlib.sha256(open(tok[1], "rb").read()).hexdigest()
    assert expected["options"]["bos"] == "<bos>" and expected["options"]["text_column"] == "text"
    assert manifest_of(tmp_path / "one")["tokenizer"] == manifest_of(tmp_path / "two")["tokenizer"] == expected
    differ = {k for k in one.manifest if one.manifest[k] != two.manifest[k]}
    assert differ == {"config", "shards"}  # only where: config inputs and each shard's path/source
    where = ("path", "format", "source", "text")
    strip = [[{k: v for k, v in row.items() if k not in where} for row in m.manifest["shards"]] for m in (one, two)]
    assert strip[0] == strip[1]
    cfg_one, cfg_two = one.manifest["config"], two.manifest["config"]
    assert {k for k in cfg_one if cfg_one[k] != cfg_two[k]} == {"inputs"}
    plain = run_pack(make_config(dict(inputs=[os.path.join(tokenized, "*.parquet")], output=str(tmp_path / "p"),
                                      **common)), engine="local")
    assert "tokenizer" not in plain.manifest  # token inputs: no key, manifest bytes as before


@pytest.mark.slow  # starts Ray or an S3 server: not the fast tier (tests/conftest.py)
def test_pack_refuses_corpora_tokenized_differently(tmp_path, text_dir, tok, capsys):
    first = tokenize(tmp_path, text_dir, tok, name="a", eos="<eos>")
    second = tokenize(tmp_path, text_dir, tok, name="b")
    code = main(["pack", "--input", first, "--input", second, "--output", str(tmp_path / "o"), "--context-length", "32"])
    assert code == 2 and "tokenized with another tokenizer or options" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "o")


def test_pack_takes_counts_from_the_tokenized_manifest(tmp_path, text_dir, tok):
    tokenized = tokenize(tmp_path, text_dir, tok)
    plan = make_plan(make_config(dict(inputs=[tokenized], output=str(tmp_path / "o"), context_length=32)))
    assert {s.count_method for s in plan.shards} == {"manifest"}
    footer = make_plan(make_config(dict(inputs=[os.path.join(tokenized, "*.parquet")], output=str(tmp_path / "o"),
                                        context_length=32)))
    assert [(s.num_docs, s.num_tokens) for s in plan.shards] == [(s.num_docs, s.num_tokens) for s in footer.shards]
    assert plan.token_dtype == "uint16"


@pytest.mark.parametrize("command", ["stats", "verify"])
def test_stats_and_verify_name_a_tokenized_corpus_for_what_it_is(tmp_path, text_dir, tok, capsys, command):
    code = main([command, tokenize(tmp_path, text_dir, tok)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and err.startswith("raypack: error: ")  # the wrong thing, not a failed audit
    assert "a tokenized corpus (raypack tokenize's output" in err and "pack it first: raypack pack --input" in err
    assert main([command, text_dir]) == 2  # an input directory
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "an input, not a packed output" in err
    assert main([command, str(tmp_path / "no-such-dir")]) == 2  # a mistyped path: it was exit 1, "verify failed"
    err = capsys.readouterr().err.strip()
    assert err == f"raypack: error: {tmp_path / 'no-such-dir'}: no such output directory; check the path"


@pytest.mark.parametrize("mistake", ["text column", "output not empty", "unfinished run"])
@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_cheap_mistakes_are_one_line_before_ray_starts(tmp_path, text_dir, tok, monkeypatch, mistake, command):
    """A wrong --text-column or an output that is not free costs no Ray start-up (seconds)."""
    import raypack.engine.session as session
    import raypack.pack.job as pack_job

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(pack_job, "connect_ray", no_ray)
    monkeypatch.setattr(session, "connect_ray", no_ray)
    out = tmp_path / "out"
    if mistake == "output not empty":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif mistake == "unfinished run":
        (tmp_path / ".out.raypack-staging-partial" / "_results").mkdir(parents=True)  # a finished task's record
        (tmp_path / ".out.raypack-staging-partial" / "_results" / "task-000000.json").write_text("{}")
    text = options(tok, **({"text_column": "body"} if mistake == "text column" else {}))
    expected = {"text column": "has no column 'body'", "output not empty": "holds 'notes.txt', which raypack did not",
                "unfinished run": "did not finish"}[mistake]
    with pytest.raises(InputError, match=expected):
        if command == "pack":
            run_pack(make_config(dict(inputs=[text_dir], output=str(out), context_length=32)), engine="ray", text=text)
        else:
            run_tokenize(TokenizeConfig(inputs=(text_dir,), output=str(out), text=text), engine="ray")


def test_a_tokenized_corpus_given_by_a_relative_path_packs_to_an_output_verify_reads(tmp_path, text_dir, tok,
                                                                                     monkeypatch, capsys):
    """The README's two steps from the shell, relative paths: the packed manifest names the parts
    by absolute path (as any other input), so ``verify OUT`` finds and checks them."""
    monkeypatch.chdir(tmp_path)
    assert main(["tokenize", "--input", text_dir, "--output", "tok", "--tokenizer", tok[1], "--local"]) == 0
    assert main(["pack", "--input", "tok", "--output", "out", "--local", "--context-length", "64"]) == 0
    capsys.readouterr()
    assert main(["verify", "out"]) == 0, capsys.readouterr().err
    assert all(os.path.isabs(s["path"]) for s in manifest_of(tmp_path / "out")["shards"])


def test_pack_refuses_a_tokenized_corpus_whose_file_changed(tmp_path, text_dir, tok, capsys):
    tokenized = tokenize(tmp_path, text_dir, tok)
    with open(os.path.join(tokenized, "part-000001.parquet"), "ab") as f:
        f.write(b"x")
    code = main(["pack", "--input", tokenized, "--output", str(tmp_path / "o"), "--local", "--context-length", "64"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "part-000001.parquet is" in err and "re-run raypack tokenize" in err


def test_pack_summary_names_the_tokenizer_and_the_backend_that_computed_the_ids(tmp_path, text_dir, tok, capsys):
    args = ["pack", "--input", text_dir, "--output", str(tmp_path / "o"), "--local", "--context-length", "64",
            "--tokenizer", tok[1], "--tokenizer-backend", "reference"]
    assert main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("tokenizer")]
    import tokenizers
    assert lines == [f"  tokenizer        {tok[1]} ({tok[0].get_vocab_size():,} ids), ids by reference tokenizers "
                     f"{tokenizers.__version__}"]
    assert main(["pack", "--input", tokenize(tmp_path, text_dir, tok), "--output", str(tmp_path / "t"), "--local",
                 "--context-length", "64"]) == 0
    assert "tokenizer" in capsys.readouterr().out  # packed from a tokenized corpus: its tokenizer is named too


# ----------------------------------------------------------------------------- split invariance


def test_bytes_do_not_depend_on_engine_workers_or_batch_sizes(ray_session, tmp_path, text_dir, tok):
    local = tokenize(tmp_path, text_dir, tok, "local", batch_rows=3)
    manifest = manifest_of(local)
    formats = [s["source"]["format"] for s in manifest["shards"]]
    assert formats.count("parquet") > 1 and formats.count("jsonl") > 1  # files split into several tasks
    assert pq.ParquetFile(os.path.join(local, "part-000000.parquet")).metadata.num_row_groups > 1
    expected = digests(local, "part-*.parquet")
    for workers, batch_rows in ((1, 1024), (2, 2)):
        out = tokenize(tmp_path, text_dir, tok, f"ray{workers}", engine="ray", workers=workers, batch_rows=batch_rows)
        assert digests(out, "part-*.parquet") == expected, f"{workers} workers"
        assert manifest_of(out)["shards"] == manifest["shards"]
    packed = [run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / f"one-{engine}"), context_length=32,
                                        num_workers=2)), engine=engine, text=options(tok)) for engine in ("local", "ray")]
    assert packed[0].manifest["content_sha256"] == packed[1].manifest["content_sha256"]


def test_local_bytes_do_not_depend_on_the_read_batch_size(tmp_path, text_dir, tok):
    small = tokenize(tmp_path, text_dir, tok, "small", batch_rows=1, row_group_docs=5)
    large = tokenize(tmp_path, text_dir, tok, "large", batch_rows=1000, row_group_docs=5, batch_bytes=1 << 30)
    pieces = tokenize(tmp_path, text_dir, tok, "pieces", batch_rows=1000, row_group_docs=5, batch_bytes=50)
    assert pq.ParquetFile(os.path.join(small, "part-000000.parquet")).metadata.num_row_groups > 1
    assert digests(small, "*") == digests(large, "*") == digests(pieces, "*")


def test_documents_do_not_depend_on_the_task_split(tmp_path, text_dir, tok):
    fine = tokenize(tmp_path, text_dir, tok, "fine", task_rows=1, task_bytes=500)
    whole = tokenize(tmp_path, text_dir, tok, "whole", task_rows=10**9, task_bytes=10**9)
    assert manifest_of(whole)["counts"]["shards"] == 2 < manifest_of(fine)["counts"]["shards"]
    assert read_documents(fine) == read_documents(whole)
    packed = [run_pack(make_config(dict(inputs=[d], output=str(tmp_path / f"p{k}"), context_length=16)), engine="local")
              for k, d in enumerate((fine, whole))]
    chunks = [pa.concat_tables(pa.ipc.open_file(p).read_all() for p in sorted(glob.glob(str(tmp_path / f"p{k}" / "*.arrow"))))
              .column("input_ids").to_pylist() for k in range(2)]
    assert chunks[0] == chunks[1] and packed[0].manifest["counts"] == packed[1].manifest["counts"]


def test_byte_pieces_literal():
    from raypack.tokenize.pieces import _byte_pieces

    texts = pa.array(["ab", "cde", "", "f", "ghijkl", "m"]).slice(1)  # a slice: offsets do not start at 0
    assert [p.to_pylist() for p in _byte_pieces(texts, 4)] == [["cde", "", "f"], ["ghijkl"], ["m"]]
    assert [p.to_pylist() for p in _byte_pieces(texts, 100)] == [texts.to_pylist()]
    assert list(_byte_pieces(pa.array([], pa.string()), 4)) == []


def test_dispatch_order_is_largest_first_and_leaves_the_plan_alone(tmp_path):
    texts = ["a" * 10] * 3 + ["b" * 5000] * 3 + ["c" * 100] * 3
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=3)  # 3 row groups: small, large, middle
    tasks = tokenize_job.plan_text_tasks((str(path),), TextOptions(tokenizer="unused", task_rows=1))
    assert [(t.start, t.end) for t in tasks] == [(0, 1), (1, 2), (2, 3)]
    assert tasks[1].text_bytes > tasks[2].text_bytes > tasks[0].text_bytes > 0
    assert [t.task_index for t in tokenize_job.dispatch_order(tasks)] == [1, 2, 0]
    same = [tokenize_job.TextTask(k, "p", "jsonl", 0, 1, 7) for k in range(3)]
    assert [t.task_index for t in tokenize_job.dispatch_order(same)] == [0, 1, 2]


def test_rayon_threads_share_the_cpus():
    assert [rayon_threads(2, n) for n in (1, 2, 3)] == [2, 1, 1]
    assert rayon_threads(16.0, 4) == 4


# ----------------------------------------------------------------------------- resume


def fail_at_task(monkeypatch, index: int) -> list[int]:
    done, real = [], tokenize_job.tokenize_task

    def flaky(task, settings, tokenizer, *ahead):
        if task.task_index == index:
            raise RuntimeError(f"killed at task {index}")
        done.append(task.task_index)
        return real(task, settings, tokenizer, *ahead)

    monkeypatch.setattr(tokenize_job, "tokenize_task", flaky)
    return done


def test_tokenize_resume_after_a_crash_reuses_finished_tasks(tmp_path, text_dir, tok, monkeypatch, caplog):
    clean = tokenize(tmp_path, text_dir, tok, "clean")
    num_tasks = manifest_of(clean)["counts"]["shards"]
    fail_at_task(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="killed at task 3"):
        tokenize(tmp_path, text_dir, tok, "out")
    assert not os.path.exists(tmp_path / "out") and os.path.isdir(tmp_path / ".out.raypack-staging-partial")
    monkeypatch.undo()
    done = fail_at_task(monkeypatch, -1)
    with pytest.raises(tokenize_job.InputError, match="--resume"):
        tokenize(tmp_path, text_dir, tok, "out")
    caplog.set_level("INFO")
    summary = run_tokenize(TokenizeConfig(inputs=(text_dir,), output=str(tmp_path / "out"), text=options(tok),
                                          num_workers=2), engine="local", resume=True)
    assert done == list(range(3, num_tasks))
    # the progress counts the kept tasks, as pack's does: it said "tokenized 17/17 tasks" of 20 (a new user's trial)
    assert f"tokenized {num_tasks}/{num_tasks} tasks" in caplog.text and "(3 kept" in caplog.text, caplog.text
    backend = manifest_of(clean)["backend"]  # named as pack's summary names it: "ids by reference tokenizers 0.23.3"
    named = " ".join(str(backend[k]) for k in ("name", "library", "version") if k in backend)
    assert summary.lines()[0].endswith(f"ids by {named})"), summary.lines()[0]
    assert digests(tmp_path / "out", "*") == digests(clean, "*")
    # the rate is this run's tokens (it counted the kept ones), and the kept ones are said (a new user's trial)
    kept = sum(s["num_tokens"] for s in manifest_of(clean)["shards"][:3])
    assert summary.kept == (3, kept)
    assert summary.lines()[-1].endswith(f"start-up included; 3 tasks, {kept:,} tokens, kept from the run before)")


def test_tokenize_resume_says_a_file_changed_where_an_edit_kept_its_size(tmp_path, text_dir, tok, monkeypatch,
                                                                          caplog):
    """b.jsonl's lines reordered after a crash, its size kept: its tasks split at other bytes, and the reason
    said "another version of raypack, or another split" (an operator's trial); it names the file as changed."""
    import logging
    import shutil

    corpus = tmp_path / "corpus"
    shutil.copytree(text_dir, corpus)
    clean = tokenize(tmp_path, str(corpus), tok, "clean")
    fail_at_task(monkeypatch, manifest_of(clean)["counts"]["shards"] - 1)
    with pytest.raises(RuntimeError, match="killed at task"):
        tokenize(tmp_path, str(corpus), tok, "out")
    monkeypatch.undo()
    lines = (corpus / "b.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (corpus / "b.jsonl").write_text("".join(reversed(lines)), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="raypack"):
        tokenize(tmp_path, str(corpus), tok, "out", resume=True)
    said = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert said and all(f"{corpus / 'b.jsonl'} changed (size or first/last MiB differ)" in m for m in said), said
    assert digests(tmp_path / "out", "*") == digests(tokenize(tmp_path, str(corpus), tok, "again"), "*")


@pytest.mark.parametrize("damage", ["a record is a folder", "the records' folder is a file"])
def test_tokenize_and_one_pass_resume_past_a_damaged_staging_directory(tmp_path, text_dir, tok, monkeypatch, damage):
    """An operator's trial: a record made a folder, or ``_results`` made a file, failed every --resume with a
    traceback (IsADirectoryError, NotADirectoryError). The tasks they held are done again."""
    clean = tokenize(tmp_path, text_dir, tok, "clean")
    fail_at_task(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="killed at task 3"):
        tokenize(tmp_path, text_dir, tok, "out")
    monkeypatch.undo()
    results = tmp_path / ".out.raypack-staging-partial" / "_results"
    if damage == "a record is a folder":
        record = sorted(results.iterdir())[1]
        record.unlink()
        record.mkdir()
    else:
        shutil.rmtree(results)
        results.write_text("x")
    run_tokenize(TokenizeConfig(inputs=(text_dir,), output=str(tmp_path / "out"), text=options(tok), num_workers=2),
                 engine="local", resume=True)
    assert digests(tmp_path / "out", "*") == digests(clean, "*")
    # the one pass
    (tmp_path / "onepass").mkdir()
    clean, last, config = crashed_at_the_last_task(tmp_path / "onepass", text_dir, tok, monkeypatch)
    results = tmp_path / "onepass" / STAGING / "_results"
    if damage == "a record is a folder":
        (results / "task-000002.json").unlink()
        (results / "task-000002.json").mkdir()
    else:
        shutil.rmtree(results)
        results.write_text("x")
    monkeypatch.undo()
    summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_tokenizer_file_that_differs_on_the_workers_is_the_workers_line(tmp_path, text_dir, tok, monkeypatch,
                                                                          capsys, ray_session, command):
    """An operator's trial: the tokenizer file replaced while a run on Ray started its actors. Each actor
    refused it in its constructor, Ray retried and then gave 'ActorDiedError' (exit 1); the reason was only in a
    worker's log. It is now the workers' line, exit 2."""
    path = tmp_path / "tokenizer.json"
    shutil.copy(tok[1], path)
    other = train_byte_level_bpe(CORPUS * 3, 400)
    real = text_tasks.rayon_threads

    def swapped_as_the_actors_start(*args):
        other.save(str(path))
        return real(*args)

    monkeypatch.setattr(text_tasks, "rayon_threads", swapped_as_the_actors_start)
    argv = [command, "--input", text_dir, "--output", str(tmp_path / "out"), "--tokenizer", str(path),
            *(["--context-length", "16"] if command == "pack" else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"raypack: error: tokenizer {path} on this worker has sha256 "), err
    assert err[0].endswith("; give every node the same file"), err


def another_backend_version(monkeypatch, version: str = "0.0.0-another") -> None:
    """Make every load of the tokenizer report ``version`` for its backend (an upgrade between a
    crash and its resume)."""
    from raypack.tokenize.backends import BackedTokenizer

    real = BackedTokenizer.backend_record
    monkeypatch.setattr(BackedTokenizer, "backend_record", lambda self: {**real(self), "version": version})


@pytest.mark.parametrize("change", ["version", "backend"])
def test_tokenize_resume_keeps_no_task_another_backend_computed(tmp_path, text_dir, tok, monkeypatch, caplog,
                                                                change):
    """The ids are the reference's whichever backend ran, as far as that backend and raypack's
    rules for it were right (stop 45 found shapes they were not): a resume keeps no task that
    another backend, or another version of it, computed, so the manifest's one backend is true."""
    if change == "backend":
        pytest.importorskip("gigatoken")
    first = dict(tokenizer_backend="reference")
    clean = tokenize(tmp_path, text_dir, tok, "clean", **first)
    fail_at_task(monkeypatch, 3)
    with pytest.raises(RuntimeError, match="killed at task 3"):
        tokenize(tmp_path, text_dir, tok, "out", **first)
    monkeypatch.undo()
    done = fail_at_task(monkeypatch, -1)
    if change == "version":
        another_backend_version(monkeypatch)
        then = first
    else:
        then = dict(tokenizer_backend="gigatoken")
    with caplog.at_level("INFO", logger="raypack.tokenize.tasks"):
        tokenize(tmp_path, text_dir, tok, "out", resume=True, **then)
    assert done == list(range(manifest_of(clean)["counts"]["shards"]))  # nothing kept
    assert "its ids were computed by backend reference " in caplog.text
    assert digests(tmp_path / "out", "part-*") == digests(clean, "part-*")
    backend = manifest_of(tmp_path / "out")["backend"]
    assert (backend["version"] == "0.0.0-another") if change == "version" else backend["name"] == "gigatoken"


def test_a_worker_with_another_backend_version_refuses(tmp_path, text_dir, tok, monkeypatch):
    settings, _ = tokenize_job._text_settings(str(tmp_path), options(tok, tokenizer_backend="reference"),
                                              tokenize_job.load_backed_tokenizer(tok[1], "reference"), [text_dir])
    assert text_tasks.load_worker_tokenizer(settings).backend == "reference"
    another_backend_version(monkeypatch, "9.9.9")
    with pytest.raises(InputError, match=r"reference on this worker is version 9\.9\.9, the driver's is .*install "
                                         r"the same version on every node"):
        text_tasks.load_worker_tokenizer(settings)


# ----------------------------------------------------------------------------- bad input


def _write(root, name, make) -> str:
    path = os.path.join(root, name)
    os.makedirs(root, exist_ok=True)
    make(path)
    return root


BAD_INPUTS = {
    "null text": (lambda p: pq.write_table(pa.table({"text": ["a", None]}), p), "in.parquet", [],
                  "in.parquet row 1: 'text' is null"),
    "missing column": (lambda p: pq.write_table(pa.table({"body": ["a"], "id": [1]}), p), "in.parquet", [],
                       "no column 'text'; its columns: body, id"),
    "invalid utf-8": (lambda p: open(p, "wb").write(b'{"text": "ok"}\n{"text": "\xff\xfe"}\n'), "in.jsonl", [],
                      "in.jsonl line 2: invalid UTF-8"),
    "gzip jsonl non-string": (lambda p: open(p, "wb").write(gzip.compress(b'{"text": "ok"}\n{"text": 5}\n')),
                              "in.jsonl.gz", [], "line 2: 'text' is a JSON number"),
    "missing tokenizer": (lambda p: pq.write_table(pa.table({"text": ["a"]}), p), "in.parquet",
                          ["--tokenizer", "/nonexistent/tokenizer.json"], "tokenizer /nonexistent/tokenizer.json not found"),
    "bos not in vocab": (lambda p: pq.write_table(pa.table({"text": ["a"]}), p), "in.parquet",
                         ["--bos", "<|begin|>"], "token '<|begin|>' is not in the vocabulary"),
    "vocab too large": (lambda p: pq.write_table(pa.table({"text": ["a"]}), p), "in.parquet",
                        ["--token-dtype", "uint8"], "--token-dtype uint8 holds ids up to 255"),
}


@pytest.mark.parametrize("command", ["tokenize", "pack"])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line_and_publishes_nothing(tmp_path, tok, capsys, case, command):
    make, name, extra, message = BAD_INPUTS[case]
    if command == "pack" and "--token-dtype" in extra:
        pytest.skip("pack's --token-dtype is the packed output's")
    root = _write(str(tmp_path / "text"), name, make)
    extra = extra if "--tokenizer" in extra else ["--tokenizer", tok[1], *extra]
    extra = [*extra, "--context-length", "64"] if command == "pack" else extra
    code = main([command, "--input", root, "--output", str(tmp_path / "out"), "--local", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and message in err, err
    assert sorted(os.listdir(tmp_path)) == ["text"]  # no output, no staging, no lock left behind


def test_toml_text_keys_equal_the_flags(tmp_path, text_dir, tok):
    toml = tmp_path / "pack.toml"
    toml.write_text(f'tokenizer = "{tok[1]}"\ntext_column = "text"\nbos = "<bos>"\neos = 1\ncontext_length = 64\n')
    assert main(["pack", "--config", str(toml), "--input", text_dir, "--output", str(tmp_path / "t"), "--local"]) == 0
    assert main(["pack", "--input", text_dir, "--tokenizer", tok[1], "--bos", "<bos>", "--eos", "1", "--output",
                 str(tmp_path / "f"), "--local", "--context-length", "64"]) == 0
    by_toml, by_flags = manifest_of(tmp_path / "t"), manifest_of(tmp_path / "f")
    assert by_toml["content_sha256"] == by_flags["content_sha256"]
    assert by_toml["tokenizer"]["options"]["bos"] == "<bos>" and by_toml["tokenizer"]["options"]["eos_id"] == 1
    toml.write_text('eos = "<eos>"\ncontext_length = 64\n')  # a text key without a tokenizer
    assert main(["pack", "--config", str(toml), "--input", text_dir, "--output", str(tmp_path / "n"), "--local"]) == 2


def test_cli_tokenize_then_pack(tmp_path, text_dir, tok, capsys):
    assert main(["tokenize", "--input", text_dir, "--output", str(tmp_path / "t"), "--tokenizer", tok[1],
                 "--eos", "<eos>", "--local"]) == 0
    assert "tokens/s" in capsys.readouterr().out
    assert main(["pack", "--input", str(tmp_path / "t"), "--output", str(tmp_path / "p"), "--local",
                 "--context-length", "64"]) == 0
    assert main(["pack", "--input", text_dir, "--tokenizer", tok[1], "--eos", "<eos>", "--output",
                 str(tmp_path / "q"), "--local", "--context-length", "64"]) == 0
    assert manifest_of(tmp_path / "p")["content_sha256"] == manifest_of(tmp_path / "q")["content_sha256"]
    assert main(["pack", "--input", text_dir, "--eos", "<eos>", "--output", str(tmp_path / "r"), "--local",
                 "--context-length", "64"]) == 2
    assert "needs --tokenizer" in capsys.readouterr().err
    assert main(["pack", "--input", text_dir, "--tokenizer", tok[1], "--token-column", "body", "--output",
                 str(tmp_path / "s"), "--local", "--context-length", "64"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--token-column body names the column of token ids" in err and "--text-column" in err
    assert not os.path.exists(tmp_path / "s")
    assert main(["pack", "--input", text_dir, "--tokenizer", tok[1], "--token-column", "input_ids", "--output",
                 str(tmp_path / "s"), "--local", "--context-length", "64"]) == 2  # given, even as the default
    assert "--token-column input_ids names the column of token ids" in capsys.readouterr().err


# ----------------------------------------------------------------------------- sample text mode


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_sample_text_mode_feeds_tokenize(tmp_path, tok, capsys, fmt):
    from raypack.sample import main as sample_main

    args = ["--output", str(tmp_path / "s"), "--shards", "2", "--docs-per-shard", "30", "--context-length", "30",
            "--text", "--format", fmt]
    assert sample_main(args) == 0 and "text shards" in capsys.readouterr().out
    first = open(tmp_path / "s" / f"shard-00000.{fmt}", "rb").read()
    assert sample_main(args) == 0 and open(tmp_path / "s" / f"shard-00000.{fmt}", "rb").read() == first
    out = tokenize(tmp_path, str(tmp_path / "s"), tok)
    documents = read_documents(out)
    texts = [t for k in range(2) for t in (
        pq.read_table(tmp_path / "s" / f"shard-{k:05d}.parquet").column("text").to_pylist() if fmt == "parquet"
        else [json.loads(line)["text"] for line in open(tmp_path / "s" / f"shard-{k:05d}.jsonl", encoding="utf-8")])]
    assert len(texts) == 60 and any(not t.isascii() for t in texts)
    assert documents == [tok[0].encode(t, add_special_tokens=False).ids for t in texts]


# ----------------------------------------------------------------------------- object store


@pytest.mark.slow  # starts Ray or an S3 server: not the fast tier (tests/conftest.py)
def test_tokenize_and_pack_with_tokenizer_on_s3(tmp_path, text_dir, tok):
    """Text in S3, outputs in S3: same bytes as locally; a one-run pack leaves no _tokenized/ objects."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    boto3 = pytest.importorskip("boto3")
    from raypack.io.fs import clear_filesystem_cache

    from s3_server import moto_server, s3_environment

    local_tok = tokenize(tmp_path, text_dir, tok, "local")
    local = run_pack(make_config(dict(inputs=[local_tok], output=str(tmp_path / "p"), context_length=32)), engine="local")
    with moto_server() as endpoint, s3_environment(endpoint):
        clear_filesystem_cache()
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="text")
        for name in os.listdir(text_dir):
            client.upload_file(os.path.join(text_dir, name), "text", f"in/{name}")
        try:
            run_tokenize(TokenizeConfig(inputs=("s3://text/in",), output="s3://text/tok", text=options(tok)),
                         engine="local")
            two = run_pack(make_config(dict(inputs=["s3://text/tok"], output="s3://text/two", context_length=32)),
                           engine="local")
            one = run_pack(make_config(dict(inputs=["s3://text/in"], output="s3://text/one", context_length=32)),
                           engine="local", text=options(tok))
            keys = [o["Key"] for o in client.list_objects_v2(Bucket="text", Prefix="one/")["Contents"]
                    if not o["Key"].endswith("/")]  # a directory marker is not an object
            tok_keys = {o["Key"][4:] for o in client.list_objects_v2(Bucket="text", Prefix="tok/")["Contents"]
                        if not o["Key"].endswith("/")}
        finally:
            clear_filesystem_cache()
    assert tok_keys == {"manifest.json", *digests(local_tok, "part-*.parquet")}
    assert one.manifest["content_sha256"] == two.manifest["content_sha256"] == local.manifest["content_sha256"]
    assert sorted(k[4:] for k in keys) == sorted(["manifest.json", *(f["path"] for f in one.manifest["files"])])


# ----------------------------------------------------------------------------- pack --tokenizer in one pass
# (raypack.tokenize.onepass): no tokenized Parquet, the same bytes as tokenize + pack (chunk files,
# content_sha256, manifest apart from naming the text), local and Ray with any workers; --resume
# keeps finished tasks without tokenizing them again.

STAGING = ".out.raypack-staging-partial"


def two_step_as_one(two: dict, text_inputs: list[str]) -> dict:
    """What the one-pass manifest must be, written independently from the two-step one: the same,
    but each shard row names its text range (the parts are gone) and the config its text inputs."""
    rows = []
    for row in two["shards"]:
        source = row["source"]
        rest = {k: v for k, v in row.items() if k not in ("path", "format", "source")}
        rows.append({"path": source["path"], "format": "text",
                     "text": {k: source[k] for k in ("format", "start", "end")}, **rest})
    return {**two, "shards": rows, "config": {**two["config"], "inputs": text_inputs}}


def manifest(out) -> dict:
    return json.load(open(os.path.join(out, "manifest.json")))


CASES = [
    pytest.param(dict(strategy="concat"), dict(task_rows=40, task_bytes=3000), id="concat"),
    pytest.param(dict(strategy="concat"), dict(task_rows=16, task_bytes=700, batch_bytes=64), id="concat-small-tasks"),
    pytest.param(dict(strategy="best_fit", best_fit_window=16), dict(task_rows=40, task_bytes=3000), id="best_fit"),
    pytest.param(dict(strategy="best_fit", best_fit_max_segments=2), dict(task_rows=16, task_bytes=900),
                 id="best_fit-max-segments"),
    pytest.param(dict(strategy="concat", long_docs="truncate"), dict(task_rows=40, task_bytes=3000), id="truncate"),
    pytest.param(dict(strategy="best_fit", long_docs="drop", best_fit_window=8), dict(task_rows=32, task_bytes=2000),
                 id="best_fit-drop"),
]


def pack_both(tmp_path, text_dir, tok, pack_kw, text_kw, engine="local", workers=2, name="one"):
    tokenized = tokenize(tmp_path, text_dir, tok, name=f"tok-{name}", eos="<eos>", **text_kw)
    common = dict(context_length=32, pad_token=0, **pack_kw)
    two = run_pack(make_config(dict(inputs=[tokenized], output=str(tmp_path / f"two-{name}"), **common)),
                   engine="local")
    one = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / name), num_workers=workers, **common)),
                   engine=engine, text=options(tok, eos="<eos>", **text_kw))
    return one, two


@pytest.mark.parametrize("pack_kw, text_kw", [CASES[1], CASES[3], CASES[5]])
def test_text_dry_run_figures_equal_the_one_pass_runs(tmp_path, text_dir, tok, pack_kw, text_kw):
    """``pack --tokenizer --dry-run`` over every document gives each strategy's figures exactly as
    its one-pass run writes them (best_fit's windows end where a text task does), from a
    tokenize-then-pack of its own, and nothing is written."""
    text = options(tok, eos="<eos>", **text_kw)
    common = dict(context_length=32, pad_token=0, **{k: v for k, v in pack_kw.items() if k != "strategy"})
    report = tokenize_job.dry_run_text(make_config(dict(inputs=[text_dir], output="unused", **pack_kw, **{
        k: v for k, v in common.items() if k not in pack_kw})), text, 0)
    assert report.num_docs == report.corpus_docs and report.num_tokens == report.corpus_tokens
    for figures in report.strategies:
        name = "best_fit" if figures.name.startswith("best_fit") else "concat"
        if name == "concat" and "best_fit_max_segments" in common:
            continue  # an option concat refuses
        run = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / name), strategy=name, **common)),
                       engine="local", text=text)
        counts = run.manifest["counts"]
        assert (figures.num_chunks, figures.padding_positions, figures.split_documents) == (
            counts["chunks"], counts["padding_positions"], counts["split_documents"]), name
        assert report.num_docs == counts["documents"]
    assert not os.path.exists("unused")


def test_text_dry_run_of_a_sample_is_the_first_documents(tmp_path, text_dir, tok, capsys):
    whole = tokenize_job.dry_run_text(make_config(dict(inputs=[text_dir], output="u", context_length=32)),
                                      options(tok), 0)
    sample = tokenize_job.dry_run_text(make_config(dict(inputs=[text_dir], output="u", context_length=32)),
                                       options(tok), 45)
    assert (sample.num_docs, sample.corpus_docs, sample.corpus_tokens) == (45, None, None)
    tokenized = tokenize(tmp_path, text_dir, tok)
    assert sample.num_tokens == sum(len(d) for d in read_documents(tokenized)[:45]) < whole.num_tokens
    out = tmp_path / "never"
    assert main(["pack", "--input", text_dir, "--output", str(out), "--context-length", "32", "--dry-run",
                 "--tokenizer", tok[1], "--sample-docs", "45", "--task-rows", "40"]) == 0
    printed = capsys.readouterr().out
    assert "a sample of 45 documents" in printed and "of the text (tokenized up to the sample)" in printed
    assert not out.exists()


@pytest.mark.parametrize("pack_kw, text_kw", CASES)
def test_one_pass_equals_tokenize_then_pack(tmp_path, text_dir, tok, pack_kw, text_kw, monkeypatch):
    one, two = pack_both(tmp_path, text_dir, tok, pack_kw, text_kw)
    assert len(one.manifest["shards"]) > 3  # several tasks
    assert one.manifest["content_sha256"] == two.manifest["content_sha256"]
    assert digests(tmp_path / "one", "*.arrow") == digests(tmp_path / "two-one", "*.arrow")
    assert manifest(tmp_path / "one") == two_step_as_one(manifest(tmp_path / "two-one"), [text_dir])
    assert sorted(os.listdir(tmp_path / "one")) == sorted(["manifest.json", *digests(tmp_path / "one", "*.arrow")])
    assert main(["verify", str(tmp_path / "one")]) == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_one_pass_publishes_on_the_committer_and_every_file_before_the_manifest(tmp_path, text_dir, tok,
                                                                                monkeypatch, workers):
    fsyncs = record_fsyncs(monkeypatch)
    run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), context_length=32, num_workers=workers)),
             engine="local", text=options(tok))
    check_published_before_the_manifest(str(tmp_path / "out"), fsyncs)


def test_one_pass_writes_no_tokenized_parquet(tmp_path, text_dir, tok, monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("a tokenized part was written")

    monkeypatch.setattr(text_tasks, "write_part", refused)
    summary = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), context_length=32)),
                       engine="local", text=options(tok))
    assert summary.manifest["counts"]["documents"] == 240


def tokenized_tasks(monkeypatch, fail_at: int | None = None) -> list[int]:
    """Record which text tasks are tokenized; raise while tokenizing task ``fail_at``."""
    done, real = [], onepass.tokenize_held

    def flaky(task, *args):
        if task.task_index == fail_at:
            raise RuntimeError(f"killed at text task {fail_at}")
        done.append(task.task_index)
        return real(task, *args)

    monkeypatch.setattr(onepass, "tokenize_held", flaky)
    return done


def fail_packing(monkeypatch, index: int) -> None:
    real = onepass.pack_documents

    def flaky(task, *args):
        if task.task_index == index:
            raise RuntimeError(f"killed while packing task {index}")
        return real(task, *args)

    monkeypatch.setattr(onepass, "pack_documents", flaky)


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
@pytest.mark.parametrize("crash", ["tokenizing", "packing"])
def test_resume_keeps_finished_tasks_without_tokenizing_them(tmp_path, text_dir, tok, monkeypatch, strategy,
                                                             crash, caplog):
    kw = dict(context_length=32, strategy=strategy, best_fit_window=16)
    clean = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "clean"), **kw)), engine="local",
                     text=options(tok))
    num_tasks, k = len(clean.manifest["shards"]), 3
    config = make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), **kw))
    if crash == "tokenizing":
        tokenized_tasks(monkeypatch, fail_at=k)
    else:
        fail_packing(monkeypatch, k)
    with pytest.raises(RuntimeError, match="killed"):
        run_pack(config, engine="local", text=options(tok))
    assert not glob.glob(str(tmp_path / STAGING / "**" / "*.parquet"), recursive=True)
    monkeypatch.undo()
    done = tokenized_tasks(monkeypatch)
    with caplog.at_level("INFO", logger="raypack.tokenize"):
        summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert done == list(range(k, num_tasks))  # tasks 0..k-1 kept, not tokenized again
    assert f"resume: {k} of {num_tasks} text tasks kept (verified), {num_tasks - k} tokenized" in caplog.text
    kept_tokens = sum(s["num_tokens"] for s in clean.manifest["shards"][:k])
    assert summary.kept == (k, kept_tokens)  # not in the summary's rate
    assert f"; {k} tasks, {kept_tokens:,} tokens, kept from the run before)" in "\n".join(summary.lines())
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]
    assert digests(tmp_path / "out", "*") == digests(tmp_path / "clean", "*")


def crashed_at_the_last_task(tmp_path, text_dir, tok, monkeypatch, **kw):
    """A clean run, then a run into ``out`` killed while tokenizing its last task:
    ``(clean summary, last task index, out's config)``."""
    kw = dict(context_length=32, strategy="best_fit", best_fit_window=16, **kw)
    clean = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "clean"), **kw)), engine="local",
                     text=options(tok))
    last = len(clean.manifest["shards"]) - 1
    config = make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), **kw))
    tokenized_tasks(monkeypatch, fail_at=last)
    with pytest.raises(RuntimeError, match="killed"):
        run_pack(config, engine="local", text=options(tok))
    return clean, last, config


def test_resume_keeps_recorded_tasks_after_a_gap(tmp_path, text_dir, tok, monkeypatch):
    """A finished task after an unfinished one (as Ray leaves them) is kept once its offsets check."""
    clean, last, config = crashed_at_the_last_task(tmp_path, text_dir, tok, monkeypatch)
    os.remove(tmp_path / STAGING / "_results" / "task-000001.json")
    monkeypatch.undo()
    done = tokenized_tasks(monkeypatch)
    summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert done == [1, last]
    assert digests(tmp_path / "out", "*") == digests(tmp_path / "clean", "*")
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]


def crashed_at_task_4_then_counted(tmp_path, text_dir, tok, monkeypatch):
    """A one pass into ``out`` killed while tokenizing task 4: ``(out's config, the list the tasks
    tokenized from now on go to)``."""
    config = make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), context_length=32))
    tokenized_tasks(monkeypatch, fail_at=4)
    with pytest.raises(RuntimeError, match="killed"):
        run_pack(config, engine="local", text=options(tok))
    monkeypatch.undo()
    return config, tokenized_tasks(monkeypatch)


def test_resume_tokenizes_again_when_the_tokenize_options_change(tmp_path, text_dir, tok, monkeypatch, caplog):
    config, done = crashed_at_task_4_then_counted(tmp_path, text_dir, tok, monkeypatch)
    with caplog.at_level("INFO", logger="raypack.tokenize"):
        summary = run_pack(config, engine="local", resume=True, text=options(tok, eos="<eos>"))
    assert done[:4] == [0, 1, 2, 3]  # another EOS: other ids, nothing kept
    again = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert len(again) == 1, again  # one line for the four recorded tasks, not one each
    assert again[0].startswith("resume: 4 recorded text tasks (text task 0 (") and again[0].endswith(
        "are tokenized again; for each, its record was made with other settings (--eos none -> id "
        f"{tok[0].token_to_id('<eos>')})")
    assert f"resume: 0 of {len(summary.manifest['shards'])} text tasks kept (verified)" in caplog.text
    clean = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "clean"), context_length=32)),
                     engine="local", text=options(tok, eos="<eos>"))
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]


def test_resume_with_another_context_length_says_why_nothing_is_kept(tmp_path, text_dir, tok, monkeypatch, caplog):
    """It said only "0 of N text tasks kept"."""
    config, done = crashed_at_task_4_then_counted(tmp_path, text_dir, tok, monkeypatch)
    config = dataclasses.replace(config, context_length=48)
    with caplog.at_level("INFO", logger="raypack.tokenize"):
        summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert done[:4] == [0, 1, 2, 3]
    again = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert len(again) == 1 and again[0].startswith("resume: 4 recorded text tasks (text task 0 ("), again
    assert again[0].endswith("its record was made with other packing settings (context_length 32 -> 48)"), again
    clean = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "clean"), context_length=48)),
                     engine="local", text=options(tok))
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]


def test_resume_over_another_split_counts_every_task_it_tokenizes_again(tmp_path, text_dir, tok, monkeypatch, caplog):
    """A new user's trial: after --task-bytes changed, the line counted 2 recorded tasks of 37: a record whose task
    number is now another file's was dropped without being counted."""
    config, _ = crashed_at_task_4_then_counted(tmp_path, text_dir, tok, monkeypatch)
    with caplog.at_level("INFO", logger="raypack.tokenize"):  # now a.parquet is task 0 and b.jsonl task 1
        run_pack(config, engine="local", resume=True, text=options(tok, task_rows=10**6, task_bytes=10**9))
    again = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert again == [f"resume: 2 recorded text tasks (text task 0 ({text_dir}/a.parquet), ...) are tokenized again; "
                     "for each, its record was made for another split of the text into tasks"], again


def test_resume_with_another_context_length_and_eos_names_both(tmp_path, text_dir, tok, monkeypatch, caplog):
    """A new user's trial: --eos added and --context-length changed at once said only the context length."""
    config, _ = crashed_at_task_4_then_counted(tmp_path, text_dir, tok, monkeypatch)
    config = dataclasses.replace(config, context_length=48)
    with caplog.at_level("INFO", logger="raypack.tokenize"):
        run_pack(config, engine="local", resume=True, text=options(tok, eos="<eos>"))
    again = [r.getMessage() for r in caplog.records if "tokenized again" in r.getMessage()]
    assert len(again) == 1 and again[0].endswith(
        "its record was made with other packing settings (context_length 32 -> 48); and other text settings "
        f"(--eos none -> id {tok[0].token_to_id('<eos>')})"), again


def test_one_pass_resume_keeps_no_task_another_backend_version_computed(tmp_path, text_dir, tok, monkeypatch,
                                                                       caplog):
    config, done = crashed_at_task_4_then_counted(tmp_path, text_dir, tok, monkeypatch)
    another_backend_version(monkeypatch)
    with caplog.at_level("INFO", logger="raypack.tokenize"):
        summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert done[:4] == [0, 1, 2, 3]
    assert "text task 0 " in caplog.text and "this run's is " in caplog.text and "0.0.0-another" in caplog.text
    clean = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "clean"), context_length=32)),
                     engine="local", text=options(tok))
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]
    assert summary.manifest["tokenizer"]["backends"][0]["version"] == "0.0.0-another"


@pytest.mark.parametrize("pack_kw, text_kw", [CASES[1], CASES[3], CASES[5]])
def test_ray_one_pass_equals_local_for_any_workers(ray_session, tmp_path, text_dir, tok, pack_kw, text_kw):
    one, two = pack_both(tmp_path, text_dir, tok, pack_kw, text_kw)
    for workers in (1, 2):
        ray, _ = pack_both(tmp_path, text_dir, tok, pack_kw, text_kw, engine="ray", workers=workers,
                           name=f"ray{workers}")
        assert digests(tmp_path / f"ray{workers}", "*.arrow") == digests(tmp_path / "one", "*.arrow")
        assert manifest(tmp_path / f"ray{workers}") == manifest(tmp_path / "one")
    assert one.manifest["content_sha256"] == two.manifest["content_sha256"]


def no_tokenize_thread(monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("--workers 1 started a tokenize thread")

    monkeypatch.setattr(onepass, "ThreadPoolExecutor", refused)


@pytest.mark.parametrize("pack_kw, text_kw", [CASES[1], CASES[3], CASES[4]])
def test_one_pass_with_one_worker_has_no_thread_and_the_same_bytes(tmp_path, text_dir, tok, pack_kw, text_kw,
                                                                   monkeypatch):
    """``--local --workers 1``: each task tokenized, then packed, on the caller's thread (one task's
    ids held), and the output is byte for byte the two-worker one."""
    one, two = pack_both(tmp_path, text_dir, tok, pack_kw, text_kw)
    no_tokenize_thread(monkeypatch)
    pack_both(tmp_path, text_dir, tok, pack_kw, text_kw, workers=1, name="w1")
    assert len(one.manifest["shards"]) > 3
    assert digests(tmp_path / "w1", "*.arrow") == digests(tmp_path / "one", "*.arrow")
    assert manifest(tmp_path / "w1") == {**manifest(tmp_path / "one"), "config": manifest(tmp_path / "w1")["config"]}
    assert manifest(tmp_path / "w1")["content_sha256"] == two.manifest["content_sha256"]


def test_a_held_task_frees_its_pieces_as_they_are_packed(tmp_path, text_dir, tok, monkeypatch):
    """Packing a tokenized task releases each piece of its ids once the packer has moved past it, so
    the task being packed and the next one being tokenized hold about one task's ids, not two. A
    piece may stay alive while the packer still reads it (the one just handed out, the one before)."""
    import weakref

    real, handed_out, most = onepass.pack_documents, [], []

    def watched(task, settings, batches, *args):
        def watching():
            for k, batch in enumerate(batches):
                most.append(k + 1)
                alive = [j for j, ref in enumerate(handed_out[:max(0, k - 1)]) if ref() is not None]
                assert not alive, f"task {task.task_index}: pieces {alive} still alive when piece {k} is packed"
                handed_out.append(weakref.ref(batch.tokens))
                yield batch
        handed_out.clear()
        return real(task, settings, watching(), *args)

    monkeypatch.setattr(onepass, "pack_documents", watched)
    summary = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), context_length=32)),
                       engine="local", text=options(tok))
    assert summary.manifest["counts"]["documents"] == len(TEXTS)
    assert max(most) >= 4  # a task of several pieces
    monkeypatch.undo()
    again = run_pack(make_config(dict(inputs=[text_dir], output=str(tmp_path / "again"), context_length=32)),
                     engine="local", text=options(tok))
    assert again.manifest["content_sha256"] == summary.manifest["content_sha256"]


@pytest.mark.parametrize("workers", [1, 2])
def test_resume_tokenizes_again_a_task_whose_chunk_file_is_gone(tmp_path, text_dir, tok, monkeypatch, workers):
    """A recorded task whose chunk file was deleted does not hold: it alone is tokenized again, between
    kept tasks, and the output equals a clean run."""
    clean, last, config = crashed_at_the_last_task(tmp_path, text_dir, tok, monkeypatch, num_workers=workers)
    record = json.load(open(tmp_path / STAGING / "_results" / "task-000002.json"))
    os.remove(tmp_path / STAGING / record["result"]["file"]["path"])
    monkeypatch.undo()
    if workers == 1:
        no_tokenize_thread(monkeypatch)
    done = tokenized_tasks(monkeypatch)
    summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert sorted(done) == [2, last]
    assert digests(tmp_path / "out", "*") == digests(tmp_path / "clean", "*")
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]


# ----------------------------------------------------------------------------- a task larger than it may hold
# A Parquet row group of more than task_bytes of text is one task: past ``held_tokens`` (task_bytes // 4)
# its ids wait in a spill file, read back as it is packed, and deleted. Where a task is held: on Ray, for
# best_fit, and with --local --workers 1 (with more, concat packs each task as it is tokenized: below).


def hold_at_most(monkeypatch, tokens: int) -> list:
    """Each task keeps at most ``tokens`` ids in memory (the task layout unchanged); the spills made
    in this process, recorded."""
    real_settings, spills = tokenize_job._text_settings, []

    def settings(*args, **kwargs):
        values, options_ = real_settings(*args, **kwargs)
        return dataclasses.replace(values, held_tokens=tokens), options_

    class Recorded(onepass.Spill):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            spills.append(self.path)

    monkeypatch.setattr(tokenize_job, "_text_settings", settings)
    monkeypatch.setattr(onepass, "Spill", Recorded)
    return spills


def test_tiny_tasks_do_not_spill(tmp_path, tok, monkeypatch):
    """``held_tokens`` was task_bytes // 4: with --task-bytes 3 (a task per JSON line) every task spilled."""
    made = []
    real_init = onepass.Spill.__init__
    monkeypatch.setattr(onepass.Spill, "__init__", lambda self, *a, **k: (made.append(1), real_init(self, *a, **k)))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "t.jsonl").write_text("".join(json.dumps({"text": f"line {i} " * 9}) + "\n" for i in range(12)))
    config = make_config(dict(inputs=[str(tmp_path / "in")], output=str(tmp_path / "out"), context_length=32))
    summary = run_pack(config, engine="local", text=options(tok, task_bytes=64))  # ~a task per line
    assert len(summary.manifest["shards"]) >= 12 and made == []


@pytest.mark.parametrize("pack_kw, text_kw", [CASES[0], CASES[3], CASES[4]])
def test_a_task_past_held_tokens_spills_and_gives_the_same_bytes(tmp_path, text_dir, tok, pack_kw, text_kw,
                                                                 monkeypatch):
    one, two = pack_both(tmp_path, text_dir, tok, pack_kw, text_kw)
    spills = hold_at_most(monkeypatch, 50)
    pack_both(tmp_path, text_dir, tok, pack_kw, text_kw, name="spilled", workers=1)
    assert len(spills) >= len(one.manifest["shards"]) - 1  # nearly every task holds more than 50 ids
    assert not [p for p in spills if os.path.exists(p)]
    assert all(os.path.basename(p).startswith(".tmp-spill-") for p in spills)
    assert digests(tmp_path / "spilled", "*.arrow") == digests(tmp_path / "one", "*.arrow")
    assert manifest(tmp_path / "spilled") == manifest(tmp_path / "one")
    assert one.manifest["content_sha256"] == two.manifest["content_sha256"]


def test_a_spilling_task_gives_back_freed_memory_after_each_spilled_piece(tmp_path, text_dir, tok, monkeypatch):
    """Only a task that spills gives its allocators' free pages back (one call per spilled piece):
    faulting them in again would cost the common, shorter tasks more than they hold."""
    calls, written = [], []
    monkeypatch.setattr(onepass, "give_back_freed_memory", lambda: calls.append(1))
    none = hold_at_most(monkeypatch, 10**12)
    pack_both(tmp_path, text_dir, tok, *CASES[0].values, name="held")
    assert none == [] and calls == []
    spills = hold_at_most(monkeypatch, 50)
    real_write = onepass.Spill.write
    monkeypatch.setattr(onepass.Spill, "write", lambda self, ids: (written.append(len(ids)), real_write(self, ids)))
    pack_both(tmp_path, text_dir, tok, *CASES[0].values, name="spilled", workers=1)
    assert spills and len(calls) == len(written) > len(spills)


def test_give_back_freed_memory_runs_here():
    packer.give_back_freed_memory()
    packer.give_back_freed_memory()


def test_ray_one_pass_spills_and_gives_the_same_bytes(ray_session, tmp_path, text_dir, tok, monkeypatch):
    one, _ = pack_both(tmp_path, text_dir, tok, *CASES[1].values)
    hold_at_most(monkeypatch, 50)  # the settings travel to the actors
    pack_both(tmp_path, text_dir, tok, *CASES[1].values, engine="ray", name="ray")
    assert digests(tmp_path / "ray", "*.arrow") == digests(tmp_path / "one", "*.arrow")
    assert manifest(tmp_path / "ray") == manifest(tmp_path / "one")


def test_a_spill_is_deleted_when_its_task_fails_while_tokenizing(tmp_path, text_dir, tok, monkeypatch, capsys):
    """The long document (~30k ids, row 120 of a.parquet) is refused while its task is spilling: the
    spill file is gone when the error leaves the task, before the run removes its staging directory."""
    spills = hold_at_most(monkeypatch, 20)
    real, seen = onepass.tokenize_held, []

    def checked(task, *args, **kwargs):
        try:
            return real(task, *args, **kwargs)
        except InputError:
            seen.append((task.task_index, [p for p in spills if os.path.exists(p)]))
            raise

    monkeypatch.setattr(onepass, "tokenize_held", checked)
    config = make_config(dict(inputs=[text_dir], output=str(tmp_path / "out"), context_length=32,
                              max_document_tokens=5000, num_workers=1))
    with pytest.raises(InputError, match="a.parquet"):
        run_pack(config, engine="local", text=options(tok))
    [(failed, left)] = seen
    assert any(p.endswith(f"task-{failed:06d}.arrow") for p in spills)  # the failing task had spilled
    assert left == []  # and its file was gone
    assert not os.path.exists(tmp_path / "out")


def test_a_spill_reads_back_in_order_and_is_deleted(tmp_path):
    spill = onepass.Spill(str(tmp_path), 7, pa.list_(pa.uint16()))
    pieces = [pa.array([[1, 2], [], [3]], pa.list_(pa.uint16())), pa.array([[4, 5, 6]], pa.list_(pa.uint16()))]
    for piece in pieces:
        spill.write(piece)
    spill.close()
    assert os.path.basename(spill.path).startswith(".tmp-spill-") and spill.path.endswith("task-000007.arrow")
    assert [p.to_pylist() for p in spill.read()] == [p.to_pylist() for p in pieces]
    assert not os.path.exists(spill.path)


def test_a_spill_never_read_is_deleted_when_it_goes(tmp_path):
    import gc

    spill = onepass.Spill("s3://bucket/out", 0, pa.list_(pa.int32()))  # not a local directory: the temp dir
    spill.write(pa.array([[1]], pa.list_(pa.int32())))
    path = spill.path
    assert os.path.dirname(path) == tempfile.gettempdir() and os.path.exists(path)
    del spill
    gc.collect()
    assert not os.path.exists(path)


def test_resume_sweeps_the_spill_file_of_a_killed_run(tmp_path, text_dir, tok, monkeypatch):
    """A process killed while it held a spilled task leaves its spill file in the staging directory
    (no finalizer runs under SIGKILL): --resume finishes the run and publishes without it."""
    hold_at_most(monkeypatch, 50)
    clean, last, config = crashed_at_the_last_task(tmp_path, text_dir, tok, monkeypatch)
    left = tmp_path / STAGING / ".tmp-spill-0123456789abcdef0123456789abcdef-task-000002.arrow"
    left.write_bytes(b"what a killed worker left")
    monkeypatch.undo()
    spills = hold_at_most(monkeypatch, 50)
    summary = run_pack(config, engine="local", resume=True, text=options(tok))
    assert spills and not [p for p in spills if os.path.exists(p)]
    assert summary.manifest["content_sha256"] == clean.manifest["content_sha256"]
    assert digests(tmp_path / "out", "*") == digests(tmp_path / "clean", "*")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(os.listdir(tmp_path / "clean"))  # dot files too
    assert not os.path.exists(tmp_path / STAGING)


@pytest.mark.parametrize("command", ["tokenize", "pack"])
def test_task_bytes_given_as_mib_is_one_line(tmp_path, capsys, command):
    """``--task-bytes 64`` meant as MiB: a task (and a part file) per 64 bytes of a JSON Lines file, 710 part
    files for a 710-byte file at 1 (a new user's trial). Past 10,000 tasks under 1 MiB each, one line."""
    from raypack.cli import main

    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.jsonl").write_text("".join(f'{{"text": "document {i} words"}}\n' for i in range(20000)))
    base = ["pack", "--context-length", "8"] if command == "pack" else ["tokenize"]
    args = [*base, "--local", "--input", str(tmp_path / "text"), "--tokenizer", "tiktoken:cl100k_base"]
    assert main([*args, "--output", str(tmp_path / "o"), "--task-bytes", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"raypack: error: --task-bytes 64 cuts the text into more than 10,000 tasks (at "
                   f"{tmp_path / 'text' / 'a.jsonl'}), each with a fixed cost (a task, a file); it is a number of bytes: "
                   "give e.g. 67108864 for 64 MiB (the default)"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text"]
    assert main([*args, "--output", str(tmp_path / "o"), "--task-bytes", "100000"]) == 0
