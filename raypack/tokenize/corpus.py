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

import json
import posixpath
import re
from typing import Any, Sequence

import pyarrow.fs as pafs

from raypack import __version__
from raypack.errors import InputError
from raypack.inputs.base import ShardInfo
from raypack.io.fs import resolve_filesystem
from raypack.packed.manifest import write_manifest
from raypack.packed.writer import MANIFEST_NAME, files_sha256

TOKENIZED_KIND = "tokenized"
TOKENIZED_VERSION = 1
TOKEN_COLUMN = "input_ids"
PART_FILE_RE = re.compile(r"^part-(\d{6,})\.parquet$")
TOKENIZED_SUBDIR = "_tokenized"
"""Where ``raypack pack --tokenizer`` writes its tokenized corpus inside its work directory."""


def part_file_name(task_index: int) -> str:
    """``part-{task_index:06d}.parquet``: sorted names are the input order."""
    return f"part-{task_index:06d}.parquet"


def build_tokenized_manifest(shards: list[dict[str, Any]], token_dtype: str, tokenizer: dict[str, Any],
                             options: dict[str, Any], backend: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a tokenized corpus. ``shards``: one dict per part file, in order, with
    path, num_docs, num_tokens, num_bytes, sha256, source; doc_offset is added here. ``backend``:
    name and version of the tokenizer backend that computed the ids (raypack.tokenize.backends),
    a record only: the ids are the reference library's whichever ran."""
    doc_offset, rows = 0, []
    for shard in shards:
        rows.append({**shard, "doc_offset": doc_offset})
        doc_offset += shard["num_docs"]
    return {
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
    }


def save_tokenized_manifest(out_dir: str, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` whole (call last: it is the commit)."""
    write_manifest(out_dir, manifest)


def load_tokenized_manifest(directory: str) -> dict[str, Any] | None:
    """The tokenized manifest in ``directory`` (a path or URI), or None if it holds none (or
    another kind of manifest). A manifest that does not parse is an InputError."""
    if any(c in directory for c in "*?["):
        return None
    fs, base = resolve_filesystem(directory)
    path = posixpath.join(base.rstrip("/"), MANIFEST_NAME) if base.rstrip("/") else MANIFEST_NAME
    try:
        if fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with fs.open_input_stream(path, compression=None) as f:
            manifest = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise InputError(f"{directory}/{MANIFEST_NAME} cannot be read as JSON ({e}); re-run raypack tokenize") from e
    if not isinstance(manifest, dict) or manifest.get("kind") != TOKENIZED_KIND:
        return None
    if manifest.get("format_version") != TOKENIZED_VERSION:
        raise InputError(f"{directory}/{MANIFEST_NAME}: tokenized format_version {manifest.get('format_version')!r} "
                         f"is not {TOKENIZED_VERSION}; re-run raypack tokenize")
    return manifest


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
    records = [{"identity": m.get("tokenizer"), "options": m.get("options")} for m in manifests]
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


def _manifest_shard_infos(directory: str, manifest: dict[str, Any], token_column: str) -> list[ShardInfo]:
    where = f"{directory}/{MANIFEST_NAME}"
    if manifest.get("token_column") != token_column:
        raise InputError(f"{where}: the tokenized corpus has column {manifest.get('token_column')!r}, "
                         f"not {token_column!r}; pass --token-column {manifest.get('token_column')}")
    sizes = _file_sizes(directory)
    infos = []
    try:
        for shard in manifest["shards"]:
            name = shard["path"]
            if not isinstance(name, str) or not PART_FILE_RE.match(name):
                raise InputError(f"{where} lists {name!r}, which is not a part-NNNNNN.parquet file; "
                                 "re-run raypack tokenize")
            if sizes.get(name) != shard["num_bytes"]:
                found = "missing" if name not in sizes else f"{sizes[name]} bytes"
                raise InputError(f"{where}: {name} is {found}, the manifest says {shard['num_bytes']} bytes; "
                                 f"the corpus changed since it was written: re-run raypack tokenize")
            infos.append(ShardInfo(f"{directory.rstrip('/')}/{name}", "parquet", int(shard["num_docs"]),
                                   int(shard["num_tokens"]), str(manifest["token_dtype"]), "manifest",
                                   source=_source(shard.get("source"))))
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        raise InputError(f"{where} is malformed ({e!r}); re-run raypack tokenize") from e
    return infos


def _file_sizes(directory: str) -> dict[str, int]:
    """Size of each plain file directly in ``directory``, by name."""
    fs, base = resolve_filesystem(directory)
    selector = pafs.FileSelector(base, recursive=False)
    return {posixpath.basename(i.path): i.size for i in fs.get_file_info(selector) if i.type == pafs.FileType.File}
