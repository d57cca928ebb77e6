"""Every code point through each fast backend, against the reference library: which ones it reads otherwise.

    PYTHONPATH=. .venv/bin/python bench/probe_code_points.py [--backends gigatoken,fastokens]
        [--shapes gpt2,...] [--planes 4] [--contexts "'{c}|({c}<|..."]

Run it when a backend's version changes. Each code point of the first ``--planes`` planes and of
plane 14 (less surrogates, private use and those unassigned in Unicode 14.0, which raypack routes to
the reference anyway) is encoded in each context (``{c}`` is the code point) by the reference library and by the
backend's own encoder (no routing), for:

* tokenizer.json shapes (``--shapes``): GPT-2's ByteLevel (and + NFC); Split regexes: Llama 3, Qwen 2
  (and + NFC), Qwen's variant with marks, o200k, GPT-2's as a Split, DeepSeek V3's three, digits in
  threes, a case-insensitive one, cl100k's. Their BPE merges every pair of bytes, so that any
  difference in pre-tokenization shows in the ids;
* SentencePiece-style shapes (``sp ...``): a BPE with ``byte_fallback``, no pre-tokenizer and
  Llama 2's normalizer (Prepend and Replace of "\u2581"), or Metaspace (prepend "first", split or
  not). In ``sp ...`` every probed code point falls back to its bytes; in ``sp ... known`` each is
  in the vocabulary, with a merge after "\u2581" and one with itself, so that how the backend cuts
  the text into characters around it shows in the ids;
* tiktoken's cl100k_base and o200k_base (their own ranks).

A code point where the ids differ outside the backend's ``misread`` (raypack.tokenize.backends.
new_characters) is a finding: the script prints each and exits 1. A shape the backend refuses is
skipped. About 5 s per shape and context set on this VM, 1-2 min per tiktoken encoding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from raypack.tokenize.backends import BACKENDS, load_backed_tokenizer
from raypack.tokenize.backends.unassigned import UNASSIGNED
from raypack.tokenize.tokenizers import TIKTOKEN_ENCODINGS, load_tokenizer

CONTEXTS = ["'{c}", "x'{c} ", "'{c}{c}", "{c}'S", "({c}<", "a{c}b", " {c} ", "\n{c}\n", "1{c}'s", "{c}1234", "A{c}a",
            "{c}{c}", "{c}\n", "\n{c}", "{c} ", " {c}", "9{c}9", "a{c}'ll", ". {c}.", "{c}\r\n", "\t{c}\t", "{c}'{c}",
            "{c}/x\n/", "x{c}{c}Y"]
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
QWEN_MARKS = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
DEEPSEEK = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
            "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]
"""DeepSeek V3's three Splits, as its tokenizer.json decodes (CR and LF as the characters themselves)."""
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _split(*patterns: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        *({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
          for pattern in patterns),
        {**BYTE_LEVEL, "use_regex": False}]}


SHAPES = {
    "gpt2": (BYTE_LEVEL, None), "gpt2 NFC": (BYTE_LEVEL, {"type": "NFC"}), "llama3": (_split(LLAMA3), None),
    "o200k": (_split(TIKTOKEN_ENCODINGS["o200k_base"]["pat_str"]), None), "qwen2": (_split(QWEN2), None),
    "qwen2 NFC": (_split(QWEN2), {"type": "NFC"}), "qwen marks": (_split(QWEN_MARKS), None),
    "gpt2 split": (_split(GPT2), None), "digits": (_split(r"\p{N}{1,3}"), None), "deepseek": (_split(*DEEPSEEK), None),
    "case-insensitive": (_split(r"'(?i:[sdmt]|ll|ve|re)|[^']+|'"), None),
    "cl100k split": (_split(TIKTOKEN_ENCODINGS["cl100k_base"]["pat_str"]), None),
}


SP_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
SP_SHAPES = {
    "sp llama2": (None, SP_NORMALIZER),
    "sp metaspace": ({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}, None),
    "sp metaspace split": ({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
                           None),
}
"""SentencePiece-style shapes: (pre-tokenizer, normalizer); each also as ``NAME known``."""


def _sentencepiece_config(pre: dict | None, normalizer: dict | None, known: list[int]) -> dict:
    """A BPE with byte_fallback over printable ASCII and "\u2581" (every pair of them merged), the
    byte tokens, and ``known`` code points, each with merges "\u2581"+c and c+c."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    base = ["\u2581", *map(chr, range(0x21, 0x7F))]
    merges = []
    for ch in base:
        vocab.setdefault(ch, len(vocab))
    for a in base:
        for b in base:
            vocab.setdefault(a + b, len(vocab))
            merges.append([a, b])
    for cp in known:
        c = chr(cp)
        if c in vocab:
            continue
        vocab[c] = len(vocab)
        for a, b in (("\u2581", c), (c, c)):
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append([a, b])
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for i, t in enumerate(["<unk>", "<s>", "</s>"])],
            "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}


def byte_chars() -> dict[int, str]:
    """GPT-2's byte-to-character table (ByteLevel's): byte -> the character that stands for it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


def _byte_pairs_config(pre: dict, normalizer: dict | None) -> dict:
    """A byte-level BPE whose merges are all 65,536 byte pairs (GPT-2's byte-to-character table)."""
    chars = byte_chars()
    vocab = {chars[b]: b for b in range(256)}
    merges = []
    for a in range(256):
        for b in range(256):
            vocab[chars[a] + chars[b]] = len(vocab)
            merges.append(f"{chars[a]} {chars[b]}")
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": normalizer,
            "pre_tokenizer": pre, "post_processor": None, "decoder": BYTE_LEVEL,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": merges}}


def _differing(reference, encoder, code_points: list[int], context: str) -> list[int]:
    texts = pa.array([context.format(c=chr(cp)) for cp in code_points])
    want, got = reference.encode_flat(texts), encoder.encode_flat(texts)
    want_lengths, got_lengths = np.diff(want.offsets), np.diff(got.offsets)
    if np.array_equal(want_lengths, got_lengths) and np.array_equal(want.values, got.values):
        return []
    def ids(flat, k):
        return flat.values[flat.offsets[k]:flat.offsets[k + 1]]

    return [cp for k, cp in enumerate(code_points)
            if want_lengths[k] != got_lengths[k] or not np.array_equal(ids(want, k), ids(got, k))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="gigatoken,fastokens")
    parser.add_argument("--shapes", default=",".join([*SHAPES, *SP_SHAPES, *(f"{k} known" for k in SP_SHAPES),
                                                      "tiktoken:cl100k_base", "tiktoken:o200k_base"]))
    parser.add_argument("--planes", type=int, default=4)
    parser.add_argument("--contexts", default="|".join(CONTEXTS), help="'|'-separated, {c} the code point")
    args = parser.parse_args()
    unassigned = np.zeros(0x110000, dtype=bool)
    for first, last in UNASSIGNED:
        unassigned[first:last + 1] = True
    candidates = [*range(min(args.planes, 14) << 16), *range(0xE0000, 0xE1000)]  # and plane 14's tags, selectors
    code_points = [cp for cp in candidates
                   if not unassigned[cp] and not 0xD800 <= cp <= 0xDFFF and not 0xE000 <= cp <= 0xF8FF]
    contexts = args.contexts.split("|")
    findings = 0
    with tempfile.TemporaryDirectory() as directory:
        for shape in args.shapes.split(","):
            spec = shape
            sp = shape.removesuffix(" known")
            if shape in SHAPES or sp in SP_SHAPES:
                spec = os.path.join(directory, shape.replace(" ", "_") + ".json")
                config = (_byte_pairs_config(*SHAPES[shape]) if shape in SHAPES else
                          _sentencepiece_config(*SP_SHAPES[sp], code_points if shape != sp else []))
                with open(spec, "w") as f:
                    json.dump(config, f)
            reference = load_tokenizer(spec)
            for backend in args.backends.split(","):
                try:
                    encoder = load_backed_tokenizer(spec, backend).encoder
                except Exception as e:  # refused (or not installed): nothing to probe
                    print(f"{shape} / {backend}: skipped ({str(e).splitlines()[0][:100]})", flush=True)
                    continue
                misread = BACKENDS[backend].misread + getattr(encoder, "misread", ())  # gigatoken's NFC_MISREAD
                start, found = time.perf_counter(), set()
                for context in contexts:
                    for cp in _differing(reference, encoder, code_points, context):
                        found.add(cp)
                        if not any(first <= cp <= last for first, last in misread):
                            findings += 1
                            print(f"  FINDING {shape} / {backend}: U+{cp:04X} in {context!r}", flush=True)
                print(f"{shape} / {backend}: {len(code_points):,} code points x {len(contexts)} contexts, "
                      f"{len(found)} differ ({', '.join(f'U+{cp:04X}' for cp in sorted(found)[:8])}), "
                      f"{time.perf_counter() - start:.0f}s", flush=True)
    print(f"{findings} findings outside the backends' misread")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
