"""The FlexAttention form of the mask rule (the optional ``torch`` extra): a ``BlockMask`` built from
per-block document ranges, never from the L x L pairs. ``raypack.torch_data`` re-exports it and builds a
batch's ``block_mask`` with it; ``raypack.training`` does not import it (torch-free)."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import numpy as np
import numpy.typing as npt

from raypack.errors import install_extra

try:
    import torch
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask
except ImportError as e:  # the optional extra
    raise ImportError(f"raypack.training.flex needs PyTorch ({e}): {install_extra('torch')}") from e

from raypack.rules.masks import PAD_ID, position_ids

__all__ = ["DEFAULT_BLOCK_SIZE", "as_doc_ids", "block_mask_to", "build_block_mask", "check_block_size",
           "document_mask_mod"]

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 128
"""FlexAttention's default sparse block size."""


def check_block_size(block_size: Any) -> None:
    """Raise for a block size that is not an integer >= 1 (numpy ints too, not bool)."""
    if not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be an integer >= 1 (FlexAttention's default is 128)")


def as_doc_ids(doc_ids: npt.ArrayLike) -> np.ndarray:
    """(B, L) int64 doc ids, or raise (the input rules of raypack.rules.masks, batches only)."""
    docs = np.asarray(doc_ids)
    if docs.ndim != 2:
        raise ValueError(f"doc_ids has shape {docs.shape}; it must be (B, L), one row per chunk")
    if docs.dtype.kind not in "iu":
        raise TypeError(f"doc_ids has dtype {docs.dtype}; it must be an integer dtype, -1 marking padding")
    docs = np.array(docs, dtype=np.int64)  # a copy: the batch's tensors never alias the caller's arrays
    if docs.size and docs.min() < PAD_ID:
        raise ValueError(f"doc_ids contains {docs.min()}; ids must be >= 0, or -1 for padding")
    return docs


def document_mask_mod(doc_ids: torch.Tensor) -> Callable[..., torch.Tensor]:
    """The module rule as a FlexAttention mask_mod over a (B, L') int64 ``doc_ids`` tensor.

    ``mask_mod(b, h, q_idx, kv_idx)`` is ``kv_idx <= q_idx & doc[b, q_idx] == doc[b, kv_idx]
    & doc[b, q_idx] != -1``. A ``functools.partial`` of a module function, so a BlockMask
    holding it pickles (DataLoader workers can return one).
    """
    return functools.partial(_document_mask, doc_ids)


def _document_mask(doc_ids: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor,
                   kv_idx: torch.Tensor) -> torch.Tensor:
    doc_q = doc_ids[b, q_idx]
    return (kv_idx <= q_idx) & (doc_q == doc_ids[b, kv_idx]) & (doc_q != PAD_ID)


def build_block_mask(doc_ids: npt.ArrayLike, block_size: int = DEFAULT_BLOCK_SIZE,
                     device: torch.device | str | None = None) -> BlockMask:
    """FlexAttention ``BlockMask`` (B, 1, L, L) of the module rule for (B, L) ``doc_ids``.

    Built from per-block document ranges, never evaluating the L x L pairs:
      1. Per position, the start of its segment: ``s = arange(L) - position_ids``. A real
         row i allows exactly the columns [s(i), i] when every doc id is one contiguous run
         per row (what packing produces); ``s`` is non-decreasing along the row.
      2. Per q block: the smallest and largest ``s`` of its real rows, and whether all its
         rows are real. O(L).
      3. Per (q block, kv block), with kv block [k0, k1): some pair allowed iff kb <= qb and
         min s < k1; every pair allowed (a "full" block, no mask_mod call in the kernel) iff
         all rows are real, the kv block is whole, max s <= k0 and k1 - 1 <= q block start.
         The rest of the non-empty blocks are "partial". O(B * (L / block)^2).
      4. Both index layouts FlexAttention keeps (per q block: its kv blocks; per kv block: its
         q blocks, for the backward pass), selected blocks first in ascending order, by a
         stable argsort of each (B, nQ, nKV) table and its transpose. O(B * (L / block)^2 *
         log(L / block)). Same tensors as ``create_block_mask`` (the tests compare them).
    The mask_mod is :func:`document_mask_mod`, evaluated by the kernel on partial blocks only.

    Ids that occur in two runs of one row (never produced by packing) fall back to
    ``create_block_mask``, which evaluates the mask_mod on all B * L * L pairs.
    device: where the BlockMask and its mask_mod's doc ids live (default: the CPU).
    """
    check_block_size(block_size)
    docs = as_doc_ids(doc_ids)
    num_rows, size = docs.shape
    if size == 0:
        raise ValueError("doc_ids has 0 positions per row; a BlockMask needs L >= 1")
    num_blocks = -(-size // block_size)
    padded = np.full((num_rows, num_blocks * block_size), PAD_ID, dtype=np.int64)
    padded[:, :size] = docs
    mask_mod = document_mask_mod(torch.from_numpy(padded).to(device))
    if not _runs_are_documents(docs):
        log.debug("doc ids are not one run per document; evaluating the mask_mod densely")
        return create_block_mask(mask_mod, num_rows, 1, size, size, device=device or "cpu", BLOCK_SIZE=block_size)
    partial, full = _document_blocks(docs, block_size)
    tables = {
        "kv_num_blocks": partial, "full_kv_num_blocks": full,
        "q_num_blocks": partial.swapaxes(1, 2), "full_q_num_blocks": full.swapaxes(1, 2),
    }
    tensors = {}
    for name, blocks in tables.items():
        counts, indices = _ordered_blocks(blocks)
        tensors[name], tensors[name.replace("num_blocks", "indices")] = counts.to(device), indices.to(device)
    return _make_block_mask(tensors, (size, size), block_size, mask_mod)


def _make_block_mask(tensors: dict[str, torch.Tensor], seq_lengths: tuple[int, int], block_size: int,
                     mask_mod: Callable) -> BlockMask:
    """A BlockMask from all eight index tensors.

    ``BlockMask.from_kv_blocks`` would derive the four q-side tensors itself, with a vmapped
    scatter costing ~7 ms per 8 x 4096 batch on a CPU against ~0.2 ms for the numpy argsort
    above; so the constructor is called, and ``from_kv_blocks`` only if its signature differs.
    """
    try:
        return BlockMask(seq_lengths=seq_lengths, BLOCK_SIZE=(block_size, block_size), mask_mod=mask_mod, **tensors)
    except TypeError:
        kv = [tensors[k] for k in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")]
        return BlockMask.from_kv_blocks(*kv, BLOCK_SIZE=block_size, mask_mod=mask_mod, seq_lengths=seq_lengths)


def block_mask_to(block_mask: BlockMask, device: torch.device | str) -> BlockMask:
    """``block_mask.to(device)``, with the doc ids of a :func:`document_mask_mod` moved too.

    ``BlockMask.to`` moves the index tensors but not tensors captured by the mask_mod, which
    the kernel then reads from the wrong device.
    """
    moved = block_mask.to(device)
    mask_mod = block_mask.mask_mod
    if isinstance(mask_mod, functools.partial) and mask_mod.func is _document_mask:
        moved.mask_mod = document_mask_mod(mask_mod.args[0].to(device))
    return moved


def _document_blocks(docs: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(B, nQ, nKV) bool partial and full blocks of the rule (steps 1-3 of build_block_mask)."""
    num_rows, size = docs.shape
    num_blocks = -(-size // block_size)
    real = docs != PAD_ID
    starts = np.arange(size, dtype=np.int64) - position_ids(docs)
    lowest, highest = _block_reduce(np.where(real, starts, size), size, np.min, block_size), \
        _block_reduce(np.where(real, starts, -1), -1, np.max, block_size)
    all_real = _block_reduce(real, False, np.all, block_size)
    block_starts = np.arange(num_blocks, dtype=np.int64) * block_size
    kv_ends = np.minimum(block_starts + block_size, size)
    q_first, kv_first, kv_last = block_starts[:, None], block_starts[None, :], kv_ends[None, :] - 1
    causal = kv_first <= q_first
    partial = causal & (lowest[:, :, None] <= kv_last)
    full = (all_real[:, :, None] & (kv_ends - block_starts == block_size)[None, :]
            & (highest[:, :, None] <= kv_first) & (kv_last <= q_first))
    return partial & ~full, full


def _block_reduce(values: np.ndarray, fill: Any, reduce: Callable, block_size: int) -> np.ndarray:
    """(B, L) -> (B, nQ): ``reduce`` over each block of ``block_size`` positions (tail filled)."""
    num_rows, size = values.shape
    num_blocks = -(-size // block_size)
    padded = np.full((num_rows, num_blocks * block_size), fill, dtype=values.dtype)
    padded[:, :size] = values
    return reduce(padded.reshape(num_rows, num_blocks, block_size), axis=-1)


def _ordered_blocks(blocks: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, nQ, nKV) bool -> (B, 1, nQ) int32 counts, (B, 1, nQ, nKV) int32 indices, selected
    blocks first in ascending order (the layout create_block_mask produces)."""
    counts = blocks.sum(axis=-1, dtype=np.int32)
    indices = np.argsort(~blocks, axis=-1, kind="stable").astype(np.int32)
    return torch.from_numpy(counts[:, None]), torch.from_numpy(indices[:, None])


def _runs_are_documents(docs: np.ndarray) -> bool:
    """True if, in every row, no real doc id occurs in two runs (packing's output always)."""
    starts = np.ones(docs.shape, dtype=bool)
    np.not_equal(docs[:, 1:], docs[:, :-1], out=starts[:, 1:])
    rows, cols = np.nonzero(starts & (docs != PAD_ID))
    ids = docs[rows, cols]
    same_row = rows[1:] == rows[:-1]
    if np.all(ids[1:][same_row] > ids[:-1][same_row]):
        return True
    return np.unique(np.stack([rows, ids]), axis=1).shape[1] == ids.size
