"""The fastokens backend (PyPI ``fastokens``, Rust, Apache-2.0): BPE from a ``tokenizer.json`` with
the Split regexes it is proven on, Digits and the common normalizers; and the tiktoken encodings.

What it is taken for is what tests/tokenize/test_tokenize_backends.py proves token for token
(:func:`inexact` refuses the rest, naming it, so ``auto`` falls back): a BPE model without
dropout; normalizers NFC, Lowercase, Prepend, Replace and Sequences of them; pre-tokenizers
ByteLevel, Split, Digits and Sequences of them, every regex among them one of
:data:`PROVEN_REGEXES` (fastokens refuses Metaspace, WhitespaceSplit, Punctuation, NFKC, NFD ...
itself); no pre-tokenizer only with ``byte_fallback`` (without it, fastokens' ids differ).
tiktoken semantics are ``encode_ordinary``: ``split_special_tokens``, so ``<|endoftext|>`` in a
text is ordinary text.

Ids without Python lists: fastokens takes Python strs (one per document: the Arrow strings are
decoded once, 0.3-0.7 ns a byte) and returns the ids as one little-endian uint32 buffer and n + 1
uint64 offsets, which numpy views without a copy. Its thread pool (FASTOKENS_BPE_THREADS) runs
with the GIL released. Its memory does not grow with the text it has seen (no pretoken table:
flat at ~320 MiB over 350 MB of distinct random words, BENCHMARKS.md).
"""

from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raypack.errors import InputError
from raypack.rules.arrays import arrow_array, numpy_values
from raypack.tokenize.backends.base import (
    LLAMA3_SPLIT,
    QWEN2_SPLIT,
    QWEN_MARKS_SPLIT,
    Unsupported,
    added_tokens_with_content,
    package_version,
    part_types,
    parts,
    rank_file_on_disk,
    tiktoken_ranks,
    tokenizer_json,
)
from raypack.tokenize.backends.new_characters import replace_documents
from raypack.tokenize.tokenizers import TEXT_EXTRA, TIKTOKEN_ENCODINGS, FlatIds, TextTokenizer, check_texts

NORMALIZERS = {"NFC", "Lowercase", "Prepend", "Replace", "Sequence"}
PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Sequence"}
PROVEN_REGEXES = frozenset({
    LLAMA3_SPLIT,
    QWEN2_SPLIT,
    QWEN_MARKS_SPLIT,
    TIKTOKEN_ENCODINGS["o200k_base"]["pat_str"],  # o200k's, as a tokenizer.json writes it
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",  # GPT-2's, as a Split
    r"\p{N}{1,3}",  # digits in threes (DeepSeek's first Split)
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",  # DeepSeek's second: CJK and kana runs
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",  # DeepSeek's third (CR, LF as themselves)
    " +",  # a Replace normalizer's runs of spaces
})
"""The regexes (Split patterns, Replace patterns) fastokens is taken for: those
bench/probe_code_points.py proves on every code point of planes 0-3 and 14 (but its ``misread``).
fastokens' generic regex engine and ``tokenizers``' Oniguruma read many others differently (two
hostile trials): ``{n,m}+`` (possessive against a repeated interval: cl100k's regex in a
tokenizer.json, any run of 4+ digits), ``^``/``$`` (line anchors in Oniguruma's Ruby syntax),
``(?m)`` (dot-all there), ``\\h`` (a hex digit there), ``\\v``, POSIX classes, script properties,
``\\w``/``\\b`` on spacing marks, ``(?i)`` with full case folding (ß, ligatures)."""


class FastokensBackend:
    name = "fastokens"
    summary = ("fastokens (Rust): BPE tokenizer.json with a Split regex it is proven on (Llama 3's, Qwen 2's, "
               "GPT-2's, o200k's, DeepSeek V3's), Digits, common normalizers; tiktoken")
    batch_bytes = 16 << 20
    """Flat uint32 ids plus the documents as Python strs: ~2-3 bytes per byte of text."""

    thread_env = ("FASTOKENS_BPE_THREADS",)
    """fastokens' own pool (it does not read RAYON_NUM_THREADS)."""
    misread = ((0x017F, 0x017F), (0x180E, 0x180E))
    """U+017F (its Llama 3 and Qwen 2 matchers leave ``'ſ`` out of ``(?i:'s)``) and U+180E (its generic
    regex engine counts it as ``\\s``): raypack.tokenize.backends.new_characters; the only ones
    bench/probe_code_points.py finds."""

    def version(self) -> str | None:
        return package_version("fastokens")

    def slower_for(self, tokenizer: TextTokenizer) -> str | None:
        return None

    def encoder(self, tokenizer: TextTokenizer) -> FastokensEncoder:
        fastokens = _import()
        if tokenizer.kind == "hf":
            data, config = tokenizer_json(tokenizer, inexact, self.name)
            try:
                loaded = fastokens.Tokenizer.from_json_str(data.decode("utf-8"))
            except (ValueError, RuntimeError) as e:
                raise Unsupported(" ".join(str(e).split())[:200]) from e
            loaded.no_truncation()
            loaded.no_padding()
            byte_text = bool((config.get("model") or {}).get("byte_fallback") and _vocabulary_byte_tokens(config))
            return FastokensEncoder(loaded, split_special_tokens=False,
                                    reference=tokenizer.encode_flat if byte_text else None)
        if tokenizer.kind == "tiktoken" and tokenizer.name in TIKTOKEN_ENCODINGS:
            return FastokensEncoder(_load_tiktoken(fastokens, tokenizer.name, tokenizer.rank_file),
                                    split_special_tokens=True)
        raise Unsupported(f"no {tokenizer.kind} tokenizer {tokenizer.identity().get('name', '')}")


def inexact(config: dict[str, Any]) -> str | None:
    """Why fastokens may give other ids than ``tokenizers``; None for the shapes the tests prove."""
    model = config.get("model") or {}
    if model.get("type") != "BPE":
        return f"model {model.get('type')}; fastokens is proven exact with BPE"
    normalizer, pre = config.get("normalizer"), config.get("pre_tokenizer")
    for kind in part_types(normalizer, "normalizers"):
        if kind not in NORMALIZERS:
            return f"normalizer {kind}; fastokens is proven exact with {', '.join(sorted(NORMALIZERS))}"
    for kind in part_types(pre, "pretokenizers"):
        if kind not in PRE_TOKENIZERS:
            return f"pre-tokenizer {kind}; fastokens is proven exact with {', '.join(sorted(PRE_TOKENIZERS))}"
    if pre is None and not model.get("byte_fallback"):
        return "no pre-tokenizer without byte_fallback, where fastokens' ids differ"
    if not model.get("byte_fallback") and "ByteLevel" not in part_types(pre, "pretokenizers"):
        return ("a BPE neither byte-level (ByteLevel) nor with byte_fallback: tokenizers merges across a character "
                "outside the vocabulary, which it drops, and fastokens does not ('>' U+0338 '<')")
    unmerged = _token_over_a_missing_character(model, config)
    if unmerged:
        return unmerged
    for pattern in _regexes(normalizer) + _regexes(pre):
        if pattern not in PROVEN_REGEXES:
            return (f"the regex {pattern[:48]!r}{'...' if len(pattern) > 48 else ''}, not one fastokens is proven "
                    "to read as tokenizers' Oniguruma does (Llama 3's, Qwen 2's, o200k's, GPT-2's, DeepSeek V3's)")
    return None


def _token_over_a_missing_character(model: dict[str, Any], config: dict[str, Any]) -> str | None:
    """With ``byte_fallback``, a vocabulary token holding a character that is no token of its own (``日本`` without
    ``日``; ``<s>`` without ``<``, as a trainer makes a special token) where the model may meet that token's text:
    ``tokenizers`` encodes the character as its byte tokens and never merges across it, fastokens takes the whole
    token (a hostile trial: Llama 2's and Gemma's shapes with such a vocabulary, wrong ids in a real run). None
    where every character of every such token is a token (as in a SentencePiece vocabulary, whose pieces are
    merges of characters)."""
    vocab = model.get("vocab")
    if not model.get("byte_fallback") or not isinstance(vocab, dict):
        return None
    single = {t for t in vocab if isinstance(t, str) and len(t) == 1}
    unnormalized = {t["content"] for t in added_tokens_with_content(config)  # single_word: not inside a word
                    if not t.get("normalized", True) and not t.get("single_word")}
    for token in vocab:
        if not isinstance(token, str) or len(token) < 2 or BYTE_TOKEN.fullmatch(token):
            continue
        if token in unnormalized and _normalizer_cannot_make(token, config.get("normalizer")):
            continue  # its text is always taken as the added token before the model sees it
        missing = next((c for c in token if c not in single), None)
        if missing is not None:
            return (f"the vocabulary token {token!r} holds {missing!r}, which is no token of its own: tokenizers "
                    "encodes that character as its byte tokens, fastokens as the whole token")
    return None


def _normalizer_cannot_make(token: str, normalizer: Any) -> bool:
    """Whether ``normalizer`` never makes ``token``'s text where the text did not hold it: every part a Prepend or a
    Replace whose inserted text shares no character with the token (a Replace by nothing joins what was apart,
    Lowercase makes ``<s>`` of ``<S>``)."""
    for part in parts(normalizer, "normalizers"):
        kind = part.get("type")
        if kind == "Sequence":
            continue
        inserted = part.get("prepend") if kind == "Prepend" else part.get("content") if kind == "Replace" else None
        if not isinstance(inserted, str) or not inserted or set(inserted) & set(token):
            return False
    return True


BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")
"""A byte fallback token's text."""

BYTE_TOKEN_TEXT = "<0x"
"""What every byte token's text begins with: a document that holds it goes to the reference (FastokensEncoder)."""


def _vocabulary_byte_tokens(config: dict[str, Any]) -> str | None:
    """The first byte token (``<0x41>``) of the model's vocabulary that is not an added token, else None. A
    hostile trial: fastokens matched the text "a<0x41>b" as the byte token, where tokenizers encodes the
    characters ('<' '0' 'x' ...; a byte fallback each where they are not in the vocabulary)."""
    vocab = (config.get("model") or {}).get("vocab")
    added = {t.get("content") for t in config.get("added_tokens") or () if isinstance(t, dict)}
    if not isinstance(vocab, dict):
        return None
    return next((f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" in vocab and f"<0x{b:02X}>" not in added), None)


def _regexes(part: Any) -> list[str]:
    """Every ``{"Regex": pattern}`` in a normalizer or pre-tokenizer and the parts nested in it."""
    if isinstance(part, dict):
        found = [part["Regex"]] if isinstance(part.get("Regex"), str) else []
        return found + [p for value in part.values() for p in _regexes(value)]
    if isinstance(part, list):
        return [p for value in part for p in _regexes(value)]
    return []


def _import() -> Any:
    try:
        import fastokens
    except ImportError as e:
        raise InputError(f"the fastokens backend does not import ({e}); {TEXT_EXTRA}") from e
    return fastokens


def _load_tiktoken(fastokens: Any, name: str, rank_file) -> Any:
    """fastokens reads an uncompressed rank file from a path: the checked contents go to a temporary file."""
    with rank_file_on_disk(name, tiktoken_ranks(name, rank_file)) as path:
        try:
            return fastokens.Tokenizer.from_tiktoken(path, encoding=name)
        except (ValueError, RuntimeError) as e:
            raise Unsupported(" ".join(str(e).split())[:200]) from e


class FastokensEncoder:
    """``encode_flat`` through ``fastokens.Tokenizer.encode_batch_flat``. ``reference``: given where the
    tokenizer's byte tokens are in its vocabulary only (Llama 2's and Mistral's files), the encoder of the
    documents that hold BYTE_TOKEN_TEXT: fastokens reads the text "<0x41>" as the byte token <0x41>,
    ``tokenizers`` as the characters '<' '0' 'x' ... (a hostile trial). Only such documents go to it."""

    def __init__(self, tokenizer: Any, *, split_special_tokens: bool,
                 reference: Callable[[pa.Array], FlatIds] | None = None) -> None:
        self.tokenizer = tokenizer
        self.split_special_tokens = split_special_tokens
        self.reference = reference

    def encode_flat(self, texts: pa.StringArray | pa.LargeStringArray) -> FlatIds:
        check_texts(texts)
        if len(texts) == 0:
            return FlatIds(np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64))
        ids, offsets = self.tokenizer.encode_batch_flat(texts.to_pylist(),
                                                       split_special_tokens=self.split_special_tokens)
        flat = FlatIds(np.frombuffer(ids, dtype="<u4"), np.frombuffer(offsets, dtype="<u8").view(np.int64))
        if self.reference is None:
            return flat
        rows = np.flatnonzero(numpy_values(pc.match_substring(texts, BYTE_TOKEN_TEXT)))
        return flat if rows.size == 0 else replace_documents(flat, rows, self.reference(texts.take(arrow_array(rows))))
