"""A one-pass task's ids past what it may hold in memory (raypack.tokenize.onepass), in a file until it is packed."""

from __future__ import annotations

import os
import tempfile
import uuid
import weakref
from contextlib import suppress
from typing import Iterator

import pyarrow as pa

from raypack.io.fs import is_uri
from raypack.packed.writer import TMP_PREFIX

__all__ = ["Spill"]


class Spill:
    """The ids of a task past its first ``held_tokens``, in order, in an Arrow IPC stream file: in
    the run's staging directory when that is local (so a crash leaves it to the next run's sweep),
    else in the system's temporary directory. :meth:`read` yields the pieces back and deletes the
    file; so does :meth:`discard`, or this object's end (``weakref.finalize``, at exit too).
    Memory: one piece at a time, either way."""

    def __init__(self, staging_dir: str, task_index: int, ids_type: pa.DataType) -> None:
        directory = tempfile.gettempdir() if is_uri(staging_dir) else staging_dir
        self.path = os.path.join(directory, f"{TMP_PREFIX}spill-{uuid.uuid4().hex}-task-{task_index:06d}.arrow")
        self._finalizer = weakref.finalize(self, _remove_quietly, self.path)
        self._sink = pa.OSFile(self.path, "wb")
        self._writer = pa.ipc.new_stream(self._sink, pa.schema([("ids", ids_type)]))

    def write(self, ids: pa.Array) -> None:
        self._writer.write_batch(pa.record_batch([ids], names=["ids"]))

    def close(self) -> None:
        """The last piece is written."""
        self._writer.close()
        self._sink.close()

    def read(self) -> Iterator[pa.Array]:
        """The pieces, in order; the file is deleted once they are all read."""
        with pa.OSFile(self.path, "rb") as source:
            for batch in pa.ipc.open_stream(source):
                yield batch.column(0)
        self.discard()

    def discard(self) -> None:
        """Delete the file (unread, or half written after an error)."""
        if not self._sink.closed:
            with suppress(Exception):  # after an error, which is the one to report
                self._writer.close()
            self._sink.close()
        self._finalizer()


def _remove_quietly(path: str) -> None:
    with suppress(FileNotFoundError):
        os.remove(path)
