"""The text plan reads its files on threads (an object store's latency per file: identities and footers);
the tasks, their numbers and the first bad file named are those of reading them one after another."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raypack.tokenize.job as job
from raypack.errors import InputError
from raypack.pack.resume import file_mark, sampled_identity
from raypack.tokenize.job import TextOptions, plan_text_tasks


@pytest.fixture
def texts(tmp_path):
    root = tmp_path / "text"
    root.mkdir()
    for k in range(40):
        pq.write_table(pa.table({"text": [f"doc {k} {i}" for i in range(3 + k % 4)]}), root / f"t{k:03d}.parquet",
                       row_group_size=2)
    return root


def test_tasks_follow_the_input_order_whatever_the_threads(texts, monkeypatch):
    options = TextOptions(tokenizer="x", task_rows=2)
    tasks = plan_text_tasks((str(texts),), options)
    monkeypatch.setattr(job, "PLAN_THREADS", 1)
    assert plan_text_tasks((str(texts),), options) == tasks
    assert [t.task_index for t in tasks] == list(range(len(tasks)))
    paths = [t.path for t in tasks]
    assert paths == sorted(paths) and len(set(paths)) == 40 and len(tasks) > 40
    assert all(t.planned == file_mark(sampled_identity(t.path, "parquet")) for t in tasks[:3])


def test_the_first_bad_file_in_order_is_named(texts):
    for name in ("t007.parquet", "t031.parquet"):
        (texts / name).write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match="t007.parquet"):
        plan_text_tasks((str(texts),), TextOptions(tokenizer="x"))
