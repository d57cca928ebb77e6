"""MosaicML streaming (MDS) export of a packed output: sample i is chunk i.

Read by ``streaming.StreamingDataset(local=DIR)`` (mosaicml-streaming) and so by llm-foundry's
text dataloader (``StreamingTextDataset`` reads the ``tokens`` column; an ndarray sample is
used as it is, ``[:max_seq_len]``, cast to int64). Pure numpy/pyarrow; files go through
:class:`raypack.output.AtomicFile`, so any filesystem the job supports (local, ``s3://``, ...).

Columns of every sample (MDS keeps them sorted by name):

| column | MDS encoding | value |
|---|---|---|
| ``segment_doc_ids`` | ``ndarray:int64`` | the chunk's segments' global doc ids, ``-1`` for padding |
| ``segment_lengths`` | ``ndarray:int32`` | their lengths; they sum to C |
| ``tokens`` | ``ndarray:{token dtype}:{C}`` | the chunk's C tokens |

The segments are the packed format's (docs/FORMAT.md): maximal runs of one doc id, so the
dense per-position doc ids raypack's masks take are ``np.repeat(segment_doc_ids,
segment_lengths)`` (-1 on padding), from which a trainer builds the block-diagonal causal mask
(raypack.masks). A chunk always has at least one segment, as an MDS ndarray must.

Bytes, exactly as mosaicml-streaming 0.13's ``MDSWriter`` writes them (proven in
tests/test_export_mds.py by writing the same samples with it): a shard file is
``[num_samples: u32][offsets: u32 x (num_samples + 1)][config JSON][samples]``, offsets
absolute in the file; a sample is ``[u32 size of segment_doc_ids][u32 size of
segment_lengths]`` then the three columns in name order; a dynamic-shape 1-D ndarray is
``[(1 << 2) | w][shape: 1 element of 2**w bytes, w the narrowest of u8/u16/u32/u64][values]``;
the static ``tokens`` is its values only. All little-endian. ``index.json`` is
``{"shards": [entry, ...], "version": 2}`` (sorted keys), written last: a directory without it
is not a dataset.

Parallel parts: part p (one file of the packed output) writes ``shard.{p:05d}.{k:05d}.mds``,
k = 0, 1, ... (:class:`PartWriter`) and returns their index entries; :func:`write_index`
writes ``index.json`` from all parts' entries in part order. Shards close at the first sample
that would pass ``size_limit`` bytes (counted as MDSWriter does: 4 bytes per sample beyond its
own, plus the header), so a shard's bytes depend only on the part's chunks and the options.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow.fs as pafs
from numpy.lib.stride_tricks import as_strided

from raypack.core import Chunks, concat_chunks
from raypack.errors import InputError
from raypack.fs import error_text, resolve_filesystem
from raypack.output import AtomicFile, write_whole
from raypack.packed import PackedDataset, read_packed

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SIZE_LIMIT",
    "INDEX_NAME",
    "MdsExport",
    "PartWriter",
    "decode_shard",
    "encode_chunks",
    "export_mds",
    "export_part",
    "load_index",
    "read_shard",
    "remove_shards",
    "shard_config",
    "shard_name",
    "verify_mds",
    "write_index",
    "write_part",
]

INDEX_NAME = "index.json"
DEFAULT_SIZE_LIMIT = 1 << 26
"""Bytes per shard before a new one starts (MDSWriter's default, 64 MiB)."""
SHARD_NAME_RE = re.compile(r"^shard\.(\d{5,})\.(\d{5,})\.mds$")
COLUMNS = ("segment_doc_ids", "segment_lengths", "tokens")
WRITE_BLOCK_BYTES = 8 << 20
"""A shard is assembled and written this many bytes at a time (one reused buffer)."""
_TOKEN_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_SAMPLE_HEAD = 8
"""Per sample: the u32 sizes of its two variable-size columns."""
_DAMAGED = "the export is damaged or not this source's; export again"


def shard_name(part: int, shard: int) -> str:
    """``shard.{part:05d}.{shard:05d}.mds``: shard ``shard`` of part ``part``."""
    return f"shard.{part:05d}.{shard:05d}.mds"


def shard_config(context_length: int, token_dtype: npt.DTypeLike, size_limit: int | None) -> dict[str, Any]:
    """The config every shard embeds and its index entry repeats (MDSWriter's keys and values)."""
    dtype = np.dtype(token_dtype)
    return {
        "column_encodings": ["ndarray:int64", "ndarray:int32", f"ndarray:{dtype.name}:{context_length}"],
        "column_names": list(COLUMNS),
        "column_sizes": [None, None, context_length * dtype.itemsize],
        "compression": None,
        "format": "mds",
        "hashes": [],
        "size_limit": size_limit,
        "version": 2,
    }


def _config_bytes(config: dict[str, Any]) -> bytes:
    return json.dumps(config, sort_keys=True).encode()


# ----------------------------------------------------------------------------- encoding


def _shape_width(lengths: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per 1-D array of ``lengths`` elements, ``w``: its shape is stored in ``2**w`` bytes."""
    return (lengths >= 1 << 8).astype(np.int64) + (lengths >= 1 << 16) + (lengths >= 1 << 32)


def _put_ndarrays(out: np.ndarray, starts: np.ndarray, lengths: np.ndarray, width: np.ndarray,
                  values: np.ndarray, offsets: np.ndarray) -> None:
    """Write one dynamic-shape 1-D ndarray per sample into ``out`` (uint8) at ``starts`` (n,):
    sample i's array is ``values[offsets[i]:offsets[i+1]]`` (``lengths[i]`` of them)."""
    n, itemsize = starts.size, values.dtype.itemsize
    out[starts] = 4 | width                                  # ndim 1, shape width
    shape = lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    keep = np.arange(8) < (1 << width)[:, None]
    out[((starts + 1)[:, None] + np.arange(8))[keep]] = shape[keep]
    owner = np.repeat(np.arange(n), lengths)
    first = starts + 1 + (1 << width)
    dest = first[owner] + itemsize * (np.arange(values.size) - offsets[owner])
    out[dest[:, None] + np.arange(itemsize)] = values.view(np.uint8).reshape(-1, itemsize)


class EncodedChunks(NamedTuple):
    """Chunks as MDS samples, tokens not copied.

    heads:       (H,) uint8; sample i's bytes before its tokens are ``heads[head_starts[i]:head_starts[i+1]]``.
    head_starts: (n + 1,) int64.
    tokens:      (n, R) uint8 view of the chunks' tokens, R = C x itemsize.
    """

    heads: npt.NDArray[np.uint8]
    head_starts: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.uint8]

    @property
    def num_samples(self) -> int:
        return int(self.tokens.shape[0])

    def sizes(self) -> npt.NDArray[np.int64]:
        """(n,) int64: each sample's bytes."""
        return np.diff(self.head_starts) + self.tokens.shape[1]

    def rows(self, start: int, stop: int) -> EncodedChunks:
        """Samples ``[start, stop)`` as views."""
        a, b = int(self.head_starts[start]), int(self.head_starts[stop])
        return EncodedChunks(self.heads[a:b], self.head_starts[start: stop + 1] - a, self.tokens[start:stop])


def encode_chunks(chunks: Chunks) -> EncodedChunks:
    """``chunks`` as MDS samples (module docstring). Cost: O(n + segments) numpy; tokens untouched."""
    counts = np.diff(chunks.segment_offsets)
    width = _shape_width(counts)
    ids_size = 1 + (1 << width) + 8 * counts
    lens_size = 1 + (1 << width) + 4 * counts
    head_starts = np.zeros(counts.size + 1, np.int64)
    np.cumsum(_SAMPLE_HEAD + ids_size + lens_size, out=head_starts[1:])
    heads = np.empty(int(head_starts[-1]), np.uint8)
    starts = head_starts[:-1]
    sizes = np.stack([ids_size, lens_size], axis=1).astype("<u4").view(np.uint8)
    heads[starts[:, None] + np.arange(_SAMPLE_HEAD)] = sizes
    first, last = int(chunks.segment_offsets[0]), int(chunks.segment_offsets[-1])
    offsets = chunks.segment_offsets - first
    _put_ndarrays(heads, starts + _SAMPLE_HEAD, counts, width,
                  chunks.segment_doc_ids[first:last].astype("<i8", copy=False), offsets)
    _put_ndarrays(heads, starts + _SAMPLE_HEAD + ids_size, counts, width,
                  chunks.segment_lengths[first:last].astype("<i4", copy=False), offsets)
    tokens = np.ascontiguousarray(chunks.input_ids)
    tokens = tokens.astype(tokens.dtype.newbyteorder("<"), copy=False)
    return EncodedChunks(heads, head_starts, tokens.view(np.uint8).reshape(tokens.shape[0], -1))


def _assemble(encoded: EncodedChunks, out: np.ndarray) -> np.ndarray:
    """Samples of ``encoded`` end to end in ``out`` (uint8, large enough); returns the used view.
    Heads go through one index, tokens through one strided row assignment: no per-sample loop."""
    n, row = encoded.tokens.shape
    used = out[: int(encoded.head_starts[-1]) + n * row]
    head_lens = np.diff(encoded.head_starts)
    sample_starts = encoded.head_starts[:-1] + row * np.arange(n)
    owner = np.repeat(np.arange(n), head_lens)
    used[np.arange(encoded.heads.size) + row * owner] = encoded.heads
    if n and row:
        windows = as_strided(used, shape=(used.size - row + 1, row), strides=(1, 1))
        windows[sample_starts + head_lens] = encoded.tokens
    return used


def shard_head(sample_sizes: npt.NDArray[np.int64], config: bytes) -> bytes:
    """``[num_samples][offsets][config]`` of a shard whose samples have ``sample_sizes`` bytes."""
    n = sample_sizes.size
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(sample_sizes, out=offsets[1:])
    offsets += 4 + 4 * (n + 1) + len(config)
    if offsets[-1] >= 1 << 32:
        raise ValueError(f"a shard of {n} samples would hold {offsets[-1]} bytes; MDS offsets are u32, "
                         "lower size_limit")
    return np.uint32(n).astype("<u4").tobytes() + offsets.astype("<u4").tobytes() + config


# ----------------------------------------------------------------------------- writing


class Committer:
    """Publishes :class:`AtomicFile` s in order on one background thread (fsync and rename release
    the GIL), so that a shard's fsync overlaps writing the next one. :meth:`wait` blocks until
    every file submitted is published and raises the first error; a file whose commit fails is
    aborted. Use as a context manager (the thread ends on exit)."""

    MAX_PENDING = 2

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raypack-mds-commit")
        self._futures: list[Future] = []

    def submit(self, file: AtomicFile) -> None:
        """Queue ``file``'s commit once fewer than MAX_PENDING are queued (each holds an open file);
        raise the error of an earlier commit first, so a full disk stops the export within
        MAX_PENDING shards, not at its end."""
        while len(self._futures) >= self.MAX_PENDING:
            self._futures[0].exception()  # waits for it
            self._futures = [f for f in self._futures if not f.done() or f.exception() is not None]
            failed = next((f.exception() for f in self._futures if f.done()), None)
            if failed is not None:
                file.abort()
                raise failed
        self._futures.append(self._pool.submit(_commit_or_abort, file))

    def wait(self) -> None:
        """Wait for every commit submitted; raise the first error (after all have ended)."""
        futures, self._futures = self._futures, []
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first

    def drain(self) -> None:
        """Wait for every commit submitted, ignoring their errors (before cleaning up after one)."""
        futures, self._futures = self._futures, []
        for future in futures:
            future.exception()

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, exc_type: type | None, *exc_info: object) -> None:
        self._pool.shutdown(wait=True)  # every commit has ended: published, or failed and aborted
        if exc_type is None:
            self.wait()


def _commit_or_abort(file: AtomicFile) -> None:
    try:
        file.commit()
    except BaseException:
        file.abort()
        raise


class PartWriter:
    """Writes part ``part`` of an MDS export into ``out_dir``: :meth:`write` chunks in order, then
    :meth:`close` returns the index entries of its shards ``shard.{part}.{k}.mds``.

    A shard is held as views (tokens are not copied) until it is full, then written whole through
    :class:`AtomicFile` (appears complete or not at all), assembled WRITE_BLOCK_BYTES at a time in
    one reused buffer, and published (fsync, rename) here or, given a ``committer``, on its
    thread: then :meth:`close` returns before the last shards are published, and the caller
    waits with ``committer.wait()`` before writing the index. Memory: one shard's segment bytes
    plus the source batches it views. :meth:`abort` removes the shards this writer published.
    """

    def __init__(self, out_dir: str, part: int, *, context_length: int, token_dtype: npt.DTypeLike,
                 size_limit: int | None = DEFAULT_SIZE_LIMIT, committer: Committer | None = None) -> None:
        if size_limit is not None and not 0 < size_limit < 1 << 32:
            raise ValueError(f"size_limit={size_limit} must be in [1, 2**32) bytes (MDS offsets are u32), or None")
        self.out_dir, self.part = out_dir, part
        self.context_length, self.token_dtype = context_length, np.dtype(token_dtype)
        if self.token_dtype.name not in _TOKEN_DTYPES:
            raise ValueError(f"token dtype {self.token_dtype} is not one MDS holds ({', '.join(_TOKEN_DTYPES)})")
        self.size_limit = size_limit
        self.config = shard_config(context_length, self.token_dtype, size_limit)
        self._config_bytes = _config_bytes(self.config)
        self._pending: list[EncodedChunks] = []
        self._pending_bytes = self._empty_bytes = 8 + len(self._config_bytes)
        self._entries: list[dict[str, Any]] = []
        self._buffer: np.ndarray | None = None
        self._committer = committer

    def write(self, chunks: Chunks) -> None:
        """Append ``chunks`` (input_ids (n, C) of the token dtype) as the next samples."""
        if chunks.input_ids.shape[1:] != (self.context_length,) or chunks.input_ids.dtype != self.token_dtype:
            raise ValueError(f"chunks of shape {chunks.input_ids.shape} {chunks.input_ids.dtype}; this part writes "
                             f"(n, {self.context_length}) {self.token_dtype}")
        encoded = encode_chunks(chunks)
        costs = encoded.sizes() + 4
        start = 0
        while start < encoded.num_samples:
            take = self._room(costs[start:])
            if take == 0:
                self._flush()
                continue
            self._pending.append(encoded.rows(start, start + take))
            self._pending_bytes += int(costs[start: start + take].sum())
            start += take
            if start < encoded.num_samples:
                self._flush()

    def _room(self, costs: np.ndarray) -> int:
        """How many of the next samples (``costs``: bytes + 4 each) fit the open shard; an empty
        shard takes at least one. Without a size limit a shard still stops below 4 GiB (u32 offsets)."""
        limit = self.size_limit if self.size_limit is not None else (1 << 32) - 1
        fit = int(np.searchsorted(np.cumsum(costs) + self._pending_bytes, limit, side="right"))
        return max(fit, 1) if not self._pending else fit

    def _flush(self) -> None:
        if not self._pending:
            return
        name = shard_name(self.part, len(self._entries))
        sizes = np.concatenate([e.sizes() for e in self._pending])
        file = AtomicFile(self.out_dir, name, make_dirs=True)
        try:
            file.write(shard_head(sizes, self._config_bytes))
            for encoded in self._pending:
                for block in self._blocks(encoded):
                    file.write(memoryview(block))
        except BaseException:
            file.abort()
            raise
        if self._committer is None:
            _commit_or_abort(file)
        else:
            self._committer.submit(file)
        num_bytes = int(4 + 4 * (sizes.size + 1) + len(self._config_bytes) + sizes.sum())
        self._entries.append({"samples": int(sizes.size), "raw_data": {"basename": name, "bytes": num_bytes,
                                                                      "hashes": {}},
                              "zip_data": None, **self.config})
        self._pending, self._pending_bytes = [], self._empty_bytes

    def _blocks(self, encoded: EncodedChunks) -> Iterator[np.ndarray]:
        """``encoded``'s samples assembled in runs of at most WRITE_BLOCK_BYTES (at least one sample)."""
        ends = np.cumsum(encoded.sizes())
        start = 0
        while start < encoded.num_samples:
            base = int(ends[start - 1]) if start else 0
            stop = max(start + 1, int(np.searchsorted(ends, base + WRITE_BLOCK_BYTES, side="right")))
            need = int(ends[stop - 1]) - base
            if self._buffer is None or self._buffer.size < need:
                self._buffer = np.empty(max(need, WRITE_BLOCK_BYTES), np.uint8)
            yield _assemble(encoded.rows(start, stop), self._buffer)
            start = stop

    def close(self) -> list[dict[str, Any]]:
        """Write the last shard; the part's index entries in order (none for a part without chunks)."""
        self._flush()
        self._buffer = None
        return self._entries

    @property
    def shard_names(self) -> list[str]:
        """The shards written so far (published, or being published by the committer)."""
        return [e["raw_data"]["basename"] for e in self._entries]

    def abort(self) -> None:
        """Remove every shard this writer published (on error; with a committer, after it drained)."""
        self._pending = []
        remove_shards(self.out_dir, self.shard_names)
        self._entries = []


def remove_shards(out_dir: str, names: Iterable[str]) -> None:
    """Delete shard files ``names`` of ``out_dir``, ignoring those already gone."""
    fs, base = resolve_filesystem(out_dir)
    for name in names:
        try:
            fs.delete_file(posixpath.join(base, name))
        except FileNotFoundError:
            pass
        except OSError as e:  # keep the caller's error; an unlisted shard is never read
            log.warning("could not delete %s/%s: %s", base, name, e)


def write_part(out_dir: str, part: int, chunks: Iterable[Chunks], *, context_length: int,
               token_dtype: npt.DTypeLike, size_limit: int | None = DEFAULT_SIZE_LIMIT) -> list[dict[str, Any]]:
    """Write part ``part`` from ``chunks`` (in order); its index entries. Nothing stays on error."""
    writer = PartWriter(out_dir, part, context_length=context_length, token_dtype=token_dtype, size_limit=size_limit)
    try:
        for piece in chunks:
            writer.write(piece)
        return writer.close()
    except BaseException:
        writer.abort()
        raise


def write_index(out_dir: str, entries: list[dict[str, Any]]) -> str:
    """Write ``index.json`` (last: it makes the export a dataset) from every part's entries in part
    order; its path."""
    text = json.dumps({"shards": entries, "version": 2}, sort_keys=True)
    return write_whole(out_dir, INDEX_NAME, text.encode(), make_dirs=True)


# ----------------------------------------------------------------------------- reading back


def load_index(out_dir: str) -> list[dict[str, Any]]:
    """The shard entries of ``out_dir/index.json``, checked as untrusted input: a version 2 index,
    every entry an uncompressed MDS shard named ``shard.P.K.mds`` (one plain name inside the
    directory) with an int ``samples`` >= 1 and ``bytes``. InputError naming the entry otherwise."""
    fs, base = resolve_filesystem(out_dir)
    path = posixpath.join(base, INDEX_NAME)
    try:
        with fs.open_input_file(path) as f:
            index = json.loads(f.read())
    except FileNotFoundError as e:
        raise InputError(f"{out_dir} holds no {INDEX_NAME}: not a finished MDS export; export again") from e
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable JSON index ({error_text(e, 200)}); {_DAMAGED}") from e
    if not isinstance(index, dict) or index.get("version") != 2 or not isinstance(index.get("shards"), list):
        raise InputError(f"{path}: not an MDS index (version 2 with a shards list); {_DAMAGED}")
    for k, entry in enumerate(index["shards"]):
        _check_entry(entry, f"{path}: shards[{k}]")
    return index["shards"]


def _is_int(value: Any, minimum: int) -> bool:
    return type(value) is int and value >= minimum


def _check_entry(entry: Any, where: str) -> None:
    raw = entry.get("raw_data") if isinstance(entry, dict) else None
    if not isinstance(raw, dict) or entry.get("format") != "mds":
        raise InputError(f"{where}: not an MDS shard entry; {_DAMAGED}")
    if entry.get("zip_data") is not None or entry.get("compression") is not None:
        raise InputError(f"{where}: a compressed shard; raypack writes and checks uncompressed shards only")
    name = raw.get("basename")
    if not isinstance(name, str) or SHARD_NAME_RE.fullmatch(name) is None:
        raise InputError(f"{where}: basename {str(name)[:80]!r} is not shard.PPPPP.KKKKK.mds; {_DAMAGED}")
    if not _is_int(entry.get("samples"), 1) or not _is_int(raw.get("bytes"), 0):
        raise InputError(f"{where}: samples must be an int >= 1 and raw_data.bytes an int; {_DAMAGED}")


def _layout(entry: dict[str, Any], where: str) -> tuple[int, np.dtype]:
    """``(context_length, token dtype)`` from an entry whose config is exactly raypack's."""
    encoding = entry.get("column_encodings")
    match = re.fullmatch(r"ndarray:([a-z0-9]+):(\d+)", encoding[-1]) if isinstance(encoding, list) and encoding \
        and isinstance(encoding[-1], str) else None
    if match is None or match.group(1) not in _TOKEN_DTYPES or not 1 <= int(match.group(2)) <= 1 << 24:
        raise InputError(f"{where}: column_encodings {str(encoding)[:120]} are not raypack's; {_DAMAGED}")
    context_length, dtype = int(match.group(2)), np.dtype(match.group(1))
    expected = shard_config(context_length, dtype, entry.get("size_limit"))
    found = {key: entry.get(key) for key in expected}
    if found != expected:
        raise InputError(f"{where}: config {str(found)[:200]} is not raypack's {expected}; {_DAMAGED}")
    return context_length, dtype


def _gather(buf: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """(n, width) uint8: the ``width`` bytes at each of ``starts`` (bounds checked by the caller)."""
    return buf[starts[:, None] + np.arange(width)]


def _read_ndarrays(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, dtype: str,
                   where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode one dynamic-shape 1-D ndarray per sample at ``starts`` that must end at ``ends``;
    ``(lengths (n,), values (sum,) of dtype, value starts (n,))``."""
    if np.any(starts + 2 > ends):
        raise InputError(f"{where}: an ndarray field is cut short; {_DAMAGED}")
    code = buf[starts].astype(np.int64)
    width = 1 << (code & 3)
    if np.any(code >> 2 != 1) or np.any(starts + 1 + width > ends):
        raise InputError(f"{where}: an ndarray field is not 1-D or is cut short; {_DAMAGED}")
    shape_bytes = buf[np.minimum(starts[:, None] + 1 + np.arange(8), buf.size - 1)].astype(np.uint64)
    shape_bytes[np.arange(8) >= width[:, None]] = 0
    lengths = (shape_bytes << (np.arange(8, dtype=np.uint64) * np.uint64(8))).sum(axis=1)
    itemsize = np.dtype(dtype).itemsize
    value_starts = starts + 1 + width
    if np.any(lengths < 1) or np.any(lengths > (ends - value_starts) // itemsize) \
            or np.any(value_starts + itemsize * lengths.astype(np.int64) != ends):
        raise InputError(f"{where}: an ndarray field's shape does not match its size; {_DAMAGED}")
    lengths = lengths.astype(np.int64)
    owner = np.repeat(np.arange(starts.size), lengths)
    first = np.zeros(starts.size, np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    dest = value_starts[owner] + itemsize * (np.arange(int(lengths.sum())) - first[owner])
    values = _gather(buf, dest, itemsize).reshape(-1).view(dtype)
    return lengths, values, value_starts


def decode_shard(data: Any, entry: dict[str, Any], where: str) -> Chunks:
    """A shard's bytes (``data``, any buffer) as :class:`Chunks`, decoded independently of the
    writer from the format alone; ``entry`` is its checked index entry. Every field must lie
    inside its sample and every byte of the file belong to one (InputError naming ``where``).
    Cost: O(samples + segments) numpy plus one copy of the tokens."""
    context_length, dtype = _layout(entry, where)
    buf = np.frombuffer(data, np.uint8)
    n = entry["samples"]
    head_end = 4 + 4 * (n + 1)
    if buf.size < head_end or int(buf[:4].view("<u4")[0]) != n:
        raise InputError(f"{where}: does not start with samples={n}; {_DAMAGED}")
    offsets = buf[4:head_end].view("<u4").astype(np.int64)
    config = _config_bytes({key: entry[key] for key in shard_config(1, "int8", None)})
    if bytes(buf[head_end: offsets[0]]) != config or np.any(np.diff(offsets) < 0) or offsets[-1] != buf.size:
        raise InputError(f"{where}: its config or sample offsets do not match the index; {_DAMAGED}")
    starts, ends = offsets[:-1], offsets[1:]
    row = context_length * dtype.itemsize
    if np.any(ends - starts < _SAMPLE_HEAD + row):
        raise InputError(f"{where}: a sample is shorter than its tokens; {_DAMAGED}")
    sizes = _gather(buf, starts, _SAMPLE_HEAD).view("<u4").astype(np.int64)
    lens_start = starts + _SAMPLE_HEAD + sizes[:, 0]
    token_start = lens_start + sizes[:, 1]
    if np.any(token_start + row != ends):
        raise InputError(f"{where}: a sample's column sizes do not add up to its length; {_DAMAGED}")
    counts, doc_ids, _ = _read_ndarrays(buf, starts + _SAMPLE_HEAD, lens_start, "<i8", where)
    counts2, lengths, _ = _read_ndarrays(buf, lens_start, token_start, "<i4", where)
    if not np.array_equal(counts, counts2):
        raise InputError(f"{where}: a sample's segment_doc_ids and segment_lengths differ in length; {_DAMAGED}")
    windows = np.lib.stride_tricks.sliding_window_view(buf, row) if n else buf[:0].reshape(0, row)
    tokens = windows[token_start].view(dtype.newbyteorder("<")).astype(dtype, copy=False)
    segment_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=segment_offsets[1:])
    return Chunks(tokens.reshape(n, context_length), segment_offsets, doc_ids.astype(np.int64),
                  lengths.astype(np.int32))


def read_shard(out_dir: str, entry: dict[str, Any]) -> Any:
    """The bytes of shard ``entry`` of ``out_dir`` (memory-mapped when local), opened only as a plain
    file directly inside the directory whose size is the entry's ``raw_data.bytes``."""
    from raypack.manifest import _open_local, _open_remote

    fs, base = resolve_filesystem(out_dir)
    path = posixpath.join(base.rstrip("/"), entry["raw_data"]["basename"])
    source, size = _open_local(path) if isinstance(fs, pafs.LocalFileSystem) else _open_remote(fs, path)
    with source:
        if size != entry["raw_data"]["bytes"]:
            raise InputError(f"{path}: {size} bytes, index.json says {entry['raw_data']['bytes']}; {_DAMAGED}")
        return source.read_buffer()


# ----------------------------------------------------------------------------- the export


class MdsExport(NamedTuple):
    """What an export holds: ``num_samples`` samples (= chunks) of ``context_length`` tokens in
    ``num_shards`` shard files of ``num_bytes`` bytes in all (index.json not counted)."""

    path: str
    num_samples: int
    num_shards: int
    num_bytes: int
    context_length: int
    token_dtype: str

    @property
    def num_tokens(self) -> int:
        """Token positions exported (padding included): samples x C."""
        return self.num_samples * self.context_length


def _summary(out_dir: str, entries: list[dict[str, Any]], context_length: int, dtype: np.dtype) -> MdsExport:
    return MdsExport(out_dir, sum(e["samples"] for e in entries), len(entries),
                     sum(e["raw_data"]["bytes"] for e in entries), context_length, dtype.name)


def _part_chunks(ds: PackedDataset, item: dict[str, Any], dtype: np.dtype) -> Iterator[Chunks]:
    """The chunks of packed file ``item`` in order, one :class:`Chunks` view per record batch,
    tokens cast to ``dtype`` (InputError naming the file when one does not fit)."""
    first = item["first_chunk"]
    for piece in ds.pieces(first, first + item["num_chunks"]):
        if piece.input_ids.dtype != dtype:
            piece = piece._replace(input_ids=_cast(piece.input_ids, dtype, f"{ds.path}/{item['path']}"))
        yield piece


def _cast(tokens: np.ndarray, dtype: np.dtype, where: str) -> np.ndarray:
    info = np.iinfo(dtype)
    if tokens.size and (int(tokens.min()) < info.min or int(tokens.max()) > info.max):
        bad = int(tokens[(tokens < info.min) | (tokens > info.max)][0])
        raise InputError(f"{where}: token id {bad} does not fit {dtype.name} [{info.min}, {info.max}]; "
                         "pass a wider token dtype")
    return tokens.astype(dtype)


def _clear_previous(out_dir: str, overwrite: bool) -> None:
    """Refuse an ``out_dir`` holding an index (unless ``overwrite``: then remove it, then its shards)."""
    fs, base = resolve_filesystem(out_dir)
    index_path = posixpath.join(base, INDEX_NAME)
    if fs.get_file_info(index_path).type == pafs.FileType.NotFound:
        return
    if not overwrite:
        raise InputError(f"{out_dir} already holds an MDS export ({INDEX_NAME}); pass overwrite=True "
                         "(--overwrite) to replace it")
    names = [e["raw_data"]["basename"] for e in load_index(out_dir)]
    fs.delete_file(index_path)
    remove_shards(out_dir, names)


def export_mds(src_dir: str, out_dir: str, *, size_limit: int | None = DEFAULT_SIZE_LIMIT,
               token_dtype: npt.DTypeLike | None = None, overwrite: bool = False) -> MdsExport:
    """Export the packed output ``src_dir`` (any strategy) as an MDS dataset in ``out_dir``
    (local path or URI): sample i is chunk i. One part per chunk file of the output, written in
    order in this process (each shard's fsync on a :class:`Committer` thread, overlapping the
    next), then ``index.json``; on any error the shards written are removed and
    no index is written. ``token_dtype``: the tokens' dtype in the export (default: the
    output's; each id is checked to fit). Cost: one pass over the tokens, no copy but the write.
    """
    ds = read_packed(src_dir)
    dtype = np.dtype(token_dtype) if token_dtype is not None else ds.token_dtype
    (out_fs, out_base), (src_fs, src_base) = resolve_filesystem(out_dir), resolve_filesystem(src_dir)
    if out_fs.type_name == src_fs.type_name and out_base.rstrip("/") == src_base.rstrip("/"):
        raise InputError(f"{out_dir} is the packed output itself; give another directory for the export")
    _clear_previous(out_dir, overwrite)
    entries: list[dict[str, Any]] = []
    try:
        with Committer() as committer:
            for part in range(len(ds.file_items())):
                entries += export_part(ds, out_dir, part, token_dtype=dtype, size_limit=size_limit,
                                       committer=committer)
        write_index(out_dir, entries)
    except BaseException:  # the committer has drained: nothing is being published any more
        remove_shards(out_dir, [e["raw_data"]["basename"] for e in entries])
        raise
    finally:
        ds.close()
    return _summary(out_dir, entries, ds.context_length, dtype)


def export_part(ds: PackedDataset, out_dir: str, part: int, *, token_dtype: npt.DTypeLike | None = None,
                size_limit: int | None = DEFAULT_SIZE_LIMIT,
                committer: Committer | None = None) -> list[dict[str, Any]]:
    """Write part ``part`` of the export of ``ds`` (its chunk file ``ds.file_items()[part]``) into
    ``out_dir``; its index entries, for :func:`write_index` in part order. Parts are independent:
    a task elsewhere opens ``read_packed(src)`` and writes its parts. On error the part's
    published shards are removed (after ``committer`` has drained). With a committer, the last
    shards may still be being published on return: ``committer.wait()`` before the index."""
    dtype = np.dtype(token_dtype) if token_dtype is not None else ds.token_dtype
    writer = PartWriter(out_dir, part, context_length=ds.context_length, token_dtype=dtype,
                        size_limit=size_limit, committer=committer)
    try:
        for chunks in _part_chunks(ds, ds.file_items()[part], dtype):
            writer.write(chunks)
        return writer.close()
    except BaseException:
        if committer is not None:
            committer.drain()
        writer.abort()
        raise


def verify_mds(out_dir: str, src_dir: str) -> MdsExport:
    """Check the MDS export ``out_dir`` against the packed output ``src_dir``: its index, then every
    shard decoded by :func:`decode_shard` (not the writer's code) and compared with the source's
    chunks in order (tokens by value, segment doc ids, lengths), and the sample count. Raises
    InputError naming the shard and the first differing sample; returns what was checked.
    Cost: every shard read once, one shard in memory at a time."""
    entries = load_index(out_dir)
    ds = read_packed(src_dir)
    chunk = 0
    try:
        for entry in entries:
            where = f"{out_dir}/{entry['raw_data']['basename']}"
            found = decode_shard(read_shard(out_dir, entry), entry, where)
            end = chunk + found.num_chunks
            if end > len(ds) or found.input_ids.shape[1] != ds.context_length:
                raise InputError(f"{where}: holds samples past the source's {len(ds)} chunks of "
                                 f"{ds.context_length} tokens; {_DAMAGED}")
            _compare(found, concat_chunks(list(ds.pieces(chunk, end)), ds.context_length, ds.token_dtype),
                     chunk, where)
            chunk = end
        if chunk != len(ds):
            raise InputError(f"{out_dir}: holds {chunk} samples, the source {src_dir} {len(ds)} chunks; {_DAMAGED}")
    finally:
        ds.close()
    context_length, dtype = _layout(entries[0], out_dir) if entries else (ds.context_length, ds.token_dtype)
    return _summary(out_dir, entries, context_length, dtype)


def _compare(found: Chunks, expected: Chunks, first_chunk: int, where: str) -> None:
    """InputError naming the first sample of ``found`` that differs from ``expected``."""
    expected_offsets = expected.segment_offsets - expected.segment_offsets[0]
    bad = ~np.all(found.input_ids == expected.input_ids, axis=1)
    if not np.array_equal(found.segment_offsets, expected_offsets):
        bad |= np.diff(found.segment_offsets) != np.diff(expected_offsets)
    elif not (np.array_equal(found.segment_doc_ids, expected.segment_doc_ids)
              and np.array_equal(found.segment_lengths, expected.segment_lengths)):
        seg_bad = (found.segment_doc_ids != expected.segment_doc_ids) | \
                  (found.segment_lengths != expected.segment_lengths)
        bad[np.searchsorted(found.segment_offsets, np.flatnonzero(seg_bad), side="right") - 1] = True
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{where}: sample {i} differs from chunk {first_chunk + i} of the source; {_DAMAGED}")
