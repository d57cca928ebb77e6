"""The job's configuration: one frozen dataclass, loaded from ``configs/*.toml`` and overrides.

Keys are flat (TOML and :func:`make_config` alike). A packing strategy's options are keys named
``{strategy}_{option}`` (``best_fit_window``), taken from the registry (raypack.strategies) and
held in ``PackConfig.strategy_options``; the options of every registered strategy are accepted
and validated, whichever strategy is chosen (the chosen one's decide the output).

Every key has a ``raypack pack`` flag, so none is TOML-only: the flag is the key with dashes
(``--context-length``, ``--best-fit-window``), except ``inputs`` (``--input``, repeatable),
``num_workers`` (``--workers``) and ``progress_timeout_s`` (``--progress-timeout``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from raypack.errors import InputError
from raypack.inputs.base import DEFAULT_MAX_DOCUMENT_TOKENS
from raypack.io.config_file import read_config_file
from raypack.rules.core import validate_context_length, validate_pad_token
from raypack.rules.long_docs import DEFAULT_LONG_DOCS, validate_long_docs
from raypack.rules.side_columns import parse_side_spec
from raypack.strategies import (
    DEFAULT_STRATEGY,
    PackingStrategy,
    configured_strategy,
    option_fields,
    strategy_class,
    strategy_names,
)
from raypack.tokenize.backends import backend_names

OUTPUT_KEYS = ("inputs", "token_column", "token_dtype", "chunks_per_record_batch", "task_tokens")
"""Keys that decide the output's bytes, saved as the manifest's ``config``, that the manifest does
not already hold: ``context_length``, ``pad_token``, the strategy and its options decide them too
but are stored once, at the manifest's top level (``token_dtype`` there is the resolved dtype; here,
the one asked for)."""
TEXT_KEYS = ("text_column", "bos", "eos", "tokenizer_backend", "task_rows", "task_bytes", "max_document_bytes")
"""Keys that apply to text inputs only (with ``tokenizer``)."""
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
    extra_columns: tuple[str, ...] = ()
    """Side columns: per-token list columns of the input (integers or bools, one value per token)
    packed with the tokens and stored beside them, ``NAME`` or ``NAME=FILL`` (the value on padding,
    default 0), e.g. ``["loss_mask", "labels=-100"]`` (raypack.rules.side_columns)."""
    read_batch_size: int = 0
    """Documents per record batch a packer reads; 0 picks it per shard from the shard's mean
    document length so that a batch holds about ``read_batch_tokens`` tokens."""
    read_batch_tokens: int = 1 << 20
    """Target tokens per read batch when ``read_batch_size`` is 0: a packer's memory follows it."""
    max_document_tokens: int = DEFAULT_MAX_DOCUMENT_TOKENS
    """A document holding more tokens is refused (one line naming shard, row and length) before it is
    read where the input allows (a Parquet footer, a JSON line's bytes): a packer reads a document
    whole, at the bytes per token of BENCHMARKS.md ("One long document"). Does not change the output."""
    strategy: str = DEFAULT_STRATEGY
    """A registered packing strategy (raypack.strategies): ``concat``, the exact rules
    (concatenate, cut every C tokens, pad only the last chunk), or ``best_fit``, best-fit
    decreasing within windows of documents (a document of at most C tokens is never cut)."""
    strategy_options: Mapping[str, Any] = field(default_factory=dict)
    """Strategy options by key, e.g. ``{"best_fit_window": 8192}`` (documents per best-fit window,
    0: a whole shard; windows never span shards). Set as flat keys; missing ones take the
    strategy's default."""
    long_docs: str = DEFAULT_LONG_DOCS
    """A document longer than ``context_length``: ``split`` (packed whole, across chunks),
    ``truncate`` (only its first C tokens are packed) or ``drop`` (left out; its doc id never
    appears). Doc ids stay input rows either way (raypack.rules.long_docs)."""
    chunks_per_record_batch: int = 512
    """Chunks per Arrow record batch written; batches start at multiples of it globally."""
    task_tokens: int = 1 << 25
    """A shard holding more tokens is packed as several tasks of whole row groups (Parquet) or
    record batches (Arrow IPC file), each of at least this many tokens (the last one: what is
    left), so that one large file keeps every worker busy; 0: one task per shard. Decides which
    files hold the chunks, never the chunks (raypack.pack.plan.split_units)."""
    num_workers: int = 2
    """Packer actors; with the local engine, packer threads of the process (raypack.pack.local)."""
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
    tokenizer: str = ""
    """The inputs are text: tokenize them first with this tokenizer.json (or its directory, or
    tiktoken:NAME); "" means the inputs are token ids. Recorded in the manifest's "tokenizer"."""
    text_column: str = "text"
    """Text inputs: the Parquet column or JSON Lines key holding the text."""
    bos: str | int | None = None
    """Text inputs: a token (or, if digits, an id) put before every document."""
    eos: str | int | None = None
    """Text inputs: a token (or, if digits, an id) put after every document."""
    tokenizer_backend: str = "auto"
    """Text inputs: who computes the ids (raypack.tokenize.backends): auto, reference or a
    backend's name. Does not change the output; the manifest records which one ran."""
    task_rows: int | None = None
    """Text inputs, Parquet: rows per tokenize task (whole row groups); None: TextOptions' default."""
    task_bytes: int | None = None
    """Text inputs: bytes of text per tokenize task; None: TextOptions' default (64 MiB)."""
    max_document_bytes: int | None = None
    """Text inputs: a longer text is refused, naming it; None: TextOptions' default (16 MiB)."""

    def __post_init__(self) -> None:
        validate_context_length(self.context_length)
        self._check_text_keys()
        if self.token_dtype not in TOKEN_DTYPES:
            raise ValueError(f"token_dtype={self.token_dtype!r} must be one of {', '.join(TOKEN_DTYPES)}")
        if self.token_dtype != "auto":
            validate_pad_token(self.pad_token, np.dtype(self.token_dtype))
        elif isinstance(self.pad_token, bool) or not isinstance(self.pad_token, int):
            raise TypeError(f"pad_token={self.pad_token!r} must be an integer")
        if self.pad_token < 0:  # an id a model's embedding looks up: -1 there is an IndexError in training
            raise ValueError(f"pad_token={self.pad_token} must be a token id >= 0 (padding is marked by doc_ids -1, "
                             "not by the pad token; e.g. --pad-token 0, or the tokenizer's pad or EOS id)")
        self.side_specs()
        strategy_class(self.strategy)
        validate_long_docs(self.long_docs)
        unknown = sorted(set(self.strategy_options) - set(option_fields()))
        if unknown:
            raise ValueError(f"unknown strategy option(s) {', '.join(unknown)}; valid are {', '.join(option_fields())}")
        self.strategies()  # every registered strategy's options are checked, the chosen one's or not
        self._refuse_options_of_other_strategies()
        for name in ("read_batch_size", "read_batch_tokens", "chunks_per_record_batch", "num_workers", "task_tokens",
                     "max_document_tokens"):
            value = getattr(self, name)
            least = 0 if name in ("read_batch_size", "task_tokens") else 1
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

    def _check_text_keys(self) -> None:
        if not isinstance(self.tokenizer, str):
            raise ValueError(f"tokenizer={self.tokenizer!r} must be a string: a tokenizer.json, its directory, or "
                             "tiktoken:NAME")
        if not isinstance(self.text_column, str) or not self.text_column:
            raise ValueError(f"text_column={self.text_column!r} must be the name of a column or key")
        for name in ("bos", "eos"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
                raise ValueError(f"{name}={value!r} must be a token string or an integer id")
        if self.tokenizer_backend not in backend_names():
            raise ValueError(f"tokenizer_backend={self.tokenizer_backend!r} must be one of {', '.join(backend_names())}")
        for name in ("task_rows", "task_bytes", "max_document_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be an integer >= 1")

    def text_keys_given(self) -> list[str]:
        """The text-input keys set to other than their defaults (they need ``tokenizer``)."""
        return [f.name for f in dataclasses.fields(self) if f.name in TEXT_KEYS
                and getattr(self, f.name) != f.default]

    def _refuse_options_of_other_strategies(self) -> None:
        """An option marked ``only_when_chosen`` (it promises something of the output, e.g. a segment
        limit) is refused when set for a strategy that is not the chosen one, instead of ignored."""
        for key, (cls, option) in option_fields().items():
            value = self.strategy_options.get(key)
            if cls.name != self.strategy and value is not None and option.metadata.get("only_when_chosen"):
                raise ValueError(f"{key}={value!r} is an option of strategy {cls.name}, which alone can honour it; "
                                 f"strategy={self.strategy} cannot: choose strategy {cls.name}, or drop {key}")

    def side_specs(self) -> tuple[tuple[str, int], ...]:
        """``(name, fill)`` of each extra column, checked: well formed, distinct, not the token column,
        and not with text inputs (text has no per-token columns)."""
        if isinstance(self.extra_columns, str) or not isinstance(self.extra_columns, (tuple, list)):
            raise ValueError(f"extra_columns={self.extra_columns!r} must be a list of NAME or NAME=FILL")
        specs = tuple(parse_side_spec(spec) for spec in self.extra_columns)
        names = [name for name, _ in specs]
        if len(set(names)) != len(names) or self.token_column in names:
            raise ValueError(f"extra_columns={list(self.extra_columns)!r}: names must be distinct and not the token "
                             f"column {self.token_column!r}")
        if specs and self.tokenizer:
            raise ValueError("extra_columns need token inputs: text has no per-token columns (tokenize it with your "
                             "own side columns, then pack the token shards)")
        return specs

    @property
    def packing(self) -> PackingStrategy:
        """The chosen strategy with its options."""
        return configured_strategy(self.strategy, self.strategy_options)

    def strategies(self) -> tuple[PackingStrategy, ...]:
        """Every registered strategy with this config's options for it (the dry run compares them)."""
        return tuple(configured_strategy(name, self.strategy_options) for name in strategy_names())

    def output_dict(self) -> dict[str, Any]:
        """The keys that decide the output's bytes besides the strategy's (workers, batch sizes,
        address do not decide them)."""
        full = self.to_dict()
        return {k: full[k] for k in OUTPUT_KEYS}

    def to_dict(self) -> dict[str, Any]:
        """Flat keys, as in a TOML config, with every registered strategy's options."""
        out = dataclasses.asdict(self)
        out.pop("strategy_options")
        out["inputs"] = list(self.inputs)
        out["extra_columns"] = list(self.extra_columns)
        for strategy in self.strategies():
            out.update(strategy.options())
        return out


def config_keys() -> list[str]:
    """Every key a config may set: the dataclass's fields and the registered strategies' options."""
    fields = [f.name for f in dataclasses.fields(PackConfig) if f.name != "strategy_options"]
    clashes = set(fields) & set(option_fields())
    if clashes:
        raise RuntimeError(f"internal error: strategy option(s) {', '.join(sorted(clashes))} clash with config keys")
    return fields + list(option_fields())


def make_config(values: Mapping[str, Any], *, source: str = "config") -> PackConfig:
    """Build a config from flat keys; unknown keys and bad values raise InputError."""
    valid = config_keys()
    unknown = sorted(set(values) - set(valid))
    if unknown:
        import difflib

        meant = [f"{key}: did you mean {close[0]}?" for key in unknown
                 if (close := difflib.get_close_matches(key, valid, n=1, cutoff=0.8))]
        raise InputError(f"{source}: unknown key(s) {', '.join(unknown)}" + (f" ({'; '.join(meant)})" if meant else "")
                         + f"; valid keys are {', '.join(valid)}")
    options = option_fields()
    values = {**{k: v for k, v in values.items() if k not in options},
              "strategy_options": {k: v for k, v in values.items() if k in options}}
    if isinstance(values.get("extra_columns"), list):
        values["extra_columns"] = tuple(values["extra_columns"])
    if "inputs" in values:
        inputs = values["inputs"]
        values["inputs"] = (inputs,) if isinstance(inputs, str) else tuple(inputs)
    try:
        return PackConfig(**values)
    except (TypeError, ValueError) as e:
        raise InputError(f"{source}: {e}") from e


_FLAGS = {"inputs": "--input", "num_workers": "--workers", "progress_timeout_s": "--progress-timeout"}
"""The ``raypack pack`` flags that are not their key with dashes."""


def flag_of(key: str) -> str:
    """The ``raypack pack`` flag that sets a config key: ``context_length`` -> ``--context-length``."""
    return _FLAGS.get(key, "--" + key.replace("_", "-"))


def load_config(path: str | Path | None = None, *, required: tuple[str, ...] = (), **overrides: Any) -> PackConfig:
    """Read a TOML config (flat keys) and apply non-None overrides on top. A key in ``required``
    must be given by one of them (its PackConfig default is not taken), else an InputError."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        values = read_config_file(path)
        fields = {f.name for f in dataclasses.fields(PackConfig)}
        table = next((key for key, value in values.items() if isinstance(value, dict) and key not in fields), None)
        if table is not None:  # it said "--context-length is required" when every key was under [pack]
            raise InputError(f"config file {path} has a table [{table}]; its keys are flat (context_length = 2048, "
                             f"no [section]): move them out of [{table}]")
    values.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(values.get("tokenizer"), str) and not values["tokenizer"].strip():  # it read as "token ids"
        where = "--tokenizer" if overrides.get("tokenizer") is not None else f"{path}: tokenizer"
        raise InputError(f"{where} is empty; give a tokenizer.json, its directory or tiktoken:NAME, or leave it out "
                         "to pack token ids")
    source = str(path) if path else "config"
    for key in required:
        if key not in values:
            if set(values) - set(config_keys()):  # a misspelt key (context_lenght) said as a missing flag: a trial
                make_config(values, source=source)
            raise InputError(f"{flag_of(key)} is required (or {key} in --config)")
    try:
        return make_config(values, source=source)
    except InputError as e:
        said = str(e).removeprefix(f"{source}: ")
        flagged = [k for k, v in overrides.items() if v is not None and said.startswith(f"{k}=")]
        if flagged:  # a flag's value: name the flag the user typed, not the config key
            key = flagged[0]
            prefixes = (f"{key}={overrides[key]!r} ", f"{key}={overrides[key]} ")
            rest = next((said[len(p):] for p in prefixes if said.startswith(p)), "")
            if rest.startswith("is an option of strategy") and path is None:  # its flags, not its keys (a trial)
                rest = re.sub(r"strategy=(\w+)", r"--strategy \1", rest).replace("choose strategy", "pass --strategy")
                aliases = option_fields()[key][1].metadata.get("aliases") or ()
                named = f"{flag_of(key)}{''.join(f' ({a})' for a in aliases)}"  # the user may have typed the alias
                raise InputError(f"{named} {overrides[key]} {rest.replace(key, flag_of(key))}") from e
            raise InputError(f"{flag_of(key)} {overrides[key]}: {rest if rest.startswith('must ') else said}") from e
        if path is None:  # flags only: name the flags typed, not the keys ("config: extra_columns need ...")
            for key in sorted((k for k, v in overrides.items() if v is not None and "_" in k), key=len, reverse=True):
                said = re.sub(rf"(?<![\w-]){key}(?![\w])", flag_of(key), said)
            raise InputError(said) from e
        raise
