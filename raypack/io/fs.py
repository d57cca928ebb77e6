"""Filesystems: local paths and URIs, one filesystem per bucket, bucket checks, opening, error text.

Every file access of raypack goes through a ``pyarrow.fs`` filesystem from
:func:`resolve_filesystem`, so local paths and URIs such as ``s3://bucket/key``,
``gs://bucket/key`` or ``file:///data`` work alike (and any scheme fsspec knows, through
``pyarrow.fs.FSSpecHandler``). Credentials and endpoints come from the filesystem's own
environment variables and config files (for S3: ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``,
``~/.aws/config``, ...). One filesystem is made per URI root (scheme, bucket, query), so
planning 10k shards in one bucket resolves its region once.

:func:`is_uri` is the one test of "is this a URI" (``scheme://...``); anything else is a
local path. :func:`error_text` puts an exception's (often multi-line) message on one line for
an InputError. pyarrow only, no Ray.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import urllib.parse

import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import InputChanged, InputError

__all__ = [
    "bucket_of",
    "check_bucket",
    "clear_filesystem_cache",
    "error_text",
    "is_uri",
    "open_input_file",
    "resolve_filesystem",
]

_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def is_uri(path: str) -> bool:
    """True when ``path`` starts with ``scheme://`` (``s3://``, ``file://``, ``memory://``, ...)."""
    return bool(_URI_RE.match(path))


def same_file_key(path: str) -> str:
    """What two spellings of one file or directory share: a local one's device and inode (``..``, a symbolic
    link, a hard link; its real path where it cannot be stat'ed); a URI as it is, less a trailing '/'."""
    if is_uri(path):
        return path.rstrip("/")
    try:
        info = os.stat(path)
    except OSError:
        return os.path.realpath(path)
    return f"inode:{info.st_dev}:{info.st_ino}"


def error_text(error: BaseException, max_chars: int | None = None) -> str:
    """``error``'s message on one line (whitespace runs become one space), cut at ``max_chars``."""
    text = " ".join(str(error).split())
    return text if max_chars is None else text[:max_chars]


def resolve_filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding ``path`` and the path inside it.

    URIs (``s3://bucket/key``, ``file:///abs``, ...) go through ``FileSystem.from_uri``, once
    per root ``scheme://netloc?query`` (cached); schemes pyarrow does not know go through
    fsspec. Anything else is a local path, made absolute.
    """
    if not is_uri(path):
        return pafs.LocalFileSystem(), pathlib.Path(path).absolute().as_posix()
    try:
        split = urllib.parse.urlsplit(path)
        query = f"?{split.query}" if split.query else ""
        fs, root_path = _filesystem_for(f"{split.scheme}://{split.netloc}/{query}")
    except (pa.ArrowException, OSError, ValueError, ImportError) as e:
        raise InputError(
            f"cannot open a filesystem for {path!r}: {error_text(e)}; give a local path or a URI such as "
            "s3://bucket/key (check the bucket name, region and credentials; on a cluster the workers need the "
            "credentials and endpoint too: README, Object storage)"
        ) from e
    if root_path is None:  # fsspec
        return fs, fs.handler.fs._strip_protocol(path.split("?", 1)[0])
    rel = urllib.parse.unquote(split.path).strip("/")
    if not rel or not root_path:
        return fs, rel or root_path
    return fs, f"{root_path.rstrip('/')}/{rel}"


@functools.lru_cache(maxsize=256)
def _filesystem_for(root: str) -> tuple[pafs.FileSystem, str | None]:
    """The filesystem of URI root ``root`` and the root's path in it (None when from fsspec)."""
    try:
        return pafs.FileSystem.from_uri(root)
    except pa.ArrowInvalid as e:
        if "Unrecognized filesystem type" not in str(e):
            raise
    import fsspec

    fs, _ = fsspec.core.url_to_fs(root)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), None


def clear_filesystem_cache() -> None:
    """Forget the cached filesystems (after changing credentials or endpoints in this process)."""
    _filesystem_for.cache_clear()


def bucket_of(fs: pafs.FileSystem, fs_path: str) -> str | None:
    """The bucket ``fs_path`` lies in when ``fs`` is S3 or GCS (paths ``bucket/key``), else None."""
    return fs_path.split("/", 1)[0] if fs.type_name in ("s3", "gcs") else None


def check_bucket(fs: pafs.FileSystem, fs_path: str, what: str) -> None:
    """Raise InputError naming the bucket when ``fs`` is an object store lacking ``fs_path``'s bucket.

    ``what`` names the path for the message, e.g. "input s3://bucket/data".
    """
    bucket = bucket_of(fs, fs_path)
    if bucket is not None and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        raise InputError(
            f"bucket {bucket!r} does not exist ({what}); check the bucket name and the endpoint "
            "(AWS_ENDPOINT_URL) the credentials point at"
        )


def is_file(path: str) -> bool:
    """Whether ``path`` (local or URI) is a file now; False where it cannot be looked up."""
    try:
        fs, fs_path = resolve_filesystem(path)
        return fs.get_file_info(fs_path).type == pafs.FileType.File
    except (InputError, OSError, pa.ArrowException):
        return False


def open_input_file(fs: pafs.FileSystem, fs_path: str, path: str) -> pa.NativeFile:
    """``fs.open_input_file``; a missing or unreadable file raises InputError naming ``path``."""
    try:
        return fs.open_input_file(fs_path)
    except FileNotFoundError as e:  # not bad data: the tasks finished from the other files are kept
        raise InputChanged(f"input path not found: {path}; it was there when the run listed its inputs: was it "
                           "moved or deleted since, or is it where a worker on another node cannot see it? (rerun "
                           "once the inputs stay put, on storage every node sees)") from e
    except PermissionError as e:
        raise InputError(f"shard {path} is not readable ({error_text(e)}); check its permissions") from e
