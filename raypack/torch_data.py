"""Feeding packed output to a PyTorch training loop (the optional ``torch`` extra).

    pip install -e ".[torch]"     # from the raypack checkout

``raypack/__init__.py`` does not import this module; torch stays out of the core install.

Pieces (docs/TRAINING.md shows each in a loop):
  * :class:`PackedTorchDataset`: a map-style ``torch.utils.data.Dataset`` over
    :func:`raypack.read_packed`; item ``i`` is chunk ``i`` as numpy arrays.
  * :func:`collate_packed` / :func:`make_collate_fn`: a list of chunks -> one training batch;
    :func:`build_batch` does the same from (B, L) arrays.
  * :func:`iter_ray_batches`: the streaming path, batches from a ``ray.data.Dataset`` of
    chunks with the attention information built per batch, in the consuming process.
  * :func:`build_block_mask` / :func:`document_mask_mod`: the FlexAttention form
    (raypack.training.flex; re-exported).
  * :class:`GlobalBatchSampler` (raypack.training, torch-free; re-exported): a DataLoader
    ``batch_sampler`` whose global batches survive a restart with another world size.

A batch (``B`` chunks of ``L`` positions) is a dict of CPU tensors:

  ``input_ids``     (B, L) int64    the tokens.
  ``doc_ids``       (B, L) int64    global document id per position, -1 on padding.
  ``labels``        (B, L) int64    ``input_ids`` with -100 where ``doc_ids == -1``. With side
                                    columns (``--extra-columns``): the chunks' ``labels``
                                    column when there is one, else ``input_ids``; and -100
                                    wherever a ``loss_mask`` column is 0. The model
                                    shifts (logits[:, i] is scored against labels[:, i + 1]),
                                    as Hugging Face causal LMs do. With
                                    ``mask_boundary_labels=True`` the first token of every
                                    segment that starts after another document in the row is
                                    also -100, so no position learns to predict the next
                                    document's first token (the usual packing caveat).
  ``position_ids``  (B, L) int64    0 at the start of every segment, +1 per position
                                    (``raypack.rules.masks.position_ids``). A document continuing
                                    from the previous chunk restarts at 0 in the new chunk,
                                    which matches what its mask lets it see.
  ``source``        (B,) int64      a mix's chunks only (raypack.mix.dataset): the index of the
                                    output each chunk was drawn from, e.g. for a loss per source.

plus the attention information, in the form asked for (``attention=``):

  ``"additive"``  ``attention_mask`` (B, L, L) float (default float32): 0.0 allowed, -inf
                  elsewhere; ``raypack.rules.masks.build_intra_document_mask``. O(L^2) per chunk.
  ``"bool"``      ``attention_mask`` (B, L, L) bool, True allowed; ``build_bool_mask``. O(L^2).
  ``"varlen"``    ``cu_seqlens`` (S + 1,) int32 over the flattened (B * L,) batch,
                  ``max_seqlen`` (int) and ``num_segments`` (int, S), flash-attn style;
                  ``raypack.rules.masks.cu_seqlens``. O(L). With ``max_segments=N`` the shape is
                  fixed: ``cu_seqlens`` is (N + 1,), the S real boundaries then zero-length
                  segments (the last offset repeated), and ``max_seqlen`` is L; a batch with
                  S > N raises ValueError (segments are never merged).
  ``"flex"``      ``block_mask``: a FlexAttention ``BlockMask`` (B, 1, L, L) whose mask_mod is
                  the rule over ``doc_ids`` (:func:`build_block_mask`). O(L + L^2 / block^2).

All four follow the one mask rule of :mod:`raypack.rules.masks` (j <= i, same doc id, not padding);
tests/test_torch_data.py checks each against it with real kernels. Padding rows allow
nothing: see ``padding_attends_self`` in :func:`build_batch` and docs/TRAINING.md.

``pad_to_multiple_of=M`` (every form) first pads each row to the next multiple of M with
``pad_token`` and doc id -1, so L divides evenly for context or tensor parallel layouts; the
added positions are padding like any other (label -100, masked by every form), and the real
positions' outputs do not change.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import numpy.typing as npt

from raypack.errors import install_extra

try:
    import torch
    from torch.nn.attention.flex_attention import BlockMask
except ImportError as e:  # the optional extra
    raise ImportError(f"raypack.torch_data needs PyTorch ({e}): {install_extra('torch')}") from e

from raypack.mix.dataset import MixedDataset
from raypack.outputs import read_packed
from raypack.packed.reader import PackedDataset
from raypack.rules.masks import (
    PAD_ID,
    build_bool_mask,
    build_intra_document_mask,
    cu_seqlens,
    pad_cu_seqlens,
    position_ids,
)
from raypack.training.flex import (
    DEFAULT_BLOCK_SIZE,
    as_doc_ids,
    block_mask_to,
    build_block_mask,
    check_block_size,
    document_mask_mod,
)
from raypack.training.sampler import GlobalBatchSampler

__all__ = [
    "ATTENTION_FORMS",
    "GlobalBatchSampler",
    "IGNORE_INDEX",
    "PackedTorchDataset",
    "build_batch",
    "block_mask_to",
    "build_block_mask",
    "collate_packed",
    "document_mask_mod",
    "iter_ray_batches",
    "make_collate_fn",
    "to_device",
]

ATTENTION_FORMS = ("additive", "bool", "varlen", "flex")
IGNORE_INDEX = -100
"""Label of positions excluded from the loss (``torch.nn.functional.cross_entropy``'s default)."""

_NUMPY_MASK_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}
_MASK_DTYPES = (*_NUMPY_MASK_DTYPES, torch.bfloat16)


# ----------------------------------------------------------------------------- dataset


class PackedTorchDataset(torch.utils.data.Dataset):
    """Map-style dataset over a packed output directory (or an open :class:`PackedDataset`); a mix
    (raypack.mix.dataset) works the same, its items adding ``"source"``.

    ``ds[i]`` -> ``{"input_ids": (L,) token dtype, "doc_ids": (L,) int64}`` numpy arrays
    (read-only views of the memory-mapped file where possible; :func:`collate_packed` copies
    them into the batch). Use it with ``collate_fn=make_collate_fn(attention)``. Pickles
    without its open files, so DataLoader workers (fork or spawn) reopen them.
    """

    def __init__(self, source: str | PackedDataset | MixedDataset) -> None:
        self.packed = source if isinstance(source, (PackedDataset, MixedDataset)) else read_packed(source)

    @property
    def context_length(self) -> int:
        return self.packed.context_length

    @property
    def pad_token(self) -> int:
        return self.packed.pad_token

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.packed[index]

    def __repr__(self) -> str:
        return f"PackedTorchDataset({self.packed!r})"


# ----------------------------------------------------------------------------- batches


def collate_packed(samples: Iterable[Mapping[str, Any]], attention: str = "additive", **options: Any) -> dict[str, Any]:
    """Stack chunks into one batch: see the module docstring for the keys.

    samples: chunks with ``input_ids`` (L,) and either dense ``doc_ids`` (L,) (what
             :class:`PackedTorchDataset` gives) or ``segment_doc_ids`` + ``segment_lengths``
             (a row of the chunk files, e.g. from Hugging Face ``datasets``; or an MDS export's
             sample, whose ``tokens`` stand for ``input_ids``: docs/MDS.md). numpy arrays,
             tensors or lists.
    attention, options: as :func:`build_batch`.
    """
    samples = list(samples)
    if not samples:
        raise ValueError("collate_packed got no samples; a batch needs at least one chunk")
    input_ids = np.stack([np.asarray(s["input_ids"] if "input_ids" in s else _mds_tokens(s)) for s in samples])
    doc_ids = np.stack([_dense_doc_ids(s) for s in samples])
    sides = {name: np.stack([np.asarray(s[name]) for s in samples]) for name in _LOSS_COLUMNS if name in samples[0]}
    batch = build_batch(input_ids, doc_ids, attention, **sides, **options)
    if "source" in samples[0]:  # a mix's items
        batch["source"] = _sources([s["source"] for s in samples])
    return batch


def make_collate_fn(attention: str = "additive", **options: Any) -> Callable[[list], dict[str, Any]]:
    """``collate_packed`` with its options bound, checked now; picklable for DataLoader workers."""
    _check_options(attention, **options)
    return functools.partial(collate_packed, attention=attention, **options)


def build_batch(
    input_ids: npt.ArrayLike,
    doc_ids: npt.ArrayLike,
    attention: str = "additive",
    *,
    mask_dtype: torch.dtype = torch.float32,
    mask_boundary_labels: bool = False,
    padding_attends_self: bool = False,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_segments: int | None = None,
    pad_to_multiple_of: int = 1,
    pad_token: int = 0,
    labels: npt.ArrayLike | None = None,
    loss_mask: npt.ArrayLike | None = None,
) -> dict[str, Any]:
    """One training batch from (B, L) tokens and doc ids (-1 on padding).

    attention:            "additive", "bool", "varlen" or "flex" (module docstring).
    mask_dtype:           float dtype of the additive mask: torch.float16/32/64 or bfloat16
                          (built as float32, then cast).
    mask_boundary_labels: also set labels to -100 on the first token of each segment that
                          starts inside the row after another document.
    padding_attends_self: dense forms only: allow padding row i to attend to itself
                          (``mask[b, i, i]`` = 0.0 / True), so even a hand-written
                          ``softmax(scores + mask)`` has no all-masked row (NaN). Real rows
                          are unchanged; padding is -100 in ``labels`` either way.
    block_size:           FlexAttention sparse block size ("flex" only).
    max_segments:         "varlen" only: fixed segment count N; ``cu_seqlens`` is (N + 1,)
                          and ``max_seqlen`` is L. ValueError if the batch has more segments
                          (padding runs count); raise N or use a smaller batch.
    pad_to_multiple_of:   pad each row with ``pad_token`` and doc id -1 up to a multiple of
                          this length (1: no padding). O(B * L) copy.
    pad_token:            token id on the added positions (pass the dataset's ``pad_token``).
    labels, loss_mask:    (B, L) side columns of the chunks (``--extra-columns``), if any: the
                          labels start from ``labels`` instead of ``input_ids``, and are -100
                          wherever ``loss_mask`` is 0 (and on padding, always).
    Returns: a dict of CPU tensors (``max_seqlen`` and ``num_segments`` are ints,
    ``block_mask`` a BlockMask).
    """
    _check_options(attention, mask_dtype=mask_dtype, block_size=block_size, max_segments=max_segments,
                   pad_to_multiple_of=pad_to_multiple_of, pad_token=pad_token)
    tokens, docs = _as_batch(input_ids, doc_ids)
    targets, keep = _loss_columns(labels, loss_mask, docs.shape)
    targets = tokens if targets is None else targets
    tokens, docs, targets, keep = _pad_rows(tokens, docs, pad_to_multiple_of, pad_token, targets, keep)
    batch = {
        "input_ids": torch.from_numpy(tokens.astype(np.int64)),
        "doc_ids": torch.from_numpy(docs),
        "labels": torch.from_numpy(_labels(targets, docs, mask_boundary_labels=mask_boundary_labels, keep=keep)),
        "position_ids": torch.from_numpy(position_ids(docs)),
    }
    if attention in ("additive", "bool"):
        batch["attention_mask"] = _dense_mask(docs, attention, mask_dtype, padding_attends_self)
    elif attention == "varlen":
        batch.update(_varlen(docs, max_segments))
    else:
        batch["block_mask"] = build_block_mask(docs, block_size=block_size)
    return batch


def _sources(sources: npt.ArrayLike) -> torch.Tensor:
    """(B,) int64 tensor of a mix's source indices, one per chunk."""
    return torch.from_numpy(np.array(sources, dtype=np.int64).reshape(-1))


_LOSS_COLUMNS = ("labels", "loss_mask")
"""Side columns the collate uses (build_batch's ``labels`` and ``loss_mask``)."""


def _loss_columns(labels: npt.ArrayLike | None, loss_mask: npt.ArrayLike | None,
                  shape: tuple[int, ...]) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``labels`` as (B, L) int64 and ``loss_mask != 0`` as (B, L) bool (None when not given), checked."""
    out = []
    for name, values in (("labels", labels), ("loss_mask", loss_mask)):
        if values is None:
            out.append(None)
            continue
        array = np.asarray(values)
        if array.shape != shape or array.dtype.kind not in "iub":
            raise ValueError(f"{name} has shape {array.shape} and dtype {array.dtype}; it must be {shape} integers "
                             "or bools, like input_ids")
        out.append(array.astype(np.int64) if name == "labels" else array != 0)
    return out[0], out[1]


def _pad_rows(tokens: np.ndarray, docs: np.ndarray, multiple: int, pad_token: int, targets: np.ndarray,
              keep: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(B, L') tokens, doc ids, label sources and loss mask, L' the next multiple of ``multiple``:
    pad_token / -1 / pad_token / False added."""
    pad = (0, -docs.shape[1] % multiple)
    if pad[1] == 0:
        return tokens, docs, targets, keep
    tokens = np.pad(tokens.astype(np.int64), ((0, 0), pad), constant_values=pad_token)
    targets = np.pad(targets.astype(np.int64), ((0, 0), pad), constant_values=pad_token)
    keep = None if keep is None else np.pad(keep, ((0, 0), pad), constant_values=False)
    return tokens, np.pad(docs, ((0, 0), pad), constant_values=PAD_ID), targets, keep


def _varlen(docs: np.ndarray, max_segments: int | None) -> dict[str, Any]:
    """``cu_seqlens``, ``max_seqlen``, ``num_segments``; fixed shapes if ``max_segments`` is set."""
    info = cu_seqlens(docs)
    num_segments = info.cu_seqlens.size - 1
    if max_segments is None:
        return {"cu_seqlens": torch.from_numpy(info.cu_seqlens), "max_seqlen": info.max_seqlen,
                "num_segments": num_segments}
    return {"cu_seqlens": torch.from_numpy(pad_cu_seqlens(info.cu_seqlens, max_segments)),
            "max_seqlen": docs.shape[1], "num_segments": num_segments}


def _labels(input_ids: np.ndarray, doc_ids: np.ndarray, *, mask_boundary_labels: bool = False,
            keep: np.ndarray | None = None) -> np.ndarray:
    """(B, L) int64: ``input_ids`` (or the labels column), -100 on padding, where ``keep`` is
    False, and on in-row document starts if asked."""
    labels = input_ids.astype(np.int64)
    ignored = doc_ids == PAD_ID
    if keep is not None:
        ignored |= ~keep
    if mask_boundary_labels:
        ignored[:, 1:] |= doc_ids[:, 1:] != doc_ids[:, :-1]
    labels[ignored] = IGNORE_INDEX
    return labels


def _dense_mask(docs: np.ndarray, attention: str, mask_dtype: torch.dtype, padding_attends_self: bool) -> torch.Tensor:
    """(B, L, L) additive or boolean mask of the rule, as a tensor sharing the numpy buffer."""
    if attention == "bool":
        mask, allow = torch.from_numpy(build_bool_mask(docs)), True
    else:
        np_dtype = _NUMPY_MASK_DTYPES.get(mask_dtype, np.float32)
        mask, allow = torch.from_numpy(build_intra_document_mask(docs, dtype=np_dtype)), 0.0
        mask = mask.to(mask_dtype)
    if padding_attends_self:
        rows, cols = torch.from_numpy(docs == PAD_ID).nonzero(as_tuple=True)
        mask[rows, cols, cols] = allow
    return mask


def _mds_tokens(sample: Mapping[str, Any]) -> np.ndarray:
    """An MDS sample's tokens (``raypack export --format mds`` names the column ``tokens``), as int64."""
    if "tokens" not in sample:
        raise ValueError(f"a sample has keys {sorted(sample)}; it needs input_ids (or an MDS sample's tokens)")
    return np.asarray(sample["tokens"]).astype(np.int64, copy=False)


def _dense_doc_ids(sample: Mapping[str, Any]) -> np.ndarray:
    """(L,) doc ids of one chunk given densely or as segments."""
    if "doc_ids" in sample:
        return np.asarray(sample["doc_ids"])
    try:
        return np.repeat(np.asarray(sample["segment_doc_ids"], dtype=np.int64),
                         np.asarray(sample["segment_lengths"], dtype=np.int64))
    except KeyError as e:
        raise ValueError(
            f"a sample has keys {sorted(sample)}; it needs input_ids and either doc_ids or "
            "segment_doc_ids + segment_lengths (a PackedTorchDataset item or a chunk-file row)"
        ) from e


def _as_batch(input_ids: npt.ArrayLike, doc_ids: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(B, L) integer tokens and (B, L) int64 doc ids, or raise."""
    tokens, docs = np.asarray(input_ids), as_doc_ids(doc_ids)
    if tokens.shape != docs.shape:
        raise ValueError(f"input_ids has shape {tokens.shape} and doc_ids {docs.shape}; they must match")
    if tokens.dtype.kind not in "iu":
        raise TypeError(f"input_ids has dtype {tokens.dtype}; it must be an integer dtype")
    return tokens, docs


def _check_options(attention: str, *, mask_dtype: torch.dtype = torch.float32, block_size: int = DEFAULT_BLOCK_SIZE,
                   max_segments: int | None = None, pad_to_multiple_of: int = 1, pad_token: int = 0,
                   **others: Any) -> None:
    """Raise for an unknown form, option or value (so make_collate_fn fails at once, not in a worker)."""
    if attention not in ATTENTION_FORMS:
        raise ValueError(f"attention={attention!r} is not a form raypack builds; "
                         f"use one of {', '.join(ATTENTION_FORMS)}")
    unknown = sorted(set(others) - {"mask_boundary_labels", "padding_attends_self"})
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; build_batch takes mask_dtype, "
                        "mask_boundary_labels, padding_attends_self, block_size, max_segments, "
                        "pad_to_multiple_of and pad_token")
    if mask_dtype not in _MASK_DTYPES:
        raise TypeError(f"mask_dtype={mask_dtype!r} cannot hold an additive mask; use torch.float32, "
                        "float16, bfloat16 or float64")
    check_block_size(block_size)
    if max_segments is not None and (attention != "varlen" or not _is_int(max_segments, 1)):
        raise ValueError(f"max_segments={max_segments!r} with attention={attention!r}; it must be an integer "
                         ">= 1 and only applies to attention='varlen'")
    if not _is_int(pad_to_multiple_of, 1):
        raise ValueError(f"pad_to_multiple_of={pad_to_multiple_of!r} must be an integer >= 1 (1: no padding)")
    if not _is_int(pad_token, 0):
        raise ValueError(f"pad_token={pad_token!r} must be an integer token id >= 0")


def _is_int(value: Any, minimum: int) -> bool:
    """True for an int (numpy ints too, not bool) >= ``minimum``."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum


# ----------------------------------------------------------------------------- devices


def to_device(batch: Mapping[str, Any], device: torch.device | str, non_blocking: bool = False) -> dict[str, Any]:
    """A :func:`build_batch` dict with every tensor (and the BlockMask) moved to ``device``."""
    moved: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            moved[key] = value.to(device, non_blocking=non_blocking)
        elif isinstance(value, BlockMask):
            moved[key] = block_mask_to(value, device)
        else:
            moved[key] = value
    return moved


# ----------------------------------------------------------------------------- Ray streaming


def iter_ray_batches(
    source: Any,
    batch_size: int,
    attention: str = "additive",
    *,
    drop_last: bool = False,
    prefetch_batches: int = 1,
    **options: Any,
) -> Iterator[dict[str, Any]]:
    """Training batches streamed from Ray Data, the attention information built per batch.

    source:     a packed output directory (str), a :class:`PackedDataset`, a ``ray.data.Dataset``
                from ``read_packed(path).to_ray_dataset()`` (columns ``input_ids``, ``doc_ids``,
                possibly after shuffling or splitting), or a ``ray.data.DataIterator`` (e.g.
                ``ray.train.get_dataset_shard("train")``).
    batch_size: chunks per batch; the last may be shorter unless ``drop_last``.
    attention, options: as :func:`build_batch`.
    Yields: :func:`build_batch` dicts. Only tokens and doc ids travel through the object
    store, O(L) per chunk; the masks are built here, in the consuming process, per batch,
    and never stored.
    """
    _check_options(attention, **options)
    batch_size = operator.index(batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    dataset = _ray_source(source)
    for table in dataset.iter_batches(batch_size=batch_size, batch_format="pyarrow",
                                      drop_last=drop_last, prefetch_batches=prefetch_batches):
        sides = {name: _matrix(table, name) for name in _LOSS_COLUMNS if name in table.column_names}
        batch = build_batch(_matrix(table, "input_ids"), _matrix(table, "doc_ids"), attention, **sides, **options)
        if "source" in table.column_names:  # a mix's rows
            batch["source"] = _sources(table.column("source").to_numpy())
        yield batch


def _ray_source(source: Any) -> Any:
    """Something with Ray's ``iter_batches``: the given dataset/iterator, or one read from a path."""
    if isinstance(source, str):
        source = read_packed(source)
    if isinstance(source, (PackedDataset, MixedDataset)):
        return source.to_ray_dataset()
    if not hasattr(source, "iter_batches"):
        raise TypeError(f"source is a {type(source).__name__}; give a packed directory, a PackedDataset, "
                        "a ray.data.Dataset from to_ray_dataset() or a ray.data.DataIterator")
    return source


def _matrix(table: Any, name: str) -> np.ndarray:
    """(n, C) numpy array of a fixed_size_list column of a pyarrow batch."""
    try:
        column = table.column(name).combine_chunks()
    except KeyError as e:
        raise ValueError(f"the Ray dataset has columns {table.column_names}; it needs input_ids and doc_ids "
                         "(read_packed(path).to_ray_dataset())") from e
    width = column.type.list_size
    return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), width)
