"""Untrusted input, read safely: one-line values, typed JSON fields, plain files opened without following links.

Every manifest kind (a packed output's, a tokenized corpus's, a mix's) and the exports' indexes
check their fields with these, so a bad value reads the same everywhere: the file, the field,
the value (cut to one line) and what to do.
"""

from __future__ import annotations

import mmap
import numbers
import os
import stat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import InputError

MAX_COUNT = 1 << 53
"""Largest count, byte size or number of positions (``chunks * context_length``) a manifest may claim."""
TOKEN_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
DAMAGED = "the output was replaced or damaged"
_HEX = frozenset("0123456789abcdef")


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)`` on one line, cut to about ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300]


def int_field(obj: dict[str, Any], key: str, where: str, minimum: int = 0, maximum: int = MAX_COUNT,
              prefix: str = "", fix: str = DAMAGED) -> int:
    """``obj[key]`` when it is an int (not a bool) in ``[minimum, maximum]``, else InputError
    naming ``where`` and ``{prefix}{key}``."""
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InputError(f"{where}: {prefix}{key}={show(value)}, expected an integer; {fix}")
    if not minimum <= value <= maximum:
        raise InputError(f"{where}: {prefix}{key}={show(value)}, expected an integer in {minimum}..{maximum}; "
                         f"{fix}")
    return int(value)


def is_hex(value: Any, length: int) -> bool:
    return isinstance(value, str) and len(value) == length and _HEX.issuperset(value)


def token_dtype_field(manifest: dict[str, Any], where: str, fix: str = DAMAGED) -> np.dtype:
    name = manifest.get("token_dtype")
    if not isinstance(name, str) or name not in TOKEN_DTYPES:
        raise InputError(f"{where}: token_dtype={show(name)} is not an integer dtype (one of "
                         f"{', '.join(TOKEN_DTYPES)}); {fix}")
    return np.dtype(name)


def str_field(obj: dict[str, Any], key: str, where: str, prefix: str = "", fix: str = DAMAGED,
              optional: bool = False) -> str | None:
    """``obj[key]`` when it is a non-empty string without a NUL (absent: None if ``optional``), else InputError."""
    value = obj.get(key)
    if value is None and optional and key not in obj:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        raise InputError(f"{where}: {prefix}{key}={show(value)}, expected a non-empty string; {fix}")
    return value


def hex_field(obj: dict[str, Any], key: str, where: str, length: int = 64, prefix: str = "", fix: str = DAMAGED) -> str:
    """``obj[key]`` when it is ``length`` lowercase hex digits, else InputError."""
    value = obj.get(key)
    if not is_hex(value, length):
        raise InputError(f"{where}: {prefix}{key}={show(value)}, expected {length} lowercase hex digits; {fix}")
    return value


def object_field(obj: dict[str, Any], key: str, where: str, prefix: str = "", fix: str = DAMAGED) -> dict[str, Any]:
    """``obj[key]`` when it is a JSON object, else InputError."""
    value = obj.get(key)
    if not isinstance(value, dict):
        raise InputError(f"{where}: {prefix}{key}={show(value)}, expected an object; {fix}")
    return value


def object_list_field(obj: dict[str, Any], key: str, where: str, required: tuple[str, ...],
                      allowed: tuple[str, ...] = (), fix: str = DAMAGED,
                      non_empty: bool = True) -> list[dict[str, Any]]:
    """``obj[key]`` when it is a list (non-empty if ``non_empty``) of objects, each holding every
    key of ``required`` and no key outside ``required + allowed``; else InputError naming the entry."""
    value = obj.get(key)
    if not isinstance(value, list) or (non_empty and not value):
        raise InputError(f"{where}: {key}={show(value)}, expected a {'non-empty ' if non_empty else ''}list of "
                         f"objects; {fix}")
    known = frozenset(required) | frozenset(allowed)
    for k, entry in enumerate(value):
        if not isinstance(entry, dict) or not known.issuperset(entry) or any(name not in entry for name in required):
            raise InputError(f"{where}: {key}[{k}]={show(entry)}, expected an object with {', '.join(required)}"
                             f"{' (and optionally ' + ', '.join(allowed) + ')' if allowed else ''}; {fix}")
    return value


def _missing(path: str) -> InputError:
    return InputError(f"{path}: listed in the manifest but missing; {DAMAGED}")


def open_local_file(path: str) -> tuple[pa.NativeFile, int]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as e:
        raise _missing(path) from e
    except OSError as e:  # ELOOP: a symlink
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({one_line(e)})"
        raise InputError(f"{path}: {kind}; only plain files directly inside the output directory are read") from e
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: not a plain file (mode {stat.filemode(info.st_mode)}); only plain files "
                             "directly inside the output directory are read")
        if info.st_size == 0:
            return pa.BufferReader(b""), 0
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise InputError(f"{path}: unreadable ({one_line(e)})") from e
    finally:
        os.close(fd)  # the mapping keeps the file itself alive, even once it is unlinked
    return pa.BufferReader(pa.py_buffer(mapped)), info.st_size


def open_remote_file(filesystem: pafs.FileSystem, path: str) -> tuple[pa.NativeFile, int]:
    try:
        source = filesystem.open_input_file(path)
        return source, source.size()
    except FileNotFoundError as e:
        raise _missing(path) from e
    except (OSError, pa.ArrowException) as e:
        raise InputError(f"{path}: unreadable ({one_line(e)}); {DAMAGED}") from e
