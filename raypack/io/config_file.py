"""A TOML config file read for ``--config`` (pack, tokenize, mix): its table, or one line naming the file
and what is wrong with it (missing, a directory or another non-file, too large, unreadable, not UTF-8,
not TOML, nested past Python's parser)."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from raypack.errors import InputError

MAX_CONFIG_BYTES = 1 << 20
"""A config is a few keys; a larger file is not one (a trial's config was a link to /dev/zero)."""


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The TOML document at ``path``; InputError, one line, for anything that is not one."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"config file {path} is a directory; give the .toml file in it")
        if not stat.S_ISREG(mode):  # a FIFO would wait for a writer; a device reads forever
            raise InputError(f"config file {path} is not a regular file; give a .toml file")
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError as e:
        raise InputError(f"config file not found: {path}") from e
    except OSError as e:
        raise InputError(f"config file {path} cannot be read ({e.strerror or e})") from e
    if len(data) > MAX_CONFIG_BYTES:
        raise InputError(f"config file {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB; a config holds a few keys")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")  # a byte order mark: an editor's, not TOML's
    except UnicodeDecodeError as e:
        raise InputError(f"config file {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                         "TOML files are UTF-8") from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"config file {path} is not valid TOML: {e}") from e
    except RecursionError as e:
        raise InputError(f"config file {path} nests arrays or tables too deeply to parse; a config holds a few "
                         "keys") from e
