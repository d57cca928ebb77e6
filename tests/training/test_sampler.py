"""GlobalBatchSampler (raypack.training.sampler over raypack.rules.global_batches): the global batches
against a naive reference, resuming with another world size, every reader, DataLoader workers,
the refusals, and docs/TRAINING.md's training loop run as written."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.errors import InputError
from raypack.mix.dataset import load_mix_config, run_mix
from raypack.outputs import read_packed
from raypack.rules.global_batches import GlobalBatches
from raypack.rules.permutation import permute, round_keys
from raypack.training import GlobalBatchSampler

from helpers import pack, write_shards

G = 8


# ----------------------------------------------------------------------------- the order, pure


def reference_epoch(length, seed, epoch, shuffle):
    """The whole order of an epoch, materialised: position p -> item (stream (2, epoch))."""
    if not shuffle:
        return np.arange(length)
    keys = round_keys(seed, (2, epoch))
    return np.array([permute(p, length, keys) for p in range(length)])


def reference_shares(length, global_batch_size, world_size, seed, epoch, shuffle, drop_last):
    """[step][rank] -> items: the order sliced into global batches, each split by np.array_split."""
    order = reference_epoch(length, seed, epoch, shuffle)
    num_steps = length // global_batch_size if drop_last else -(-length // global_batch_size)
    batches = [order[s * global_batch_size:(s + 1) * global_batch_size] for s in range(num_steps)]
    return [[part.tolist() for part in np.array_split(batch, world_size)] for batch in batches]


@st.composite
def orders(draw):
    global_batch_size = draw(st.integers(1, 48))
    divisors = [w for w in range(1, global_batch_size + 1) if global_batch_size % w == 0]
    return dict(length=draw(st.integers(global_batch_size, 400)), global_batch_size=global_batch_size,
                world_size=draw(st.sampled_from(divisors)), seed=draw(st.integers(0, 2**64 - 1)),
                epoch=draw(st.integers(0, 5)), shuffle=draw(st.booleans()), drop_last=draw(st.booleans()))


@settings(max_examples=60, deadline=None)
@given(case=orders())
def test_each_rank_yields_its_slice_of_the_naive_order(case):
    expected = reference_shares(**case)
    length, world_size, epoch = case["length"], case["world_size"], case["epoch"]
    seen = []
    for rank in range(world_size):
        sampler = GlobalBatchSampler(length, global_batch_size=case["global_batch_size"], rank=rank,
                                     world_size=world_size, seed=case["seed"], shuffle=case["shuffle"],
                                     drop_last=case["drop_last"])
        sampler.set_epoch(epoch)
        mine = [step[rank] for step in expected if step[rank]]
        got = list(sampler)
        assert got == mine
        assert len(sampler) == len(mine)
        seen += itertools.chain.from_iterable(got)
    assert len(seen) == len(set(seen))                      # no index repeats within the epoch
    full = length // case["global_batch_size"] * case["global_batch_size"]
    assert len(seen) == (full if case["drop_last"] else length) and set(seen) <= set(range(length))


def test_the_order_is_pinned():
    """The rules' bits (a state names them "global-batches-v1"): a change here breaks every saved state."""
    order = GlobalBatches(10, 5, seed=0)
    assert [order.global_batch(0, s).tolist() for s in (0, 1)] == [[3, 5, 7, 4, 0], [2, 6, 8, 1, 9]]
    assert order.global_batch(1, 0).tolist() == [2, 3, 7, 8, 1]      # each epoch its own permutation
    assert GlobalBatches(10**9, 4, seed=7).global_batch(3, 12345).tolist() == [162046266, 920952087, 735825634,
                                                                             773887712]
    assert GlobalBatches(10, 5, shuffle=False).global_batch(4, 1).tolist() == [5, 6, 7, 8, 9]


def test_set_epoch_and_the_end_of_an_epoch():
    sampler = GlobalBatchSampler(20, global_batch_size=4, seed=3)
    first = list(sampler)
    assert (sampler.epoch, sampler.step) == (0, 5)
    second = list(sampler)                                  # a finished epoch moves on by itself
    assert sampler.epoch == 1 and second != first and sorted(sum(second, [])) == list(range(20))
    sampler.set_epoch(0)
    assert list(sampler) == first
    sampler.set_epoch(3)
    it = iter(sampler)
    next(it), next(it)
    sampler.set_epoch(3)                                    # the current epoch: keeps its step (a resumed loop)
    assert (sampler.epoch, sampler.step) == (3, 2)
    sampler.set_epoch(7)
    assert (sampler.epoch, sampler.step) == (7, 0)


def epochs_of(samplers, start, end, set_epoch):
    """Every rank's batches, global batch after global batch, of a loop over epochs [start, end)."""
    seen = []
    for epoch in range(start, end):
        for sampler in samplers:
            if set_epoch:
                sampler.set_epoch(epoch)
        seen += [sum(batches, []) for batches in zip(*samplers)]
    return seen


@pytest.mark.parametrize("loop", ["set_epoch at the checkpoint's epoch", "set_epoch at the next epoch",
                                  "no set_epoch, the state's next epoch"])
def test_a_state_saved_after_an_epochs_last_batch_resumes_without_an_extra_epoch(loop):
    """A trial: a checkpoint taken right after an epoch's last batch, resumed by the documented loop (set_epoch at
    the top of each epoch, from the loop's saved epoch), trained an extra epoch: set_epoch kept the finished
    epoch's step and the iteration then moved on by itself, so the sampler ran one epoch ahead of the loop."""
    length, epochs = 47, 3
    whole = epochs_of([GlobalBatchSampler(length, global_batch_size=G, rank=r, world_size=4, seed=5) for r in range(4)],
                      0, epochs, set_epoch=True)
    before = [GlobalBatchSampler(length, global_batch_size=G, rank=r, world_size=4, seed=5) for r in range(4)]
    first = epochs_of(before, 0, 1, set_epoch=True)       # epoch 0 whole, then the checkpoint
    state = json.loads(json.dumps(before[0].state_dict()))
    assert (state["epoch"], state["step"]) == (0, before[0].num_steps)
    after = [GlobalBatchSampler(length, global_batch_size=G, rank=r, world_size=2, seed=5) for r in range(2)]
    for sampler in after:
        sampler.load_state_dict(state)
    if loop == "set_epoch at the checkpoint's epoch":
        rest = epochs_of(after, 0, epochs, set_epoch=True)
    elif loop == "set_epoch at the next epoch":
        rest = epochs_of(after, 1, epochs, set_epoch=True)
    else:   # TRAINING.md: a loop without set_epoch starts at epoch + (step == num_steps)
        rest = epochs_of(after, state["epoch"] + (state["step"] == after[0].num_steps), epochs, set_epoch=False)
    assert first + rest == whole
    assert after[0].epoch == epochs - 1


@pytest.mark.parametrize("saved_after", [1, 3])   # epochs; 3 is the last: nothing is left to train
@pytest.mark.parametrize("start", ["the checkpoint's epoch", "the next epoch"])
def test_set_epoch_before_the_state_is_loaded_resumes_the_same(saved_after, start):
    """A trial: a loop (or a loader that applies a state as its iteration starts) that calls set_epoch and then
    loads the state had the epoch it named forgotten, and trained one epoch more (12 global batches, not 9)."""
    length, epochs = 47, 3
    whole = epochs_of([GlobalBatchSampler(length, global_batch_size=G, rank=r, world_size=2, seed=5) for r in range(2)],
                      0, epochs, set_epoch=True)
    before = [GlobalBatchSampler(length, global_batch_size=G, rank=r, world_size=2, seed=5) for r in range(2)]
    first = epochs_of(before, 0, saved_after, set_epoch=True)
    state = before[0].state_dict()
    after = [GlobalBatchSampler(length, global_batch_size=G, rank=r, world_size=4, seed=5) for r in range(4)]
    rest = []
    for epoch in range(saved_after - 1 if start == "the checkpoint's epoch" else saved_after, epochs):
        for sampler in after:
            sampler.set_epoch(epoch)
            if epoch == saved_after - 1 or (start == "the next epoch" and epoch == saved_after):
                sampler.load_state_dict(state)
        rest += [sum(batches, []) for batches in zip(*after)]
    assert first + rest == whole


def test_drop_last_is_in_the_state_and_another_is_refused():
    """A trial: drop_last was not in the state, so a state loaded into a sampler with the other drop_last gave a
    partial global batch the run never had."""
    sampler = GlobalBatchSampler(50, global_batch_size=G, drop_last=True)
    list(sampler)
    state = sampler.state_dict()
    assert state["drop_last"] is True
    with pytest.raises(InputError, match=r"^sampler state has drop_last=True \(the last partial global batch\) "
                                         "but this sampler has False; resume over the same output with the same "
                                         "drop_last$"):
        GlobalBatchSampler(50, global_batch_size=G, drop_last=False).load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "drop_last"}   # a state saved before drop_last was in it
    GlobalBatchSampler(50, global_batch_size=G).load_state_dict(older)


def test_a_state_whose_numbers_passed_through_numpy_or_torch_loads():
    """A trial: a checkpoint tool's np.int64 and 0-d tensors were refused, the line showing a valid-looking value."""
    sampler = GlobalBatchSampler(100, global_batch_size=G, seed=9)
    next(iter(sampler))
    state = sampler.state_dict()
    as_numpy = {k: np.int64(v) if type(v) is int else np.bool_(v) if type(v) is bool else v for k, v in state.items()}
    other = GlobalBatchSampler(100, global_batch_size=G, seed=9)
    other.load_state_dict(as_numpy)
    assert other.state_dict() == state
    assert all(type(v) in (int, bool, str, type(None)) for v in other.state_dict().values())
    torch = pytest.importorskip("torch")
    as_torch = {k: torch.tensor(v) if type(v) in (int, bool) and k != "seed" else v for k, v in state.items()}
    other.load_state_dict(as_torch)
    assert other.state_dict() == state
    for bad in (torch.tensor(1.5), torch.tensor([1, 2]), np.float64(2.0)):
        with pytest.raises(InputError, match="sampler state has step="):
            other.load_state_dict({**state, "step": bad})


def test_a_state_that_cannot_be_checked_against_the_output_is_said(outputs, caplog):
    """A trial: a state saved over a length (no content_sha256) loaded into a sampler over another output without
    a word. It cannot be refused (the length may be right), so it is one WARNING, either way round."""
    length = len(read_packed(outputs["concat"]))
    bare = GlobalBatchSampler(length, global_batch_size=G).state_dict()
    with caplog.at_level("WARNING", logger="raypack.training.sampler"):
        GlobalBatchSampler(outputs["concat"], global_batch_size=G).load_state_dict(bare)
        GlobalBatchSampler(length, global_batch_size=G).load_state_dict(
            GlobalBatchSampler(outputs["concat"], global_batch_size=G).state_dict())
        GlobalBatchSampler(length, global_batch_size=G).load_state_dict(bare)        # neither has one: nothing said
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "has no content_sha256 (saved over a length or a plain dataset)" in said[0]
    assert "this sampler's source has no digest" in said[1]


# ----------------------------------------------------------------------------- packed outputs


def packed(root, name, seed, strategy="concat", num_docs=60):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, 900, size=int(n)).tolist() for n in rng.integers(1, 30, size=num_docs)]
    shard_dir = write_shards(root / f"in-{name}", docs, [num_docs // 3, 2 * num_docs // 3])
    pack(root, shard_dir, name=name, strategy=strategy)
    return str(root / name)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """C = 8 outputs: concat (~110 chunks), best_fit, another concat, and a mix of the first two."""
    root = tmp_path_factory.mktemp("sampler")
    made = {"concat": packed(root, "concat", 0), "best_fit": packed(root, "best_fit", 1, "best_fit"),
            "other": packed(root, "other", 2)}
    run_mix(load_mix_config(None, sources=[(made["concat"], 1), (made["best_fit"], 2)], output=str(root / "mix"),
                            num_chunks=150, seed=9))
    made["mix"] = str(root / "mix")
    return made


def run_ranks(source, world_size, total_steps, *, state=None, save_at=None, drop_last=True):
    """W samplers in lockstep, epoch after epoch, from ``state`` (or the start) to global step
    ``total_steps``: {global step: sorted items of the global batch}, and the state saved after
    ``save_at`` global batches (every rank's, checked equal)."""
    samplers = [GlobalBatchSampler(source, global_batch_size=G, rank=r, world_size=world_size, seed=5,
                                   drop_last=drop_last) for r in range(world_size)]
    for sampler in samplers:
        if state is not None:
            sampler.load_state_dict(state)
    num_steps = samplers[0].num_steps
    step = samplers[0].epoch * num_steps + samplers[0].step
    batches, saved = {}, None
    while step < total_steps:
        for shares in itertools.zip_longest(*samplers, fillvalue=[]):
            batches[step] = sorted(itertools.chain.from_iterable(shares))
            step += 1
            if step == save_at:
                states = [s.state_dict() for s in samplers]
                assert all(s == states[0] for s in states)
                saved = json.loads(json.dumps(states[0]))     # a state is plain JSON
            if step == total_steps:
                break
    return batches, saved


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_state_saved_by_4_ranks_resumes_on_2_and_8(outputs, drop_last):
    out = outputs["concat"]
    length = len(read_packed(out))
    assert 50 > length // G > 4 and length % G >= 1         # 50 steps cross several epochs; a partial batch
    whole, state = run_ranks(out, 4, 50, save_at=23, drop_last=drop_last)
    num_steps = GlobalBatchSampler(length, global_batch_size=G, drop_last=drop_last).num_steps
    assert sorted(whole) == list(range(50)) and 0 < state["step"] < num_steps and state["epoch"] >= 1   # mid-epoch
    for world_size in (2, 8):
        resumed, _ = run_ranks(out, world_size, 50, state=state, drop_last=drop_last)
        assert sorted(resumed) == list(range(23, 50))
        assert resumed == {s: whole[s] for s in range(23, 50)}
    if not drop_last:
        assert any(len(b) < G for b in whole.values())     # the partial batch took part


@pytest.mark.parametrize("kind", ["concat", "best_fit", "mix"])
def test_every_reader_and_strategy(outputs, kind):
    ds = read_packed(outputs[kind])
    sampler = GlobalBatchSampler(outputs[kind], global_batch_size=G, drop_last=False, seed=1)
    assert sampler.content_sha256 == ds.content_sha256 and len(sampler.state_dict()["content_sha256"]) == 64
    items = list(itertools.chain.from_iterable(sampler))
    assert sorted(items) == list(range(len(ds)))            # one epoch: every chunk once
    assert GlobalBatchSampler(ds, global_batch_size=G).content_sha256 == ds.content_sha256


def test_a_mix_digest_names_its_order(tmp_path, outputs):
    again = str(tmp_path / "again")
    run_mix(load_mix_config(None, sources=[(outputs["concat"], 1), (outputs["best_fit"], 2)], output=again,
                            num_chunks=150, seed=9))
    reseeded = str(tmp_path / "reseeded")
    run_mix(load_mix_config(None, sources=[(outputs["concat"], 1), (outputs["best_fit"], 2)], output=reseeded,
                            num_chunks=150, seed=10))
    digest = read_packed(outputs["mix"]).content_sha256
    assert read_packed(again).content_sha256 == digest != read_packed(reseeded).content_sha256


# ----------------------------------------------------------------------------- refusals


def one_line(excinfo):
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(global_batch_size=8, world_size=3), "world_size=3 does not divide global_batch_size=8"),
    (dict(global_batch_size=8, world_size=4, rank=4), "rank=4 is out of range for world_size=4"),
    (dict(global_batch_size=8, world_size=4, rank=-1), "rank=-1 must be an integer >= 0"),
    (dict(global_batch_size=200), "100 items are fewer than one global batch of 200"),
    (dict(global_batch_size=0), "global_batch_size=0 must be an integer >= 1"),
    (dict(global_batch_size=8, seed=-1), "seed=-1 must be an integer"),
])
def test_bad_arguments_are_one_line(kwargs, message):
    with pytest.raises(ValueError) as excinfo:
        GlobalBatchSampler(100, **kwargs)
    assert message in one_line(excinfo)


def test_a_state_of_another_output_or_length_is_refused(outputs):
    state = GlobalBatchSampler(outputs["concat"], global_batch_size=G).state_dict()
    other = GlobalBatchSampler(outputs["other"], global_batch_size=G)
    with pytest.raises(InputError) as excinfo:
        other.load_state_dict(state)
    assert "sampler state is from another output" in one_line(excinfo)
    with pytest.raises(InputError) as excinfo:
        GlobalBatchSampler(state["length"] + 1, global_batch_size=G).load_state_dict(state)
    assert f"length={state['length']}" in one_line(excinfo)
    with pytest.raises(InputError) as excinfo:
        GlobalBatchSampler(outputs["concat"], global_batch_size=4).load_state_dict(state)
    assert "global_batch_size=8" in one_line(excinfo)
    GlobalBatchSampler(state["length"], global_batch_size=G).load_state_dict(state)   # a bare length: no digest


@pytest.mark.parametrize("change, message", [
    (dict(order="global-batches-v0"), "order='global-batches-v0'"),
    (dict(step=10**6), "past the epoch's"),
    (dict(epoch=-1), "epoch=-1"),
    (dict(shuffle=1), "shuffle=1"),
    (dict(content_sha256="abc"), "expected 64 hex digits"),
    (dict(seed=None), "seed=None"),
])
def test_a_damaged_state_is_refused(change, message):
    sampler = GlobalBatchSampler(100, global_batch_size=G)
    state = {**sampler.state_dict(), **change}
    with pytest.raises(InputError) as excinfo:
        sampler.load_state_dict(state)
    assert message in one_line(excinfo)
    with pytest.raises(InputError, match="lacks step"):
        sampler.load_state_dict({k: v for k, v in sampler.state_dict().items() if k != "step"})
    assert (sampler.epoch, sampler.step, sampler.order.seed) == (0, 0, 0)   # nothing half-applied


# ----------------------------------------------------------------------------- torch


@pytest.mark.filterwarnings("ignore:This DataLoader will create")   # 4 workers on a 2-CPU machine
@pytest.mark.parametrize("num_workers", [1, 4])
def test_loader_workers_give_the_same_batches_and_resume(outputs, num_workers):
    torch = pytest.importorskip("torch")
    from raypack.torch_data import GlobalBatchSampler as Exported
    from raypack.torch_data import PackedTorchDataset, make_collate_fn

    assert Exported is GlobalBatchSampler
    out = outputs["concat"]
    dataset, collate = PackedTorchDataset(out), make_collate_fn("varlen")
    chunks = read_packed(out).get_batch(0, len(dataset))["input_ids"]

    def loader(sampler, workers):
        return torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate)

    def make():
        return GlobalBatchSampler(dataset, global_batch_size=G, rank=1, world_size=2, seed=4, drop_last=False)

    indices = list(make())
    plain = [b["input_ids"] for b in loader(make(), 0)]
    assert [b.tolist() for b in plain] == [chunks[i].astype(np.int64).tolist() for i in indices]
    sampler = make()
    batches = iter(loader(sampler, num_workers))
    head = [next(batches)["input_ids"] for _ in range(5)]
    assert sampler.state_dict()["step"] > 5                 # the workers fetched ahead: the loop says where it is
    state = sampler.state_dict(step=5)
    del batches
    resumed = make()                                        # a restarted rank 1 of 2, a new loader
    resumed.load_state_dict(state)
    tail = [b["input_ids"] for b in loader(resumed, num_workers)]
    assert all(torch.equal(a, b) for a, b in zip(head + tail, plain, strict=True))


@pytest.mark.slow   # ~3 s alone, ~7 s on a loaded machine (packing, torch, 30 training steps)
def test_training_example_runs_as_written(tmp_path, monkeypatch):
    """docs/TRAINING.md, "Training on many ranks": every python block of the section, in order, in one
    namespace (the doc asserts the loss goes down and the resumed run's losses equal the whole run's)."""
    pytest.importorskip("torch")
    text = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "TRAINING.md")).read()
    section = text.split("## Training on many ranks", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    scope = {"__name__": "training_many_ranks_example"}
    exec(compile("\n".join(blocks), "docs/TRAINING.md", "exec"), scope)  # noqa: S102 - our own documentation
    assert len(scope["losses"]) == 20 and scope["losses"][-1] < scope["losses"][0]
    assert (tmp_path / "checkpoint.pt").exists()
