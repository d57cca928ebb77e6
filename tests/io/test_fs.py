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
