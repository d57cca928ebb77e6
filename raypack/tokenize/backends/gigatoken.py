"""The gigatoken backend (PyPI ``gigatoken``, Rust, MIT): byte-level BPE and SentencePiece-style BPE
with byte fallback from a ``tokenizer.json``, and the tiktoken encodings from their rank files.

What it cannot do is refused at load (``Unsupported``, so ``auto`` falls back to the reference):
gigatoken itself raises for a normalizer, a pre-tokenizer (its pre-tokenizers are hand-written
equivalents of the known split regexes) or a model it lacks (WordPiece, Unigram, ...). But it also
loads shapes it then encodes differently from ``tokenizers`` (it keeps a Sequence's one Split and
drops the rest, ignores a Split's behavior, ByteLevel's flags beside a Split, and a subword
prefix or suffix): so this module takes a ``tokenizer.json`` only in the shapes
tests/tokenize/test_tokenize_backends.py proves token for token (:func:`inexact`), and refuses
every other one, naming what is outside them.

Ids without Python lists: the texts go in as an awkward array over the Arrow buffers (offsets
widened to int64, the UTF-8 bytes borrowed), the ids come back as an awkward list array whose
offsets and uint32 content are numpy arrays. tiktoken semantics are ``encode_ordinary``: the
rank file is loaded without special tokens, so ``<|endoftext|>`` in a text is ordinary text.

Memory: gigatoken memoizes the encoding of every short (<= 15 byte) pretoken it meets, in a
table per tokenizer that only grows (measured: +176 MiB over the 386 MB of distinct real text of
BENCHMARKS.md's one-pass corpus, and ~6 bytes per byte of text made of distinct random words,
which would take a long-running worker to any size). So a :class:`GigatokenEncoder` loads a fresh
tokenizer, from the bytes it first loaded (never the file again), once this process has grown by
more than ``cache_budget`` (CACHE_BUDGET, 1 GiB) since its tokenizer's first encode: the table is
freed, and the worker's memory stays within that budget (plus one call's growth) of where the
first encode left it, whatever the text. The ids do not change; the fresh table is cold, so the
next pieces encode ~25% slower until it warms.

Threads: gigatoken's process-global Rayon pool (RAYON_NUM_THREADS, set per worker by
:func:`raypack.tokenize.backends.set_thread_env`); inside a multiprocessing worker or a forked child
it encodes on the calling thread (gigatoken's own rule), which gives the same ids. Where that pool
would have one thread (a Ray actor given one CPU: ``rayon_threads``; a one-core machine), a call
encodes on the calling thread too (``parallel=False``): the same ids, 12-24% less CPU than
handing the call to a one-thread pool (BENCHMARKS.md, "the encoder's two paths"). That path
holds the GIL for the call, which is why it is not taken where the pool has threads to share.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from raypack.errors import InputError
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
from raypack.tokenize.tokenizers import (
    TEXT_EXTRA,
    TIKTOKEN_ENCODINGS,
    FlatIds,
    TextTokenizer,
    check_texts,
    text_offsets,
)

log = logging.getLogger(__name__)

PRETOKENIZERS = {"cl100k_base": "gpt4", "o200k_base": "o200k"}
"""gigatoken's name for the split pattern of each tiktoken encoding raypack knows."""

PROVEN_SPLITS = frozenset({
    LLAMA3_SPLIT,
    QWEN2_SPLIT,
    QWEN_MARKS_SPLIT,
    TIKTOKEN_ENCODINGS["o200k_base"]["pat_str"],  # o200k's, as a tokenizer.json writes it
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+",  # o200k's without the contractions, digits one by one
    r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",  # GPT-2's, as a Split
})
"""The Split regexes gigatoken is taken for (tests/tokenize/test_tokenize_backends.py proves each token for
token). gigatoken matches a Split's regex against a list of the ones it has hand-written matchers for, and
refuses the rest; but two it knows are read otherwise than by ``tokenizers``' Oniguruma (a hostile trial,
every regex of that list tried): cl100k's ending in ``\\s+`` (``\\p{N}{1,3}+``, a repeated interval there:
any run of 4+ digits) and Llama 3's with ``\\s*[\\r\\n]`` for ``\\s*[\\r\\n]+`` (whitespace ending a document).
So a regex is taken only when it is one of these, not when gigatoken loads it."""


NFC_MISREAD: tuple[tuple[int, int], ...] = (
    (0x07FD, 0x07FD), (0x0898, 0x089F), (0x08CA, 0x08D3), (0x09FE, 0x09FE), (0x0C3C, 0x0C3C), (0x0D3B, 0x0D3C),
    (0x0EBA, 0x0EBA), (0x1715, 0x1715), (0x1ABF, 0x1ACE), (0x1DF6, 0x1DFA), (0xA82C, 0xA82C), (0x10D24, 0x10D27),
    (0x10EAB, 0x10EAC), (0x10F46, 0x10F50), (0x10F82, 0x10F85), (0x11070, 0x11070), (0x1133B, 0x1133B),
    (0x1145E, 0x1145E), (0x11839, 0x1183A), (0x11930, 0x11930), (0x11935, 0x11935), (0x11938, 0x11938),
    (0x1193D, 0x1193E), (0x11943, 0x11943), (0x119E0, 0x119E0), (0x11A34, 0x11A34), (0x11A47, 0x11A47),
    (0x11A99, 0x11A99), (0x11D42, 0x11D42), (0x11D44, 0x11D45), (0x11D97, 0x11D97), (0x16FF0, 0x16FF1),
    (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF),
)
"""Code points (inclusive ranges) gigatoken's NFC normalizes otherwise than ``tokenizers``': marks
whose canonical combining class ``tokenizers``' older Unicode tables do not have (so it leaves them
in place where gigatoken reorders them), and the parts of compositions it does not know. Found by
bench/probe_nfc.py (every code point of planes 0-3 and 14, alone, beside a mark of every combining
class and in every canonical composition of Unicode 14.0; then random strings without them: none
differs). A document holding one goes to the reference (raypack.tokenize.backends.new_characters)."""


class GigatokenBackend:
    name = "gigatoken"
    summary = "gigatoken (Rust): byte-level BPE, SentencePiece-style BPE with byte fallback, tiktoken encodings"
    batch_bytes = 16 << 20
    """Flat uint32 ids, ~1-2 bytes per byte of text: 16 MiB pieces cost ~30 MiB and make each call's
    fixed cost (the awkward arrays around it, waking the Rayon pool) small."""

    thread_env = ("RAYON_NUM_THREADS",)
    misread = ()
    """None found (bench/probe_code_points.py: every code point of planes 0-3 in 24 contexts, for the
    tokenizer.json shapes it takes and cl100k/o200k)."""

    def version(self) -> str | None:
        return package_version("gigatoken")

    def slower_for(self, tokenizer: TextTokenizer) -> str | None:
        """A BPE with no pre-tokenizer that cuts the text into words (Llama 2's and Mistral's
        SentencePiece-style tokenizer.json: a Prepend and Replace normalizer, no pre-tokenizer) merges
        over each whole document, and gigatoken does that at a quarter to a half of fastokens' speed:
        1.8 against 3.3M tok/s in `pack --tokenizer --local`, 1.5 against 6.0M in `raypack tokenize`,
        and 8.6 against 0.5 s for one 8 MiB document (BENCHMARKS.md, "stop 51"). With a pre-tokenizer
        that splits (Metaspace with ``split``), gigatoken's pretoken table makes it the fast one (22.6M
        tok/s)."""
        if tokenizer.kind != "hf":
            return None
        try:
            config = json.loads(tokenizer.path.read_bytes())
        except (OSError, ValueError):
            return None
        model = config.get("model") if isinstance(config, dict) else None
        if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
            return None
        pre = config.get("pre_tokenizer")
        if pre is None or (isinstance(pre, dict) and pre.get("type") == "Metaspace" and pre.get("split") is False):
            return ("its BPE merges over whole documents (no pre-tokenizer splits them), "
                    "where fastokens is 1.8-4x faster")
        return None

    def encoder(self, tokenizer: TextTokenizer) -> GigatokenEncoder:
        gigatoken = _import()
        if tokenizer.kind == "hf":
            data, config = tokenizer_json(tokenizer, inexact, self.name)
            encoder = GigatokenEncoder(lambda: gigatoken.Tokenizer(_load_hf(data)))
            if "NFC" in part_types(config.get("normalizer"), "normalizers"):
                encoder.misread = NFC_MISREAD
            return encoder
        if tokenizer.kind == "tiktoken" and tokenizer.name in PRETOKENIZERS:
            contents = tiktoken_ranks(tokenizer.name, tokenizer.rank_file)
            return GigatokenEncoder(lambda: gigatoken.Tokenizer(_load_tiktoken(tokenizer.name, contents)))
        raise Unsupported(f"no {tokenizer.kind} tokenizer {tokenizer.identity().get('name', '')}")


def _import() -> Any:
    try:
        import gigatoken
    except ImportError as e:
        raise InputError(f"the gigatoken backend does not import ({e}); {TEXT_EXTRA}") from e
    return gigatoken


MAX_ID = 1 << 22
"""gigatoken is not given a tokenizer with a token id of this or more: it sizes a table by the largest id (16
bytes an id: a file with id 4294967294 made it ask for 64 GiB and abort the process). Real vocabularies hold
at most a few hundred thousand ids."""


def _largest_id(config: dict[str, Any]) -> int:
    """The largest token id of the model's vocabulary and the added tokens (0 where none is an int)."""
    vocab = (config.get("model") or {}).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else []
    ids += [t.get("id") for t in config.get("added_tokens") or () if isinstance(t, dict)]
    return max((i for i in ids if isinstance(i, int) and not isinstance(i, bool)), default=0)


def inexact(config: dict[str, Any]) -> str | None:
    """Why gigatoken may give other ids than ``tokenizers`` for this tokenizer.json; None when its
    shape is one the tests prove token for token:

    * a BPE model without ``continuing_subword_prefix`` or ``end_of_word_suffix``, and no added
      token with ``single_word``;
    * byte-level (no ``byte_fallback``): the pre-tokenizer ``ByteLevel`` with ``use_regex`` (GPT-2;
      with ``add_prefix_space``, no added token that begins with whitespace), or
      ``Sequence[Split(regex, Isolated), ByteLevel(use_regex=false, add_prefix_space=false)]`` with
      a regex of :data:`PROVEN_SPLITS` (Llama 3, Qwen 2, o200k-style, GPT-2 as a Split);
    * SentencePiece-style (``byte_fallback``): no pre-tokenizer, or ``Metaspace`` (with
      ``prepend_scheme: "first"``, no normalizer that deletes characters: :func:`_first_piece_moved`);

    * (added tokens that strip whitespace are refused for every backend: ``tokenizer_json`` in base.py)
    * no merge listed twice, and no ``ignore_merges`` with ``byte_fallback`` (byte-level
      ``ignore_merges``, Llama 3's, is exact);
    * an NFC normalizer is taken: gigatoken's normalization data is another Unicode version's than
      ``tokenizers``', so the code points where they part (NFC_MISREAD) make the encoder's
      ``misread``, and documents holding one go to the reference; but not with an added token that
      is ``normalized`` (the default of ``add_tokens``): ``tokenizers`` matches it in the normalized
      text, gigatoken in the text as written (Qwen 2's added tokens are not normalized).

    Other normalizers are gigatoken's to refuse (it takes Prepend/Replace for SentencePiece style,
    and encodes those exactly)."""
    model = config.get("model") or {}
    largest = _largest_id(config)
    if largest >= MAX_ID:  # a hostile trial: id 4294967294 aborted the process (a 64 GiB allocation failed)
        return (f"its largest token id {largest:,}: gigatoken allocates a table entry for every id up to the "
                f"largest, and is taken below {MAX_ID:,}")
    if model.get("type") != "BPE":
        return None  # gigatoken refuses other models itself, naming them
    for field in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(field):
            return f"the BPE model's {field} {model[field]!r}, which gigatoken ignores"
    nfc = "NFC" in part_types(config.get("normalizer"), "normalizers")
    for token in config.get("added_tokens") or []:
        if nfc and isinstance(token, dict) and token.get("normalized", True):
            return (f"added token {token.get('content')!r} is normalized, which tokenizers matches in the NFC text "
                    "and gigatoken in the text as written (e.g. before U+0338, which composes with '>')")
        if isinstance(token, dict) and token.get("single_word"):
            return f"added token {token.get('content')!r} is single_word, which gigatoken matches differently"
    if model.get("byte_fallback") and model.get("ignore_merges"):
        return "ignore_merges with byte_fallback, which gigatoken ignores (a word in the vocabulary is merged instead)"
    counts = collections.Counter(m if isinstance(m, str) else " ".join(map(str, m)) for m in model.get("merges") or [])
    twice = next((k for k, n in counts.items() if n > 1), None)
    if twice is not None:
        return (f"the merge {twice!r} listed twice: tokenizers ranks it by its last place, gigatoken by its "
                "first")
    pre = config.get("pre_tokenizer")
    if model.get("byte_fallback"):
        if _is(pre, "Metaspace") and pre.get("prepend_scheme") == "first":
            return _first_piece_moved(config.get("normalizer"))
        if pre is None or _is(pre, "Metaspace"):
            return None
        return f"pre-tokenizer {_describe(pre)} with byte_fallback; gigatoken is proven exact with none or Metaspace"
    if _is(pre, "ByteLevel") and pre.get("use_regex", True):
        spaced = next((t["content"] for t in added_tokens_with_content(config) if t["content"][0].isspace()), None)
        if pre.get("add_prefix_space", True) and spaced is not None:
            return (f"added token {spaced!r} begins with whitespace, beside ByteLevel's add_prefix_space: gigatoken "
                    "adds the space before it matches added tokens, tokenizers after")
        return None
    if _is(pre, "Sequence"):
        steps = pre.get("pretokenizers") or []
        if (len(steps) == 2 and _is(steps[0], "Split") and "Regex" in (steps[0].get("pattern") or {})
                and steps[0].get("behavior") == "Isolated" and not steps[0].get("invert")
                and _is(steps[1], "ByteLevel") and steps[1].get("use_regex") is False
                and steps[1].get("add_prefix_space", True) is False):
            pattern = steps[0]["pattern"]["Regex"]
            if pattern in PROVEN_SPLITS:
                return None
            return (f"the Split regex {_short(pattern)}, which gigatoken is not proven to read as tokenizers does "
                    "(it is proven on Llama 3's, Qwen 2's, o200k's and GPT-2's)")
    return (f"pre-tokenizer {_describe(pre)}; gigatoken is proven exact with ByteLevel(use_regex=true), or "
            f"Split(Isolated) with a regex it is proven on, then ByteLevel(use_regex=false, add_prefix_space=false)")


def _short(pattern: Any, limit: int = 60) -> str:
    """A regex for a one-line message: repr'd, cut at ``limit`` characters."""
    text = repr(pattern)
    return text if len(text) <= limit else f"{text[:limit]}...'"


KEEPS_THE_FIRST_CHARACTER = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend", "Sequence"})
"""Normalizers that never delete a character, so the normalized text's first piece still begins where the text
does (a Replace does too where its content is not empty)."""


def _first_piece_moved(normalizer: Any) -> str | None:
    """Why Metaspace's ``prepend_scheme: "first"`` may part from ``tokenizers`` under ``normalizer``: it prepends
    the replacement only where the normalized text still begins at the original text's first character, so a
    normalizer that deletes a text's first characters (a Replace of a BOM by "", Strip) leaves it out, and
    gigatoken prepends it all the same (a hostile trial). None for a normalizer that deletes nothing."""
    for part in parts(normalizer, "normalizers"):
        kind = part.get("type")
        if kind == "Replace" and part.get("content") == "" or kind not in KEEPS_THE_FIRST_CHARACTER | {"Replace"}:
            return (f"normalizer {kind} {'by nothing ' if kind == 'Replace' else ''}beside Metaspace's prepend_scheme "
                    "\"first\": tokenizers prepends no replacement where the text's first characters are deleted, "
                    "gigatoken does")
    return None


def _is(part: Any, kind: str) -> bool:
    return isinstance(part, dict) and part.get("type") == kind


def _describe(pre: Any) -> str:
    """A pre-tokenizer in a few words: ``Sequence[Digits, Split(Isolated), ByteLevel(use_regex=false)]``."""
    if not isinstance(pre, dict):
        return "none" if pre is None else repr(pre)[:40]
    kind = pre.get("type")
    if kind == "Sequence":
        return "Sequence[" + ", ".join(_describe(p) for p in pre.get("pretokenizers") or []) + "]"
    if kind == "Split":
        return f"Split({pre.get('behavior')}{', invert' if pre.get('invert') else ''})"
    if kind == "ByteLevel":
        flags = [f"{k}={str(bool(pre.get(k, True))).lower()}" for k in ("use_regex", "add_prefix_space")]
        return f"ByteLevel({', '.join(flags)})"
    return str(kind)


def _load_hf(data: bytes) -> Any:
    from gigatoken.gigatoken_rs import load_hf_json

    try:
        return load_hf_json(data)
    except (RuntimeError, ValueError) as e:  # gigatoken's way of saying what it lacks
        raise Unsupported(" ".join(str(e).split("Location:")[0].split())) from e


def _load_tiktoken(name: str, contents: bytes) -> Any:
    """gigatoken reads an uncompressed rank file from a path: ``contents`` go to a temporary file."""
    from gigatoken.gigatoken_rs import BPETokenizer

    with rank_file_on_disk(name, contents) as path:
        try:
            return BPETokenizer.from_tiktoken(path, PRETOKENIZERS[name], {})
        except (RuntimeError, ValueError) as e:
            raise Unsupported(" ".join(str(e).split("Location:")[0].split())) from e


CACHE_BUDGET = 1 << 30
"""Bytes this process may grow by, after its gigatoken tokenizer's first encode, before a fresh one
replaces it (its pretoken table is the part that grows with the text: the module doc)."""


class GigatokenEncoder:
    """``encode_flat`` through ``gigatoken.Tokenizer.encode_batch``, no Python object per document.

    ``load()`` makes the tokenizer; it is called again, after an encode, when the process has grown
    by more than ``cache_budget`` bytes since the first encode after the last load (``rss``: this
    process's resident bytes, 0 where unknown: then the tokenizer is never replaced). So the
    process stays within ``cache_budget`` plus one call's growth (~6 bytes per byte of the call's
    text at worst) of where that first encode left it. :attr:`reloads` counts the loads after the first."""

    def __init__(self, load: Callable[[], Any], *, cache_budget: int | None = None,
                 rss: Callable[[], int] | None = None) -> None:
        self._load, self._rss = load, rss or resident_bytes
        self.misread: tuple[tuple[int, int], ...] = ()
        """Code points this tokenizer's encoder reads otherwise, beyond the backend's (NFC_MISREAD)."""
        self.cache_budget = CACHE_BUDGET if cache_budget is None else cache_budget
        self.reloads = 0
        self.tokenizer = load()
        self._baseline: int | None = None  # taken after the first encode: the pool and its buffers exist then
        self._reloading = threading.Lock()  # two calls in flight (calls_in_flight) end on two threads

    @property
    def calls_in_flight(self) -> int:
        """Encode calls worth having at once: 2 where the calls run on a Rayon pool of threads (a call's
        last long documents run on one of them, and the next call's keep the others busy: 8-10% faster,
        BENCHMARKS.md "stop 63"), 1 where a call runs on the calling thread (it holds the GIL)."""
        return 2 if pool_threads() > 1 else 1

    def encode_flat(self, texts: pa.StringArray | pa.LargeStringArray) -> FlatIds:
        """Cost: the Rust encode, plus O(n) numpy for the offsets; ids are not copied."""
        check_texts(texts)
        if len(texts) == 0:
            return FlatIds(np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64))
        strings = _awkward_strings(texts)
        parallel = None if pool_threads() > 1 else False  # None: gigatoken's own rule (see the module docstring)
        layout = self.tokenizer.encode_batch(strings, parallel=parallel).layout.to_ListOffsetArray64(True)
        flat = FlatIds(np.asarray(layout.content.data), np.asarray(layout.offsets.data))
        self._bound_cache()
        return flat

    def _bound_cache(self) -> None:
        with self._reloading:
            self._bound_cache_now()

    def _bound_cache_now(self) -> None:
        if self._baseline is None:
            self._baseline = self._rss()
            return
        grown = self._rss() - self._baseline
        if self._baseline and grown > self.cache_budget:
            log.info("gigatoken's pretoken table: this process grew by %d MiB since its tokenizer's first encode, "
                     "more than %d MiB; loading a fresh one", grown >> 20, self.cache_budget >> 20)
            self.tokenizer = None  # the old table is freed before the new tokenizer is built
            self.tokenizer = self._load()
            self.reloads += 1
            self._baseline = self._rss()


def pool_threads() -> int:
    """The threads of this process's Rayon pool, by Rayon's rule: RAYON_NUM_THREADS when it is a
    positive integer, else the CPUs this process may run on. (Rayon also reads a cgroup's CPU quota;
    this does not, so under a one-CPU quota a call keeps the pool path, as before.)"""
    value = os.environ.get("RAYON_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resident_bytes() -> int:
    """This process's resident set size (Linux /proc/self/statm), 0 where it is not available."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _awkward_strings(texts: pa.Array) -> Any:
    """An awkward string array over ``texts``' buffers (gigatoken wants int64 offsets)."""
    import awkward as ak

    data_buffer = texts.buffers()[2]
    offsets = text_offsets(texts)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, dtype=np.uint8)
    content = ak.contents.NumpyArray(data, parameters={"__array__": "char"})
    strings = ak.contents.ListOffsetArray(ak.index.Index64(offsets.astype(np.int64)), content,
                                          parameters={"__array__": "string"})
    return ak.Array(strings)
