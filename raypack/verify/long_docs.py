"""Under ``long_docs`` truncate or drop, no document in the output holds more than C tokens.

Checked on the output's non-padding stream (both strategies give it in doc id order, each
document's tokens together), so it holds with or without the inputs. O(positions) numpy work;
it keeps one document's running length between pieces.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from raypack.verify.blocks import Piece
from raypack.verify.report import VerifyError


def check_document_lengths(pieces: Iterator[Piece], context_length: int, long_docs: str) -> Iterator[Piece]:
    """``pieces`` passed through; VerifyError at the first document whose tokens exceed C."""
    last_id, last_len = -1, 0
    for piece in pieces:
        ids = piece.doc_ids
        if ids.size:
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            run_lens = np.diff(np.r_[starts, ids.size])
            run_lens[0] += last_len if ids[0] == last_id else 0
            if run_lens.max() > context_length:
                k = int(np.argmax(run_lens > context_length))
                raise VerifyError(f"{piece.where(int(starts[k]))}: doc id {int(ids[starts[k]])} has more than "
                                  f"{context_length} tokens, but the manifest says long_docs={long_docs} "
                                  "(no document is packed longer than C)")
            last_id, last_len = int(ids[-1]), int(run_lens[-1])
        yield piece
