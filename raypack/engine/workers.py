"""What runs inside a Ray worker of the engine (raypack.engine.pipeline): plain classes and
functions, no Ray import, that the pipeline hands to Ray (``ray.remote``, ``map_batches``). Each
reads and packs through the pure layers; bad input comes back as an error row or dict (``task_index``,
``error``), not as an exception through Ray, so the driver says it in one line."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from raypack.errors import InputError, worker_error_text
from raypack.pack.packer import count_task, pack_shard, reset_peak_rss
from raypack.pack.tasks import PackSettings, ShardTask, result_to_table
from raypack.rules.arrays import arrow_array, binary_array, stream_bytes


def error_table(index: int, error: InputError) -> pa.Table:
    """The row an actor returns instead of raising bad input through Ray (tracebacks on the terminal)."""
    return pa.table({"task_index": arrow_array(np.array([index], dtype=np.int64)),
                     "error": binary_array([worker_error_text(error).encode()], pa.string())})


def loaded(load, settings) -> tuple[Any, InputError | None]:
    """``(load(settings), None)``, or ``(None, the InputError)``: an actor keeps its tokenizer's refusal (a file
    that differs on this node) and answers every call with it as an error row. Raised from ``__init__``, Ray
    gave the driver ActorDiedError after retries, and the line only in a worker's log (an operator's trial)."""
    try:
        return load(settings), None
    except InputError as e:
        return None, e


class ShardPackerActor:
    """Packs whole tasks, one per call, in the order its rows list them. Its tasks' ``peak_rss_bytes``
    are the process's peak since the actor started (Ray may give it a worker that ran other work)."""

    def __init__(self, settings: dict) -> None:
        reset_peak_rss()
        self.settings = PackSettings(**settings)
        self.token_type = pa.from_numpy_dtype(np.dtype(self.settings.token_dtype))

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        for row in batch.to_pylist():
            try:
                result = pack_shard(ShardTask(**row), self.settings)
            except InputError as e:
                yield error_table(row["task_index"], e)
            else:
                yield result_to_table(result, self.token_type, self.settings.record_dtype)


def count_tasks(batch: pa.Table, settings: dict) -> Iterator[pa.Table]:
    """The first pass (best_fit's chunks, long_docs' cuts), a Ray Data *task* function: counts each
    task from its document lengths. Stateless, so not an actor pool: Ray reuses its task workers
    (those prestarted with the cluster, or left by an earlier pass), where each actor of a pool is a
    new process that imports Ray Data first (~3.5 CPU-s apiece here, before any work)."""
    pack_settings = PackSettings(**settings)
    for row in batch.to_pylist():
        task = ShardTask(**row)
        try:
            counts = count_task(task, pack_settings)
        except InputError as e:
            yield error_table(task.task_index, e)
        else:
            yield pa.table({"task_index": [task.task_index], "num_chunks": [counts.num_chunks],
                            **{key: [value] for key, value in counts.cut.as_dict().items()}})


class TextTokenizerActor:
    """Tokenizes text tasks, one per call. Loads the tokenizer once, from its spec string."""

    def __init__(self, settings: dict) -> None:
        from raypack.tokenize.backends import set_thread_env
        from raypack.tokenize.tasks import TokenizeSettings, load_worker_tokenizer

        self.settings = TokenizeSettings(**settings)
        set_thread_env(self.settings.num_threads)  # before the tokenizer's pool first starts
        self.tokenizer, self.load_error = loaded(load_worker_tokenizer, self.settings)

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        from raypack.tokenize.tasks import TextTask, tokenize_task

        for row in batch.to_pylist():
            try:
                if self.load_error is not None:
                    raise self.load_error
                result = tokenize_task(TextTask(**row), self.settings, self.tokenizer)
            except InputError as e:
                yield error_table(row["task_index"], e)
            else:
                yield pa.Table.from_pylist([asdict(result)])


class TextPackerActor:
    """Tokenizes text tasks into memory and packs each once the driver sends its offsets
    (raypack.tokenize.onepass). Holds the ids of the tasks it has tokenized and not packed. Its
    tasks' ``peak_rss_bytes`` are the process's peak since the actor started: its tokenizer, the ids
    it holds and its tokenizing included."""

    def __init__(self, text_settings: dict, settings: dict) -> None:
        reset_peak_rss()
        from raypack.tokenize.backends import set_thread_env
        from raypack.tokenize.tasks import TokenizeSettings, load_worker_tokenizer

        self.text_settings = TokenizeSettings(**text_settings)
        self.settings = PackSettings(**settings)
        self.token_type = pa.from_numpy_dtype(np.dtype(self.settings.token_dtype))
        set_thread_env(self.text_settings.num_threads)  # before the tokenizer's pool first starts
        self.tokenizer, self.load_error = loaded(load_worker_tokenizer, self.text_settings)
        self.held: dict[int, Any] = {}

    def tokenize(self, task: dict) -> dict:
        """The task's report (raypack.tokenize.onepass.TaskReport as a dict), or ``{"error": ...}``."""
        from raypack.tokenize.onepass import tokenize_held
        from raypack.tokenize.tasks import TextTask

        try:
            if self.load_error is not None:
                raise self.load_error
            held = tokenize_held(TextTask(**task), self.text_settings, self.tokenizer, self.settings)
        except InputError as e:
            return {"error": worker_error_text(e)}
        self.held[held.task.task_index] = held
        return held.report.to_dict()

    def pack(self, task: dict) -> bytes:
        """The result row (or error row) as Arrow IPC stream bytes (raypack.rules.arrays.stream_bytes)."""
        from raypack.tokenize.onepass import pack_held

        shard_task = ShardTask(**task)
        try:
            if self.load_error is not None:  # a new actor, after one died: its tasks' tokenize calls said it
                raise self.load_error
            result = pack_held(self.held.pop(shard_task.task_index), shard_task, self.settings)
        except InputError as e:
            return stream_bytes(error_table(shard_task.task_index, e))
        return stream_bytes(result_to_table(result, self.token_type, self.settings.record_dtype))
