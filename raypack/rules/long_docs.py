"""What happens to a document longer than the context length C (``long_docs``). Pure numpy, no I/O.

  ``split``     (default) it is packed whole, cut across chunks like any other document;
  ``truncate``  only its first C tokens are packed, the rest is left out;
  ``drop``      none of it is packed: its doc id never appears in the output.

A document's id stays its global input row either way (a dropped or cut document keeps its id
and takes no more positions than it keeps), so ids do not depend on how the work is split.
Applied where documents are read for packing (raypack.pack.packer) and where chunks and tokens
are planned (the counting pass, raypack.pack.packer.count_task): both read *kept* lengths
(:func:`kept_lengths`), so a truncated or dropped document looks to every strategy like a
shorter (or empty) document.

A document is read whole; :func:`keep_prefixes` keeps each one's kept prefix. Everything works on
any dtype (plain slicing and fancy indexing), so a structured array of tokens and side values is
cut the same way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["DEFAULT_LONG_DOCS", "LONG_DOCS", "CutCounts", "count_cut", "keep_prefixes", "kept_lengths",
           "validate_long_docs"]

LONG_DOCS = ("split", "truncate", "drop")
DEFAULT_LONG_DOCS = "split"


def validate_long_docs(value: Any) -> str:
    """``value`` when it is one of :data:`LONG_DOCS`, else ValueError naming it and the choices."""
    if not isinstance(value, str) or value not in LONG_DOCS:
        raise ValueError(f"long_docs={value!r} must be one of {', '.join(LONG_DOCS)}")
    return value


class CutCounts(NamedTuple):
    """Documents longer than C that were truncated or dropped, and the tokens each left out."""

    documents_truncated: int = 0
    tokens_truncated: int = 0
    """Tokens cut off truncated documents (those after their first C)."""
    documents_dropped: int = 0
    tokens_dropped: int = 0
    """Every token of the dropped documents."""

    def __add__(self, other: tuple) -> CutCounts:  # type: ignore[override]
        return CutCounts(*(a + b for a, b in zip(self, other)))

    @property
    def num_tokens_left_out(self) -> int:
        return self.tokens_truncated + self.tokens_dropped

    def as_dict(self) -> dict[str, int]:
        return self._asdict()


def kept_lengths(lengths: npt.NDArray[np.integer], long_docs: str, context_length: int) -> npt.NDArray[np.int64]:
    """(n,) int64: the tokens each document keeps under ``long_docs``. O(n)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if long_docs == "truncate":
        return np.minimum(lengths, context_length)
    if long_docs == "drop":
        return np.where(lengths > context_length, 0, lengths)
    return lengths


def count_cut(lengths: npt.NDArray[np.integer], long_docs: str, context_length: int) -> CutCounts:
    """What ``long_docs`` leaves out of documents of these (full) lengths. O(n)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if long_docs == "split" or not lengths.size:
        return CutCounts()
    long = lengths > context_length
    num_long = int(np.count_nonzero(long))
    if long_docs == "truncate":
        return CutCounts(num_long, int((lengths[long] - context_length).sum()), 0, 0)
    return CutCounts(0, 0, num_long, int(lengths[long].sum()))


def keep_prefixes(tokens: np.ndarray, lengths: npt.NDArray[np.integer],
                  keep: npt.NDArray[np.integer]) -> np.ndarray:
    """The first ``keep[i]`` of each run's ``lengths[i]`` tokens, runs laid end to end in ``tokens``.

    tokens: (T,) any dtype; lengths, keep: (n,), ``0 <= keep <= lengths``. Returns ``tokens``
    itself when every run is kept whole, else a gathered (sum(keep),) copy (one int64 index per
    kept token: np.repeat of the run offsets plus an arange). O(n + sum(keep)).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    keep = np.asarray(keep, dtype=np.int64)
    if np.array_equal(keep, lengths):
        return tokens
    starts = np.cumsum(lengths) - lengths
    kept_starts = np.cumsum(keep) - keep
    index = np.repeat(starts - kept_starts, keep) + np.arange(int(keep.sum()), dtype=np.int64)
    return tokens[index]
