"""What a tokenizer backend is: its protocol, its one error, and what every backend reads alike.

Versions, a tokenizer.json (parsed, checked against the backend's proven shapes and the added
tokens' ids), and a tiktoken rank file (checked against tiktoken's sha256, written where a Rust
backend can read it).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import tempfile
from typing import Any, Callable, Iterator, Protocol

from raypack.errors import InputError
from raypack.tokenize.tokenizers import TIKTOKEN_ENCODINGS, Encoder, TextTokenizer, rank_file_bytes

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
"""Llama 3's Split regex in its tokenizer.json (Qwen 2's has ``\\p{N}`` for ``\\p{N}{1,3}``)."""
QWEN2_SPLIT = LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
"""Qwen 2's Split regex: Llama 3's with digits one by one."""
QWEN_MARKS_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
"""Qwen's Split regex that keeps combining marks with letters."""


class Unsupported(Exception):
    """A backend cannot encode this tokenizer exactly; the message says what it lacks (one line)."""


class TokenizerBackend(Protocol):
    name: str
    summary: str
    batch_bytes: int
    """Bytes of text per encode call by default (``TextOptions.batch_bytes``): large enough that a
    call's fixed cost is small, small enough that what the encoder builds per token stays bounded."""
    thread_env: tuple[str, ...]
    """Environment variables that size the backend's thread pool, read before its first encode
    (:func:`raypack.tokenize.backends.set_thread_env`)."""
    misread: tuple[tuple[int, int], ...]
    """Assigned code points (inclusive ranges) the backend is known to read otherwise than the
    reference library: a document holding one goes to the reference, as one holding a character
    newer than Unicode 14.0 does (raypack.tokenize.backends.new_characters). An encoder may add its
    own for one tokenizer, as its ``misread`` attribute (gigatoken's for an NFC normalizer)."""

    def version(self) -> str | None:
        """The installed version, or None when the backend is not installed (nothing is imported)."""
        ...

    def encoder(self, tokenizer: TextTokenizer) -> Encoder:
        """An encoder giving ``tokenizer``'s ids; raises ``Unsupported`` naming what it lacks."""
        ...

    def slower_for(self, tokenizer: TextTokenizer) -> str | None:
        """Why the backends after it in ``AUTO_ORDER`` are faster for ``tokenizer`` (measured), or
        None: ``auto`` tries them first, and this one only where none of them takes the tokenizer."""
        ...


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None if it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def tokenizer_json(tokenizer: TextTokenizer, inexact: Callable[[dict[str, Any]], str | None],
                   backend: str) -> tuple[bytes, dict[str, Any]]:
    """The bytes of ``tokenizer``'s tokenizer.json and its parsed config (read and parsed once), or
    ``Unsupported`` naming why ``backend`` may not give its ids: ``inexact(config)`` (the backend's
    proven shapes); a vocabulary that cannot hold every byte; a normalized added token the normalizer
    empties; a normalized added token overlapping one that is not; an added token that strips whitespace
    where whitespace is a token's too; or an added token whose id in the
    file is not the one ``tokenizers`` gives it (it numbers added tokens after the vocabulary,
    whatever a file with a gap says; the Rust backends take the file's). Every one of these made a
    Rust backend give other ids, or fail, in a trial."""
    data = tokenizer.path.read_bytes()
    try:
        config = json.loads(data)
    except ValueError as e:
        raise Unsupported(f"{tokenizer.path} is not JSON") from e
    reason = (_untyped_model(config) or inexact(config)) if isinstance(config, dict) else "not a JSON object"
    if reason is None:
        reason = (incomplete_vocabulary(config, backend) or _normalized_to_nothing(config, backend)
                  or _overlapping_added_tokens(config, backend) or _stripping_added_tokens(config, backend))
    for token in (config.get("added_tokens") or []) if reason is None else []:
        if not isinstance(token, dict) or not isinstance(token.get("content"), str):
            continue
        try:
            actual = tokenizer.token_id(token["content"])
        except InputError:
            actual = None
        if actual != token.get("id"):
            reason = (f"added token {token['content']!r} has id {token.get('id')} in the file but {actual} in "
                      f"tokenizers, which {backend} would not follow")
            break
    if reason is not None:
        raise Unsupported(reason)
    return data, config


def incomplete_vocabulary(config: dict[str, Any], backend: str) -> str | None:
    """Why a BPE's vocabulary cannot take every byte, where ``tokenizers`` and the Rust backends part:
    with ``byte_fallback``, a missing ``<0xXX>`` token (``tokenizers`` drops the character and merges
    across it, the backends do not); with a ByteLevel pre-tokenizer, a missing byte character (a
    backend fails the whole batch, ``tokenizers`` drops it). None when every byte has its token."""
    model = config.get("model") or {}
    vocab = model.get("vocab") if isinstance(model.get("vocab"), dict) else {}
    if model.get("byte_fallback"):
        missing = next((f"<0x{b:02X}>" for b in range(256) if f"<0x{b:02X}>" not in vocab), None)
        if missing is not None:
            return (f"byte_fallback without the byte token {missing} in the vocabulary: tokenizers drops such a "
                    f"byte and merges across it, {backend} does not")
    if "ByteLevel" in part_types(config.get("pre_tokenizer"), "pretokenizers"):  # with byte_fallback too (a trial)
        import tokenizers

        missing = next((c for c in sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet()) if c not in vocab), None)
        if missing is not None:
            takes = "its byte token" if model.get("byte_fallback") else "nothing"
            return (f"a ByteLevel pre-tokenizer over a vocabulary without the byte character {missing!r}: tokenizers "
                    f"encodes that byte as {takes}, {backend} fails the whole batch")
    return None


def _normalized_to_nothing(config: dict[str, Any], backend: str) -> str | None:
    """A ``normalized`` added token the normalizer makes empty (a Replace of ``">"`` by ``""`` and the
    token ``">"``): gigatoken asks for gigabytes and aborts the process (a hostile trial); ``tokenizers``
    encodes the text. None when there is none."""
    if not config.get("normalizer"):
        return None
    import tokenizers

    empty = {"version": "1.0", "normalizer": config["normalizer"], "model": {"type": "BPE", "vocab": {}, "merges": []}}
    try:
        normalize = tokenizers.Tokenizer.from_str(json.dumps(empty)).normalizer.normalize_str
    except Exception:  # noqa: BLE001 (the reference loaded the file: this copy of its normalizer should too)
        return None
    for token in added_tokens_with_content(config):
        if token.get("normalized", True) and not normalize(token["content"]):
            return f"added token {token['content']!r} is normalized to nothing, which {backend} cannot match"
    return None


def added_tokens_with_content(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The added tokens of a tokenizer.json that are objects with a non-empty string ``content``."""
    return [t for t in config.get("added_tokens") or []
            if isinstance(t, dict) and isinstance(t.get("content"), str) and t["content"]]


def _overlapping_added_tokens(config: dict[str, Any], backend: str) -> str | None:
    """A ``normalized`` added token and one that is not, where one's content holds the other's or they
    overlap (``<a>`` and ``x<a>y``): ``tokenizers`` matches the not-normalized ones first and the others
    in what is left, gigatoken and fastokens all in one pass (a hostile trial). None when there is none."""
    tokens = added_tokens_with_content(config)
    normalized = [t["content"] for t in tokens if t.get("normalized", True)]
    for b in (t["content"] for t in tokens if not t.get("normalized", True)):
        for a in normalized:
            if a in b or b in a or any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, min(len(a), len(b)))):
                return (f"added tokens {a!r} (normalized) and {b!r} (not) overlap, which tokenizers matches in two "
                        f"passes and {backend} in one")
    return None


def _stripping_added_tokens(config: dict[str, Any], backend: str) -> str | None:
    """An added token that strips the whitespace beside it (``lstrip``/``rstrip``) where whitespace is matched
    otherwise too: the token begins or ends with whitespace itself (``"\\n"`` with both, which fastokens matched
    twice in ``"\\n\\n"`` and ``tokenizers`` once), or a token beside it begins (``rstrip``) or ends (``lstrip``)
    with whitespace, which the strip takes in ``tokenizers`` and the backends match as that token (gigatoken; and
    fastokens, ``<mask>`` with ``lstrip`` beside a normalized ``"\\n"`` in ``"x\\n<mask>"``). Hostile trials
    found each. None when there is none."""
    tokens = added_tokens_with_content(config)
    for token in tokens:
        content = token["content"]
        if (token.get("lstrip") or token.get("rstrip")) and content != content.strip():
            return (f"added token {content!r} begins or ends with whitespace and strips it beside it (lstrip/rstrip), "
                    f"which {backend} matches otherwise")
    for strip, edge, where in (("rstrip", 0, "begins"), ("lstrip", -1, "ends")):
        stripping = next((t for t in tokens if t.get(strip)), None)
        spaced = next((t for t in tokens if t is not stripping and t["content"][edge].isspace()), None)
        if stripping is not None and spaced is not None:
            return (f"added token {stripping['content']!r} strips whitespace ({strip}) and {spaced['content']!r} "
                    f"{where} with whitespace, which {backend} matches otherwise")
    return None


def _untyped_model(config: dict[str, Any]) -> str | None:
    """A model without a ``type``: ``tokenizers`` reads such a legacy model by its fields (as a BPE first;
    it refuses an untyped normalizer or pre-tokenizer), and the backends' checks, which go by the type,
    passed over it (a hostile trial: an untyped model with a single_word added token, whose ids gigatoken
    got wrong in 20 of 21 documents)."""
    model = config.get("model")
    if isinstance(model, dict) and not isinstance(model.get("type"), str):
        return 'its model has no "type" (a legacy tokenizer.json), which the fast backends are not proven on'
    return None


def parts(part: Any, children: str) -> list[dict[str, Any]]:
    """A normalizer or pre-tokenizer ``part`` and every part nested in its Sequences, in order
    (``children``: "normalizers" or "pretokenizers"); none where ``part`` is not an object."""
    if not isinstance(part, dict):
        return []
    return [part, *(p for child in part.get(children) or [] for p in parts(child, children))]


def part_types(part: Any, children: str) -> list[str]:
    """The ``type`` of each of :func:`parts`."""
    return [str(p.get("type")) for p in parts(part, children)]


def tiktoken_ranks(name: str, rank_file) -> bytes:
    """The uncompressed rank file of tiktoken encoding ``name``, checked against tiktoken's sha256."""
    return rank_file_bytes(rank_file, TIKTOKEN_ENCODINGS[name]["rank_sha256"])


@contextlib.contextmanager
def rank_file_on_disk(name: str, contents: bytes) -> Iterator[str]:
    """The path of ``contents`` (an uncompressed rank file) written to a temporary directory, removed
    after: the Rust backends read a rank file only from a path."""
    with tempfile.TemporaryDirectory(prefix="raypack-ranks-") as directory:
        path = os.path.join(directory, f"{name}.tiktoken")
        with open(path, "wb") as f:
            f.write(contents)
        yield path
