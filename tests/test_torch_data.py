"""raypack.torch_data: every attention form against the mask rule, with real torch kernels.

The corpus is packed by the job itself (local engine) so documents continue across chunk
boundaries and the last chunk is padded; ``test_corpus_is_not_vacuous`` checks that first.
"""

from __future__ import annotations

import glob
import os
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention  # noqa: E402

from raypack.outputs import read_packed  # noqa: E402
from raypack.pack.config import make_config  # noqa: E402
from raypack.pack.job import run_pack  # noqa: E402
from raypack.rules.masks import build_bool_mask, build_intra_document_mask, pad_cu_seqlens  # noqa: E402
from raypack.torch_data import (  # noqa: E402
    ATTENTION_FORMS,
    IGNORE_INDEX,
    PackedTorchDataset,
    block_mask_to,
    build_batch,
    build_block_mask,
    collate_packed,
    iter_ray_batches,
    make_collate_fn,
    to_device,
)

C = 16
DOC_LENS = [[5, 23, 3, 2, 9], [40, 1, 7, 12, 4], [6, 30, 2, 3, 1, 11]]  # tokens per document, per shard
HEADS, HEAD_DIM = 2, 8
BLOCK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


# ----------------------------------------------------------------------------- corpus


@pytest.fixture(scope="module", params=["concat", "best_fit"])
def packed_dir(tmp_path_factory, request) -> str:
    """Three Parquet shards packed with context_length 16 by the local engine, by each strategy."""
    root = tmp_path_factory.mktemp(f"torch_data_{request.param}")
    shard_dir = root / "shards"
    shard_dir.mkdir()
    rng = np.random.default_rng(0)
    for k, lens in enumerate(DOC_LENS):
        docs = [rng.integers(1, 1000, size=n).tolist() for n in lens]
        pq.write_table(pa.table({"input_ids": pa.array(docs, pa.list_(pa.int32()))}),
                       shard_dir / f"part-{k:02d}.parquet")
    out = str(root / "packed")
    run_pack(make_config(dict(inputs=[str(shard_dir)], output=out, context_length=C, pad_token=0,
                              strategy=request.param)), engine="local")
    return out


@pytest.fixture(scope="module")
def chunks(packed_dir) -> dict[str, np.ndarray]:
    """All chunks: input_ids and doc_ids, (N, C)."""
    ds = read_packed(packed_dir)
    return ds.get_batch(0, len(ds))


def all_chunks(packed_dir, attention, **options):
    ds = PackedTorchDataset(packed_dir)
    return collate_packed([ds[i] for i in range(len(ds))], attention, **options)


def test_corpus_is_not_vacuous(chunks, packed_dir):
    doc_ids = chunks["doc_ids"]
    continues = doc_ids[1:, 0] == doc_ids[:-1, -1]
    assert continues.sum() >= (3 if "concat" in packed_dir else 1)  # documents continue into the next chunk
    assert np.any(np.all(doc_ids[1:-1] == doc_ids[1:-1, :1], axis=1))  # a chunk inside one document
    assert (doc_ids == -1).sum() > 0 and doc_ids[-1, -1] == -1  # padding, at the end
    if "best_fit" in packed_dir:
        assert np.count_nonzero(doc_ids[:, -1] == -1) >= 3    # padding at the end of several chunks
    num_segments = 1 + (doc_ids[:, 1:] != doc_ids[:, :-1]).sum(axis=1)
    assert num_segments.max() >= 3                            # several documents in one chunk
    assert len(glob.glob(os.path.join(packed_dir, "chunks-*.arrow"))) >= 2  # file order matters


# ----------------------------------------------------------------------------- dataset, labels, positions


def test_dataset_and_dataloader_give_the_chunks(packed_dir, chunks):
    ds = PackedTorchDataset(packed_dir)
    assert len(ds) == len(chunks["input_ids"]) and ds.context_length == C and ds.pad_token == 0
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=make_collate_fn("varlen"))
    batches = list(loader)
    assert [len(b["input_ids"]) for b in batches] == [4, 4, len(ds) - 8]
    got = torch.cat([b["input_ids"] for b in batches])
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), chunks["input_ids"])
    np.testing.assert_array_equal(torch.cat([b["doc_ids"] for b in batches]).numpy(), chunks["doc_ids"])
    assert pickle.loads(pickle.dumps(ds))[3]["doc_ids"].tolist() == chunks["doc_ids"][3].tolist()


def test_labels_and_position_ids_literal():
    input_ids = [[10, 11, 12, 13, 14, 0], [15, 16, 20, 21, 22, 23]]
    doc_ids = [[3, 3, 4, 4, 4, -1], [4, 4, 5, 5, 5, 5]]  # row 1 continues document 4 from row 0
    batch = build_batch(np.array(input_ids), np.array(doc_ids), "varlen")
    assert batch["labels"].tolist() == [[10, 11, 12, 13, 14, -100], [15, 16, 20, 21, 22, 23]]
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 0, 1, 2, 3]]
    bounded = build_batch(np.array(input_ids), np.array(doc_ids), "varlen", mask_boundary_labels=True)
    assert bounded["labels"].tolist() == [[10, 11, -100, 13, 14, -100], [15, 16, -100, 21, 22, 23]]
    assert bounded["cu_seqlens"].tolist() == [0, 2, 5, 6, 8, 12] and bounded["max_seqlen"] == 4


def test_boundary_labels_leave_no_cross_document_target(packed_dir, chunks):
    """After the model's shift (logits[:, i] vs labels[:, i + 1]) no kept target crosses documents."""
    doc_ids = chunks["doc_ids"]
    crosses = doc_ids[:, :-1] != doc_ids[:, 1:]
    plain = all_chunks(packed_dir, "varlen")["labels"].numpy()[:, 1:] != IGNORE_INDEX
    bounded = all_chunks(packed_dir, "varlen", mask_boundary_labels=True)["labels"].numpy()[:, 1:] != IGNORE_INDEX
    assert np.any(plain & crosses)            # without the option such targets exist
    assert not np.any(bounded & crosses)      # with it, none
    np.testing.assert_array_equal(bounded, plain & ~crosses)  # and nothing else is dropped


def test_position_ids_restart_per_segment(packed_dir, chunks):
    positions = all_chunks(packed_dir, "varlen")["position_ids"].numpy()
    doc_ids = chunks["doc_ids"]
    starts = np.c_[np.ones(len(doc_ids), bool), doc_ids[:, 1:] != doc_ids[:, :-1]]
    assert np.all(positions[starts] == 0)
    assert np.all(positions[:, 1:][~starts[:, 1:]] == positions[:, :-1][~starts[:, 1:]] + 1)
    assert np.all(positions[1:, 0][doc_ids[1:, 0] == doc_ids[:-1, -1]] == 0)  # continuing docs restart


# ----------------------------------------------------------------------------- kernels


def qkv(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, dtype=torch.float64, generator=gen) for _ in range(3)]


def segments(row: np.ndarray) -> list[tuple[int, int, int]]:
    """(start, end, doc id) of each maximal run of ``row``."""
    starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
    ends = np.r_[starts[1:], row.size]
    return [(int(s), int(e), int(row[s])) for s, e in zip(starts, ends)]


def assert_equals_documents_alone(out, q, k, v, doc_ids):
    """Every real row of ``out`` (B, H, L, D) equals causal attention over its segment alone."""
    checked = 0
    for b, row in enumerate(doc_ids):
        for start, end, doc in segments(row):
            if doc == -1:
                continue
            alone = F.scaled_dot_product_attention(q[b:b + 1, :, start:end], k[b:b + 1, :, start:end],
                                                   v[b:b + 1, :, start:end], is_causal=True)
            torch.testing.assert_close(out[b:b + 1, :, start:end], alone, rtol=0, atol=1e-12)
            checked += end - start
    assert checked == (doc_ids != -1).sum()


@pytest.mark.slow  # > 5 s
@pytest.mark.parametrize("attention", ["additive", "bool"])
def test_sdpa_with_dense_mask_equals_documents_alone(packed_dir, chunks, attention):
    batch = all_chunks(packed_dir, attention, mask_dtype=torch.float64)
    mask = batch["attention_mask"]
    assert mask.shape == (len(chunks["doc_ids"]), C, C)
    assert mask.dtype == (torch.float64 if attention == "additive" else torch.bool)
    q, k, v = qkv((len(mask), HEADS, C, HEAD_DIM))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
    assert_equals_documents_alone(out, q, k, v, chunks["doc_ids"])


def test_varlen_segments_reproduce_doc_ids(packed_dir, chunks):
    batch = all_chunks(packed_dir, "varlen")
    cu, doc_ids = batch["cu_seqlens"], chunks["doc_ids"]
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == doc_ids.size
    flat, bounds = doc_ids.reshape(-1), cu.tolist()
    rebuilt = np.concatenate([np.full(e - s, flat[s]) for s, e in zip(bounds[:-1], bounds[1:])])
    np.testing.assert_array_equal(rebuilt, flat)                        # each segment holds one id
    expected = [s + b * C for b, row in enumerate(doc_ids) for s, _, _ in segments(row)] + [doc_ids.size]
    assert bounds == expected                                           # and segments are the runs
    assert batch["max_seqlen"] == max(e - s for s, e in zip(bounds[:-1], bounds[1:]))
    assert batch["num_segments"] == len(bounds) - 1
    assert_varlen_equals_dense(cu, doc_ids)


def varlen_attention(q, k, v, bounds):
    """(B, H, L, D): the varlen kernel's semantics, causal attention within each segment
    [bounds[n], bounds[n + 1]) of the flattened (B * L,) batch; zero-length segments give nothing."""
    batch, heads, size, dim = q.shape
    flat = [t.transpose(0, 1).reshape(1, heads, batch * size, dim) for t in (q, k, v)]
    out = torch.cat([F.scaled_dot_product_attention(*(t[..., s:e, :] for t in flat), is_causal=True)
                     for s, e in zip(bounds[:-1], bounds[1:])], dim=2)
    return out.reshape(heads, batch, size, dim).transpose(0, 1)


def assert_varlen_equals_dense(cu, doc_ids):
    """Attention per segment of ``cu`` equals SDPA with the dense mask of ``doc_ids`` on real positions."""
    q, k, v = qkv((len(doc_ids), HEADS, doc_ids.shape[1], HEAD_DIM))
    out = varlen_attention(q, k, v, cu.tolist())
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.from_numpy(build_bool_mask(doc_ids))[:, None])
    real = torch.from_numpy(doc_ids != -1)
    torch.testing.assert_close(out.transpose(1, 2)[real], dense.transpose(1, 2)[real], rtol=0, atol=1e-12)


def effective_mask(block_mask, mask_mod, size) -> torch.Tensor:
    """(B, H, L, L) what the kernel computes: full blocks, plus partial blocks where mask_mod allows."""
    q_block, kv_block = block_mask.BLOCK_SIZE
    def dense_blocks(counts, indices):
        blocks = torch.zeros(*indices.shape, dtype=torch.bool)
        for pos in np.ndindex(*counts.shape):
            blocks[pos][indices[pos][: counts[pos]].long()] = True
        return blocks.repeat_interleave(q_block, -2).repeat_interleave(kv_block, -1)[..., :size, :size]
    partial = dense_blocks(block_mask.kv_num_blocks, block_mask.kv_indices)
    full = dense_blocks(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    assert not torch.any(partial & full)
    batch, heads = block_mask.kv_num_blocks.shape[:2]
    return full | (partial & create_mask(mask_mod, batch, heads, size, size, device="cpu"))


@pytest.mark.slow  # > 5 s
@pytest.mark.parametrize("block_size", [4, 5, 16, 128])
def test_flex_block_mask_equals_bool_mask(packed_dir, chunks, block_size):
    batch = all_chunks(packed_dir, "flex", block_size=block_size)
    block_mask, doc_ids = batch["block_mask"], chunks["doc_ids"]
    expected = torch.from_numpy(build_bool_mask(doc_ids))[:, None]
    assert block_mask.shape == (len(doc_ids), 1, C, C)
    # the mask_mod, materialised densely, is the rule
    torch.testing.assert_close(create_mask(block_mask.mask_mod, len(doc_ids), 1, C, C, device="cpu"), expected)
    # the block structure keeps every allowed pair and marks only all-allowed blocks full
    torch.testing.assert_close(effective_mask(block_mask, block_mask.mask_mod, C), expected)
    reference = create_block_mask(block_mask.mask_mod, len(doc_ids), 1, C, C, device="cpu", BLOCK_SIZE=block_size)
    for name in BLOCK_FIELDS:
        torch.testing.assert_close(getattr(block_mask, name), getattr(reference, name))
    assert block_mask.full_kv_num_blocks.sum() > 0 or block_size > 4  # full blocks are used


@pytest.mark.slow  # > 5 s
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_equals_documents_alone(packed_dir, chunks):
    block_mask = all_chunks(packed_dir, "flex", block_size=4)["block_mask"]
    q, k, v = qkv((len(chunks["doc_ids"]), HEADS, C, HEAD_DIM))
    out = flex_attention(q, k, v, block_mask=block_mask)
    assert_equals_documents_alone(out, q, k, v, chunks["doc_ids"])
    assert torch.all(out.transpose(1, 2)[torch.from_numpy(chunks["doc_ids"] == -1)] == 0)


def test_block_mask_pickles_for_dataloader_workers(packed_dir):
    block_mask = all_chunks(packed_dir, "flex", block_size=4)["block_mask"]
    again = pickle.loads(pickle.dumps(block_mask))
    torch.testing.assert_close(again.kv_indices, block_mask.kv_indices)
    torch.testing.assert_close(create_mask(again.mask_mod, again.shape[0], 1, C, C, device="cpu"),
                               create_mask(block_mask.mask_mod, again.shape[0], 1, C, C, device="cpu"))


def test_to_device_moves_the_mask_mod_doc_ids(packed_dir):
    batch = all_chunks(packed_dir, "flex", block_size=4)
    assert batch["block_mask"].to("meta").mask_mod.args[0].device.type == "cpu"  # why the helper exists
    moved = to_device(batch, "meta")
    assert sorted(moved) == sorted(batch) and moved["labels"].device.type == "meta"
    block_mask = moved["block_mask"]
    assert block_mask.mask_mod.args[0].device.type == "meta"
    assert all(getattr(block_mask, name).device.type == "meta" for name in BLOCK_FIELDS)
    assert block_mask_to(batch["block_mask"], "cpu").mask_mod.args[0].device.type == "cpu"


@st.composite
def doc_id_batches(draw):
    """(B, L) doc ids: runs of increasing ids, a padded tail, sometimes an id repeated later."""
    batch, size = draw(st.integers(1, 3)), draw(st.integers(1, 24))
    rows = []
    for _ in range(batch):
        lens = draw(st.lists(st.integers(1, 12), min_size=1, max_size=size))
        row = np.repeat(np.arange(len(lens)), lens)[:size]
        row = np.pad(row, (0, size - row.size), constant_values=-1)
        row[size - draw(st.integers(0, size)):] = -1
        if draw(st.booleans()) and size >= 3:
            row[-1] = row[0] if row[0] != row[-2] else row[-1]  # not one run per document
        rows.append(row)
    return np.stack(rows), draw(st.integers(1, 9))


@pytest.mark.slow  # > 5 s
@settings(max_examples=40, deadline=None)
@given(doc_id_batches())
@example((np.array([[3, 3, 5, 3, -1, -1], [7, 7, 7, 8, 8, 9]]), 2))  # id 3 in two runs: the dense fallback
def test_build_block_mask_equals_create_block_mask(case):
    doc_ids, block_size = case
    size = doc_ids.shape[1]
    block_mask = build_block_mask(doc_ids, block_size=block_size)
    expected = torch.from_numpy(build_bool_mask(doc_ids))[:, None]
    torch.testing.assert_close(effective_mask(block_mask, block_mask.mask_mod, size), expected)
    reference = create_block_mask(block_mask.mask_mod, len(doc_ids), 1, size, size, device="cpu", BLOCK_SIZE=block_size)
    for name in BLOCK_FIELDS:
        torch.testing.assert_close(getattr(block_mask, name), getattr(reference, name))


# ----------------------------------------------------------------------------- options


def test_max_segments_literal():
    input_ids, doc_ids = np.arange(12).reshape(2, 6), np.array([[3, 3, 4, 4, 4, -1], [4, 4, 5, 5, 5, 5]])
    batch = build_batch(input_ids, doc_ids, "varlen", max_segments=7)
    assert batch["cu_seqlens"].tolist() == [0, 2, 5, 6, 8, 12, 12, 12] and batch["cu_seqlens"].dtype == torch.int32
    assert batch["num_segments"] == 5 and batch["max_seqlen"] == 6        # L, not the longest segment (4)
    exact = build_batch(input_ids, doc_ids, "varlen", max_segments=5)
    assert exact["cu_seqlens"].tolist() == [0, 2, 5, 6, 8, 12]
    with pytest.raises(ValueError, match="the batch has 5 segments .* and max_segments=4; raise max_segments"):
        build_batch(input_ids, doc_ids, "varlen", max_segments=4)
    assert pad_cu_seqlens(np.array([0], np.int32), 2).tolist() == [0, 0, 0]  # no positions: all empty


def test_max_segments_fixes_the_shape_across_batches(packed_dir, chunks):
    ds = PackedTorchDataset(packed_dir)
    plain = list(torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=make_collate_fn("varlen")))
    counts = [b["num_segments"] for b in plain]
    assert len(set(counts)) > 1 and len({len(b["input_ids"]) for b in plain}) > 1  # not vacuous
    fixed = list(torch.utils.data.DataLoader(ds, batch_size=3,
                                             collate_fn=make_collate_fn("varlen", max_segments=max(counts))))
    for start, (got, want) in zip(range(0, len(ds), 3), zip(fixed, plain)):
        cu, num = got["cu_seqlens"], want["num_segments"]
        assert cu.shape == (max(counts) + 1,) and got["max_seqlen"] == C and got["num_segments"] == num
        torch.testing.assert_close(cu[:num + 1], want["cu_seqlens"], rtol=0, atol=0)   # real boundaries first
        assert torch.all(cu[num:] == len(got["input_ids"]) * C)                        # then empty segments
        assert_varlen_equals_dense(cu, chunks["doc_ids"][start:start + 3])
    with pytest.raises(ValueError, match=f"has {max(counts)} segments .* max_segments={max(counts) - 1}"):
        list(torch.utils.data.DataLoader(ds, batch_size=3,
                                         collate_fn=make_collate_fn("varlen", max_segments=max(counts) - 1)))


def attention_output(batch, attention, q, k, v):
    """(B, H, L, D) attention of ``batch``'s form on CPU."""
    if attention in ("additive", "bool"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=batch["attention_mask"][:, None])
    if attention == "varlen":
        return varlen_attention(q, k, v, batch["cu_seqlens"].tolist())
    return flex_attention(q, k, v, block_mask=batch["block_mask"])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("attention", ATTENTION_FORMS)
def test_pad_to_multiple_of(chunks, attention):
    tokens, doc_ids = chunks["input_ids"], chunks["doc_ids"]
    options = dict(mask_dtype=torch.float64, block_size=4) if attention != "varlen" else {}
    plain = build_batch(tokens, doc_ids, attention, **options)
    padded = build_batch(tokens, doc_ids, attention, pad_to_multiple_of=5, pad_token=7, **options)
    size = 20                                                       # C = 16 -> 20
    assert padded["input_ids"].shape == (len(tokens), size)
    for key, pad in (("input_ids", 7), ("doc_ids", -1), ("labels", IGNORE_INDEX)):
        assert torch.all(padded[key][:, C:] == pad), key
        torch.testing.assert_close(padded[key][:, :C], plain[key], rtol=0, atol=0)
    torch.testing.assert_close(padded["position_ids"][:, :C], plain["position_ids"], rtol=0, atol=0)
    expected = build_bool_mask(padded["doc_ids"].numpy())           # the rule over the padded ids
    if attention in ("additive", "bool"):
        torch.testing.assert_close(padded["attention_mask"] == (0.0 if attention == "additive" else True),
                                   torch.from_numpy(expected))
    elif attention == "varlen":
        assert padded["cu_seqlens"][-1] == len(tokens) * size
    else:
        assert padded["block_mask"].shape == (len(tokens), 1, size, size)
        torch.testing.assert_close(effective_mask(padded["block_mask"], padded["block_mask"].mask_mod, size),
                                   torch.from_numpy(expected)[:, None])
    q, k, v = qkv((len(tokens), HEADS, size, HEAD_DIM))
    got = attention_output(padded, attention, q, k, v)
    want = attention_output(plain, attention, q[..., :C, :], k[..., :C, :], v[..., :C, :])
    real = torch.from_numpy(doc_ids != -1)
    torch.testing.assert_close(got[..., :C, :].transpose(1, 2)[real], want.transpose(1, 2)[real], rtol=0, atol=1e-12)
    aligned = build_batch(tokens, doc_ids, attention, pad_to_multiple_of=8, **options)  # 16 is a multiple of 8
    assert_batches_equal(aligned, plain)


def test_padding_rows_and_their_remedy(chunks):
    doc_ids = chunks["doc_ids"][-2:]
    tokens = chunks["input_ids"][-2:]
    q, k, v = qkv((2, 1, C, HEAD_DIM))
    real = torch.from_numpy(doc_ids != -1)
    hand_written = lambda mask: torch.softmax(q @ k.transpose(-1, -2) + mask[:, None], dim=-1) @ v  # noqa: E731
    plain = build_batch(tokens, doc_ids, "additive", mask_dtype=torch.float64)["attention_mask"]
    fixed = build_batch(tokens, doc_ids, "additive", mask_dtype=torch.float64,
                        padding_attends_self=True)["attention_mask"]
    assert torch.all(torch.isnan(hand_written(plain).transpose(1, 2)[~real]))   # the caveat
    assert torch.all(torch.isfinite(hand_written(fixed)))                        # the remedy
    torch.testing.assert_close(fixed[real], plain[real])
    torch.testing.assert_close(hand_written(fixed).transpose(1, 2)[real], hand_written(plain).transpose(1, 2)[real])
    fixed_bool = build_batch(tokens, doc_ids, "bool", padding_attends_self=True)["attention_mask"]
    torch.testing.assert_close(fixed_bool, fixed == 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_mask_dtype(chunks, dtype):
    mask = build_batch(chunks["input_ids"][:3], chunks["doc_ids"][:3], "additive", mask_dtype=dtype)["attention_mask"]
    assert mask.dtype == dtype
    expected = torch.from_numpy(build_intra_document_mask(chunks["doc_ids"][:3])).to(dtype)
    torch.testing.assert_close(mask, expected)


def test_collate_accepts_chunk_file_rows(packed_dir):
    table = pa.concat_tables(pa.ipc.open_file(p).read_all()
                             for p in sorted(glob.glob(os.path.join(packed_dir, "chunks-*.arrow"))))
    rows = table.to_pylist()
    ds = PackedTorchDataset(packed_dir)
    for attention in ("bool", "varlen"):
        from_rows, from_ds = collate_packed(rows, attention), collate_packed([ds[i] for i in range(len(ds))], attention)
        assert_batches_equal(from_rows, from_ds)


def test_validation(chunks):
    tokens, doc_ids = chunks["input_ids"][:2], chunks["doc_ids"][:2]
    with pytest.raises(ValueError, match="attention='dense' is not a form"):
        build_batch(tokens, doc_ids, "dense")
    with pytest.raises(TypeError, match="unknown option"):
        make_collate_fn("bool", mask_boundary_label=True)
    with pytest.raises(ValueError, match="block_size=0 must be"):
        make_collate_fn("flex", block_size=0)
    with pytest.raises(ValueError, match="max_segments=8 with attention='bool'; .* only applies to"):
        make_collate_fn("bool", max_segments=8)
    with pytest.raises(ValueError, match="max_segments=0 with attention='varlen'; it must be an integer >= 1"):
        build_batch(tokens, doc_ids, "varlen", max_segments=0)
    with pytest.raises(ValueError, match="pad_to_multiple_of=True must be an integer >= 1"):
        make_collate_fn("flex", pad_to_multiple_of=True)
    with pytest.raises(ValueError, match="pad_to_multiple_of=0 must be"):
        build_batch(tokens, doc_ids, pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="pad_token=-1 must be an integer token id >= 0"):
        make_collate_fn("varlen", pad_to_multiple_of=64, pad_token=-1)
    with pytest.raises(TypeError, match="mask_dtype=torch.int32 cannot"):
        build_batch(tokens, doc_ids, mask_dtype=torch.int32)
    with pytest.raises(ValueError, match="they must match"):
        build_batch(tokens[:, :-1], doc_ids)
    with pytest.raises(ValueError, match=r"must be \(B, L\)"):
        build_batch(tokens[0], doc_ids[0])
    with pytest.raises(ValueError, match="doc_ids contains -2; ids must be >= 0"):
        build_batch(tokens, np.minimum(doc_ids, -2))
    with pytest.raises(TypeError, match="doc_ids has dtype float64"):
        build_block_mask(doc_ids.astype(float))
    with pytest.raises(ValueError, match="no samples"):
        collate_packed([])
    with pytest.raises(ValueError, match="segment_doc_ids"):
        collate_packed([{"input_ids": tokens[0]}])
    with pytest.raises(TypeError, match="source is a list"):
        next(iter_ray_batches([1, 2], 2))
    with pytest.raises(ValueError, match="batch_size=0"):
        next(iter_ray_batches("unused", 0))


@settings(max_examples=40, deadline=None)
@given(doc_id_batches(), st.integers(1, 9), st.integers(0, 3))
def test_padding_and_max_segments_keep_the_rule(case, multiple, spare):
    """Any doc ids: the padded bool mask is the unpadded one plus nothing; the padded varlen
    boundaries are the unpadded ones, then empty segments."""
    doc_ids, size = case[0], case[0].shape[1]
    tokens = np.zeros_like(doc_ids)
    padded = build_batch(tokens, doc_ids, "bool", pad_to_multiple_of=multiple)["attention_mask"]
    assert padded.shape[-1] % multiple == 0 and padded.shape[-1] - size < multiple
    torch.testing.assert_close(padded[:, :size, :size], torch.from_numpy(build_bool_mask(doc_ids)))
    assert not padded[:, size:].any() and not padded[:, :, size:].any()
    plain = build_batch(tokens, doc_ids, "varlen", pad_to_multiple_of=multiple)
    num = plain["num_segments"]
    fixed = build_batch(tokens, doc_ids, "varlen", pad_to_multiple_of=multiple, max_segments=num + spare)
    assert fixed["cu_seqlens"].tolist() == plain["cu_seqlens"].tolist() + [plain["cu_seqlens"][-1].item()] * spare
    assert fixed["num_segments"] == num and fixed["max_seqlen"] == plain["input_ids"].shape[1]


# ----------------------------------------------------------------------------- Ray, Hugging Face


def assert_batches_equal(got, expected):
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        if key == "block_mask":
            for name in BLOCK_FIELDS:
                torch.testing.assert_close(getattr(got[key], name), getattr(value, name))
            size = value.shape[-1]
            torch.testing.assert_close(create_mask(got[key].mask_mod, value.shape[0], 1, size, size, device="cpu"),
                                       create_mask(value.mask_mod, value.shape[0], 1, size, size, device="cpu"))
        elif isinstance(value, torch.Tensor):
            torch.testing.assert_close(got[key], value, rtol=0, atol=0)
        else:
            assert got[key] == value, key


def test_iter_ray_batches_equals_dataloader(packed_dir, ray_session):
    rds = read_packed(packed_dir).to_ray_dataset(batch_rows=2)
    assert rds.schema().names == ["input_ids", "doc_ids"]  # nothing L x L goes through the object store
    ds = PackedTorchDataset(packed_dir)
    for attention in ATTENTION_FORMS:
        loader = torch.utils.data.DataLoader(ds, batch_size=3, collate_fn=make_collate_fn(attention, block_size=8))
        streamed = list(iter_ray_batches(rds, 3, attention, block_size=8))
        expected = list(loader)
        assert len(streamed) == len(expected) == -(-len(ds) // 3)
        for got, want in zip(streamed, expected):
            assert_batches_equal(got, want)
    from_path = list(iter_ray_batches(packed_dir, 4, "varlen", drop_last=True))
    assert len(from_path) == len(ds) // 4
    assert_batches_equal(from_path[0], collate_packed([ds[i] for i in range(4)], "varlen"))


@pytest.mark.slow  # > 5 s
def test_hugging_face_load_dataset(packed_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    hf = datasets.load_dataset("arrow", data_files=os.path.join(packed_dir, "chunks-*.arrow"), split="train",
                               cache_dir=str(tmp_path / "hf"))
    ds = PackedTorchDataset(packed_dir)
    assert hf.num_rows == len(ds) and hf["chunk_index"][:] == list(range(len(ds)))  # global order kept
    hf = hf.with_format("numpy")
    assert_batches_equal(collate_packed([hf[i] for i in range(len(ds))], "bool", mask_boundary_labels=True),
                         collate_packed([ds[i] for i in range(len(ds))], "bool", mask_boundary_labels=True))
    loader = torch.utils.data.DataLoader(hf, batch_size=4, collate_fn=make_collate_fn("varlen"))
    assert_batches_equal(next(iter(loader)), collate_packed([ds[i] for i in range(4)], "varlen"))
