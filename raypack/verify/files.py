"""Check 1, the files: listed ones present, none unlisted, sizes and sha256 as the manifest records
(and, for a format version 2 manifest, its ``content_sha256`` from those sha256 digests).

Every file is opened only through :func:`raypack.packed.manifest.open_chunk_file` (a plain file directly
inside the output directory: no symlink, even one whose target hashes right, no FIFO) and hashed
streaming, ``HASH_BLOCK_BYTES`` at a time. Hashing comes before decoding, so nothing later decodes
a file whose bytes are not the ones the manifest vouches for. Cost: one read of every byte.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.io.lock import ObjectStoreLock
from raypack.packed.manifest import open_chunk_file
from raypack.packed.writer import CHUNK_FILE_RE, MANIFEST_NAME, files_sha256
from raypack.verify.report import VerifyError

log = logging.getLogger(__name__)

__all__ = ["HASH_BLOCK_BYTES", "check_files", "open_file"]

HASH_BLOCK_BYTES = 8 << 20
"""Bytes read at a time when hashing a chunk file."""


def open_file(fs: pafs.FileSystem, base: str, entry: dict[str, Any]) -> pa.NativeFile:
    """The manifest's file ``entry`` through :func:`raypack.packed.manifest.open_chunk_file` (a plain file
    directly inside ``base`` of ``num_bytes`` bytes); its InputError becomes a VerifyError."""
    try:
        return open_chunk_file(fs, base, entry["path"], entry["num_bytes"])
    except InputError as e:
        raise VerifyError(str(e)) from e


def check_files(fs: pafs.FileSystem, base: str, manifest: dict[str, Any]) -> int:
    """Listed files present, none unlisted, sizes and sha256 as recorded; return the total bytes."""
    present = {posixpath.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(base))}
    files = manifest.files
    for entry in files:
        if entry["path"] not in present:
            last = entry["first_chunk"] + entry["num_chunks"] - 1
            raise VerifyError(f"{posixpath.join(base, entry['path'])}: missing (the manifest lists it for "
                              f"chunks {entry['first_chunk']}..{last})")
    listed = {entry["path"] for entry in files}
    unlisted = sorted(n for n in present if _looks_like_chunk_file(n) and n not in listed)
    if unlisted:
        raise VerifyError(f"{posixpath.join(base, unlisted[0])}: a chunk file the manifest does not list "
                          f"({len(unlisted)} unlisted in all); it is not part of this output")
    others = sorted(present - listed - {MANIFEST_NAME, ObjectStoreLock.NAME})
    if others:  # not an error (no reader opens them), but not what a run leaves: said (a hostile trial)
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        log.warning("%s holds %r%s, which the manifest does not list: a published output holds only %s and its "
                    "files (pack --overwrite refuses what it did not write); move it away", base, others[0], more,
                    MANIFEST_NAME)
    for entry in files:
        _check_file_bytes(fs, base, entry)
    if manifest.format_version == 2:  # version 3's content digest is checked as the chunks are decoded
        _check_files_sha256(base, manifest)
    return sum(entry["num_bytes"] for entry in files)


def _check_files_sha256(base: str, manifest: dict[str, Any]) -> None:
    """Format version 2's ``content_sha256``: the sha256 of the files' sha256 digests, one per line."""
    expected = files_sha256(manifest.files)
    if manifest.content_sha256 != expected:
        raise VerifyError(f"{posixpath.join(base, MANIFEST_NAME)}: content_sha256={manifest.content_sha256}, "
                          f"expected {expected} (format version 2: sha256 of the files' sha256 digests, one per line)")


def _looks_like_chunk_file(name: str) -> bool:
    """A chunk file name of this format or of version 1 (``chunks-{first:012d}.arrow``)."""
    return CHUNK_FILE_RE.fullmatch(name) is not None or (name.startswith("chunks-") and name.endswith(".arrow"))


def _check_file_bytes(fs: pafs.FileSystem, base: str, entry: dict[str, Any]) -> None:
    """Size (checked on open) and sha256 of the file ``entry`` names, as the manifest records."""
    path = posixpath.join(base, entry["path"])
    with open_file(fs, base, entry) as source:
        digest, num_bytes = _sha256(source)
    if num_bytes != entry["num_bytes"]:
        raise VerifyError(f"{path}: read {num_bytes} bytes, the manifest says num_bytes={entry['num_bytes']}")
    if digest != entry["sha256"]:
        raise VerifyError(f"{path}: sha256 {digest} differs from the manifest's {entry['sha256']}; "
                          "the file's bytes changed after it was written")


def _sha256(source: pa.NativeFile) -> tuple[str, int]:
    """Hex sha256 and size of an open file, read in HASH_BLOCK_BYTES blocks (zero-copy when mapped)."""
    sha, num_bytes = hashlib.sha256(), 0
    while (block := source.read_buffer(HASH_BLOCK_BYTES)).size:
        sha.update(block)
        num_bytes += block.size
    return sha.hexdigest(), num_bytes
