"""An elastic batch sampler: global batches that survive a restart with another world size.

``GlobalBatchSampler(source, global_batch_size=G, rank=r, world_size=W)`` yields rank r's share
(G / W chunk indices) of each global batch of the order in :mod:`raypack.rules.global_batches`:
global batch s of epoch e is a fixed set of G indices that depends on (length, G, seed, e, s)
alone. Use it as a DataLoader's ``batch_sampler`` (any ``num_workers``: the sampler runs in the
main process and the workers only read the indices it gives)::

    sampler = GlobalBatchSampler(out, global_batch_size=64, rank=rank, world_size=world_size)
    loader = DataLoader(PackedTorchDataset(out), batch_sampler=sampler, collate_fn=make_collate_fn("varlen"))

State (the torchdata ``StatefulDataLoader`` protocol, ``state_dict()`` / ``load_state_dict()``):
the rules' name, seed, epoch, step (global batches of the epoch already yielded), length, G,
shuffle, drop_last and the source's ``content_sha256``: a handful of JSON values, the same on every
rank. A state saved by W ranks loads into W' ranks (W' divides G) and the global batches go on at
step s exactly as an uninterrupted run's would. ``set_epoch(e)`` starts epoch e at step 0, as
``DistributedSampler``'s does; setting the epoch the sampler is already in keeps its step, so a
resumed loop that calls ``set_epoch`` at the top of each epoch does not restart the epoch (and an
epoch it names that is finished, a state saved after its last batch, yields nothing: the loop goes
on to the next). An iteration that starts on a finished epoch without ``set_epoch`` moves on to
the next epoch by itself (torchdata's rule for a state saved at an epoch's end).

Torch-free: it yields lists of ints, which is all a DataLoader asks of a batch sampler.
"""

from __future__ import annotations

import logging
import operator
import os
from typing import Any, Iterator

from raypack.errors import InputError
from raypack.io.untrusted import is_hex, show
from raypack.outputs import read_packed
from raypack.rules.global_batches import GlobalBatches, check_world

__all__ = ["ORDER_RULES", "GlobalBatchSampler"]

log = logging.getLogger(__name__)

ORDER_RULES = "global-batches-v1"
"""The name of the order's rules (raypack.rules.global_batches), kept in a state; another is refused."""
_STATE_KEYS = ("order", "seed", "epoch", "step", "length", "global_batch_size", "shuffle", "content_sha256")
_OPTIONAL_KEYS = ("drop_last",)
"""In a state since it decides the last global batch; a state saved before it was added loads as it did."""
_MAX_WORD = (1 << 64) - 1


def describe_source(source: Any) -> tuple[int, str | None]:
    """(length, content_sha256 or None) of a packed output or mix (a path, or as read_packed opens
    it), a dataset wrapping one (``.packed``, e.g. PackedTorchDataset), any sized dataset, or a length."""
    if isinstance(source, bool):
        raise TypeError("source=True/False is not a length; give a packed output, a mix, a dataset or a length")
    if isinstance(source, (str, os.PathLike)):
        source = read_packed(os.fspath(source))
    if not hasattr(source, "__len__"):
        try:
            return operator.index(source), None
        except TypeError as e:
            raise TypeError(f"source is a {type(source).__name__}; give a packed output (its path or read_packed's "
                            "dataset), a mix, a sized dataset or a length") from e
    inner = getattr(source, "packed", source)
    digest = getattr(inner, "content_sha256", None)
    return len(source), digest if isinstance(digest, str) else None


class GlobalBatchSampler:
    """Rank ``rank`` of ``world_size``'s share of each global batch (module docstring).

    source:            a packed output or a mix (its path, or what ``read_packed`` returns), a
                       ``PackedTorchDataset``, any dataset with ``len``, or a length.
    global_batch_size: G chunks per global batch, over all ranks; ``world_size`` must divide it.
    seed:              the order's key (0 <= seed < 2**64); each epoch has its own permutation.
    shuffle:           False: the plain order 0, 1, 2, ... (still split into the same global batches).
    drop_last:         True: ``length // G`` global batches per epoch. False: one more, the m
                       leftover items split as evenly as they can be (ranks r < m % W take
                       m // W + 1, the others m // W); a rank whose share is empty (m < W, r >= m)
                       yields nothing for that step, so its ``len`` is one less.
    Raises ValueError for a world size that does not divide G, a rank outside [0, W), and a
    source with fewer than G items.
    """

    def __init__(self, source: Any, *, global_batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = True) -> None:
        length, self.content_sha256 = describe_source(source)
        self.order = GlobalBatches(length, global_batch_size, seed=_word("seed", seed), shuffle=shuffle,
                                   drop_last=drop_last)
        self.rank, self.world_size = check_world(self.order.global_batch_size, rank, world_size)
        self.epoch = 0
        self.step = 0
        """Global batches of the current epoch yielded so far (the next one is ``step``)."""
        self._named_epoch: int | None = None
        """The epoch :meth:`set_epoch` named since the last iteration began: when the sampler is in it and
        it is finished, the iteration yields nothing instead of moving on (a loop resumed from a state saved
        after an epoch's last batch). Kept by :meth:`load_state_dict`: a loop may call ``set_epoch`` first."""

    # ------------------------------------------------------------------------- the order

    @property
    def num_steps(self) -> int:
        """Global batches per epoch (the same on every rank)."""
        return self.order.num_steps

    @property
    def local_batch_size(self) -> int:
        """This rank's items per full global batch: G / W."""
        return self.order.global_batch_size // self.world_size

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch."""
        last = self.order.num_steps - 1
        start, end = self.order.share_bounds(last, self.rank, self.world_size)
        return self.order.num_steps - (start == end)

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's shares of global batches ``step``, ``step + 1``, ... of the current epoch, each a
        list of chunk indices; the state moves as each one is yielded. When the current epoch is
        finished (``step == num_steps``), it first moves on to step 0 of the next epoch, so a loop
        that never calls :meth:`set_epoch` still gets a new permutation each epoch; an epoch that
        :meth:`set_epoch` named is not left this way (finished, it yields nothing)."""
        if self.step >= self.order.num_steps and self._named_epoch != self.epoch:
            self.epoch, self.step = self.epoch + 1, 0
        self._named_epoch = None
        epoch = self.epoch
        while self.step < self.order.num_steps:
            share = self.order.share(epoch, self.step, self.rank, self.world_size)
            self.step += 1
            if share.size:
                yield share.tolist()

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s permutation from its step 0; the current epoch keeps its step (finished,
        the next iteration yields nothing)."""
        epoch = _word("epoch", epoch)
        if epoch != self.epoch:
            self.epoch, self.step = epoch, 0
        self._named_epoch = epoch

    # ------------------------------------------------------------------------- state

    def state_dict(self, *, step: int | None = None) -> dict[str, Any]:
        """The order's state: JSON values, the same on every rank (module docstring).

        step: the global batches of the current epoch the training loop has consumed, when it is
              not what this sampler has yielded: a plain DataLoader's workers fetch batches ahead
              (``prefetch_factor`` x ``num_workers``), so its loop passes its own count.
              ``StatefulDataLoader`` keeps track itself and calls this without one.
        """
        if step is None:
            step = self.step
        elif isinstance(step, bool) or not hasattr(step, "__index__") or not 0 <= step <= self.order.num_steps:
            raise ValueError(f"step={step!r} must be an integer in 0..{self.order.num_steps}, the global batches "
                             "per epoch")
        return {"order": ORDER_RULES, "seed": self.order.seed, "epoch": self.epoch, "step": operator.index(step),
                "length": self.order.length, "global_batch_size": self.order.global_batch_size,
                "shuffle": self.order.shuffle, "drop_last": self.order.drop_last,
                "content_sha256": self.content_sha256}

    def load_state_dict(self, state: Any) -> None:
        """Go on where ``state`` (a :meth:`state_dict`, saved by any world size) stopped: its seed,
        epoch and step. InputError, one line, for a state of another output, length, global batch
        size, shuffle or drop_last, or a damaged one. A WARNING where one side has no digest to compare
        (a sampler over a length or a plain dataset), so the state's output cannot be checked."""
        fields = _checked_state(state)
        ours = self.state_dict()
        theirs, mine = fields["content_sha256"], self.content_sha256
        if theirs is not None and mine is not None and theirs != mine:
            raise InputError(f"sampler state is from another output (content_sha256 {theirs[:16]}..., this source "
                             f"{mine[:16]}...); load a state saved over this output")
        if (theirs is None) != (mine is None):
            log.warning("sampler state %s; it cannot be checked to be of this output: make sure it is (build both "
                        "samplers over the packed output, or its dataset, to have it checked)",
                        "has no content_sha256 (saved over a length or a plain dataset)" if theirs is None else
                        f"is of output {theirs[:16]}..., this sampler's source has no digest (a length or a plain "
                        "dataset)")
        for key, what in (("length", "chunks"), ("global_batch_size", "chunks per global batch"),
                          ("shuffle", "shuffle"), ("drop_last", "the last partial global batch")):
            if key in fields and fields[key] != ours[key]:
                raise InputError(f"sampler state has {key}={fields[key]!r} ({what}) but this sampler has "
                                 f"{ours[key]!r}; resume over the same output with the same {key}")
        order = self.order
        self.order = GlobalBatches(order.length, order.global_batch_size, seed=fields["seed"], shuffle=order.shuffle,
                                   drop_last=order.drop_last)
        if fields["step"] > self.order.num_steps:
            self.order = order
            raise InputError(f"sampler state has step={fields['step']}, past the epoch's {order.num_steps} global "
                             "batches; it is damaged" + ("" if "drop_last" in fields else
                                                         ", or was saved with another drop_last"))
        if fields["seed"] != order.seed:
            log.info("sampler state has seed %d; this sampler was made with %d and now follows the state",
                     fields["seed"], order.seed)
        self.epoch, self.step = fields["epoch"], fields["step"]

    def __repr__(self) -> str:
        return (f"GlobalBatchSampler(length={self.order.length}, global_batch_size={self.order.global_batch_size}, "
                f"rank={self.rank}, world_size={self.world_size}, seed={self.order.seed}, epoch={self.epoch}, "
                f"step={self.step}/{self.order.num_steps})")


def _word(name: str, value: Any) -> int:
    """``value`` as an int in [0, 2**64), or ValueError."""
    if isinstance(value, bool) or not hasattr(value, "__index__") or not 0 <= operator.index(value) <= _MAX_WORD:
        raise ValueError(f"{name}={value!r} must be an integer in 0..2**64 - 1")
    return operator.index(value)


def _checked_state(state: Any) -> dict[str, Any]:
    """The fields of a sampler state, each of its type, or InputError naming the first bad one."""
    if not isinstance(state, dict):
        raise InputError(f"sampler state is a {type(state).__name__}, not a dict; pass what "
                         "GlobalBatchSampler.state_dict() returned")
    missing = [key for key in _STATE_KEYS if key not in state]
    if missing:
        raise InputError(f"sampler state {show(state)} lacks {', '.join(missing)}; pass what "
                         "GlobalBatchSampler.state_dict() returned")
    if state["order"] != ORDER_RULES:
        raise InputError(f"sampler state has order={show(state['order'])}; this raypack follows {ORDER_RULES}")
    fields = dict(state)
    for key in ("seed", "epoch", "step", "length", "global_batch_size"):
        value = _integer(state[key])  # numpy's and torch's integers as Python's (a checkpoint's tooling)
        if value is None or not 0 <= value <= _MAX_WORD:
            raise InputError(f"sampler state has {key}={show(state[key])}, expected an integer in 0..2**64 - 1")
        fields[key] = value
    for key in ("shuffle", *_OPTIONAL_KEYS):
        if key in state:
            value = _flag(state[key])
            if value is None:
                raise InputError(f"sampler state has {key}={show(state[key])}, expected true or false")
            fields[key] = value
    digest = state["content_sha256"]
    if digest is not None and not is_hex(digest, 64):
        raise InputError(f"sampler state has content_sha256={show(digest)}, expected 64 hex digits or null")
    return fields


def _integer(value: Any) -> int | None:
    """An int, or a numpy or 0-d torch integer, as an int (None for anything else, a bool among them)."""
    if isinstance(value, bool) or _dtype_name(value) == "bool" or not hasattr(value, "__index__"):
        return None
    try:
        return operator.index(value)
    except TypeError:  # a torch tensor of more than one element, a float tensor
        return None


def _flag(value: Any) -> bool | None:
    """A bool, or a numpy or 0-d torch bool, as a bool (None for anything else)."""
    if isinstance(value, bool):
        return value
    if _dtype_name(value) == "bool" and getattr(value, "shape", None) in ((), []):
        return bool(value)
    return None


def _dtype_name(value: Any) -> str:
    """``value``'s dtype's name ("bool", "int64"; torch's without its "torch." prefix), or ""."""
    return str(getattr(value, "dtype", "")).removeprefix("torch.")
