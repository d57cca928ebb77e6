"""Writing packed output: the Arrow schema, chunk files that appear whole, the manifest.

See docs/FORMAT.md. Every file is written through :class:`AtomicFile`, so it appears whole or
not at all: in a local directory under a temporary name, fsynced and renamed into place; on
an object store (any non-local ``pyarrow.fs`` filesystem) as one upload straight to its final
key, which the store shows only once the upload completes. The manifest is written last, so
an output without one is visibly incomplete. Record batches start at global chunk indices
that are multiples of ``chunks_per_record_batch``, so a file's bytes depend only on which
chunks it holds, never on how they were read or computed.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import posixpath
import re
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.io.fs import resolve_filesystem
from raypack.io.threads import JOIN_TIMEOUT_S, call_within, interruptible, left_behind_level, stop_pool
from raypack.rules.arrays import arrow_array
from raypack.rules.content_digest import ContentHasher, RangeDigester
from raypack.rules.core import Chunks, concat_chunks
from raypack.rules.side_columns import SideColumn, split_fields

log = logging.getLogger(__name__)

FORMAT_VERSION = 3
"""The manifest's ``format_version``. 3: ``content_sha256`` is the content digest of the chunks
(raypack.rules.content_digest); 2: it hashed the files' sha256 digests (:func:`files_sha256`)."""
CHUNK_FILE_VERSION = 2
"""A chunk file's schema metadata ``raypack.format_version``: its layout, unchanged since format
version 2 (version 3 changed only the manifest), so version 2 and 3 outputs hold the same bytes."""
MANIFEST_NAME = "manifest.json"
TMP_PREFIX = ".tmp-"
WRITEBACK_BYTES = 8 << 20
"""A local file being written asks the kernel to start writing back every this many bytes."""
_CAN_START_WRITEBACK = hasattr(os, "posix_fadvise")


CHUNK_FILE_RE = re.compile(r"^chunks-(\d{12})-([0-9a-f]{16})\.arrow$")
"""A chunk file's name: its first global chunk and the first 16 hex digits of its sha256."""


def chunk_file_name(first_chunk: int, sha256: str) -> str:
    """``chunks-{first_chunk:012d}-{sha256[:16]}.arrow``: content-addressed, so the same chunks
    always get the same name and different bytes never hide under a name a reader knows."""
    return f"chunks-{first_chunk:012d}-{sha256[:16]}.arrow"


def chunk_file_stem(first_chunk: int) -> str:
    """The name a chunk file is written under until its hash is known."""
    return f"chunks-{first_chunk:012d}.arrow"


def side_arrow_type(type_name: str) -> pa.DataType:
    """The Arrow value type of a side column of numpy type ``type_name`` (bool: Arrow's bool)."""
    return pa.bool_() if type_name == "bool" else pa.from_numpy_dtype(np.dtype(type_name))


def chunk_schema(context_length: int, token_type: pa.DataType, pad_token: int,
                 extra_columns: Sequence[SideColumn] = ()) -> pa.Schema:
    """The chunk files' schema; side columns (raypack.rules.side_columns) follow ``segment_lengths``,
    each ``fixed_size_list<its type>[C]``, and are listed in the metadata (absent without any)."""
    sides = [pa.field(c.name, pa.list_(side_arrow_type(c.type), context_length)) for c in extra_columns]
    metadata = {
        "raypack.format_version": str(CHUNK_FILE_VERSION),
        "raypack.context_length": str(context_length),
        "raypack.pad_token": str(pad_token),
    }
    if extra_columns:
        metadata["raypack.extra_columns"] = json.dumps([c._asdict() for c in extra_columns])
    return pa.schema(
        [
            pa.field("chunk_index", pa.int64()),
            pa.field("input_ids", pa.list_(token_type, context_length)),
            pa.field("segment_doc_ids", pa.list_(pa.int64())),
            pa.field("segment_lengths", pa.list_(pa.int32())),
            *sides,
        ],
        metadata=metadata,
    )


def schema_record_dtype(schema: pa.Schema) -> np.dtype:
    """The record dtype (raypack.rules.side_columns.record_dtype) of a chunk schema's tokens and side columns."""
    names = ["input_ids", *schema.names[4:]]
    return np.dtype([(name, np.dtype(schema.field(name).type.value_type.to_pandas_dtype()).newbyteorder("<"))
                     for name in names])


def chunks_to_record_batch(chunks: Chunks, first_chunk: int, schema: pa.Schema) -> pa.RecordBatch:
    """Zero-copy wrap of ``chunks`` as a record batch of ``schema``; side columns from
    ``chunks.sides`` (records in ``input_ids`` are split first, one copy per field)."""
    if chunks.input_ids.dtype.kind == "V":
        tokens, sides = split_fields(chunks.input_ids, schema_record_dtype(schema))
        chunks = chunks._replace(input_ids=tokens, sides=sides)
    n, c = chunks.input_ids.shape
    offsets = arrow_array(chunks.segment_offsets.astype(np.int32))
    columns = [
        arrow_array(np.arange(first_chunk, first_chunk + n, dtype=np.int64)),
        pa.FixedSizeListArray.from_arrays(arrow_array(np.ascontiguousarray(chunks.input_ids).reshape(-1)), c),
        pa.ListArray.from_arrays(offsets, arrow_array(chunks.segment_doc_ids)),
        pa.ListArray.from_arrays(offsets, arrow_array(chunks.segment_lengths)),
        *(pa.FixedSizeListArray.from_arrays(arrow_array(np.ascontiguousarray(side).reshape(-1)), c)
          for side in chunks.sides),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def slice_chunks(chunks: Chunks, start: int, stop: int) -> Chunks:
    """Chunks ``[start, stop)`` of ``chunks``, as views with offsets rebased to 0."""
    offsets = chunks.segment_offsets[start: stop + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    return Chunks(
        chunks.input_ids[start:stop],
        offsets - first,
        chunks.segment_doc_ids[first:last],
        chunks.segment_lengths[first:last],
        tuple(side[start:stop] for side in chunks.sides),
    )


class AtomicFile:
    """A new file in directory ``out_dir`` (a local path or a URI) that appears whole.

    ``name`` is the final name, or, with ``named_at_commit=True``, only a stem: the final name
    is then given to :meth:`commit` (a content-addressed name is known only once the bytes are).

    Local: written as ``.tmp-<uuid>-<name>`` beside its final name (opened at once), fsynced
    and renamed into place by :meth:`commit`. Object store: one upload, opened by the first
    :meth:`write` and completed by :meth:`commit`; the store shows the object only then, and a
    process that dies mid-upload leaves none. When the name comes at commit, the upload goes to
    ``.tmp-<uuid>-<name>`` and is copied to its final key by the store (no bytes through
    this process), then the temporary object is deleted. pyarrow cannot abort an upload from
    Python (closing or dropping the stream completes it), so :meth:`abort` deletes the object
    right after closing it: a partial object exists only for that moment, and no manifest
    ever lists it.
    """

    def __init__(self, out_dir: str, name: str, *, make_dirs: bool = False, named_at_commit: bool = False) -> None:
        self._fs, self._base = resolve_filesystem(out_dir)
        self.path = posixpath.join(self._base, name)
        self.is_local = isinstance(self._fs, pafs.LocalFileSystem)
        self._stream = None
        self._dropped_to = self._flushed_to = self._unflushed = 0
        self._upload_path = self.path
        tmp_name = f"{TMP_PREFIX}{uuid.uuid4().hex}-{posixpath.basename(name)}"
        if self.is_local:
            if make_dirs:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._upload_path = os.path.join(os.path.dirname(self.path), tmp_name)
            try:
                self._stream = open(self._upload_path, "wb")
            except BaseException:  # a Ctrl-C handled as open() returns: the file is there, unnamed by anyone
                with contextlib.suppress(OSError):
                    os.remove(self._upload_path)
                raise
        elif named_at_commit:
            self._upload_path = posixpath.join(posixpath.dirname(self.path), tmp_name)

    def write(self, data) -> int:
        if not self.is_local:  # on the main thread (a manifest, a boundary file), a Ctrl-C reaches it meanwhile
            return interruptible(lambda: self._write_remote(data), "raypack-upload")
        n = self._stream.write(data)
        if self.is_local and _CAN_START_WRITEBACK:
            self._unflushed += n
            if self._unflushed >= WRITEBACK_BYTES:
                self._start_writeback()
        return n

    def _write_remote(self, data) -> int:
        if self._stream is None:
            self._stream = self._fs.open_output_stream(self._upload_path)
        return self._stream.write(data)

    def _start_writeback(self) -> None:
        """Have the kernel start writing what was written so far, without waiting for it, so
        that the fsync in :meth:`commit` finds little left to write, and drop from the page cache
        what the step before wrote (written back by now, mostly). Durability still comes from that
        fsync; this only spreads the disk writes over the time the file is written.

        On Linux, POSIX_FADV_DONTNEED starts writeback of the range's dirty pages and drops its
        clean ones; pages still dirty or under writeback stay, and the fsync writes them. So a file
        being written holds about two ``WRITEBACK_BYTES`` steps of page cache, not all its bytes:
        a large job does not fill the page cache with its output, and its writes reuse the same
        pages. Measured on this project's 2-core VM, ``raypack pack --local`` of 600M int32 tokens
        (2.4 GB out): 6.0-6.3 s against 7.5-8.8 s, 1.7-2.3 against 4.6-6.9 system CPU-s, and the
        page cache grew by 0.4 against 2.5 GB (BENCHMARKS.md, 2026-12-05).
        """
        self._stream.flush()
        # From the step before's start: its pages have had this step's time to be written back.
        end = self._flushed_to + self._unflushed
        os.posix_fadvise(self._stream.fileno(), self._dropped_to, end - self._dropped_to, os.POSIX_FADV_DONTNEED)
        self._dropped_to, self._flushed_to = self._flushed_to, end
        self._unflushed = 0

    def commit(self, name: str | None = None) -> None:
        """Make the file visible under its final name (``name``, if given), complete."""
        if name is not None:
            self.path = posixpath.join(posixpath.dirname(self.path), name)
        if self._stream is None:
            self.write(b"")
        if self.is_local:
            self._stream.flush()
            os.fsync(self._stream.fileno())
            self._stream.close()
            os.replace(self._upload_path, self.path)
            return
        interruptible(self._upload, "raypack-upload")  # a Ctrl-C reaches a main thread that waits on the store

    def _upload(self) -> None:
        self._stream.close()
        if self._upload_path != self.path:
            self._fs.copy_file(self._upload_path, self.path)
            self._delete(self._upload_path)

    def abort(self) -> None:
        """Leave nothing behind (on error). On an object store, waited for at most ``JOIN_TIMEOUT_S``: closing
        the upload and deleting it are requests to a store that may have stopped answering (a Ctrl-C then held
        the run for minutes: an operator's trial); what is left is what a killed run leaves."""
        if self._stream is None:
            return
        if self.is_local:
            try:
                self._stream.close()
            finally:
                if os.path.exists(self._upload_path):
                    os.remove(self._upload_path)
            return
        if not call_within(self._drop_upload, JOIN_TIMEOUT_S, "raypack-abort"):
            log.log(left_behind_level(), "could not drop the upload %s (the store did not answer in time); a later "
                    "--overwrite or --resume of this output removes it", self._upload_path)

    def _drop_upload(self) -> None:
        try:
            self._stream.close()
        finally:
            self._delete(self._upload_path)

    def _delete(self, path: str) -> None:
        try:
            self._fs.delete_file(path)
        except FileNotFoundError:
            pass
        except OSError as e:  # keep the original error; the object is never listed in a manifest
            log.warning("could not delete the partial object %s: %s", path, e)


class Committer:
    """Publishes finished files on one background thread, in the order submitted, so that a file's
    fsync (a wait on the disk, not CPU) overlaps writing the next one.

    ``submit(publish, abort)`` queues ``publish()`` (e.g. :meth:`AtomicFile.commit`, or a chunk
    file's commit and then its resume record); if it raises, ``abort()`` runs on the thread and the
    error is kept. Each queued job holds what its publish needs (an open file), so at most
    ``max_pending`` are queued: a submit beyond waits for the oldest. An earlier job's error is raised
    by the next :meth:`submit` (which then aborts its own job without running it), so a full disk
    stops the writers within ``max_pending`` files, not at the end. :meth:`wait` blocks until every
    job submitted has ended and raises the first error; :meth:`drain` does the same without raising.
    Several threads may submit. As a context manager: the thread ends on exit, after every job
    (published, or failed and aborted); on a clean exit the first error is raised. On Ctrl-C or SIGTERM
    (KeyboardInterrupt) the jobs queued are dropped (aborted: their files removed) and the running one waited for a
    bounded time (:func:`raypack.io.threads.stop_pool`): an upload to a store that stopped answering is not waited
    out.
    """

    def __init__(self, max_pending: int = 2) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending} must be >= 1")
        self.max_pending = max_pending
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raypack-publish")
        self._futures: collections.deque[Future] = collections.deque()
        self._aborts: dict[Future, Callable[[], None]] = {}
        """Each job not yet forgotten: its abort (run for a job a Ctrl-C cancels before it starts)."""
        self._lock = threading.Lock()

    def submit(self, publish: Callable[[], None], abort: Callable[[], None]) -> None:
        try:
            with self._lock:
                self._raise_failed()
                while len(self._futures) >= self.max_pending:
                    self._futures[0].exception()  # waits for the oldest
                    self._raise_failed()
                future = self._pool.submit(publish_or_abort, publish, abort)
                self._futures.append(future)
                self._aborts[future] = abort
        except BaseException:  # an earlier job's error, Ctrl-C while waiting (or taking the lock), a closed committer
            abort()
            raise

    def submit_file(self, file: AtomicFile) -> None:
        """Queue ``file``'s commit (fsync and rename; one upload on an object store)."""
        self.submit(file.commit, file.abort)

    def _raise_failed(self) -> None:
        """Forget the jobs that ended well; raise the error of one that failed."""
        while self._futures and self._futures[0].done():
            future = self._futures.popleft()
            self._aborts.pop(future, None)
            error = future.exception()
            if error is not None:
                raise error

    def wait(self) -> None:
        """Wait for every job submitted; raise the first error (after all have ended)."""
        with self._lock:
            futures, self._futures, self._aborts = list(self._futures), collections.deque(), {}
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def drain(self) -> None:
        """Wait for every job submitted, ignoring their errors (before cleaning up after one)."""
        with self._lock:
            futures, self._futures, self._aborts = list(self._futures), collections.deque(), {}
        for future in futures:
            future.exception()

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, exc_type: type | None, *exc_info: object) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):  # a command being stopped
            jobs = list(self._futures)
            stop_pool(self._pool, jobs)  # an upload that hangs is not waited out (raypack.io.threads)
            dropped = [self._aborts[f] for f in jobs if f.cancelled() and f in self._aborts]
            # what the dropped jobs wrote goes, as their aborts leave it (a partial file was left: CI)
            call_within(lambda: _abort_all(dropped), JOIN_TIMEOUT_S, "raypack-abort")
            return
        self._pool.shutdown(wait=True)  # every job has ended: published, or failed and aborted
        if exc_type is None:
            self.wait()


def _abort_all(aborts: list[Callable[[], None]]) -> None:
    """Run each abort; an error in one (the command is being stopped anyway) does not stop the next."""
    for abort in aborts:
        try:
            abort()
        except Exception:  # noqa: BLE001 - the Ctrl-C is what the caller reports
            log.debug("an abort failed while stopping", exc_info=True)


def publish_or_abort(publish: Callable[[], None], abort: Callable[[], None]) -> None:
    """``publish()``; if it raises, ``abort()`` and re-raise (what a :class:`Committer` runs, here)."""
    try:
        publish()
    except BaseException:
        abort()
        raise


class HashingSink:
    """A write-only file object that hashes what passes through it and writes it to ``f``.

    Hashing and writing happen in order on one background thread (both release the GIL), so
    they overlap the caller's decoding and packing. ``write`` only queues (at most
    ``max_queued`` bytes; the queue keeps a reference to each buffer, which the caller never
    changes afterwards). :meth:`finish` waits for everything queued and raises the first
    error the thread met (as does the next ``write`` after an error).
    """

    def __init__(self, f, max_queued: int = 16 << 20) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0
        self.closed = False
        self._max_queued = max_queued
        self._queue: collections.deque = collections.deque()
        self._queued = 0
        self._error: BaseException | None = None
        self._stopping = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="raypack-chunk-writer", daemon=True)
        self._thread.start()

    def write(self, data) -> int:
        view = memoryview(data)
        with self._cond:
            while self._queued > self._max_queued and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            self._queue.append(view)
            self._queued += view.nbytes
            self.num_bytes += view.nbytes
            self._cond.notify_all()
        return view.nbytes

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                view = self._queue[0]
            try:
                if self._error is None:
                    self.sha256.update(view)
                    self._f.write(view)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                with self._cond:
                    self._error = e
            with self._cond:
                self._queue.popleft()
                self._queued -= view.nbytes
                self._cond.notify_all()

    def finish(self) -> None:
        """Wait until everything queued is hashed and written; raise the thread's error."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def flush(self) -> None:
        pass  # the thread writes in order; commit flushes and syncs the file

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True


class WrittenFile(NamedTuple):
    path: str
    first_chunk: int
    num_chunks: int
    num_bytes: int
    sha256: str
    digests: str = ""
    """The range digests of the file's chunks (raypack.rules.content_digest), 64 hex digits each; for
    the driver's ``content_sha256`` and resume records, never the manifest's ``files``."""


class ChunkFileWriter:
    """Writes one chunk file: appends chunks in order, then publishes it whole (:class:`AtomicFile`).

    Rows are buffered until a record batch boundary (a global multiple of
    ``chunks_per_record_batch``), so the bytes do not depend on how chunks arrive. The chunks'
    range digests (raypack.rules.content_digest) are computed as each batch is written, on the
    caller's thread (a thread of their own cost the token job 8-13% of its wall time on 2 cores:
    BENCHMARKS.md, "2026-12-05: the content digest on the packer's thread"); the file's bytes are hashed and
    written on :class:`HashingSink`'s thread. The digests are returned in :attr:`WrittenFile.digests`.
    """

    def __init__(self, out_dir: str, first_chunk: int, schema: pa.Schema, chunks_per_record_batch: int) -> None:
        self.out_dir = out_dir
        self.first_chunk = first_chunk
        self.next_chunk = first_chunk
        self.schema = schema
        self.batch_rows = chunks_per_record_batch
        self._file = AtomicFile(out_dir, chunk_file_stem(first_chunk), named_at_commit=True)
        try:
            self._sink = HashingSink(self._file)
            self._writer = pa.ipc.new_file(pa.PythonFile(self._sink, mode="w"), schema)
        except BaseException:  # a Ctrl-C too: the file just opened goes (a trial found .tmp files left)
            self._file.abort()
            raise
        self._pending: list[Chunks] = []
        self._pending_rows = 0
        self._digester = RangeDigester(first_chunk)
        self.record = schema_record_dtype(schema)
        self._name = ""

    @property
    def num_chunks(self) -> int:
        """Chunks written so far, buffered ones included."""
        return self.next_chunk - self.first_chunk + self._pending_rows

    def write(self, chunks: Chunks) -> None:
        """Append complete chunks (they continue from the last ones written)."""
        start = 0
        while start < chunks.num_chunks:
            room = self.batch_rows - (self.next_chunk + self._pending_rows) % self.batch_rows
            take = min(room, chunks.num_chunks - start)
            self._pending.append(slice_chunks(chunks, start, start + take))
            self._pending_rows += take
            start += take
            if take == room:
                self._flush()

    def _flush(self) -> None:
        if not self._pending_rows:
            return
        context_length = self.schema.field("input_ids").type.list_size
        merged = concat_chunks(self._pending, context_length, self._pending[0].input_ids.dtype)
        tokens, sides = split_fields(merged.input_ids, self.record)
        merged = merged._replace(input_ids=tokens, sides=sides)
        self._writer.write_batch(chunks_to_record_batch(merged, self.next_chunk, self.schema))
        self._digester.add(tokens, merged.segment_offsets, merged.segment_doc_ids, merged.segment_lengths, sides)
        self.next_chunk += self._pending_rows
        self._pending, self._pending_rows = [], 0

    def finish(self) -> WrittenFile:
        """Write the last record batch and the footer: the file is complete, not yet visible
        (:meth:`publish` shows it under its name; :meth:`abort` drops it)."""
        self._flush()
        self._writer.close()
        self._sink.finish()
        sha256 = self._sink.sha256.hexdigest()
        self._name = chunk_file_name(self.first_chunk, sha256)
        return WrittenFile(self._name, self.first_chunk, self.next_chunk - self.first_chunk, self._sink.num_bytes,
                           sha256, self._digester.hex())

    def publish(self) -> None:
        """Make the finished file visible under its content-addressed name (local: fsync and rename;
        on a :class:`Committer`'s thread, where the caller gives it one)."""
        self._file.commit(self._name)

    def close(self) -> WrittenFile:
        """:meth:`finish` the file and :meth:`publish` it."""
        written = self.finish()
        self.publish()
        return written

    def abort(self) -> None:
        """Drop what was written (on error)."""
        try:
            self._sink.finish()
        except BaseException:  # noqa: BLE001 - the caller is already handling an error
            pass
        self._file.abort()


def write_chunks_file(out_dir: str, first_chunk: int, chunks: Chunks, schema: pa.Schema,
                      chunks_per_record_batch: int) -> WrittenFile:
    """Write ``chunks`` as one complete file."""
    writer = ChunkFileWriter(out_dir, first_chunk, schema, chunks_per_record_batch)
    try:
        writer.write(chunks)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def files_sha256(files: list[dict[str, Any]]) -> str:
    """sha256 of the files' sha256 hex digests, one per line, in file order: a tokenized corpus's
    ``content_sha256``, and a packed output's in format version 2."""
    return hashlib.sha256("".join(f["sha256"] + "\n" for f in files).encode()).hexdigest()


def content_sha256(files: list[WrittenFile], token_dtype: str, context_length: int, num_chunks: int,
                   extra_columns: Sequence[SideColumn] = ()) -> str:
    """A packed output's ``content_sha256`` (format version 3) from its files' range digests;
    ``files`` tile ``[0, num_chunks)`` in order. Cost: O(files * G + num_chunks / G) hashing."""
    hasher = ContentHasher(token_dtype, context_length, num_chunks, extra_columns=extra_columns)
    for f in files:
        hasher.add_range(f.first_chunk, f.num_chunks, f.digests)
    return hasher.hexdigest()


def write_whole(out_dir: str, name: str, data: bytes, *, make_dirs: bool = False) -> str:
    """Write ``data`` as file ``name`` through :class:`AtomicFile`: whole or not at all."""
    file = AtomicFile(out_dir, name, make_dirs=make_dirs)
    try:
        file.write(data)
        file.commit()
    except BaseException:
        file.abort()
        raise
    return file.path
