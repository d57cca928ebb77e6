"""``pack --tokenizer --local`` packs each task as it is tokenized (raypack.tokenize.onepass._run_streamed):
a task's pieces are packed while its later pieces are encoded, so the ids in memory do not grow with the
task; the bytes are those of the held path (``--workers 1``) and of the two-step tokenize + pack; an error
in the middle of a task is the same one line, with nothing left behind."""

from __future__ import annotations

import hashlib
import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raypack.tokenize.onepass as onepass
from raypack.errors import InputError
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.tokenize.backends import BACKENDS
from raypack.tokenize.job import TextOptions, TokenizeConfig, run_tokenize

from helpers import CORPUS, train_byte_level_bpe

DOCS = [f"{CORPUS[i % len(CORPUS)]} document {i} " * (1 + i % 7) for i in range(240)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_byte_level_bpe(CORPUS * 20, 500).save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def one_task(tmp_path_factory) -> str:
    """One Parquet row group of 240 texts: one task, tokenized in pieces of 5 texts."""
    root = tmp_path_factory.mktemp("text")
    pq.write_table(pa.table({"text": DOCS}), root / "a.parquet", row_group_size=len(DOCS))
    pq.write_table(pa.table({"text": DOCS[:30]}), root / "b.parquet", row_group_size=10)
    return str(root)


def text(tok: str, backend: str = "reference", **kw) -> TextOptions:
    return TextOptions(tokenizer=tok, tokenizer_backend=backend, batch_rows=5, **kw)


def run(tmp_path, inputs: str, tok: str, name: str, workers: int, backend: str = "reference", **kw):
    config = make_config(dict(inputs=[inputs], output=str(tmp_path / name), context_length=64, num_workers=workers,
                              **kw))
    return run_pack(config, engine="local", text=text(tok, backend))


def files(out) -> dict[str, str]:
    return {name: hashlib.sha256((out / name).read_bytes()).hexdigest() for name in sorted(os.listdir(out))
            if name.endswith(".arrow") or name == "manifest.json"}


def in_memory(monkeypatch) -> list[int]:
    """The pieces tokenized and not yet packed, after each event (a piece encoded, a piece taken by the packer)."""
    state, seen, lock = {"made": 0, "packed": 0}, [], threading.Lock()
    real_tokenize, real_pack = onepass.tokenize_in_memory, onepass.pack_documents

    def tokenize_in_memory(*args, **kwargs):
        for ids in real_tokenize(*args, **kwargs):
            with lock:
                state["made"] += 1
                seen.append(state["made"] - state["packed"])
            yield ids

    def pack_documents(task, settings, batches, *args, **kwargs):
        def counted():
            for batch in batches:
                with lock:
                    state["packed"] += 1
                    seen.append(state["made"] - state["packed"])
                yield batch
        return real_pack(task, settings, counted(), *args, **kwargs)

    monkeypatch.setattr(onepass, "tokenize_in_memory", tokenize_in_memory)
    monkeypatch.setattr(onepass, "pack_documents", pack_documents)
    return seen


@pytest.mark.parametrize("settings", [dict(long_docs="split"), dict(long_docs="truncate")])
def test_a_task_is_packed_as_it_is_tokenized_with_the_bytes_of_the_held_path(tmp_path, tok, one_task, settings,
                                                                            monkeypatch):
    """48 pieces in the big task: packed as they come, at most 3 tokenized and not packed (the one packed, the
    one waiting, the one just encoded); held (``--workers 1``), the whole task is, before its packing starts."""
    held = in_memory(monkeypatch)
    run(tmp_path, one_task, tok, "held", 1, **settings)
    monkeypatch.undo()
    streamed = in_memory(monkeypatch)
    summary = run(tmp_path, one_task, tok, "streamed", 2, **settings)
    assert max(held) >= 48
    assert max(streamed) <= 3
    assert files(tmp_path / "streamed") == files(tmp_path / "held")
    assert summary.manifest["counts"]["documents"] == 270


def test_a_refused_document_in_the_middle_of_a_streamed_task_is_the_held_paths_line(tmp_path, tok, one_task):
    """Row 200 of the big task is its first document over max_document_tokens: the same one line as the held
    path's, no output and nothing left in the output's parent (its chunk file aborted, its staging removed)."""
    lengths = [len(d) for d in DOCS]
    limit = max(lengths[:200]) * 3  # well over any document before row 200 in tokens...
    long_doc = DOCS[:200] + ["lorem ipsum dolor " * limit] + DOCS[201:]
    pq.write_table(pa.table({"text": long_doc}), os.path.join(one_task, "..", "long.parquet"))
    inputs = tmp_path / "in"
    inputs.mkdir()
    os.replace(os.path.join(one_task, "..", "long.parquet"), inputs / "long.parquet")
    said = []
    for workers in (1, 2):
        (tmp_path / str(workers)).mkdir()
        with pytest.raises(InputError) as e:
            run(tmp_path / str(workers), str(inputs), tok, "out", workers, max_document_tokens=limit)
        said.append(str(e.value))
        assert not (tmp_path / str(workers) / "out").exists()
        assert os.listdir(tmp_path / str(workers)) == []
    assert said[0] == said[1] and "long.parquet" in said[1] and "row 200" in said[1], said


def test_best_fit_holds_each_task(tmp_path, tok, one_task, monkeypatch):
    """best_fit is not packed as it is tokenized: its windows of documents beside the encoder raised its peak
    (BENCHMARKS.md, "stop 63"). It holds each task, as before, with the same bytes as --workers 1."""
    seen = in_memory(monkeypatch)
    run(tmp_path, one_task, tok, "two", 2, strategy="best_fit", best_fit_window=8)
    monkeypatch.undo()
    run(tmp_path, one_task, tok, "one", 1, strategy="best_fit", best_fit_window=8)
    assert max(seen) >= 48
    assert files(tmp_path / "two") == files(tmp_path / "one")


def test_only_a_long_streamed_task_gives_freed_memory_back(tmp_path, tok, one_task, monkeypatch):
    """glibc's free pages are given back after each piece once a task has passed ``held_tokens`` ids (as a
    spilling task did), never in a shorter one: after every piece of every task it cost 10-17% of the speed."""
    import dataclasses

    import raypack.tokenize.job as tokenize_job

    calls = []
    monkeypatch.setattr(onepass, "trim_freed_heap", lambda: calls.append(1))
    run(tmp_path, one_task, tok, "short", 2)
    assert calls == []
    real_settings = tokenize_job._text_settings

    def settings(*args, **kwargs):
        values, options_ = real_settings(*args, **kwargs)
        return dataclasses.replace(values, held_tokens=10_000), options_

    monkeypatch.setattr(tokenize_job, "_text_settings", settings)
    run(tmp_path, one_task, tok, "long", 2)
    # the big task: ~35k ids in 48 pieces, ~14 of them before 10k ids; b.parquet's ~4k ids: none
    assert 20 <= len(calls) <= 40, len(calls)
    assert files(tmp_path / "long") == files(tmp_path / "short")


# ------------------------------------------------- the next task's texts read while this one is encoded

THREE = [DOCS[i * 20:(i + 1) * 20] for i in range(3)]


@pytest.fixture()
def three_tasks(tmp_path) -> str:
    """Three files of one row group each: three tasks."""
    root = tmp_path / "three"
    root.mkdir()
    for k, docs in enumerate(THREE):
        pq.write_table(pa.table({"text": docs}), root / f"{'abc'[k]}.parquet")
    return str(root)


def _spy_reads(monkeypatch, on_read) -> None:
    """``on_read(path)`` as each task's text read begins (in the thread that reads)."""
    import raypack.tokenize.pieces as pieces

    real = pieces.format_named

    class Spied:
        def __init__(self, fmt):
            self._fmt = fmt

        def __getattr__(self, name):
            return getattr(self._fmt, name)

        def iter_texts(self, path, *args, **kwargs):
            on_read(path)
            yield from self._fmt.iter_texts(path, *args, **kwargs)

    monkeypatch.setattr(pieces, "format_named", lambda name: Spied(real(name)))


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_the_next_tasks_first_read_overlaps_this_tasks_last_encode(tmp_path, tok, three_tasks, monkeypatch, command):
    """The encode of each task's last document waits (at most 3 s) for the next task's read to begin: read
    ahead across the tasks' edges it does at once; read task by task it could not begin before this encode
    ended (each task's first read left the encoder idle). ``pack --tokenizer --local`` and ``tokenize
    --local`` alike; the packed bytes are the held path's."""
    import raypack.tokenize.pieces as pieces

    started = {name: threading.Event() for name in ("a", "b", "c")}
    overlapped = []
    _spy_reads(monkeypatch, lambda path: started[os.path.basename(path)[0]].set())
    real_encode = pieces.encode_naming

    def encode_naming(tokenizer, texts, *args, **kwargs):
        last = texts[len(texts) - 1].as_py()
        for k, following in ((0, "b"), (1, "c")):
            if last == THREE[k][-1]:
                overlapped.append(started[following].wait(timeout=3))
        return real_encode(tokenizer, texts, *args, **kwargs)

    monkeypatch.setattr(pieces, "encode_naming", encode_naming)
    if command == "tokenize":
        run_tokenize(TokenizeConfig(inputs=(three_tasks,), output=str(tmp_path / "tokenized"), text=text(tok)),
                     engine="local")
        assert overlapped == [True, True]
        return
    run(tmp_path, three_tasks, tok, "streamed", 2)
    monkeypatch.undo()
    assert overlapped == [True, True]
    run(tmp_path, three_tasks, tok, "held", 1)
    assert files(tmp_path / "streamed") == files(tmp_path / "held")


@pytest.mark.parametrize("refused_in_a", [True, False])
def test_a_read_error_met_ahead_is_raised_in_its_tasks_turn(tmp_path, tok, three_tasks, monkeypatch, refused_in_a):
    """b.parquet's read fails. Read ahead, it fails while a.parquet is still being encoded; the error said is
    the one the held path (task by task) says: a.parquet's refused document where a has one, else b's read
    error. Nothing is left behind either way."""
    limit = 10**6
    if refused_in_a:
        docs = THREE[0][:5] + ["lorem ipsum dolor " * 400] + THREE[0][6:]
        pq.write_table(pa.table({"text": docs}), os.path.join(three_tasks, "a.parquet"))
        limit = 600

    def on_read(path):
        if path.endswith("b.parquet"):
            raise InputError(f"{path} row 0: a damaged page (a test's); rewrite the file")

    _spy_reads(monkeypatch, on_read)
    said = []
    for workers in (1, 2):
        parent = tmp_path / str(workers)
        parent.mkdir()
        with pytest.raises(InputError) as e:
            run(parent, three_tasks, tok, "out", workers, max_document_tokens=limit)
        said.append(str(e.value))
        assert os.listdir(parent) == []
    assert said[0] == said[1], said
    assert ("a.parquet row 5" in said[0]) if refused_in_a else ("damaged page" in said[0]), said


GIGATOKEN = pytest.param("gigatoken", marks=pytest.mark.skipif(BACKENDS["gigatoken"].version() is None,
                                                                reason="gigatoken is not installed"))


@pytest.mark.parametrize("backend", ["reference", GIGATOKEN])
@pytest.mark.parametrize("middle", [[], ["", "", ""], ["x"]])
def test_tasks_read_ahead_around_an_empty_or_tiny_task_give_the_held_paths_bytes(tmp_path, tok, three_tasks, middle,
                                                                                 backend):
    """b.parquet holds no document, only empty ones, or one of one character: the tasks around it are read and
    encoded across its edges (with gigatoken, two calls in flight across them); the bytes are those of
    ``--workers 1``, which reads and encodes task by task."""
    pq.write_table(pa.table({"text": pa.array(middle, pa.string())}), os.path.join(three_tasks, "b.parquet"))
    streamed = run(tmp_path, three_tasks, tok, "streamed", 2, backend)
    run(tmp_path, three_tasks, tok, "held", 1, backend)
    assert files(tmp_path / "streamed") == files(tmp_path / "held")
    assert streamed.manifest["counts"]["documents"] == 40 + len(middle)
