"""Every kind of bad input, through the CLI: one line on stderr naming the file, row and
value, exit code 2, and nothing written (no output, no staging directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.cli import main
from raypack.errors import install_extra


def write_parquet(path, docs, type=pa.list_(pa.int32()), column="input_ids"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({column: pa.array(docs, type)}), path)
    return str(path)


@pytest.fixture
def shards(tmp_path):
    d = tmp_path / "in"
    write_parquet(d / "a.parquet", [[1, 2, 3], [4]])
    write_parquet(d / "b.parquet", [[5, 6], [], [7, 8, 9]])
    return d


def run(capsys, tmp_path, *args, expect=2):
    out = tmp_path / "out"
    code = main(["pack", "--local", "--output", str(out), "--context-length", "4", "--pad-token", "0", *args])
    err = capsys.readouterr().err.strip()
    assert code == expect, err
    if expect == 2:
        assert len(err.splitlines()) == 1, err
        assert err.startswith("raypack: error: ")
        assert not out.exists()
        assert not [p for p in os.listdir(tmp_path) if "raypack-staging" in p]
    return err


def test_good_input_passes(capsys, tmp_path, shards):
    run(capsys, tmp_path, "--input", str(shards), expect=0)


def test_missing_path(capsys, tmp_path):
    err = run(capsys, tmp_path, "--input", str(tmp_path / "nope.parquet"))
    assert "nope.parquet" in err and "not found" in err


def test_glob_matching_nothing(capsys, tmp_path, shards):
    err = run(capsys, tmp_path, "--input", str(shards / "*.jsonl"))
    assert "*.jsonl" in err and "matched no" in err


def test_truncated_parquet(capsys, tmp_path, shards):
    path = shards / "b.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    err = run(capsys, tmp_path, "--input", str(shards))
    assert "b.parquet" in err


def test_missing_token_column_lists_the_columns(capsys, tmp_path):
    path = write_parquet(tmp_path / "in" / "x.parquet", [[1]], column="tokens")
    err = run(capsys, tmp_path, "--input", path)
    assert "x.parquet" in err and "input_ids" in err and "tokens" in err


@pytest.mark.parametrize("docs,type,word", [
    ([["a", "b"]], pa.list_(pa.string()), "string"),
    ([[1.5]], pa.list_(pa.float64()), "double"),
    ([[[1, 2]]], pa.list_(pa.list_(pa.int32())), "list"),
])
def test_wrong_token_types(capsys, tmp_path, docs, type, word):
    path = write_parquet(tmp_path / "in" / "x.parquet", docs, type)
    err = run(capsys, tmp_path, "--input", path)
    assert "x.parquet" in err and word in err


def test_null_row(capsys, tmp_path):
    path = write_parquet(tmp_path / "in" / "x.parquet", [[1, 2], [3], None, [4]])
    err = run(capsys, tmp_path, "--input", path)
    assert "x.parquet" in err and "row 2" in err and "null" in err


def test_negative_token(capsys, tmp_path):
    path = write_parquet(tmp_path / "in" / "x.parquet", [[1, 2], [3, -7]])
    err = run(capsys, tmp_path, "--input", path)
    assert "x.parquet" in err and "row 1" in err and "-7" in err


def test_token_overflowing_the_output_dtype(capsys, tmp_path):
    path = write_parquet(tmp_path / "in" / "x.parquet", [[1, 2], [3], [70000]])
    err = run(capsys, tmp_path, "--input", path, "--token-dtype", "uint16")
    assert "x.parquet" in err and "row 2" in err and "70000" in err and "uint16" in err


def test_pad_token_out_of_range(capsys, tmp_path, shards):
    out = tmp_path / "out"
    code = main(["pack", "--local", "--input", str(shards), "--output", str(out), "--context-length", "4",
                 "--pad-token", str(2**40)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and str(2**40) in err and "int32" in err and not out.exists()


@pytest.mark.parametrize("dtype", ["auto", "int32"])
def test_a_negative_pad_token_is_one_line(capsys, tmp_path, shards, dtype):
    """A trial: --pad-token -1 packed, and the last chunk's -1s then failed the model's embedding lookup."""
    out = tmp_path / "out"
    code = main(["pack", "--local", "--input", str(shards), "--output", str(out), "--context-length", "4",
                 "--pad-token", "-1", "--token-dtype", dtype])
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert err == ("raypack: error: --pad-token -1: must be a token id >= 0 (padding is marked by doc_ids -1, not by "
                   "the pad token; e.g. --pad-token 0, or the tokenizer's pad or EOS id)\n")


@pytest.mark.parametrize("value", ["0", "-3"])
def test_bad_context_length(capsys, tmp_path, shards, value):
    out = tmp_path / "out"
    code = main(["pack", "--local", "--input", str(shards), "--output", str(out), "--context-length", value,
                 "--pad-token", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"--context-length {value}: must be in 1.." in err and not out.exists()


@pytest.mark.parametrize("command", ["pack", "tokenize", "mix"])
@pytest.mark.parametrize("make, said", [
    (lambda p: p.write_bytes(b"context_length = 128\n\xff\xfe = 1\n"),
     "is not UTF-8 text (byte 0xff at offset 21); TOML files are UTF-8"),
    (lambda p: p.mkdir(), "is a directory; give the .toml file in it"),
    (lambda p: p.write_text("context_length = \n"), "is not valid TOML: "),
    (lambda p: p.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n"), "nests arrays or tables too deeply to parse"),
    (lambda p: os.mkfifo(p), "is not a regular file; give a .toml file"),
    (lambda p: p.symlink_to("/dev/zero"), "is not a regular file; give a .toml file"),
    (lambda p: p.write_bytes(b"x = 1\n" + b"#" * (2 << 20)), "is larger than 1 MiB"),
])
def test_a_config_file_that_is_no_toml_text_is_one_line(capsys, tmp_path, shards, command, make, said):
    """An operator's trial: a config file that was not UTF-8, or a directory, gave a traceback (exit 1)."""
    config = tmp_path / "c.toml"
    make(config)
    argv = {"pack": ["pack", "--local", "--input", str(shards), "--output", str(tmp_path / "o")],
            "tokenize": ["tokenize", "--local", "--input", str(shards), "--output", str(tmp_path / "o")],
            "mix": ["mix", "--output", str(tmp_path / "o")]}[command]
    assert main([*argv, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"raypack: error: config file {config} {said}") and err.count("\n") == 1, err


def test_a_config_file_with_a_byte_order_mark_is_read(capsys, tmp_path, shards):
    config = tmp_path / "c.toml"
    config.write_bytes(b"\xef\xbb\xbfcontext_length = 8\n")
    assert main(["pack", "--local", "--config", str(config), "--input", str(shards), "--output",
                 str(tmp_path / "o")]) == 0


def test_non_integer_context_length_in_config(capsys, tmp_path, shards):
    config = tmp_path / "c.toml"
    config.write_text("context_length = 2.5\npad_token = 0\n")
    code = main(["pack", "--local", "--config", str(config), "--input", str(shards), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "context_length=2.5" in err and "c.toml" in err


def test_unknown_config_key_lists_valid_ones(capsys, tmp_path, shards):
    config = tmp_path / "c.toml"
    config.write_text("context_length = 8\ncontext_lenght = 9\n")
    code = main(["pack", "--local", "--config", str(config), "--input", str(shards), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "context_lenght" in err and "valid keys are" in err and "pad_token" in err
    assert "(context_lenght: did you mean context_length?)" in err
    config.write_text("context_lenght = 9\n")  # a new user's trial: this one typo said "--context-length is required"
    code = main(["pack", "--local", "--config", str(config), "--input", str(shards), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "(context_lenght: did you mean context_length?)" in err, err


def test_a_token_column_misnamed_gets_the_flag_with_the_files_own_column(capsys, tmp_path, shards):
    """A new user's trial: --token-column ids on shards with one list column said "name the token column with
    --token-column" and not which; a text column's line names its column (--text-column body)."""
    code = main(["pack", "--local", "--input", str(shards), "--output", str(tmp_path / "o"), "--context-length", "4",
                 "--token-column", "ids"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().endswith("its columns are ['input_ids']; name the token column with "
                                              "--token-column input_ids"), err


@pytest.mark.parametrize("tokenizer", [[], ["--tokenizer", "tiktoken:cl100k_base"]])
def test_inputs_that_mix_token_shards_and_text_are_said_to(capsys, tmp_path, tokenizer):
    """A new user's trial: token shards and text in one directory; without --tokenizer the line said to add it, with
    it the line said to drop it."""
    write_parquet(tmp_path / "in" / "a.parquet", [[1, 2, 3]])
    pq.write_table(pa.table({"text": ["hello world"]}), tmp_path / "in" / "b.parquet")
    pq.write_table(pa.table({"text": ["more"]}), tmp_path / "in" / "c.parquet")
    if tokenizer:  # text first, then the token shard
        os.rename(tmp_path / "in" / "a.parquet", tmp_path / "in" / "d.parquet")
    code = main(["pack", "--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "o"),
                 "--context-length", "4", *tokenizer])
    err = capsys.readouterr().err.strip().splitlines()
    tokens, text = (("d", "b") if tokenizer else ("a", "b"))
    assert code == 2 and err == [f"raypack: error: the inputs mix token shards ({tmp_path / 'in' / tokens}.parquet) "
                                 f"and text ({tmp_path / 'in' / text}.parquet); pack each kind in a run of its own "
                                 "(raypack pack for the token shards, raypack pack --tokenizer for the text; raypack "
                                 "mix trains on both outputs), or give one kind"], err
    assert not (tmp_path / "o").exists()


def test_mixed_token_dtypes_are_widened_safely(capsys, tmp_path):
    d = tmp_path / "in"
    write_parquet(d / "a.parquet", [[1, 2]], pa.list_(pa.int32()))
    write_parquet(d / "b.parquet", [[2**40]], pa.list_(pa.int64()))
    run(capsys, tmp_path, "--input", str(d), expect=0)
    from raypack.outputs import read_packed

    ds = read_packed(str(tmp_path / "out"))
    assert ds[0]["input_ids"].dtype == np.int64 and ds[0]["input_ids"][2] == 2**40


def test_mixed_token_dtypes_that_no_type_holds_are_refused(capsys, tmp_path):
    d = tmp_path / "in"
    write_parquet(d / "a.parquet", [[1, 2]], pa.list_(pa.int32()))
    write_parquet(d / "b.parquet", [[2**63]], pa.list_(pa.uint64()))
    err = run(capsys, tmp_path, "--input", str(d))
    assert "uint64" in err and "int32" in err


@pytest.mark.parametrize("given, where", [("dir", "packed"), ("recursive glob", "packed"), ("dir", "sub/packed")])
def test_output_inside_an_input_directory(capsys, tmp_path, shards, given, where):
    out = shards / where
    item = str(shards) if given == "dir" else f"{shards}/**/*.parquet"
    code = main(["pack", "--local", "--input", item, "--output", str(out), "--context-length", "4",
                 "--pad-token", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"lies inside the input {item}, whose files are read as shards" in err and not out.exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_holding_an_input_is_refused(capsys, tmp_path, overwrite):
    """``--input data/sub --output data --overwrite`` would replace data, the input with it."""
    write_parquet(tmp_path / "data" / "sub" / "a.parquet", [[1, 2, 3]])
    code = main(["pack", "--local", "--input", str(tmp_path / "data" / "sub" / "a.parquet"), "--output",
                 str(tmp_path / "data"), "--context-length", "4", *(["--overwrite"] if overwrite else [])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "holds 'sub', which raypack did not write" in err and "\n" not in err
    assert os.listdir(tmp_path / "data" / "sub") == ["a.parquet"]


@pytest.mark.parametrize("given", ["file", "one-folder glob"])
def test_an_output_beside_an_input_file_is_packed(capsys, tmp_path, shards, given):
    """Not inside an input: the input is one file (or a glob over one folder's files), which a run
    over it again reads without the output's files."""
    files = sorted(os.listdir(shards))
    item = str(shards / files[0]) if given == "file" else f"{shards}/*.parquet"
    assert main(["pack", "--local", "--input", item, "--output", str(shards / "packed"), "--context-length", "4",
                 "--pad-token", "0"]) == 0
    assert sorted(os.listdir(shards)) == sorted(files + ["packed"])


def test_non_empty_output_without_overwrite(capsys, tmp_path, shards):
    """A directory holding a file raypack did not write: --overwrite would refuse it too, so the line does not
    offer it (it explained --overwrite to a --resume)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    code = main(["pack", "--local", "--input", str(shards), "--output", str(out), "--context-length", "4",
                 "--pad-token", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "holds 'keep.txt', which raypack did not write; choose another --output" in err
    assert "--overwrite" not in err and (out / "keep.txt").exists()


def test_verify_exit_codes(capsys, tmp_path, shards):
    run(capsys, tmp_path, "--input", str(shards), expect=0)
    assert main(["verify", str(tmp_path / "out")]) == 0
    victim = sorted((tmp_path / "out").glob("chunks-*.arrow"))[0]
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out")]) == 1
    assert "sha256" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_working_directory_holding_a_clone_is_one_line_before_ray(tmp_path, monkeypatch, capsys, command):
    """Run from the folder that holds a clone, ./raypack is the repository: Ray's workers would
    import it instead of the installed package. One line naming the folder and the fix, before
    Ray starts (the fast tier refuses ray.init) and before anything is written."""
    (tmp_path / "raypack" / "raypack").mkdir(parents=True)  # a clone: ./raypack/raypack/...
    if command == "pack":
        write_parquet(tmp_path / "in" / "part-0.parquet", [[1, 2, 3]])
    else:
        (tmp_path / "in").mkdir()
        pq.write_table(pa.table({"text": ["some text"]}), tmp_path / "in" / "part-0.parquet")
    monkeypatch.chdir(tmp_path)
    args = (["pack", "--context-length", "4"] if command == "pack"
            else ["tokenize", "--tokenizer", "tiktoken:cl100k_base"])
    assert main([*args, "--input", "in", "--output", "out"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a folder named raypack" in err[0] and "run from another directory" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["in", "raypack"]


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_mistyped_input_is_one_line_before_ray_starts(tmp_path, capsys, command):
    """Not after an embedded Ray took seconds to start: the fast tier refuses ray.init, so a check
    that came after it would fail here."""
    args = (["pack", "--context-length", "4"] if command == "pack"
            else ["tokenize", "--tokenizer", "tiktoken:cl100k_base"])
    assert main([*args, "--input", str(tmp_path / "nope" / "*.parquet"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matched nothing" in err[0], err
    assert os.listdir(tmp_path) == []


def test_a_text_corpus_packed_without_tokenizer_names_tokenizer(tmp_path, capsys):
    """Both ways a new user meets it: the default token column missing, and --token-column text."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["hello world", "more text"]}), tmp_path / "in" / "part-0.parquet")
    for extra in ([], ["--token-column", "text"]):
        assert main(["pack", "--local", "--context-length", "4", "--input", str(tmp_path / "in"), "--output",
                     str(tmp_path / "out"), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--tokenizer" in err[0] and "--text-column text" in err[0], err


def test_tokenizer_over_a_tokenized_corpus_says_drop_tokenizer(tmp_path, capsys):
    write_parquet(tmp_path / "ids" / "part-0.parquet", [[1, 2, 3]])
    (tmp_path / "ids" / "manifest.json").write_text("{}")  # a raypack output: its manifest beside the parts
    assert main(["pack", "--local", "--context-length", "4", "--input", str(tmp_path / "ids"), "--output",
                 str(tmp_path / "out"), "--tokenizer", "tiktoken:cl100k_base"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a raypack output" in err[0] and "with `raypack pack`, no --tokenizer" in err[0], err


def test_text_options_over_a_packed_output_or_a_mix_say_what_it_is(tmp_path, capsys):
    """A trial: a packed output or a mix given as text was told to drop --tokenizer, and pack then refused it too
    (a mix as 'holds no shard files')."""
    from raypack.mix.dataset import load_mix_config, run_mix
    from raypack.sample import write_sample_corpus

    write_sample_corpus(str(tmp_path / "corpus"), num_shards=1, docs_per_shard=20, mean_doc_len=10, seed=1)
    assert main(["pack", "--local", "--context-length", "8", "--input", str(tmp_path / "corpus"), "--output",
                 str(tmp_path / "packed")]) == 0
    run_mix(load_mix_config(sources=[(str(tmp_path / "packed"), 1)], output=str(tmp_path / "mix"), num_chunks=10))
    capsys.readouterr()
    said = {}
    for name in ("packed", "mix"):
        for extra in (["--tokenizer", "tiktoken:cl100k_base"], []):
            assert main(["pack", "--local", "--context-length", "4", "--input", str(tmp_path / name), "--output",
                         str(tmp_path / "out"), *extra]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1, err
            said[name, bool(extra)] = err[0]
    packed, mix = str(tmp_path / "packed"), str(tmp_path / "mix")
    assert said["packed", True] == (f"raypack: error: input {packed} is a packed raypack output (fixed-length chunks "
                                    "of token ids), not text: give the text it was packed from (read it with "
                                    "raypack.read_packed)")
    assert "is a chunk file of a packed raypack output" in said["packed", False]
    assert said["mix", True] == (f"raypack: error: input {mix} is a mix (raypack mix's index over packed outputs), "
                                 "not text: give the text its sources were packed from (read it with "
                                 "raypack.read_packed)")
    assert said["mix", False] == (f"raypack: error: input directory {mix} is a mix (raypack mix's index over packed "
                                  "outputs), not a corpus of documents: read it with raypack.read_packed, or give "
                                  "pack the corpora its sources were packed from")


def test_a_directorys_json_metadata_is_not_read_as_json_lines(tmp_path):
    """An HF dataset_info.json beside the shards is skipped; a .json named explicitly is still read."""
    from raypack.inputs.shards import discover_shards

    write_parquet(tmp_path / "in" / "part-0.parquet", [[1, 2, 3]])
    (tmp_path / "in" / "dataset_info.json").write_text('{"description": ""}')
    assert discover_shards(str(tmp_path / "in")) == [str(tmp_path / "in" / "part-0.parquet")]
    assert discover_shards(str(tmp_path / "in" / "dataset_info.json")) == [str(tmp_path / "in" / "dataset_info.json")]
    assert main(["pack", "--local", "--context-length", "4", "--input", str(tmp_path / "in"), "--output",
                 str(tmp_path / "out")]) == 0


def test_without_ray_installed_a_ray_run_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.") or m == "raypack.engine.pipeline"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the [ray] extra were not installed
    import raypack.engine

    monkeypatch.delattr(raypack.engine, "pipeline", raising=False)  # an earlier import binds it here too
    write_parquet(tmp_path / "in" / "part-0.parquet", [[1, 2, 3]])
    assert main(["pack", "--context-length", "4", "--input", str(tmp_path / "in"), "--output",
                 str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and install_extra("ray") in err[0] and "--local" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("mistake", ["tokenizer", "eos"])
@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_mistyped_tokenizer_or_eos_is_one_line_before_ray_starts(tmp_path, capsys, command, mistake):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["some text"]}), tmp_path / "in" / "part-0.parquet")
    spec = str(tmp_path / "nope.json") if mistake == "tokenizer" else "tiktoken:cl100k_base"
    args = ["--tokenizer", spec, *(["--eos", "<|not a token|>"] if mistake == "eos" else [])]
    base = ["pack", "--context-length", "4"] if command == "pack" else ["tokenize"]
    assert main([*base, *args, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raypack: error: "), err
    assert ("nope.json" in err[0]) if mistake == "tokenizer" else ("not a token" in err[0]), err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("argv, wanted", [
    (["verify", "OUT", "IN"], ["verify", "OUT", "--input", "IN"]),
    (["verify", "OUT", "a", "b c"], ["verify", "OUT", "--input", "a", "--input", "b c"]),
    (["pack", "IN", "OUT", "--context-length", "4", "--pad-token", "0", "--local"],
     ["pack", "--context-length", "4", "--pad-token", "0", "--local", "--input", "IN", "--output", "OUT"]),
    (["pack", "--output", "OUT", "IN", "--context-length", "4", "--pad-token", "0", "--local"],
     ["pack", "--output", "OUT", "--context-length", "4", "--pad-token", "0", "--local", "--input", "IN"]),
])
def test_paths_given_bare_are_one_line_with_the_command_to_run(tmp_path, capsys, monkeypatch, shards, argv,
                                                                wanted):
    """A new user's ``raypack verify OUT IN`` or ``raypack pack IN OUT``: one line whose command runs."""
    import shlex

    monkeypatch.chdir(tmp_path)
    main(["pack", "--local", "--input", str(shards), "--output", "OUT", "--context-length", "4", "--pad-token", "0"])
    os.symlink(shards, tmp_path / "IN")
    for name, shard in (("a", "a.parquet"), ("b c", "b.parquet")):  # the two shards, as two inputs
        os.mkdir(tmp_path / name)
        os.symlink(shards / shard, tmp_path / name / shard)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("raypack: error: unexpected argument"), err
    assert "takes each input as --input PATH" in err
    suggested = shlex.split(err.split("run: raypack ", 1)[1])
    assert suggested == wanted
    if argv[0] == "pack":
        suggested.append("--overwrite")
    assert main(suggested) == 0, capsys.readouterr().err


def test_other_unknown_arguments_keep_argparses_error(capsys):
    assert main(["verify", "OUT", "--bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["raypack: error: unrecognized arguments: --bogus; raypack verify --help lists its flags"], err


@pytest.mark.parametrize("argv, said", [
    (["pack", "--tokeniser", "tok.json"], "unrecognized arguments: --tokeniser tok.json (--tokeniser: did you mean "
                                          "--tokenizer?)"),
    (["pack", "--context-lenght=64"], "(--context-lenght: did you mean --context-length?)"),
    # a new user's trial: argparse took --context for --context-length; a script that relies on a prefix breaks
    # the day a longer flag of that prefix comes
    (["pack", "--context", "64", "--input", "x", "--output", "y"], "unrecognized arguments: --context 64 "
                                                                   "(--context: did you mean --context-length?)"),
    (["pack", "--token", "ids"], "(--token: did you mean --token-column or --token-dtype?)"),
    (["tokenize", "--input", "x"], "the following arguments are required: --output; raypack tokenize --help"),
    (["pack", "--workers", "x"], "argument --workers: invalid int value: 'x'; raypack pack --help lists its flags"),
    (["pak"], "invalid choice: 'pak'"),
])
def test_a_mistyped_flag_is_one_line_with_the_flag_meant(capsys, argv, said):
    """argparse printed its usage block above the error, and no suggestion."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors leave by exit(2)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("raypack: error: ") and said in err[0], err


@pytest.mark.slow
@pytest.mark.parametrize("text", [False, True])
def test_workers_asking_for_more_cpus_than_the_machine_has_is_one_line(tmp_path, text):
    """An actor asking for more CPUs than any node has never starts, and Ray waits for it forever:
    on the embedded Ray, one line naming the flag, exit 2, nothing written (it hung before)."""
    import subprocess
    import sys

    if text:
        (tmp_path / "in").mkdir()
        pq.write_table(pa.table({"text": ["some text", "more text"]}), tmp_path / "in" / "part-0.parquet")
        args = ["--tokenizer", "tiktoken:cl100k_base"]
    else:
        write_parquet(tmp_path / "in" / "part-0.parquet", [[1, 2, 3]])
        args = []
    done = subprocess.run([sys.executable, "-m", "raypack.cli", "pack", "--input", str(tmp_path / "in"), "--output",
                           str(tmp_path / "out"), "--context-length", "4", "--worker-num-cpus", "64", *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "RAY_ADDRESS": ""})
    err = [line for line in done.stderr.splitlines() if not line.startswith("Ray's logs are in")]
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith("raypack: error: --worker-num-cpus 64: each worker asks for 64 CPUs"), err
    assert "at most" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.slow
@pytest.mark.parametrize("given", ["--address", "RAY_ADDRESS"])
def test_no_cluster_at_the_address_names_where_the_address_came_from(tmp_path, given):
    """Nothing listening at the address: one line naming ``--address`` or the environment's
    ``RAY_ADDRESS`` (it said --address for a RAY_ADDRESS the user never typed as a flag)."""
    write_parquet(tmp_path / "in" / "part-0.parquet", [[1, 2, 3]])
    flag = ["--address", "127.0.0.1:1"] if given == "--address" else []
    done = subprocess.run([sys.executable, "-m", "raypack.cli", "pack", "--input", str(tmp_path / "in"), "--output",
                           str(tmp_path / "out"), "--context-length", "4", *flag],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "RAY_ADDRESS": "" if flag else "127.0.0.1:1"})
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1, done.stderr
    assert err[0].startswith(f"raypack: error: no Ray cluster at {given}=127.0.0.1:1 ("), err
    assert ("unset RAY_ADDRESS" in err[0]) == (given == "RAY_ADDRESS"), err
    assert sorted(os.listdir(tmp_path)) == ["in"]


def test_address_auto_without_a_cluster_says_to_leave_it_out():
    """--address auto and no cluster: the line said "... or run on the head node with --address auto", the flag
    the user had typed; the fix is to leave it out for an embedded Ray. (Ray's own error, as ray.init raises it;
    a run is not started here: "auto" finds any Ray on the machine, another test's included.)"""
    from raypack.engine.connect import connect_hint

    said = connect_hint("auto", ConnectionError("Could not find any running Ray instance. Please specify the one to "
                                                 "connect to by setting `--address`"))
    assert said == ("no Ray cluster found for --address auto (Could not find any running Ray instance); start one "
                    "with `ray start --head`, or leave --address out (and unset RAY_ADDRESS) to run on an embedded "
                    "local Ray")


def test_a_packed_output_or_a_file_as_output_is_one_line_with_the_fix(tmp_path, capsys):
    """A packed output given as a corpus said its 'input_ids' "must be a list of integer token ids"; an
    --output that is a file said only "exists and is not a directory"."""
    write_parquet(tmp_path / "in" / "part-0.parquet", [[1, 2, 3], [4, 5]])
    assert main(["pack", "--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "packed"),
                 "--context-length", "4"]) == 0
    capsys.readouterr()
    assert main(["pack", "--local", "--input", str(tmp_path / "packed"), "--output", str(tmp_path / "again"),
                 "--context-length", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a chunk file of a packed raypack output (fixed-length 'input_ids', " \
        "'segment_doc_ids'), not a corpus of documents: give the corpus it was packed from" in err[0], err
    (tmp_path / "a-file").write_text("x")
    assert main(["pack", "--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "a-file"),
                 "--context-length", "4"]) == 2
    assert capsys.readouterr().err == (f"raypack: error: output {tmp_path / 'a-file'} exists and is a file, not a "
                                       "directory: give --output a directory (a new path is made), or move the file "
                                       "away\n")
    assert sorted(os.listdir(tmp_path)) == ["a-file", "in", "packed"]


@pytest.mark.parametrize("case", ["cpus", "text", "a damaged shard", "pack: a later file without its text column",
                                  "tokenize: a later file's text column not text"])
def test_refused_before_ray_starts(tmp_path, capsys, monkeypatch, case):
    """--worker-num-cpus over this machine's CPUs (embedded Ray), a text file packed without --tokenizer,
    a damaged token shard (its footer: the plan) and a later text file without its text column are one line
    before Ray takes seconds to start: Ray is never started here (a damaged shard was found after Ray's start,
    its line after Ray's own; a later text file's column once its task ran, after every file before it was
    tokenized and packed)."""
    from raypack.engine import pipeline

    def no_ray(*args, **kwargs):
        raise RuntimeError("Ray was started")

    monkeypatch.setattr(pipeline, "init_ray", no_ray)
    monkeypatch.setattr(pipeline.ray, "is_initialized", lambda: False)  # as in a fresh process (a test before
    # this one in the same worker may have left its Ray up: then the check rightly defers to Ray's own count)
    monkeypatch.setenv("RAY_ADDRESS", "")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    (tmp_path / "in").mkdir()
    if case == "text":
        pq.write_table(pa.table({"text": ["some text"]}), tmp_path / "in" / "part-0.parquet")
        args, said = ["pack"], "has no column 'input_ids'"
    elif case == "a damaged shard":
        write_parquet(tmp_path / "in" / "part-0.parquet", [[1, 2, 3]])
        (tmp_path / "in" / "part-1.parquet").write_bytes(b"PAR1garbagePAR1")
        args, said = ["pack"], f"shard {tmp_path / 'in' / 'part-1.parquet'} is not a readable Parquet file"
    elif case.endswith("text column") or case.endswith("not text"):
        pq.write_table(pa.table({"text": ["some text"] * 3}), tmp_path / "in" / "part-0.parquet")
        later = {"body": ["more text"]} if case.startswith("pack") else {"text": [7], "content": ["more text"]}
        pq.write_table(pa.table(later), tmp_path / "in" / "part-1.parquet")
        args = [case.split(":")[0], "--tokenizer", "tiktoken:cl100k_base"]
        said = (f"text file {tmp_path / 'in' / 'part-1.parquet'} has no column 'text'; its columns: body; its text "
                "column is 'body': pass --text-column body" if case.startswith("pack") else
                f"text file {tmp_path / 'in' / 'part-1.parquet'}: column 'text' holds int64, not text; it must hold "
                "strings (string, large_string or string_view, binary holding UTF-8, or a dictionary of those); its "
                "text column is 'content': pass --text-column content")
    else:
        write_parquet(tmp_path / "in" / "part-0.parquet", [[1, 2, 3]])
        args = ["pack", "--worker-num-cpus", "3"]
        said = "--worker-num-cpus 3: each worker asks for 3 CPUs, and this machine has 2"
    length = ["--context-length", "4"] if args[0] == "pack" else []
    code = main([*args, *length, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.slow
def test_more_text_workers_than_the_machine_holds_use_those_that_fit(tmp_path):
    """``pack --tokenizer --workers 3 --worker-num-cpus 1`` on 2 CPUs hung without a word: tasks go to
    actors in order, and the third actor never started. Now the workers that fit are used."""
    import subprocess
    import sys

    (tmp_path / "in").mkdir()
    for k in range(4):
        pq.write_table(pa.table({"text": [f"text {k} {i}" for i in range(50)]}), tmp_path / "in" / f"p{k}.parquet")
    args = ["--input", str(tmp_path / "in"), "--context-length", "16", "--tokenizer", "tiktoken:cl100k_base"]
    done = subprocess.run([sys.executable, "-m", "raypack.cli", "pack", *args, "--output", str(tmp_path / "out"),
                           "--workers", "64", "--worker-num-cpus", "1"],
                          capture_output=True, text=True, timeout=150, cwd=tmp_path,
                          env={**os.environ, "RAY_ADDRESS": ""})
    assert done.returncode == 0, done.stderr
    import re

    assert re.search(r"64 workers \(--workers, num_workers in a config\) of 1 CPU each \(--worker-num-cpus\): (\d+) "
                     r"fit in the cluster's \1 CPUs; using \1", done.stderr), done.stderr
    assert main(["pack", "--local", *args, "--output", str(tmp_path / "local")]) == 0
    with open(tmp_path / "out" / "manifest.json") as a, open(tmp_path / "local" / "manifest.json") as b:
        assert json.load(a)["content_sha256"] == json.load(b)["content_sha256"]


@pytest.mark.parametrize("case", ["text", "tokenize", "tokens", "tokens in Arrow", "side column"])
def test_a_column_named_twice_is_one_line(tmp_path, capsys, case):
    """Parquet and Arrow allow two columns of one name; raypack reads a column by its name. A hostile trial:
    two 'text' columns ended in a KeyError traceback (exit 1) with a staging directory left to --resume."""
    (tmp_path / "in").mkdir()
    name, args = "text", ["pack", "--tokenizer", "tiktoken:cl100k_base", "--context-length", "4"]
    if case in ("text", "tokenize"):
        table = pa.table([pa.array(["a b"]), pa.array(["c"])], names=["text", "text"])
        args = args if case == "text" else ["tokenize", "--tokenizer", "tiktoken:cl100k_base"]
    else:
        ids = pa.array([[1, 2, 3]], pa.list_(pa.int32()))
        name = "loss_mask" if case == "side column" else "input_ids"
        table = pa.table([ids, ids] if case != "side column" else [ids, ids, ids],
                         names=["input_ids", "input_ids"] if case != "side column" else
                         ["input_ids", "loss_mask", "loss_mask"])
        args = ["pack", "--context-length", "4"] + (["--extra-columns", "loss_mask"] if case == "side column" else [])
    path = tmp_path / "in" / ("part-0.arrow" if case == "tokens in Arrow" else "part-0.parquet")
    if case == "tokens in Arrow":
        with pa.ipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table)
    else:
        pq.write_table(table, path)
    code = main([*args, "--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == (f"raypack: error: shard {path} has 2 columns named {name!r}; a column is read by its name: "
                      "rename or drop all but one"), err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("where", ["flag", "config"])
def test_an_empty_tokenizer_is_one_line(tmp_path, capsys, where):
    """``--tokenizer ""`` (or ``tokenizer = ""``) read as "token ids": the line said the text file had no
    'input_ids' column and to pass --tokenizer (a new user's trial)."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["some text"]}), tmp_path / "in" / "a.parquet")
    args = ["pack", "--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]
    if where == "flag":
        args += ["--tokenizer", "", "--context-length", "8"]
        said = "--tokenizer"
    else:
        (tmp_path / "c.toml").write_text('tokenizer = " "\ncontext_length = 8\n')
        args += ["--config", str(tmp_path / "c.toml")]
        said = f"{tmp_path / 'c.toml'}: tokenizer"
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"raypack: error: {said} is empty; give a tokenizer.json, its directory or tiktoken:NAME, or leave it out "
        "to pack token ids"]


def test_an_unreadable_tokenizer_file_is_said_to_be_that(tmp_path, capsys, monkeypatch):
    """It said "is not a Hugging Face tokenizer.json (Permission denied ...); give the tokenizer.json a model
    ships": a wrong fix (a new user's trial, as a user without the file's read permission)."""
    import builtins

    import raypack.tokenize.tokenizers as tokenizers_module

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": ["some text"]}), tmp_path / "in" / "a.parquet")
    (tmp_path / "tokenizer.json").write_text("{}")

    def refuse(path, *args, **kwargs):
        if str(path).endswith("tokenizer.json"):
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(tokenizers_module, "open", refuse, raising=False)
    args = ["pack", "--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tokenizer",
            str(tmp_path / "tokenizer.json"), "--context-length", "8"]
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"raypack: error: tokenizer {tmp_path / 'tokenizer.json'} cannot be read (Permission denied); check its "
        "permissions"]


def test_a_config_with_its_keys_under_a_table_is_said_to_be_that(tmp_path, capsys):
    """Every key under ``[pack]``: it said "--context-length is required (or context_length in --config)"
    (a new user's trial). The keys are flat."""
    (tmp_path / "in").mkdir()
    write_parquet(tmp_path / "in" / "a.parquet", [[1, 2, 3]])
    (tmp_path / "c.toml").write_text('[pack]\ncontext_length = 8\n')
    assert main(["pack", "--local", "--config", str(tmp_path / "c.toml"), "--input", str(tmp_path / "in"),
                 "--output", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"raypack: error: config file {tmp_path / 'c.toml'} has a table [pack]; its keys are flat (context_length = "
        "2048, no [section]): move them out of [pack]"]


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_later_text_file_without_its_column_is_refused_before_any_text_is_tokenized(tmp_path, capsys, monkeypatch,
                                                                                      command):
    """--local: the missing column of the last of 17 files was met once its task ran (10 s of tokenizing and
    packing in a new user's trial, thrown away); the plan reads every file's footer, so it is refused there."""
    from raypack.tokenize import pieces

    def never(*args, **kwargs):
        raise AssertionError("a task was tokenized")

    monkeypatch.setattr(pieces, "_iter_texts", never)
    (tmp_path / "in").mkdir()
    for k in range(3):
        pq.write_table(pa.table({"text": [f"text {k}"] * 3}), tmp_path / "in" / f"part-{k}.parquet")
    pq.write_table(pa.table({"txt": ["more text"], "id": [1]}), tmp_path / "in" / "part-3.parquet")
    length = ["--context-length", "4"] if command == "pack" else []
    code = main([command, "--local", "--tokenizer", "tiktoken:cl100k_base", "--text-column", "text", *length,
                 "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"raypack: error: text file {tmp_path / 'in' / 'part-3.parquet'} has no column "
                                 "'text'; its columns: txt, id; its text column is 'txt': pass --text-column txt"], err
    assert sorted(os.listdir(tmp_path)) == ["in"]


@pytest.mark.parametrize("text", [True, False])
def test_inputs_without_a_document_make_an_empty_output_with_a_warning(tmp_path, caplog, text):
    """A glob that matched only empty files packed an empty output without a word (exit 0, 0 documents)."""
    (tmp_path / "in").mkdir()
    if text:
        (tmp_path / "in" / "a.jsonl").write_text("")
        pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "in" / "b.parquet")
    else:
        write_parquet(tmp_path / "in" / "a.parquet", [])
    tokenizer = ["--tokenizer", "tiktoken:cl100k_base"] if text else []
    with caplog.at_level("INFO", logger="raypack"):
        assert main(["pack", "--local", *tokenizer, "--input", str(tmp_path / "in"), "--output",
                     str(tmp_path / "out"), "--context-length", "4"]) == 0
    files = "2 files" if text else "1 file"
    assert [(r.levelname, r.getMessage()) for r in caplog.records if "no documents" in r.getMessage()] == [
        ("WARNING", f"the inputs hold no documents ({files}, every one empty): the output holds no chunks; check the "
                    "inputs")]


def _without_file_permission_overrides() -> list[str]:
    """A command prefix under which mode 000 blocks this user: root's overrides dropped (setpriv), or none."""
    import shutil

    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: a directory's permissions do not bind")
    return ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search"]


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_an_input_under_a_directory_that_may_not_be_searched_is_one_line(tmp_path, command):
    """A file under a directory of mode 000 (a hostile trial): a PermissionError traceback, exit 1, and a
    staging directory left behind with "rerun with --resume" although nothing was packed."""
    prefix = _without_file_permission_overrides()
    locked = tmp_path / "locked"
    locked.mkdir()
    pq.write_table(pa.table({"text": ["some text"]}), locked / "a.parquet")
    tok = tmp_path / "tokenizer.json"
    from tests.helpers import train_byte_level_bpe

    train_byte_level_bpe(["some text and more text"] * 4, 300).save(str(tok))
    out = tmp_path / "out"
    extra = ["--context-length", "8"] if command == "pack" else []
    os.chmod(locked, 0)
    try:
        done = subprocess.run([*prefix, sys.executable, "-m", "raypack.cli", command, "--local", "--input",
                               str(locked / "a.parquet"), "--output", str(out), "--tokenizer", str(tok), *extra],
                              capture_output=True, text=True, timeout=120)
    finally:
        os.chmod(locked, 0o755)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines == [f"raypack: error: cannot look up input {locked / 'a.parquet'} (permission denied on a directory "
                     "above it); check the permissions of its directories"], done.stderr
    assert sorted(os.listdir(tmp_path)) == ["locked", "tokenizer.json"]
