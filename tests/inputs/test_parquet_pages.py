"""A Parquet text column's pages checked against its footer (raypack.inputs.parquet_pages): a footer that
lies is refused in one line before a page is decoded, and no file pyarrow writes is refused."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.errors import InputError
from raypack.inputs.parquet import iter_parquet_texts
from raypack.inputs.parquet_pages import DATA_PAGE, DATA_PAGE_V2, read_page_header
from tests.parquet_footer import set_footer_int


def texts_of(path, **kwargs) -> list[str]:
    return [t for _, batch in iter_parquet_texts(str(path), **kwargs) for t in batch.to_pylist()]


def test_a_footer_whose_row_counts_agree_on_a_lie_is_refused(tmp_path):
    """The file's num_rows, the row group's and the column's num_values all say 2; the page holds 4.
    pyarrow reads 2 rows: "cc" and "dd" were dropped, exit 0 (a hostile trial)."""
    texts = ["aa", "bb", "cc", "dd"]
    for dictionary in (True, False):
        path = tmp_path / f"lie-{dictionary}.parquet"
        pq.write_table(pa.table({"text": texts}), path, use_dictionary=dictionary)
        data = path.read_bytes()
        for field in [(3,), (4, 0, 3), (4, 0, 1, 0, 3, 5)]:
            data = set_footer_int(data, field, 2)
        path.write_bytes(data)
        assert pq.read_table(path)["text"].to_pylist() == ["aa", "bb"]  # what the footer makes pyarrow read
        with pytest.raises(InputError) as raised:
            texts_of(path)
        assert str(raised.value) == (
            f"text file {path} row group 0: its footer claims 2 rows, and the pages of its 'text' column hold 4 "
            "values; the footer is damaged or hostile: re-write or remove the file")


def test_a_footer_that_understates_a_text_is_refused_from_its_page_header(tmp_path, monkeypatch):
    """The footer says the column holds 1,000 bytes for a 4 MB text: the footer's check passed, and the page
    was decoded whole before the text was refused (a 147 KB file took 3.3 GB with 1.6 GB of text: a hostile
    trial). The page header is read, never the page."""
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": ["abc def " * 500_000]}), path, compression="zstd", use_dictionary=False)
    path.write_bytes(set_footer_int(path.read_bytes(), (4, 0, 1, 0, 3, 6), 1000))
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).total_uncompressed_size == 1000

    def no_page_read(*args, **kwargs):
        raise AssertionError("a page was read")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", no_page_read)
    with pytest.raises(InputError) as raised:
        texts_of(path, max_text_bytes=100_000)
    assert str(raised.value).startswith(
        f"text file {path} row group 0: a page of its 'text' column holds 4,000,0")
    assert "(its page header says) for 1 value, more than 1 text of max_document_bytes=100,000 take" in \
        str(raised.value)


def test_a_page_header_that_is_not_one_is_refused(tmp_path):
    """The footer points the column chunk at bytes that are no page header (its offset edited)."""
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["x" * 100] * 50}), path, use_dictionary=False, compression="none")
    offset = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    path.write_bytes(set_footer_int(path.read_bytes(), (4, 0, 1, 0, 3, 9), offset + 20))  # data_page_offset
    with pytest.raises(InputError, match=r"row group 0: no readable page header at byte [\d,]+ of its 'text' "
                                         r"column \(.*\); the file is damaged or hostile: re-write or remove it$"):
        texts_of(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.one_of(st.none(), st.text(max_size=300)), min_size=0, max_size=400),
       dictionary=st.booleans(), compression=st.sampled_from(["none", "snappy", "zstd", "gzip", "lz4", "brotli"]),
       version=st.sampled_from(["1.0", "2.0"]), page_size=st.sampled_from([64, 1024, 1 << 20]),
       row_group_size=st.integers(1, 500), statistics=st.booleans(), page_index=st.booleans(),
       large=st.booleans())
def test_no_file_pyarrow_writes_is_refused(tmp_path_factory, rows, dictionary, compression, version, page_size,
                                           row_group_size, statistics, page_index, large):
    """The pages' values are each row group's rows, whatever the writer's options: a false refusal would
    refuse a good corpus. Nulls are refused later, by the reader's own check."""
    path = tmp_path_factory.mktemp("p") / "a.parquet"
    column = pa.array(rows, pa.large_string() if large else pa.string())
    pq.write_table(pa.table({"text": column}), path, use_dictionary=dictionary, compression=compression,
                   data_page_version=version, data_page_size=page_size, row_group_size=row_group_size,
                   write_statistics=statistics, write_page_index=page_index)
    if None in rows:  # refused by the reader's own check, not by the pages'
        with pytest.raises(InputError, match=r"row \d+: .*null"):
            texts_of(path, max_text_bytes=1000)
    else:
        assert texts_of(path, max_text_bytes=1000) == rows
    metadata = pq.ParquetFile(path).metadata
    with pa.OSFile(str(path)) as source:
        for g in range(metadata.num_row_groups):
            chunk = metadata.row_group(g).column(0)
            offsets = [o for o in (chunk.dictionary_page_offset, chunk.data_page_offset) if o]  # 0: the magic
            if not offsets:  # a row group of no rows, with no page
                assert metadata.row_group(g).num_rows == 0
                continue
            offset = min(offsets)
            end, values = offset + chunk.total_compressed_size, 0
            while offset < end:
                page = read_page_header(source, offset, end)
                values += page.num_values if page.page_type in (DATA_PAGE, DATA_PAGE_V2) else 0
                offset += page.header_size + page.compressed_size
            assert offset == end and values == metadata.row_group(g).num_rows
