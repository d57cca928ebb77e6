"""Where a fast backend's NFC normalizer differs from ``tokenizers``': every code point, black-box.

    PYTHONPATH=. .venv/bin/python bench/probe_nfc.py [--backends gigatoken,fastokens] [--planes 4]
        [--random 200000] [--seed 0]

A tokenizer.json whose ids are the bytes of its normalized text (a byte-level BPE with the 256 byte
tokens and no merge, an ``NFC`` normalizer) turns each library into an NFC function that can be
compared on any string. NFC is canonical decomposition, canonical ordering by combining class, and
canonical composition, so the probe asks each library, for every assigned code point ``c`` of the
first ``--planes`` planes and of plane 14 (not those unassigned in Unicode 14.0, which raypack
routes to the reference anyway; not surrogates or private use):

* its decomposition and recomposition: ``c`` alone, after a starter and before one mark;
* whether it is a starter: ``\\u4e00 \\u0301 c \\u0316`` keeps the marks apart only if it is;
* its combining class against every class Unicode 14.0 uses: ``\\u4e00 c m`` and ``\\u4e00 m c`` for
  one mark ``m`` of each class (a different class orders differently against one of them);

then every canonical composition pair of Unicode 14.0 (``L M``, ``L m M`` with a blocking and a
non-blocking mark ``m``, and the composite followed by marks; a pair that differs adds its composite
and both parts), Hangul syllables, and ``--random`` random strings of bases and marks (one in ten of
20-60 characters). Prints the code points that differ (the backend's NFC ``misread``: raypack routes
documents holding them to the reference) and exits 1 when a random string without any of them
still differs (the table would not be complete). About 5 minutes a backend.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import unicodedata

import numpy as np
import pyarrow as pa
from probe_code_points import byte_chars  # bench/, beside this script

from raypack.tokenize.backends import BACKENDS
from raypack.tokenize.backends.gigatoken import GigatokenEncoder
from raypack.tokenize.backends.unassigned import UNASSIGNED
from raypack.tokenize.tokenizers import load_tokenizer

BASE = "\u4e00"
"""A starter that composes with nothing."""


def _bytes_config() -> dict:
    """A byte-level BPE of the 256 byte tokens (GPT-2's byte-to-character table) and no merge, with NFC:
    its ids are the bytes of the normalized text."""
    chars = byte_chars()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": {"type": "NFC"},
            "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {chars[b]: b for b in range(256)}, "merges": []}}


def code_points(planes: int) -> list[int]:
    unassigned = np.zeros(0x110000, dtype=bool)
    for first, last in UNASSIGNED:
        unassigned[first:last + 1] = True
    candidates = [*range(min(planes, 14) << 16), *range(0xE0000, 0xE1000)]
    return [cp for cp in candidates if not unassigned[cp] and not 0xD800 <= cp <= 0xDFFF
            and not 0xE000 <= cp <= 0xF8FF]


def class_marks() -> dict[int, list[str]]:
    """The marks of each nonzero canonical combining class of Unicode 14.0 (Python's unicodedata), in
    code point order, less those with a decomposition."""
    marks: dict[int, list[str]] = {}
    for cp in range(0x110000):
        ccc = unicodedata.combining(chr(cp))
        if ccc and not unicodedata.decomposition(chr(cp)):
            marks.setdefault(ccc, []).append(chr(cp))
    return marks


def composition_pairs() -> list[tuple[str, str, str]]:
    """(composite, first, second) for every two-character canonical decomposition of Unicode 14.0."""
    pairs = []
    for cp in range(0x110000):
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<"):
            parts = [chr(int(x, 16)) for x in d.split()]
            if len(parts) == 2:
                pairs.append((chr(cp), *parts))
    return pairs


def _differ(want_flat, got_flat) -> np.ndarray:
    """Per string: whether the two libraries' ids differ."""
    wl, gl = np.diff(want_flat.offsets), np.diff(got_flat.offsets)
    out = wl != gl
    same = np.flatnonzero(~out)
    wv, gv = want_flat.values, got_flat.values
    wo, go = want_flat.offsets, got_flat.offsets
    if np.array_equal(wl, gl) and np.array_equal(wv, gv):
        return out
    for k in same:
        if not np.array_equal(wv[wo[k]:wo[k + 1]], gv[go[k]:go[k + 1]]):
            out[k] = True
    return out


def _raw_gigatoken(spec: str) -> GigatokenEncoder:
    """gigatoken's own encoder of ``spec``, without raypack's shape check (raypack refuses NFC) or routing."""
    import gigatoken

    return GigatokenEncoder(lambda: gigatoken.Tokenizer(spec))


def compare(reference, encoder, texts: list[str]) -> np.ndarray:
    array = pa.array(texts, pa.large_string())
    return _differ(reference.encode_flat(array), encoder.encode_flat(array))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="gigatoken,fastokens")
    parser.add_argument("--planes", type=int, default=4)
    parser.add_argument("--random", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cps = code_points(args.planes)
    probed = set(cps)
    chars = [chr(cp) for cp in cps]
    marks = class_marks()
    pairs = composition_pairs()
    contexts = ["{c}", BASE + "{c}", "{c}\u0301", "{c}\u0316", "{c}\u093c", "{c}\u3099", "{c}\u0334",
                BASE + "\u0301{c}\u0316"]
    failures = 0
    with tempfile.TemporaryDirectory() as directory:
        spec = os.path.join(directory, "nfc_bytes.json")
        with open(spec, "w") as f:
            json.dump(_bytes_config(), f)
        reference = load_tokenizer(spec)
        for backend in args.backends.split(","):
            try:
                encoder = _raw_gigatoken(spec) if backend == "gigatoken" else BACKENDS[backend].encoder(reference)
            except Exception as e:  # refused or not installed
                print(f"{backend}: skipped ({str(e).splitlines()[0][:120]})", flush=True)
                continue
            start, found = time.perf_counter(), {}
            for context in contexts:
                differ = compare(reference, encoder, [context.replace("{c}", c) for c in chars])
                for k in np.flatnonzero(differ):
                    found.setdefault(cps[k], context)
            # then each class, by a mark both read alike (a class only newer marks have is not tested:
            # those marks are found above, and a code point of that class differs against another class)
            agreed = {ccc: next((m for m in ms if ord(m) in probed and ord(m) not in found), None)
                      for ccc, ms in marks.items()}
            skipped = sorted(ccc for ccc, m in agreed.items() if m is None)
            class_contexts = [BASE + "{c}" + m for m in agreed.values() if m] + \
                [BASE + m + "{c}" for m in agreed.values() if m]
            for context in class_contexts:
                differ = compare(reference, encoder, [context.replace("{c}", c) for c in chars])
                for k in np.flatnonzero(differ):
                    found.setdefault(cps[k], context)
            contexts_run = len(contexts) + len(class_contexts)
            print(f"{backend}: classes without a mark both read alike: {skipped}", flush=True)
            print(f"{backend}: {len(cps):,} code points x {contexts_run} contexts: {len(found)} differ "
                  f"({time.perf_counter() - start:.0f}s)", flush=True)
            # composition pairs: L M, L m M (blocked by a mark of class >= M's when M is a mark), P m, m-led
            texts, owners = [], []
            for composite, first, second in pairs:
                for text in (first + second, first + "\u0316" + second, first + "\u0301" + second,
                             composite + "\u0316", composite + "\u0301", BASE + first + second, second + first):
                    texts.append(text)
                    owners.append({ord(composite), ord(first), ord(second)})
            hangul = [chr(0x1100 + lead) + chr(0x1161 + vowel) + (chr(0x11A7 + tail) if tail else "")
                      for lead in range(0, 19, 3) for vowel in range(0, 21, 4) for tail in range(0, 28, 5)]
            hangul += [chr(0xAC00 + k) + chr(0x11A8 + t) for k in range(0, 11172, 97) for t in range(0, 27, 6)]
            texts += hangul
            owners += [set(map(ord, h)) for h in hangul]
            differ = compare(reference, encoder, texts)
            pair_found = [k for k in np.flatnonzero(differ) if not owners[k] & set(found)]
            for k in pair_found:  # a composition one library lacks: its composite and both parts are misread
                print(f"  composition differs: {' '.join(f'U+{ord(c):04X}' for c in texts[k])}", flush=True)
                for cp in owners[k] - {ord(BASE), 0x0316, 0x0301}:
                    found.setdefault(cp, f"composition {texts[k]!r}")
            print(f"{backend}: {len(pairs):,} composition pairs, {len(hangul)} Hangul strings: "
                  f"{int(differ.sum())} differ, {len(pair_found)} with no code point found above", flush=True)
            # random strings of bases and marks, without the found code points
            rng = random.Random(args.seed)
            alphabet = [c for c in chars if ord(c) not in found]
            markish = [c for c in alphabet if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Mc", "Me")]
            composers = sorted({c for _, a, b in pairs for c in (a, b) if ord(c) not in found})
            strings = []
            for k in range(args.random):
                n = rng.randint(20, 60) if k % 10 == 0 else rng.randint(1, 8)
                strings.append("".join(rng.choice(markish if r < 0.5 else composers if r < 0.8 else alphabet)
                                       for r in (rng.random() for _ in range(n))))
            differ = compare(reference, encoder, strings)
            for k in np.flatnonzero(differ)[:10]:
                print(f"  random string differs: {' '.join(f'U+{ord(c):04X}' for c in strings[k])}", flush=True)
            failures += int(differ.sum())
            print(f"{backend}: {len(strings):,} random strings without them: {int(differ.sum())} differ", flush=True)
            ranges = []
            for cp in sorted(found):
                if ranges and cp == ranges[-1][1] + 1:
                    ranges[-1][1] = cp
                else:
                    ranges.append([cp, cp])
            print(f"{backend} NFC misread ({len(found)} code points, {len(ranges)} ranges):")
            print("    " + ", ".join(f"(0x{a:04X}, 0x{b:04X})" for a, b in ranges))
            for cp in sorted(found)[:400]:
                print(f"    U+{cp:04X} {unicodedata.name(chr(cp), '?')} ccc={unicodedata.combining(chr(cp))} "
                      f"first in {found[cp]!r}")
    print(f"{failures} differences not explained by the misread code points")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
