"""A sample sharded corpus of random tokens, for ``make demo``, tests and benchmarks.

Each shard holds ``docs_per_shard`` documents with log-normal lengths and uniform random
tokens in ``[0, vocab_size)``, in one column ``input_ids`` of type ``list<dtype>``. Shard
``k`` depends only on ``(seed, k)`` (its generator is child ``k`` of ``SeedSequence(seed)``)
and its tokens do not depend on ``dtype`` or ``fmt``: the same corpus can be written in any
format and dtype (each registered input format writes its own, raypack.inputs.base.InputFormat.write).
Documents are built with numpy (offsets + values) and no per-token Python; JSONL loops per document.

    python -m raypack.sample --output build/sample --shards 8 --docs-per-shard 2000 --context-length 512

``--text`` writes text instead (:func:`write_sample_texts`): a ``text`` column of words, some
of them non-ASCII, for ``raypack tokenize`` / ``raypack pack --tokenizer``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NamedTuple, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from raypack.errors import InputError
from raypack.inputs.registry import FORMATS, format_named
from raypack.rules.arrays import arrow_array

__all__ = ["FORMATS", "TEXT_WORDS", "lognormal_lengths", "main", "write_sample_corpus", "write_sample_texts"]

_MAX_LIST_VALUES = np.iinfo(np.int32).max


class _Shard(NamedTuple):
    path: str
    num_docs: int
    num_tokens: int


def lognormal_lengths(
    num_docs: int, mean: float, sigma: float = 1.0, seed: int | np.random.Generator | np.random.SeedSequence = 0
) -> npt.NDArray[np.int64]:
    """``num_docs`` document lengths, (num_docs,) int64, each >= 1, with mean about ``mean``.

    Draws ``exp(N(mu, sigma))`` with ``mu = ln(mean) - sigma**2 / 2`` (so its mean is ``mean``),
    rounded; the floor at 1 raises the mean only when ``mean`` is near 1.
    """
    if num_docs < 0:
        raise ValueError(f"num_docs={num_docs} must be >= 0")
    if not mean > 0:
        raise ValueError(f"mean={mean} must be > 0")
    if not 0 <= sigma <= 4:
        raise ValueError(f"sigma={sigma} must be in [0, 4]")
    rng = np.random.default_rng(seed)
    draws = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size=num_docs)
    return np.maximum(np.rint(draws), 1).astype(np.int64)


def _random_tokens(rng: np.random.Generator, num_tokens: int, vocab_size: int, dtype: np.dtype) -> np.ndarray:
    """Uniform tokens in [0, vocab_size), drawn the same way whatever ``dtype``."""
    draw_dtype = np.uint32 if vocab_size <= 2**32 else np.int64
    return rng.integers(0, vocab_size, size=num_tokens, dtype=draw_dtype).astype(dtype, copy=False)


def _shard_documents(seed: np.random.SeedSequence, num_docs: int, mean_doc_len: float,
                     vocab_size: int, dtype: np.dtype) -> pa.ListArray:
    """One shard's documents as a ``list<dtype>`` array built from numpy offsets and values."""
    rng = np.random.default_rng(seed)
    lengths = lognormal_lengths(num_docs, mean_doc_len, seed=rng)
    offsets = np.zeros(num_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > _MAX_LIST_VALUES:
        raise ValueError(f"a shard of {offsets[-1]} tokens exceeds the 2**31-1 of an Arrow list; use more shards")
    tokens = _random_tokens(rng, int(offsets[-1]), vocab_size, dtype)
    return pa.ListArray.from_arrays(arrow_array(offsets.astype(np.int32)), arrow_array(tokens))


def _write_shard(path: str, documents: pa.ListArray, fmt: str, row_group_size: int | None) -> None:
    format_named(fmt).write(path, pa.table({"input_ids": documents}), row_group_size)


def _check_args(num_shards: int, docs_per_shard: int, mean_doc_len: float, vocab_size: int,
                fmt: str, dtype: np.dtype, row_group_size: int | None) -> None:
    if num_shards < 1:
        raise ValueError(f"num_shards={num_shards} must be >= 1")
    if docs_per_shard < 0:
        raise ValueError(f"docs_per_shard={docs_per_shard} must be >= 0")
    if not mean_doc_len > 0:
        raise ValueError(f"mean_doc_len={mean_doc_len} must be > 0")
    format_named(fmt)
    if dtype.kind not in "iu":
        raise ValueError(f"dtype={dtype.name} must be an integer dtype")
    if not 1 <= vocab_size <= int(np.iinfo(dtype).max) + 1:
        raise ValueError(f"vocab_size={vocab_size} must be in 1..{int(np.iinfo(dtype).max) + 1} for dtype {dtype.name}")
    if row_group_size is not None and row_group_size < 1:
        raise ValueError(f"row_group_size={row_group_size} must be >= 1 or None")


def _check_no_stale_shards(output_dir: str, names: Sequence[str]) -> None:
    """Refuse to leave shards of an earlier, different sample beside the new ones."""
    shard_name = re.compile(rf"shard-\d{{5,}}\.({'|'.join(map(re.escape, FORMATS))})")
    stale = sorted(n for n in os.listdir(output_dir) if shard_name.fullmatch(n) and n not in names)
    if stale:
        raise InputError(
            f"{output_dir} already holds other shards ({', '.join(stale[:3])}{', ...' if len(stale) > 3 else ''}); "
            "remove them or choose another output directory"
        )


def _write_corpus(output_dir: str, *, num_shards: int, docs_per_shard: int, mean_doc_len: float,
                  vocab_size: int, seed: int, fmt: str, dtype: npt.DTypeLike,
                  row_group_size: int | None) -> list[_Shard]:
    dtype = np.dtype(dtype)
    _check_args(num_shards, docs_per_shard, mean_doc_len, vocab_size, fmt, dtype, row_group_size)
    os.makedirs(output_dir, exist_ok=True)
    names = [f"shard-{k:05d}.{fmt}" for k in range(num_shards)]
    _check_no_stale_shards(output_dir, names)
    shards = []
    for name, shard_seed in zip(names, np.random.SeedSequence(seed).spawn(num_shards)):
        documents = _shard_documents(shard_seed, docs_per_shard, mean_doc_len, vocab_size, dtype)
        path = os.path.join(output_dir, name)
        _write_shard(path, documents, fmt, row_group_size)
        shards.append(_Shard(path, len(documents), documents.offsets[-1].as_py()))
    return shards


def write_sample_corpus(
    output_dir: str,
    *,
    num_shards: int,
    docs_per_shard: int,
    mean_doc_len: float,
    vocab_size: int = 50_000,
    seed: int = 0,
    fmt: str = "parquet",
    dtype: npt.DTypeLike = "int32",
    row_group_size: int | None = None,
) -> list[str]:
    """Write ``num_shards`` shards ``shard-00000.{fmt}``, ... into ``output_dir``; return their paths.

    Column ``input_ids``: list<dtype>, ``docs_per_shard`` documents per shard with log-normal
    lengths of mean ``mean_doc_len`` and random tokens in ``[0, vocab_size)``; deterministic
    for ``seed``. ``row_group_size`` sets rows per Parquet row group / Arrow record batch
    (JSONL ignores it). Existing shards of the same names are overwritten; other
    ``shard-*`` files in the directory raise InputError.
    """
    shards = _write_corpus(output_dir, num_shards=num_shards, docs_per_shard=docs_per_shard,
                           mean_doc_len=mean_doc_len, vocab_size=vocab_size, seed=seed, fmt=fmt,
                           dtype=dtype, row_group_size=row_group_size)
    return [s.path for s in shards]


# ----------------------------------------------------------------------------- text mode

TEXT_WORDS = (
    "the", "of", "and", "a", "to", "in", "is", "data", "model", "token", "packing", "context", "window",
    "def", "return", "import", "42", "3.14", "(x)", "=", ",", ".", "\n",
    "café", "naïve", "Ωμέγα", "Кириллица", "東京", "日本語", "我爱北京", "한국어", "😀", "🎉", "👍🏽",
    "مرحبا", "العربية", "שלום", "עברית",
)
"""Words of the sample text: mostly English, some code, and non-ASCII (accents, Greek, Cyrillic,
CJK, emoji, right-to-left scripts)."""


def _shard_texts(seed: np.random.SeedSequence, num_docs: int, mean_doc_words: float) -> pa.StringArray:
    """One shard's documents: log-normal word counts of uniformly drawn TEXT_WORDS, space-joined."""
    rng = np.random.default_rng(seed)
    lengths = lognormal_lengths(num_docs, mean_doc_words, seed=rng)
    words = np.array(TEXT_WORDS, dtype=object)[rng.integers(0, len(TEXT_WORDS), size=int(lengths.sum()))]
    return pa.array([" ".join(doc) for doc in np.split(words, np.cumsum(lengths)[:-1])] if num_docs else [],
                    pa.string())


def write_sample_texts(output_dir: str, *, num_shards: int, docs_per_shard: int, mean_doc_words: float,
                       seed: int = 0, fmt: str = "parquet") -> list[str]:
    """Write ``num_shards`` text shards ``shard-00000.{fmt}``, ... (Parquet or JSONL, column/key
    ``text``) into ``output_dir``, for ``raypack tokenize`` and ``raypack pack --tokenizer``;
    deterministic for ``seed``. Returns their paths."""
    if not format_named(fmt).holds_text:
        raise ValueError(f"fmt={fmt!r} must be one of {', '.join(n for n, f in FORMATS.items() if f.holds_text)} "
                         "for text")
    _check_args(num_shards, docs_per_shard, mean_doc_words, 2, fmt, np.dtype("int32"), None)
    os.makedirs(output_dir, exist_ok=True)
    names = [f"shard-{k:05d}.{fmt}" for k in range(num_shards)]
    _check_no_stale_shards(output_dir, names)
    paths = []
    for name, shard_seed in zip(names, np.random.SeedSequence(seed).spawn(num_shards)):
        texts = _shard_texts(shard_seed, docs_per_shard, mean_doc_words)
        path = os.path.join(output_dir, name)
        format_named(fmt).write(path, pa.table({"text": texts}))
        paths.append(path)
    return paths


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m raypack.sample",
                                     description="Write a sample sharded corpus of random tokens.")
    parser.add_argument("--output", required=True, help="directory to write the shards into")
    parser.add_argument("--shards", type=int, required=True, help="number of shards")
    parser.add_argument("--docs-per-shard", type=int, required=True, help="documents per shard")
    parser.add_argument("--context-length", type=int, required=True, help="context length the corpus is meant for")
    parser.add_argument("--mean-doc-len", type=float, default=None,
                        help="mean document length (default: context length / 3)")
    parser.add_argument("--format", choices=tuple(FORMATS), default="parquet")
    parser.add_argument("--dtype", default="int32", help="token dtype (default int32)")
    parser.add_argument("--vocab-size", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text", action="store_true",
                        help="write text (a 'text' column of words, some non-ASCII) instead of tokens; "
                             "--mean-doc-len is then in words")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; prints one summary line, returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.context_length < 1:
            raise ValueError(f"--context-length={args.context_length} must be >= 1")
        mean = args.mean_doc_len if args.mean_doc_len is not None else args.context_length / 3
        if args.text:
            paths = write_sample_texts(args.output, num_shards=args.shards, docs_per_shard=args.docs_per_shard,
                                       mean_doc_words=mean, seed=args.seed, fmt=args.format)
            print(f"wrote {len(paths)} {args.format} text shards, {len(paths) * args.docs_per_shard} documents "
                  f"to {args.output}")
            return 0
        shards = _write_corpus(args.output, num_shards=args.shards, docs_per_shard=args.docs_per_shard,
                               mean_doc_len=mean, vocab_size=args.vocab_size, seed=args.seed,
                               fmt=args.format, dtype=args.dtype, row_group_size=None)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    num_docs = sum(s.num_docs for s in shards)
    num_tokens = sum(s.num_tokens for s in shards)
    print(f"wrote {len(shards)} {args.format} shards, {num_docs} documents, {num_tokens} tokens to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
