"""raypack.tokenize.pieces.encode_pieces: with ``calls_in_flight`` encode calls at once (gigatoken on a pool of
threads), the pieces and their ids come out in order, an error is raised where one call at a time would
raise it, no more calls than that run at once, and leaving early starts no other call. Against a fake
tokenizer whose calls take a while, and against gigatoken itself (its ids equal one call at a time's).
Across tasks (``encode_across``, EncodeAhead): the next task's first call starts before this task's
end is taken, and a read's error waits for its place."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from raypack.errors import InputError
from raypack.tokenize.pieces import encode_across, encode_pieces
from raypack.tokenize.tasks import TextTask
from raypack.tokenize.tokenizers import FlatIds

TASK = TextTask(0, "/data/t.parquet", "parquet", 0, 1)


class Slow:
    """ids = the texts' lengths; each call sleeps, and records how many run at once."""

    def __init__(self, calls_in_flight: int, bad: int | None = None) -> None:
        self.calls_in_flight, self.bad = calls_in_flight, bad
        self.running = self.most = self.calls = 0
        self.lock = threading.Lock()

    def encode_flat(self, texts: pa.Array) -> FlatIds:
        with self.lock:
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
            self.started = [*getattr(self, "started", []), *(len(t) for t in texts.to_pylist())]
        try:
            time.sleep(0.02)
            values = [len(t) for t in texts.to_pylist()]
            if self.bad is not None and self.bad in values:
                raise InputError(f"text of length {self.bad} refused")
            return FlatIds(np.array(values, dtype=np.uint32), np.arange(len(values) + 1, dtype=np.int64))
        finally:
            with self.lock:
                self.running -= 1


def pieces(n: int):
    return ((k, pa.array(["x" * k])) for k in range(n))


@pytest.mark.parametrize("calls", [1, 2, 3])
def test_the_pieces_come_out_in_order_with_at_most_calls_in_flight(calls):
    tok = Slow(calls)
    out = [(piece.to_pylist(), flat.values.tolist()) for piece, flat in encode_pieces(TASK, pieces(20), tok)]
    assert out == [(["x" * k], [k]) for k in range(20)]
    assert tok.most == calls


def test_an_error_is_raised_in_order():
    tok = Slow(2, bad=5)
    seen = []
    with pytest.raises(InputError, match="length 5"):
        for piece, _ in encode_pieces(TASK, pieces(20), tok):
            seen.append(len(piece[0].as_py()))
    assert seen == [0, 1, 2, 3, 4]
    assert tok.calls <= 7  # the bad one and at most one after it


def test_leaving_early_starts_no_other_call():
    tok = Slow(2)
    it = encode_pieces(TASK, pieces(100), tok)
    next(it)
    it.close()
    calls = tok.calls
    time.sleep(0.1)
    assert calls == tok.calls <= 3 and tok.running == 0


def test_gigatoken_with_two_calls_in_flight_gives_one_call_at_a_times_ids(tmp_path, monkeypatch):
    pytest.importorskip("gigatoken")
    from raypack.tokenize.backends import load_backed_tokenizer

    from helpers import CORPUS, train_byte_level_bpe

    path = tmp_path / "tokenizer.json"
    train_byte_level_bpe(CORPUS * 20, 500).save(str(path))
    monkeypatch.setenv("RAYON_NUM_THREADS", "2")
    tok = load_backed_tokenizer(str(path), "gigatoken")
    assert tok.calls_in_flight == 2
    texts = [pa.array([CORPUS[(k + i) % len(CORPUS)] * (1 + (k * i) % 9) for i in range(30)]) for k in range(40)]
    both = [flat for _, flat in encode_pieces(TASK, enumerate(texts), tok)]
    one = [tok.encode_flat(t) for t in texts]
    for a, b in zip(both, one):
        assert a.values.tolist() == b.values.tolist() and a.offsets.tolist() == b.offsets.tolist()
    monkeypatch.setenv("RAYON_NUM_THREADS", "1")
    assert tok.calls_in_flight == 1  # a call on the calling thread holds the GIL: one at a time


def _three_tasks():
    """Three tasks of 4 pieces each (texts of lengths 10t + k), each followed by its end (no piece)."""
    for t in range(3):
        task = TextTask(t, f"/data/{t}.parquet", "parquet", 0, 1)
        for k in range(4):
            yield task, k, pa.array(["x" * (10 * t + k)])
        yield task, 0, None


@pytest.mark.parametrize("calls", [1, 2])
def test_across_tasks_the_ends_pass_in_place_and_the_next_tasks_calls_start_before_this_ones_end(calls):
    """At each task's end the consumer waits (at most 0.5 s) for a call of the next task to start: with two
    calls in flight one has (read and encoded ahead); one call at a time, none can before the end is taken."""
    tok = Slow(calls)
    out, next_started = [], []
    for task, piece, flat in encode_across(_three_tasks(), tok):
        if piece is None:
            out.append((task.task_index, "end"))
            t = task.task_index + 1
            deadline = time.monotonic() + 0.5
            while t < 3 and time.monotonic() < deadline and not any(v // 10 == t for v in getattr(tok, "started", [])):
                time.sleep(0.005)
            next_started.append(any(v // 10 == t for v in getattr(tok, "started", [])))
        else:
            out.append((task.task_index, flat.values.tolist()))
    assert out == [x for t in range(3) for x in [*((t, [10 * t + k]) for k in range(4)), (t, "end")]]
    assert tok.most == calls
    assert next_started == ([False, False, False] if calls == 1 else [True, True, False])


def test_a_reads_error_waits_for_the_calls_before_it():
    """Piece 3's call fails and the read after it fails while piece 3 is in flight: piece 3's error is the
    one raised, as one call at a time raises it (with two calls in flight the read's was, before stop 64)."""
    def items():
        for k in range(4):
            yield TASK, k, pa.array(["x" * k])
        raise InputError("the read after piece 3 failed")

    for calls in (1, 2):
        seen = []
        with pytest.raises(InputError, match="length 3"):
            for _, piece, _ in encode_across(items(), Slow(calls, bad=3)):
                seen.append(len(piece[0].as_py()))
        assert seen == [0, 1, 2]
