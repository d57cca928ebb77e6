"""A TOML config file read for ``--config`` (pack, tokenize, mix): its table, or one line naming the file
and what is wrong with it (missing, a directory, unreadable, not UTF-8, not TOML)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from raypack.errors import InputError


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The TOML document at ``path``; InputError, one line, for anything that is not one."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError as e:
        raise InputError(f"config file not found: {path}") from e
    except IsADirectoryError as e:
        raise InputError(f"config file {path} is a directory; give the .toml file in it") from e
    except OSError as e:
        raise InputError(f"config file {path} cannot be read ({e.strerror or e})") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"config file {path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                         "TOML files are UTF-8") from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"config file {path} is not valid TOML: {e}") from e
