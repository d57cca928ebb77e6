"""Finding an output: the file system holding a path, its ``manifest.json`` read (parsed, NOT checked:
:mod:`raypack.packed.manifest` checks it), and, where there is none, what the directory holds instead, in a
message's words (an input, an export, an empty or unrelated directory, or an unfinished run)."""

from __future__ import annotations

import posixpath
from typing import Any

import pyarrow.fs as pafs

from raypack.errors import InputError, NotAnOutput
from raypack.io.fs import check_bucket, error_text, is_uri, resolve_filesystem
from raypack.io.json_doc import read_json_document
from raypack.packed.writer import CHUNK_FILE_RE, MANIFEST_NAME

__all__ = ["MAX_MANIFEST_BYTES", "read_manifest_json", "resolve_output"]

MAX_MANIFEST_BYTES = 128 << 20
"""A larger ``manifest.json`` is refused unread, and never written (raypack.io.json_doc: a document
the pre-scan lets through builds at most ~5x its bytes in ``json.loads``, so a reader stays under
1 GiB; bench/bench_manifest.py). A shard or file entry takes ~220-250 bytes: ~500,000 of them."""


def resolve_output(path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding output directory ``path`` (local path or URI) and its path there."""
    filesystem, base = resolve_filesystem(path)
    return filesystem, base.rstrip("/") or base


def read_manifest_json(path: str) -> tuple[Any, str]:
    """``manifest.json`` of output directory ``path`` parsed but NOT checked, and its path: for
    readers that first ask which kind of output it is (a packed output or a mix, raypack.mix.dataset).
    Same InputErrors as :func:`load_manifest` up to the parse."""
    filesystem, base = resolve_output(path)
    manifest_path = posixpath.join(base, MANIFEST_NAME)
    try:
        info = filesystem.get_file_info(manifest_path)
        if info.type != pafs.FileType.File and filesystem.get_file_info(base).type != pafs.FileType.Directory:
            check_bucket(filesystem, base, f"output {path}")
            raise NotAnOutput(f"{path}: no such output directory; check the path")
    except NotAnOutput:
        raise
    except InputError as e:  # a missing bucket: not an output that fails an audit (verify's exit 1)
        raise NotAnOutput(str(e)) from e
    except OSError as e:  # an endpoint that does not answer, credentials refused: a traceback (an operator's trial)
        fix = "check the endpoint (AWS_ENDPOINT_URL) and the credentials" if is_uri(path) else "check its permissions"
        raise NotAnOutput(f"cannot reach the output {path} ({error_text(e, 300)}); {fix}") from e
    if info.type != pafs.FileType.File:
        what = _what_is_there(filesystem, base)
        if what:  # an input, or an export ("1 file(s) like index.json: an input" of an MDS export, a trial)
            raise NotAnOutput(f"{path} {what}; give the directory raypack pack wrote (its --output)")
        raise InputError(f"{path} is incomplete: no {MANIFEST_NAME}; the job did not finish (or the output is "
                         "being replaced): rerun it, or wait for it")
    manifest = read_json_document(filesystem, manifest_path, MAX_MANIFEST_BYTES)
    return manifest, manifest_path


_INPUT_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".jsonl.zst", ".json", ".arrow", ".ipc")


def _what_is_there(filesystem: pafs.FileSystem, base: str) -> str:
    """What directory ``base`` (no manifest) holds, in a message's words: an export of ``raypack export``, input
    files (in it or in its first subfolders), nothing, or other files; "" where it holds a run's files (chunk files,
    resume records under ``_results/``): an unfinished run. Its error path only: a listing or a few."""
    try:
        entries = filesystem.get_file_info(pafs.FileSelector(base))
    except OSError:
        return ""
    names = sorted(posixpath.basename(i.path) for i in entries if i.type == pafs.FileType.File)
    folders = sorted(posixpath.basename(i.path) for i in entries if i.type == pafs.FileType.Directory)
    pair = [n[:-4] for n in names if n.endswith(".bin") and f"{n[:-4]}.idx" in names]
    if "index.json" in names or pair:
        return "is " + ("an MDS export (index.json)" if "index.json" in names else
                        f"a Megatron indexed dataset ({pair[0]}.bin + .idx)") + ", not a packed output (its reader " \
            "reads it)"
    if any(CHUNK_FILE_RE.match(n) for n in names) or "_results" in folders:
        return ""  # a run's files without its manifest: unfinished (an object store), or damaged
    found = [n for n in names if n.endswith(_INPUT_SUFFIXES)]
    for folder in folders[:_FOLDERS_LOOKED_INTO]:  # a corpus in subfolders (a new user's trial: jsonl/, pq/)
        if found:
            break
        try:
            found = sorted(posixpath.join(folder, posixpath.basename(i.path)) for i in
                           filesystem.get_file_info(pafs.FileSelector(posixpath.join(base, folder)))
                           if i.type == pafs.FileType.File and i.path.endswith(_INPUT_SUFFIXES))
        except OSError:
            continue
    if found:
        return (f"holds no {MANIFEST_NAME} and no chunk files, but {len(found)} file(s) like {found[0]}: an input, "
                "not a packed output")
    if not names and not folders:
        return "is an empty directory, not a packed output"
    return (f"holds no {MANIFEST_NAME} and no chunk files (it holds {(names or folders)[0]}, ...): not a packed "
            "output")


_FOLDERS_LOOKED_INTO = 8
"""How many of a directory's subfolders :func:`_what_is_there` lists, looking for input files."""
