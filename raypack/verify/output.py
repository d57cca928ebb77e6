"""Checks 0-3 of one packed output (the order and costs are in :mod:`raypack.verify`'s docstring)."""

from __future__ import annotations

import posixpath
import time
from typing import Any, Sequence

from raypack.errors import InputError
from raypack.packed.manifest import Manifest, load_manifest, long_docs_of, resolve_output, side_columns_of, strategy_of
from raypack.packed.writer import MANIFEST_NAME
from raypack.rules.long_docs import DEFAULT_LONG_DOCS
from raypack.strategies import strategy_of_manifest
from raypack.verify.files import check_files
from raypack.verify.inputs import check_shard_sources, compare_with_inputs, resolve_inputs
from raypack.verify.long_docs import check_document_lengths
from raypack.verify.report import VerifyError, VerifyReport
from raypack.verify.structure import Structure, output_pieces


def structure_class(manifest: dict) -> type[Structure]:
    """The structure check of the manifest's strategy, from the strategy registry
    (``PackingStrategy.verify_structure``), built as ``cls(manifest, keep_tokens=...)``."""
    return strategy_of_manifest(manifest).verify_structure()


def verify_packed(out: str, inputs: Sequence[str] | None = None, *, token_column: str | None = None,
                  batch_chunks: int = 1024, start: float | None = None,
                  max_document_tokens: int | None = None, parsed: tuple[Any, str] | None = None) -> VerifyReport:
    """Audit the packed output ``out`` (not a mix), as :func:`raypack.verify.verify_output` describes;
    ``start``: the ``perf_counter`` its report's seconds count from (default: now); ``parsed``: the
    manifest's JSON and path when the caller has read them (parsed once, not twice)."""
    start = time.perf_counter() if start is None else start
    manifest = _load_manifest(out, parsed)
    fs, base = resolve_output(out)
    manifest_path = posixpath.join(base, MANIFEST_NAME)
    check_shard_sources(manifest, manifest_path)
    num_bytes = check_files(fs, base, manifest)
    shards, not_compared = resolve_inputs(manifest, inputs, manifest_path)
    strategy = strategy_of(manifest)
    structure = structure_class(manifest)(manifest, keep_tokens=shards is not None)
    pieces = output_pieces(fs, base, manifest, structure, batch_chunks)
    if long_docs_of(manifest) != DEFAULT_LONG_DOCS:
        pieces = check_document_lengths(pieces, manifest.context_length, long_docs_of(manifest))
    if shards is None:
        for _ in pieces:
            pass
    else:
        column = token_column or manifest.config.token_column or "input_ids"
        compare_with_inputs(pieces, shards, column, manifest, manifest_path, max_document_tokens)
    return VerifyReport(
        output=out, num_files=len(manifest.files), num_bytes=num_bytes,
        num_chunks=structure.next_chunk, context_length=structure.context_length,
        num_tokens=structure.num_tokens, num_padding_positions=structure.num_padding,
        num_documents=manifest.counts.documents, num_split_documents=structure.num_split,
        num_segments=structure.num_segments, content_sha256=manifest.content_sha256,
        inputs_compared=shards is not None, num_shards=len(shards or ()), inputs_note=not_compared,
        seconds=time.perf_counter() - start, strategy=strategy,
        strategy_note=structure.report_note(),
        input_paths=tuple(shard.path for shard in shards or ()),
        long_docs=long_docs_of(manifest), long_doc_counts=_long_doc_counts(manifest),
        extra_columns=tuple(f"{c.name} {c.type} fill={c.fill}" for c in side_columns_of(manifest)),
    )


def _long_doc_counts(manifest: Manifest) -> tuple[int, int]:
    """(documents, tokens) the manifest says were truncated or dropped ((0, 0) under split)."""
    counts = manifest.counts
    policy = long_docs_of(manifest)
    if policy == DEFAULT_LONG_DOCS:
        return 0, 0
    if policy == "drop":
        return counts.documents_dropped, counts.tokens_dropped
    return counts.documents_truncated, counts.tokens_truncated


def _load_manifest(out: str, parsed: tuple[Any, str] | None = None) -> Manifest:
    """The manifest, checked by :func:`raypack.packed.manifest.load_manifest` (or ``parsed``, checked the
    same way); its InputError becomes a VerifyError."""
    try:
        return load_manifest(out) if parsed is None else Manifest.from_dict(*parsed)
    except InputError as e:
        raise VerifyError(str(e)) from e
