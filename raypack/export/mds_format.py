"""The MosaicML streaming (MDS) format as raypack writes it: sample i is chunk i of a packed output.

Read by ``streaming.StreamingDataset(local=DIR)`` (mosaicml-streaming) and so by llm-foundry's
text dataloader (``StreamingTextDataset`` reads the ``tokens`` column; an ndarray sample is
used as it is, ``[:max_seq_len]``, cast to int64). This module is the format alone: encoding
chunks as samples, a shard's head, the index, and decoding them back (pure numpy). Writing an
export (parts, publishing, cleanup, ``raypack export --format mds``) is :mod:`raypack.export.mds`.

Columns of every sample (MDS keeps them sorted by name):

| column | MDS encoding | value |
|---|---|---|
| ``segment_doc_ids`` | ``ndarray:int64`` | the chunk's segments' global doc ids, ``-1`` for padding |
| ``segment_lengths`` | ``ndarray:int32`` | their lengths; they sum to C |
| ``tokens`` | ``ndarray:{token dtype}:{C}`` | the chunk's C tokens |

The segments are the packed format's (docs/FORMAT.md): maximal runs of one doc id, so the
dense per-position doc ids raypack's masks take are ``np.repeat(segment_doc_ids,
segment_lengths)`` (-1 on padding), from which a trainer builds the block-diagonal causal mask
(raypack.rules.masks). A chunk always has at least one segment, as an MDS ndarray must.

Bytes, exactly as mosaicml-streaming 0.13's ``MDSWriter`` writes them (proven in
tests/export/test_export_mds.py by writing the same samples with it): a shard file is
``[num_samples: u32][offsets: u32 x (num_samples + 1)][config JSON][samples]``, offsets
absolute in the file; a sample is ``[u32 size of segment_doc_ids][u32 size of
segment_lengths]`` then the three columns in name order; a dynamic-shape 1-D ndarray is
``[(1 << 2) | w][shape: 1 element of 2**w bytes, w the narrowest of u8/u16/u32/u64][values]``;
the static ``tokens`` is its values only. All little-endian. ``index.json`` is
``{"shards": [entry, ...], "version": 2}`` (sorted keys), written last: a directory without it
is not a dataset.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow.fs as pafs
from numpy.lib.stride_tricks import as_strided

from raypack.errors import InputError
from raypack.io.fs import error_text, resolve_filesystem
from raypack.packed.writer import write_whole
from raypack.rules.core import Chunks

INDEX_NAME = "index.json"
DEFAULT_SIZE_LIMIT = 1 << 26
"""Bytes per shard before a new one starts (MDSWriter's default, 64 MiB)."""
SHARD_NAME_RE = re.compile(r"^shard\.(\d{5,})\.(\d{5,})\.mds$")
COLUMNS = ("segment_doc_ids", "segment_lengths", "tokens")
TOKEN_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
"""Token dtypes an MDS ndarray column holds."""
_SAMPLE_HEAD = 8
"""Per sample: the u32 sizes of its two variable-size columns."""
DAMAGED = "the export is damaged or not this source's; export again"


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


def config_bytes(config: dict[str, Any]) -> bytes:
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


def assemble_samples(encoded: EncodedChunks, out: np.ndarray) -> np.ndarray:
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


# ----------------------------------------------------------------------------- the index


def write_index(out_dir: str, entries: list[dict[str, Any]]) -> str:
    """Write ``index.json`` (last: it makes the export a dataset) from every part's entries in part
    order; its path."""
    text = json.dumps({"shards": entries, "version": 2}, sort_keys=True)
    return write_whole(out_dir, INDEX_NAME, text.encode(), make_dirs=True)


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
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: arrays nested past Python's limit
        raise InputError(f"{path}: not a readable JSON index ({error_text(e, 200)}); {DAMAGED}") from e
    if not isinstance(index, dict) or index.get("version") != 2 or not isinstance(index.get("shards"), list):
        raise InputError(f"{path}: not an MDS index (version 2 with a shards list); {DAMAGED}")
    for k, entry in enumerate(index["shards"]):
        _check_entry(entry, f"{path}: shards[{k}]")
    return index["shards"]


def _is_int(value: Any, minimum: int) -> bool:
    return type(value) is int and value >= minimum


def _check_entry(entry: Any, where: str) -> None:
    raw = entry.get("raw_data") if isinstance(entry, dict) else None
    if not isinstance(raw, dict) or entry.get("format") != "mds":
        raise InputError(f"{where}: not an MDS shard entry; {DAMAGED}")
    if entry.get("zip_data") is not None or entry.get("compression") is not None:
        raise InputError(f"{where}: a compressed shard; raypack writes and checks uncompressed shards only")
    name = raw.get("basename")
    if not isinstance(name, str) or SHARD_NAME_RE.fullmatch(name) is None:
        raise InputError(f"{where}: basename {str(name)[:80]!r} is not shard.PPPPP.KKKKK.mds; {DAMAGED}")
    if not _is_int(entry.get("samples"), 1) or not _is_int(raw.get("bytes"), 0):
        raise InputError(f"{where}: samples must be an int >= 1 and raw_data.bytes an int; {DAMAGED}")


def entry_layout(entry: dict[str, Any], where: str) -> tuple[int, np.dtype]:
    """``(context_length, token dtype)`` from an entry whose config is exactly raypack's."""
    encoding = entry.get("column_encodings")
    match = re.fullmatch(r"ndarray:([a-z0-9]+):(\d+)", encoding[-1]) if isinstance(encoding, list) and encoding \
        and isinstance(encoding[-1], str) else None
    if match is None or match.group(1) not in TOKEN_DTYPES or not 1 <= int(match.group(2)) <= 1 << 24:
        raise InputError(f"{where}: column_encodings {str(encoding)[:120]} are not raypack's; {DAMAGED}")
    context_length, dtype = int(match.group(2)), np.dtype(match.group(1))
    expected = shard_config(context_length, dtype, entry.get("size_limit"))
    found = {key: entry.get(key) for key in expected}
    if found != expected:
        raise InputError(f"{where}: config {str(found)[:200]} is not raypack's {expected}; {DAMAGED}")
    return context_length, dtype


def _gather(buf: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """(n, width) uint8: the ``width`` bytes at each of ``starts`` (bounds checked by the caller)."""
    return buf[starts[:, None] + np.arange(width)]


def _read_ndarrays(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, dtype: str,
                   where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode one dynamic-shape 1-D ndarray per sample at ``starts`` that must end at ``ends``;
    ``(lengths (n,), values (sum,) of dtype, value starts (n,))``."""
    if np.any(starts + 2 > ends):
        raise InputError(f"{where}: an ndarray field is cut short; {DAMAGED}")
    code = buf[starts].astype(np.int64)
    width = 1 << (code & 3)
    if np.any(code >> 2 != 1) or np.any(starts + 1 + width > ends):
        raise InputError(f"{where}: an ndarray field is not 1-D or is cut short; {DAMAGED}")
    shape_bytes = buf[np.minimum(starts[:, None] + 1 + np.arange(8), buf.size - 1)].astype(np.uint64)
    shape_bytes[np.arange(8) >= width[:, None]] = 0
    lengths = (shape_bytes << (np.arange(8, dtype=np.uint64) * np.uint64(8))).sum(axis=1)
    itemsize = np.dtype(dtype).itemsize
    value_starts = starts + 1 + width
    if np.any(lengths < 1) or np.any(lengths > (ends - value_starts) // itemsize) \
            or np.any(value_starts + itemsize * lengths.astype(np.int64) != ends):
        raise InputError(f"{where}: an ndarray field's shape does not match its size; {DAMAGED}")
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
    context_length, dtype = entry_layout(entry, where)
    buf = np.frombuffer(data, np.uint8)
    n = entry["samples"]
    head_end = 4 + 4 * (n + 1)
    if buf.size < head_end or int(buf[:4].view("<u4")[0]) != n:
        raise InputError(f"{where}: does not start with samples={n}; {DAMAGED}")
    offsets = buf[4:head_end].view("<u4").astype(np.int64)
    config = config_bytes({key: entry[key] for key in shard_config(1, "int8", None)})
    if bytes(buf[head_end: offsets[0]]) != config or np.any(np.diff(offsets) < 0) or offsets[-1] != buf.size:
        raise InputError(f"{where}: its config or sample offsets do not match the index; {DAMAGED}")
    starts, ends = offsets[:-1], offsets[1:]
    row = context_length * dtype.itemsize
    if np.any(ends - starts < _SAMPLE_HEAD + row):
        raise InputError(f"{where}: a sample is shorter than its tokens; {DAMAGED}")
    sizes = _gather(buf, starts, _SAMPLE_HEAD).view("<u4").astype(np.int64)
    lens_start = starts + _SAMPLE_HEAD + sizes[:, 0]
    token_start = lens_start + sizes[:, 1]
    if np.any(token_start + row != ends):
        raise InputError(f"{where}: a sample's column sizes do not add up to its length; {DAMAGED}")
    counts, doc_ids, _ = _read_ndarrays(buf, starts + _SAMPLE_HEAD, lens_start, "<i8", where)
    counts2, lengths, _ = _read_ndarrays(buf, lens_start, token_start, "<i4", where)
    if not np.array_equal(counts, counts2):
        raise InputError(f"{where}: a sample's segment_doc_ids and segment_lengths differ in length; {DAMAGED}")
    windows = np.lib.stride_tricks.sliding_window_view(buf, row) if n else buf[:0].reshape(0, row)
    tokens = windows[token_start].view(dtype.newbyteorder("<")).astype(dtype, copy=False)
    segment_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=segment_offsets[1:])
    return Chunks(tokens.reshape(n, context_length), segment_offsets, doc_ids.astype(np.int64),
                  lengths.astype(np.int32))


def read_shard(out_dir: str, entry: dict[str, Any]) -> Any:
    """The bytes of shard ``entry`` of ``out_dir`` (memory-mapped when local), opened only as a plain
    file directly inside the directory whose size is the entry's ``raw_data.bytes``."""
    from raypack.io.untrusted import open_local_file, open_remote_file

    fs, base = resolve_filesystem(out_dir)
    path = posixpath.join(base.rstrip("/"), entry["raw_data"]["basename"])
    source, size = open_local_file(path) if isinstance(fs, pafs.LocalFileSystem) else open_remote_file(fs, path)
    with source:
        if size != entry["raw_data"]["bytes"]:
            raise InputError(f"{path}: {size} bytes, index.json says {entry['raw_data']['bytes']}; {DAMAGED}")
        return source.read_buffer()
