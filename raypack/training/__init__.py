"""Feeding a training loop on many ranks, torch-free: :class:`GlobalBatchSampler` (sampler.py)
wraps the pure order of :mod:`raypack.rules.global_batches`. ``raypack.torch_data`` re-exports it."""

from raypack.training.sampler import GlobalBatchSampler

__all__ = ["GlobalBatchSampler"]
