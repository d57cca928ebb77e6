"""Check 3, the round trip: which inputs to compare with, and the comparison itself.

:func:`resolve_inputs` picks the shards: the ones given (expanded like ``raypack pack`` does), or by
default the manifest's, read only when each is an absolute path or URI of a shard file without
``..`` (the manifest is untrusted) and all of them still exist. :func:`compare_with_inputs` walks
the output's non-padding stream and the inputs' token stream together (as the manifest's
``long_docs`` keeps it: a truncated document's first C tokens, a dropped one's none), each token
labelled with its document's global id: a cursor compares the overlap of the current output piece and input piece
with numpy, whose batch boundaries differ, so every non-empty document appears once, whole,
contiguous and in order, and tokens are conserved. Then the inputs' document count must equal the
manifest's and, when the inputs are the manifest's shards, each shard's counts what was recorded.
Memory: one input read batch of ``INPUT_BATCH_DOCS`` documents as the reader decodes it, and
verify's own arrays for PIECE_POSITIONS positions of it (a long document is compared a slice at a
time). Cost: the inputs read once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from raypack.errors import InputError
from raypack.inputs.base import DocumentTooLong, HoldsText
from raypack.inputs.reading import iter_document_batches
from raypack.inputs.registry import FORMATS, accepted_suffixes, shard_format
from raypack.inputs.shards import discover_shards
from raypack.io.fs import is_file
from raypack.io.fs import is_uri as fs_is_uri
from raypack.packed.manifest import CUT_KEYS, long_docs_of, side_columns_of
from raypack.rules.arrays import numpy_values
from raypack.rules.core import cast_tokens, flatten_documents
from raypack.rules.side_columns import SideColumn, combine, record_dtype
from raypack.verify.blocks import Piece
from raypack.verify.report import VerifyError

__all__ = ["INPUT_BATCH_DOCS", "Shard", "compare_with_inputs", "resolve_inputs"]

INPUT_BATCH_DOCS = 2048
"""Input documents read per batch when comparing with the inputs."""


class Shard(NamedTuple):
    path: str
    format: str
    recorded: dict[str, Any] | None
    """The manifest's entry for this shard, when the inputs are the manifest's shards."""


def resolve_inputs(manifest: dict[str, Any], inputs: Sequence[str] | None,
                   where: str) -> tuple[list[Shard] | None, str]:
    """The shards to compare with, or None to skip the comparison, and why it is skipped ("" when it is
    not: the report's inputs line says it, and nothing is printed before the checks have run). ``where``
    names the manifest.

    Default (``inputs`` None): the manifest's shards, but only absolute paths or URIs with a known
    shard suffix and no ``..`` (else InputError: pass --input), and only when all still exist.
    """
    recorded = manifest.shards
    if inputs is None:
        if not recorded:
            return None, "the manifest lists no shards"
        if any(isinstance(e, dict) and e.get("format") == "text" for e in recorded):
            return None, ("text, tokenized in the run: --check-tokenizer re-encodes a sample; --input a raypack "
                          "tokenize of the texts compares every token")
        for k, entry in enumerate(recorded):
            _check_default_input(entry, k, where)
        missing = [e["path"] for e in recorded if not is_file(e["path"])]
        if missing:
            return None, (f"{len(missing):,} of the manifest's shards are gone (e.g. {missing[0]}); pass --input "
                          "where they are now")
        return [Shard(e["path"], e.get("format") or shard_format(e["path"]), e) for e in recorded], ""
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs:
        return None, "--no-inputs"
    paths = discover_shards(list(inputs))
    same = paths == [e["path"] for e in recorded]
    return [Shard(p, shard_format(p), recorded[k] if same else None) for k, p in enumerate(paths)], ""


def check_shard_sources(manifest: Any, where: str) -> None:
    """VerifyError for a shard whose format, or whose text source (``text`` in a one pass's entry, ``source``
    in a tokenized corpus's), is not one raypack writes: an edited "texx" passed verify, or made
    --check-tokenizer a traceback or a line saying the output was not packed from text (a hostile trial)."""
    for k, entry in enumerate(manifest.shards):
        fmt = entry.get("format")
        if fmt is not None and fmt != "text" and fmt not in FORMATS:
            raise VerifyError(f"{where}: shards[{k}]: format={fmt!r} is not one raypack writes (text, "
                              f"{', '.join(FORMATS)}); the manifest was edited or damaged")
        for key in ("text", "source"):
            source = entry.get(key)
            if key not in entry:
                continue
            bounds = [source.get(b) for b in ("start", "end")] if isinstance(source, dict) else []
            if (not isinstance(source, dict) or source.get("format") not in FORMATS or key == "text" and fmt != "text"
                    or key == "source" and not isinstance(source.get("path"), str)
                    or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in bounds)
                    or bounds[0] > bounds[1]):
                raise VerifyError(f"{where}: shards[{k}]: {key}={source!r} is not a text source raypack writes (a "
                                  f"format of {', '.join(FORMATS)}, 0 <= start <= end); the manifest was edited or "
                                  "damaged")


def _check_default_input(entry: dict[str, Any], k: int, where: str) -> None:
    """Refuse to read a manifest's shard path unless it is an absolute local path or a URI with a
    known shard suffix and no ``..`` component, in a known format (the manifest is untrusted)."""
    path, fmt = entry["path"], entry.get("format")
    is_uri = fs_is_uri(path)
    parts = (path.split("://", 1)[1] if is_uri else path).split("/")
    if (not (is_uri or os.path.isabs(path)) or ".." in parts or shard_format(path) is None
            or (fmt is not None and fmt not in FORMATS) or any(c in path for c in "\n\r\0")):
        raise InputError(f"{where}: shards[{k}]: path={path!r} (format={fmt!r}) is not an absolute path or URI of a "
                         f"shard file ({accepted_suffixes()}) without '..'; verify does not read it: pass "
                         "the inputs with --input (or --no-inputs)")


@dataclass
class _InputTotals:
    num_docs: int = 0
    """Documents in the shards read so far: the global id of the next shard's first document."""
    cut: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CUT_KEYS, 0))
    """What ``long_docs`` left out of the shards read so far."""


PIECE_POSITIONS = 1 << 20
"""Input positions compared at a time: a long document is walked in slices of this many tokens, so
verify's own arrays (doc ids, the kept mask, the kept copies: ~22 bytes a position) stay this size
whatever the longest document; what remains per document is the reader's decode of it."""


def _input_pieces(shards: list[Shard], column: str, totals: _InputTotals, long_docs: str, context_length: int,
                  extra_columns: tuple[SideColumn, ...] = (), token_dtype: str = "int64",
                  max_document_tokens: int | None = None) -> Iterator[Piece]:
    """The inputs' token stream as ``long_docs`` keeps it, each token labelled with its document's
    global id, in pieces of at most PIECE_POSITIONS positions. With side columns each token is a
    record of the output's packed dtype: the token and its side values (as the output's structure
    check gives them), so one comparison covers every column."""
    names = tuple(c.name for c in extra_columns)
    dtype = record_dtype(token_dtype, extra_columns)
    for shard in shards:
        num_docs, num_tokens, cut = 0, 0, dict.fromkeys(CUT_KEYS, 0)
        try:
            for first_row, lists, sides in _input_batches(shard, column, names, max_document_tokens):
                tokens, lengths = flatten_documents(lists)
                lengths = np.asarray(lengths, dtype=np.int64)
                _count_cut(lengths, long_docs, context_length, cut)
                if names:
                    tokens = _packed_input(tokens, sides, dtype, shard.path, first_row)
                first_id = totals.num_docs + first_row
                for piece in _batch_pieces(tokens, lengths, first_id, long_docs, context_length):
                    num_tokens += piece.tokens.size
                    yield piece._replace(where=_input_locator(shard.path, first_row, first_id, lengths, piece.where))
                num_docs = first_row + lengths.size
        except DocumentTooLong:
            raise  # a limit, not a discrepancy: exit 2, and the line names the flag
        except HoldsText:
            raise InputError(f"input {shard.path} holds text: verify compares an output with the token ids it was "
                             "packed from; pass the tokenized corpus (raypack tokenize) with --input, or, for an "
                             "output packed from text, give no --input and add --check-tokenizer") from None
        except InputError as e:
            raise VerifyError(f"input {e}") from e
        _check_recorded(shard, num_docs, num_tokens, cut if long_docs != "split" else None)
        totals.num_docs += num_docs
        totals.cut = {key: totals.cut[key] + cut[key] for key in CUT_KEYS}


def _count_cut(lengths: np.ndarray, long_docs: str, context_length: int, cut: dict[str, int]) -> None:
    """Adds to ``cut`` what ``long_docs`` leaves out of documents of ``lengths`` (split: nothing)."""
    long = lengths > context_length
    if long_docs == "truncate":
        cut["documents_truncated"] += int(np.count_nonzero(long))
        cut["tokens_truncated"] += int((lengths[long] - context_length).sum())
    elif long_docs == "drop":
        cut["documents_dropped"] += int(np.count_nonzero(long))
        cut["tokens_dropped"] += int(lengths[long].sum())


class _Slice(NamedTuple):
    tokens: np.ndarray
    doc_ids: np.ndarray
    where: Callable[[int], int]
    """Position i of the slice's kept tokens -> its position among the batch's tokens."""


def _batch_pieces(tokens: np.ndarray, lengths: np.ndarray, first_id: int, long_docs: str,
                  context_length: int) -> Iterator[_Slice]:
    """The batch's tokens that ``long_docs`` keeps (split: all; truncate: a document's first C; drop:
    documents of at most C), with their global doc ids, PIECE_POSITIONS positions at a time."""
    ends = np.cumsum(lengths)
    for start in range(0, tokens.size, PIECE_POSITIONS):
        stop = min(start + PIECE_POSITIONS, tokens.size)
        first = int(np.searchsorted(ends, start, side="right"))
        last = int(np.searchsorted(ends, stop - 1, side="right"))
        doc_starts = ends[first:last + 1] - lengths[first:last + 1]
        spans = np.minimum(ends[first:last + 1], stop) - np.maximum(doc_starts, start)
        rows = np.repeat(np.arange(first, last + 1), spans)
        if long_docs == "split":
            yield _Slice(tokens[start:stop], rows + first_id, lambda i, start=start: start + i)
            continue
        if long_docs == "truncate":
            keep = np.arange(start, stop) - (ends[rows] - lengths[rows]) < context_length
        else:  # drop
            keep = lengths[rows] <= context_length
        kept = np.flatnonzero(keep)
        yield _Slice(tokens[start:stop][kept], rows[kept] + first_id,
                     lambda i, start=start, kept=kept: start + int(kept[i]))


def _input_batches(shard: Shard, column: str, names: tuple[str, ...],
                   max_document_tokens: int | None) -> Iterator[tuple[int, pa.Array, tuple]]:
    for batch in iter_document_batches(shard.path, shard.format, column, INPUT_BATCH_DOCS, extra_columns=names,
                                       max_document_tokens=max_document_tokens):
        yield batch.first_row, batch.tokens, batch.sides


def _packed_input(tokens: np.ndarray, sides: tuple[pa.Array, ...], dtype: np.dtype, path: str,
                  first_row: int) -> np.ndarray:
    """Input tokens and side values as one array of the output's packed dtype; a value that does
    not fit the output is a mismatch (VerifyError naming the batch)."""
    try:
        values = [numpy_values(side.flatten()) for side in sides]
        return combine(cast_tokens(tokens, dtype[0]), values, dtype)
    except (TypeError, ValueError) as e:
        raise VerifyError(f"input shard {path} rows from {first_row}: {e}; the output cannot hold these inputs") from e


def _input_locator(path: str, first_row: int, first_id: int, lengths: np.ndarray,
                   position: Callable[[int], int]) -> Callable[[int], str]:
    """Names the kept token i of a slice: ``position(i)`` is its place among the batch's tokens."""
    def where(i: int) -> str:
        p = position(i)
        ends = np.cumsum(lengths)
        row = int(np.searchsorted(ends, p, side="right"))
        offset = p - (int(ends[row - 1]) if row else 0)
        return (f"input shard {path} row {first_row + row} (doc id {first_id + row}, "
                f"token {offset} of {int(lengths[row])})")

    return where


def _check_recorded(shard: Shard, num_docs: int, num_tokens: int, cut: dict[str, int] | None = None) -> None:
    """The shard's counts as the manifest recorded them (``num_tokens``: the tokens kept)."""
    if shard.recorded is None:
        return
    recorded = (shard.recorded["num_docs"], shard.recorded["num_tokens"])
    if (num_docs, num_tokens) != recorded:
        raise VerifyError(f"input shard {shard.path}: holds {num_docs} documents / {num_tokens} tokens, the manifest "
                          f"recorded {recorded[0]} / {recorded[1]} at packing; it changed after packing")
    for key, value in (cut or {}).items():
        if shard.recorded.get(key) != value:
            raise VerifyError(f"input shard {shard.path}: {key}={value} re-read with the policy, the manifest "
                              f"recorded {shard.recorded.get(key)}; it changed after packing")


class _Cursor:
    """Walks a stream of pieces; ``take(n)`` views the next n positions of the current piece."""

    def __init__(self, pieces: Iterator[Piece]) -> None:
        self._pieces = pieces
        self.piece: Piece | None = None
        self.offset = 0

    def current(self) -> Piece | None:
        """The piece holding the next position (skipping empty ones), None at the end."""
        while self.piece is None or self.offset == self.piece.tokens.size:
            self.piece, self.offset = next(self._pieces, None), 0
            if self.piece is None:
                return None
        return self.piece

    def remaining(self) -> int:
        return self.piece.tokens.size - self.offset

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        start, self.offset = self.offset, self.offset + n
        return self.piece.tokens[start:self.offset], self.piece.doc_ids[start:self.offset]


def compare_with_inputs(output: Iterator[Piece], shards: list[Shard], column: str, manifest: dict[str, Any],
                         manifest_path: str, max_document_tokens: int | None = None) -> None:
    """Walk the output and input streams together; raise at the first position where they differ."""
    totals = _InputTotals()
    long_docs = long_docs_of(manifest)
    found = _Cursor(output)
    expected = _Cursor(_input_pieces(shards, column, totals, long_docs, manifest.context_length,
                                     side_columns_of(manifest), manifest.token_dtype.name,
                                     max_document_tokens))
    while found.current() is not None and expected.current() is not None:
        n = min(found.remaining(), expected.remaining())
        start_found, start_expected = found.offset, expected.offset
        found_tokens, found_ids = found.take(n)
        expected_tokens, expected_ids = expected.take(n)
        bad = (found_ids != expected_ids) | (found_tokens != expected_tokens)
        if bad.any():
            i = int(np.argmax(bad))
            raise VerifyError(
                f"{found.piece.where(start_found + i)}: found doc id {int(found_ids[i])} token "
                f"{found_tokens[i].item()}; {expected.piece.where(start_expected + i)}: expected doc id "
                f"{int(expected_ids[i])} token {expected_tokens[i].item()}"
            )
    if found.current() is not None:
        raise VerifyError(f"{found.piece.where(found.offset)}: the output continues (doc id "
                          f"{int(found.piece.doc_ids[found.offset])}) but the inputs end there; tokens not conserved")
    if expected.current() is not None:
        raise VerifyError(f"{expected.piece.where(expected.offset)}: not in the output, which ends after "
                          f"{manifest.counts.tokens} tokens; tokens not conserved")
    if totals.num_docs != manifest.counts.documents:
        raise VerifyError(f"{manifest_path}: counts.documents={manifest.counts.documents} but the inputs "
                          f"hold {totals.num_docs} documents")
    for key, value in totals.cut.items() if long_docs != "split" else ():
        if getattr(manifest.counts, key) != value:
            raise VerifyError(f"{manifest_path}: counts.{key}={getattr(manifest.counts, key)} but the inputs re-read "
                              f"with long_docs={long_docs} give {value}")
