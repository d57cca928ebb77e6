"""On the driver, after the packers: stitch the chunks that straddle shards, check that the
files cover every chunk exactly once (the manifest is built by raypack.packed.manifest). No Ray here.

Fragments are at most two per shard and each shorter than one chunk, so this holds at most
``2 * num_shards * context_length`` tokens.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np
import pyarrow as pa

from raypack.pack.plan import Plan
from raypack.pack.tasks import PackSettings, ShardResult
from raypack.packed.writer import WrittenFile, chunk_schema, write_chunks_file
from raypack.rules.core import Chunks, Fragment, concat_chunks, stitch_fragments
from raypack.rules.long_docs import DEFAULT_LONG_DOCS


def stitch_boundaries(results: Sequence[ShardResult], plan: Plan, settings: PackSettings) -> list[tuple[int, Chunks]]:
    """The chunks no single shard owns, as ``(first_chunk, chunks)`` runs of consecutive chunks."""
    c = settings.context_length
    fragments = sorted((f for r in results for f in (r.head, r.tail) if f is not None), key=lambda f: f.start)
    by_chunk = itertools.groupby(fragments, key=lambda f: f.start // c)
    stitched = [(index, _stitch_one(list(group), index, plan, settings)) for index, group in by_chunk]
    return _consecutive_runs(stitched, c, settings.packed_dtype)


def _stitch_one(group: list[Fragment], index: int, plan: Plan, settings: PackSettings) -> Chunks:
    is_last = index == plan.num_chunks - 1
    return stitch_fragments(group, settings.context_length, settings.pad_value,
                            pad=is_last, dtype=settings.packed_dtype)


def _consecutive_runs(stitched: list[tuple[int, Chunks]], c: int, dtype: np.dtype) -> list[tuple[int, Chunks]]:
    runs: list[tuple[int, list[Chunks]]] = []
    for index, chunks in stitched:
        if runs and runs[-1][0] + len(runs[-1][1]) == index:
            runs[-1][1].append(chunks)
        else:
            runs.append((index, [chunks]))
    return [(first, concat_chunks(parts, c, np.dtype(dtype))) for first, parts in runs]


def write_boundaries(runs: list[tuple[int, Chunks]], settings: PackSettings) -> list[WrittenFile]:
    schema = chunk_schema(settings.context_length, pa.from_numpy_dtype(np.dtype(settings.token_dtype)), settings.pad_token,
                          settings.extra_columns)
    return [write_chunks_file(settings.out_dir, first, chunks, schema, settings.chunks_per_record_batch)
            for first, chunks in runs]


def check_coverage(files: list[WrittenFile], num_chunks: int) -> list[WrittenFile]:
    """Files sorted by first chunk; raise if they do not tile ``[0, num_chunks)`` exactly."""
    files = sorted(files, key=lambda f: f.first_chunk)
    expected = 0
    for f in files:
        if f.first_chunk != expected:
            raise RuntimeError(f"internal error: chunk {expected} missing or duplicated (next file {f.path})")
        expected += f.num_chunks
    if expected != num_chunks:
        raise RuntimeError(f"internal error: files hold {expected} chunks, expected {num_chunks}")
    return files


def count_stats(results: Sequence[ShardResult], plan: Plan) -> dict[str, int]:
    """The manifest's counts; with a ``long_docs`` other than split, also what it left out
    (``documents`` stays every input document, ``tokens`` the tokens in the chunks)."""
    counts = {
        "documents": plan.num_docs,
        "tokens": plan.num_packed_tokens,
        "chunks": plan.num_chunks,
        "padding_positions": plan.num_chunks * plan.context_length - plan.num_packed_tokens,
        "split_documents": sum(r.num_split_docs for r in results),
    }
    return counts if plan.long_docs == DEFAULT_LONG_DOCS else {**counts, **plan.cut.as_dict()}
