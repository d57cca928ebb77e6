"""Audit a packed output directory against docs/FORMAT.md and, optionally, its inputs.

``verify_output(out, inputs)`` streams the output with bounded memory and stops at the FIRST
discrepancy, raising :class:`VerifyError` with a message naming it (file, chunk, position,
doc id, expected vs found). numpy and pyarrow only, no Ray; the output is read with plain
pyarrow, independently of ``raypack.packed.reader``. Checks, in this order, one module each:

  0. Manifest: it passes :func:`raypack.packed.manifest.load_manifest` (format version 2 or 3, every field
     typed and in range, file names after their first chunk and hash, files tiling chunks
     ``0..n-1``; the strategy's own options and fields, asked of the strategy).
  1. Files (:mod:`.files`): every listed file exists, no unlisted ``chunks-*.arrow`` does, each
     opened only as a plain file directly inside the directory, its size and sha256 (hashed
     streaming) as recorded; in format version 2, ``content_sha256`` is the sha256 of those digests,
     one per line.
  2. Structure, one block of ``batch_chunks`` chunks at a time, in global order (:mod:`.blocks`
     decodes; :mod:`.structure` holds what every strategy checks: schema, row counts, no nulls,
     ``chunk_index`` ``0..n-1``, segment lengths > 0 summing to C, and the manifest's counts at
     the end; in format version 3, ``content_sha256`` recomputed from the decoded chunks,
     :mod:`.content`). The strategy's own rules are its structure check, in its folder
     (``raypack/strategies/NAME/verify.py``) and named by it (:func:`structure_class`:
     ``PackingStrategy.verify_structure``); the check also gives the report its note beside the
     strategy's name. Nothing in this package knows a strategy by name.
  3. Round trip (:mod:`.inputs`, when inputs are compared), in the same pass: the output's
     non-padding stream with dense doc ids equals the input documents concatenated in order, as
     the manifest's ``long_docs`` keeps them (truncate: first C tokens; drop: none of a longer
     document), and the cut counts re-read equal the manifest's. Under truncate or drop no
     document in the output exceeds C tokens (:mod:`.long_docs`), inputs compared or not.

Memory: ``batch_chunks * C`` output positions (tokens plus int64 doc ids), one input read batch of
``INPUT_BATCH_DOCS`` documents as the reader decodes it (a document whole, at most
``max_document_tokens`` tokens), verify's arrays for ``PIECE_POSITIONS`` input positions, and what
the strategy's check holds back (its docstring says how much). Cost: every file is read twice (hash,
then decode; the second read is usually served by the page cache), the inputs once, and O(tokens)
numpy work plus three hashlib calls per chunk (the content digest); no Python loop runs per token,
document or segment."""

from __future__ import annotations

import time
from typing import Any, Sequence

from raypack.errors import InputError, NotAnOutput
from raypack.inputs.base import DEFAULT_MAX_DOCUMENT_TOKENS
from raypack.packed.manifest import MIX_KIND, TOKENIZED_KIND, check_manifest, read_manifest_json
from raypack.verify.inputs import INPUT_BATCH_DOCS
from raypack.verify.mix import MixVerifyReport, verify_mix
from raypack.verify.output import structure_class, verify_packed
from raypack.verify.report import VerifyError, VerifyReport

__all__ = ["INPUT_BATCH_DOCS", "VerifyError", "VerifyReport", "structure_class", "verify_output"]


def verify_output(
    out: str,
    inputs: Sequence[str] | None = None,
    *,
    token_column: str | None = None,
    batch_chunks: int = 1024,
    max_document_tokens: int | None = DEFAULT_MAX_DOCUMENT_TOKENS,
) -> VerifyReport | MixVerifyReport:
    """Audit output directory ``out`` (local path or URI); raise VerifyError at the first discrepancy.

    inputs: shard files/directories/globs to compare with (expanded like ``raypack pack`` does);
    None compares with the manifest's shards when every one of them still exists (only absolute
    paths or URIs of shard files without ``..``: anything else is an InputError asking for
    explicit inputs; the report names every shard read), ``[]`` skips the comparison.
    token_column: the inputs' token column (default: the manifest's config, else ``input_ids``).
    batch_chunks: chunks decoded at a time (bounds memory).
    max_document_tokens: an input document longer than this is refused (one line, before the
    reader decodes it where the format allows), as ``raypack pack`` does: the reader decodes a
    document whole, so this bounds verify's memory (BENCHMARKS.md, "verify and one long document").
    Raises InputError for unusable arguments (an input path that does not exist).
    A mix (raypack mix) is checked through its sources: :func:`raypack.verify.mix.verify_mix`.
    """
    start = time.perf_counter()
    if isinstance(batch_chunks, bool) or not isinstance(batch_chunks, int) or batch_chunks < 1:
        raise ValueError(f"batch_chunks={batch_chunks!r} must be an integer >= 1")
    if max_document_tokens is not None and (isinstance(max_document_tokens, bool) or
                                            not isinstance(max_document_tokens, int) or max_document_tokens < 1):
        raise InputError(f"max_document_tokens={max_document_tokens!r} must be an integer >= 1")
    data, where = _read_json(out)
    if isinstance(data, dict) and data.get("kind") == TOKENIZED_KIND:
        check_manifest(data, where)  # NotAnOutput, naming it
    if isinstance(data, dict) and data.get("kind") == MIX_KIND:  # read through raypack.mix.dataset: verify.mix
        return verify_mix(out, data, where, inputs)
    return verify_packed(out, inputs, token_column=token_column, batch_chunks=batch_chunks, start=start,
                         max_document_tokens=max_document_tokens, parsed=(data, where))


def _read_json(out: str) -> tuple[Any, str]:
    """The parsed, unchecked manifest and its path (a mix or a packed output?); InputError -> VerifyError."""
    try:
        return read_manifest_json(out)
    except NotAnOutput:
        raise  # the wrong thing given (exit 2), not an output that fails its audit
    except InputError as e:
        raise VerifyError(str(e)) from e
