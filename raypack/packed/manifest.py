"""The manifest of a packed output, read as untrusted input, and the chunk files it names.

Outputs travel between teams and get downloaded, so everything here assumes a hostile
``manifest.json`` and directory. This module is the one place that parses a manifest
(:func:`load_manifest`) and the one place that opens a chunk file it lists
(:func:`open_chunk_file`); ``raypack.packed.reader``, ``raypack.cli.stats`` and ``raypack.verify`` use both.
It also saves one (:func:`write_manifest`, called last by a run: the commit); what a manifest
holds is built here too (:func:`build_manifest`) and documented in docs/FORMAT.md: the schema
lives in this one module. Finding it (the path's file system, what a directory without one holds
instead) is :mod:`raypack.packed.locate`'s; this module re-exports it.

:func:`check_manifest` checks, before any chunk file is opened, and raises one-line
InputErrors naming the manifest, the entry and the value:
  1. types and ranges of every field: ``format_version`` one of READABLE_FORMAT_VERSIONS, ints
     are ints (never bools or floats), counts are in ``[0, MAX_COUNT]``, ``context_length`` in
     ``[1, MAX_CONTEXT_LENGTH]``, ``token_dtype`` a plain integer dtype name and ``pad_token``
     inside its range, ``content_sha256`` 64 hex digits and (version 3) ``content_group_chunks``
     in ``[1, MAX_COUNT]``;
  2. every ``files[].path`` matches :data:`raypack.packed.writer.CHUNK_FILE_RE` exactly (so it holds
     no ``/``, no ``..`` and is not absolute), its 12-digit number equals ``first_chunk`` and
     its 16 hex digits start ``sha256``;
  3. files tile ``[0, counts.chunks)`` contiguously in order with ``num_chunks >= 1`` each (so
     no file is listed twice), and each file is large enough to hold its tokens
     (``num_bytes >= num_chunks * context_length * itemsize``): a manifest cannot claim more
     chunks than the bytes it vouches for, so hostile counts cost nothing;
  4. ``shards`` (optional; a strategy may require them): offsets are the running sums, totals
     equal the counts; ``strategy`` registered, and the strategy's own top-level options and
     shard fields valid (asked of the strategy: raypack.strategies, e.g. best_fit's window and
     chunk ranges).
Cost: O(files + shards) Python work, which stops at the first bad entry; the manifest itself
is read whole but never more than ``MAX_MANIFEST_BYTES``, and parsed only once a pre-scan shows
it within the depth and size-proportional value caps of :mod:`raypack.io.json_doc` (the reader
every manifest kind shares). Readers use the typed accessors of :class:`Manifest` (``counts``,
``token_dtype``, ``files``, ``shards``, ``config``, ``strategy``, ...), never raw keys.

What is NOT checked here: the chunk files' bytes, nor ``content_sha256`` against them.
:func:`open_chunk_file` compares a file's size with ``num_bytes`` (one stat); only
``raypack verify`` hashes every byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import InputError, NotAnOutput
from raypack.io.json_doc import CheckedDocument
from raypack.io.untrusted import (
    DAMAGED,
    MAX_COUNT,
    int_field,
    is_hex,
    open_local_file,
    open_remote_file,
    show,
    token_dtype_field,
)
from raypack.packed.locate import MAX_MANIFEST_BYTES, read_manifest_json, resolve_output
from raypack.packed.writer import CHUNK_FILE_RE, FORMAT_VERSION, MANIFEST_NAME, WrittenFile, content_sha256, write_whole
from raypack.rules.content_digest import CONTENT_GROUP_CHUNKS
from raypack.rules.core import MAX_CONTEXT_LENGTH
from raypack.rules.long_docs import DEFAULT_LONG_DOCS, LONG_DOCS, CutCounts
from raypack.rules.side_columns import RESERVED_NAMES, SIDE_TYPES, SideColumn
from raypack.strategies import DEFAULT_STRATEGY, PackingStrategy, strategy_of_manifest

if TYPE_CHECKING:
    from raypack.pack.config import PackConfig
    from raypack.pack.plan import Plan

__all__ = ["COUNT_KEYS", "FILE_KEYS", "MAX_CONTEXT_LENGTH", "MAX_COUNT", "MAX_MANIFEST_BYTES", "Manifest",
           "PackedCounts", "RecordedConfig", "build_manifest", "write_manifest",
           "check_manifest", "load_manifest", "open_chunk_file", "read_manifest_json", "resolve_output",
           "backend_label", "side_columns_of", "strategy_of"]

# MAX_CONTEXT_LENGTH: one cap for writers and readers (raypack.rules.core)
"""Largest context length a manifest may claim (16M tokens). Today's longest windows are ~2**20;
the cap keeps a chunk's (C,) arrays, a (C, C) mask's size and ``chunk * C`` position arithmetic
far inside int64 for any chunk count below ``MAX_COUNT``, so no reader arithmetic overflows."""
COUNT_KEYS = ("documents", "tokens", "chunks", "padding_positions", "split_documents")
CUT_KEYS = CutCounts._fields
"""Counts of what ``long_docs`` truncate / drop left out: in ``counts`` and each ``shards[k]``, only
when the manifest's ``long_docs`` is not split."""
FILE_KEYS = ("path", "first_chunk", "num_chunks", "num_bytes", "sha256")
SHARD_KEYS = ("num_docs", "num_tokens", "doc_offset", "token_offset")
READABLE_FORMAT_VERSIONS = (2, FORMAT_VERSION)
"""Versions this reader reads: 2 differs from 3 only in what ``content_sha256`` hashes."""
MIX_KIND = "mix"
TOKENIZED_KIND = "tokenized"
"""The kind of a tokenized corpus's manifest (raypack.tokenize.corpus): token ids per document, not chunks."""
"""``kind`` of a mix's manifest (raypack.mix.dataset): an index over packed outputs, no chunk files."""


# ----------------------------------------------------------------------------- loading


class PackedCounts(NamedTuple):
    """A packed output's ``counts``; the cut counts are 0 unless ``long_docs`` truncate / drop recorded them."""

    documents: int
    tokens: int
    chunks: int
    padding_positions: int
    split_documents: int
    documents_truncated: int = 0
    tokens_truncated: int = 0
    documents_dropped: int = 0
    tokens_dropped: int = 0

    @property
    def cut(self) -> CutCounts:
        return CutCounts(self.documents_truncated, self.tokens_truncated, self.documents_dropped, self.tokens_dropped)


class RecordedConfig(NamedTuple):
    """What readers use of the run's recorded ``config``: ``token_column`` (None when not recorded)."""

    token_column: str | None


class ChunkLayout(CheckedDocument):
    """What every reader of chunks asks first, shared by a packed output's manifest and a mix's."""

    @property
    def context_length(self) -> int:
        return self._data["context_length"]

    @property
    def pad_token(self) -> int:
        return self._data["pad_token"]

    @property
    def token_dtype(self) -> np.dtype:
        return np.dtype(self._data["token_dtype"])


class Manifest(ChunkLayout):
    """A packed output's manifest: the one type that builds (:meth:`build`), checks
    (:meth:`from_dict`, :meth:`load`) and saves (:meth:`save`) it. Read-only: ``manifest[key]``
    reads a JSON field as docs/FORMAT.md names it; the properties give them typed, and readers
    use those. Every instance passed :func:`check_manifest` (or was built by this module)."""

    __slots__ = ()

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_NAME) -> Manifest:
        """``data`` (parsed JSON) checked; InputError naming ``where`` otherwise."""
        check_manifest(data, where)
        return cls(data)

    @classmethod
    def of(cls, manifest: Mapping[str, Any], where: str = MANIFEST_NAME) -> Manifest:
        """``manifest`` itself when it is a Manifest, else the parsed JSON ``manifest`` checked."""
        return manifest if isinstance(manifest, Manifest) else cls.from_dict(manifest, where)

    @classmethod
    def load(cls, path: str) -> Manifest:
        return load_manifest(path)

    @classmethod
    def build(cls, config: PackConfig, plan: Plan, files: list[WrittenFile], counts: dict[str, int]) -> Manifest:
        return build_manifest(config, plan, files, counts)

    def save(self, out_dir: str) -> str:
        """Write ``manifest.json`` into ``out_dir`` whole. Call it last: it is the commit."""
        return write_manifest(out_dir, self._data)

    def __repr__(self) -> str:
        return (f"Manifest(strategy={self.strategy_name!r}, context_length={self.context_length}, "
                f"chunks={self.num_chunks}, files={len(self.files)})")


    @property
    def extra_columns(self) -> tuple[SideColumn, ...]:
        """The side columns (raypack.rules.side_columns), in the files' column order; () without any."""
        return side_columns_of(self._data)

    @property
    def strategy_name(self) -> str:
        return strategy_of(self._data)

    @property
    def strategy(self) -> PackingStrategy:
        """The packing strategy with its recorded options (raypack.strategies)."""
        return strategy_of_manifest(self)

    @property
    def long_docs(self) -> str:
        return long_docs_of(self._data)

    @property
    def counts(self) -> PackedCounts:
        counts = self._data["counts"]
        return PackedCounts(**{key: counts[key] for key in PackedCounts._fields if key in counts})

    @property
    def files(self) -> list[dict[str, Any]]:
        """The chunk files in chunk order, each with FILE_KEYS checked."""
        return self._data["files"]

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The input shards in order (none listed: []), each with SHARD_KEYS, ``path`` and any cut counts checked."""
        return self._data.get("shards") or []

    @property
    def lists_shards(self) -> bool:
        return "shards" in self._data

    @property
    def config(self) -> RecordedConfig:
        recorded = self._data.get("config", {})
        return RecordedConfig(recorded.get("token_column"))

    @property
    def num_chunks(self) -> int:
        return self._data["counts"]["chunks"]

    @property
    def format_version(self) -> int:
        return self._data["format_version"]

    @property
    def content_sha256(self) -> str:
        return self._data["content_sha256"]

    @property
    def content_group_chunks(self) -> int:
        """Chunks per group of the content digest (format version 3)."""
        return self._data["content_group_chunks"]

    @property
    def tokenizer_record(self) -> dict[str, Any] | None:
        """``{"identity", "options", ...}`` of the tokenizer an output packed from text was made with; None otherwise."""
        record = self._data.get("tokenizer")
        return record if isinstance(record, dict) and isinstance(record.get("identity"), dict) else None

    @property
    def tokenizer_identity(self) -> dict[str, Any] | None:
        """What defines the ids of an output packed from text (its tokenizer's kind, name, vocabulary
        size and file digest; not the path it was read from); None for an output of token inputs."""
        record = self._data.get("tokenizer")
        identity = record.get("identity") if isinstance(record, dict) else None
        if not isinstance(identity, dict):
            return None
        return {key: value for key, value in identity.items() if key != "file"}


def backend_label(record: Mapping[str, Any]) -> str:
    """A recorded tokenizer backend in the words of a summary: ``reference tokenizers 0.23.3``, ``gigatoken 0.10.0``
    (its name, library and version, those it records)."""
    return " ".join(str(record[k]) for k in ("name", "library", "version") if record.get(k))


def load_manifest(path: str) -> Manifest:
    """The checked ``manifest.json`` of output directory ``path`` (local path or URI).

    Raises InputError when the directory or its manifest is missing, unreadable, larger than
    MAX_MANIFEST_BYTES, not JSON, or fails :func:`check_manifest` (a mix's manifest fails it:
    read a mix with :func:`raypack.outputs.read_packed`).
    """
    data, manifest_path = read_manifest_json(path)
    return Manifest.from_dict(data, manifest_path)


def strategy_of(manifest: Mapping[str, Any]) -> str:
    """The name of a checked manifest's packing strategy (none: concat); the strategy object with its
    options is :func:`raypack.strategies.strategy_of_manifest`."""
    return manifest.get("strategy", DEFAULT_STRATEGY)


# ----------------------------------------------------------------------------- checking


def check_manifest(manifest: Any, where: str) -> None:
    """Raise InputError naming ``where``, the entry and the value unless ``manifest`` is well formed
    (the rules in this module's docstring). O(files + shards)."""
    if not isinstance(manifest, dict):
        raise InputError(f"{where}: expected a JSON object, found {type(manifest).__name__}")
    if manifest.get("kind") == MIX_KIND:
        raise InputError(f"{where}: a mix (an index over other outputs, raypack mix), not a packed output; "
                         "read it with raypack.read_packed, or give one of its sources")
    if manifest.get("kind") == TOKENIZED_KIND:
        raise NotAnOutput(f"{where}: a tokenized corpus (raypack tokenize's output: the token ids of each document), "
                         "not a packed output; pack it first: raypack pack --input DIR --output OUT --context-length C")
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in READABLE_FORMAT_VERSIONS:
        raise InputError(f"{where}: format_version={show(version)} is not supported (this reader reads versions "
                         f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))}); read it with the raypack version that "
                         "wrote it")
    context_length = int_field(manifest, "context_length", where, 1, MAX_CONTEXT_LENGTH)
    dtype = token_dtype_field(manifest, where)
    int_field(manifest, "pad_token", where, int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    counts = _check_counts(manifest, context_length, where)
    if not is_hex(manifest.get("content_sha256"), 64):
        raise InputError(f"{where}: content_sha256={show(manifest.get('content_sha256'))}, expected 64 lowercase "
                         f"hex digits; {DAMAGED}")
    if version >= 3:
        int_field(manifest, "content_group_chunks", where, 1)
    _check_files(manifest.get("files"), context_length * dtype.itemsize, counts["chunks"], where)
    _check_long_docs(manifest, where)
    _check_shards(manifest, counts, where)
    _check_strategy(manifest, where)
    _check_extra_columns(manifest, where)


def side_columns_of(manifest: Mapping[str, Any]) -> tuple[SideColumn, ...]:
    """A checked manifest's side columns (``extra_columns``; none: ())."""
    return tuple(SideColumn(c["name"], c["type"], c["fill"]) for c in manifest.get("extra_columns", ()))


def _check_extra_columns(manifest: dict[str, Any], where: str) -> None:
    """``extra_columns`` (optional): a non-empty list of ``{"name", "type", "fill"}`` with distinct,
    non-reserved names, a SIDE_TYPES type and a fill inside it."""
    if "extra_columns" not in manifest:
        return
    columns = manifest["extra_columns"]
    if not isinstance(columns, list) or not columns:
        raise InputError(f"{where}: extra_columns={show(columns)}, expected a non-empty list; {DAMAGED}")
    names = set()
    for k, entry in enumerate(columns):
        label = f"{where}: extra_columns[{k}]"
        if not isinstance(entry, dict) or set(entry) != {"name", "type", "fill"}:
            raise InputError(f"{label}={show(entry)}, expected {{name, type, fill}}; {DAMAGED}")
        name, type_name = entry["name"], entry["type"]
        if not isinstance(name, str) or not name or name in RESERVED_NAMES or name in names:
            raise InputError(f"{label}: name={show(name)} is empty, reserved or repeated; {DAMAGED}")
        names.add(name)
        if not isinstance(type_name, str) or type_name not in SIDE_TYPES:
            raise InputError(f"{label}: type={show(type_name)}, expected one of {', '.join(SIDE_TYPES)}; {DAMAGED}")
        low, high = (0, 1) if type_name == "bool" else (int(np.iinfo(type_name).min), int(np.iinfo(type_name).max))
        int_field(entry, "fill", label, low, high)


def _check_counts(manifest: dict[str, Any], context_length: int, where: str) -> dict[str, int]:
    counts = manifest.get("counts")
    if not isinstance(counts, dict):
        raise InputError(f"{where}: counts={show(counts)}, expected an object with {', '.join(COUNT_KEYS)}; {DAMAGED}")
    values = {key: int_field(counts, key, where, prefix="counts.") for key in COUNT_KEYS}
    values.update({key: int_field(counts, key, where, prefix="counts.") for key in CUT_KEYS if key in counts})
    positions = values["chunks"] * context_length
    if positions > MAX_COUNT:
        raise InputError(f"{where}: counts.chunks={values['chunks']} of context_length={context_length} make "
                         f"{positions} positions, more than {MAX_COUNT}; {DAMAGED}")
    for key in ("tokens", "padding_positions"):
        if values[key] > positions:
            raise InputError(f"{where}: counts.{key}={values[key]} but counts.chunks={values['chunks']} chunks of "
                             f"{context_length} hold only {positions} positions; {DAMAGED}")
    return values


def long_docs_of(manifest: Mapping[str, Any]) -> str:
    """A checked manifest's ``long_docs`` (none: split)."""
    return manifest.get("long_docs", DEFAULT_LONG_DOCS)


def _check_long_docs(manifest: dict[str, Any], where: str) -> None:
    """``long_docs`` one of LONG_DOCS (none: split); other than split, ``counts`` has the cut counts."""
    value = manifest.get("long_docs", DEFAULT_LONG_DOCS)
    if not isinstance(value, str) or value not in LONG_DOCS:
        raise InputError(f"{where}: long_docs={show(value)}, expected one of {', '.join(LONG_DOCS)}; {DAMAGED}")
    if value != DEFAULT_LONG_DOCS:
        for key in CUT_KEYS:
            int_field(manifest["counts"], key, where, prefix="counts.")


def _check_files(files: Any, min_bytes_per_chunk: int, num_chunks: int, where: str) -> None:
    """Entries well typed, named by CHUNK_FILE_RE after their first chunk and hash, tiling
    ``[0, num_chunks)`` in order, each large enough for its chunks' tokens."""
    if not isinstance(files, list):
        raise InputError(f"{where}: files={show(files)}, expected a list; {DAMAGED}")
    next_chunk = 0
    for k, entry in enumerate(files):
        if not isinstance(entry, dict) or any(key not in entry for key in FILE_KEYS):
            raise InputError(f"{where}: files[{k}]={show(entry)} lacks one of {', '.join(FILE_KEYS)}; {DAMAGED}")
        label = f"{where}: files[{k}] ({show(entry['path'])})"
        first = int_field(entry, "first_chunk", label)
        count = int_field(entry, "num_chunks", label, 1)
        num_bytes = int_field(entry, "num_bytes", label)
        _check_file_name(entry, first, label)
        if first != next_chunk:
            raise InputError(f"{label}: first_chunk={first}, expected {next_chunk}; the files must cover the chunks "
                             f"contiguously from 0, in order, each once; {DAMAGED}")
        if num_bytes < count * min_bytes_per_chunk:
            raise InputError(f"{label}: num_chunks={count} needs at least {count * min_bytes_per_chunk} bytes of "
                             f"tokens but num_bytes={num_bytes}; {DAMAGED}")
        next_chunk += count
        if next_chunk > num_chunks:
            break  # reported below, before walking a hostile list further
    if next_chunk != num_chunks:
        raise InputError(f"{where}: counts.chunks={num_chunks} but the files hold "
                         f"{'more than ' if next_chunk > num_chunks else ''}{next_chunk} chunks; {DAMAGED}")


def _check_file_name(entry: dict[str, Any], first: int, label: str) -> None:
    path, sha256 = entry["path"], entry["sha256"]
    if not is_hex(sha256, 64):
        raise InputError(f"{label}: sha256={show(sha256)}, expected 64 lowercase hex digits; {DAMAGED}")
    match = CHUNK_FILE_RE.fullmatch(path) if isinstance(path, str) else None
    if match is None:
        raise InputError(f"{label}: path is not a chunk file name chunks-{{first_chunk:012d}}-{{sha256[:16]}}.arrow "
                         f"(a plain name inside the output directory); {DAMAGED}")
    if int(match.group(1)) != first or match.group(2) != sha256[:16]:
        raise InputError(f"{label}: the name does not match first_chunk={first} and sha256={sha256[:16]}...; "
                         f"{DAMAGED}")


def _check_shards(manifest: dict[str, Any], counts: dict[str, int], where: str) -> None:
    """Optional ``shards``: well typed, offsets the running sums, totals equal to the counts."""
    shards = manifest.get("shards")
    if shards is None:
        return
    if not isinstance(shards, list):
        raise InputError(f"{where}: shards={show(shards)}, expected a list; {DAMAGED}")
    docs = tokens = 0
    cut = [0] * len(CUT_KEYS)
    stopped = False  # at a shard past the counts: the sums are then lower bounds
    for k, entry in enumerate(shards):
        label = f"{where}: shards[{k}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise InputError(f"{label}={show(entry)} lacks a path; {DAMAGED}")
        label = f"{label} ({show(entry['path'])})"
        num_docs, num_tokens, doc_offset, token_offset = (int_field(entry, key, label) for key in SHARD_KEYS)
        for key, found, expected in (("doc_offset", doc_offset, docs), ("token_offset", token_offset, tokens)):
            if found != expected:
                raise InputError(f"{label}: {key}={found}, expected {expected} (the sum over earlier shards); {DAMAGED}")
        if not isinstance(entry.get("format", ""), str):
            raise InputError(f"{label}: format={show(entry['format'])}, expected a string; {DAMAGED}")
        docs, tokens = docs + num_docs, tokens + num_tokens
        cut = [c + (int_field(entry, key, label) if key in counts else 0) for c, key in zip(cut, CUT_KEYS)]
        if docs > counts["documents"] or tokens > counts["tokens"]:
            stopped = k < len(shards) - 1  # shards after this one not summed
            break  # reported below
    for key, total in (("documents", docs), ("tokens", tokens), *zip(CUT_KEYS, cut)):
        if shards and counts.get(key, 0) != total:
            raise InputError(f"{where}: counts.{key}={counts[key]} but its shards list "
                             f"{'at least ' if stopped else ''}{total} {key} in all; {DAMAGED}")


def _check_strategy(manifest: dict[str, Any], where: str) -> None:
    """``strategy`` registered (none: concat), its options and its own fields valid: asked of the
    strategy (raypack.strategies), which reads them back from the top level."""
    config = manifest.get("config", {})
    if not isinstance(config, dict):
        raise InputError(f"{where}: config={show(config)}, expected an object; {DAMAGED}")
    column = config.get("token_column")
    if column is not None and (not isinstance(column, str) or not column):
        raise InputError(f"{where}: config.token_column={show(column)}, expected a column name; {DAMAGED}")
    strategy_of_manifest(manifest, where)


# ----------------------------------------------------------------------------- chunk files


def open_chunk_file(filesystem: pafs.FileSystem, base: str, name: str, num_bytes: int) -> pa.NativeFile:
    """Chunk file ``name`` of output directory ``base``, opened for random access after one size check.

    Only plain files directly inside ``base`` are opened: ``name`` must match CHUNK_FILE_RE (so it
    is one path component). Local: ``os.open(O_RDONLY | O_NOFOLLOW | O_NONBLOCK)`` and fstat,
    so a symlink, a FIFO, a directory or a device is refused without reading it (and a FIFO
    cannot block), then the open file (not the path again) is memory-mapped read-only:
    buffers read from it are zero-copy views that stay valid after it is dropped. Object
    store: the key ``base + '/' + name``, nothing else. Either way the size must equal
    ``num_bytes`` (one stat, no hashing; only ``raypack verify`` hashes). Raises InputError
    naming the file when it is missing ("the output was replaced or damaged"), not a plain
    file, or of another size.
    """
    if not isinstance(name, str) or CHUNK_FILE_RE.fullmatch(name) is None:
        raise InputError(f"{base}: {show(name)} is not a chunk file name; only plain files named "
                         "chunks-{first_chunk:012d}-{sha256[:16]}.arrow inside the output are read")
    path = f"{base}/{name}"
    if isinstance(filesystem, pafs.LocalFileSystem):
        source, size = open_local_file(path)
    else:
        source, size = open_remote_file(filesystem, path)
    if size != num_bytes:
        source.close()
        raise InputError(f"{path}: {size} bytes, the manifest says num_bytes={num_bytes}; {DAMAGED}")
    return source


# ----------------------------------------------------------------------------- building and saving


def _shard_row(shard, task, packing: PackingStrategy, text_inputs: bool, long_docs: str) -> dict[str, Any]:
    """One input shard: ``num_tokens`` its tokens in the chunks (with ``long_docs`` truncate or drop,
    its tokens less those left out, which its cut counts give). A tokenized corpus's part also names its text source; with
    ``text_inputs`` (``pack --tokenizer``, whose parts are not kept) the text source is the
    shard: format "text" and the text's own format and range under "text"."""
    source = shard.source
    if text_inputs and source is not None:
        where = {"path": source["path"], "format": "text",
                 "text": {k: source[k] for k in ("format", "start", "end")}}
    else:
        where = {"path": shard.path, "format": shard.format, **({"source": source} if source else {})}
    cut = task.cut.as_dict() if long_docs != DEFAULT_LONG_DOCS else {}
    return {**where, "num_docs": shard.num_docs, "num_tokens": shard.num_tokens - task.cut.num_tokens_left_out,
            "doc_offset": task.doc_offset, "token_offset": task.token_offset, **cut,
            **packing.shard_row_extras(task)}


def build_manifest(config: PackConfig, plan: Plan, files: list[WrittenFile], counts: dict[str, int]) -> Manifest:
    """The manifest of a finished run (docs/FORMAT.md)."""
    file_rows = [{key: getattr(f, key) for key in FILE_KEYS} for f in files]
    return Manifest({
        "format_version": FORMAT_VERSION,
        "created_by": f"raypack {_version()}",
        "context_length": config.context_length,
        "pad_token": config.pad_token,
        "token_dtype": plan.token_dtype,
        **plan.packing.manifest_fields(),
        **({"long_docs": plan.long_docs} if plan.long_docs != DEFAULT_LONG_DOCS else {}),
        **({"extra_columns": [c._asdict() for c in plan.extra_columns]} if plan.extra_columns else {}),
        "counts": counts,
        "files": file_rows,
        "shards": [_shard_row(s, t, plan.packing, plan.text_inputs, plan.long_docs)
                   for s, t in zip(plan.shards, plan.whole_shard_tasks())],
        "content_sha256": content_sha256(files, plan.token_dtype, config.context_length, counts["chunks"],
                                         plan.extra_columns),
        "content_group_chunks": CONTENT_GROUP_CHUNKS,
        "config": config.output_dict(),
        **({"tokenizer": plan.tokenizer} if plan.tokenizer is not None else {}),
    })


def write_manifest(out_dir: str, manifest: Mapping[str, Any]) -> str:
    """Write ``manifest.json`` whole (a :class:`Manifest`, or a plain dict for other kinds of
    manifest such as a tokenized corpus's). Call it last: it is the commit."""
    data = manifest._data if isinstance(manifest, CheckedDocument) else manifest
    encoded = (json.dumps(data, indent=2, sort_keys=False) + "\n").encode()
    if len(encoded) > MAX_MANIFEST_BYTES:
        raise InputError(f"{out_dir}: the manifest would be {len(encoded):,} bytes, more than the {MAX_MANIFEST_BYTES:,} "
                         "every reader accepts; use fewer, larger shards (or fewer tasks: --task-tokens)")
    return write_whole(out_dir, MANIFEST_NAME, encoded)


def _version() -> str:
    from raypack import __version__

    return __version__
