"""A keyed bijection of [0, n), computed per index: the shuffle of a mix and of a training order.

Pure integer arithmetic (Python ints and numpy uint64), no file I/O, no ``np.random``: the same
key gives the same permutation on any machine and any numpy version, and position x alone gives
``permute(x, n, keys)``, so nothing of size n is ever stored.

``permute(x, n, keys)`` is a Feistel network on the k-bit integers, 2**(k-1) < n <= 2**k
(k >= 1), with halves of floor(k/2) and ceil(k/2) bits that swap widths every round, ROUNDS
rounds; round r turns (L, R) into (R, L xor F_r(R)) with F_r(R) the top |L| bits of
(a_r R + b_r) mod 2**64 (multiply-add-shift hashing, a_r odd). Values >= n walk the cycle (apply
the network again) until they land in [0, n), which keeps it a bijection of [0, n) and takes
fewer than 2 steps on average (2**k < 2n). The round keys (a_r, b_r) are splitmix64 hashes of
(seed, *stream, r, 0) (made odd) and (seed, *stream, r, 1) (:func:`round_keys`): one seed gives
independent permutations for different streams. Cost: O(ROUNDS) integer operations per index
and walking step.

Users: raypack.mix.order (streams (0,) and (1, k, p)) and raypack.rules.global_batches (stream
(2, epoch)). The bits are pinned by tests/mix/test_mix.py (a mix records them as "feistel4-v1").
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["MASK64", "ROUNDS", "num_bits", "permute", "permute_array", "round_keys", "walk"]

ROUNDS = 4
"""Feistel rounds per permutation (Luby-Rackoff: 4 rounds of random functions make a strong
pseudo-random permutation; these rounds are hashes: docs/MIX.md, "How random", measures it)."""
MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


# ----------------------------------------------------------------------------- hashing


def _mix64(z: int) -> int:
    """splitmix64's finaliser of a 64-bit integer."""
    z = ((z ^ (z >> 30)) * _MUL1) & MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & MASK64
    return z ^ (z >> 31)


def _hash_words(words: Sequence[int]) -> int:
    """A 64-bit hash of a sequence of non-negative integers below 2**64."""
    h = 0
    for word in words:
        h = _mix64(((h ^ word) + _GOLDEN) & MASK64)
    return h


def round_keys(seed: int, stream: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The ROUNDS round keys (a, b) of permutation ``stream`` under ``seed``: a odd, both 64-bit."""
    return tuple((_hash_words((seed, *stream, r, 0)) | 1, _hash_words((seed, *stream, r, 1))) for r in range(ROUNDS))


def num_bits(n: int) -> int:
    """k with 2**(k-1) < n <= 2**k (k >= 1): the width of the network over [0, n)."""
    return max(1, (n - 1).bit_length())


# ----------------------------------------------------------------------------- permutations


def _feistel(x: int, bits: int, keys: tuple[tuple[int, int], ...]) -> int:
    """One pass of the network over ``bits``-bit ``x``: per round (a, b), the right half R of
    ``lo`` bits and the left half L of ``hi`` bits become (R, L xor F(R)), F(R) = the top ``hi``
    bits of (a R + b) mod 2**64 (multiply-add-shift hashing)."""
    hi, lo = bits >> 1, bits - (bits >> 1)
    for a, b in keys:
        right = x & ((1 << lo) - 1)
        x = (right << hi) | ((x >> lo) ^ (((a * right + b) & MASK64) >> (64 - hi)))
        hi, lo = lo, hi
    return x


def permute(x: int, n: int, keys: tuple[tuple[int, int], ...]) -> int:
    """Position ``x`` of [0, n) under the keyed permutation (module docstring); scalar, ~µs."""
    return walk(x, n, num_bits(n), keys)


def walk(x: int, n: int, bits: int, keys: tuple[tuple[int, int], ...]) -> int:
    """:func:`permute` with ``bits`` = ``num_bits(n)`` given (the per-item hot path)."""
    if n <= 1:
        return 0
    x = _feistel(x, bits, keys)
    while x >= n:
        x = _feistel(x, bits, keys)
    return x


def _feistel_array(x: np.ndarray, bits: int, keys: tuple[tuple[int, int], ...]) -> np.ndarray:
    """:func:`_feistel` over a uint64 array (wrapping arithmetic, the same bits)."""
    hi, lo = bits >> 1, bits - (bits >> 1)
    for a, b in keys:
        right = x & np.uint64((1 << lo) - 1)
        left = x >> np.uint64(lo)
        if hi:  # a shift by 64 is undefined for uint64; F of a 0-bit half is 0
            left ^= (right * np.uint64(a) + np.uint64(b)) >> np.uint64(64 - hi)
        x = (right << np.uint64(hi)) | left
        hi, lo = lo, hi
    return x


def permute_array(xs: npt.ArrayLike, n: int, keys: tuple[tuple[int, int], ...]) -> npt.NDArray[np.int64]:
    """:func:`permute` of every element of ``xs`` (each in [0, n)); (len,) int64, equal to the
    scalar one element for element. Vectorised: O(ROUNDS * len) per cycle-walking step, and
    the steps continue only for the elements still outside [0, n)."""
    xs = np.asarray(xs, dtype=np.int64)
    if n <= 1:
        return np.zeros(xs.shape, np.int64)
    bits = num_bits(n)
    with np.errstate(over="ignore"):
        x = _feistel_array(xs.astype(np.uint64), bits, keys)
        out = x >= np.uint64(n)
        while out.any():
            x[out] = _feistel_array(x[out], bits, keys)
            out = x >= np.uint64(n)
    return x.astype(np.int64)
