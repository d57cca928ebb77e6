"""The page-level Parquet reader (raypack.inputs.parquet_pages) gives exactly pyarrow's rows, in pieces
of at most ``max_tokens`` tokens, for files written with many writer options; it refuses
malformed pages with one InputError line and hands unsupported encodings back to pyarrow; a
shard whose long document is read in pieces packs to the same bytes as whole-document reading."""

from __future__ import annotations

import contextlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raypack.inputs.parquet_pages as parquet_pages
import raypack.inputs.parquet_pages.page_streams as page_streams
import raypack.inputs.token_pieces as token_pieces
from raypack.errors import InputError
from raypack.inputs.parquet_pages import Unsupported, iter_row_group_pieces
from raypack.inputs.token_pieces import iter_token_pieces

from helpers import pack_one

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
TYPES = {"int32": pa.int32(), "int64": pa.int64(), "uint16": pa.uint16(), "uint32": pa.uint32()}


def write(path, docs, value_type=pa.int32(), large=False, nullable=(True, True), **options) -> None:
    """``nullable``: (the list, its elements); non-nullable ones change the definition levels."""
    element = pa.field("element", value_type, nullable=nullable[1])
    list_type = pa.large_list(element) if large else pa.list_(element)
    schema = pa.schema([pa.field("input_ids", list_type, nullable=nullable[0])])
    pq.write_table(pa.table({"input_ids": pa.array(docs, list_type)}, schema=schema), path, **options)


def read_pieces(path, max_tokens: int, reader=None):
    """Every row group's pieces, in order (the page reader for all of them)."""
    with pa.OSFile(str(path)) as source:
        parquet_file = pq.ParquetFile(source)
        first_row, pieces = 0, []
        for group in range(parquet_file.metadata.num_row_groups):
            pieces += iter_row_group_pieces(reader or source, parquet_file, group, "input_ids", first_row,
                                            max_tokens, str(path))
            first_row += parquet_file.metadata.row_group(group).num_rows
    return pieces


def joined(pieces) -> tuple[list[list[int]], list[int]]:
    """The documents the pieces hold (continued pieces joined), and the doc_lens they announce."""
    docs, lens = [], []
    for piece in pieces:
        rows = piece.docs.to_pylist()
        if piece.continued:
            assert docs and rows[0], "a continued piece continues a document with tokens"
            docs[-1] += rows.pop(0)
        assert piece.first_row == len(docs) - piece.continued
        docs += rows
        lens += piece.doc_lens.tolist()
    return docs, lens


def check_pieces(path, docs, max_tokens: int) -> list:
    pieces = read_pieces(path, max_tokens)
    assert all(len(p.docs.values) <= max_tokens for p in pieces)
    got, lens = joined(pieces)
    expected = pq.read_table(path).column("input_ids").to_pylist()
    assert got == expected == docs
    assert lens == [len(d) for d in docs]
    assert all(p.docs.type == pq.read_schema(path).field("input_ids").type for p in pieces)
    return pieces


# ----------------------------------------------------------------------------- equal to pyarrow


@st.composite
def writer_options(draw):
    return dict(compression=draw(st.sampled_from(["none", "snappy", "zstd", "gzip", "lz4", "brotli"])),
                use_dictionary=draw(st.booleans()),
                data_page_version=draw(st.sampled_from(["1.0", "2.0"])),
                data_page_size=draw(st.sampled_from([64, 1000, 1 << 20])),
                row_group_size=draw(st.integers(1, 40)))


@SETTINGS
@given(lengths=st.lists(st.one_of(st.integers(0, 5), st.integers(0, 1500)), max_size=25),
       type_name=st.sampled_from(sorted(TYPES)), large=st.booleans(), options=writer_options(),
       nullable=st.tuples(st.booleans(), st.booleans()), max_tokens=st.integers(1, 5000),
       window=st.sampled_from([1, 7, 64, 1 << 18]), seed=st.integers(0, 3))
def test_pieces_equal_pyarrow(tmp_path_factory, lengths, type_name, large, options, nullable, max_tokens, window,
                              seed):
    """``window``: levels decoded at a time, so that runs are read in parts at any bit offset."""
    rng = np.random.default_rng(seed)
    high = 1 << 16 if type_name == "uint16" else 1 << 31 if type_name != "int64" else 1 << 40
    vocab = rng.integers(0, high, size=50 + seed * 100_000 % 300_000)  # small (dictionary) or large vocabularies
    docs = [rng.choice(vocab, n).tolist() for n in lengths]
    path = tmp_path_factory.mktemp("p") / "x.parquet"
    write(path, docs, TYPES[type_name], large, nullable, **options)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parquet_pages, "_WINDOW", window)
        check_pieces(path, docs, max_tokens)


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_single_huge_row_in_pieces(tmp_path, version):
    docs = [np.random.default_rng(0).integers(0, 70_000, 200_003).tolist()]
    write(tmp_path / "x.parquet", docs, data_page_version=version, data_page_size=4096)
    pieces = check_pieces(tmp_path / "x.parquet", docs, 10_000)
    assert len(pieces) == 21 and [p.continued for p in pieces] == [False] + [True] * 20
    assert pieces[0].doc_lens.tolist() == [200_003] and all(p.doc_lens.size == 0 for p in pieces[1:])


def test_many_tiny_rows_and_empty_rows(tmp_path):
    docs = [[i % 7] * (i % 3) for i in range(20_000)]
    write(tmp_path / "x.parquet", docs, data_page_size=512, row_group_size=7000)
    pieces = check_pieces(tmp_path / "x.parquet", docs, 999)
    assert len(pieces) > 20


@pytest.mark.parametrize("nullable", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_every_schema_shape_with_empty_documents(tmp_path, nullable, version):
    """Definition levels of 1..3 bits, mixed (bit-packed) by empty documents."""
    docs = [[i] * (i % 3) for i in range(300)]
    write(tmp_path / "x.parquet", docs, nullable=nullable, data_page_version=version)
    check_pieces(tmp_path / "x.parquet", docs, 50)


def test_literal_cuts(tmp_path):
    write(tmp_path / "x.parquet", [[1, 2, 3], [], [4, 5, 6, 7, 8], [9], []])
    pieces = read_pieces(tmp_path / "x.parquet", 4)
    assert [(p.first_row, p.docs.to_pylist(), p.continued, p.doc_lens.tolist()) for p in pieces] == [
        (0, [[1, 2, 3], [], [4]], False, [3, 0, 5]),
        (2, [[5, 6, 7, 8]], True, []),
        (3, [[9], []], False, [1, 0])]


# ----------------------------------------------------------------------------- refusals and fallbacks


def page_offset(path) -> int:
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    return chunk.data_page_offset


def test_garbage_header_is_an_input_error(tmp_path):
    path = tmp_path / "x.parquet"
    write(path, [[1, 2, 3]] * 100, use_dictionary=False)
    data = bytearray(path.read_bytes())
    at = page_offset(path)
    data[at:at + 6] = b"\xff" * 6
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"x.parquet row group 0: malformed Parquet page .*; re-write the file$"):
        read_pieces(path, 50)


def test_truncated_page_is_an_input_error(tmp_path):
    path = tmp_path / "x.parquet"
    write(path, [list(range(1000))] * 10, compression="none", use_dictionary=False)
    data = path.read_bytes()
    short = pa.BufferReader(data[:page_offset(path) + 500])  # the footer read from the whole file, pages cut
    with pytest.raises(InputError, match=r"row group 0: malformed Parquet page \(truncated\)"):
        read_pieces(path, 50, reader=short)


def test_page_size_past_the_chunk_is_an_input_error(tmp_path):
    path = tmp_path / "x.parquet"
    write(path, [list(range(1000))] * 10, compression="none", use_dictionary=False)
    data = bytearray(path.read_bytes())
    at = page_offset(path)
    # compact header: type (0x15 0x00), uncompressed size (0x15 varint), compressed size (0x15 varint)
    assert data[at:at + 3] == b"\x15\x00\x15"
    size_at = at + 3 + next(i for i, b in enumerate(data[at + 3:]) if b < 0x80) + 2
    num_bytes = next(i for i, b in enumerate(data[size_at:]) if b < 0x80) + 1
    data[size_at:size_at + num_bytes] = b"\xfe" + b"\xff" * (num_bytes - 2) + b"\x7f"  # larger than the chunk
    path.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"malformed Parquet page \(page of \d+ bytes runs past the column chunk\)"):
        read_pieces(path, 50)


@pytest.mark.parametrize("docs, message", [
    ([[1], None, [2]], r"x.parquet row 1: the document is null; every document must be a list"),
    ([[1], [], [2, None, 3]], r"x.parquet row 2: a token of the document is null; token ids must be non-null"),
])
def test_nulls_name_their_row(tmp_path, docs, message):
    write(tmp_path / "x.parquet", docs)
    with pytest.raises(InputError, match=message):
        read_pieces(tmp_path / "x.parquet", 1)
    with pytest.raises(InputError, match=r"x.parquet row \d: "):
        list(iter_token_pieces(str(tmp_path / "x.parquet"), "parquet", max_tokens=1))


def test_unsupported_encoding_falls_back_to_pyarrow(tmp_path):
    path = tmp_path / "x.parquet"
    docs = [list(range(n)) for n in (5, 0, 3000, 7)]
    write(path, docs, use_dictionary=False, column_encoding={"input_ids.list.element": "DELTA_BINARY_PACKED"})
    with pytest.raises(Unsupported, match="value encoding"):
        read_pieces(path, 10)
    pieces = list(iter_token_pieces(str(path), "parquet", batch_size=2, max_tokens=10))
    assert joined(pieces) == (docs, [5, 0, 3000, 7]) and not any(p.continued for p in pieces)


def test_iter_token_pieces_reads_long_row_groups_by_pages(tmp_path):
    path = tmp_path / "x.parquet"
    docs = [[1] * 5000, [2] * 3]
    write(path, docs)
    pieces = list(iter_token_pieces(str(path), "parquet", max_tokens=1000))
    assert len(pieces) == 6 and joined(pieces) == (docs, [5000, 3])
    whole = list(iter_token_pieces(str(path), "parquet", max_tokens=1 << 20))
    assert len(whole) == 1 and joined(whole) == (docs, [5000, 3])


# ----------------------------------------------------------------------------- packing


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_packing_pieces_gives_the_same_chunks(tmp_path, strategy, monkeypatch):
    rng = np.random.default_rng(2)
    lengths = [3, 0, 100_001, 0, 2047, 2049, 60_000, 5]
    docs = [rng.integers(0, 50_000, n).tolist() for n in lengths]
    write(tmp_path / "x.parquet", docs, data_page_size=4096)
    piece_sizes = []
    original = token_pieces.iter_row_group_pieces

    def spy(*args):
        for piece in original(*args):
            piece_sizes.append(len(piece.docs.values))
            yield piece
    monkeypatch.setattr(token_pieces, "iter_row_group_pieces", spy)
    by_pages = pack_one(tmp_path / "x.parquet", tmp_path / "pages", strategy, 4093, token_offset=1000)
    assert len(piece_sizes) > 40 and max(piece_sizes) <= 4093  # really read in pieces
    monkeypatch.setattr(token_pieces, "PAGE_READ_MEAN_DIVISOR", 0)  # pyarrow, whole documents
    by_pyarrow = pack_one(tmp_path / "x.parquet", tmp_path / "pyarrow", strategy, 4093, token_offset=1000)
    assert by_pages.file.sha256 == by_pyarrow.file.sha256
    for name in ("num_docs", "num_nonempty_docs", "num_tokens", "num_split_docs"):
        assert getattr(by_pages, name) == getattr(by_pyarrow, name)
    if strategy == "concat":
        assert by_pages.head.input_ids.tolist() == by_pyarrow.head.input_ids.tolist()
        assert by_pages.tail.input_ids.tolist() == by_pyarrow.tail.input_ids.tolist()


# ----------------------------------------------------------------------------- page bodies in parts


def snappy_literal(data: bytes) -> bytes:
    n = len(data) - 1
    if n < 60:
        return bytes([n << 2]) + data
    num_bytes = (n.bit_length() + 7) // 8
    return bytes([(59 + num_bytes) << 2]) + n.to_bytes(num_bytes, "little") + data


def snappy_copy(length: int, offset: int, kind: int) -> bytes:
    """A copy element: kind 1 (length 4..11, offset < 2048), 2 (2-byte offset) or 3 (4-byte offset)."""
    if kind == 1:
        return bytes([(offset >> 8) << 5 | (length - 4) << 2 | 1, offset & 0xFF])
    return bytes([(length - 1) << 2 | kind]) + offset.to_bytes(2 if kind == 2 else 4, "little")


def snappy_stream(elements: list[bytes], size: int) -> bytes:
    return page_streams._varint(size) + b"".join(elements)


@contextlib.contextmanager
def parts_of_64k():
    """Parts of 64 KiB; yields the lists of the snappy parts tried (True: cut at a fragment)
    and of the bodies read by parts (codec, decompressed size)."""
    cuts, bodies, original_part, original_parts = [], [], page_streams._snappy_part, parquet_pages.iter_body_parts

    def spy_part(window, start, ratio):
        part, end = original_part(window, start, ratio)
        cuts.append(part is not None)
        return part, end

    def spy_parts(read, size, uncompressed, codec):
        bodies.append((codec, uncompressed))
        return original_parts(read, size, uncompressed, codec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(page_streams, "GROUP", 1 << 16)
        patch.setattr(page_streams, "_snappy_part", spy_part)
        patch.setattr(parquet_pages, "iter_body_parts", spy_parts)
        yield cuts, bodies


def body_parts(compressed: bytes, size: int, codec: str | None):
    """(parts, the sizes read, the snappy parts tried) with 64 KiB parts."""
    reads = []

    def read(pos, n):
        reads.append(n)
        return compressed[pos:pos + n]
    with parts_of_64k() as (cuts, _):
        parts = [bytes(p) for p in page_streams.iter_body_parts(read, len(compressed), size, codec)]
    return parts, reads, cuts


def snappy_fragments(seed: int, size: int, cross: bool) -> tuple[bytes, bytes]:
    """A valid snappy stream built by hand of random elements, 64 KiB fragments whose copies stay
    inside their fragment unless ``cross``: (the stream, the bytes it decodes to)."""
    rng = np.random.default_rng(seed)
    out, elements = bytearray(), []
    while len(out) < size:
        fragment_start = len(out) // 65536 * 65536 if not cross else 0
        left = min(size, fragment_start + 65536) - len(out) if not cross else size - len(out)
        room = len(out) - fragment_start
        kind = int(rng.integers(0, 4)) if room >= 8 else 0
        if kind == 0:
            n = int(min(left, rng.choice([rng.integers(1, 61), rng.integers(61, 300), rng.integers(300, 70_000)])))
            data = rng.integers(0, 256, n, np.uint8).tobytes()
            elements.append(snappy_literal(data))
            out += data
            continue
        length = int(min(left, rng.integers(4, 12) if kind == 1 else rng.integers(1, 65)))
        kind = 2 if kind == 1 and length < 4 else kind
        offset = int(rng.integers(1, min(room, 2047 if kind == 1 else 65535) + 1))
        elements.append(snappy_copy(length, offset, kind))
        for _ in range(length):
            out.append(out[-offset])
    return snappy_stream(elements, size), bytes(out)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), size=st.integers(2 * 65536 + 1, 4 * 65536), cross=st.booleans())
def test_snappy_parts_equal_the_whole(seed, size, cross):
    """Every tag kind and literal length form; without ``cross`` every part but the last is cut
    at a fragment; with it the bytes are still right (pyarrow refuses a part, the rest is whole)."""
    compressed, expected = snappy_fragments(seed, size, cross)
    assert bytes(pa.decompress(compressed, len(expected), codec="snappy")) == expected  # a valid stream
    parts, _, cuts = body_parts(compressed, len(expected), "snappy")
    assert b"".join(parts) == expected
    if not cross:
        assert cuts and all(cuts) and len(parts) == -(-len(expected) // 65536)


def test_snappy_copy_across_fragments_falls_back():
    """A copy in the second 64 KiB reaching into the first: pyarrow refuses the part, so the rest
    comes from the whole body (after the first part, already cut)."""
    rng = np.random.default_rng(0)
    first, second, third = (rng.integers(0, 256, n, np.uint8).tobytes() for n in (65536, 100, 65536 - 164))
    tail = rng.integers(0, 256, 70_000, np.uint8).tobytes()
    elements = [snappy_literal(first), snappy_literal(second), snappy_copy(64, 150, 2), snappy_literal(third),
                snappy_literal(tail)]
    expected = first + second + first[-50:] + second[:14] + third + tail
    compressed = snappy_stream(elements, len(expected))
    assert bytes(pa.decompress(compressed, len(expected), codec="snappy")) == expected
    parts, _, cuts = body_parts(compressed, len(expected), "snappy")
    assert cuts == [True, False] and [len(p) for p in parts] == [65536, len(expected) - 65536]
    assert b"".join(parts) == expected


def test_snappy_element_across_the_cut_falls_back():
    """A literal crossing 64 KiB (not a fragment compressor): one decompression of the whole."""
    data = np.random.default_rng(0).integers(0, 256, 3 * 65536, np.uint8).tobytes()
    compressed = snappy_stream([snappy_literal(data[:1000]), snappy_literal(data[1000:])], len(data))
    parts, reads, cuts = body_parts(compressed, len(data), "snappy")
    assert parts == [data] and cuts == [False] and reads[-1] == len(compressed)


@pytest.mark.parametrize("codec", [None, "snappy", "zstd", "gzip", "brotli"])
def test_body_parts_are_bounded(codec):
    """Uncompressed, pyarrow's snappy (fragments of 64 KiB) and streamed codecs: parts of 64 KiB,
    reads of at most a part and a quarter."""
    rng = np.random.default_rng(0)
    data = np.concatenate([rng.integers(0, 50, 200_000), np.tile(rng.integers(0, 9, 7), 30_000)]).astype("<u2")
    data = data.tobytes()
    compressed = bytes(pa.compress(data, codec=codec)) if codec else data
    parts, reads, cuts = body_parts(compressed, len(data), codec)
    assert b"".join(parts) == data and len(parts) == -(-len(data) // 65536)
    assert max(len(p) for p in parts) == 65536 and max(reads) <= 65536 + 65536 // 4 + 8192
    assert all(cuts) and len(cuts) == (len(parts) - 1 if codec == "snappy" else 0)


def test_streamed_codec_failing_at_once_falls_back(monkeypatch):
    """pyarrow's stream refusing the body at its first read: one decompression of the whole."""
    data = np.random.default_rng(0).integers(0, 9, 300_000, np.uint8).tobytes()
    compressed = bytes(pa.compress(data, codec="zstd"))

    class Refusing:
        def __init__(self, *args):
            pass

        def read(self, n):
            raise pa.ArrowInvalid("no")
    monkeypatch.setattr(pa, "CompressedInputStream", Refusing)
    parts, reads, _ = body_parts(compressed, len(data), "zstd")
    assert parts == [data] and reads == [len(compressed)]


@st.composite
def long_tokens(draw) -> np.ndarray:
    """200K-300K tokens: random, repeated phrases (copy-heavy), or both in turns of 5000."""
    rng = np.random.default_rng(draw(st.integers(0, 100)))
    n = draw(st.integers(200_000, 300_000))
    vocab = rng.integers(0, 1 << 30, draw(st.sampled_from([300, 40_000])))
    kind = draw(st.sampled_from(["random", "phrases", "mixed"]))
    tokens = vocab[rng.integers(0, vocab.size, n)]
    if kind != "random":
        book = vocab[rng.integers(0, vocab.size, 600)]
        phrases = np.lib.stride_tricks.sliding_window_view(np.tile(book, 2), 8)[rng.integers(0, 600, n // 8 + 1)]
        repeated = phrases.reshape(-1)[:n]
        tokens = repeated if kind == "phrases" else np.where((np.arange(n) // 5000) % 2 == 1, tokens, repeated)
    return tokens.astype(np.int32)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=long_tokens(), options=st.fixed_dictionaries(dict(
    compression=st.sampled_from(["snappy", "snappy", "none", "zstd", "gzip"]), use_dictionary=st.booleans(),
    data_page_version=st.sampled_from(["1.0", "2.0"]))), num_short=st.integers(0, 3),
    max_tokens=st.sampled_from([9_999, 1 << 20]))
def test_pages_in_parts_equal_pyarrow(tmp_path_factory, tokens, options, num_short, max_tokens):
    """One long document (and a few short ones in its page): pages of 200K-1.2M bytes read in
    parts of 64 KiB, random or copy-heavy (repeated phrases) tokens, dictionary indices of 9 or
    16 bits or PLAIN; pyarrow's large snappy pages are really cut (v2 pages pyarrow could not
    compress are stored uncompressed)."""
    lengths = np.array([7] * num_short + [tokens.size] + [3] * num_short)
    values = np.concatenate([tokens[:7]] * num_short + [tokens] + [tokens[-3:]] * num_short)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    path = tmp_path_factory.mktemp("p") / "x.parquet"
    pq.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, values)}), path, **options)
    with parts_of_64k() as (cuts, bodies):
        pieces = read_pieces(path, max_tokens)
    got = np.concatenate([p.docs.values.to_numpy() for p in pieces])
    assert np.array_equal(got, values) and np.array_equal(got, pq.read_table(path)["input_ids"].combine_chunks().values)
    assert np.concatenate([p.doc_lens for p in pieces]).tolist() == lengths.tolist()
    assert sum(len(p.docs) - p.continued for p in pieces) == lengths.size
    assert all(cuts) and (len(cuts) >= 1) == any(codec == "snappy" and n > 2 * 65536 for codec, n in bodies)
    assert max(n for _, n in bodies) > 2 * 65536
