"""Builders shared by the test files: shard writers, the job runner, plain-pyarrow output readers,
corpora and their hypothesis strategies. Test files import from here, never from each other."""

from __future__ import annotations

import glob
import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from raypack.pack.config import make_config
from raypack.pack.job import run_pack

# ----------------------------------------------------------------------------- shards and outputs


def write_shards(root, docs: list[list[int]], cuts: list[int], dtype=pa.int32(), row_group_size=None) -> str:
    """Write ``docs`` as Parquet shards split at ``cuts`` (document indices); return the dir."""
    shard_dir = os.path.join(root, "shards")
    os.makedirs(shard_dir, exist_ok=True)
    bounds = [0, *cuts, len(docs)]
    for k in range(len(bounds) - 1):
        table = pa.table({"input_ids": pa.array(docs[bounds[k]: bounds[k + 1]], pa.list_(dtype))})
        pq.write_table(table, os.path.join(shard_dir, f"part-{k:04d}.parquet"), row_group_size=row_group_size)
    return shard_dir


def read_output(out: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """Plain pyarrow: files sorted by name, dense doc ids from the segment columns."""
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    c = manifest["context_length"]
    tables = [pa.ipc.open_file(p).read_all() for p in sorted(glob.glob(os.path.join(out, "chunks-*.arrow")))]
    if not tables:
        return np.zeros((0, c), np.int64), np.zeros((0, c), np.int64), manifest
    table = pa.concat_tables(tables)
    assert table.column("chunk_index").to_pylist() == list(range(table.num_rows))
    input_ids = table.column("input_ids").combine_chunks().flatten().to_numpy().reshape(-1, c)
    seg_ids = table.column("segment_doc_ids").combine_chunks().flatten().to_numpy()
    seg_lens = table.column("segment_lengths").combine_chunks().flatten().to_numpy()
    return input_ids, np.repeat(seg_ids, seg_lens).reshape(-1, c), manifest


def write_long_token_shards(root, num_shards: int, docs_per_shard: int, seed: int = 0) -> None:
    """``num_shards`` Parquet shards ``000.parquet``, ... of random int32 documents of 1-1999 tokens:
    enough work that a run can be interrupted after its first tasks."""
    rng = np.random.default_rng(seed)
    os.makedirs(root, exist_ok=True)
    for k in range(num_shards):
        offsets = np.concatenate([[0], np.cumsum(rng.integers(1, 2000, docs_per_shard))]).astype(np.int32)
        docs = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 1000, offsets[-1]).astype(np.int32)))
        pq.write_table(pa.table({"input_ids": docs}), os.path.join(root, f"{k:03d}.parquet"))


def file_digests(out: str) -> dict[str, str]:
    """The chunk files of ``out`` (name -> sha256)."""
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in sorted(glob.glob(os.path.join(out, "*.arrow")))}


def pack(tmp_path, shard_dir, name="out", engine="local", **overrides):
    """Run the job on ``shard_dir`` into ``tmp_path / name`` (C = 8, small batches); its summary."""
    values = dict(inputs=[shard_dir], output=str(tmp_path / name), context_length=8, pad_token=0,
                  read_batch_size=3, chunks_per_record_batch=2)
    values.update(overrides)
    summary = run_pack(make_config(values), engine=engine)
    return summary


def tree_digest(path) -> dict[str, str]:
    """Every file under ``path`` (relative name -> sha256)."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            out[os.path.relpath(full, path)] = hashlib.sha256(open(full, "rb").read()).hexdigest()
    return out


# ----------------------------------------------------------------------------- corpora

doc_lengths = st.one_of(st.integers(0, 3), st.integers(0, 30), st.sampled_from([7, 8, 9, 16, 17, 40]))


@st.composite
def sharded_corpora(draw):
    """(docs, cuts): up to 25 documents as lists of ids and the document indices to cut shards at."""
    lengths = draw(st.lists(doc_lengths, min_size=0, max_size=25))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    docs = [rng.integers(0, 1000, size=n).tolist() for n in lengths]
    cuts = sorted(draw(st.lists(st.integers(0, len(docs)), max_size=5)))
    return docs, cuts


def random_corpus(seed: int, num_docs: int, max_len: int):
    """``num_docs`` documents of random ids, lengths in [0, max_len), from ``seed``."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, max_len, size=num_docs)
    return [rng.integers(0, 50_000, size=n).tolist() for n in lengths]


# ----------------------------------------------------------------------------- text

CORPUS = [
    "The quick brown fox jumps over the lazy dog. def main(): return 42\n",
    "東京は日本の首都です。我爱北京天安门。한국어 텍스트도 있습니다。",
    "Emoji: 😀👍🏽👨‍👩‍👧‍👦🇯🇵 🎉 and more ✨",
    "العربية تُكتب من اليمين إلى اليسار. עברית נכתבת מימין לשמאל.",
    "Ünïcödé çömbining: é vs e\u0301, ß, ﬁ ligature, Ωμέγα, Кириллица.",
    "   leading spaces\tand tabs\r\nwindows line\n\n\nblank lines   ",
]

def train_byte_level_bpe(texts: list[str], vocab_size: int):
    import tokenizers

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<bos>", "<eos>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def train_sentencepiece_style_bpe(texts: list[str], vocab_size: int):
    """A SentencePiece-style BPE (Llama 2's shape) with ``tokenizers``: no pre-tokenizer, spaces
    as "▁" and one prepended by the normalizer, byte fallback to <0xNN> for unseen characters."""
    import tokenizers

    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = tokenizers.normalizers.Sequence(
        [tokenizers.normalizers.Prepend("▁"), tokenizers.normalizers.Replace(" ", "▁")])
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab_size,
                                             special_tokens=["<unk>", "<s>", "</s>", *byte_tokens])
    tok.train_from_iterator(texts, trainer)
    return tok


def pack_one(path, out, strategy: str, read_batch_tokens: int, read_batch_size: int = 0, doc_offset: int = 5,
             token_offset: int = 0):
    """Pack the one shard ``path`` into the new directory ``out`` with pack_shard (best_fit: its
    count first, window 2); the ShardResult."""
    from raypack.inputs.reading import inspect_shard
    from raypack.pack.packer import count_shard_chunks, pack_shard
    from raypack.pack.tasks import PackSettings, ShardTask

    info = inspect_shard(str(path))
    settings = PackSettings(out_dir=str(out), context_length=2048, pad_token=0, token_dtype="int32",
                            token_column="input_ids", read_batch_size=read_batch_size,
                            read_batch_tokens=read_batch_tokens, chunks_per_record_batch=64, strategy=strategy,
                            strategy_options={"best_fit_window": 2} if strategy == "best_fit" else {})
    task = ShardTask(0, str(path), info.format, doc_offset, token_offset, info.num_docs, info.num_tokens)
    if strategy == "best_fit":
        num_chunks = count_shard_chunks(task, settings)
        task = ShardTask(0, str(path), info.format, doc_offset, token_offset, info.num_docs, info.num_tokens, 0,
                         num_chunks)
    out.mkdir()
    return pack_shard(task, settings)


# Split regexes of real tokenizer.json files (Llama 3; o200k as a tokenizer.json writes it)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK = (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
            "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
"""DeepSeek V3's three Split regexes, as its tokenizer.json decodes (CR and LF as the characters)."""
