"""Text readers (raypack.inputs.parquet, .jsonl): every row read once, in order, whatever the split; bad input."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from raypack.errors import InputError
from raypack.inputs.jsonl import iter_jsonl_texts, jsonl_byte_range_tasks
from raypack.inputs.parquet import iter_parquet_texts, parquet_row_group_tasks, text_batch_rows

TEXTS = ["first", "", "東京 😀", "שלום مرحبا", "  ", "line\nwith newline escaped", "x" * 1000, "last"]


def write_jsonl(path, texts, *, newline_at_end=True, compress=None, extra=None):
    lines = [json.dumps({"id": i, "text": t, **(extra or {})}, ensure_ascii=i % 2 == 0) for i, t in enumerate(texts)]
    data = ("\n".join(lines) + ("\n" if newline_at_end else "")).encode()
    if compress == "gzip":
        data = gzip.compress(data)
    elif compress == "zstd":
        data = pa.compress(data, "zstd", asbytes=True)
    path.write_bytes(data)
    return path


def read_jsonl_tasks(path, tasks, column="text", batch_rows=3, block_bytes=1 << 20):
    """Texts of all tasks in task order, and each task's row count."""
    texts, counts = [], []
    for start, end in tasks:
        rows = 0
        for first_row, batch in iter_jsonl_texts(str(path), column, start, end, batch_rows, block_bytes=block_bytes):
            assert first_row == rows and len(batch) <= batch_rows
            texts += batch.to_pylist()
            rows += len(batch)
        counts.append(rows)
    return texts, counts


# ---------------------------------------------------------------------------------------------
# JSON Lines: splits


def test_jsonl_whole_file(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    assert jsonl_byte_range_tasks(str(path), 1 << 20) == [(0, path.stat().st_size)]
    texts, counts = read_jsonl_tasks(path, [(0, None)])
    assert texts == TEXTS and counts == [len(TEXTS)]


def test_jsonl_ranges_split_lines_and_leave_empty_ranges(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    tasks = jsonl_byte_range_tasks(str(path), 16)
    assert len(tasks) > len(TEXTS)  # more ranges than lines: some hold no line start
    assert tasks[0][0] == 0 and tasks[-1][1] == path.stat().st_size
    assert all(a[1] == b[0] for a, b in zip(tasks, tasks[1:]))
    texts, counts = read_jsonl_tasks(path, tasks)
    assert texts == TEXTS
    assert 0 in counts and sum(counts) == len(TEXTS)


def test_jsonl_range_starting_exactly_at_a_line(tmp_path):
    """A nominal start right at a line start: that line belongs to the range before."""
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text":"a"}\n{"text":"b"}\n{"text":"c"}\n')
    line_len = len(b'{"text":"a"}\n')
    assert read_jsonl_tasks(path, [(0, line_len)])[0] == ["a", "b"]
    assert read_jsonl_tasks(path, [(line_len, 2 * line_len)])[0] == ["c"]
    assert read_jsonl_tasks(path, [(line_len - 1, line_len)])[0] == ["b"]


@settings(max_examples=150, deadline=None)
@given(
    line_lens=st.lists(st.integers(0, 40), min_size=0, max_size=30),
    target_bytes=st.integers(1, 120),
    newline_at_end=st.booleans(),
    block_bytes=st.sampled_from([1, 7, 64, 1 << 20]),
    blank_every=st.integers(0, 5),
    blank=st.sampled_from(["", "  ", "\t ", " \r"]),
    line_end=st.sampled_from(["", "\r", " "]),
)
def test_jsonl_ranges_cover_every_line_once(tmp_path_factory, line_lens, target_bytes, newline_at_end, block_bytes,
                                            blank_every, blank, line_end):
    texts = [("é" if n % 3 == 0 else "a") * n for n in line_lens]
    lines = [json.dumps({"text": t}, ensure_ascii=False) + line_end for t in texts]
    if blank_every:
        lines = [x for i, line in enumerate(lines) for x in ([line, blank] if i % blank_every == 0 else [line])]
    path = tmp_path_factory.mktemp("j") / "a.jsonl"
    path.write_bytes(("\n".join(lines) + ("\n" if newline_at_end and lines else "")).encode())
    tasks = jsonl_byte_range_tasks(str(path), target_bytes)
    got, counts = read_jsonl_tasks(path, tasks, block_bytes=block_bytes)
    assert got == texts
    assert sum(counts) == len(texts)


@pytest.mark.parametrize("compress, suffix", [("gzip", ".jsonl.gz"), ("zstd", ".jsonl.zst")])
def test_jsonl_compressed_is_one_task(tmp_path, compress, suffix):
    path = write_jsonl(tmp_path / f"a{suffix}", TEXTS * 50, compress=compress)
    tasks = jsonl_byte_range_tasks(str(path), 10)
    assert tasks == [(0, path.stat().st_size)]
    assert read_jsonl_tasks(path, tasks, block_bytes=100)[0] == TEXTS * 50
    with pytest.raises(ValueError, match=r"compressed \(.*\) and can only be read whole"):
        next(iter_jsonl_texts(str(path), start=5))


@pytest.mark.parametrize("target_bytes", [1, 20, 1000])
@pytest.mark.parametrize("block_bytes", [16, 1 << 20])
def test_jsonl_with_a_bom_at_its_start_is_read(tmp_path, target_bytes, block_bytes):
    """A UTF-8 BOM before the first line (Windows editors write one): read, whatever the split. The check that
    each line is one object refused it as "not JSON" (this stop's trial of the check, before it landed)."""
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "a"}\n{"text": "b"}\n{"text": "c"}\n')
    tasks = jsonl_byte_range_tasks(str(path), target_bytes)
    assert read_jsonl_tasks(path, tasks, block_bytes=block_bytes)[0] == ["a", "b", "c"]


def test_jsonl_other_column_and_empty_file(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"body": "x", "text": 1}\n\n{"body": "y"}\n')
    assert read_jsonl_tasks(path, [(0, None)], column="body")[0] == ["x", "y"]
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    assert jsonl_byte_range_tasks(str(empty), 10) == [(0, 0)]
    assert read_jsonl_tasks(empty, [(0, 0)]) == ([], [0])
    blank = tmp_path / "b.jsonl"
    blank.write_bytes(b"\n\n  \n")
    assert read_jsonl_tasks(blank, [(0, None)]) == ([], [0])


def _object_lines_reference(data: bytes) -> int:
    """The line count's rule, written the plain way (substring searches and a split): the lines that are
    not blank, or -1 where one of them does not both start with ``{`` and end with ``}``; where no line is
    blank and no blank sits beside a newline, every newline ends a line."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if data[:1].isspace() or (data[-1:].isspace() and not data.endswith(b"\n")) or \
            any(blank in data for blank in (b"\n\n", b"\n ", b" \n", b"\r", b"\t")):
        lines = [line.strip() for line in data.split(b"\n")]
        lines = [line for line in lines if line]
        return len(lines) if all(line[:1] == b"{" and line[-1:] == b"}" for line in lines) else -1
    if not data:
        return 0
    lines = data[:-1].split(b"\n") if data.endswith(b"\n") else data.split(b"\n")
    return len(lines) if all(line[:1] == b"{" and line[-1:] == b"}" for line in lines) else -1


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from([b"{", b"}", b"{}", b'{"text": "a b"}', b"\n", b" ", b"\r", b"\t", b"\x0b",
                                 b"x", b"\n\n", b"\xef\xbb\xbf"]), max_size=30))
@example([b"{}", b" ", b"\n", b"{}", b"\n"])  # a blank before a newline
@example([b"{}", b"\n", b" ", b"{}", b"\n"])  # after one
@example([b"{}", b"\n\n", b"{}"])  # a blank line
@example([b"\xef\xbb\xbf", b"{}", b"\n", b"{}"])
@example([b"{}", b"\r", b"\n", b"{}", b"\t"])
def test_the_jsonl_line_count_agrees_with_a_plain_reference(parts):
    """The reader's line count (numpy over the block, blanks beside newlines found by gathers) equals
    the plain rule on any mix of objects, braces, newlines, blanks, carriage returns, tabs and BOMs."""
    from raypack.inputs.jsonl import _object_lines

    data = b"".join(parts)
    assert _object_lines(data) == _object_lines_reference(data), data


# ---------------------------------------------------------------------------------------------
# JSON Lines: bad input


BAD_LINES = [
    (b'{"text": "ok"}\n{"text": "\xff"}\n', r"a\.jsonl line 2: invalid UTF-8 \(byte 0xff"),
    (b'{"text": "ok"}\n{"text": "\xed\xa0\x80"}\n', r"line 2: invalid UTF-8 \(byte 0xed"),
    (b'{"text": "\\ud800"}\n', r"line 1: 'text' holds an unpaired surrogate"),
    (b'{"text": "ok"}\n\n{"text": null}\n', r"line 3: 'text' is a JSON null, not a string"),
    (b'{"text": "ok"}\n{"text": 5}\n', r"line 2: 'text' is a JSON number, not a string"),
    (b'{"text": ["a"]}\n', r"line 1: 'text' is a JSON array, not a string"),
    (b'{"text": {"a": 1}}\n', r"line 1: 'text' is a JSON object, not a string"),  # it named a private class
    (b'{"text": "ok"}\n{"body": "x", "id": 1}\n',
     r"line 2: no key 'text' \(keys: body, id; if one of them holds the text, pass it with --text-column\); fix"),
    (b'{"text": "ok"}\n[1, 2]\n', r"line 2: a JSON array where an object was expected"),
    (b'{"text": "ok"}\n"just a string"\n', r"line 2: a JSON string where an object was expected"),
    (b'{"text": "ok"}\nnot json\n', r"line 2: not JSON \(Expecting value at column 1; JSON Lines holds one whole "
                                    r"object on each line\)"),
    # two objects on a line, and one across lines (pretty-printed): read as two and one before, whatever the
    # lines, so the file was read or refused by how its tasks were cut (a hostile trial)
    (b'{"text": "ok"}\n{"text": "a"} {"text": "b"}\n', r"line 2: not JSON \(Extra data at column 15; JSON Lines"),
    (b'{"text": "ok"}\n\n{\n  "text": "a"\n}\n', r"line 3: not JSON \(Expecting property name enclosed in double "
                                                 r"quotes at column 2; JSON Lines holds one whole object on each line"),
    # both at once: a line of two objects beside an object over two lines balance the count of lines (a
    # later trial: read at --task-bytes 1000, refused at 30), with and without a blank line in the block
    (b'{"text":"a"} {"text":"b"}\n{"text":\n"c"}\n', r"line 1: not JSON \(Extra data at column 14"),
    (b'{"text":"a"} {"text":"b"}\n\n{"text":\n"c"}\n', r"line 1: not JSON \(Extra data at column 14"),
    (b'{"text":"a"}\n{"text":{"k":1}\n,"id":2}\n', r"line 2: not JSON \(Expecting ',' delimiter"),
    # a value Arrow refuses in a key that is not read (Python's json reads both): it said "lines 1-5001" of
    # a 5,000-line file, naming no line (a trial); now the line, and why
    (b'{"text": "ok"}\n{"text": "fine", "meta": "\\udc00"}\n{"text": "ok"}\n',
     r"a\.jsonl line 2: JSON that Arrow's parser refuses \(JSON parse error: The surrogate pair in string is "
     r"invalid\.\) outside the 'text' value \(only 'text' is read, but each line is parsed whole\); fix or drop "
     r"that line$"),
    (b'{"text": "a", "n": 1e999}\n', r"line 1: JSON that Arrow's parser refuses \(JSON parse error: Number too big"),
    (b'{"text": "ok"}\n{"text": "a", "id": {"k": 1, "k": 2}, "text": "b"}\n',
     r"line 2: the key 'text' appears 2 times \(which one is the text\?\); fix or drop that line"),
    # the file's form, not a line (new-user and operator trials): said so, with the conversion
    (b'[{"text": "a"}, {"text": "b"}]\n', r"a\.jsonl line 1: a JSON array of objects: the file is one JSON document, "
                                         r"not JSON Lines \(one object on each line\); write one object a line, "
                                         r"e\.g\. jq -c '\.\[\]' FILE$"),
    (b'[\n{"text": "a"},\n{"text": "b"}\n]\n', r"line 1: a JSON array of objects: the file is one JSON document"),
    (b'{"text": "a"}\r{"text": "b"}\r', r"line 1: not JSON \(its lines end with a carriage return alone, \\r, not "
                                      r"\\n: convert them to \\n, e\.g\. tr '\\r' '\\n'\)$"),
    (b'{"text": "a"}\r\n{"text": "b"}\r\n[1]\r\n', r"line 3: a JSON array where an object was expected"),  # CRLF: fine
    # nested past Python's parser (an operator's trial: RecursionError, a traceback and the run's work kept)
    (b'{"text": "ok"}\n{"text": ' + b"[" * 5000 + b"]" * 5000 + b"}\n",
     r"line 2: JSON nested too deeply to parse \(arrays or objects over [\d,]+ levels deep\); each line must be one "
     r"object whose text is a string; fix or drop that line$"),
    (b'{"text": "ok"}\n' + b'{"x":' * 5000 + b"1" + b"}" * 5000 + b"\n", r"line 2: JSON nested too deeply"),
]


@pytest.mark.parametrize("data, match", BAD_LINES)
def test_jsonl_bad_line(tmp_path, data, match):
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    with pytest.raises(InputError, match=match):
        list(iter_jsonl_texts(str(path)))


@pytest.mark.parametrize("max_text_bytes", [1, 10_000])
def test_a_line_over_the_hard_limit_does_not_say_to_raise_max_document_bytes(tmp_path, monkeypatch, max_text_bytes):
    """Past MAX_LINE_BYTES (1 GiB) no --max-document-bytes reads a line, and the line said to raise it (a hostile
    trial: a 5 GB line with the limit at 2 GB); under it, raising the limit is the fix, and the line says so."""
    import raypack.inputs.jsonl as jsonl

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 2_000)
    path = write_jsonl(tmp_path / "a.jsonl", ["short", "x" * 5_000])
    with pytest.raises(InputError) as e:
        list(iter_jsonl_texts(str(path), max_text_bytes=max_text_bytes, block_bytes=1_000))
    said = str(e.value)
    assert said.startswith(f"{path}: line 2 is longer than 2,000 bytes, raypack's longest JSON line whatever "
                           f"max_document_bytes (here {max_text_bytes:,}); split the document upstream"), said
    assert "raise" not in said


def test_jsonl_bad_line_number_is_the_file_line_in_a_later_range_and_block(tmp_path):
    good = [json.dumps({"text": f"doc {i}"}).encode() for i in range(200)]
    data = b"\n".join(good[:150] + [b'{"text": "\xff"}'] + good[150:]) + b"\n"
    path = tmp_path / "a.jsonl"
    path.write_bytes(data)
    tasks = jsonl_byte_range_tasks(str(path), 500)
    with pytest.raises(InputError, match=r"a\.jsonl line 151: invalid UTF-8"):
        read_jsonl_tasks(path, tasks, block_bytes=64)
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(data))
    with pytest.raises(InputError, match=r"a\.jsonl\.gz line 151: invalid UTF-8"):
        read_jsonl_tasks(gz, [(0, None)], block_bytes=64)


def test_jsonl_missing_file_and_corrupt_gzip(tmp_path):
    with pytest.raises(InputError, match=r"text file not found: .*nope\.jsonl"):
        jsonl_byte_range_tasks(str(tmp_path / "nope.jsonl"), 10)
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(b"not gzip at all")
    with pytest.raises(InputError, match=r"a\.jsonl\.gz: cannot read"):
        list(iter_jsonl_texts(str(path)))


# ---------------------------------------------------------------------------------------------
# Parquet


def write_parquet(path, texts, row_group_size, text_type=pa.string()):
    table = pa.table({"id": list(range(len(texts))), "text": pa.array(texts, text_type)})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@pytest.mark.parametrize("text_type", [pa.string(), pa.large_string()])
@pytest.mark.parametrize("row_group_size, target_rows, batch_rows",
                         [(3, None, 2), (3, 4, 1), (2, 100, 5), (100, None, 3)])
def test_parquet_tasks_cover_every_row_in_order(tmp_path, text_type, row_group_size, target_rows, batch_rows):
    path = write_parquet(tmp_path / "a.parquet", TEXTS, row_group_size, text_type)
    tasks = parquet_row_group_tasks(str(path), target_rows=target_rows)
    assert tasks[0].row_group_start == 0 and all(a.row_group_end == b.row_group_start for a, b in zip(tasks, tasks[1:]))
    got = []
    for task in tasks:
        rows = 0
        for first_row, batch in iter_parquet_texts(str(path), "text", task[:2], batch_rows):
            assert first_row == rows and len(batch) <= batch_rows and batch.type == text_type
            got += batch.to_pylist()
            rows += len(batch)
        assert rows == task.num_rows
    assert got == TEXTS


def test_parquet_text_batches_hold_about_batch_bytes_of_long_texts(tmp_path):
    """Long texts in one big row group (a book corpus written with pyarrow's defaults) are read a
    few at a time, not ``batch_rows`` at once (which was gigabytes); short ones ``batch_rows`` at once."""
    books = [chr(ord("a") + i % 26) * (10_000 + 37 * i) for i in range(120)]  # ~1.5 MB, one row group
    path = write_parquet(tmp_path / "books.parquet", books, 10**6)
    batch_bytes = 64_000
    got, sizes = [], []
    for first_row, batch in iter_parquet_texts(str(path), "text", None, 1024, batch_bytes=batch_bytes):
        assert first_row == len(got)
        got += batch.to_pylist()
        sizes.append(sum(map(len, batch.to_pylist())))
    assert got == books
    assert len(sizes) > 10 and max(sizes) <= 2 * batch_bytes  # rows at the mean size: ~5 of ~12.2 kB
    short = write_parquet(tmp_path / "short.parquet", ["ab"] * 3000, 10**6)
    assert [len(b) for _, b in iter_parquet_texts(str(short), "text", None, 1024, batch_bytes=batch_bytes)] == \
        [1024, 1024, 952]


def test_text_batch_rows_from_the_footer(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", ["x" * 1000] * 100, 50)
    metadata = pq.ParquetFile(path).metadata
    size = metadata.row_group(0).column(1).total_uncompressed_size  # the text column's, not the row group's
    assert text_batch_rows(metadata, 0, "text", 1024, size) == 50
    assert text_batch_rows(metadata, 1, "text", 1024, size // 5) in (9, 10)
    assert text_batch_rows(metadata, 0, "text", 7, size) == 7  # never more than batch_rows
    assert text_batch_rows(metadata, 0, "text", 1024, 1) == 1  # never fewer than one row
    assert text_batch_rows(metadata, 0, "nope", 1024, metadata.row_group(0).total_byte_size) == 50


def test_a_damaged_column_beside_the_text_does_not_abort_the_read(tmp_path):
    """pyarrow's ``RowGroupMetaData.column(i)`` aborts the process (SIGABRT, an uncaught C++ exception)
    on a column chunk whose level histogram does not fit its schema (apache/arrow#45283's check): here
    the 'meta' column, made REQUIRED in the footer. The text reader builds the text column's chunk
    metadata only, so a file whose other column is damaged reads (in a child: an abort would end pytest)."""
    import subprocess
    import sys

    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"meta": [f"m{i}" if i % 3 else None for i in range(50)],
                             "text": [f"doc {i}" for i in range(50)]}), path)
    data = bytearray(path.read_bytes())
    at = data.index(b"\x25\x02\x18\x04meta", len(data) - 8 - int.from_bytes(data[-8:-4], "little"))
    data[at + 1] = 0  # the repetition type of 'meta': OPTIONAL -> REQUIRED
    path.write_bytes(bytes(data))

    def child(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)

    damaged = child("import sys, pyarrow.parquet as pq; pq.ParquetFile(sys.argv[1]).metadata.row_group(0).column(0)")
    assert damaged.returncode != 0 and "histogram size mismatch" in damaged.stderr  # so this test can fail
    read = child("import sys; from raypack.inputs.parquet import iter_parquet_texts; "
                 "print(sum(len(t) for _, t in iter_parquet_texts(sys.argv[1])))")
    assert read.returncode == 0 and read.stdout.strip() == "50", read.stderr[-500:]


def test_a_tokenized_file_given_as_text_says_to_drop_the_tokenizer(tmp_path):
    """It said to pass --text-column, which a file of token ids has none for."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2]], pa.list_(pa.int32()))}), path)
    with pytest.raises(InputError, match=r"has no column 'text'; its columns: input_ids; if 'input_ids' holds token "
                                         r"ids, the file is tokenized already: pack it with `raypack pack`, "
                                         r"no --tokenizer$"):
        list(iter_parquet_texts(str(path), "text"))


def test_a_column_path_that_is_not_utf8_in_the_footer_is_read_by_position(tmp_path):
    """A flipped byte in a column chunk's path_in_schema (not the schema's name) was a UnicodeDecodeError
    traceback: the path only sizes the batches, so they are sized from the row group, and the texts,
    read by the schema, are all there."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": [f"document {i}" for i in range(100)]}), path, row_group_size=10)
    data = bytearray(path.read_bytes())
    start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    data[data.index(b"text", data.index(b"text", start) + 4)] = 0x9C
    path.write_bytes(bytes(data))
    with pytest.raises(UnicodeDecodeError):
        pq.ParquetFile(path).metadata.row_group(0).column(0).path_in_schema  # what it met
    texts = [t for _, batch in iter_parquet_texts(str(path), "text") for t in batch.to_pylist()]
    assert texts == [f"document {i}" for i in range(100)]


@pytest.mark.parametrize("claimed, rows", [(0, 1024), (-5, 1024), (1, 1024), (2**62, 1), (100 * 16 << 20, 10)])
def test_text_batch_rows_from_a_footer_that_lies(claimed, rows):
    """Sizes come from the footer, which may lie: the batch stays within [1, batch_rows] rows."""

    class Column:
        path_in_schema, total_uncompressed_size = "text", claimed

    class RowGroup:
        num_rows, num_columns, total_byte_size = 1000, 1, claimed

        def column(self, i):
            return Column()

    class Leaf:
        path = "text"

    class Schema:
        def __len__(self):
            return 1

        def column(self, i):
            return Leaf()

    class Metadata:
        schema = Schema()

        def row_group(self, g):
            return RowGroup()

    assert text_batch_rows(Metadata(), 0, "text", 1024, 16 << 20) == rows


def test_parquet_row_group_tasks_literal(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", TEXTS, 3)  # row groups of 3, 3, 2 rows
    assert [t[:3] for t in parquet_row_group_tasks(str(path))] == [(0, 1, 3), (1, 2, 3), (2, 3, 2)]
    assert [t[:3] for t in parquet_row_group_tasks(str(path), target_rows=4)] == [(0, 2, 6), (2, 3, 2)]
    empty = tmp_path / "e.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), empty)
    assert sum(t.num_rows for t in parquet_row_group_tasks(str(empty))) == 0


def test_parquet_tasks_hold_at_most_target_bytes_of_row_groups(tmp_path):
    """A task is whole row groups holding at most target_bytes (the footer's uncompressed sizes),
    or one larger row group alone: a file 10x larger is 10x the tasks, not a 10x task."""
    texts = ["x" * 1000] * 40
    path = write_parquet(tmp_path / "a.parquet", texts, 4)  # 10 row groups of ~4 kB
    sizes = [pq.ParquetFile(path).metadata.row_group(g).total_byte_size for g in range(10)]
    one, two = sizes[0], sizes[0] + sizes[1]
    assert [t[:2] for t in parquet_row_group_tasks(str(path), target_rows=10**6, target_bytes=two)] == \
        [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    tasks = parquet_row_group_tasks(str(path), target_rows=10**6, target_bytes=one // 2)
    assert [t[:2] for t in tasks] == [(g, g + 1) for g in range(10)]  # each row group alone
    assert all(t.num_bytes <= two for t in parquet_row_group_tasks(str(path), target_rows=10**6,
                                                                   target_bytes=two + one // 2))
    assert len(parquet_row_group_tasks(str(path), target_rows=10**6, target_bytes=10**9)) == 1


def test_parquet_null_names_the_file_row(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", ["a", "b", "c", "d", None, "f"], 2)
    list(iter_parquet_texts(str(path), "text", (0, 2)))  # rows 0-3 are fine
    with pytest.raises(InputError, match=r"a\.parquet row 4: 'text' is null"):
        list(iter_parquet_texts(str(path), "text", (2, 3)))


def test_parquet_missing_column_lists_columns(tmp_path):
    path = write_parquet(tmp_path / "a.parquet", TEXTS, 3)
    with pytest.raises(InputError, match=r"a\.parquet has no column 'body'; its columns: id, text; its text column "
                                         r"is 'text': pass --text-column text$"):
        list(iter_parquet_texts(str(path), "body"))
    pq.write_table(pa.table({"a": ["x"], "b": ["y"], "n": [1]}), tmp_path / "b.parquet")
    with pytest.raises(InputError, match=r"pass --text-column with one of its text columns: a, b$"):
        list(iter_parquet_texts(str(tmp_path / "b.parquet"), "text"))
    pq.write_table(pa.table({"n": [1]}), tmp_path / "c.parquet")
    with pytest.raises(InputError, match=r"its columns: n; it has no text column to pass with --text-column$"):
        list(iter_parquet_texts(str(tmp_path / "c.parquet"), "text"))


@pytest.mark.parametrize("values, type_name",
                         [([1, 2], "int64"), ([["a"], []], "list<.*: string>")])
def test_parquet_non_string_column(tmp_path, values, type_name):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": values}), path)
    with pytest.raises(InputError, match=rf"column 'text' holds {type_name}, not text; it must hold strings"):
        list(iter_parquet_texts(str(path)))


TEXT_TYPES = {
    "large_string": lambda a: a.cast(pa.large_string()),
    "string_view": lambda a: a.cast(pa.string_view()),
    "binary": lambda a: a.cast(pa.binary()),
    "large_binary": lambda a: a.cast(pa.large_binary()),
    "binary_view": lambda a: a.cast(pa.binary_view()),
    "dictionary": lambda a: a.dictionary_encode(),
    "dictionary of large_string": lambda a: a.cast(pa.large_string()).dictionary_encode(),
}


@pytest.mark.parametrize("kind", sorted(TEXT_TYPES))
def test_parquet_text_of_any_string_type_reads_as_its_strings(tmp_path, kind):
    """What other writers give for text (polars' views, pandas' categoricals, binary from older
    writers) reads as the same strings, in batches the encoders take (string or large_string)."""
    texts = TEXTS * 3 + TEXTS[:2]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": TEXT_TYPES[kind](pa.array(texts))}), path, row_group_size=7)
    assert pq.read_schema(path).field("text").type != pa.string()
    read = list(iter_parquet_texts(str(path), "text", batch_rows=4))
    assert all(b.type in (pa.string(), pa.large_string()) for _, b in read)
    assert [t for _, b in read for t in b.to_pylist()] == texts


@pytest.mark.parametrize("kind", sorted(k for k in TEXT_TYPES if k.startswith("dictionary")))
@settings(max_examples=25, deadline=None)
@given(values=st.lists(st.integers(0, 3_000), min_size=1, max_size=6),
       picks=st.lists(st.integers(0, 5), min_size=0, max_size=300), batch_bytes=st.integers(1, 40_000))
def test_a_dictionary_of_long_texts_is_decoded_a_few_rows_at_a_time(tmp_path_factory, kind, values, picks,
                                                                    batch_bytes):
    """A dictionary stores a repeated text once, so the footer's mean row size (the batch's rows) says nothing
    of its decoded size: 8,192 rows naming one 1 MB text decoded to 8 GB at once (a hostile trial: a 1 MB file
    took a run to 2.1 GB, then a traceback). Each read now holds at most ``batch_bytes`` of text, or one row."""
    words = [chr(ord("a") + k) * n for k, n in enumerate(values)]
    texts = [words[p % len(words)] for p in picks]
    path = tmp_path_factory.mktemp("dict") / "a.parquet"
    pq.write_table(pa.table({"text": TEXT_TYPES[kind](pa.array(texts, pa.string()))}), path)
    assert pa.types.is_dictionary(pq.read_schema(path).field("text").type)
    read, rows = list(iter_parquet_texts(str(path), "text", batch_bytes=batch_bytes)), 0
    for first_row, batch in read:
        assert first_row == rows and batch.type in (pa.string(), pa.large_string())
        assert len(batch) == 1 or sum(map(len, batch.to_pylist())) <= batch_bytes
        rows += len(batch)
    assert [t for _, b in read for t in b.to_pylist()] == texts


def test_a_dictionary_index_outside_it_fails_as_arrows_decode_does():
    """Sliced decoding must not turn a bad index into numpy's IndexError (a traceback naming nothing)."""
    from raypack.inputs.text_arrays import text_slices

    bad = pa.DictionaryArray.from_arrays(pa.array([0, 5, 1], pa.int32()), pa.array(["a", "b"]), safe=False)
    with pytest.raises(pa.ArrowIndexError, match="Index 5 out of bounds"):
        list(text_slices(bad, 1))
    empty = pa.DictionaryArray.from_arrays(pa.array([None, None], pa.int32()), pa.array([], pa.string()))
    assert [a.to_pylist() for a in text_slices(empty, 1)] == [[None, None]]  # nulls only: refused by the reader


@pytest.mark.parametrize("kind", ["binary", "binary_view", "dictionary", "string_view"])
def test_parquet_text_of_another_type_names_a_null_or_invalid_row(tmp_path, kind):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": TEXT_TYPES[kind](pa.array(["a", "b", "c", None]))}), path)
    with pytest.raises(InputError, match=r"a\.parquet row 3: 'text' is null"):
        list(iter_parquet_texts(str(path)))
    if kind.startswith("binary"):
        pq.write_table(pa.table({"text": TEXT_TYPES[kind](pa.array([b"ab", b"c", b"\xff", b"d"]))}), path)
        with pytest.raises(InputError, match=r"a\.parquet row 2: 'text' is not valid UTF-8"):
            list(iter_parquet_texts(str(path)))


def test_parquet_invalid_utf8_names_the_row_and_the_byte_not_arrows_batch_index(tmp_path):
    """Arrow's "(Invalid UTF8 sequence at string index 0)" counts rows of the batch: at file row 90,000 it
    read as a place in the text (a new user's trial). The line names the byte in the text instead."""
    texts = [b"fine"] * 9000 + [b"caf\xc3\xa9 then \xe2\x28\xa1"] + [b"after"]
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": pa.array(texts, pa.binary())}), path, row_group_size=4000)
    with pytest.raises(InputError, match=r"^text file .*a\.parquet row 9000: 'text' is not valid UTF-8 \(byte 0xe2 at "
                                         r"byte 11 of the text\); re-encode the file$"):
        list(iter_parquet_texts(str(path), batch_rows=512))


def test_parquet_invalid_utf8_names_the_row(tmp_path):
    offsets = pa.py_buffer(b"\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00")
    strings = pa.Array.from_buffers(pa.string(), 3, [None, offsets, pa.py_buffer(b"ab\xff")])
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": strings}), path)
    with pytest.raises(InputError, match=r"a\.parquet row 2: 'text' is not valid UTF-8"):
        list(iter_parquet_texts(str(path)))


def test_parquet_missing_and_corrupt_file(tmp_path):
    with pytest.raises(InputError, match=r"not found: .*nope\.parquet"):
        parquet_row_group_tasks(str(tmp_path / "nope.parquet"))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match=r"bad\.parquet is not a readable Parquet file"):
        parquet_row_group_tasks(str(bad))


def test_a_page_of_long_texts_is_named_in_one_line(tmp_path, monkeypatch, caplog):
    """A reader decodes a Parquet page whole, and pyarrow's writer cuts pages only between write batches
    of 1,024 values: a row group's first 1,024 texts go in one dictionary page (the default) or, without
    dictionary encoding, in one data page. A page of books costs up to ~2.5x its text to read
    (BENCHMARKS.md, stops 51 and 61): the plan names the file, by the page's own header. Written with
    small write batches, or with short texts, it says nothing."""
    import logging

    import raypack.inputs.parquet as parquet
    from raypack.tokenize.job import TextOptions, plan_text_tasks

    monkeypatch.setattr(parquet, "LARGE_PAGE_NOTE_BYTES", 3 << 19)  # 1.5 MiB: over a dictionary page that falls back
    books = [f"book {i} " + "lorem ipsum dolor sit amet " * 12_000 for i in range(8)]  # ~330 kB each
    for folder in "abc":
        (tmp_path / folder).mkdir()
    pq.write_table(pa.table({"id": range(8), "text": books}), tmp_path / "a" / "books.parquet")
    pq.write_table(pa.table({"text": books}), tmp_path / "b" / "plain.parquet", use_dictionary=False)
    pq.write_table(pa.table({"text": books}), tmp_path / "c" / "small_pages.parquet", write_batch_size=2)
    pq.write_table(pa.table({"text": books}), tmp_path / "c" / "small_plain.parquet", write_batch_size=2,
                   use_dictionary=False)
    pq.write_table(pa.table({"text": TEXTS * 100}), tmp_path / "c" / "short.parquet")
    notes = parquet.large_page_notes(str(tmp_path / "a" / "books.parquet"), "text")
    assert len(notes) == 1 and "row group 0 keeps 2 MiB of its 'text' column's text in one dictionary page" \
        in notes[0] and "write_batch_size=16" in notes[0], notes
    plain = parquet.large_page_notes(str(tmp_path / "b" / "plain.parquet"), "text")
    assert len(plain) == 1 and "in one data page" in plain[0], plain
    assert parquet.large_page_notes(str(tmp_path / "a" / "books.parquet"), "id") == []  # 8 ints
    for name in ("small_pages", "small_plain", "short"):
        assert parquet.large_page_notes(str(tmp_path / "c" / f"{name}.parquet"), "text") == [], name
    with caplog.at_level(logging.INFO, logger="raypack.tokenize.job"):
        plan_text_tasks((str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c")),
                        TextOptions(tokenizer="unused.json"))
    said = [r.getMessage() for r in caplog.records if r.name == "raypack.tokenize.job"]
    assert said == notes + plain


def test_a_file_of_many_row_groups_costs_one_page_header_read_at_most(tmp_path, monkeypatch):
    """The note reads one page header a file, in the row group whose text column the footer makes the
    largest (one writer wrote the file's pages); a file of an object store's corpus plans in one
    more small read, not one a row group."""
    import raypack.inputs.parquet as parquet

    monkeypatch.setattr(parquet, "LARGE_PAGE_NOTE_BYTES", 3 << 19)
    reads = []
    real = parquet.first_page_header
    monkeypatch.setattr(parquet, "first_page_header", lambda source, chunk: reads.append(chunk) or real(source, chunk))
    short = ["short text"] * 8
    books = [f"book {i} " + "lorem ipsum dolor sit amet " * 12_000 for i in range(8)]
    with pq.ParquetWriter(tmp_path / "mixed.parquet", pa.schema([("text", pa.string())]),
                          use_dictionary=False) as writer:
        for texts in (short, short, books, books[:6], short):
            writer.write_table(pa.table({"text": texts}))
    notes = parquet.large_page_notes(str(tmp_path / "mixed.parquet"), "text")
    assert len(reads) == 1 and len(notes) == 1 and "row group 2 keeps 2 MiB" in notes[0], (reads, notes)
    reads.clear()
    pq.write_table(pa.table({"text": short * 100}), tmp_path / "short.parquet", row_group_size=8)
    assert parquet.large_page_notes(str(tmp_path / "short.parquet"), "text") == [] and reads == []
