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


def test_an_output_of_token_inputs_has_nothing_to_re_encode(tmp_path, capsys):
    (tmp_path / "ids").mkdir()
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32()))}), tmp_path / "ids" / "p.parquet")
    assert main(["pack", "--local", "--input", str(tmp_path / "ids"), "--output", str(tmp_path / "out"),
                 "--context-length", "4"]) == 0
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--check-tokenizer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was not packed from text" in err[0], err
