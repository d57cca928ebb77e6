"""One tokenize task: a range of a text file in, one Parquet part file of token ids out. No Ray.

A task is row groups ``[start, end)`` of a Parquet file or the JSONL lines of nominal byte
range ``[start, end)`` (line-aligned by :mod:`raypack.inputs.jsonl`), so one huge text file is
spread over many workers. The driver numbers tasks in input order; task k writes
``part-{k:06d}.parquet`` and returns its counts. Nothing a task writes depends on the worker,
the read batch size or the thread count:

  * documents are encoded in batches of ``batch_rows`` texts (a tokenizer's ids for one text
    do not depend on its batch);
  * row groups close at fixed document boundaries: the first boundary where the row group
    holds ``row_group_tokens`` tokens or ``row_group_docs`` documents, a function of the
    document sequence alone;
  * the Parquet writer's options are fixed (zstd, no dictionary, statistics on).

Memory per task: one read batch of texts, the encodings of at most ``batch_bytes`` of it, and
at most one row group of ids (about ``row_group_tokens`` ids plus one piece): flat in the
size of the task and in the length of its documents (but a single text is encoded whole).

After a part file is complete a record ``_results/text-NNNNNN.json`` (checksummed JSON, as
:mod:`raypack.pack.resume` writes for packing) holds the task, the settings that decide the
bytes, the input's sampled identity and the result; ``--resume`` reuses a task when its
record checks, its input still has that identity and the part file still hashes to its
recorded sha256.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack.errors import InputError
from raypack.io.fs import resolve_filesystem
from raypack.pack.resume import RESULTS_DIR, check_same_file, remove_damaged_record, sampled_identity
from raypack.packed.writer import AtomicFile, HashingSink, write_whole
from raypack.rules.arrays import numpy_values
from raypack.tokenize.backends import load_backed_tokenizer
from raypack.tokenize.corpus import TOKEN_COLUMN, part_file_name
from raypack.tokenize.guard import ReferenceGuard
from raypack.tokenize.pieces import document_name, encode_pieces, task_pieces
from raypack.tokenize.tokenizers import FlatIds, TextTokenizer, flat_to_list_array

log = logging.getLogger(__name__)

RECORD_VERSION = 1
PARQUET_WRITE_OPTIONS = {"compression": "zstd", "use_dictionary": False, "write_statistics": True}
"""Fixed, so a part file's bytes depend only on its documents."""
_NOT_OUTPUT_SETTINGS = ("out_dir", "tokenizer", "batch_rows", "batch_bytes", "num_threads", "tokenizer_backend",
                        "tokenizer_backend_version", "max_document_bytes", "held_tokens")
_BACKEND_SETTINGS = ("tokenizer_backend", "tokenizer_backend_version")


@dataclass(frozen=True)
class TextTask:
    """Row groups [start, end) of a Parquet file, or JSONL nominal byte range [start, end)."""

    task_index: int
    path: str
    format: str
    start: int
    end: int
    text_bytes: int = 0
    """Planning's estimate of the task's text (footer or byte range): its cost, for scheduling."""
    planned: str = ""
    """The file's identity when the run planned its tasks (raypack.pack.resume.file_mark); a task that finds
    another refuses, so that no output mixes two versions of one file ("": not checked)."""


def check_planned(task: TextTask, identity: dict) -> None:
    """InputChanged when ``task``'s file is not the file its tasks were planned on (``identity``: now)."""
    check_same_file("text file", task.path, task.planned, identity)


MAX_DOCUMENT_BYTES = 16 << 20
"""The default ``max_document_bytes``: a longer text is one line (pack, tokenize), or not re-encoded
(verify --check-tokenizer); BENCHMARKS.md, "One long text document" and "stop 51"."""


@dataclass(frozen=True)
class TokenizeSettings:
    """What every tokenize worker shares; the tokenizer travels as its spec string."""

    out_dir: str
    tokenizer: str
    """The spec (a tokenizer.json path or tiktoken:NAME); each worker loads it once."""
    tokenizer_sha256: str
    """What the driver loaded; a worker whose file differs refuses to run."""
    text_column: str
    token_dtype: str
    bos_id: int | None = None
    eos_id: int | None = None
    row_group_tokens: int = 1 << 20
    row_group_docs: int = 65536
    batch_rows: int = 8192
    """Texts read at once, at most (raypack.tokenize.job.TextOptions.batch_rows); no effect on the output."""
    batch_bytes: int = 1 << 20
    """Bytes of text encoded at once (a read batch is cut into pieces of at most this many
    bytes, or one longer text): the tokenizer's per-token objects, about 100 bytes a token,
    stay bounded however long the documents. No effect on the output."""
    num_threads: int = 0
    """Tokenizer threads per worker (0: the library's default, all cores); no effect on the output."""
    tokenizer_backend: str = "reference"
    """The backend the driver chose (never ``auto``: every worker uses the same one); no effect on
    the output (the ids are the reference's, checked on a sample: raypack.tokenize.guard)."""
    tokenizer_backend_version: str = ""
    """The version of the library behind ``tokenizer_backend`` on the driver; a worker whose
    library differs refuses to run, and a resume record made by another backend or version is
    not kept (:func:`record_settings`)."""
    max_document_bytes: int = MAX_DOCUMENT_BYTES
    """A longer text is refused before it is encoded (raypack.tokenize.job.TextOptions)."""
    held_tokens: int = 16 << 20
    """``pack --tokenizer``: the ids a task keeps in memory; the rest of a larger task (a Parquet
    row group of more than ``task_bytes`` of text) wait in a spill file (raypack.tokenize.onepass).
    No effect on the output."""


@dataclass(frozen=True)
class TextResult:
    task_index: int
    path: str
    """The part file's name, relative to the output."""
    num_docs: int
    num_tokens: int
    num_bytes: int
    sha256: str


def record_name(task_index: int) -> str:
    return f"{RESULTS_DIR}/text-{task_index:06d}.json"


def load_worker_tokenizer(settings: TokenizeSettings) -> TextTokenizer:
    """Load the tokenizer from its spec with the driver's backend, once per worker, and check it is
    the driver's."""
    tokenizer = load_backed_tokenizer(settings.tokenizer, settings.tokenizer_backend)
    sha256 = tokenizer.identity()["sha256"]
    if sha256 != settings.tokenizer_sha256:
        raise InputError(f"tokenizer {settings.tokenizer} on this worker has sha256 {sha256[:16]}..., the driver's "
                         f"has {settings.tokenizer_sha256[:16]}...; give every node the same file")
    version = tokenizer.backend_record()["version"]
    if settings.tokenizer_backend_version and version != settings.tokenizer_backend_version:
        raise InputError(f"tokenizer backend {settings.tokenizer_backend} on this worker is version {version}, the "
                         f"driver's is {settings.tokenizer_backend_version}; install the same version on every node")
    if settings.num_threads and hasattr(tokenizer.reference, "num_threads"):
        tokenizer.reference.num_threads = settings.num_threads
    return tokenizer


def tokenize_task(task: TextTask, settings: TokenizeSettings, tokenizer: TextTokenizer,
                  encoded: Iterator[tuple[pa.Array, FlatIds]] | None = None) -> TextResult:
    """Tokenize ``task``'s texts into its part file, then record the result durably. ``encoded``:
    as :func:`tokenize_in_memory` takes it, used once the file's identity is checked."""
    identity = sampled_identity(task.path, task.format)
    check_planned(task, identity)
    token_type = pa.from_numpy_dtype(np.dtype(settings.token_dtype))
    result = write_part(settings.out_dir, task.task_index, tokenize_in_memory(task, settings, tokenizer, encoded),
                        token_type, settings)
    save_record(task, settings, result, identity)
    return result


def _check_still_planned(task: TextTask) -> None:
    """check_planned, now; a file gone or unreadable leaves the error at hand to be said."""
    if task.planned:
        try:
            identity = sampled_identity(task.path, task.format)
        except (OSError, InputError):
            return
        check_planned(task, identity)


def tokenize_in_memory(task: TextTask, settings: TokenizeSettings, tokenizer: TextTokenizer,
                       encoded: Iterator[tuple[pa.Array, FlatIds]] | None = None) -> Iterator[pa.Array]:
    """``task``'s ids as list<token_dtype> arrays, in order, one per piece of at most ``batch_bytes``
    of text (what :func:`tokenize_task` writes; kept in memory, ``pack --tokenizer``'s one pass). The
    reference guard's check of the task's sample runs after the last piece is taken, before the
    iteration ends: a difference raises there, before the task's file is committed or its counts
    reported; so does a file that is no longer the one the run planned (:func:`check_planned`).
    ``encoded``: the task's pieces with their ids as
    :meth:`raypack.tokenize.pieces.EncodeAhead.encoded` gives them (read and encoded ahead across
    tasks); by default they are read and encoded here."""
    token_type = pa.from_numpy_dtype(np.dtype(settings.token_dtype))
    guard = ReferenceGuard(tokenizer, lambda k: document_name(task, k))
    try:
        if encoded is None:
            encoded = encode_pieces(task, task_pieces(task, settings), tokenizer)
        for piece, flat in encoded:
            yield _encode(piece, flat, settings, token_type, guard)
            del piece, flat
    except InputError:
        _check_still_planned(task)  # a file rewritten under the read (say, cut short) is that, not bad JSON
        raise
    guard.finish()
    if task.planned:  # the task's reads span its encode: the file must still be the one planned
        check_planned(task, sampled_identity(task.path, task.format))


def _encode(texts: pa.Array, flat: FlatIds, settings: TokenizeSettings, token_type: pa.DataType,
            guard: ReferenceGuard) -> pa.Array:
    """The ids of ``texts`` as list<token_type>, [bos] + ids + [eos]; the guard takes its sample."""
    guard.check(texts, flat)
    ids = flat_to_list_array(flat, np.dtype(settings.token_dtype), bos_id=settings.bos_id, eos_id=settings.eos_id)
    return ids.cast(pa.list_(token_type)) if ids.type != pa.list_(token_type) else ids


def write_part(out_dir: str, task_index: int, id_lists: Iterator[pa.Array], token_type: pa.DataType,
               settings: TokenizeSettings) -> TextResult:
    """Write the list arrays ``id_lists`` (in order) as ``part-{task_index:06d}.parquet``, whole."""
    name = part_file_name(task_index)
    schema = pa.schema([pa.field(TOKEN_COLUMN, pa.list_(token_type))])
    file = AtomicFile(out_dir, name, make_dirs=True)
    sink = HashingSink(file)
    num_docs = num_tokens = 0
    try:
        with pq.ParquetWriter(pa.PythonFile(sink, mode="w"), schema, **PARQUET_WRITE_OPTIONS) as writer:
            for group in _row_groups(id_lists, settings.row_group_tokens, settings.row_group_docs):
                writer.write_table(pa.table([group], schema=schema), row_group_size=len(group))
                num_docs += len(group)
                num_tokens += group.offsets[-1].as_py() - group.offsets[0].as_py()
        sink.finish()
        file.commit()
    except BaseException:
        try:
            sink.finish()
        except BaseException:  # noqa: BLE001 - already handling an error
            pass
        file.abort()
        raise
    return TextResult(task_index, name, num_docs, num_tokens, sink.num_bytes, sink.sha256.hexdigest())


def _row_groups(id_lists: Iterator[pa.Array], max_tokens: int, max_docs: int) -> Iterator[pa.Array]:
    """Regroup a stream of list arrays into row groups cut at fixed document boundaries.

    A row group ends after the first document that brings it to ``max_tokens`` tokens, or at
    ``max_docs`` documents, whichever comes first; the last one holds what remains (at least
    one document, unless there are none). Cost: O(documents) numpy per input array.
    """
    pending: pa.Array | None = None
    for ids in id_lists:
        pending = ids if pending is None else pa.concat_arrays([pending, ids])
        start = 0
        lens = np.diff(numpy_values(pending.offsets)).astype(np.int64)
        while (end := _group_end(lens, start, max_tokens, max_docs)) is not None:
            yield pending.slice(start, end - start)
            start = end
        pending = pending.slice(start)
    if pending is not None and len(pending):
        yield pending


def _group_end(lens: np.ndarray, start: int, max_tokens: int, max_docs: int) -> int | None:
    """End of the row group starting at document ``start``, or None if it is not complete yet."""
    if start + max_docs <= len(lens):
        limit = start + max_docs
    else:
        limit = len(lens)
    reached = np.flatnonzero(np.cumsum(lens[start:limit]) >= max_tokens)
    if reached.size:
        return start + int(reached[0]) + 1
    return limit if limit - start == max_docs else None


# ----------------------------------------------------------------------------- resume records


def output_settings(settings: TokenizeSettings) -> dict[str, Any]:
    """The settings that decide a part file's bytes."""
    return {k: v for k, v in asdict(settings).items() if k not in _NOT_OUTPUT_SETTINGS}


def record_settings(settings: TokenizeSettings) -> dict[str, Any]:
    """What a resume record must match to be kept: the settings that decide the bytes, and the
    backend (name and version) that computed the ids. Its ids are the reference's whichever backend
    ran, but only as far as that backend and raypack's rules for it were right: a task is not kept
    from another backend's run (an upgrade, a fallback), so that every id of an output comes from
    the one backend its manifest names."""
    # max_document_bytes: a task kept from a run with a higher limit held a text this run refuses (an
    # operator's trial: --resume with a lower limit passed where a clean run is one line naming the row)
    return {**output_settings(settings), "max_document_bytes": settings.max_document_bytes,
            **{k: getattr(settings, k) for k in _BACKEND_SETTINGS}}


def settings_changed(recorded: Any, settings: TokenizeSettings) -> str | None:
    """Why a record's settings (``recorded``) are not this run's :func:`record_settings`, naming
    what changed, or None when they are."""
    now = record_settings(settings)
    if recorded == now:
        return None
    if not isinstance(recorded, dict):
        return "its record holds no settings"
    if {k: v for k, v in recorded.items() if k not in _BACKEND_SETTINGS} == \
            {k: v for k, v in now.items() if k not in _BACKEND_SETTINGS}:
        was, this = (" ".join(str(d.get(k, "?")) for k in _BACKEND_SETTINGS) for d in (recorded, now))
        return f"its ids were computed by backend {was}, this run's is {this}"
    changed = [f"{_SETTING_FLAGS[k]} {_token(recorded.get(k))} -> {_token(now.get(k))}" if k in _SETTING_FLAGS else
               f"{k} {recorded.get(k)!r} -> {now.get(k)!r}"
               for k in sorted(set(recorded) | set(now)) if recorded.get(k) != now.get(k)]
    return f"its record was made with other settings ({', '.join(changed)})"


_SETTING_FLAGS = {"bos_id": "--bos", "eos_id": "--eos"}
"""Settings a resume's reason names by the flag that sets them (the others by their config key)."""


def _token(token_id: Any) -> str:
    """A recorded --bos/--eos as said to the user: "id 0" or "none" (it said "0 -> None": a new user's trial)."""
    return "none" if token_id is None else f"id {token_id}"


def _canonical(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def save_record(task: TextTask, settings: TokenizeSettings, result: TextResult, identity: dict[str, Any]) -> None:
    body = {"version": RECORD_VERSION, "task": asdict(task), "settings": record_settings(settings),
            "input": identity, "result": asdict(result)}
    record = {**body, "record_sha256": hashlib.sha256(_canonical(body)).hexdigest()}
    write_whole(settings.out_dir, record_name(task.task_index), _canonical(record), make_dirs=True)


def load_verified_record(task: TextTask, settings: TokenizeSettings,
                         redone: dict[str, list[TextTask]] | None = None) -> TextResult | None:
    """The recorded result of ``task`` if its record, its input and its part file all check; else
    None, and why goes to ``redone`` (reason -> tasks, for :func:`say_redone`) or is logged.

    Cost: reads the record, at most 2 MiB of the input (plus a Parquet footer) and the whole
    part file.
    """
    fs, base = resolve_filesystem(settings.out_dir)
    path = posixpath.join(base, record_name(task.task_index))
    try:
        with fs.open_input_stream(path, compression=None) as f:
            record = json.loads(f.read())
        claimed = record.pop("record_sha256")
        result = TextResult(**record["result"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        why = f"its record does not parse ({e})"
        if isinstance(e, OSError):
            remove_damaged_record(fs, path)  # a local folder there: the task's new record takes its name
    else:
        why = _rejection(record, claimed, task, settings, result, fs, base)
        if not why:
            return result
    if redone is None:
        say_redone({why: [task]})
    else:
        redone.setdefault(why, []).append(task)
    return None


def say_redone(redone: dict[str, list[TextTask]]) -> None:
    """One INFO line per reason that recorded text tasks are tokenized again (not one per task)."""
    for why, again in redone.items():
        first = f"text task {again[0].task_index} ({again[0].path})"
        if len(again) == 1:
            log.info("resume: %s is tokenized again: %s", first, why)
        else:
            log.info("resume: %d recorded text tasks (%s, ...) are tokenized again; for each, %s", len(again), first,
                     why)


def _rejection(record: dict[str, Any], claimed: str, task: TextTask, settings: TokenizeSettings,
               result: TextResult, fs, base: str) -> str | None:
    if hashlib.sha256(_canonical(record)).hexdigest() != claimed:
        return "its record fails its checksum"
    if record.get("version") != RECORD_VERSION or record.get("task") != asdict(task):
        if (isinstance(record.get("task"), dict) and record["task"].get("path") == task.path
                and record.get("input") != sampled_identity(task.path, task.format)):  # not "another split": a trial
            return f"{task.path} changed (size or first/last MiB differ), and its text splits into other tasks"
        return "its record was made by another version of raypack, or for another split of the text into tasks"
    if why := settings_changed(record.get("settings"), settings):
        return why
    if record.get("input") != sampled_identity(task.path, task.format):
        return f"{task.path} changed (size or first/last MiB differ)"
    if (result.path != part_file_name(task.task_index)
            or not _file_hashes_to(fs, posixpath.join(base, result.path), result.sha256)):
        return f"its part file {result.path} is missing or no longer hashes to its sha256"
    return None


def _file_hashes_to(fs, path: str, sha256: str) -> bool:
    digest = hashlib.sha256()
    try:
        with fs.open_input_stream(path, compression=None) as f:
            while block := f.read(4 << 20):
                digest.update(block)
    except OSError:
        return False
    return digest.hexdigest() == sha256


def rayon_threads(num_cpus: float, num_workers: int) -> int:
    """Tokenizer threads per worker: the CPUs shared evenly by the workers, at least 1.

    HF ``tokenizers`` runs each ``encode_batch`` on its own Rayon pool, by default one thread
    per core of the machine; N workers on C cores would run N*C threads that fight for C
    cores (context switches, cache thrash). C // N threads each keep every core busy once.
    """
    return max(1, int(num_cpus) // max(1, num_workers))
