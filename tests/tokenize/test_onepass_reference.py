"""``pack --tokenizer`` (``--local``, and on Ray), and ``tokenize`` then ``pack``, against a naive reference,
whatever the split (hypothesis).

The reference is written here from the rules alone: each text encoded by ``tokenizers`` itself
(``encode(text, add_special_tokens=False)``) between the BOS and EOS asked for, cut or dropped by
``long_docs``, then packed by tests/reference.py one token at a time: concat over the whole stream;
best_fit shard by shard, where with text in a shard is a task (README: ``--task-rows`` and
``--task-bytes`` move best_fit's windows), each task checked here to hold the rows of its row
groups, or the lines of its byte range, in order.

The job is free to split the work: Parquet files of any row groups or JSON Lines files (LF or CRLF,
cut into tasks at any byte), empty files, texts that are empty or hold a special token's string,
tasks of one row group or of many (``task_rows``, ``task_bytes``), a held task's ids past a few
sent to its spill file (``held_tokens``), reads of any rows, encode calls of any bytes, one packer
(each task held) or two (tasks read and encoded ahead across their edges,
raypack.tokenize.pieces.EncodeAhead), the reference tokenizer, auto or each installed fast backend.
None of it may change a byte of the chunks, nor may a run killed in any task and resumed; and each
output passes ``raypack verify`` and ``verify --check-tokenizer`` over every document.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raypack.tokenize.job as tokenize_job
import raypack.tokenize.onepass as onepass
from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.tokenize.backends import BACKENDS
from raypack.tokenize.job import TextOptions, TokenizeConfig, run_tokenize
from raypack.verify import verify_output
from raypack.verify.tokenizer import check_tokenizer

from helpers import CORPUS, read_output, train_byte_level_bpe
from reference import naive_best_fit, naive_pack

BACKEND_NAMES = ["reference", "auto",
                 *(name for name in ("gigatoken", "fastokens") if BACKENDS[name].version() is not None)]

# Pieces of text: ASCII and words the tokenizer merged, multi-byte characters (2, 3 and 4 bytes),
# a combining accent, whitespace runs and newlines, a special token's string inside the text.
PIECES = ["a", "b", " ", "  ", "\n", "\t", "the", " quick", "fox", "é", "e\u0301", "ĉ", "東京", "😀", "👍🏽",
          "<bos>", "<eos>", "42", "!"]
TEXT = st.lists(st.sampled_from(PIECES), max_size=14).map("".join)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    reference = train_byte_level_bpe(CORPUS * 20, 400)
    reference.save(str(path))
    return reference, str(path)


@st.composite
def cases(draw):
    texts = draw(st.lists(TEXT, min_size=1, max_size=40))
    files = draw(st.integers(1, 3))
    cuts = sorted(draw(st.lists(st.integers(0, len(texts)), min_size=files - 1, max_size=files - 1)))
    return dict(
        texts=texts, cuts=cuts, fmt=draw(st.sampled_from(["parquet", "jsonl"])), crlf=draw(st.booleans()),
        row_group=draw(st.integers(1, 8)), context_length=draw(st.integers(1, 24)),
        strategy=draw(st.sampled_from(["concat", "concat", "best_fit"])), window=draw(st.integers(0, 5)),
        workers=draw(st.sampled_from([1, 2])), backend=draw(st.sampled_from(BACKEND_NAMES)),
        task_rows=draw(st.integers(1, 24)), task_bytes=draw(st.sampled_from([1, 40, 400, 64 << 20])),
        batch_rows=draw(st.integers(1, 9)), batch_bytes=draw(st.sampled_from([1, 12, 100, 1 << 20])),
        held_tokens=draw(st.sampled_from([None, 1, 7, 30])),
        long_docs=draw(st.sampled_from(["split", "truncate", "drop"])),
        bos=draw(st.sampled_from([None, None, "<bos>"])), eos=draw(st.sampled_from([None, None, "<eos>", 1])),
    )


def holding_at_most(monkeypatch: pytest.MonkeyPatch, tokens: int | None) -> None:
    """Each held task keeps at most ``tokens`` ids in memory, the rest in its spill file (None: as set)."""
    if tokens is None:
        return
    real = tokenize_job._text_settings

    def settings(*args, **kwargs):
        values, options = real(*args, **kwargs)
        return dataclasses.replace(values, held_tokens=tokens), options

    monkeypatch.setattr(tokenize_job, "_text_settings", settings)


def write_files(root, case: dict) -> tuple[str, list[tuple[int, int]], list[list[int]]]:
    """The texts as files split at the cuts (some may be empty): Parquet of ``row_group`` rows a row
    group, or JSON Lines (non-ASCII as is, lines ending CRLF or LF); the dir, each file's documents,
    and for JSON Lines each line's first byte."""
    os.makedirs(root, exist_ok=True)
    texts, bounds = case["texts"], [0, *case["cuts"], len(case["texts"])]
    ranges, line_starts = list(zip(bounds, bounds[1:])), []
    for k, (a, b) in enumerate(ranges):
        path = os.path.join(root, f"t-{k}.{case['fmt']}")
        if case["fmt"] == "parquet":
            table = pa.table({"text": pa.array(texts[a:b], pa.string())})
            pq.write_table(table, path, row_group_size=case["row_group"])
            continue
        lines = [(json.dumps({"text": t}, ensure_ascii=False) + ("\r\n" if case["crlf"] else "\n")).encode()
                 for t in texts[a:b]]
        with open(path, "wb") as f:
            f.write(b"".join(lines))
        line_starts.append(np.cumsum([0, *map(len, lines)])[:-1].tolist())
    return str(root), ranges, line_starts


def task_ranges(manifest: dict, ranges: list[tuple[int, int]], line_starts: list[list[int]], case: dict
                ) -> list[tuple[int, int]]:
    """Each shard's (task's) documents, tiling the corpus in order: the rows of its row groups, or the
    lines whose line before ends in its byte range (the first line: the first task's), of its file."""
    got, at = [], 0
    for shard in manifest["shards"]:
        text = shard["source"] if "source" in shard else {"path": shard["path"], **shard["text"]}  # a tokenized part's
        k = int(os.path.basename(text["path"]).split(".")[0][2:])
        file_start, file_end = ranges[k]
        start, end = text["start"], text["end"]
        if case["fmt"] == "parquet":
            a, b = file_start + start * case["row_group"], min(file_end, file_start + end * case["row_group"])
        else:
            owners = [max(s - 1, 0) for s in line_starts[k]]  # a line goes with the byte that ends the line before
            a, b = file_start + sum(o < start for o in owners), file_start + sum(o < end for o in owners)
        assert (shard["doc_offset"], shard["num_docs"]) == (a, b - a) and a == at, shard
        got.append((a, b))
        at = b
    assert at == len(case["texts"])
    return got


def documents(reference, case: dict) -> list[list[int]]:
    """Each text's ids as the rules pack them: ``tokenizers``' encode between the BOS and EOS asked for,
    then ``long_docs`` (a document longer than C cut to its first C ids, or left empty: dropped)."""
    c = case["context_length"]
    def ids(given: str | int | None) -> list[int]:
        return [] if given is None else [given if isinstance(given, int) else reference.token_to_id(given)]

    bos, eos = ids(case["bos"]), ids(case["eos"])
    docs = [bos + reference.encode(t, add_special_tokens=False).ids + eos for t in case["texts"]]
    if case["long_docs"] == "truncate":
        return [doc[:c] for doc in docs]
    if case["long_docs"] == "drop":
        return [[] if len(doc) > c else doc for doc in docs]
    return docs


def expected(docs: list[list[int]], tasks: list[tuple[int, int]], case: dict) -> tuple[np.ndarray, np.ndarray]:
    c = case["context_length"]
    if case["strategy"] == "concat":
        return naive_pack(docs, c, 0, np.uint16)
    ids, doc_ids = [np.zeros((0, c), np.uint16)], [np.zeros((0, c), np.int64)]
    for a, b in tasks:
        part_ids, part_docs = naive_best_fit(docs[a:b], c, 0, case["window"], dtype=np.uint16)
        ids.append(part_ids)
        doc_ids.append(np.where(part_docs >= 0, part_docs + a, -1))
    return np.concatenate(ids), np.concatenate(doc_ids)


def check_the_one_pass(root, tok, case: dict, engine: str, two_step: bool = False) -> None:
    """Run ``case`` with ``engine`` into ``root``/out and compare it with the naive reference;
    ``two_step``: ``raypack tokenize`` into ``root``/tokenized, then pack that."""
    reference, path = tok
    inputs, ranges, line_starts = write_files(root / "text", case)
    extra = {"best_fit_window": case["window"]} if case["strategy"] == "best_fit" else {}
    config = make_config(dict(inputs=[inputs], output=str(root / "out"), context_length=case["context_length"],
                              num_workers=case["workers"], strategy=case["strategy"], long_docs=case["long_docs"],
                              **extra))
    text = TextOptions(tokenizer=path, tokenizer_backend=case["backend"], task_rows=case["task_rows"],
                       task_bytes=case["task_bytes"], batch_rows=case["batch_rows"], batch_bytes=case["batch_bytes"],
                       bos=case["bos"], eos=case["eos"])
    with pytest.MonkeyPatch.context() as monkeypatch:
        holding_at_most(monkeypatch, case["held_tokens"])
        if two_step:
            tokenized = str(root / "tokenized")
            run_tokenize(TokenizeConfig(inputs=(inputs,), output=tokenized, text=text, num_workers=case["workers"]),
                         engine=engine)
            run_pack(dataclasses.replace(config, inputs=(tokenized,)), engine=engine)
        else:
            run_pack(config, engine=engine, text=text)

    docs = documents(reference, case)
    input_ids, doc_ids, manifest = read_output(str(root / "out"))
    want_ids, want_docs = expected(docs, task_ranges(manifest, ranges, line_starts, case), case)
    np.testing.assert_array_equal(input_ids, want_ids)
    np.testing.assert_array_equal(doc_ids, want_docs)
    assert manifest["token_dtype"] == "uint16"
    assert manifest["counts"]["documents"] == len(docs) and manifest["counts"]["tokens"] == sum(map(len, docs))
    assert manifest["counts"]["chunks"] == len(want_ids)
    assert manifest["counts"]["padding_positions"] == int((want_docs == -1).sum())
    verify_output(str(root / "out"))  # the structure, the content digest and the counts
    said = check_tokenizer(str(root / "out"), num_docs=len(docs))  # every document re-encoded by the reference
    assert said[0].split()[:3] == ["tokenizer", f"{len(docs):,}", "documents"], said


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_one_pass_equals_the_naive_reference_whatever_the_split(tmp_path_factory, tok, case):
    check_the_one_pass(tmp_path_factory.mktemp("case"), tok, case, "local")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_tokenize_then_pack_equals_the_naive_reference_whatever_the_split(tmp_path_factory, tok, case):
    """``raypack tokenize --local`` (texts read and encoded ahead across its tasks), then ``pack`` of
    the tokenized corpus: the same chunks (a tokenized part is the pack's shard, as a task is)."""
    check_the_one_pass(tmp_path_factory.mktemp("case"), tok, case, "local", two_step=True)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_ray_one_pass_equals_the_naive_reference_whatever_the_split(ray_session, tmp_path_factory, tok, case):
    """The same on Ray: text tasks placed on 1 or 2 packer actors as they report their counts."""
    check_the_one_pass(tmp_path_factory.mktemp("case"), tok, case, "ray")


def chunk_files(out) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in sorted(os.listdir(out)) if name.endswith(".arrow")}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases(), crash=st.integers(0, 60), workers=st.sampled_from([1, 2]), backend=st.sampled_from(BACKEND_NAMES),
       batch_rows=st.integers(1, 9))
def test_a_run_killed_in_any_task_resumes_to_the_same_bytes(tmp_path_factory, tok, case, crash, workers, backend,
                                                             batch_rows):
    """Killed while packing any task, then resumed with other packers, reads and backend (none of them
    output settings): the chunk files are those of a run never killed, and of the naive reference."""
    reference, path = tok
    root = tmp_path_factory.mktemp("case")
    inputs, ranges, line_starts = write_files(root / "text", case)
    extra = {"best_fit_window": case["window"]} if case["strategy"] == "best_fit" else {}

    def run(name: str, resume: bool = False, **changed):
        options = {**case, **changed}
        config = make_config(dict(inputs=[inputs], output=str(root / name), context_length=case["context_length"],
                                  num_workers=options["workers"], strategy=case["strategy"],
                                  long_docs=case["long_docs"], **extra))
        text = TextOptions(tokenizer=path, tokenizer_backend=options["backend"], task_rows=case["task_rows"],
                           task_bytes=case["task_bytes"], batch_rows=options["batch_rows"],
                           batch_bytes=case["batch_bytes"], bos=case["bos"], eos=case["eos"])
        return run_pack(config, engine="local", resume=resume, text=text)

    with pytest.MonkeyPatch.context() as monkeypatch:
        holding_at_most(monkeypatch, case["held_tokens"])
        clean = run("clean")
    killed_at = crash % len(clean.manifest["shards"])
    real = onepass.pack_documents

    def killed(task, *args, **kwargs):
        if task.task_index == killed_at:
            raise RuntimeError(f"killed while packing task {killed_at}")
        return real(task, *args, **kwargs)

    with pytest.MonkeyPatch.context() as monkeypatch:
        holding_at_most(monkeypatch, case["held_tokens"])
        monkeypatch.setattr(onepass, "pack_documents", killed)
        with pytest.raises(RuntimeError, match="killed"):
            run("out")
    assert not (root / "out" / "manifest.json").exists()
    resumed = run("out", resume=True, workers=workers, backend=backend, batch_rows=batch_rows)
    if resumed.manifest["tokenizer"]["backends"] == clean.manifest["tokenizer"]["backends"]:
        assert resumed.kept[0] >= killed_at  # the tasks before the one killed were kept, not redone

    assert chunk_files(root / "out") == chunk_files(root / "clean")
    assert resumed.manifest["content_sha256"] == clean.manifest["content_sha256"]
    assert resumed.manifest["shards"] == clean.manifest["shards"]
    input_ids, doc_ids, manifest = read_output(str(root / "out"))
    want_ids, want_docs = expected(documents(reference, case), task_ranges(manifest, ranges, line_starts, case), case)
    np.testing.assert_array_equal(input_ids, want_ids)
    np.testing.assert_array_equal(doc_ids, want_docs)
