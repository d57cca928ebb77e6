"""Decide ownership before distributing: list shards, count them, assign offsets.

The driver lists the shards in a fixed order, reads their document and token counts (Parquet
footers, Arrow IPC offsets; JSONL needs a scan), and turns the counts into global doc-id and
token offsets with a cumulative sum. Every packer then receives its offsets as data: nothing
about the result depends on which worker runs what, or when.
"""

from __future__ import annotations

import os
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from raypack.config import PackConfig
from raypack.core import validate_pad_token
from raypack.errors import InputError
from raypack.formats import ShardInfo, inspect_shard
from raypack.fs import is_uri
from raypack.shards import common_token_type, discover_shards, plan_offsets
from raypack.strategies import PackingStrategy, default_strategy
from raypack.tasks import PackSettings, ShardTask
from raypack.tokenized import tokenized_inputs, tokenizer_record


@dataclass(frozen=True)
class Plan:
    shards: tuple[ShardInfo, ...]
    tasks: tuple[ShardTask, ...]
    token_dtype: str
    num_docs: int
    num_tokens: int
    context_length: int
    packing: PackingStrategy = field(default_factory=default_strategy)
    tokenizer: dict | None = None
    """Tokenized-corpus inputs: their tokenizer identity and text options (the packed manifest's "tokenizer")."""
    text_inputs: bool = False
    """``pack --tokenizer``: the shards are this run's own tokenized parts, gone once it publishes;
    the manifest names the text each came from instead."""

    @property
    def num_chunks(self) -> int:
        """Chunks of the whole output, as the strategy counts them (after :func:`place_chunks` if it counts)."""
        return self.packing.num_chunks(self)


def place_chunks(plan: Plan, chunk_counts: Sequence[int]) -> Plan:
    """A strategy with a counting pass: give each shard its chunk range from every shard's
    counted chunks (a cumsum)."""
    if len(chunk_counts) != len(plan.tasks):
        raise RuntimeError(f"internal error: {len(chunk_counts)} chunk counts for {len(plan.tasks)} shards")
    firsts = np.concatenate([[0], np.cumsum(np.asarray(chunk_counts, dtype=np.int64))[:-1]])
    tasks = tuple(replace(t, first_chunk=int(first), num_chunks=int(n))
                  for t, first, n in zip(plan.tasks, firsts, chunk_counts))
    return replace(plan, tasks=tasks)


def make_plan(config: PackConfig, *, max_threads: int = 8) -> Plan:
    """List, count and place every shard. Raises InputError on bad input, before any write."""
    if not config.inputs:
        raise InputError("no input given: pass --input PATH (a shard file, a directory or a glob)")
    infos = tokenized_inputs(config.inputs, config.token_column)  # counts from a tokenized corpus's manifest
    if infos is None:
        paths = discover_shards(list(config.inputs))
        with ThreadPoolExecutor(max_workers=max(1, min(max_threads, len(paths)))) as pool:
            infos = list(pool.map(lambda p: inspect_shard(p, config.token_column), paths))
    token_dtype = _resolve_token_dtype(config, infos)
    offsets = plan_offsets(infos)
    tasks = tuple(
        ShardTask(k, info.path, info.format, int(offsets.doc_offsets[k]), int(offsets.token_offsets[k]),
                  info.num_docs, info.num_tokens)
        for k, info in enumerate(infos)
    )
    return Plan(tuple(infos), tasks, token_dtype, int(offsets.doc_offsets[-1]),
                int(offsets.token_offsets[-1]), config.context_length, config.packing,
                tokenizer_record(config.inputs))


def _resolve_token_dtype(config: PackConfig, infos: list[ShardInfo]) -> str:
    dtype = common_token_type(infos) if infos else "int32"
    if config.token_dtype != "auto":
        dtype = config.token_dtype  # narrower than the input: every token is range-checked
    try:
        validate_pad_token(config.pad_token, np.dtype(dtype))
    except ValueError as e:
        raise InputError(f"{e} (token dtype chosen from the shards: {dtype}; set token_dtype to widen it)") from e
    return dtype


def settings_for(config: PackConfig, plan: Plan, out_dir: str) -> PackSettings:
    """The one place PackSettings are built: the config's, with the plan's token dtype, writing to ``out_dir``."""
    return PackSettings(out_dir=out_dir, context_length=config.context_length, pad_token=config.pad_token,
                        token_dtype=plan.token_dtype, token_column=config.token_column,
                        read_batch_size=config.read_batch_size, read_batch_tokens=config.read_batch_tokens,
                        chunks_per_record_batch=config.chunks_per_record_batch, strategy=plan.packing.name,
                        strategy_options=plan.packing.options(), verify_inputs=config.verify_inputs,
                        progress_timeout_s=config.progress_timeout_s, restart_stalled=config.restart_stalled)


def check_output_outside_inputs(output: str, plan: Plan) -> None:
    """Refuse an output directory (or prefix) that is, or lies inside, a directory holding an input shard."""
    out = _location(output)
    for info in plan.shards:
        location = _location(info.path)
        shard_dir = location[: location.rindex("/")] if is_uri(location) else os.path.dirname(location)
        if out == shard_dir or out.startswith(shard_dir + "/"):
            raise InputError(f"output directory {output} lies inside the input directory {shard_dir} "
                             f"(shard {info.path}); choose an output outside the inputs")


def _location(path: str) -> str:
    """A local path (or file:// URI) made real, or another URI without its query and trailing slash."""
    if path.startswith("file://"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
    if not is_uri(path):
        return os.path.realpath(path)
    return path.split("?", 1)[0].rstrip("/")
