"""raypack.io.fs: the one URI test, the one-line error text, local paths resolved."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from raypack.io.fs import error_text, is_uri, resolve_filesystem


@pytest.mark.parametrize("path", ["s3://bucket/key", "file:///abs", "gs://b", "memory://x/y", "s3+x.y-z://b"])
def test_is_uri_true_for_scheme_colon_slash_slash(path):
    assert is_uri(path)


@pytest.mark.parametrize("path", ["data/a.parquet", "/abs/a://b", "a b://c", "://x", "1s3://b", "", "s3:/b"])
def test_is_uri_false_for_local_paths(path):
    """A "://" that does not follow a scheme at the very start is part of a local path."""
    assert not is_uri(path)


def test_local_path_with_colon_slashes_stays_local(tmp_path):
    path = f"{tmp_path}/odd://name"
    fs, fs_path = resolve_filesystem(path)
    assert isinstance(fs, pafs.LocalFileSystem) and fs_path.startswith(f"{tmp_path}/odd:")


def test_error_text_is_one_line_and_cut():
    error = OSError("first line\n  second\tline  ")
    assert error_text(error) == "first line second line"
    assert error_text(error, 10) == "first line"


@pytest.mark.parametrize("command", ["verify", "stats"])
def test_an_output_on_a_store_that_cannot_be_reached_is_one_line_exit_2(tmp_path, command):
    """An endpoint typo (nothing listens there): it was a traceback, exit 1, which verify's exit codes read as
    an output that failed its audit (an operator's trial). Now one line naming the fix, exit 2."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_MAX_ATTEMPTS": "1",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    done = subprocess.run([sys.executable, "-m", "raypack.cli", command, "s3://bucket/out"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raypack: error: cannot reach the output s3://bucket/out (")
    assert lines[0].endswith("; check the endpoint (AWS_ENDPOINT_URL) and the credentials")
