"""The run-time exactness guard: each tokenize task re-encodes a sample of its documents with the
reference library and refuses on any difference. No Ray, no I/O.

The sample is a function of the task's document sequence alone (so a rerun checks the same
documents): document k of the task (counted from 0 in the task's order) is a candidate when
``k == 0`` or the top ``SAMPLE_LOG2`` bits of splitmix64(k) are zero (1 document in 2,048), and a
candidate is checked when the bytes checked so far, its own included, stay within
``FREE_BYTES + BYTES_SHARE x`` the task's bytes up to and including it. So at most 1 KiB plus
1/20000 of a task's text is encoded twice, however its documents' lengths are spread.

A candidate longer than what is left of that budget (~4.4 KB by the end of a 64 MiB task; most
source files and books) is checked on a prefix where the tokenizer can be cut (``cut_rule``:
byte-level BPE with GPT-2's, cl100k's, Llama 3's or o200k's split regex, and the tiktoken
encodings; raypack.tokenize.backends.new_characters): its text up to its last indented line's cut
within the budget, whose reference ids must begin the backend's ids of the whole document (the
regex splits there, so the ids of the whole are those of the two sides). A hostile trial found
the guard checked nothing in a task of documents all over 1 KiB. Where the tokenizer has no cut
(SentencePiece style, a normalizer) or the document no indented line within the budget, a long
document is still not checked.

That is a tripwire for a backend that goes wrong, not a proof: the proofs are the token-for-token
tests and ``raypack verify OUT --check-tokenizer N``, which re-encodes documents of any length.

The sampled documents' texts and ids are kept as the task's batches pass (:meth:`ReferenceGuard.check`:
the batch's document indices hashed, then a loop over its few candidates) and re-encoded in one
reference call at the task's end (:meth:`ReferenceGuard.finish`), before the task's file is
committed or its counts reported.

Cost (BENCHMARKS.md, "The guard's share"): the reference re-encodes the sample at R_ref (1-2 MB/s
here, cold, a few documents a call) while a one-pass run reads text at R_run (~100 MB/s), so the
share costs BYTES_SHARE x R_run / R_ref of a task's time (~0.5-1%), plus 1 KiB per task at
R_ref and ~50 microseconds per batch. Measured against the same runs without the guard: 1.3% +-
0.8% of a one-pass run on 400-byte documents, where it had been 7.8% +- 1.4% (a reference call per
batch, 4 KiB + 1/5000 a task).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa

from raypack.errors import InputError
from raypack.io.untrusted import show
from raypack.rules.arrays import arrow_array, binary_array
from raypack.tokenize.backends.new_characters import indent_cuts
from raypack.tokenize.tokenizers import FlatIds, TextTokenizer, encode_naming, text_offsets

SAMPLE_LOG2 = 11
"""A document is a candidate with probability 2**-SAMPLE_LOG2 (and document 0 always)."""
BYTES_SHARE = 1 / 20000
FREE_BYTES = 1 << 10


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
    """Checks the ids of a backed tokenizer against its reference, over one task.

    :meth:`check` takes each batch's sampled documents (their texts and the backend's ids; a few
    KiB a task); :meth:`finish`, at the task's end, re-encodes them all with the reference in one
    call and refuses on any difference. One call a task, not one a batch: on short documents
    (8,192 a batch) the reference's calls, each taking the GIL back from the packer, had made the
    guard 7.8% of a one-pass run (BENCHMARKS.md, "The guard's share"). ``name_document(k)`` names
    document k of the task for the error (file, task, position). A tokenizer whose ids come from
    its reference library is not checked."""

    def __init__(self, tokenizer: TextTokenizer, name_document: Callable[[int], str]) -> None:
        reference = getattr(tokenizer, "reference", None)
        self.reference = None if getattr(tokenizer, "encoder", reference) is reference else reference
        self.backend = getattr(tokenizer, "backend", "reference")
        self.name_document = name_document
        self.cut_rule = getattr(tokenizer, "cut_rule", None)
        """Where a long document may be cut for a prefix check (module doc), or None."""
        self.num_docs = self.num_bytes = 0
        self.num_checked_docs = self.num_checked_bytes = 0
        self._texts: list[pa.Array] = []  # the sampled documents' texts, batch by batch
        self._ids: list[np.ndarray] = []  # the backend's ids of each sampled document (copies)
        self._docs: list[int] = []  # each one's index in the task
        self._prefixes: list[bool] = []  # each one checked on a prefix: its ids begin the backend's

    def check(self, texts: pa.Array, flat: FlatIds) -> None:
        """Take this batch's sampled documents (their texts and ids) for :meth:`finish`. Cost: the
        batch's document indices hashed (numpy), then a loop over its few candidates."""
        if self.reference is not None and len(texts):
            offsets = text_offsets(texts)
            first = int(offsets[0])
            picked, prefixes, checked = [], [], self.num_checked_bytes
            rows = np.flatnonzero(candidates(self.num_docs + np.arange(len(texts), dtype=np.int64)))
            for row in rows.tolist():
                size = int(offsets[row + 1]) - int(offsets[row])
                bytes_through = self.num_bytes + int(offsets[row + 1]) - first  # the task's bytes up to this one
                left = int(FREE_BYTES + BYTES_SHARE * bytes_through) - checked
                if size <= left:
                    picked.append(row)
                    checked += size
                elif (cut := self._prefix_cut(texts, offsets, row, left)) > 0:
                    prefixes.append((row, cut))
                    checked += cut
            if picked:
                self._texts.append(texts.take(arrow_array(np.array(picked, dtype=np.int64))).cast(pa.large_string()))
                self._ids.extend(flat.values[flat.offsets[row]:flat.offsets[row + 1]].copy() for row in picked)
                self._docs.extend(self.num_docs + row for row in picked)
                self._prefixes.extend([False] * len(picked))
            if prefixes:  # each prefix's ids are at most its bytes (byte-level: every id holds a byte)
                data = np.frombuffer(texts.buffers()[2], dtype=np.uint8)
                starts = [int(offsets[row]) for row, _ in prefixes]
                self._texts.append(binary_array([data[a:a + cut].tobytes() for a, (_, cut) in zip(starts, prefixes)],
                                                pa.large_binary()).cast(pa.large_string()))
                self._ids.extend(flat.values[flat.offsets[row]:min(flat.offsets[row] + cut, flat.offsets[row + 1])]
                                 .copy() for row, cut in prefixes)
                self._docs.extend(self.num_docs + row for row, _ in prefixes)
                self._prefixes.extend([True] * len(prefixes))
            if picked or prefixes:
                self.num_checked_docs += len(picked) + len(prefixes)
                self.num_checked_bytes = checked
            self.num_bytes += int(offsets[-1]) - first
        self.num_docs += len(texts)

    def _prefix_cut(self, texts: pa.Array, offsets: np.ndarray, row: int, left: int) -> int:
        """The length of the prefix of document ``row`` to check within ``left`` bytes: its last cut
        (``cut_rule``) there, or 0 where there is none."""
        if self.cut_rule is None or left <= 0:
            return 0
        start = int(offsets[row])
        head = np.frombuffer(texts.buffers()[2], dtype=np.uint8)[start:min(start + left + 256, int(offsets[row + 1]))]
        cuts = indent_cuts(head, self.cut_rule)  # a cut found in the head is one of the whole document
        cuts = cuts[(cuts > 0) & (cuts <= left)]
        return int(cuts[-1]) if cuts.size else 0

    def finish(self) -> None:
        """Re-encode the task's sample with the reference in one call; InputError on a difference."""
        if not self._texts:
            return
        sample = pa.concat_arrays(self._texts)
        ids, docs, prefixes = self._ids, self._docs, self._prefixes
        self._texts, self._ids, self._docs, self._prefixes = [], [], [], []
        # the reference itself may fail (a Rust panic on a broken tokenizer.json): one line naming the document
        expected = encode_naming(self.reference, sample, lambda k: self.name_document(docs[k]))
        for k, (doc, got, prefix) in enumerate(zip(docs, ids, prefixes)):
            want = expected.values[expected.offsets[k]:expected.offsets[k + 1]]
            if prefix and got.size >= want.size:
                got = got[:want.size]  # the prefix's ids begin the whole document's
            if got.shape != want.shape or not np.array_equal(got, want):
                self._refuse(doc, sample[k].as_py(), got, want, prefix)

    def _refuse(self, doc: int, text: str, got: np.ndarray, want: np.ndarray, prefix: bool = False) -> None:
        size = min(got.size, want.size)
        at = int(np.flatnonzero(got[:size] != want[:size])[0]) if (got[:size] != want[:size]).any() else size
        seen = lambda ids: "end" if at >= ids.size else str(int(ids[at]))  # noqa: E731
        part = f" for its first {len(text.encode())} bytes" if prefix else ""
        raise InputError(
            f"{self.name_document(doc)} (text {show(text, 60)}): the {self.backend} tokenizer "
            f"backend gives {got.size} ids{part}, the reference {getattr(self.reference, 'library', '')} {want.size}, "
            f"first differing at id {at} ({seen(got)} vs {seen(want)}); rerun with --tokenizer-backend reference "
            f"and report it to {self.backend}")
