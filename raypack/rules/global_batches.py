"""An elastic training order: which items form global batch s of epoch e, and each rank's share.

Pure numpy, no state, no ``np.random``. For ``length`` items (chunks of a packed output or a
mix), a global batch of G items, a seed S:

  1. The epoch's order: position p of epoch e holds item ``permute(p, length, keys(S, e))``
     (:mod:`raypack.rules.permutation`, stream (2, e)): a keyed bijection of [0, length), a new
     one each epoch; with ``shuffle=False`` position p holds item p.
  2. Global batch s is positions [s G, (s + 1) G) of that order: a fixed set of G items that
     depends on (length, G, S, e, s) alone, never on the world size, the rank or the loader's
     workers. An epoch has ``length // G`` global batches (``drop_last``) or ``ceil(length / G)``,
     the last one then holding the m = length - s G < G left over.
  3. Rank r of W (W divides G) takes the contiguous slice [r G / W, (r + 1) G / W) of the batch.
     The last partial batch (``drop_last=False``) is split as evenly as it can be: with
     q, t = divmod(m, W), ranks r < t take q + 1 items and the others q, in rank order, so
     shares differ by at most one item; when m < W, ranks r >= m get none.

So the global batches of a run do not change when it restarts with another world size: a
state of (seed, epoch, step) and the length say where it stands. Cost per batch: a rank's
G / W items through the network, O(ROUNDS) integer operations each (a few µs per item at any
length: bench/bench_sampler.py); memory O(G / W).
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
import numpy.typing as npt

from raypack.rules.permutation import permute_array, round_keys

__all__ = ["EPOCH_STREAM", "GlobalBatches", "check_world"]

EPOCH_STREAM = 2
"""First word of the permutation stream of an epoch, (2, epoch): distinct from a mix's (0,) and (1, k, p)."""


def _count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (not a bool), or ValueError naming it."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")
    try:
        number = operator.index(value)
    except TypeError as e:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}") from e
    if number < minimum:
        raise ValueError(f"{name}={number} must be an integer >= {minimum}")
    return number


def check_world(global_batch_size: int, rank: Any, world_size: Any) -> tuple[int, int]:
    """(rank, world_size) checked against the global batch size: W >= 1 divides it, 0 <= rank < W."""
    world_size = _count("world_size", world_size, 1)
    rank = _count("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank={rank} is out of range for world_size={world_size}; ranks are 0..{world_size - 1}")
    if global_batch_size % world_size:
        raise ValueError(f"world_size={world_size} does not divide global_batch_size={global_batch_size}; use a "
                         f"world size that divides it (each rank takes global_batch_size / world_size items)")
    return rank, world_size


class GlobalBatches:
    """The order of the module docstring over ``length`` items; every method is a pure function of
    its arguments and the settings (it caches the last epoch's round keys only)."""

    def __init__(self, length: int, global_batch_size: int, *, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = True) -> None:
        self.length = _count("length", length, 0)
        self.global_batch_size = _count("global_batch_size", global_batch_size, 1)
        self.seed = _count("seed", seed, 0)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        if self.length < self.global_batch_size:
            raise ValueError(f"{self.length} items are fewer than one global batch of {self.global_batch_size}; "
                             "use a global_batch_size of at most the number of chunks")
        self.num_steps = (self.length // self.global_batch_size if self.drop_last
                          else -(-self.length // self.global_batch_size))
        """Global batches per epoch."""
        self._keys: tuple[int, tuple[tuple[int, int], ...]] | None = None

    def epoch_keys(self, epoch: int) -> tuple[tuple[int, int], ...]:
        """The round keys of epoch ``epoch``'s permutation (stream (EPOCH_STREAM, epoch))."""
        if self._keys is None or self._keys[0] != epoch:
            self._keys = (epoch, round_keys(self.seed, (EPOCH_STREAM, epoch)))
        return self._keys[1]

    def batch_bounds(self, step: int) -> tuple[int, int]:
        """Positions [start, end) of global batch ``step`` in its epoch's order."""
        self._check_step(step)
        start = step * self.global_batch_size
        return start, min(start + self.global_batch_size, self.length)

    def share_bounds(self, step: int, rank: int, world_size: int) -> tuple[int, int]:
        """Positions [start, end) of rank ``rank``'s share of global batch ``step`` (rule 3)."""
        rank, world_size = check_world(self.global_batch_size, rank, world_size)
        start, end = self.batch_bounds(step)
        base, extra = divmod(end - start, world_size)
        first = start + rank * base + min(rank, extra)
        return first, first + base + (rank < extra)

    def items(self, epoch: int, start: int, end: int) -> npt.NDArray[np.int64]:
        """(end - start,) int64: the items at positions [start, end) of epoch ``epoch``'s order."""
        _count("epoch", epoch, 0)
        positions = np.arange(start, end, dtype=np.int64)
        return permute_array(positions, self.length, self.epoch_keys(epoch)) if self.shuffle else positions

    def global_batch(self, epoch: int, step: int) -> npt.NDArray[np.int64]:
        """(G,) int64 (the last partial batch: (m,)): the items of global batch ``step`` of ``epoch``."""
        return self.items(epoch, *self.batch_bounds(step))

    def share(self, epoch: int, step: int, rank: int, world_size: int) -> npt.NDArray[np.int64]:
        """(G / W,) int64 (the last partial batch: rule 3): rank ``rank``'s items of global batch ``step``."""
        return self.items(epoch, *self.share_bounds(step, rank, world_size))

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step={step} is out of range; an epoch has {self.num_steps} global batches")
