"""What a one-pass packer actor hands back (raypack.engine.workers), read as the driver reads it: no Ray needed."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pyarrow as pa

from raypack.engine.workers import TextPackerActor
from raypack.errors import InputChanged, InputError, worker_error_from_text
from raypack.pack.tasks import ShardResult, ShardTask, result_to_table, table_to_results
from raypack.packed.writer import WrittenFile
from raypack.rules.arrays import from_stream_bytes, stream_bytes
from raypack.rules.core import Fragment


def test_bad_input_in_a_packer_comes_back_as_one_error_row_of_its_kind():
    """An InputError (an input that changed, too) raised inside ``pack`` comes back as IPC bytes of one row
    ``(task_index, error)``, and the driver's reading of it (raypack.engine.pipeline.pack_texts) gives back the
    same line and kind, not an exception through Ray."""
    task = ShardTask(shard_index=0, path="in/a.parquet", format="parquet", doc_offset=0, token_offset=0, num_docs=1,
                     num_tokens=1, task_index=7)
    for error in (InputError("in/a.parquet row 3: the document is null"), InputChanged("in/a.parquet changed")):
        actor = object.__new__(TextPackerActor)  # as a new actor whose tokenizer load was refused
        actor.load_error = error
        table = from_stream_bytes(actor.pack(asdict(task)))
        assert table.column_names == ["task_index", "error"] and table.num_rows == 1
        (index,), (text,) = table.column("task_index").to_pylist(), table.column("error").to_pylist()
        back = worker_error_from_text(text)
        assert index == 7 and type(back) is type(error) and str(back) == str(error)


def test_a_result_row_survives_the_bytes_with_or_without_its_file_and_fragments():
    fragment = Fragment(5, np.array([1, 2, 3], np.uint16), np.array([7], np.int64), np.array([3], np.int32))
    full = ShardResult(shard_index=1, file=WrittenFile("chunks-1.arrow", 3, 4, 100, "ab" * 32, "cd" * 32),
                       head=fragment, tail=None, num_docs=3, num_nonempty_docs=2, num_tokens=10, num_split_docs=1,
                       peak_rss_bytes=5, started_at=1.5, finished_at=2.5, task_index=4)
    empty = ShardResult(shard_index=2, file=None, head=None, tail=fragment, num_docs=0, num_nonempty_docs=0,
                        num_tokens=0, num_split_docs=0)
    tables = [from_stream_bytes(stream_bytes(result_to_table(r, pa.uint16()))) for r in (full, empty)]
    assert tables[0].schema == tables[1].schema  # one schema: a missing file or fragment is a null of its type
    for want, got in zip((full, empty), table_to_results(pa.concat_tables(tables))):
        for field in ("shard_index", "file", "num_docs", "num_nonempty_docs", "num_tokens", "num_split_docs",
                      "peak_rss_bytes", "started_at", "finished_at", "task_index"):
            assert getattr(got, field) == getattr(want, field), field
        for name in ("head", "tail"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None) == (b is None)
            if a is not None:
                assert a.start == b.start and all(np.array_equal(x, y) and x.dtype == y.dtype
                                                  for x, y in zip(a[1:], b[1:]))
