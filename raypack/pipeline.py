"""The Ray Data engine: the only module that imports Ray.

One shard is one row of a dataset built with ``from_items`` (one block per shard), mapped by
a pool of stateful packer actors with ``batch_size=1``: each call streams one whole shard in
order, so the carry between record batches never leaves the actor, and Ray's block shaping,
scheduling order and retries cannot change what is packed. Actors write their own chunk files
(kept out of the object store) and return one small Arrow row: counts, the file written and
the edge fragments. Actors reserve a fraction of a CPU so that Ray Data's read and output
tasks can always be scheduled beside them (whole-CPU actors deadlock a 2-CPU machine).
Each actor holds its next shard queued (two calls in flight; it runs them one after the
other), so it starts that shard as soon as it ends one instead of waiting for the driver's
scheduling loop to notice and dispatch.

It also holds the Ray side of reading packed output back: :func:`packed_to_ray_dataset`
(``PackedDataset.to_ray_dataset``), one read task per chunk file.
"""

from __future__ import annotations

import operator
import os
from dataclasses import asdict
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import ray

from raypack.core import Chunks
from raypack.packed import PackedDataset, chunks_table, iter_file_tables
from raypack.shard_pack import count_shard_chunks, pack_shard
from raypack.tasks import PackSettings, ShardResult, ShardTask, result_to_table, table_to_results


def init_ray(address: str | None = None) -> None:
    """Connect to ``address`` (or RAY_ADDRESS), else start an embedded local Ray."""
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(address="local", include_dashboard=False, log_to_driver=True)


class ShardPackerActor:
    """Packs whole shards, one per call, in the order its rows list them."""

    def __init__(self, settings: dict) -> None:
        self.settings = PackSettings(**settings)
        self.token_type = pa.from_numpy_dtype(np.dtype(self.settings.token_dtype))

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        for row in batch.to_pylist():
            result = pack_shard(ShardTask(**row), self.settings)
            yield result_to_table(result, self.token_type)


class ShardCounterActor:
    """best_fit's first pass: counts each shard's chunks from its document lengths."""

    def __init__(self, settings: dict) -> None:
        self.settings = PackSettings(**settings)

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        for row in batch.to_pylist():
            task = ShardTask(**row)
            yield pa.table({"shard_index": [task.shard_index], "num_chunks": [count_shard_chunks(task, self.settings)]})


def pack_shards(
    tasks: Sequence[ShardTask], settings: PackSettings, *, num_workers: int, worker_num_cpus: float
) -> list[ShardResult]:
    """Pack every shard on a pool of actors; results in shard order."""
    blocks = _map_shards(ShardPackerActor, tasks, settings, num_workers, worker_num_cpus)
    results = [r for block in blocks for r in table_to_results(block)]
    return sorted(results, key=lambda r: r.shard_index)


def count_chunks(
    tasks: Sequence[ShardTask], settings: PackSettings, *, num_workers: int, worker_num_cpus: float
) -> list[int]:
    """best_fit: every shard's chunk count, in shard order."""
    counts = {}
    for block in _map_shards(ShardCounterActor, tasks, settings, num_workers, worker_num_cpus):
        counts.update(zip(block.column("shard_index").to_pylist(), block.column("num_chunks").to_pylist()))
    return [counts[t.shard_index] for t in tasks]


def _map_shards(actor_class: type, tasks: Sequence[ShardTask], settings: PackSettings, num_workers: int,
                worker_num_cpus: float) -> Iterator[pa.Table]:
    """Run ``actor_class`` over the shards, one shard per call, on a pool of stateful actors."""
    if not tasks:
        return iter(())
    dataset = ray.data.from_items([asdict(t) for t in tasks], override_num_blocks=len(tasks))
    mapped = dataset.map_batches(
        actor_class,
        fn_constructor_kwargs={"settings": asdict(settings)},
        batch_size=1,
        batch_format="pyarrow",
        compute=ray.data.ActorPoolStrategy(size=max(1, min(num_workers, len(tasks))),
                                           max_tasks_in_flight_per_actor=2),
        num_cpus=worker_num_cpus,
    )
    return mapped.iter_batches(batch_size=None, batch_format="pyarrow")


def original_error(error: BaseException) -> BaseException:
    """The user's exception inside Ray's wrappers (RayTaskError, UserCodeException)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None:
            error = error.cause
        elif error.__cause__ is not None:
            error = error.__cause__
        else:
            break
    return error


# ----------------------------------------------------------------------------- reading packed output


def packed_to_ray_dataset(packed: PackedDataset, batch_rows: int | None = None) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of ``packed``'s chunks in global order, one row per chunk.

    Also ``packed.to_ray_dataset(batch_rows)``. Columns: ``input_ids``
    fixed_size_list<token>[C] and ``doc_ids`` fixed_size_list<int64>[C]. One read task per
    file; each yields one block per record batch, or blocks of ``batch_rows`` chunks. Order is
    kept (``preserve_order`` is set on this dataset's own context, not globally). Masks are not
    in the dataset; build them per batch. Ray's "numpy" batch format turns fixed_size_list
    columns into object arrays of rows, so stack them first::

        from raypack.masks import build_intra_document_mask
        for batch in ds.to_ray_dataset().iter_batches(batch_size=8, batch_format="numpy"):
            doc_ids = np.stack(batch["doc_ids"])         # (8, C) int64
            mask = build_intra_document_mask(doc_ids)    # (8, C, C)
    """
    if batch_rows is not None and operator.index(batch_rows) < 1:
        raise ValueError(f"batch_rows={batch_rows} must be >= 1 or None")
    items = packed.file_items()
    if not items:
        return ray.data.from_arrow(chunks_table(Chunks.empty(packed.context_length, packed.token_dtype)))
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    dataset.context.execution_options.preserve_order = True
    return dataset.map_batches(
        _read_file_blocks, batch_size=1, batch_format="pyarrow",
        fn_kwargs={"filesystem": packed.filesystem, "base": packed.base, "context_length": packed.context_length,
                   "token_dtype": packed.token_dtype.name, "batch_rows": batch_rows},
    )


def _read_file_blocks(items: pa.Table, **options: Any) -> Iterator[pa.Table]:
    """Ray map_batches function: the chunk tables of the files described by ``items``, in order."""
    for item in items.to_pylist():
        yield from iter_file_tables(item, **options)


# ----------------------------------------------------------------------------- tokenize


class TextTokenizerActor:
    """Tokenizes text tasks, one per call. Loads the tokenizer once, from its spec string."""

    def __init__(self, settings: dict) -> None:
        from raypack.tokenize_tasks import TokenizeSettings, load_worker_tokenizer, set_thread_env

        self.settings = TokenizeSettings(**settings)
        set_thread_env(self.settings.num_threads)  # before the tokenizer's pool first starts
        self.tokenizer = load_worker_tokenizer(self.settings)

    def __call__(self, batch: pa.Table) -> Iterator[pa.Table]:
        from raypack.tokenize_tasks import TextTask, tokenize_task

        for row in batch.to_pylist():
            yield pa.Table.from_pylist([asdict(tokenize_task(TextTask(**row), self.settings, self.tokenizer))])


def tokenize_texts(tasks: Sequence, settings, *, num_workers: int, worker_num_cpus: float) -> list:
    """Run every text task (raypack.tokenize_tasks) on a pool of tokenizer actors; results in task order.

    Each actor's tokenizer gets ``cluster CPUs // actors`` threads (rayon_threads says why).
    """
    from dataclasses import replace

    from raypack.tokenize_tasks import TextResult, rayon_threads

    num_actors = max(1, min(num_workers, len(tasks)))
    cpus = ray.cluster_resources().get("CPU", os.cpu_count() or 1)
    settings = replace(settings, num_threads=rayon_threads(cpus, num_actors))
    blocks = _map_shards(TextTokenizerActor, tasks, settings, num_workers, worker_num_cpus)
    results = [TextResult(**row) for block in blocks for row in block.to_pylist()]
    return sorted(results, key=lambda r: r.task_index)
