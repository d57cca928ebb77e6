"""Shards: discovery, global offsets and the common token type. pyarrow/numpy only, no Ray.

The driver runs this before any worker starts:

  1. ``discover_shards(inputs)`` lists the shard files in a fixed order: the order of the
     inputs, each file/directory/glob expanded in sorted path order, duplicates dropped.
  2. ``raypack.inputs.reading.inspect_shard(path)`` counts each shard's documents and tokens.
  3. ``plan_offsets(infos)`` turns the counts into global offsets by a cumulative sum:
     document ``i`` of shard ``k`` has global doc id ``doc_offsets[k] + i``, and shard ``k``'s
     tokens start at global stream position ``token_offsets[k]``.

Inputs may be local paths or URIs (:mod:`raypack.io.fs`). A shard path returned by
``discover_shards`` is an absolute local path, or a URI when the input was one.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow.fs as pafs

from raypack.errors import InputError
from raypack.inputs.base import ShardInfo
from raypack.inputs.registry import accepted_suffixes, shard_format, shard_suffix
from raypack.io.fs import check_bucket, is_uri, resolve_filesystem, same_file_key

log = logging.getLogger(__name__)

__all__ = [
    "ShardPlan",
    "common_token_type",
    "discover_shards",
    "plan_offsets",
    "read_region",
]

_GLOB_MAGIC = re.compile(r"[*?\[]")


# ---------------------------------------------------------------------------------------------
# Discovery



def discover_shards(inputs: Sequence[str] | str) -> list[str]:
    """Shard paths, in a fixed order, for files, directories and globs.

    Order: the order of ``inputs``, each input expanded in sorted path order; a file seen
    before is dropped (the first occurrence keeps its place and its spelling): the same path, or a
    local path that resolves to the same file (``..``, a symbolic link, relative and absolute), with
    one INFO line (a hard link is the same file too). A directory expands to every
    shard file under it (recursive); a glob (``*``, ``?``, ``[...]``, and ``**`` for any
    number of directories) must match the whole path, one path component per pattern
    component. Expansion keeps only known shard suffixes and skips names starting with
    ``_`` or ``.`` (``_SUCCESS``, ``.tmp/``) at any level below the directory or glob root.
    A single string is taken as one input.
    """
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs:
        raise InputError("no inputs given; list shard files, directories or globs to pack")
    seen: dict[str, str] = {}  # the file (same_file_key) -> the path as first given
    again: list[tuple[str, str]] = []
    for item in inputs:
        for path in _expand_input(item):
            first = seen.setdefault(same_file_key(path), path)
            if first != path:
                again.append((path, first))
    if again:  # the same training data twice, from two spellings of one file, was packed twice without a word
        log.info("inputs: %d file%s given again under another path %s read once (%s is %s%s)", len(again),
                 "" if len(again) == 1 else "s", "is" if len(again) == 1 else "are", again[0][0], again[0][1],
                 ", ..." if len(again) > 1 else "")
    return list(seen.values())



def _expand_input(item: str) -> list[str]:
    if not isinstance(item, str) or not item:
        raise InputError(f"input {item!r} must be a non-empty path string")
    if _GLOB_MAGIC.search(item) and not (not is_uri(item) and os.path.isfile(item)):  # a file named star*.parquet
        return _expand_glob(item)
    fs, fs_path = resolve_filesystem(item)
    return _expand_path(item, fs, fs_path)


def _expand_path(item: str, fs: pafs.FileSystem, fs_path: str) -> list[str]:
    try:
        info = fs.get_file_info(fs_path)
    except PermissionError as e:  # a directory above it that may not be searched (a hostile trial: a traceback)
        raise InputError(f"cannot look up input {item} (permission denied on a directory above it); check the "
                         "permissions of its directories") from e
    if info.type == pafs.FileType.NotFound:
        check_bucket(fs, fs_path, f"input {item}")
        if not is_uri(item) and os.path.islink(item):
            raise InputError(f"input {item} is a symbolic link that leads nowhere (a loop, or its target is gone); "
                             "give the file or directory it should name")
        raise InputError(f"input path not found: {item}; check the path (globs may use * ? [...])")
    if info.type not in (pafs.FileType.File, pafs.FileType.Directory):
        raise InputError(f"input {item} is neither a file nor a directory (a FIFO, a socket, a device?); give shard "
                         "files, directories or globs")
    if info.type == pafs.FileType.File:
        if shard_format(fs_path) is None:
            raise InputError(
                f"input file {item} has an unknown shard suffix; accepted: {accepted_suffixes()}"
            )
        return [_to_user_path(item, fs_path, fs_path)]
    skipped: list[str] = []
    paths = sorted(_list_shard_files(fs, fs_path, recursive=True, walk=True, skipped=skipped))
    if not paths:
        raise InputError(f"input directory {item} {_what_it_holds(fs, fs_path, item)}")
    _say_skipped(f"input directory {item}", skipped)
    return [_to_user_path(item, fs_path, p) for p in paths]


KNOWN_METADATA = ("manifest.json", "dataset_info.json", "state.json", "dataset_dict.json", ".gitattributes")
"""Files a corpus directory holds beside its shards that are not data (raypack's and Hugging Face's): a
directory's expansion leaves them out without a word, as it does README and LICENSE files."""


def _is_metadata(name: str) -> bool:
    return name in KNOWN_METADATA or name.upper().startswith(("README", "LICENSE", "LICENCE"))


def _say_skipped(what: str, skipped: list[str]) -> None:
    """One WARNING line (once a process) where a directory or glob leaves out files that are not hidden: a
    directory's ``b.json`` beside ``a.jsonl``, or a ``c.jsonl.bz2``, was left out without a word and half a
    corpus with it (a new user's trial). Hidden and ``_`` names (``_SUCCESS``, ``.crc``) and KNOWN_METADATA are
    not counted."""
    names = sorted(p for p in skipped if not _is_metadata(p.rsplit("/", 1)[-1]))
    if not names or what in _SAID:
        return
    _SAID.add(what)
    json_named = [n for n in names if shard_suffix(n) in NAMED_ONLY_SUFFIXES]
    first = (json_named or names)[0]
    why = (f"a directory's .json files are read only when named (they are often metadata): pass "
           f"{first.rsplit('/', 1)[0]}/*.json too" if json_named else
           f"no shard suffix ({accepted_suffixes()}): rename or convert {'it' if len(names) == 1 else 'them'}")
    log.warning("%s: %d file%s not read, e.g. %s; %s to read %s, or move %s away", what, len(names),
                "" if len(names) == 1 else "s", first.rsplit("/", 1)[-1], why,
                *(["it"] * 2 if len(names) == 1 else ["them"] * 2))


def _what_it_holds(fs: pafs.FileSystem, fs_path: str, item: str) -> str:
    """Words for a directory with no shard files, from its own entries (not its subfolders'): empty, or
    what it has, and the hint for .json files only where it has some. On the error path only."""
    try:
        entries = fs.get_file_info(pafs.FileSelector(fs_path))
    except OSError:
        entries = []
    accepted = f"accepted suffixes: {accepted_suffixes()}; names starting with '_' or '.' are skipped"
    if not entries:
        return f"is empty; give the directory that holds the shard files ({accepted})"
    files = sorted(e.base_name for e in entries if e.type == pafs.FileType.File)
    if "manifest.json" in files and output_kind(fs, fs_path) == "mix":
        return ("is a mix (raypack mix's index over packed outputs), not a corpus of documents: read it with "
                "raypack.read_packed, or give pack the corpora its sources were packed from")
    if any(name.endswith(".json") for name in files):
        return (f"holds no shard files ({accepted}; .json files are read only when named: pass "
                f"{item.rstrip('/')}/*.json)")
    has = f"{len(files)} files like {files[0]}" if files else f"{len(entries)} folders and no shard file in them"
    return f"holds no shard files: it has {has} ({accepted})"


def output_kind(fs: pafs.FileSystem, fs_path: str) -> str | None:
    """What raypack output directory ``fs_path`` is, by its manifest.json: "mix", "tokenized" (raypack
    tokenize's corpus), "packed" or "" (a manifest of none of these); None without one. Reads the
    manifest's first 4 KiB, where raypack's writers put "kind" (a packed output's has none, and its
    ``context_length`` comes early); on error paths and plan checks only."""
    try:
        with fs.open_input_file(f"{fs_path.rstrip('/')}/manifest.json") as f:
            head = f.read(min(f.size(), 4096))
    except (OSError, ValueError):
        return None
    kind = re.search(rb'"kind"\s*:\s*"(mix|tokenized)"', head)
    return kind.group(1).decode() if kind else "packed" if b'"context_length"' in head else ""


def read_region(item: str) -> str | None:
    """The folder under which input ``item`` reads files at any depth, as the user wrote it: a
    directory itself, or a glob's base where the glob reaches into subfolders (``**``, or a pattern
    in a folder's name); None for a file or a glob over one folder's files. An output inside it would
    be read as input by a run over ``item`` again (raypack.pack.plan.check_output_outside_inputs)."""
    if not isinstance(item, str) or not item:
        return None
    if _GLOB_MAGIC.search(item):
        base, pattern_parts = _split_glob(item)
        return base if _glob_is_recursive(pattern_parts) else None
    fs, fs_path = resolve_filesystem(item)
    return item if fs.get_file_info(fs_path).type == pafs.FileType.Directory else None


def _split_glob(item: str) -> tuple[str, list[str]]:
    """A glob's base directory (no wildcard) and its pattern's parts."""
    trimmed = item.rstrip("/")
    parts = trimmed.split("/")
    first_magic = next(i for i, part in enumerate(parts) if _GLOB_MAGIC.search(part))
    if is_uri(item) and first_magic < 3:
        raise InputError(f"glob {item} must not put wildcards in the URI's bucket or host")
    return "/".join(parts[:first_magic]) or ("/" if trimmed.startswith("/") else "."), parts[first_magic:]


def _glob_is_recursive(pattern_parts: list[str]) -> bool:
    return len(pattern_parts) > 1 or "**" in pattern_parts


def _expand_glob(item: str) -> list[str]:
    base, pattern_parts = _split_glob(item)
    fs, base_fs_path = resolve_filesystem(base)
    if fs.get_file_info(base_fs_path).type != pafs.FileType.Directory:
        check_bucket(fs, base_fs_path, f"input {item}")
        raise InputError(f"glob {item} matched nothing: its base directory {base} does not exist")
    recursive = _glob_is_recursive(pattern_parts)
    skipped: list[str] = []
    candidates = list(_list_shard_files(fs, base_fs_path, recursive=recursive, skipped=skipped))
    matches = sorted(
        p for p in candidates if _match_parts(pattern_parts, _relative_parts(base_fs_path, p))
    )
    if not matches:
        raise InputError(
            f"glob {item} matched no shard files (accepted suffixes: {accepted_suffixes()}; "
            "names starting with '_' or '.' are skipped); check the pattern"
        )
    _say_skipped(f"glob {item}", [p for p in skipped if _match_parts(pattern_parts, _relative_parts(base_fs_path, p))])
    return [_to_user_path(base, base_fs_path, p) for p in matches]


NAMED_ONLY_SUFFIXES = (".json",)
"""Read only when named (a file or a glob), never found by walking a directory: a directory's
``.json`` files are usually metadata (an HF ``dataset_info.json``, a raypack ``manifest.json``)."""


def _list_shard_files(fs: pafs.FileSystem, root: str, *, recursive: bool, walk: bool = False,
                      skipped: list[str] | None = None) -> Iterator[str]:
    """Files under ``root`` with a shard suffix and no hidden component below ``root`` (``walk``: a
    directory's expansion, which skips NAMED_ONLY_SUFFIXES); ``skipped`` gets the files left out for
    their suffix alone."""
    if isinstance(fs, pafs.LocalFileSystem):
        files = _local_files(root, recursive)
    else:
        selector = pafs.FileSelector(root, recursive=recursive, allow_not_found=True)
        files = (info.path for info in fs.get_file_info(selector) if info.type == pafs.FileType.File)
    for path in files:
        if any(part.startswith(("_", ".")) for part in _relative_parts(root, path)):
            continue
        if shard_format(path) is None or (walk and shard_suffix(path) in NAMED_ONLY_SUFFIXES):
            if skipped is not None:
                skipped.append(path)
            continue
        yield path


_SAID: set[str] = set()
"""The looping directories whose line was said (once a process)."""


def _local_files(root: str, recursive: bool) -> Iterator[str]:
    """The files under local directory ``root`` (through symbolic links), each directory entered once:
    a link back to a directory already entered (``self -> .``) is not followed again. pyarrow's
    recursive listing followed such loops to the kernel's 40 links, listing every file 41 times; with
    two links, without end. Hidden and ``_`` directories below ``root`` are not entered."""
    entered: set[tuple[int, int]] = set()
    pending = [root]
    while pending:
        directory = pending.pop()
        try:
            st = os.stat(directory)
            if (st.st_dev, st.st_ino) in entered:
                if directory not in _SAID:  # a run lists its inputs twice on Ray (before its start, and to plan)
                    _SAID.add(directory)
                    log.info("input directory %s is one already listed (through a symbolic link); its files are "
                             "listed once", directory)
                continue
            entered.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        except OSError as e:
            raise InputError(f"cannot list input directory {directory} ({e.strerror}); check its permissions") from e
        for entry in entries:
            try:
                if entry.is_file():
                    yield entry.path
                elif recursive and entry.is_dir() and not entry.name.startswith(("_", ".")):
                    pending.append(entry.path)
                elif entry.is_symlink() and not entry.is_dir():
                    _refuse_dangling(entry)
            except OSError:  # a link whose target cannot be looked up (a loop of links)
                _refuse_dangling(entry)


def _refuse_dangling(entry: os.DirEntry) -> None:
    """A symbolic link that leads nowhere, named as a shard (its suffix, no '_' or '.' first): the shard it
    stood for would be left out without a word (a hostile trial). Others are skipped, as their files are."""
    if shard_format(entry.name) is not None and shard_suffix(entry.name) not in NAMED_ONLY_SUFFIXES \
            and not entry.name.startswith(("_", ".")):
        raise InputError(f"input {entry.path} is a symbolic link that leads nowhere (a loop, or its target is gone); "
                         "restore its target, or remove the link to pack without it")


def _relative_parts(root: str, path: str) -> list[str]:
    root = root.rstrip("/")
    rel = path[len(root) :] if path.startswith(root) else path
    return [part for part in rel.split("/") if part]


def _match_parts(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Component-wise fnmatch; a ``**`` component matches zero or more components."""
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_parts(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _match_parts(rest, parts[1:])


def _to_user_path(item: str, item_fs_path: str, fs_path: str) -> str:
    """``fs_path`` written the way the input was: a local path, or a URI like ``item``."""
    if not is_uri(item):
        return fs_path
    item = item.rstrip("/")
    at = item.rfind(item_fs_path.rstrip("/")) if item_fs_path.strip("/") else -1
    if at < 0:
        return item[: item.index("://") + 3] + fs_path
    return item[:at] + fs_path + item[at + len(item_fs_path.rstrip("/")) :]


# ---------------------------------------------------------------------------------------------
# Offsets and the common token type


class ShardPlan(NamedTuple):
    """Global offsets of shards in discovery order.

    doc_offsets:   (n + 1,) int64; shard k holds global doc ids [doc_offsets[k], doc_offsets[k+1]).
    token_offsets: (n + 1,) int64; shard k's tokens sit at stream positions
                   [token_offsets[k], token_offsets[k+1]).
    """

    doc_offsets: npt.NDArray[np.int64]
    token_offsets: npt.NDArray[np.int64]

    @property
    def num_docs(self) -> int:
        return int(self.doc_offsets[-1])

    @property
    def num_tokens(self) -> int:
        return int(self.token_offsets[-1])


def plan_offsets(infos: Sequence[ShardInfo]) -> ShardPlan:
    """Exclusive cumulative sums of the shards' document and token counts, starting at 0."""
    num_docs = np.array([info.num_docs for info in infos], dtype=np.int64)
    num_tokens = np.array([info.num_tokens for info in infos], dtype=np.int64)
    if (num_docs < 0).any() or (num_tokens < 0).any():
        raise ValueError("shard counts must be >= 0")
    return ShardPlan(_exclusive_cumsum(num_docs), _exclusive_cumsum(num_tokens))


def _exclusive_cumsum(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


_INTEGER_BITS = {f"{sign}int{bits}": bits for sign in ("", "u") for bits in (8, 16, 32, 64)}


def common_token_type(infos: Sequence[ShardInfo]) -> str:
    """The narrowest integer type every shard's token type converts to without loss.

    All signed: the widest; all unsigned: the widest; mixed: a signed type wide enough for
    both (uint16 + int32 -> int32, uint32 + int32 -> int64). uint64 mixed with a signed type
    has no such type and raises InputError naming a shard of each.
    """
    if not infos:
        raise InputError("no shards to take a token type from; check the inputs")
    for info in infos:
        if info.token_type not in _INTEGER_BITS:
            raise ValueError(f"shard {info.path} token_type={info.token_type!r} is not an integer type")
    signed = [i for i in infos if not i.token_type.startswith("u")]
    unsigned = [i for i in infos if i.token_type.startswith("u")]
    widest_signed = max(signed, key=lambda i: _INTEGER_BITS[i.token_type], default=None)
    widest_unsigned = max(unsigned, key=lambda i: _INTEGER_BITS[i.token_type], default=None)
    if widest_unsigned is None:
        return widest_signed.token_type
    if widest_signed is None:
        return widest_unsigned.token_type
    bits = max(_INTEGER_BITS[widest_signed.token_type], 2 * _INTEGER_BITS[widest_unsigned.token_type])
    if bits > 64:
        raise InputError(
            f"no integer type can hold both {widest_unsigned.token_type} (shard "
            f"{widest_unsigned.path}) and {widest_signed.token_type} (shard {widest_signed.path}) "
            "safely; re-write the shards with one token type (int64 holds ids < 2**63)"
        )
    return f"int{bits}"
