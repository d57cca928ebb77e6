"""The run-time exactness guard: each tokenize task re-encodes a sample of its documents with the
reference library and refuses on any difference. No Ray, no I/O.

The sample is a function of the task's document sequence alone (so a rerun checks the same
documents): document k of the task (counted from 0 in the task's order) is a candidate when
``k == 0`` or the top ``SAMPLE_LOG2`` bits of splitmix64(k) are zero (1 document in 2,048), and a
candidate is checked when the bytes checked so far, its own included, stay within
``FREE_BYTES + BYTES_SHARE x`` the task's bytes up to and including it. So at most 4 KiB plus
1/5000 of a task's text is encoded twice, however its documents' lengths are spread.

Cost (BENCHMARKS.md, "Tokenizer backends" and "The guard's share"): the reference encodes text at
R_ref and the task runs at R_run, so the guard adds at most BYTES_SHARE x R_run / R_ref of the
task's time, plus 4 KiB per task at R_ref. The one-pass ``pack --tokenizer`` runs ~90 times faster
than the reference encodes these few documents (2 MB/s, one at a time), so the share's bound is
1.8%; measured, with the few numpy steps per batch, the guard took 1.7-2.0% of that run. A batch
with no candidate costs O(1) here.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raypack.errors import InputError
from raypack.io.untrusted import show
from raypack.tokenize.tokenizers import FlatIds, TextTokenizer, text_offsets

SAMPLE_LOG2 = 11
"""A document is a candidate with probability 2**-SAMPLE_LOG2 (and document 0 always)."""
BYTES_SHARE = 1 / 5000
FREE_BYTES = 4 << 10


def splitmix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of ``values + golden gamma``, uint64 (wrapping arithmetic)."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def candidates(doc_indices: np.ndarray) -> np.ndarray:
    """Boolean mask of the documents that may be sampled (see the module doc)."""
    return ((splitmix64(doc_indices) >> np.uint64(64 - SAMPLE_LOG2)) == 0) | (doc_indices == 0)


class ReferenceGuard:
    """Checks the ids of a backed tokenizer against its reference, batch after batch of one task.

    ``name_document(k)`` names document k of the task for the error (file, task, position). A
    tokenizer whose ids come from its reference library is not checked."""

    def __init__(self, tokenizer: TextTokenizer, name_document: Callable[[int], str]) -> None:
        reference = getattr(tokenizer, "reference", None)
        self.reference = None if getattr(tokenizer, "encoder", reference) is reference else reference
        self.backend = getattr(tokenizer, "backend", "reference")
        self.name_document = name_document
        self.num_docs = self.num_bytes = 0
        self.num_checked_docs = self.num_checked_bytes = 0

    def check(self, texts: pa.Array, flat: FlatIds) -> None:
        """Re-encode this batch's sampled documents with the reference; InputError on a difference."""
        if self.reference is not None and len(texts):
            rows = np.flatnonzero(candidates(self.num_docs + np.arange(len(texts), dtype=np.int64)))
            if rows.size:
                lens = pc.binary_length(texts).to_numpy(zero_copy_only=False).astype(np.int64)
                rows = self._sample(lens, rows)
                if rows.size:
                    self._compare(texts.take(pa.array(rows)), flat, rows)
                    self.num_checked_docs += int(rows.size)
                    self.num_checked_bytes += int(lens[rows].sum())
                self.num_bytes += int(lens.sum())
            else:
                offsets = text_offsets(texts)
                self.num_bytes += int(offsets[-1]) - int(offsets[0])
        self.num_docs += len(texts)

    def _sample(self, lens: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Rows of this batch to check among the candidates ``rows``, in order (a loop over those few)."""
        bytes_through = self.num_bytes + np.cumsum(lens)
        picked, checked = [], self.num_checked_bytes
        for row in rows:
            if checked + lens[row] <= FREE_BYTES + BYTES_SHARE * bytes_through[row]:
                picked.append(int(row))
                checked += int(lens[row])
        return np.asarray(picked, dtype=np.int64)

    def _compare(self, sample: pa.Array, flat: FlatIds, rows: np.ndarray) -> None:
        expected = self.reference.encode_flat(sample)
        for k, row in enumerate(rows):
            got = flat.values[flat.offsets[row]:flat.offsets[row + 1]]
            want = expected.values[expected.offsets[k]:expected.offsets[k + 1]]
            if got.shape != want.shape or not np.array_equal(got, want):
                self._refuse(int(row), sample[k].as_py(), got, want)

    def _refuse(self, row: int, text: str, got: np.ndarray, want: np.ndarray) -> None:
        size = min(got.size, want.size)
        at = int(np.flatnonzero(got[:size] != want[:size])[0]) if (got[:size] != want[:size]).any() else size
        seen = lambda ids: "end" if at >= ids.size else str(int(ids[at]))  # noqa: E731
        raise InputError(
            f"{self.name_document(self.num_docs + row)} (text {show(text, 60)}): the {self.backend} tokenizer "
            f"backend gives {got.size} ids, the reference {getattr(self.reference, 'library', '')} {want.size}, "
            f"first differing at id {at} ({seen(got)} vs {seen(want)}); rerun with --tokenizer-backend reference "
            f"and report it to {self.backend}")
