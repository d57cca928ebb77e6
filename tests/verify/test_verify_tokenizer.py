"""``raypack verify --check-tokenizer``: documents re-encoded from their text with the reference library."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.cli import main

from helpers import train_byte_level_bpe

TEXTS = [f"doc {i}: " + "naïve café 🙂 " * (i % 7) + "tail" * (i % 3) for i in range(120)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_byte_level_bpe(TEXTS, 300).save(str(path))
    return str(path)


def text_dir(tmp_path, texts=TEXTS):
    (tmp_path / "text").mkdir(exist_ok=True)
    pq.write_table(pa.table({"text": texts}), tmp_path / "text" / "part-0.parquet", row_group_size=25)
    return str(tmp_path / "text")


@pytest.mark.parametrize("spec", ["hf", "tiktoken:cl100k_base"])
@pytest.mark.parametrize("extra", [[], ["--strategy", "best_fit"], ["--long-docs", "truncate"],
                                   ["--long-docs", "drop"], ["--eos", "0", "--bos", "1"]])
def test_a_text_output_re_encodes_equal(tmp_path, tok, capsys, spec, extra):
    spec = tok if spec == "hf" else spec
    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", spec, "--task-rows", "30", *extra]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "40"]) == 0
    out = capsys.readouterr().out
    assert "40  documents re-encoded with" in out and ": equal" in out, out


def test_tokenize_then_pack_re_encodes_equal_and_a_changed_text_is_named(tmp_path, tok, capsys):
    assert main(["tokenize", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "t"),
                 "--tokenizer", tok, "--eos", "0"]) == 0
    assert main(["pack", "--local", "--input", str(tmp_path / "t"), "--output", str(tmp_path / "out"),
                 "--context-length", "16"]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer"]) == 0
    changed = list(TEXTS)
    changed[-1] = changed[-1] + " something else"  # the last document is always among those checked
    text_dir(tmp_path, changed)
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "document 119" in err[0] and "differs from the output" in err[0], err


def test_a_mix_checks_each_source_packed_from_text(tmp_path, tok, capsys):
    """It said a mix is "not a packed output"; now each source packed from text is re-encoded."""
    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "a"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    (tmp_path / "ids").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3]] * 50, pa.list_(pa.uint16()))}),
                   tmp_path / "ids" / "p.parquet")
    assert main(["pack", "--local", "--input", str(tmp_path / "ids"), "--output", str(tmp_path / "b"),
                 "--context-length", "24"]) == 0
    mix = ["mix", "--weight", "1", "--num-chunks", "8", "--output"]
    assert main([*mix[:1], "--source", str(tmp_path / "a"), *mix[1:], str(tmp_path / "m"),
                 "--source", str(tmp_path / "b"), "--weight", "1"]) == 0
    assert main(["mix", "--source", str(tmp_path / "b"), *mix[1:], str(tmp_path / "m_ids")]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "m"), "--check-tokenizer", "7"]) == 0
    out = capsys.readouterr().out
    assert "  source 0: " in out and "7  documents re-encoded with tokenizers: equal" in out, out
    assert "source 1: " in out and "not packed from text, nothing to re-encode" in out, out
    changed = list(TEXTS)
    changed[0] = "changed " + changed[0]
    text_dir(tmp_path, changed)
    assert main(["verify", str(tmp_path / "m"), "--check-tokenizer", "7"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "source 0 of the mix" in err[0] and "document 0 " in err[0], err
    assert main(["verify", str(tmp_path / "m_ids"), "--check-tokenizer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a mix none of whose sources was packed from text" in err[0], err


@pytest.mark.parametrize("count", ["0", "-3"])
def test_a_count_below_one_is_the_only_line(tmp_path, tok, capsys, caplog, count):
    """It came after the inputs' check had printed its note ("inputs not compared")."""
    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    capsys.readouterr()
    caplog.clear()
    caplog.set_level("INFO")
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", count]) == 2
    assert [r.getMessage() for r in caplog.records] == []
    captured = capsys.readouterr()
    assert captured.err == f"raypack: error: --check-tokenizer {count}: give a number of documents >= 1\n"
    assert captured.out == ""


def test_an_output_of_token_inputs_has_nothing_to_re_encode(tmp_path, capsys):
    (tmp_path / "ids").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32()))}), tmp_path / "ids" / "p.parquet")
    assert main(["pack", "--local", "--input", str(tmp_path / "ids"), "--output", str(tmp_path / "out"),
                 "--context-length", "4"]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was not packed from text" in err[0], err


class _Panic(BaseException):
    """What pyo3 raises for a Rust panic (a BaseException), e.g. Onig's retry limit on 16 MB of spaces."""


def test_a_document_the_reference_cannot_encode_is_one_line_naming_it(tmp_path, tok, capsys, monkeypatch):
    from raypack.tokenize.tokenizers import HFTokenizer

    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok, "--task-rows", "30"]) == 0
    capsys.readouterr()
    real = HFTokenizer.encode_flat

    def fails_on_the_last_document(self, texts):
        if TEXTS[-1] in texts.to_pylist():
            raise _Panic("Onig: Regex search error: retry-limit-in-match over")
        return real(self, texts)

    monkeypatch.setattr(HFTokenizer, "encode_flat", fails_on_the_last_document)
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "document 119 (" in err[0] and "part-0.parquet row 119)" in err[0], err
    assert "cannot be encoded by the tokenizer: Onig" in err[0] and "cannot be checked" in err[0]


def test_a_text_file_moved_since_packing_is_one_line_naming_it(tmp_path, tok, capsys):
    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    (tmp_path / "text" / "part-0.parquet").rename(tmp_path / "moved.parquet")
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "part-0.parquet: the text of documents 0-119 is no longer there" in err[0], err
    assert "put the file back there" in err[0] and "after discovery" not in err[0], err


@pytest.mark.parametrize("change", ["fewer row groups", "renamed column"])
def test_a_text_file_rewritten_since_packing_is_one_verify_line(tmp_path, tok, capsys, change):
    """It was a traceback (an IndexError from the footer) for fewer row groups, and advice to pass
    --text-column (a flag verify has not) for a renamed column."""
    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    path = tmp_path / "text" / "part-0.parquet"
    table = pq.read_table(path)
    if change == "fewer row groups":
        pq.write_table(table, path)
    else:
        pq.write_table(table.rename_columns(["body"]), path, row_group_size=25)
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}: its text no longer reads as it did when the output was packed" in err[0], err
    assert "--text-column" not in err[0] and err[0].endswith("the text changed since the output was packed"), err


def test_verify_given_the_text_as_input_says_what_to_give_instead(tmp_path, tok, capsys):
    """It was 'verify failed' (exit 1) with pack's advice (--tokenizer, --text-column: flags verify has not)."""
    text = text_dir(tmp_path)
    assert main(["pack", "--local", "--input", text, "--output", str(tmp_path / "out"), "--context-length", "24",
                 "--tokenizer", tok]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--input", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "part-0.parquet holds text: verify compares an output with the token ids" in err[0], err
    assert "--check-tokenizer" in err[0] and "--text-column" not in err[0], err


def test_why_a_text_outputs_inputs_were_not_compared_is_in_the_report_only(tmp_path, tok, capsys, caplog):
    """verify logged "inputs not compared" before its checks: a failure then printed two lines, and a pass said "not
    compared" beside "N documents re-encoded: equal" with nothing between them (a new user's trial)."""
    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    capsys.readouterr()
    caplog.clear()
    caplog.set_level("INFO")
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3"]) == 0
    assert [r.getMessage() for r in caplog.records if "compared" in r.getMessage()] == []
    lines = capsys.readouterr().out.splitlines()
    inputs = next(line for line in lines if line.startswith("  inputs "))
    assert inputs.split(None, 1)[1] == ("not compared (text, tokenized in the run: --check-tokenizer re-encodes a "
                                        "sample; --input a raypack tokenize of the texts compares every token)")
    assert lines.index(inputs) < next(i for i, line in enumerate(lines) if "re-encoded with tokenizers: equal" in line)


def test_a_tokenizer_moved_or_changed_since_packing_says_to_put_it_back(tmp_path, tok, capsys):
    """It said to "give a tokenizer.json" / "give the tokenizer": verify has no flag to give one."""
    import shutil

    copy = tmp_path / "tok.json"
    shutil.copy(tok, copy)
    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", str(copy)]) == 0
    copy.rename(tmp_path / "elsewhere.json")
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"packed with tokenizer {copy}, which is no longer there" in err[0], err
    assert "put it back at that path, or give where it is now with --tokenizer" in err[0], err
    # where it is now (a new user's trial: there was no way to give it)
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3", "--tokenizer",
                 str(tmp_path / "elsewhere.json")]) == 0
    assert "3  documents re-encoded with tokenizers: equal" in capsys.readouterr().out
    other = tmp_path / "other.json"
    train_byte_level_bpe(TEXTS[:50], 280).save(str(other))
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3", "--tokenizer", str(other)]) == 1
    assert f"tokenizer {other} is not the one {tmp_path / 'out'} was packed with (sha256 " in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "out"), "--tokenizer", str(other)]) == 2
    assert capsys.readouterr().err == ("raypack: error: --tokenizer names the tokenizer --check-tokenizer re-encodes "
                                       "with: add --check-tokenizer, or drop it\n")


def test_a_document_over_max_document_bytes_is_counted_not_re_encoded(tmp_path, tok, capsys):
    """The reference library needs ~110 bytes a byte of text: verify re-encodes a chosen document only
    up to --max-document-bytes (pack's default), and says how many it left (a 50 MB document, packed
    with a raised limit, took verify to 5.1 GB)."""
    sizes = [len(t.encode()) for t in TEXTS]
    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    changed = list(TEXTS)
    changed[118] = changed[118] + " something else"  # 118 % 7 == 6: six "naïve café 🙂 ", over 40 bytes
    text_dir(tmp_path, changed)
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "120", "--max-document-bytes", "40"]) == 0
    out = capsys.readouterr().out
    longer = sum(size > 40 for size in sizes)
    assert 0 < longer < 120 and f"{120 - longer}  documents re-encoded with tokenizers: equal; {longer} longer " \
        "than max_document_bytes=40 not re-encoded" in out, out
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "120"]) == 1  # 16 MiB by default
    assert "document 118" in capsys.readouterr().err


@pytest.mark.parametrize("flags, said", [
    (["--max-document-bytes", "10"], "--max-document-bytes limits what --check-tokenizer re-encodes"),
    (["--check-tokenizer", "--max-document-bytes", "0"], "--max-document-bytes 0: give a number of bytes >= 1")])
def test_max_document_bytes_mistakes_are_one_line(tmp_path, tok, capsys, monkeypatch, flags, said):
    """Refused before the audit runs (it ran the whole audit, printing its notes, and then refused)."""
    import raypack.verify as verify

    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    capsys.readouterr()
    monkeypatch.setattr(verify, "verify_output", lambda *a, **k: pytest.fail("the audit ran"))
    assert main(["verify", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_a_manifest_whose_tokenizer_record_was_edited_fails_the_check(tmp_path, tok, capsys):
    """An operator's trial: the manifest's tokenizer vocab_size set to 50000 passed verify --check-tokenizer
    (the file's sha256 still matched). The record must say what the file is."""
    import json

    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(path.read_text())
    vocab_size = manifest["tokenizer"]["identity"]["vocab_size"]
    manifest["tokenizer"]["identity"]["vocab_size"] = 50000
    path.write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3"]) == 1
    assert (f"its manifest records the tokenizer's vocab_size=50000, and the tokenizer it names (the same sha256) "
            f"has vocab_size={vocab_size}: the manifest was edited; pack again") in capsys.readouterr().err


@pytest.mark.parametrize("route", ["one pass", "tokenize then pack"])
@pytest.mark.parametrize("edit", ["format", "text format", "text end"])
def test_a_shards_edited_format_or_text_source_fails_verify_in_one_line(tmp_path, tok, capsys, route, edit):
    """A hostile trial: shards[0].format "text" edited to "texx" passed verify (exit 0) and made --check-tokenizer
    say the output was not packed from text (exit 2); an unknown source format was a ValueError traceback."""
    import json

    if route == "one pass":
        assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                     "--context-length", "24", "--tokenizer", tok, "--task-rows", "30"]) == 0
    else:
        assert main(["tokenize", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "t"),
                     "--tokenizer", tok]) == 0
        assert main(["pack", "--local", "--input", str(tmp_path / "t"), "--output", str(tmp_path / "out"),
                     "--context-length", "24"]) == 0
    path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(path.read_text())
    entry = manifest["shards"][0]
    source = entry["text"] if route == "one pass" else entry["source"]
    if edit == "format":
        entry["format"] = "texx"
    elif edit == "text format":
        source["format"] = "parquex"
    else:
        source["end"] = source["start"] - 1
    path.write_text(json.dumps(manifest))
    capsys.readouterr()
    for extra in ([], ["--check-tokenizer", "3"]):
        assert main(["verify", str(tmp_path / "out"), *extra]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "shards[0]: " in err[0] and "the manifest was edited or damaged" in err[0], err


def test_a_tokenizer_record_edited_to_tiktoken_without_a_name_fails_the_check(tmp_path, tok, capsys):
    """identity.kind edited to "tiktoken" on an output packed with a tokenizer.json: "unknown tokenizer
    tiktoken:None", exit 2 (bad input), where the manifest was edited (an operator's trial): exit 1."""
    import json

    assert main(["pack", "--local", "--input", text_dir(tmp_path), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["tokenizer"]["identity"]["kind"] = "tiktoken"
    path.write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "3"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "its manifest records a tiktoken tokenizer with no encoding name (name=None): the manifest was edited; "
        "pack again")


def test_an_output_of_empty_text_files_has_nothing_to_re_encode(tmp_path, tok, capsys):
    """Polars, DuckDB and fastparquet write an empty table as a file of no row group: its output records a
    tokenizer and no shard, and --check-tokenizer said it "records no tokenizer and no text source", exit 2
    (a trial). Nothing to re-encode: exit 0, said so."""
    (tmp_path / "text").mkdir()
    path = tmp_path / "text" / "empty.parquet"
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])):
        pass  # no row group at all, as the other writers do (pyarrow's write_table writes one of 0 rows)
    assert pq.ParquetFile(path).metadata.num_row_groups == 0
    assert main(["pack", "--local", "--input", str(tmp_path / "text"), "--output", str(tmp_path / "out"),
                 "--context-length", "24", "--tokenizer", tok]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer", "5"]) == 0
    assert "no documents to re-encode (the output holds none)" in capsys.readouterr().out
