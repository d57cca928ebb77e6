"""Text to token ids: one small protocol, two adapters, a registry keyed by kind. No Ray.

``load_tokenizer(spec)`` returns a ``TextTokenizer``:

  * ``"hf"``: a Hugging Face ``tokenizer.json`` (the file, or a directory holding it) through
    the ``tokenizers`` library. A document's ids equal
    ``Tokenizer.encode(text, add_special_tokens=False).ids`` with the file's truncation and
    padding switched off (padding would make ids depend on the batch, truncation would drop
    text). Added tokens written in the text (e.g. ``"<|endoftext|>"``) are matched as the
    tokenizer itself matches them. A BPE with dropout is refused: its ids are drawn at random.
  * ``"tiktoken"``: ``tiktoken:NAME`` for NAME in ``TIKTOKEN_ENCODINGS``, built from the rank
    file the ``bpe-openai`` package ships (gzip) with the pattern and special tokens of
    tiktoken's own ``tiktoken_ext/openai_public.py``; no network, no cache directory. A
    document's ids equal ``tiktoken.get_encoding(NAME).encode_ordinary(text)``: special-token
    text in a document is ordinary text.

``encode_flat`` returns the ids of a batch as ``FlatIds`` (one flat uint32 array plus offsets);
``encode_batch`` turns that into one list<uintN> array (N from ``token_dtype_for``) with the
optional BOS/EOS ids placed by index arithmetic. These two adapters are the *reference*
encoders: the libraries hand back one Python list of ids per document, and flattening those
costs a few percent of the encode itself (bench/bench_tokenize.py measures both). A faster
encoder for the same tokenizer is a backend (:mod:`raypack.tokenize.backends`), proven to give
the same ids.

``tokenizers`` and ``tiktoken`` are imported only when a tokenizer of their kind is loaded; a
missing one is an InputError naming the extra (``pip install -e '.[text]'`` from the checkout).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib
import importlib.util
import itertools
import json
import os
import zlib
from pathlib import Path
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from raypack.errors import BackendError, InputError, install_extra
from raypack.rules.arrays import arrow_array
from raypack.rules.token_checks import check_pad_in_vocabulary

__all__ = ["TEXT_EXTRA", "TIKTOKEN_ENCODINGS", "TOKENIZER_KINDS", "Encoder", "FlatIds", "HFTokenizer", "TextTokenizer",
           "TiktokenTokenizer", "check_texts", "encode_with", "flat_to_list_array", "ids_to_list_array",
           "lists_to_flat", "load_tokenizer", "text_offsets", "token_dtype_for"]

TEXT_EXTRA = install_extra("text")
TOKEN_DTYPES = ("uint8", "uint16", "uint32")


class FlatIds(NamedTuple):
    """The ids of n documents: document i is ``values[offsets[i]:offsets[i + 1]]``."""

    values: npt.NDArray[np.uint32]
    """All ids, document after document; uint32 (or narrower), every id < the vocabulary size."""
    offsets: npt.NDArray[np.int64]
    """n + 1 int64 offsets into values, offsets[0] == 0, non-decreasing."""


class Encoder(Protocol):
    """Texts to ids: what a backend provides (the reference adapters are encoders too). An encoder
    whose calls are worth overlapping says how many at once as ``calls_in_flight`` (default 1;
    raypack.tokenize.tasks.tokenize_in_memory reads it); its ``encode_flat`` is then called from
    that many threads at once."""

    def encode_flat(self, texts: pa.StringArray | pa.LargeStringArray) -> FlatIds:
        """The ids of each text, no BOS/EOS; a null text is an InputError naming its row."""
        ...


class TextTokenizer(Protocol):
    """What the tokenize stage asks of a tokenizer."""

    kind: str
    vocab_size: int  # every id it can produce is < vocab_size
    library: str
    """The reference library that defines its ids (``tokenizers``, ``tiktoken``)."""

    def identity(self) -> dict[str, Any]:
        """kind, name or file, vocab_size, sha256 of the tokenizer or rank file: for manifests."""
        ...

    def token_id(self, token: str | int) -> int:
        """The id of a token string the vocabulary holds, or an int id < vocab_size."""
        ...

    def encode_flat(self, texts: pa.StringArray | pa.LargeStringArray) -> FlatIds:
        """The ids of each text (no BOS/EOS), as ``Encoder.encode_flat``."""
        ...

    def encode_batch(
        self, texts: pa.StringArray | pa.LargeStringArray, *, bos_id: int | None = None, eos_id: int | None = None
    ) -> pa.ListArray | pa.LargeListArray:
        """One list<uintN> row per text: [bos] + ids + [eos]."""
        ...


# ---------------------------------------------------------------------------------------------
# Token dtype and the Arrow result


def token_dtype_for(vocab_size: int, requested: str = "auto") -> np.dtype:
    """The narrowest of uint8/uint16/uint32 holding ids < vocab_size, or ``requested`` if it does.

    Raises InputError if ``requested`` is unknown or cannot hold the vocabulary.
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= 2**32:
        raise ValueError(f"vocab_size={vocab_size!r} must be an integer in [1, 2**32]")
    if requested == "auto":
        return next(np.dtype(d) for d in TOKEN_DTYPES if np.iinfo(d).max >= vocab_size - 1)
    if requested not in TOKEN_DTYPES:
        raise InputError(f"--token-dtype {requested!r} is not one of auto, {', '.join(TOKEN_DTYPES)}")
    if np.iinfo(requested).max < vocab_size - 1:
        raise InputError(
            f"--token-dtype {requested} holds ids up to {np.iinfo(requested).max}, but the tokenizer's "
            f"vocabulary has {vocab_size} ids; use --token-dtype {token_dtype_for(vocab_size).name} or auto"
        )
    return np.dtype(requested)


def ids_to_list_array(
    id_lists: Sequence[Sequence[int]], dtype: np.dtype, *, bos_id: int | None = None, eos_id: int | None = None
) -> pa.ListArray | pa.LargeListArray:
    """``[bos] + ids + [eos]`` per document as one list<dtype> array (large_list past 2**31 ids).

    id_lists: n sequences of ints, each < 2**(8*itemsize). Cost: one pass over the ids into a
    flat numpy array (np.fromiter over the chained lists), then ``flat_to_list_array``.
    """
    return flat_to_list_array(lists_to_flat(id_lists, dtype), dtype, bos_id=bos_id, eos_id=eos_id)


def lists_to_flat(id_lists: Sequence[Sequence[int]], dtype: np.dtype = np.dtype(np.uint32)) -> FlatIds:
    """One Python list of ids per document (what the reference libraries return) as FlatIds."""
    body_lens = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    offsets = np.zeros(len(id_lists) + 1, dtype=np.int64)
    np.cumsum(body_lens, out=offsets[1:])
    values = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=dtype, count=int(offsets[-1]))
    return FlatIds(values, offsets)


def flat_to_list_array(flat: FlatIds, dtype: np.dtype, *, bos_id: int | None = None,
                       eos_id: int | None = None) -> pa.ListArray | pa.LargeListArray:
    """``[bos] + ids + [eos]`` per document of ``flat`` as one list<dtype> array (large_list past
    2**31 ids). Cost: one O(ids) numpy pass (the cast to dtype, or the spread when BOS/EOS are
    given, which casts as it copies); the arrays become Arrow buffers without a copy."""
    offsets = flat.offsets
    num_extra = (bos_id is not None) + (eos_id is not None)
    if num_extra:
        offsets = offsets + num_extra * np.arange(len(offsets), dtype=np.int64)
        values = _with_bos_eos(flat.values, offsets, bos_id, eos_id, np.dtype(dtype))
    else:
        values = flat.values if flat.values.dtype == dtype else flat.values.astype(dtype)
    if offsets[-1] < 2**31:
        return pa.ListArray.from_arrays(arrow_array(offsets.astype(np.int32)), arrow_array(values))
    return pa.LargeListArray.from_arrays(arrow_array(offsets), arrow_array(values))


SPREAD_BY_SLICES = 256
"""Documents of at least this many ids on average are spread one slice copy per document (a
Python step per document, ~0.4 us, against ~1.5 ns per id for the boolean mask; BENCHMARKS.md,
"BOS/EOS spread"); shorter ones by one boolean mask over all ids. Either way at most ~1.6 ns an id."""


def _with_bos_eos(body: np.ndarray, offsets: np.ndarray, bos_id: int | None, eos_id: int | None,
                  dtype: np.dtype) -> np.ndarray:
    """Spread ``body`` into ``offsets[-1]`` slots of ``dtype``, BOS at each row start and EOS at
    each row end (the ids cast as they are copied)."""
    values = np.empty(int(offsets[-1]), dtype=dtype)
    num_docs = len(offsets) - 1
    if bos_id is not None:
        values[offsets[:-1]] = bos_id
    if eos_id is not None:
        values[offsets[1:] - 1] = eos_id
    if num_docs and body.size >= SPREAD_BY_SLICES * num_docs:
        first = 1 if bos_id is not None else 0
        last = 1 if eos_id is not None else 0
        at = 0
        for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
            n = end - start - first - last
            values[start + first:end - last] = body[at:at + n]
            at += n
        return values
    is_body = np.ones(values.size, dtype=bool)
    if bos_id is not None:
        is_body[offsets[:-1]] = False
    if eos_id is not None:
        is_body[offsets[1:] - 1] = False
    values[is_body] = body
    return values


def text_offsets(texts: pa.StringArray | pa.LargeStringArray) -> np.ndarray:
    """The ``len(texts) + 1`` offsets of a string/large_string array into its UTF-8 bytes (a view of
    its buffer, int32 or int64, slices honoured). O(1)."""
    width = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    return np.frombuffer(texts.buffers()[1], dtype=width)[texts.offset:texts.offset + len(texts) + 1]


def check_texts(texts: pa.Array) -> None:
    """A string/large_string array of valid UTF-8 without nulls; else an InputError naming the row."""
    if not pa.types.is_string(texts.type) and not pa.types.is_large_string(texts.type):
        raise TypeError(f"texts must be a string or large_string array, not {texts.type}")
    if texts.null_count:
        row = int(np.flatnonzero(texts.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(f"text row {row} is null; every document must be a string (an empty text is \"\")")
    try:
        texts.validate(full=True)  # O(bytes), fast: every backend then sees valid UTF-8
    except pa.ArrowInvalid as e:
        row = str(e).rsplit(" ", 1)[-1]
        raise InputError(f"text row {row} is not valid UTF-8 (e.g. an encoded lone surrogate); write the "
                         f"text as UTF-8 (Python: str.encode('utf-8', 'replace'))") from e


SPLIT_IT = "split the document upstream, or lower --max-document-bytes to refuse such documents before they are encoded"
SHORT_TEXT = 1 << 16
"""Below this many bytes a document the tokenizer fails on is not too long: the tokenizer is broken."""
BROKEN_TOKENIZER = ("the text is short, so the tokenizer itself fails on it (its tokenizer.json, e.g. a normalizer or "
                    "regex that matches the empty string, or its library): fix the tokenizer, or remove the document "
                    "upstream")


NOT_THE_DOCUMENT = (InputError, BackendError, KeyboardInterrupt, SystemExit, GeneratorExit)
"""What ``encode_naming`` lets through as it is: errors that already say what is wrong, and Ctrl-C."""


def encode_naming(encoder: Encoder, texts: pa.Array, name: Callable[[int], str], fix: str = SPLIT_IT) -> FlatIds:
    """``encoder.encode_flat(texts)``; where the tokenizer's library fails on the batch (an error
    of its own, or a Rust panic: pyo3 raises those as BaseException), an InputError naming the
    document that fails alone (``name(k)``; the longest are tried first, as a regex's match limit is
    what long texts hit), then ``fix``. Costs nothing unless the library fails."""
    try:
        return encoder.encode_flat(texts)
    except NOT_THE_DOCUMENT:
        raise
    except BaseException as e:  # noqa: BLE001 (see the docstring)
        failure = e
    lengths = np.diff(text_offsets(texts))
    if len(texts) == 1:  # that one (not encoded again: a Rust panic prints its message each time)
        raise InputError(_cannot(name(0), int(lengths[0]), failure, fix)) from failure
    for k in np.argsort(-lengths, kind="stable"):
        try:
            encoder.encode_flat(texts.slice(int(k), 1))
        except NOT_THE_DOCUMENT:
            raise
        except BaseException as e:  # noqa: BLE001
            raise InputError(_cannot(name(int(k)), int(lengths[k]), e, fix)) from e
    raise InputError(f"{name(0)} and the {len(texts) - 1} documents after it cannot be encoded together by the "
                     f"tokenizer, though each can alone: {_first_line(failure)}") from failure


def _cannot(document: str, size: int, error: BaseException, fix: str) -> str:
    if fix == SPLIT_IT and size < SHORT_TEXT:
        fix = BROKEN_TOKENIZER
    return f"{document} ({size:,} bytes of text) cannot be encoded by the tokenizer: {_first_line(error)}; {fix}"


def _first_line(error: BaseException) -> str:
    text = " ".join(str(error).split("\n")[0].split()) or type(error).__name__
    return text[:200]


def _texts_to_list(texts: pa.Array) -> list[str]:
    """Python strs of a string/large_string array (checked by ``check_texts``)."""
    check_texts(texts)
    return texts.to_pylist()


def _check_id(token_id: int, vocab_size: int) -> int:
    if not 0 <= token_id < vocab_size:
        raise InputError(f"token id {token_id} (--bos/--eos, bos/eos in a config) is outside the vocabulary "
                         f"[0, {vocab_size}); give an id below {vocab_size}")
    return token_id


def check_packed_ids(pad_token: int, token_dtype: str, vocab_size: int) -> None:
    """What ``pack --tokenizer`` writes must hold the tokenizer's ids: InputError for a pad id outside
    its vocabulary (a model's embedding has no row for it) or a ``token_dtype`` too narrow for it
    (found before anything is tokenized, not at the first id over it)."""
    check_pad_in_vocabulary(pad_token, vocab_size)
    if token_dtype != "auto" and np.iinfo(token_dtype).max < vocab_size - 1:
        raise InputError(f"--token-dtype {token_dtype} holds ids up to {np.iinfo(token_dtype).max:,}, but the "
                         f"tokenizer's vocabulary has {vocab_size:,} ids; use --token-dtype "
                         f"{token_dtype_for(vocab_size).name} or auto")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _import_extra(module: str, kind: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise InputError(f"the {kind} tokenizer needs the {module!r} package, which is not installed; "
                         f"{TEXT_EXTRA}") from e


# ---------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json


def _colliding_added_tokens(tokenizer: Any) -> str | None:
    """Two ``normalized`` added tokens that the normalizer makes equal (``"<a>"`` and ``"<A>"`` under
    Lowercase): ``tokenizers`` matches them in the normalized text and gives such text one id or the
    other from one process to the next (measured: 700 or 701 over six runs), so no run would be
    reproducible. None when there are none. O(added tokens)."""
    normalize = tokenizer.normalizer.normalize_str if tokenizer.normalizer is not None else (lambda text: text)
    seen: dict[str, tuple[int, str]] = {}
    for token_id, token in sorted(tokenizer.get_added_tokens_decoder().items()):
        if not token.normalized:
            continue
        key = normalize(token.content)
        if key in seen:
            first_id, first = seen[key]
            return (f"added tokens {first!r} (id {first_id}) and {token.content!r} (id {token_id}) are both "
                    f"normalized, to {key!r}, so tokenizers gives such text either id from one run to the next; "
                    'remove one, or set "normalized": false on them')
        seen[key] = (token_id, token.content)
    return None


def _json_without_a_model(path: Path) -> str | None:
    """Words for a file ``tokenizers`` refused that is JSON but no tokenizer (its own error then quotes
    a parser's position, as if the JSON were broken); None for anything else. On the error path only."""
    try:
        if path.stat().st_size > 64 << 20:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(data, dict) and "model" in data:
        return None
    return 'it is JSON, but not an object with a "model" (the tokenizer itself) as a tokenizer.json has'


def _fix_for_missing(spec: str) -> str:
    """What to give instead of a tokenizer that is not there: a tiktoken encoding's name without its prefix, or
    what reads as a Hugging Face Hub name (``gpt2``, ``ORG/NAME``: never fetched), get their own fix (a new
    user's trial: both said only "not found"). A FIFO or /dev/null was "not found" too (a trial)."""
    if spec in TIKTOKEN_ENCODINGS:
        return f"for the tiktoken encoding, give tiktoken:{spec}"
    org, slash, name = spec.partition("/")
    if not (os.path.isabs(spec) or spec.endswith(".json") or slash and (os.path.lexists(org) or "/" in name)):
        return (f"raypack reads local files only and never downloads a tokenizer: if {spec} is a Hugging Face Hub "
                "model, download its tokenizer.json and give that file (or a directory holding it), or tiktoken:NAME")
    return "give a tokenizer.json file, a directory holding one, or tiktoken:NAME"


class HFTokenizer:
    """A ``tokenizer.json`` through ``tokenizers.Tokenizer``; threads: its Rayon pool (RAYON_NUM_THREADS)."""

    kind = "hf"
    library = "tokenizers"

    def __init__(self, path: Path) -> None:
        tokenizers = _import_extra("tokenizers", self.kind)
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a bare Exception for a bad file; a Rust panic (pyo3's PanicException) for some
            first_line = _json_without_a_model(path) or (str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise InputError(
                f"tokenizer {path} is not a Hugging Face tokenizer.json ({first_line}); "
                f"give the tokenizer.json a model ships, or tiktoken:NAME"
            ) from e
        dropout = getattr(tokenizer.model, "dropout", None)
        if dropout:  # BPE dropout draws other merges at every call: the ids would differ run to run
            raise InputError(
                f"tokenizer {path} has BPE dropout {dropout:.3g}, so its ids would change from run to run; "
                f'give a tokenizer.json whose model has "dropout": null'
            )
        clash = _colliding_added_tokens(tokenizer)
        if clash:
            raise InputError(f"tokenizer {path}: {clash}")
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.path = Path(os.path.abspath(path))  # manifests name the file wherever the run was started
        self._tokenizer = tokenizer
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = max(tokenizer.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
        self._encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    @classmethod
    def from_spec(cls, spec: str) -> HFTokenizer:
        path = Path(spec)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            where = path if path.is_absolute() else f"{path}, from {os.getcwd()}"
            slow = [name for name in ("vocab.json", "merges.txt", "tokenizer.model", "tokenizer_config.json")
                    if (path.parent / name).is_file()] if path.name == "tokenizer.json" else []
            if slow:
                raise InputError(
                    f"tokenizer {spec}: {path.parent} holds {', '.join(slow)} but no tokenizer.json, the one file "
                    "raypack reads; write one with transformers (for a fast tokenizer, "
                    "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR) saves it), or give tiktoken:NAME")
            what = "is not a regular file (a FIFO, a device, a broken link?)" if os.path.lexists(path) else "not found"
            raise InputError(f"tokenizer {spec} {what} (looked for {where}); {_fix_for_missing(spec)}")
        try:  # unreadable: it said "not a Hugging Face tokenizer.json (Permission denied ...)", a wrong fix
            open(path, "rb").close()
        except OSError as e:
            raise InputError(f"tokenizer {path} cannot be read ({e.strerror}); check its permissions") from e
        return cls(path)

    def identity(self) -> dict[str, Any]:
        """sha256: of the tokenizer.json bytes."""
        return {"kind": self.kind, "file": str(self.path), "vocab_size": self.vocab_size,
                "sha256": _sha256_file(self.path)}

    def token_id(self, token: str | int) -> int:
        if isinstance(token, bool) or not isinstance(token, (str, int)):
            raise TypeError(f"token must be a str or an int, not {type(token).__name__}")
        if isinstance(token, int):
            return _check_id(token, self.vocab_size)
        token_id = self._tokenizer.token_to_id(token)
        if token_id is None:
            specials = sorted(t.content for t in self._tokenizer.get_added_tokens_decoder().values() if t.special)
            some = f"its special tokens: {', '.join(specials[:8])}{', ...' if len(specials) > 8 else ''}" \
                if specials else "it has no special tokens"
            raise InputError(f"token {token!r} is not in the vocabulary of {self.path}; give a token it holds "
                             f"({some}) or an integer id below {self.vocab_size}")
        return token_id

    def encode_flat(self, texts: pa.StringArray | pa.LargeStringArray) -> FlatIds:
        """Cost: the library's encode plus a flatten of its lists (few %)."""
        encodings = self._encode(_texts_to_list(texts), add_special_tokens=False)
        return lists_to_flat([encoding.ids for encoding in encodings])

    def encode_batch(
        self, texts: pa.StringArray | pa.LargeStringArray, *, bos_id: int | None = None, eos_id: int | None = None
    ) -> pa.ListArray | pa.LargeListArray:
        """list<uintN>, one row per text."""
        return encode_with(self, self, texts, bos_id, eos_id)


# ---------------------------------------------------------------------------------------------
# tiktoken, offline


# Copied from tiktoken 0.14.0 tiktoken_ext/openai_public.py (cl100k_base(), o200k_base()); the
# rank hashes are its expected_hash values, checked against the decompressed shipped files.
_O200K_PAT_STR = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
TIKTOKEN_ENCODINGS: dict[str, dict[str, Any]] = {
    "cl100k_base": {
        "pat_str": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
        "special_tokens": {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
        "rank_sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    },
    "o200k_base": {
        "pat_str": _O200K_PAT_STR,
        "special_tokens": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
        "rank_sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    },
}


def tiktoken_rank_file(name: str) -> Path:
    """The gzip rank file ``bpe_openai/data/NAME.tiktoken.gz`` (found without importing bpe_openai)."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise InputError(f"tiktoken:{name} needs the rank files of the 'bpe-openai' package, which is not "
                         f"installed; {TEXT_EXTRA}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"{name}.tiktoken.gz"
    if not path.is_file():
        raise InputError(f"tiktoken:{name}: the installed bpe-openai ships no {path.name}; {TEXT_EXTRA}")
    return path


def rank_file_bytes(path: Path, expected_sha256: str) -> bytes:
    """The bytes of a (gzip) ``.tiktoken`` rank file; InputError where it cannot be read or decompressed (a
    damaged install: it was a traceback) or its bytes do not hash to ``expected_sha256``."""
    try:
        contents = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"rank file {path} cannot be read ({type(e).__name__}: {e}); reinstall bpe-openai "
                         f"({TEXT_EXTRA})") from e
    actual = hashlib.sha256(contents).hexdigest()
    if actual != expected_sha256:
        raise InputError(f"rank file {path} has sha256 {actual}, not tiktoken's {expected_sha256}; "
                         "reinstall bpe-openai")
    return contents


def load_rank_file(path: Path, expected_sha256: str) -> dict[bytes, int]:
    """Ranks of a (gzip) ``.tiktoken`` file (:func:`rank_file_bytes`), parsed as tiktoken's ``load_tiktoken_bpe``."""
    pairs = (line.split() for line in rank_file_bytes(path, expected_sha256).splitlines() if line)
    return {base64.b64decode(token): int(rank) for token, rank in pairs}


class TiktokenTokenizer:
    """``tiktoken:NAME``: encode_ordinary over ``num_threads`` threads (tiktoken releases the GIL)."""

    kind = "tiktoken"
    library = "tiktoken"

    def __init__(self, name: str, *, num_threads: int | None = None) -> None:
        if name not in TIKTOKEN_ENCODINGS:
            known = ", ".join("tiktoken:" + n for n in TIKTOKEN_ENCODINGS)
            raise InputError(f"unknown tokenizer tiktoken:{name}; known: {known}")
        tiktoken = _import_extra("tiktoken", self.kind)
        params = TIKTOKEN_ENCODINGS[name]
        self.name = name
        self.rank_file = tiktoken_rank_file(name)
        ranks = load_rank_file(self.rank_file, params["rank_sha256"])
        self._encoding = tiktoken.Encoding(
            name, pat_str=params["pat_str"], mergeable_ranks=ranks, special_tokens=params["special_tokens"]
        )
        self.vocab_size = self._encoding.n_vocab
        self.num_threads = num_threads or os.cpu_count() or 1

    @classmethod
    def from_spec(cls, spec: str) -> TiktokenTokenizer:
        return cls(spec.removeprefix("tiktoken:"))

    def identity(self) -> dict[str, Any]:
        """sha256: of the decompressed rank file (tiktoken's own expected_hash)."""
        sha256 = TIKTOKEN_ENCODINGS[self.name]["rank_sha256"]
        return {"kind": self.kind, "name": self.name, "file": str(self.rank_file), "vocab_size": self.vocab_size,
                "sha256": sha256}

    def token_id(self, token: str | int) -> int:
        if isinstance(token, bool) or not isinstance(token, (str, int)):
            raise TypeError(f"token must be a str or an int, not {type(token).__name__}")
        if isinstance(token, int):
            return _check_id(token, self.vocab_size)
        try:
            return self._encoding.encode_single_token(token)
        except KeyError as e:
            specials = ", ".join(TIKTOKEN_ENCODINGS[self.name]["special_tokens"])
            raise InputError(
                f"token {token!r} is not one token of tiktoken:{self.name}; give one of {specials}, "
                f"another single token, or an integer id below {self.vocab_size}"
            ) from e

    def encode_flat(self, texts: pa.StringArray | pa.LargeStringArray) -> FlatIds:
        """encode_ordinary of each text."""
        return lists_to_flat(self._encoding.encode_ordinary_batch(_texts_to_list(texts), num_threads=self.num_threads))

    def encode_batch(
        self, texts: pa.StringArray | pa.LargeStringArray, *, bos_id: int | None = None, eos_id: int | None = None
    ) -> pa.ListArray | pa.LargeListArray:
        """list<uintN>, one row per text."""
        return encode_with(self, self, texts, bos_id, eos_id)


def encode_with(tokenizer: TextTokenizer, encoder: Encoder, texts: pa.Array, bos_id: str | int | None,
                eos_id: str | int | None) -> pa.ListArray | pa.LargeListArray:
    """``encode_batch`` of ``tokenizer`` with the ids of ``encoder``: [bos] + ids + [eos] per text."""
    bos_id, eos_id = (None if t is None else tokenizer.token_id(t) for t in (bos_id, eos_id))
    flat = encoder.encode_flat(texts)
    return flat_to_list_array(flat, token_dtype_for(tokenizer.vocab_size), bos_id=bos_id, eos_id=eos_id)


# ---------------------------------------------------------------------------------------------
# Registry

TOKENIZER_KINDS: dict[str, Callable[[str], TextTokenizer]] = {
    HFTokenizer.kind: HFTokenizer.from_spec,
    TiktokenTokenizer.kind: TiktokenTokenizer.from_spec,
}


def load_tokenizer(spec: str) -> TextTokenizer:
    """``KIND:REST`` for a registered KIND other than hf (``tiktoken:cl100k_base``), else a path."""
    kind, sep, _ = spec.partition(":")
    if not (sep and kind in TOKENIZER_KINDS):
        kind = HFTokenizer.kind
    return TOKENIZER_KINDS[kind](spec)
