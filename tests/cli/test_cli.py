"""The entry points a user runs: the configs shipped in configs/, `raypack pack` with the
embedded Ray, and jobs/pack.py (the `ray job submit` entrypoint)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

import raypack
import raypack.cli
from raypack.cli import main
from raypack.errors import install_extra
from raypack.outputs import read_packed
from raypack.pack.config import PackConfig, load_config
from raypack.sample import write_sample_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "configs", "*.toml"))))
def test_shipped_configs_load(path):
    config = load_config(path)
    assert config.context_length >= 1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(str(root), num_shards=3, docs_per_shard=50, mean_doc_len=30, seed=7)
    return str(root)


def test_cli_pack_with_ray_prints_the_summary(ray_session, tmp_path, corpus, capsys):
    code = main(["pack", "--config", os.path.join(ROOT, "configs", "tiny.toml"), "--input", corpus,
                 "--output", str(tmp_path / "out"), "--context-length", "64", "--workers", "2"])
    printed = capsys.readouterr().out
    assert code == 0
    for word in ("documents", "tokens", "chunks", "padding", "split documents", "tokens/s"):
        assert word in printed
    assert len(read_packed(str(tmp_path / "out"))) > 0
    assert main(["verify", str(tmp_path / "out")]) == 0


@pytest.mark.slow  # > 5 s
def test_job_entrypoint_runs(tmp_path, corpus):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "jobs", "pack.py"), "--local", "--input", corpus, "--output", str(out),
         "--context-length", "64", "--pad-token", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "packed" in done.stdout and (out / "manifest.json").exists()


# ----------------------------------------------------------------------------- help, --version


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines: compare with single spaces


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"raypack {raypack.__version__}\n"


def test_top_level_help_is_a_short_description(capsys):
    printed = help_of(capsys)
    assert "Pack tokenized corpora into fixed-length context windows" in printed
    assert "Bad input" not in printed and "``" not in printed  # not the module's docstring
    assert "--version" in printed


def test_pack_help_shows_the_config_defaults(capsys):
    printed = help_of(capsys, "pack")
    defaults = PackConfig()
    for flag, value in [("--pad-token ID", defaults.pad_token), ("--token-column NAME", defaults.token_column),
                        ("--token-dtype DTYPE", defaults.token_dtype), ("--read-batch-tokens TOKENS",
                                                                        defaults.read_batch_tokens),
                        ("--chunks-per-record-batch N", defaults.chunks_per_record_batch),
                        ("--worker-num-cpus CPUS", defaults.worker_num_cpus),
                        ("--progress-timeout SECONDS", defaults.progress_timeout_s)]:
        section = printed.split("options:", 1)[1].split(flag, 1)[1].split(" --", 1)[0]
        assert f"(default: {value})" in section, (flag, section)
    assert "--context-length C tokens per chunk (required, or context_length in --config)" in printed
    assert "--sample-docs N with --dry-run: the first N documents of the stream (0: all) (default: 100000)" in printed
    assert ("--overwrite replace an earlier raypack output (a directory holding other files is refused) "
            "(default: off)") in printed
    assert "(default: text)" in printed and "(default: 65536)" in printed  # TextOptions' defaults


def test_pack_help_defaults_follow_packconfig(capsys, monkeypatch):
    """The help reads PackConfig's defaults; it does not repeat them."""
    monkeypatch.setattr(raypack.cli, "PackConfig", lambda: PackConfig(chunks_per_record_batch=77))
    assert "chunks per Arrow record batch written (default: 77)" in help_of(capsys, "pack")


def test_tokenize_help_shows_defaults(capsys):
    printed = help_of(capsys, "tokenize")
    assert "tokenizer actors (default: 2)" in printed and "(default: auto)" in printed
    assert "(default: text)" in printed and "(default: 67108864)" in printed


def test_verify_help_states_its_exit_statuses_and_they_hold(capsys, tmp_path, corpus):
    """A CI step that runs verify must tell a failed audit from a verify that could not run (a trial: the help
    said neither)."""
    import shutil

    printed = " ".join(help_of(capsys, "verify").split())
    assert "exit status: 0 the output passed; 1 it failed the audit" in printed and "2 verify could not run" in printed
    out = tmp_path / "out"
    assert main(["pack", "--input", corpus, "--output", str(out), "--context-length", "64", "--local"]) == 0
    assert main(["verify", str(out)]) == 0
    damaged = tmp_path / "damaged"
    shutil.copytree(out, damaged)
    (damaged / "manifest.json").write_text("{")
    assert main(["verify", str(damaged)]) == 1
    assert main(["verify", str(tmp_path / "none")]) == 2


# ----------------------------------------------------------------------------- refused flags: one line, exit 2


def refused(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("raypack: error: "), err
    return err.strip()


@pytest.fixture(scope="module")
def tiny_input(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    write_sample_corpus(str(root), num_shards=2, docs_per_shard=20, mean_doc_len=10, seed=3)
    return str(root)


def test_context_length_is_required_without_a_config(capsys, tiny_input, tmp_path):
    err = refused(capsys, ["pack", "--local", "--input", tiny_input, "--output", str(tmp_path / "o")])
    assert err == "raypack: error: --context-length is required (or context_length in --config)"
    assert not (tmp_path / "o").exists()
    config = tmp_path / "c.toml"
    config.write_text("pad_token = 0\n")  # a config without context_length does not give it either
    assert "--context-length is required" in refused(capsys, ["pack", "--local", "--config", str(config), "--input",
                                                              tiny_input, "--output", str(tmp_path / "o")])


def test_context_length_from_the_config_or_the_flag(capsys, tiny_input, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("context_length = 24\n")
    assert main(["pack", "--local", "--config", str(config), "--input", tiny_input, "--output",
                 str(tmp_path / "a")]) == 0
    assert read_packed(str(tmp_path / "a")).context_length == 24
    assert main(["pack", "--local", "--input", tiny_input, "--output", str(tmp_path / "b"), "--context-length",
                 "16"]) == 0
    assert read_packed(str(tmp_path / "b")).context_length == 16


REFUSED = {
    "sample-docs without dry-run": (["--sample-docs", "10"], "--sample-docs applies only with --dry-run"),
    "sample-docs 0 without dry-run": (["--sample-docs", "0"], "--sample-docs applies only with --dry-run"),
    "resume with overwrite": (["--resume", "--overwrite"], "--resume and --overwrite cannot be used together"),
    "dry-run with resume": (["--dry-run", "--resume"], "--dry-run and --resume cannot be used together"),
    "dry-run with overwrite": (["--dry-run", "--overwrite"], "--dry-run and --overwrite cannot be used together"),
    "local with address": (["--local", "--address", "127.0.0.1:6379"], "--local and --address cannot be used together"),
    "dry-run with address": (["--dry-run", "--address", "auto"], "--dry-run and --address cannot be used together"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_contradictory_pack_flags_are_refused(capsys, tiny_input, tmp_path, case):
    extra, message = REFUSED[case]
    local = [] if "--address" in extra else ["--local"]  # a wrong acceptance then packs without Ray
    err = refused(capsys, ["pack", *local, "--input", tiny_input, "--output", str(tmp_path / "o"),
                           "--context-length", "16", *extra])
    assert message in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags, said", [
    (["--workers", "0"], "--workers 0: must be an integer >= 1"),
    (["--context-length", "0"], "--context-length 0: must be in 1..")])
def test_a_bad_flag_value_names_the_flag(capsys, tiny_input, tmp_path, flags, said):
    args = ["pack", "--local", "--input", tiny_input, "--output", str(tmp_path / "o"), "--context-length", "16"]
    err = refused(capsys, [*args, *flags])
    assert err.startswith(f"raypack: error: {said}"), err
    config = tmp_path / "c.toml"
    config.write_text("num_workers = 0\n")  # from a config file: its key, named with the file
    err = refused(capsys, [*args, "--config", str(config)])
    assert err.startswith(f"raypack: error: {config}: num_workers=0 must be"), err


def test_tokenize_refuses_resume_with_overwrite(capsys, tmp_path):
    err = refused(capsys, ["tokenize", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--tokenizer",
                           "tiktoken:cl100k_base", "--local", "--resume", "--overwrite"])
    assert "--resume and --overwrite cannot be used together" in err


def test_dry_run_takes_sample_docs(capsys, tiny_input):
    assert main(["pack", "--input", tiny_input, "--context-length", "16", "--dry-run", "--sample-docs", "5"]) == 0
    assert capsys.readouterr().out


@pytest.fixture(scope="module")
def packed(tmp_path_factory, tiny_input):
    out = tmp_path_factory.mktemp("packed") / "out"
    assert main(["pack", "--local", "--input", tiny_input, "--output", str(out), "--context-length", "16"]) == 0
    return str(out)


@pytest.mark.parametrize("extra, message", [
    (["--input", "x.parquet"], "--no-inputs and --input cannot be used together"),
    (["--token-column", "ids"], "--no-inputs and --token-column cannot be used together"),
])
def test_verify_refuses_no_inputs_with_inputs(capsys, packed, extra, message):
    assert message in refused(capsys, ["verify", packed, "--no-inputs", *extra])
    assert main(["verify", packed, "--no-inputs"]) == 0


# ----------------------------------------------------------------------------- stats --plot


def test_stats_plot_without_matplotlib_names_the_extra(capsys, packed, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["stats", packed, "--plot", str(tmp_path / "s.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and install_extra("plot") in err and "[plot]'" in err, err
    assert not (tmp_path / "s.png").exists()


def test_stats_plot_has_fixed_axes(packed, tmp_path, monkeypatch):
    """Every y axis is 0-100 (%) and the histogram's x axis 1..C+1, whatever the data, and the
    histogram's bars are shares of all fragments (they sum to 100)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from raypack.cli.stats import packing_stats, plot_stats

    seen = []
    savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (seen.append(fig.axes), savefig(fig, *a, **k)))
    png = plot_stats(packing_stats(packed), str(tmp_path / "s.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    (axes,) = seen
    assert [tuple(ax.get_ylim()) for ax in axes] == [(0, 100)] * 3
    assert tuple(axes[0].get_xlim()) == (1, 17)
    assert sum(bar.get_height() for bar in axes[0].patches) == pytest.approx(100)


def test_an_extra_is_installed_from_the_checkout_never_by_the_pypi_name():
    """``pip install raypack[text]`` installs another project (the PyPI name is taken): every message
    that names an extra gives the checkout's path."""
    import raypack
    from raypack.engine.session import RAY_EXTRA
    from raypack.tokenize.tokenizers import TEXT_EXTRA

    root = os.path.dirname(os.path.dirname(os.path.abspath(raypack.__file__)))
    assert install_extra("text") == f"pip install -e '{root}[text]'" or " " in root
    for said in (TEXT_EXTRA, RAY_EXTRA, install_extra("plot"), install_extra("torch")):
        assert said.startswith("pip install -e ") and root in said and "raypack[" not in said.replace(root, "")


@pytest.mark.parametrize("command", ["tokenize", "export"])
def test_workers_0_reads_the_same_in_every_command(capsys, tmp_path, command):
    args = (["tokenize", "--input", str(tmp_path), "--output", str(tmp_path / "o"), "--tokenizer",
             "tiktoken:cl100k_base", "--local"] if command == "tokenize"
            else ["export", str(tmp_path), "--format", "megatron", "--output", str(tmp_path / "o")])
    err = refused(capsys, [*args, "--workers", "0"])
    assert "--workers 0: must be an integer >= 1" in err, err


@pytest.fixture
def text_input(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "text").mkdir()
    pq.write_table(pa.table({"body": [f"document {i} " * (i % 5 + 1) for i in range(60)]}),
                   tmp_path / "text" / "a.parquet", row_group_size=10)
    return str(tmp_path / "text")


def manifest_of(out) -> dict:
    import json

    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def test_tokenize_takes_a_pack_config_s_inputs_tokenizer_and_text_keys(capsys, tmp_path, text_input):
    """``raypack tokenize --config pack.toml``: its inputs, tokenizer and text keys (the pack keys
    are pack's), the same corpus as the flags give; a flag overrides its key."""
    config = tmp_path / "pack.toml"
    config.write_text(f'context_length = 64\ninputs = ["{text_input}"]\ntokenizer = "tiktoken:cl100k_base"\n'
                      'text_column = "body"\neos = 100257\ntask_rows = 20\n')
    assert main(["tokenize", "--local", "--config", str(config), "--output", str(tmp_path / "by-config")]) == 0
    assert main(["tokenize", "--local", "--input", text_input, "--tokenizer", "tiktoken:cl100k_base", "--text-column",
                 "body", "--eos", "100257", "--task-rows", "20", "--output", str(tmp_path / "by-flags")]) == 0
    assert main(["tokenize", "--local", "--config", str(config), "--eos", "100256", "--output",
                 str(tmp_path / "flag-wins")]) == 0
    by_config, by_flags = manifest_of(tmp_path / "by-config"), manifest_of(tmp_path / "by-flags")
    assert by_config["content_sha256"] == by_flags["content_sha256"]
    same = {k: v for k, v in by_config["options"].items() if k != "eos"}  # as given: 100257 (TOML), "100257" (flag)
    assert same == {k: v for k, v in by_flags["options"].items() if k != "eos"}
    assert by_config["options"]["eos_id"] == 100257 and by_config["options"]["text_column"] == "body"
    assert by_config["counts"]["shards"] == 3  # task_rows = 20 of 60 rows
    assert manifest_of(tmp_path / "flag-wins")["options"]["eos_id"] == 100256
    capsys.readouterr()
    assert "--tokenizer is required (or tokenizer in --config)" in refused(
        capsys, ["tokenize", "--local", "--input", text_input, "--output", str(tmp_path / "o")])


@pytest.mark.parametrize("line, said", [
    ("eos = 100257.0", "eos=100257.0 must be a token string or an integer id"),
    ("bos = true", "bos=True must be a token string or an integer id"),
    ("tokenizer_backend = \"fast\"", "tokenizer_backend='fast' must be one of auto"),
    ("task_bytes = 0", "task_bytes=0 must be an integer >= 1"),
    ("text_column = 3", "text_column=3 must be the name of a column or key")])
def test_a_bad_text_key_in_a_config_is_one_line_naming_file_and_key(capsys, tmp_path, text_input, line, said):
    """Each was a traceback (a float or bool eos) or named a flag the user never typed; nothing is left behind
    (a traceback left an empty staging directory that blocked the next run)."""
    config = tmp_path / "c.toml"
    config.write_text(f'context_length = 64\ntokenizer = "tiktoken:cl100k_base"\n{line}\n')
    for command in (["pack", "--context-length", "8"], ["tokenize"]):
        err = refused(capsys, [*command, "--local", "--config", str(config), "--input", text_input, "--output",
                               str(tmp_path / "o")])
        assert err.startswith(f"raypack: error: {config}: {said}"), err
        assert sorted(os.listdir(tmp_path)) == ["c.toml", "text"]


def test_text_keys_without_a_tokenizer_name_the_keys_or_the_flags_given(capsys, tmp_path, tiny_input):
    config = tmp_path / "c.toml"
    config.write_text('context_length = 64\ntext_column = "body"\n')
    args = ["pack", "--local", "--input", tiny_input, "--output", str(tmp_path / "o")]
    assert refused(capsys, [*args, "--config", str(config)]).endswith(
        f"{config}: text_column needs tokenizer: it applies to text inputs; set tokenizer there or pass --tokenizer")
    assert "error: --eos, --task-rows need --tokenizer: they apply" in refused(
        capsys, [*args, "--context-length", "8", "--eos", "1", "--task-rows", "5"])


def test_a_flags_only_refusal_names_the_flags_not_config_keys(capsys, tmp_path, text_input):
    """With no --config it said "config: extra_columns need token inputs"."""
    err = refused(capsys, ["pack", "--local", "--input", text_input, "--tokenizer", "tiktoken:cl100k_base",
                           "--extra-columns", "loss_mask", "--context-length", "8", "--output", str(tmp_path / "o")])
    assert err.startswith("raypack: error: --extra-columns need token inputs: text has no per-token columns"), err


def test_a_relative_output_in_a_submitted_job_is_refused(tmp_path, monkeypatch, capsys, corpus):
    """An operator's trial: `ray job submit --working-dir . -- python jobs/pack.py ... --output build/x` printed
    "packed build/x" and the job succeeded, but the output lay in Ray's copy of the working directory."""
    from raypack.cli import refuse_output_in_rays_copy

    copy = tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_2d3a"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    assert main(["pack", "--local", "--input", corpus, "--output", "build/x", "--context-length", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raypack: error: --output build/x is relative, and this job runs in Ray's copy of its "
                          f"working directory ({copy}), which Ray removes") and err.count("\n") == 1
    assert not (copy / "build").exists()
    refuse_output_in_rays_copy(str(tmp_path / "abs"))       # absolute, or a URI, or run elsewhere: fine
    refuse_output_in_rays_copy("s3://bucket/out")
    refuse_output_in_rays_copy("build/x", cwd=str(tmp_path))


def test_a_storage_failure_under_a_command_is_one_line_and_pack_keeps_its_work(tmp_path, corpus, capsys, monkeypatch):
    """An OSError that is not bad input (an S3 server killed mid-run, a disk's I/O error): it was a traceback,
    exit 1 (an operator's trial). Now one line, exit 1; a pack keeps its finished tasks for --resume."""
    import errno

    from raypack.pack.publish import staging_dir

    from packing_faults import fail_at_shard

    fail_at_shard(monkeypatch, 1, OSError(errno.EIO, "When completing multiple part upload: AWS Error "
                                                     "NETWORK_CONNECTION\nDetails: Failed to connect"))
    out = str(tmp_path / "out")
    code = main(["pack", "--input", corpus, "--output", out, "--context-length", "16", "--local", "--workers", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1, err
    assert err[-1] == ("raypack: error: the storage failed: [Errno 5] When completing multiple part upload: AWS Error "
                       "NETWORK_CONNECTION Details: Failed to connect; the finished tasks are kept: run the same "
                       "command with --resume once it answers"), err
    assert not any(line.startswith("Traceback") for line in err)
    assert os.path.isdir(staging_dir(out)) and not os.path.exists(out)
    monkeypatch.undo()
    assert main(["pack", "--input", corpus, "--output", out, "--context-length", "16", "--local", "--resume"]) == 0

    def unreachable(args):
        raise OSError("When reading information for key 'out/manifest.json': AWS Error NETWORK_CONNECTION")

    monkeypatch.setattr(raypack.cli, "_run_verify", unreachable)
    assert main(["verify", out]) == 1
    assert capsys.readouterr().err.strip().endswith("AWS Error NETWORK_CONNECTION; run it again once it answers")
