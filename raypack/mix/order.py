"""The training order of a mix: weighted shares, passes and a seeded shuffle, computed per index.

Pure integer arithmetic (Python ints and numpy uint64), no file I/O, no Ray, no ``np.random``:
the same seed gives the same order on any machine and any numpy version. A mix of K sources
(packed outputs of n_0 .. n_{K-1} chunks) with weights w_k, N items and seed S is fixed by
these rules (docs/MIX.md):

  1. Shares: source k is drawn m_k times, the largest-remainder apportionment of N by the
     weights: m_k = floor(N w_k / W) (W = sum of weights, exact rational arithmetic), then the
     N - sum(floors) leftover draws go one each to the sources with the largest fractional
     parts (ties: the lowest source index). :func:`apportion`.
  2. Passes: draw j of source k (0 <= j < m_k) is in pass p = j // n_k at rank r = j % n_k and
     reads chunk ``permute(r, n_k, key(S, k, p))``. A pass is a permutation of all n_k chunks,
     so floor(m_k / n_k) whole passes read every chunk once each; the last partial pass reads
     the first m_k mod n_k outputs of its permutation, distinct chunks.
  3. Interleave: the N draws are laid out as slots, source 0's draws in slots [0, m_0), source
     1's in [m_0, m_0 + m_1), ...; item i is slot ``permute(i, N, key(S))``. So the order is a
     seeded shuffle of all draws together: any window of items is a uniform sample of the
     mixture (each source's count is hypergeometric around its share), and repeated copies of
     a chunk land at independent random places, not pass after pass.

``permute(x, n, key)`` is the keyed bijection of [0, n) in :mod:`raypack.rules.permutation` (a
Feistel network with cycle walking, ROUNDS rounds; docs/MIX.md), its round keys splitmix64 hashes
of (seed, stream, r, 0 | 1), stream (0,) for the interleave and (1, k, p) for pass p of source k.
Cost per item: two permutations, O(ROUNDS) integer operations each, no state: item i depends on
the seed and i alone, so a trainer resumes at step k without reading the first k items, and the
index is 0 bytes per chunk.
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction
from typing import NamedTuple, Sequence

import numpy as np
import numpy.typing as npt

from raypack.rules.permutation import ROUNDS, num_bits, permute, permute_array, round_keys, walk

__all__ = ["ORDER_NAME", "ROUNDS", "Draws", "MixOrder", "apportion", "permute", "permute_array", "round_keys",
           "to_fraction"]

ORDER_NAME = "feistel4-v1"
"""The name of these rules, recorded in a mix's manifest; a reader refuses any other."""
_INTERLEAVE = 0
_PASS = 1


# ----------------------------------------------------------------------------- shares


def to_fraction(weight: float | int) -> Fraction:
    """A weight as an exact fraction of its shortest decimal form (0.1 -> 1/10), so a weight means
    the same from a flag, TOML or JSON."""
    return Fraction(repr(weight)) if isinstance(weight, float) else Fraction(weight)


def apportion(weights: Sequence[float | int], total: int) -> list[int]:
    """Largest-remainder shares of ``total`` by ``weights`` (positive, finite; any sum), exactly.

    Each share is floor(total * w / W), then the leftover units go one each to the largest
    fractional parts, ties to the lowest index. The shares sum to ``total``; O(K log K).
    """
    fractions = [to_fraction(w) for w in weights]
    whole = sum(fractions)
    quotas = [total * f / whole for f in fractions]
    shares = [math.floor(q) for q in quotas]
    leftover = total - sum(shares)
    by_remainder = sorted(range(len(quotas)), key=lambda k: (-(quotas[k] - shares[k]), k))
    for k in by_remainder[:leftover]:
        shares[k] += 1
    return shares


# ----------------------------------------------------------------------------- the order


class Draws(NamedTuple):
    """Where items come from: ``sources`` and ``chunks``, each (len,) int64."""

    sources: npt.NDArray[np.int64]
    chunks: npt.NDArray[np.int64]


class MixOrder:
    """The order of a mix (module docstring): item i -> (source k, chunk of source k).

    ``shares[k]`` draws from source k of ``source_chunks[k]`` chunks; ``len == sum(shares)``.
    Keeps only the shares and a cache of round keys: O(K) memory whatever N is.
    """

    def __init__(self, seed: int, shares: Sequence[int], source_chunks: Sequence[int]) -> None:
        self.seed = int(seed)
        self.shares = tuple(int(m) for m in shares)
        self.source_chunks = tuple(int(n) for n in source_chunks)
        for m, n in zip(self.shares, self.source_chunks):
            if m > 0 and n < 1:
                raise ValueError(f"a source of {n} chunks cannot be drawn {m} times")
        self.num_items = sum(self.shares)
        self.slot_ends = np.cumsum(np.array(self.shares, dtype=np.int64))
        self._slot_starts = [int(e) - m for e, m in zip(self.slot_ends, self.shares)]
        self._ends = self.slot_ends.tolist()
        self._interleave_keys = round_keys(self.seed, (_INTERLEAVE,))
        self._bits = num_bits(self.num_items)
        self._source_bits = [num_bits(n) for n in self.source_chunks]
        self._pass_keys: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}

    def __len__(self) -> int:
        return self.num_items

    def passes(self, k: int) -> tuple[int, int]:
        """(whole passes, chunks of the last partial pass) of source ``k``."""
        m, n = self.shares[k], self.source_chunks[k]
        return divmod(m, n) if n else (0, 0)

    def pass_keys(self, k: int, p: int) -> tuple[tuple[int, int], ...]:
        keys = self._pass_keys.get((k, p))
        if keys is None:
            keys = self._pass_keys[(k, p)] = round_keys(self.seed, (_PASS, k, p))
        return keys

    def draw_chunk(self, k: int, j: int) -> int:
        """The chunk of source ``k`` read by its draw ``j`` (rule 2)."""
        p, r = divmod(j, self.source_chunks[k])
        keys = self._pass_keys.get((k, p)) or self.pass_keys(k, p)
        return walk(r, self.source_chunks[k], self._source_bits[k], keys)

    def locate(self, i: int) -> tuple[int, int]:
        """Item ``i`` (0 <= i < len) as (source, chunk of that source). Scalar: a few µs."""
        slot = walk(i, self.num_items, self._bits, self._interleave_keys)
        k = bisect.bisect_right(self._ends, slot)
        return k, self.draw_chunk(k, slot - self._slot_starts[k])

    def locate_array(self, items: npt.ArrayLike) -> Draws:
        """:meth:`locate` of every item in ``items``; vectorised, grouped per (source, pass)."""
        slots = permute_array(items, self.num_items, self._interleave_keys)
        sources = np.searchsorted(self.slot_ends, slots, side="right").astype(np.int64)
        draws = slots - (self.slot_ends - np.array(self.shares, np.int64))[sources]
        chunks = np.empty_like(draws)
        for k in np.unique(sources).tolist():
            mine = sources == k
            n = self.source_chunks[k]
            passes, ranks = np.divmod(draws[mine], n)
            found = np.empty_like(ranks)
            for p in np.unique(passes).tolist():
                in_pass = passes == p
                found[in_pass] = permute_array(ranks[in_pass], n, self.pass_keys(k, p))
            chunks[mine] = found
        return Draws(sources, chunks)
