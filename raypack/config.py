"""The job's configuration: one frozen dataclass, loaded from ``configs/*.toml`` and overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import tomllib

from raypack.core import validate_context_length, validate_pad_token
from raypack.errors import InputError

OUTPUT_KEYS = ("inputs", "context_length", "pad_token", "token_column", "token_dtype", "chunks_per_record_batch",
               "strategy")
STRATEGIES = ("concat", "best_fit")
TOKEN_DTYPES = ("auto", "uint8", "uint16", "uint32", "int16", "int32", "int64")


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """Everything a packing run needs. Unknown keys are rejected by :func:`load_config`."""

    inputs: tuple[str, ...] = ()
    """Shard files, directories or globs, in order."""
    output: str = ""
    """Output directory (created; must be empty unless overwrite or resume)."""
    context_length: int = 2048
    pad_token: int = 0
    token_column: str = "input_ids"
    token_dtype: str = "auto"
    """Output token dtype; "auto" takes the narrowest type every shard's type fits in."""
    read_batch_size: int = 0
    """Documents per record batch a packer reads; 0 picks it per shard from the shard's mean
    document length so that a batch holds about ``read_batch_tokens`` tokens."""
    read_batch_tokens: int = 1 << 20
    """Target tokens per read batch when ``read_batch_size`` is 0: a packer's memory follows it."""
    strategy: str = "concat"
    """"concat": the exact rules (concatenate, cut every C tokens, pad only the last chunk).
    "best_fit": best-fit decreasing within windows of documents; a document of at most C
    tokens is never cut and every chunk may end with padding (see raypack/best_fit.py)."""
    best_fit_window: int = 8192
    """Documents per best-fit window (0: a whole shard). Windows never span shards; a packer
    holds one window of tokens in memory."""
    chunks_per_record_batch: int = 512
    """Chunks per Arrow record batch written; batches start at multiples of it globally."""
    num_workers: int = 2
    """Packer actors."""
    worker_num_cpus: float = 0.5
    """CPUs each packer actor reserves; fractional so reads and writes can always run."""
    overwrite: bool = False
    verify_inputs: bool = False
    """Identify each input by the sha256 of all its bytes for ``--resume``, not only by its size and
    first/last MiB (and Parquet footer): every packer reads its shard once more, and ``--resume``
    reads every input whose record it checks once more. Does not change the output."""
    progress_timeout_s: float = 600.0
    """A packer that makes no progress on its shard for this long is reported (0: never)."""
    restart_stalled: bool = False
    """On Ray, a stalled packer (see ``progress_timeout_s``) is also ended, so that Ray restarts it
    and packs its shard again; the local engine only reports."""
    address: str | None = None
    """Ray cluster address; None uses RAY_ADDRESS or starts an embedded local Ray."""

    def __post_init__(self) -> None:
        validate_context_length(self.context_length)
        if self.token_dtype not in TOKEN_DTYPES:
            raise ValueError(f"token_dtype={self.token_dtype!r} must be one of {', '.join(TOKEN_DTYPES)}")
        if self.token_dtype != "auto":
            validate_pad_token(self.pad_token, np.dtype(self.token_dtype))
        elif isinstance(self.pad_token, bool) or not isinstance(self.pad_token, int):
            raise TypeError(f"pad_token={self.pad_token!r} must be an integer")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy={self.strategy!r} must be one of {', '.join(STRATEGIES)}")
        for name in ("read_batch_size", "read_batch_tokens", "chunks_per_record_batch", "num_workers", "best_fit_window"):
            value = getattr(self, name)
            least = 0 if name in ("read_batch_size", "best_fit_window") else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} must be an integer >= {least}")
        for name in ("verify_inputs", "restart_stalled"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be true or false")
        if isinstance(self.progress_timeout_s, bool) or not isinstance(self.progress_timeout_s, (int, float)) \
                or not 0 <= self.progress_timeout_s < 1e9:
            raise ValueError(f"progress_timeout_s={self.progress_timeout_s!r} must be a number of seconds >= 0 "
                             "(0: never)")
        if not 0 < self.worker_num_cpus <= 64:
            raise ValueError(f"worker_num_cpus={self.worker_num_cpus!r} must be in (0, 64]")

    def output_dict(self) -> dict[str, Any]:
        """The keys that decide the output's bytes (workers, batch sizes, address do not)."""
        full = self.to_dict()
        keys = OUTPUT_KEYS + (("best_fit_window",) if self.strategy == "best_fit" else ())
        return {k: full[k] for k in keys}

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["inputs"] = list(self.inputs)
        return out


def config_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(PackConfig)]


def make_config(values: Mapping[str, Any], *, source: str = "config") -> PackConfig:
    """Build a config from a mapping; unknown keys and bad values raise InputError."""
    valid = config_keys()
    unknown = sorted(set(values) - set(valid))
    if unknown:
        raise InputError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys are {', '.join(valid)}")
    values = dict(values)
    if "inputs" in values:
        inputs = values["inputs"]
        values["inputs"] = (inputs,) if isinstance(inputs, str) else tuple(inputs)
    try:
        return PackConfig(**values)
    except (TypeError, ValueError) as e:
        raise InputError(f"{source}: {e}") from e


def load_config(path: str | Path | None = None, **overrides: Any) -> PackConfig:
    """Read a TOML config (flat keys) and apply non-None overrides on top."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            values = tomllib.loads(path.read_text())
        except FileNotFoundError as e:
            raise InputError(f"config file not found: {path}") from e
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"config file {path} is not valid TOML: {e}") from e
    values.update({k: v for k, v in overrides.items() if v is not None})
    return make_config(values, source=str(path) if path else "config")
