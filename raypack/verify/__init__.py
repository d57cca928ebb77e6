"""Audit a packed output directory against docs/FORMAT.md and, optionally, its inputs.

``verify_output(out, inputs)`` streams the output with bounded memory and stops at the FIRST
discrepancy, raising :class:`VerifyError` with a message naming it (file, chunk, position,
doc id, expected vs found). numpy and pyarrow only, no Ray; the output is read with plain
pyarrow, independently of ``raypack.packed.reader``. Checks, in this order, one module each:

  0. Manifest: it passes :func:`raypack.packed.manifest.load_manifest` (format version 2 or 3, every field
     typed and in range, file names after their first chunk and hash, files tiling chunks
     ``0..n-1``; for best_fit also ``best_fit_window`` and the shards' chunk ranges).
  1. Files (:mod:`.files`): every listed file exists, no unlisted ``chunks-*.arrow`` does, each
     opened only as a plain file directly inside the directory, its size and sha256 (hashed
     streaming) as recorded; in format version 2, ``content_sha256`` is the sha256 of those digests,
     one per line.
  2. Structure, one block of ``batch_chunks`` chunks at a time, in global order (:mod:`.blocks`
     decodes; :mod:`.structure` holds what every strategy checks: schema, row counts, no nulls,
     ``chunk_index`` ``0..n-1``, segment lengths > 0 summing to C, and the manifest's counts at
     the end; in format version 3, ``content_sha256`` recomputed from the decoded chunks,
     :mod:`.content`). The strategy's own rules: :mod:`.concat` (doc ids along the output, padding only
     at the very end) or :mod:`.best_fit` (per chunk and per window; the layout best-fit
     decreasing must produce comes from :mod:`.best_fit_layout`). :data:`STRUCTURES` maps a
     manifest's strategy to its check class.
  3. Round trip (:mod:`.inputs`, when inputs are compared), in the same pass: the output's
     non-padding stream with dense doc ids equals the input documents concatenated in order, as
     the manifest's ``long_docs`` keeps them (truncate: first C tokens; drop: none of a longer
     document), and the cut counts re-read equal the manifest's. Under truncate or drop no
     document in the output exceeds C tokens (:mod:`.long_docs`), inputs compared or not.

Memory: ``batch_chunks * C`` output positions (tokens plus int64 doc ids), one input read batch
of ``INPUT_BATCH_DOCS`` documents and, for best_fit, one window held back. Cost: every file is
read twice (hash, then decode; the second read is usually served by the page cache), the inputs
once, and O(tokens) numpy work plus three hashlib calls per chunk (the content digest); no Python
loop runs per token, document or segment.
"""

from __future__ import annotations

import posixpath
import time
from typing import Any, Sequence

from raypack.errors import InputError
from raypack.packed.manifest import (
    MIX_KIND,
    load_manifest,
    long_docs_of,
    read_manifest_json,
    resolve_output,
    side_columns_of,
    strategy_of,
)
from raypack.packed.writer import MANIFEST_NAME
from raypack.rules.long_docs import DEFAULT_LONG_DOCS
from raypack.strategies import strategy_of_manifest
from raypack.verify.files import check_files
from raypack.verify.inputs import INPUT_BATCH_DOCS, compare_with_inputs, resolve_inputs
from raypack.verify.long_docs import check_document_lengths
from raypack.verify.mix import MixVerifyReport, verify_mix
from raypack.verify.report import VerifyError, VerifyReport
from raypack.verify.structure import Structure, output_pieces

__all__ = ["INPUT_BATCH_DOCS", "VerifyError", "VerifyReport", "verify_output"]

def structure_class(manifest: dict) -> type[Structure]:
    """The structure check of the manifest's strategy, from the strategy registry
    (``PackingStrategy.verify_structure``), built as ``cls(manifest, keep_tokens=...)``."""
    return strategy_of_manifest(manifest).verify_structure()


def verify_output(
    out: str,
    inputs: Sequence[str] | None = None,
    *,
    token_column: str | None = None,
    batch_chunks: int = 1024,
) -> VerifyReport | MixVerifyReport:
    """Audit output directory ``out`` (local path or URI); raise VerifyError at the first discrepancy.

    inputs: shard files/directories/globs to compare with (expanded like ``raypack pack`` does);
    None compares with the manifest's shards when every one of them still exists (only absolute
    paths or URIs of shard files without ``..``: anything else is an InputError asking for
    explicit inputs; the report names every shard read), ``[]`` skips the comparison.
    token_column: the inputs' token column (default: the manifest's config, else ``input_ids``).
    batch_chunks: chunks decoded at a time (bounds memory).
    Raises InputError for unusable arguments (an input path that does not exist).
    A mix (raypack mix) is checked through its sources: :func:`raypack.verify.mix.verify_mix`.
    """
    start = time.perf_counter()
    if isinstance(batch_chunks, bool) or not isinstance(batch_chunks, int) or batch_chunks < 1:
        raise ValueError(f"batch_chunks={batch_chunks!r} must be an integer >= 1")
    data, where = _read_json(out)
    if isinstance(data, dict) and data.get("kind") == MIX_KIND:  # read through raypack.mix.dataset: verify.mix
        return verify_mix(out, data, where, inputs)
    manifest = _load_manifest(out)
    fs, base = resolve_output(out)
    manifest_path = posixpath.join(base, MANIFEST_NAME)
    num_bytes = check_files(fs, base, manifest)
    shards = resolve_inputs(manifest, inputs, manifest_path)
    strategy = strategy_of(manifest)
    structure = structure_class(manifest)(manifest, keep_tokens=shards is not None)
    pieces = output_pieces(fs, base, manifest, structure, batch_chunks)
    if long_docs_of(manifest) != DEFAULT_LONG_DOCS:
        pieces = check_document_lengths(pieces, manifest["context_length"], long_docs_of(manifest))
    if shards is None:
        for _ in pieces:
            pass
    else:
        column = token_column or (manifest.get("config") or {}).get("token_column") or "input_ids"
        compare_with_inputs(pieces, shards, column, manifest, manifest_path)
    return VerifyReport(
        output=out, num_files=len(manifest["files"]), num_bytes=num_bytes,
        num_chunks=structure.next_chunk, context_length=structure.context_length,
        num_tokens=structure.num_tokens, num_padding_positions=structure.num_padding,
        num_documents=manifest["counts"]["documents"], num_split_documents=structure.num_split,
        num_segments=structure.num_segments, content_sha256=manifest["content_sha256"],
        inputs_compared=shards is not None, num_shards=len(shards or ()),
        seconds=time.perf_counter() - start, strategy=strategy,
        best_fit_window=structure.window,
        input_paths=tuple(shard.path for shard in shards or ()),
        long_docs=long_docs_of(manifest), long_doc_counts=_long_doc_counts(manifest),
        extra_columns=tuple(f"{c.name} {c.type} fill={c.fill}" for c in side_columns_of(manifest)),
    )


def _long_doc_counts(manifest: dict[str, Any]) -> tuple[int, int]:
    """(documents, tokens) the manifest says were truncated or dropped ((0, 0) under split)."""
    counts = manifest["counts"]
    policy = long_docs_of(manifest)
    if policy == DEFAULT_LONG_DOCS:
        return 0, 0
    return counts.get(f"documents_{policy}ped" if policy == "drop" else "documents_truncated", 0), \
        counts.get("tokens_dropped" if policy == "drop" else "tokens_truncated", 0)


def _read_json(out: str) -> tuple[Any, str]:
    """The parsed, unchecked manifest and its path (a mix or a packed output?); InputError -> VerifyError."""
    try:
        return read_manifest_json(out)
    except InputError as e:
        raise VerifyError(str(e)) from e


def _load_manifest(out: str) -> dict[str, Any]:
    """The manifest, checked by :func:`raypack.packed.manifest.load_manifest`; its InputError becomes a VerifyError."""
    try:
        return load_manifest(out)
    except InputError as e:
        raise VerifyError(str(e)) from e
