"""raypack.inputs.shards and formats counts: discovery order, cheap counts, offsets and the common token type."""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as paipc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.errors import InputError
from raypack.inputs.base import ShardInfo
from raypack.inputs.parquet import footer_null_counts_exact
from raypack.inputs.reading import check_token_column, inspect_shard
from raypack.inputs.registry import shard_format
from raypack.inputs.shards import ShardPlan, common_token_type, discover_shards, plan_offsets
from raypack.io.fs import resolve_filesystem

I32 = pa.list_(pa.int32())


# ---------------------------------------------------------------------------------------------
# factories


def write_parquet(path: Path, docs, list_type=I32, *, column="input_ids", **kwargs) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: pa.array(docs, list_type), "meta": pa.array(range(len(docs)))})
    pq.write_table(table, path, **kwargs)
    return str(path)


def write_ipc(path: Path, docs, list_type=I32, *, max_chunksize=None, stream=False) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"meta": pa.array(range(len(docs))), "input_ids": pa.array(docs, list_type)})
    opener = paipc.new_stream if stream else paipc.new_file
    with opener(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=max_chunksize)
    return str(path)


def write_jsonl(path: Path, docs, *, column="input_ids") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"id": i, column: doc, "text": "x"}) + "\n" for i, doc in enumerate(docs))
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(lines.encode()))
    elif path.name.endswith(".zst"):
        path.write_bytes(pa.compress(lines.encode(), "zstd", asbytes=True))
    else:
        path.write_text(lines)
    return str(path)


def touch(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return str(path)


DOCS = [[1, 2, 3], [], [4], [5, 6], [], [7, 8, 9, 10]]


# ---------------------------------------------------------------------------------------------
# discovery


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """d/ with shards at two levels plus files and directories discovery must skip."""
    d = tmp_path / "d"
    write_parquet(d / "b.parquet", DOCS)
    write_jsonl(d / "a.jsonl", DOCS)
    write_ipc(d / "sub" / "c.arrow", DOCS)
    write_parquet(d / "sub" / "a.pq", DOCS)
    touch(d / "_SUCCESS")
    touch(d / "notes.txt")
    write_parquet(d / ".hidden.parquet", DOCS)
    write_parquet(d / "_tmp" / "x.parquet", DOCS)
    write_parquet(d / ".cache" / "y.parquet", DOCS)
    return d


def test_directory_expands_recursively_in_sorted_order_skipping_hidden(tree: Path):
    expected = ["a.jsonl", "b.parquet", "sub/a.pq", "sub/c.arrow"]
    assert discover_shards([str(tree)]) == [str(tree / name) for name in expected]


def test_order_follows_inputs_then_sorted_expansion_and_dedupes_keeping_first(tree: Path):
    inputs = [str(tree / "sub" / "c.arrow"), str(tree), str(tree / "b.parquet")]
    expected = ["sub/c.arrow", "a.jsonl", "b.parquet", "sub/a.pq"]
    assert discover_shards(inputs) == [str(tree / name) for name in expected]


def test_one_file_under_two_spellings_is_read_once(tree: Path, tmp_path, monkeypatch, caplog):
    """The same directory given as a relative path, through a symbolic link and with ``..`` packed every document
    twice without a word (an operator's trial); each file is now read once, under its first spelling, and one
    line says so."""
    (tmp_path / "link").symlink_to(tree)
    monkeypatch.chdir(tree.parent)
    inputs = [tree.name, str(tmp_path / "link"), str(tree / "sub" / ".." / "b.parquet")]
    with caplog.at_level(logging.INFO, logger="raypack.inputs"):
        found = discover_shards(inputs)
    assert found == [str(tree / name) for name in ["a.jsonl", "b.parquet", "sub/a.pq", "sub/c.arrow"]]
    said = [r.getMessage() for r in caplog.records if "given again" in r.getMessage()]
    assert said == [f"inputs: 5 files given again under another path are read once ({tmp_path / 'link' / 'a.jsonl'} "
                    f"is {tree / 'a.jsonl'}, ...)"], said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="raypack.inputs"):
        assert discover_shards([str(tree / "b.parquet"), str(tree / "b.parquet")]) == [str(tree / "b.parquet")]
    assert not [r for r in caplog.records if "given again" in r.getMessage()]  # one spelling twice: as before
    os.link(tree / "b.parquet", tmp_path / "hard.parquet")  # a hard link: the same file (a hostile trial)
    assert discover_shards([str(tree / "b.parquet"), str(tmp_path / "hard.parquet")]) == [str(tree / "b.parquet")]


def test_files_a_directory_or_glob_leaves_out_are_said_in_one_line(tree: Path, caplog):
    """A new user's trial: a directory holding a.jsonl and b.json, or a c.jsonl.bz2, packed a.jsonl alone without
    a word (half the corpus gone). What expansion leaves out for its name alone is now one WARNING line; hidden and
    ``_`` names and known metadata (manifest.json, README, LICENSE) are not counted."""
    for name in ("manifest.json", "README.md", "LICENSE"):
        touch(tree / name)
    with caplog.at_level(logging.INFO, logger="raypack.inputs"):
        discover_shards([str(tree)])
        discover_shards([str(tree)])  # a run lists its inputs twice on Ray: said once
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [f"input directory {tree}: 1 file not read, e.g. notes.txt; no shard suffix (.parquet, .pq, "
                    ".jsonl, .json, .jsonl.gz, .jsonl.zst, .arrow, .ipc, .feather): rename or convert it to read it, "
                    "or move it away"], said
    write_jsonl(tree / "sub" / "b.json", DOCS)
    touch(tree / "c.jsonl.bz2")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="raypack.inputs"):
        discover_shards([str(tree) + "/"])
        discover_shards([str(tree / "*")])
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [f"input directory {tree}/: 3 files not read, e.g. b.json; a directory's .json files are read "
                    f"only when named (they are often metadata): pass {tree / 'sub'}/*.json too to read them, or "
                    "move them away",
                    f"glob {tree / '*'}: 2 files not read, e.g. c.jsonl.bz2; no shard suffix (.parquet, .pq, .jsonl, "
                    ".json, .jsonl.gz, .jsonl.zst, .arrow, .ipc, .feather): rename or convert them to read them, or "
                    "move them away"], said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="raypack.inputs"):
        discover_shards([str(tree / "*.parquet")])  # a glob that names what it reads: nothing to say
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(
    "pattern, expected",
    [
        ("*.parquet", ["b.parquet"]),  # '*' does not cross '/'
        ("*/*", ["sub/a.pq", "sub/c.arrow"]),
        ("**/*.p*", ["b.parquet", "sub/a.pq"]),
        ("**", ["a.jsonl", "b.parquet", "sub/a.pq", "sub/c.arrow"]),
        ("?.jsonl", ["a.jsonl"]),
        ("sub/[a-b].*", ["sub/a.pq"]),
        ("*", ["a.jsonl", "b.parquet"]),  # _SUCCESS, notes.txt, .hidden.parquet skipped
    ],
)
def test_globs_match_whole_paths_sorted(tree: Path, pattern: str, expected: list[str]):
    assert discover_shards([f"{tree}/{pattern}"]) == [str(tree / name) for name in expected]


def test_relative_inputs_become_absolute_paths(tree: Path, monkeypatch):
    monkeypatch.chdir(tree)
    assert discover_shards(["b.parquet", "sub/*.arrow", "./b.parquet"]) == [
        str(tree / "b.parquet"),
        str(tree / "sub" / "c.arrow"),
    ]


def test_uri_inputs_return_uris(tree: Path):
    uri = f"file://{tree}"
    assert discover_shards([f"{uri}/sub", f"{uri}/*.jsonl"]) == [
        f"{uri}/sub/a.pq",
        f"{uri}/sub/c.arrow",
        f"{uri}/a.jsonl",
    ]
    fs, fs_path = resolve_filesystem(f"{uri}/sub/a.pq")
    assert fs.get_file_info(fs_path).size > 0


def test_single_string_is_one_input(tree: Path):
    assert discover_shards(str(tree / "b.parquet")) == [str(tree / "b.parquet")]


@pytest.mark.parametrize(
    "inputs, match",
    [
        (["missing.parquet"], r"input path not found: .*missing\.parquet"),
        (["{d}/*.feather"], r"glob .*\*\.feather matched no shard files"),
        (["{d}/nowhere/*.parquet"], r"glob .* matched nothing: its base directory .*nowhere does not exist"),
        (["{d}/_tmp/../notes.txt"], r"notes\.txt has an unknown shard suffix; accepted: \.parquet, \.pq, \.jsonl"),
        (["{d}/empty"], r"input directory .*empty holds no shard files: it has 2 files like _SUCCESS \(accepted "
                        r"suffixes: \.parquet"),
        (["{d}/nothing"], r"input directory .*nothing is empty; give the directory that holds the shard files "
                          r"\(accepted suffixes: \.parquet"),
        (["{d}/onlyjson"], r"input directory .*onlyjson holds no shard files \(accepted suffixes: .*; \.json files are "
                           r"read only when named: pass .*onlyjson/\*\.json\)"),
        ([], r"no inputs given"),
        ([""], r"must be a non-empty path string"),
    ],
)
def test_discovery_errors(tree: Path, inputs, match):
    touch(tree / "empty" / "_SUCCESS")
    touch(tree / "empty" / "readme.md")
    (tree / "nothing").mkdir()
    touch(tree / "onlyjson" / "a.json")
    with pytest.raises(InputError, match=match):
        discover_shards([item.format(d=tree) for item in inputs])


@pytest.mark.parametrize(
    "name, fmt",
    [
        ("x.parquet", "parquet"),
        ("x.PQ", "parquet"),
        ("x.jsonl", "jsonl"),
        ("x.json", "jsonl"),
        ("x.jsonl.gz", "jsonl"),
        ("x.jsonl.zst", "jsonl"),
        ("x.arrow", "arrow"),
        ("x.ipc", "arrow"),
        ("s3://b/k/x.feather", "arrow"),
        ("x.csv", None),
        ("x.gz", None),
        (".parquet", None),
    ],
)
def test_shard_format_by_suffix(name: str, fmt: str | None):
    assert shard_format(name) == fmt


# ---------------------------------------------------------------------------------------------
# counts


def _expected(docs) -> tuple[int, int]:
    return len(docs), sum(len(d) for d in docs if d is not None)


docs_strategy = st.lists(
    st.one_of(st.lists(st.integers(0, 60_000), max_size=9), st.just([]), st.none()), max_size=40
)


@settings(max_examples=40, deadline=None)
@given(
    docs=docs_strategy,
    row_group_size=st.integers(1, 8),
    list_type=st.sampled_from([I32, pa.list_(pa.int64()), pa.large_list(pa.uint16())]),
)
def test_parquet_footer_counts_equal_scanned_counts(tmp_path_factory, docs, row_group_size, list_type):
    d = tmp_path_factory.mktemp("pq")
    footer = inspect_shard(write_parquet(d / "s.parquet", docs, list_type, row_group_size=row_group_size))
    scanned = inspect_shard(
        write_parquet(d / "n.parquet", docs, list_type, row_group_size=row_group_size, write_statistics=False)
    )
    assert (footer.num_docs, footer.num_tokens) == _expected(docs)
    assert (scanned.num_docs, scanned.num_tokens) == _expected(docs)
    assert footer.count_method == "parquet-footer"
    assert scanned.count_method == ("scan" if docs else "parquet-footer")  # no row group to scan
    assert footer.token_type == scanned.token_type == str(list_type.value_type)


@pytest.mark.parametrize("compliant_nested", [True, False])
@pytest.mark.parametrize("nullable", [True, False])
def test_parquet_footer_counts_over_many_row_groups(tmp_path: Path, compliant_nested, nullable):
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50_000, rng.integers(0, 6)).tolist() for _ in range(200)]
    element = pa.field("element", pa.int32(), nullable=nullable)
    path = write_parquet(
        tmp_path / "s.parquet", docs, pa.list_(element), row_group_size=17,
        use_compliant_nested_type=compliant_nested,
    )
    assert pq.ParquetFile(path).metadata.num_row_groups > 10  # not vacuous
    assert sum(1 for d in docs if not d) > 10
    info = inspect_shard(path)
    assert info == ShardInfo(path, "parquet", *_expected(docs), "int32", "parquet-footer")


def test_parquet_without_token_column_statistics_is_scanned(tmp_path: Path):
    path = write_parquet(tmp_path / "s.parquet", DOCS, row_group_size=2, write_statistics=["meta"])
    assert inspect_shard(path) == ShardInfo(path, "parquet", *_expected(DOCS), "int32", "scan")


@pytest.mark.parametrize(
    "created_by, trusted",
    [
        ("parquet-cpp-arrow version 26.0.1", True),
        ("parquet-cpp-arrow version 6.0.0", True),
        ("parquet-cpp-arrow version 5.0.0", False),  # before PARQUET-2067: empty lists uncounted
        ("parquet-mr version 1.12.3 (build abc)", False),
        ("Polars", False),
        (None, False),
    ],
)
def test_footer_counts_only_trusted_from_writers_known_to_count_empty_lists(created_by, trusted):
    assert footer_null_counts_exact(created_by) is trusted


@pytest.mark.parametrize("stream", [False, True])
def test_ipc_counts_from_offsets(tmp_path: Path, stream: bool):
    docs = DOCS * 7
    path = write_ipc(tmp_path / "s.arrow", docs, pa.large_list(pa.uint32()), max_chunksize=4, stream=stream)
    assert inspect_shard(path) == ShardInfo(path, "arrow", *_expected(docs), "uint32", "ipc-offsets")


def test_ipc_without_batches_counts_zero(tmp_path: Path):
    path = write_ipc(tmp_path / "s.feather", [])
    assert inspect_shard(path) == ShardInfo(path, "arrow", 0, 0, "int32", "ipc-offsets")


@pytest.mark.parametrize("name", ["s.jsonl", "s.json", "s.jsonl.gz", "s.jsonl.zst"])
def test_jsonl_counts_by_scan(tmp_path: Path, name: str):
    path = write_jsonl(tmp_path / name, DOCS)
    assert inspect_shard(path) == ShardInfo(path, "jsonl", *_expected(DOCS), "int64", "scan")


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_empty_jsonl_has_no_documents(tmp_path: Path, text: str):
    (tmp_path / "e.jsonl").write_text(text)
    path = str(tmp_path / "e.jsonl")
    assert inspect_shard(path) == ShardInfo(path, "jsonl", 0, 0, "int64", "scan")


def test_jsonl_lines_longer_than_a_block_are_read_with_larger_blocks(tmp_path: Path):
    docs = [[1], list(range(3000)), [2, 3], list(range(5000)), []]
    path = write_jsonl(tmp_path / "s.jsonl", docs)
    assert inspect_shard(path, json_block_size=512) == ShardInfo(path, "jsonl", *_expected(docs), "int64", "scan")


def _write_with_column(tmp_path: Path, fmt: str, column: str) -> str:
    if fmt == "parquet":
        return write_parquet(tmp_path / "s.parquet", DOCS, column=column)
    table = pa.table({column: pa.array(DOCS, I32), "meta": pa.array(range(len(DOCS)))})
    with paipc.new_file(str(tmp_path / "s.arrow"), table.schema) as writer:
        writer.write_table(table)
    return str(tmp_path / "s.arrow")


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_missing_column_lists_the_columns(tmp_path: Path, fmt: str):
    path = _write_with_column(tmp_path, fmt, "tokens")
    with pytest.raises(InputError, match=r"s\.(parquet|arrow) has no column 'input_ids'; its columns are \['tokens', "
                                         r"'meta'\]"):
        inspect_shard(path)
    assert inspect_shard(path, column="tokens").num_tokens == _expected(DOCS)[1]
    with pytest.raises(InputError, match=r"s\.(parquet|arrow) has no column 'input_ids'; its columns are"):
        check_token_column(path, "input_ids")  # from the footer or header alone, before Ray starts
    check_token_column(path, "tokens")


def test_the_check_before_ray_starts_reads_no_jsonl(tmp_path: Path):
    """A JSON Lines shard has no cheap schema: its column is checked by the plan, not before."""
    check_token_column(write_jsonl(tmp_path / "s.jsonl", DOCS, column="tokens"), "input_ids")


def test_jsonl_missing_key_names_the_keys_there_are(tmp_path: Path):
    path = write_jsonl(tmp_path / "s.jsonl", DOCS, column="tokens")
    with pytest.raises(InputError, match=r"s\.jsonl: no line has a 'input_ids' list \(keys of the first line: \['id', "
                                         r"'tokens', 'text'\]\); name the token column with --token-column; to pack "
                                         r"its text "
                                         r"'text', tokenize it in the run: --tokenizer .* --text-column text$"):
        inspect_shard(path)


WRONG_TYPES = [
    (pa.array([["a"], []], pa.list_(pa.string())), r"token ids must be integers, not string"),
    (pa.array([[1.5], []], pa.list_(pa.float32())), r"token ids must be integers, not float"),
    (pa.array([[[1]], []], pa.list_(pa.list_(pa.int32()))), r"token ids must be integers, not list<"),
    (pa.array([1, 2], pa.int64()), r"int64; it must be a list of integer token ids"),
    (pa.array(["1 2", ""], pa.string()), r"string; it must be a list"),
]


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
@pytest.mark.parametrize("column, match", WRONG_TYPES)
def test_non_integer_token_columns_are_rejected(tmp_path: Path, fmt: str, column: pa.Array, match: str):
    table = pa.table({"input_ids": column})
    path = str(tmp_path / f"s.{fmt}")
    if fmt == "parquet":
        pq.write_table(table, path)
    else:
        with paipc.new_file(path, table.schema) as writer:
            writer.write_table(table)
    with pytest.raises(InputError, match=rf"shard .*s\.{fmt} column 'input_ids' has type .*{match}"):
        inspect_shard(path)


@pytest.mark.parametrize(
    "line", ['{"input_ids": ["a"]}', '{"input_ids": [1.5]}', '{"input_ids": [[1]]}', "[1, 2]", '{"input_ids": [1,']
)
def test_jsonl_non_integer_tokens_are_rejected(tmp_path: Path, line: str):
    (tmp_path / "s.jsonl").write_text('{"input_ids": [1]}\n' + line + "\n")
    with pytest.raises(InputError, match=r"shard .*s\.jsonl: cannot parse JSON Lines from document 0 on \(.+\); each "
                                         r"line must be one object"):
        inspect_shard(str(tmp_path / "s.jsonl"))


@pytest.mark.parametrize("damage", ["truncate", "cut-footer", "zero-middle"])
def test_damaged_parquet_names_the_file(tmp_path: Path, damage: str):
    path = write_parquet(tmp_path / "s.parquet", DOCS * 20, row_group_size=10)
    data = Path(path).read_bytes()
    damaged = {
        "truncate": data[: len(data) // 2],
        "cut-footer": data[:-3],
        "zero-middle": data[:4] + bytes(len(data) - 12) + data[-8:],  # footer length + magic intact
    }[damage]
    Path(path).write_bytes(damaged)
    with pytest.raises(InputError, match=r"shard .*s\.parquet is not a readable Parquet file \(.+\); re-write or "
                                         r"remove it"):
        inspect_shard(path)


def test_damaged_ipc_names_the_file(tmp_path: Path):
    path = write_ipc(tmp_path / "s.arrow", DOCS)
    Path(path).write_bytes(Path(path).read_bytes()[:40])
    with pytest.raises(InputError, match=r"shard .*s\.arrow is not a readable Arrow IPC file or stream"):
        inspect_shard(path)


def test_inspect_errors_on_missing_file_and_unknown_suffix(tmp_path: Path):
    with pytest.raises(InputError, match=r"input path not found: .*gone\.parquet"):
        inspect_shard(str(tmp_path / "gone.parquet"))
    with pytest.raises(InputError, match=r"shard .*x\.csv has an unknown suffix; accepted: \.parquet"):
        inspect_shard(str(tmp_path / "x.csv"))


# ---------------------------------------------------------------------------------------------
# offsets and token types


def _info(num_docs: int, num_tokens: int, token_type: str = "int32", path: str = "s") -> ShardInfo:
    return ShardInfo(path, "parquet", num_docs, num_tokens, token_type, "parquet-footer")


def test_plan_offsets_is_an_exclusive_cumulative_sum():
    plan = plan_offsets([_info(3, 10), _info(0, 0), _info(2, 5), _info(1, 0)])
    assert isinstance(plan, ShardPlan)
    np.testing.assert_array_equal(plan.doc_offsets, [0, 3, 3, 5, 6])
    np.testing.assert_array_equal(plan.token_offsets, [0, 10, 10, 15, 15])
    assert plan.doc_offsets.dtype == plan.token_offsets.dtype == np.int64
    assert (plan.num_docs, plan.num_tokens) == (6, 15)


def test_plan_offsets_of_no_shards_and_of_huge_counts():
    empty = plan_offsets([])
    np.testing.assert_array_equal(empty.doc_offsets, [0])
    assert empty.num_tokens == 0
    big = plan_offsets([_info(2**31, 2**40), _info(2**31, 2**40)])
    assert (big.num_docs, big.num_tokens) == (2**32, 2**41)


def test_plan_offsets_rejects_negative_counts():
    with pytest.raises(ValueError, match=r"counts must be >= 0"):
        plan_offsets([_info(-1, 0)])


@pytest.mark.parametrize(
    "types, expected",
    [
        (["int32"], "int32"),
        (["int32", "int64"], "int64"),
        (["int16", "int8", "int16"], "int16"),
        (["uint16", "uint8"], "uint16"),
        (["uint16", "int32"], "int32"),
        (["uint16", "int16"], "int32"),
        (["uint8", "int8"], "int16"),
        (["uint32", "int32"], "int64"),
        (["uint32", "int8", "uint16"], "int64"),
        (["uint64", "uint8"], "uint64"),
        (["int64", "uint32"], "int64"),
    ],
)
def test_common_token_type_holds_every_shard_type(types: list[str], expected: str):
    infos = [_info(1, 1, t, f"s{i}") for i, t in enumerate(types)]
    assert common_token_type(infos) == expected
    for t in types:  # the claim, checked: every source range fits the common type
        src, dst = np.iinfo(np.dtype(t)), np.iinfo(np.dtype(expected))
        assert dst.min <= src.min and src.max <= dst.max


def test_common_token_type_rejects_uint64_with_signed():
    infos = [_info(1, 1, "int8", "a.parquet"), _info(1, 1, "uint64", "b.parquet"), _info(1, 1, "int32", "c.parquet")]
    with pytest.raises(InputError, match=r"no integer type can hold both uint64 \(shard b\.parquet\) and int32 \(shard "
                                         r"c\.parquet\) safely"):
        common_token_type(infos)


def test_common_token_type_needs_shards_and_integer_types():
    with pytest.raises(InputError, match=r"no shards"):
        common_token_type([])
    with pytest.raises(ValueError, match=r"token_type='float32' is not an integer type"):
        common_token_type([_info(1, 1, "float32")])


def test_a_symbolic_link_loop_in_an_input_directory_lists_each_file_once(tmp_path: Path, caplog):
    """pyarrow's listing followed ``self -> .`` 40 times (every file packed 41 times, exit 0); with a
    second link (``up -> ../d``) it listed without end, its memory growing ~48 MB/s."""
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    for name in ("a.parquet", "sub/b.parquet"):
        (d / name).write_bytes(b"")
    os.symlink(".", d / "self")
    os.symlink("../d", d / "sub" / "up")
    with caplog.at_level(logging.INFO, logger="raypack.inputs.shards"):
        for _ in range(2):  # a run on Ray lists its inputs twice: the line is said once (it was said twice)
            assert discover_shards([str(d)]) == [str(d / "a.parquet"), str(d / "sub" / "b.parquet")]
    lines = [r.getMessage() for r in caplog.records if "already listed" in r.getMessage()]
    assert len(lines) == len(set(lines)) >= 1, lines


def test_a_fifo_or_a_looping_link_named_as_input_is_one_line(tmp_path: Path):
    os.mkfifo(tmp_path / "pipe.parquet")
    with pytest.raises(InputError, match=r"pipe.parquet is neither a file nor a directory \(a FIFO"):
        discover_shards([str(tmp_path / "pipe.parquet")])
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    with pytest.raises(InputError, match=r"loop1 is a symbolic link that leads nowhere"):
        discover_shards([str(tmp_path / "loop1")])


@pytest.mark.parametrize("link", ["gone", "loop"])
def test_a_dangling_link_named_as_a_shard_in_a_directory_is_one_line(tmp_path: Path, link):
    """A directory holding ``b.parquet -> gone``: the shard it stood for was left out without a word, exit 0
    (a hostile trial). Links that would not be shards (another suffix, hidden, metadata .json) are skipped."""
    d = tmp_path / "in"
    (d / "sub").mkdir(parents=True)
    (d / "a.parquet").write_bytes(b"")
    for name in ("notes.txt", ".hidden.parquet", "_tmp.parquet", "info.json"):
        os.symlink(tmp_path / "gone", d / name)
    assert discover_shards([str(d)]) == [str(d / "a.parquet")]
    bad = d / "sub" / "b.parquet"
    if link == "gone":
        os.symlink(tmp_path / "gone", bad)
    else:
        os.symlink(d / "sub" / "c.parquet", bad)
        os.symlink(bad, d / "sub" / "c.parquet")
    with pytest.raises(InputError, match=rf"^input {d}/sub/[bc]\.parquet is a symbolic link that leads nowhere \(a "
                                         r"loop, or its target is gone\); restore its target, or remove the link"):
        discover_shards([str(d)])


def test_a_file_whose_name_holds_glob_characters_is_taken_as_named(tmp_path: Path):
    """``star*glob.parquet`` also matched ``starXglob.parquet``; ``[br]acket.parquet`` matched nothing."""
    for name in ("star*glob.parquet", "starXglob.parquet", "[br]acket.parquet", "backet.parquet"):
        (tmp_path / name).write_bytes(b"")
    assert discover_shards([str(tmp_path / "star*glob.parquet")]) == [str(tmp_path / "star*glob.parquet")]
    assert discover_shards([str(tmp_path / "[br]acket.parquet")]) == [str(tmp_path / "[br]acket.parquet")]
    assert discover_shards([str(tmp_path / "star?glob.parquet")]) == [str(tmp_path / "star*glob.parquet"),
                                                                       str(tmp_path / "starXglob.parquet")]


@pytest.mark.parametrize("offsets", [(0, 3, 100), (0, 3, -5), (0, 4, 2)], ids=["past the values", "negative",
                                                                               "decreasing"])
@pytest.mark.parametrize("kind", ["file", "stream"])
def test_an_arrow_shard_whose_list_offsets_lie_is_one_line(tmp_path, offsets, kind):
    """A hostile trial: Arrow's IPC reader checks only buffer sizes, so offsets past the values crashed the run
    (a traceback, exit 1, its work kept), and decreasing ones were packed as other documents, which verify then
    passed. Every read of the shard (its plan, its packing) refuses it in one line."""
    import struct

    from raypack.inputs.reading import iter_document_batches

    table = pa.table({"input_ids": pa.array([[11, 12, 13], [14, 15, 16]], pa.list_(pa.int32()))})
    path = tmp_path / "s.arrow"
    with (paipc.new_file if kind == "file" else paipc.new_stream)(str(path), table.schema) as writer:
        writer.write_table(table)
    data = bytearray(path.read_bytes())
    at = data.find(struct.pack("<3i", 0, 3, 6))
    data[at:at + 12] = struct.pack("<3i", *offsets)
    path.write_bytes(bytes(data))
    said = (rf"shard {path}: record batch 0, column 'input_ids': its list offsets are not those of a list array "
            r"\(Offset invariant failure: .*\); the file is damaged or hostile: re-write it$")
    with pytest.raises(InputError, match=said):
        inspect_shard(str(path))
    with pytest.raises(InputError, match=said):
        list(iter_document_batches(str(path), "arrow", "input_ids", 10))
