"""A tokenized corpus (the output of ``raypack tokenize``): its file names and its manifest.

Layout of a tokenized corpus directory (or object-store prefix)::

    part-000000.parquet   one per tokenize task, in input order; one column ``input_ids``,
    part-000001.parquet   list<uintN> (N: the narrowest width holding the vocabulary)
    ...
    manifest.json         written last: kind "tokenized", per-shard counts, sizes and sha256,
                          the tokenizer's identity and the options

Sorted part names are the input order. ``raypack pack --input DIR`` takes the shard list and
the document and token counts from this manifest instead of reading Parquet footers, after
checking each listed file is a plain ``part-NNNNNN.parquet`` of the recorded size.
"""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any, NamedTuple, Sequence

import numpy as np
import pyarrow.fs as pafs

from raypack import __version__
from raypack.errors import InputError
from raypack.inputs.base import ShardInfo
from raypack.io.fs import is_uri, resolve_filesystem
from raypack.io.json_doc import CheckedDocument, read_json_document
from raypack.io.untrusted import (
    MAX_COUNT,
    hex_field,
    int_field,
    object_field,
    object_list_field,
    show,
    str_field,
    token_dtype_field,
)
from raypack.packed.manifest import MAX_MANIFEST_BYTES, TOKENIZED_KIND, write_manifest
from raypack.packed.writer import MANIFEST_NAME, files_sha256

TOKENIZED_VERSION = 1
TOKEN_COLUMN = "input_ids"
PART_FILE_RE = re.compile(r"^part-(\d{6,})\.parquet$")
TOKENIZED_SUBDIR = "_tokenized"
"""Where ``raypack pack --tokenizer`` writes its tokenized corpus inside its work directory."""
RERUN = "re-run raypack tokenize"
_FIX = f"the tokenized corpus was replaced or damaged; {RERUN}"
_COUNT_KEYS = ("documents", "tokens", "shards")
_SHARD_KEYS = ("path", "num_docs", "num_tokens", "num_bytes", "sha256", "doc_offset")


def part_file_name(task_index: int) -> str:
    """``part-{task_index:06d}.parquet``: sorted names are the input order."""
    return f"part-{task_index:06d}.parquet"


class TokenizedCounts(NamedTuple):
    documents: int
    tokens: int
    shards: int


class CorpusShard(NamedTuple):
    """One part file of a tokenized corpus, as its manifest records it (checked)."""

    path: str
    """The part's file name, ``part-NNNNNN.parquet``, inside the corpus directory."""
    num_docs: int
    num_tokens: int
    num_bytes: int
    sha256: str
    doc_offset: int
    source: dict[str, Any] | None
    """The text range it was tokenized from (path, format, start, end), if recorded well formed."""


class TokenizedManifest(CheckedDocument):
    """A tokenized corpus's manifest: built by :func:`build_tokenized_manifest`, read and checked by
    :func:`load_tokenized_manifest` (:func:`check_tokenized_manifest`), as strictly as a packed
    output's. ``manifest[key]`` gives a JSON field; readers use the typed properties."""

    __slots__ = ()

    @property
    def token_column(self) -> str:
        return self._data["token_column"]

    @property
    def token_dtype(self) -> np.dtype:
        return np.dtype(self._data["token_dtype"])

    @property
    def tokenizer(self) -> dict[str, Any]:
        return self._data["tokenizer"]

    @property
    def options(self) -> dict[str, Any]:
        return self._data["options"]

    @property
    def counts(self) -> TokenizedCounts:
        counts = self._data["counts"]
        return TokenizedCounts(*(counts[key] for key in _COUNT_KEYS))

    @property
    def shards(self) -> tuple[CorpusShard, ...]:
        return tuple(CorpusShard(*(row[key] for key in _SHARD_KEYS), _source(row.get("source")))
                     for row in self._data["shards"])

    @property
    def content_sha256(self) -> str:
        return self._data["content_sha256"]

    @property
    def backend(self) -> dict[str, Any]:
        """The tokenizer backend that computed the ids, ``{"name", "version"}`` (a record only); {} if none."""
        backend = self._data.get("backend")
        return backend if isinstance(backend, dict) else {}


def build_tokenized_manifest(shards: list[dict[str, Any]], token_dtype: str, tokenizer: dict[str, Any],
                             options: dict[str, Any], backend: dict[str, Any] | None = None) -> TokenizedManifest:
    """The manifest of a tokenized corpus. ``shards``: one dict per part file, in order, with
    path, num_docs, num_tokens, num_bytes, sha256, source; doc_offset is added here. ``backend``:
    name and version of the tokenizer backend that computed the ids (raypack.tokenize.backends),
    a record only: the ids are the reference library's whichever ran."""
    doc_offset, rows = 0, []
    for shard in shards:
        rows.append({**shard, "doc_offset": doc_offset})
        doc_offset += shard["num_docs"]
    return TokenizedManifest({
        "kind": TOKENIZED_KIND,
        "format_version": TOKENIZED_VERSION,
        "created_by": f"raypack {__version__}",
        "token_column": TOKEN_COLUMN,
        "token_dtype": token_dtype,
        "tokenizer": tokenizer,
        **({"backend": backend} if backend is not None else {}),
        "options": options,
        "counts": {"documents": doc_offset, "tokens": sum(s["num_tokens"] for s in shards), "shards": len(shards)},
        "shards": rows,
        "content_sha256": files_sha256(rows),
    })


def save_tokenized_manifest(out_dir: str, manifest: TokenizedManifest) -> None:
    """Write ``manifest.json`` whole (call last: it is the commit)."""
    write_manifest(out_dir, manifest)


def load_tokenized_manifest(directory: str) -> TokenizedManifest | None:
    """The checked tokenized manifest in ``directory`` (a path or URI), or None if it holds none
    (or another kind of manifest). One that is larger than MAX_MANIFEST_BYTES, not JSON (within
    the bounds of raypack.io.json_doc) or fails :func:`check_tokenized_manifest` is an InputError."""
    if any(c in directory for c in "*?["):
        return None
    fs, base = resolve_filesystem(directory)
    path = posixpath.join(base.rstrip("/"), MANIFEST_NAME) if base.rstrip("/") else MANIFEST_NAME
    where = f"{directory.rstrip('/')}/{MANIFEST_NAME}"
    try:
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
    except OSError as e:
        raise InputError(f"{where} cannot be read ({e}); {RERUN}") from e
    data = read_json_document(fs, path, MAX_MANIFEST_BYTES, _FIX)
    if not isinstance(data, dict) or data.get("kind") != TOKENIZED_KIND:
        return None
    check_tokenized_manifest(data, where)
    return TokenizedManifest(data)


def check_tokenized_manifest(data: dict[str, Any], where: str) -> None:
    """Raise one-line InputError naming ``where``, the field and the value unless ``data`` is a
    well-formed tokenized manifest: format_version 1, token_column a name, token_dtype an integer
    dtype name, tokenizer and options objects, counts ints in ``[0, MAX_COUNT]``, a non-empty shard
    list of part files in increasing name order with typed fields, doc offsets the running sums,
    totals equal to the counts and content_sha256 the digest of the parts' sha256. O(shards)."""
    if data.get("format_version") != TOKENIZED_VERSION:
        raise InputError(f"{where}: tokenized format_version {show(data.get('format_version'))} "
                         f"is not {TOKENIZED_VERSION}; {RERUN}")
    str_field(data, "token_column", where, fix=_FIX)
    token_dtype_field(data, where, _FIX)
    object_field(data, "tokenizer", where, fix=_FIX)
    object_field(data, "options", where, fix=_FIX)
    counts = object_field(data, "counts", where, fix=_FIX)
    totals = [int_field(counts, key, where, prefix="counts.", fix=_FIX) for key in _COUNT_KEYS]
    rows = object_list_field(data, "shards", where, _SHARD_KEYS, ("source",), _FIX)
    docs = tokens = 0
    last = ""
    for k, row in enumerate(rows):
        label = f"{where}: shards[{k}]"
        name = row["path"]
        if not isinstance(name, str) or not PART_FILE_RE.match(name):
            raise InputError(f"{where} lists {show(name)}, which is not a part-NNNNNN.parquet file; {RERUN}")
        if name <= last:
            raise InputError(f"{label}: {name} follows {last}; the parts are listed once each, in name order; {_FIX}")
        last = name
        num_docs, num_tokens = (int_field(row, key, label, fix=_FIX) for key in ("num_docs", "num_tokens"))
        int_field(row, "num_bytes", label, fix=_FIX)
        hex_field(row, "sha256", label, fix=_FIX)
        if int_field(row, "doc_offset", label, fix=_FIX) != docs:
            raise InputError(f"{label}: doc_offset={row['doc_offset']}, expected {docs} (the sum over earlier "
                             f"shards); {_FIX}")
        if "source" in row and not isinstance(row["source"], dict):
            raise InputError(f"{label}: source={show(row['source'])}, expected an object; {_FIX}")
        docs, tokens = docs + num_docs, tokens + num_tokens
    for key, recorded, found in zip(_COUNT_KEYS, totals, (docs, tokens, len(rows))):
        if recorded != found or found > MAX_COUNT:
            raise InputError(f"{where}: counts.{key}={recorded} but its shards hold {found}; {_FIX}")
    if hex_field(data, "content_sha256", where, fix=_FIX) != files_sha256(rows):
        raise InputError(f"{where}: content_sha256={data['content_sha256']} is not the digest of its parts' "
                         f"sha256 ({files_sha256(rows)}); {_FIX}")


def tokenized_inputs(inputs: Sequence[str], token_column: str) -> list[ShardInfo] | None:
    """Shard infos from the manifests when every input is a tokenized corpus directory; None
    when none is. Cost: one manifest read and one directory listing per input, no footer read.

    Raises InputError for a mix of tokenized directories and other inputs, another token
    column, a listed file that is not a part file or whose size differs from the manifest's.
    """
    manifests = [load_tokenized_manifest(item) for item in inputs]
    if all(m is None for m in manifests):
        return None
    if any(m is None for m in manifests):
        mixed = next(item for item, m in zip(inputs, manifests) if m is None)
        raise InputError(f"input {mixed} is not a tokenized corpus but other inputs are; "
                         f"pack tokenized corpus directories alone")
    infos: list[ShardInfo] = []
    for item, manifest in zip(inputs, manifests):
        infos.extend(_manifest_shard_infos(item, manifest, token_column))
    return infos


def tokenizer_record(inputs: Sequence[str]) -> dict[str, Any] | None:
    """``{"identity": ..., "options": ..., "backends": [...]}`` of the tokenized corpora in ``inputs``
    (what the packed manifest records under "tokenizer"), or None when the inputs are not tokenized
    corpora. ``backends``: the distinct tokenizer backends that made them, in input order (absent
    when no manifest records one). Cost: one manifest read per input. Raises InputError when two
    corpora differ in identity or options (not in backend: the ids do not depend on it)."""
    manifests = [load_tokenized_manifest(item) for item in inputs]
    if not manifests or any(m is None for m in manifests):
        return None
    records = [{"identity": m.tokenizer, "options": m.options} for m in manifests]
    for item, record in zip(inputs, records):
        if record != records[0]:
            raise InputError(f"{item} was tokenized with another tokenizer or options than {inputs[0]}; "
                             f"pack corpora tokenized the same way, or tokenize them again together")
    backends = [m["backend"] for m in manifests if isinstance(m.get("backend"), dict)]
    distinct = [b for k, b in enumerate(backends) if b not in backends[:k]]
    return {**records[0], **({"backends": distinct} if distinct else {})}


def _source(source: Any) -> dict | None:
    """A part's text source as the manifest gives it, if well formed (only copied into the packed
    manifest, never opened)."""
    keys = {"path": str, "format": str, "start": int, "end": int}
    if isinstance(source, dict) and set(source) == set(keys) and all(
            isinstance(source[k], t) and not isinstance(source[k], bool) for k, t in keys.items()):
        return dict(source)
    return None


def _manifest_shard_infos(directory: str, manifest: TokenizedManifest, token_column: str) -> list[ShardInfo]:
    where = f"{directory}/{MANIFEST_NAME}"
    if manifest.token_column != token_column:
        raise InputError(f"{where}: the tokenized corpus has column {manifest.token_column!r}, "
                         f"not {token_column!r}; pass --token-column {manifest.token_column}")
    sizes = _file_sizes(directory)
    root = directory.rstrip("/") if is_uri(directory) else os.path.abspath(directory)  # as discover_shards gives
    infos = []
    for shard in manifest.shards:
        if sizes.get(shard.path) != shard.num_bytes:
            found = "missing" if shard.path not in sizes else f"{sizes[shard.path]} bytes"
            raise InputError(f"{where}: {shard.path} is {found}, the manifest says {shard.num_bytes} bytes; "
                             f"the corpus changed since it was written: {RERUN}")
        infos.append(ShardInfo(f"{root}/{shard.path}", "parquet", shard.num_docs, shard.num_tokens,
                               manifest.token_dtype.name, "manifest", source=shard.source))
    return infos


def _file_sizes(directory: str) -> dict[str, int]:
    """Size of each plain file directly in ``directory``, by name."""
    fs, base = resolve_filesystem(directory)
    selector = pafs.FileSelector(base, recursive=False)
    return {posixpath.basename(i.path): i.size for i in fs.get_file_info(selector) if i.type == pafs.FileType.File}
