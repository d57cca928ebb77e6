"""raypack.inputs.reading, every format: token batches in file order, exact round trips, validation messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as paipc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.errors import InputError
from raypack.inputs.reading import inspect_shard, iter_token_batches
from raypack.rules.token_checks import check_tokens_fit, validate_token_batch

I32 = pa.list_(pa.int32())
FORMATS = ["parquet", "arrow", "jsonl"]
SUFFIX = {"parquet": "parquet", "arrow": "arrow", "jsonl": "jsonl"}


# ---------------------------------------------------------------------------------------------
# factories


def write_shard(tmp_path: Path, fmt: str, docs, list_type=I32, *, rows_per_part: int = 5) -> str:
    """A shard of ``docs`` split into parts (row groups / record batches) of rows_per_part."""
    path = tmp_path / f"s.{SUFFIX[fmt]}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps({"input_ids": d, "n": i}) + "\n" for i, d in enumerate(docs)))
        return str(path)
    table = pa.table({"n": pa.array(range(len(docs))), "input_ids": pa.array(docs, list_type)})
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=rows_per_part)
    else:
        with paipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table, max_chunksize=rows_per_part)
    return str(path)


def corpus(num_docs: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 50_000, rng.integers(0, 7)).tolist() for _ in range(num_docs)]
    docs[1] = []
    return docs


def read_all(path: str, fmt: str, batch_size: int, **kwargs):
    return list(iter_token_batches(path, fmt, batch_size=batch_size, **kwargs))


# ---------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("batch_size", [1, 3, 4, 7, 23, 1000])
def test_batches_concatenate_back_to_the_column(tmp_path: Path, fmt: str, batch_size: int):
    docs = corpus(23)
    path = write_shard(tmp_path, fmt, docs, rows_per_part=5)
    batches = read_all(path, fmt, batch_size)
    first_rows = [first for first, _ in batches]
    lengths = [len(tokens) for _, tokens in batches]
    assert first_rows == [0, *np.cumsum(lengths)[:-1].tolist()]
    assert all(1 <= n <= batch_size for n in lengths)
    assert [doc for _, tokens in batches for doc in tokens.to_pylist()] == docs
    for _, tokens in batches:
        assert isinstance(tokens, (pa.ListArray, pa.LargeListArray))
        assert pa.types.is_integer(tokens.type.value_type)


def test_batch_sizes_that_do_not_divide_the_parts_really_split_them(tmp_path: Path):
    path = write_shard(tmp_path, "arrow", corpus(23), rows_per_part=5)
    lengths = [len(tokens) for _, tokens in read_all(path, "arrow", 3)]
    assert lengths == [3, 2] * 4 + [3]  # re-sliced per record batch, never merged
    assert sum(lengths) == 23


@pytest.mark.parametrize("fmt", FORMATS)
def test_reader_counts_agree_with_inspect(tmp_path: Path, fmt: str):
    path = write_shard(tmp_path, fmt, corpus(40, seed=3), rows_per_part=6)
    info = inspect_shard(path)
    batches = read_all(path, fmt, 7)
    assert info.num_docs == sum(len(t) for _, t in batches)
    assert info.num_tokens == sum(len(t.flatten()) for _, t in batches)
    assert info.token_type == str(batches[0][1].type.value_type)


@settings(max_examples=30, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=6), min_size=1, max_size=30),
    rows_per_part=st.integers(1, 9),
    batch_size=st.integers(1, 12),
    fmt=st.sampled_from(FORMATS),
)
def test_round_trip_property(tmp_path_factory, docs, rows_per_part, batch_size, fmt):
    path = write_shard(tmp_path_factory.mktemp("rt"), fmt, docs, rows_per_part=rows_per_part)
    batches = read_all(path, fmt, batch_size)
    assert [doc for _, t in batches for doc in t.to_pylist()] == docs
    lengths = [len(t) for _, t in batches]
    assert [first for first, _ in batches] == [0, *np.cumsum(lengths)[:-1].tolist()]
    assert max(lengths) <= batch_size


def test_large_list_and_unsigned_types_pass_through(tmp_path: Path):
    docs = corpus(9)
    path = write_shard(tmp_path, "parquet", docs, pa.large_list(pa.uint16()))
    batches = read_all(path, "parquet", 4)
    assert all(t.type == pa.large_list(pa.field("element", pa.uint16())) for _, t in batches)
    assert [d for _, t in batches for d in t.to_pylist()] == docs


def test_jsonl_lines_longer_than_a_block_come_once_in_order(tmp_path: Path):
    docs = [[1], list(range(3000)), [2, 3], list(range(5000)), [], [4]]
    path = write_shard(tmp_path, "jsonl", docs)
    batches = read_all(path, "jsonl", 2, json_block_size=512)
    assert [d for _, t in batches for d in t.to_pylist()] == docs
    assert [first for first, _ in batches] == sorted({first for first, _ in batches})


def test_empty_shards_yield_nothing(tmp_path: Path):
    assert read_all(write_shard(tmp_path, "parquet", []), "parquet", 4) == []
    (tmp_path / "e.jsonl").write_text("")
    assert read_all(str(tmp_path / "e.jsonl"), "jsonl", 4) == []


# ---------------------------------------------------------------------------------------------
# validation while reading


def _with(row: int, doc, num_docs: int = 23) -> list:
    docs = corpus(num_docs)
    docs[row] = doc
    return docs


@pytest.mark.parametrize("fmt", FORMATS)
def test_null_document_names_file_and_row(tmp_path: Path, fmt: str):
    path = write_shard(tmp_path, fmt, _with(17, None))
    with pytest.raises(InputError, match=rf"shard .*s\.{fmt} row 17: the document is null[^;]*; .*write \[\] for an "
                                         rf"empty document"):
        read_all(path, fmt, 4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_null_token_names_file_row_and_position(tmp_path: Path, fmt: str):
    path = write_shard(tmp_path, fmt, _with(9, [5, 6, None, 7]))
    with pytest.raises(InputError, match=rf"shard .*s\.{fmt} row 9: token 2 of the document is null"):
        read_all(path, fmt, 4)


@pytest.mark.parametrize("fmt", FORMATS)
def test_negative_token_names_file_row_and_value(tmp_path: Path, fmt: str):
    path = write_shard(tmp_path, fmt, _with(12, [4, -3, -5]))
    with pytest.raises(InputError, match=rf"shard .*s\.{fmt} row 12: token -3 is negative; token ids must be >= 0"):
        read_all(path, fmt, 5)


def test_jsonl_missing_key_is_a_null_document(tmp_path: Path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"input_ids": [1]}\n{"input_ids": [2]}\n{"text": "no tokens"}\n')
    with pytest.raises(InputError, match=r"s\.jsonl row 2: the document is null \(null, or the line has no such "
                                         r"key\)"):
        read_all(str(path), "jsonl", 8)


def test_parquet_footer_counts_exclude_null_tokens_which_reading_rejects(tmp_path: Path):
    path = write_shard(tmp_path, "parquet", [[1, None, 2], [3]])
    assert inspect_shard(path).num_tokens == 3  # non-null tokens; the shard cannot be packed
    with pytest.raises(InputError, match=r"row 0: token 1 of the document is null"):
        read_all(path, "parquet", 8)


def test_validation_reads_only_the_slice_not_the_raw_values_child():
    lists = pa.array([[-1], [None], None, [1, 2], [], [3, -7], [-9]], I32)
    validate_token_batch(lists.slice(3, 2), path="x", first_row=0)
    assert lists.slice(3, 2).values.to_pylist()[0] == -1  # the trap a .values reader falls into
    with pytest.raises(InputError, match=r"shard x row 102: token -7 is negative"):
        validate_token_batch(lists.slice(3, 3), path="x", first_row=100)


def test_validation_rejects_non_integer_batches():
    with pytest.raises(InputError, match=r"token ids have type double; they must be integers"):
        validate_token_batch(pa.array([[1.0]], pa.list_(pa.float64())), path="x", first_row=0)
    with pytest.raises(InputError, match=r"token column has type int64; it must be a list"):
        validate_token_batch(pa.array([1]), path="x", first_row=0)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_reader_checks_the_column_before_reading(tmp_path: Path, fmt: str):
    path = write_shard(tmp_path, fmt, [[1.5]], pa.list_(pa.float32()))
    with pytest.raises(InputError, match=rf"s\.{fmt} column 'input_ids' has type .*float"):
        read_all(path, fmt, 4)
    with pytest.raises(InputError, match=r"has no column 'tokens'; its columns are \['n', 'input_ids'\]"):
        list(iter_token_batches(path, fmt, column="tokens"))


def test_reader_argument_and_file_errors(tmp_path: Path):
    with pytest.raises(ValueError, match=r"fmt='csv' must be one of parquet, jsonl, arrow"):
        read_all("x.csv", "csv", 4)
    with pytest.raises(ValueError, match=r"batch_size=0 must be an integer >= 1"):
        read_all("x.parquet", "parquet", 0)
    with pytest.raises(InputError, match=r"input path not found: .*gone\.parquet"):
        read_all(str(tmp_path / "gone.parquet"), "parquet", 4)
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match=r"shard .*bad\.parquet is not a readable Parquet file"):
        read_all(str(tmp_path / "bad.parquet"), "parquet", 4)


# ---------------------------------------------------------------------------------------------
# check_tokens_fit


def test_tokens_that_fit_pass():
    tokens = np.array([0, 65_535, 7], dtype=np.int64)
    check_tokens_fit(tokens, np.array([2, 0, 1]), np.uint16, path="x", first_row=0)
    check_tokens_fit(tokens, np.array([3]), pa.int32(), path="x", first_row=0)
    check_tokens_fit(np.array([], dtype=np.int64), np.array([0, 0]), "uint8", path="x", first_row=0)


def test_a_token_too_large_names_file_row_and_value():
    tokens = np.array([1, 2, 3, 70_000, 99_999], dtype=np.int64)
    lengths = np.array([2, 0, 1, 0, 2])  # row 4 holds 70_000 and 99_999; rows 1 and 3 are empty
    with pytest.raises(InputError, match=r"shard x row 14: token 70000 does not fit the output token dtype uint16 "
                                         r"\(0\.\.65535\); set token_dtype"):
        check_tokens_fit(tokens, lengths, "uint16", path="x", first_row=10)


@pytest.mark.parametrize(
    "src, dst, value",
    [("uint32", "int32", 2**31), ("uint64", "int64", 2**63), ("int64", "uint32", 2**32), ("int64", "uint8", -1)],
)
def test_out_of_range_across_signedness(src: str, dst: str, value: int):
    tokens = np.array([0, value, 1], dtype=src)
    with pytest.raises(InputError, match=rf"row 1: token {value} does not fit the output token dtype {dst}"):
        check_tokens_fit(tokens, np.array([1, 1, 1]), dst, path="x", first_row=0)


def test_check_tokens_fit_needs_an_integer_dtype():
    with pytest.raises(ValueError, match=r"dtype=float32 must be an integer dtype"):
        check_tokens_fit(np.array([1]), np.array([1]), np.float32, path="x", first_row=0)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _claim_rows(path: Path, rows: int, claimed: int) -> None:
    """Rewrite the footer's row counts (FileMetaData's and the row group's num_rows, Thrift compact
    i64 field 3 after field 2: header 0x16, zigzag varint) from ``rows`` to ``claimed``."""
    import struct

    data = path.read_bytes()
    length = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-8 - length:-8]
    old, new = b"\x16" + _varint(2 * rows), b"\x16" + _varint(2 * claimed)
    assert footer.count(old) >= 2  # the file's count and its one row group's (a flat column's value count too)
    footer = footer.replace(old, new)
    path.write_bytes(data[:-8 - length] + footer + struct.pack("<I", len(footer)) + b"PAR1")


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_footer_claiming_2_to_the_40_rows_is_one_line_before_pyarrow_allocates(tmp_path: Path, command: str):
    """pyarrow sizes its buffers from the footer's row count: 2^40 rows in a 10 kB file took 12.8-22.8 GB.
    The child runs under a 2 GiB address-space limit, so a regression fails here instead of the machine."""
    import subprocess
    import sys

    (tmp_path / "in").mkdir()
    column = {"pack": ("input_ids", pa.array([[1, 2, 3]] * 1000, I32)),
              "tokenize": ("text", pa.array(["a b"] * 1000))}
    pq.write_table(pa.table(dict([column[command]])), tmp_path / "in" / "part-0.parquet")
    _claim_rows(tmp_path / "in" / "part-0.parquet", 1000, 2**40)
    args = (["pack", "--context-length", "4"] if command == "pack"
            else ["tokenize", "--tokenizer", "tiktoken:cl100k_base"])
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30));"
              "from raypack.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", script, *args, "--local", "--input", str(tmp_path / "in"),
                           "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "claims 1099511627776 rows in a file of" in lines[0], proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def _padded_varint(n: int, width: int) -> bytes:
    """``n`` as a varint of exactly ``width`` bytes (redundant zero groups: still the same value)."""
    out = bytearray(_varint(n))
    assert len(out) <= width
    while len(out) < width:
        out[-1] |= 0x80
        out.append(0)
    return bytes(out)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i, value, shift = i + 1, value | (byte & 0x7F) << shift, shift + 7
        if not byte & 0x80:
            return value, i


def _claim_page_size(path: Path, claimed: int) -> int:
    """Rewrite the first data page header's uncompressed_page_size (Thrift compact PageHeader: i32
    fields 1-4, header byte 0x15 each: type, uncompressed and compressed size, crc; then field 5, the
    data page header, 0x1C) to ``claimed``, keeping the file's length: the crc field (written with
    write_page_checksum, not verified by default) makes room for the longer varint. Returns the true size."""
    offset = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    i, values, widths = offset, [], []
    for _ in range(4):
        assert data[i] == 0x15
        value, end = _read_varint(data, i + 1)
        values.append(value)
        widths.append(end - i - 1)
        i = end
    assert data[i] == 0x1C
    total = i - offset
    room = total - 3 - 5  # three field headers and the claim's five bytes: the rest for type and compressed size
    type_width = max(widths[0], room - 5)
    header = (b"\x15" + _padded_varint(values[0], type_width) + b"\x15" + _padded_varint(2 * claimed, 5)
              + b"\x15" + _padded_varint(values[2], room - type_width))
    assert len(header) == total
    data[offset:i + 1] = header + b"\x2C"  # field 5 now follows field 3: delta 2
    path.write_bytes(bytes(data))
    return values[1] // 2


@pytest.mark.parametrize("command", ["pack", "tokenize"])
@pytest.mark.parametrize("statistics", [True, False], ids=["footer-counts", "scan"])
def test_a_page_claiming_2_gib_uncompressed_is_one_line_in_bounded_memory(tmp_path: Path, command: str,
                                                                         statistics: bool):
    """A snappy page of a 1.4 MB file whose header claims 2^31-1 uncompressed bytes (issue 25, item 12:
    the hand-written page reader allocated from the claim, 2.1 GB). pyarrow checks what the page
    decompressed to against the claim: one line, exit 2, and the child's peak RSS stays far below the claim."""
    import subprocess
    import sys

    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "part-0.parquet"
    rng = np.random.default_rng(0)
    n = 350_000
    if command == "pack":
        offsets = pa.array(np.arange(0, n + 1, 1000, dtype=np.int32))
        column = ("input_ids", pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 50_000, n, dtype=np.int32))))
    else:
        column = ("text", pa.array([f"w{v} x{v % 7}" for v in rng.integers(0, 10**6, n // 10)]))
    pq.write_table(pa.table(dict([column])), path, compression="snappy", use_dictionary=False,
                   write_statistics=statistics, write_page_checksum=True)
    true_size = _claim_page_size(path, 2**31 - 1)
    assert 100_000 < true_size < 2**21
    args = (["pack", "--context-length", "64"] if command == "pack"
            else ["tokenize", "--tokenizer", "tiktoken:cl100k_base"])
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30));"
              "from raypack.cli import main; rc = main(sys.argv[1:]);"
              "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", script, *args, "--local", "--input", str(tmp_path / "in"),
                           "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "part-0.parquet" in lines[0] and "expected: 2147483647" in lines[0], lines
    assert "re-write the file" in lines[0]
    peak_kib = int(proc.stdout.split()[-1])
    assert peak_kib < 1 << 20, f"peak RSS {peak_kib} KiB for a page claiming 2 GiB"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_a_footer_whose_created_by_is_not_utf8_is_read_by_scanning(tmp_path: Path):
    """The writer's name is unknown, so the footer's counts are not trusted: the counts come from a scan."""
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"input_ids": pa.array([[1, 2], [3], []], I32)}), path)
    data = path.read_bytes()
    name = b"parquet-cpp-arrow version "
    assert data.count(name) == 1
    path.write_bytes(data.replace(name, b"\xff" + name[1:]))  # same length: the footer's size holds
    info = inspect_shard(str(path))
    assert (info.num_docs, info.num_tokens, info.count_method) == (3, 3, "scan")


def _claim_group_rows(path: Path, claimed: int) -> None:
    """Rewrite row group 0's num_rows (and the file's, so the two still agree) to ``claimed``, leaving
    its column chunks' num_values as written. Thrift compact: RowGroup's num_rows (i64 field 3)
    follows its total_byte_size (i64 field 2), each ``0x16`` + zigzag varint; the file's num_rows is
    the one ``0x16`` + varint of the total (two row groups, so it differs from any group's count)."""
    import struct

    meta = pq.ParquetFile(path).metadata
    group, total = meta.row_group(0), meta.num_rows
    data = path.read_bytes()
    length = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-8 - length:-8]
    old = b"\x16" + _varint(2 * group.total_byte_size) + b"\x16" + _varint(2 * group.num_rows)
    new = b"\x16" + _varint(2 * group.total_byte_size) + b"\x16" + _varint(2 * claimed)
    assert footer.count(old) == 1 and footer.count(b"\x16" + _varint(2 * total)) == 1
    footer = footer.replace(old, new).replace(b"\x16" + _varint(2 * total),
                                              b"\x16" + _varint(2 * (total - group.num_rows + claimed)))
    path.write_bytes(data[:-8 - length] + footer + struct.pack("<I", len(footer)) + b"PAR1")


@pytest.mark.parametrize("claimed", [400, 0])
@pytest.mark.parametrize("command", ["pack", "tokenize", "pack --tokenizer"])
def test_a_row_group_claiming_fewer_rows_than_its_pages_hold_is_one_line(tmp_path: Path, capsys, command: str,
                                                                         claimed: int):
    """pyarrow reads the rows a row group claims: 400 (or 0) of its 500 documents were packed, exit 0."""
    from raypack.cli import main

    (tmp_path / "in").mkdir()
    text = command != "pack"
    column = ("text", pa.array([f"doc {i}" for i in range(1000)])) if text else \
        ("input_ids", pa.array([[1, 2, 3]] * 500 + [[1, 2, 3, 4]] * 500, I32))  # two row groups of other sizes
    pq.write_table(pa.table(dict([column])), tmp_path / "in" / "part-0.parquet", row_group_size=500)
    _claim_group_rows(tmp_path / "in" / "part-0.parquet", claimed)
    assert pq.ParquetFile(tmp_path / "in" / "part-0.parquet").metadata.row_group(0).num_rows == claimed
    args = {"pack": ["pack", "--context-length", "4"], "tokenize": ["tokenize", "--tokenizer", "tiktoken:cl100k_base"],
            "pack --tokenizer": ["pack", "--context-length", "4", "--tokenizer", "tiktoken:cl100k_base"]}[command]
    assert main([*args, "--local", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = ("its metadata is wrong" if (command, claimed) == ("pack", 400)  # a list column's levels can outnumber
            else f"row group 0 claims {claimed} rows, and its column")  # its rows: the read's count check sees it
    assert len(err) == 1 and said in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
