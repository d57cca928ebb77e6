"""Tokenizer backends: who computes a tokenizer's ids. One small protocol, a registry, ``auto``.

A tokenizer (:mod:`raypack.tokenize.tokenizers`) is defined by its reference library: a
``tokenizer.json`` by Hugging Face ``tokenizers``, ``tiktoken:NAME`` by ``tiktoken``. A backend
is another encoder of the same tokenizer that must give the same ids, token for token
(tests/tokenize/test_tokenize_backends.py proves it on a varied corpus; each tokenize task re-checks a
sample at run time, :mod:`raypack.tokenize.guard`). So the ids, the part files and
``content_sha256`` never depend on the backend; the manifest records which one ran.

``--tokenizer-backend`` (config ``tokenizer_backend``):

  * ``auto`` (default): the first backend of ``AUTO_ORDER`` (fastest first, measured by
    bench/bench_backends.py and bench/bench_backend_candidates.py: gigatoken, then fastokens for
    the tokenizer.json shapes gigatoken does not take) that is installed and takes the tokenizer,
    else the reference; a backend whose ``slower_for(tokenizer)`` names a reason goes after the
    others (gigatoken for a BPE without a pre-tokenizer); one INFO line says why each faster one was
    passed over;
  * ``reference``: the reference library itself;
  * a backend's name (``gigatoken``): that one, or an InputError when it is not installed
    (naming the extra) or cannot do this tokenizer (naming what it lacks).

A backend takes a tokenizer only in the shapes the tests prove it encodes exactly (each module's
``inexact``): a library that loads a tokenizer.json may still encode it otherwise.

Adding a backend: a module with a class like ``GigatokenBackend`` (``name``, ``batch_bytes``,
``thread_env``, ``version()``, ``encoder(tokenizer)``), one line in ``BACKENDS``, and its name in
``AUTO_ORDER`` once the benches show where it ranks and the backend tests pass for it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import pyarrow as pa

from raypack.errors import BackendError, InputError
from raypack.tokenize.backends.base import TokenizerBackend, Unsupported, package_version
from raypack.tokenize.backends.fastokens import FastokensBackend
from raypack.tokenize.backends.gigatoken import GigatokenBackend
from raypack.tokenize.backends.new_characters import encode_new_characters, indent_cut_rule
from raypack.tokenize.backends.reference import ReferenceBackend
from raypack.tokenize.tokenizers import TEXT_EXTRA, Encoder, FlatIds, TextTokenizer, encode_with, load_tokenizer

__all__ = ["AUTO", "AUTO_ORDER", "BACKENDS", "BackedTokenizer", "TokenizerBackend", "Unsupported",
           "backend_names", "check_backend_name", "load_backed_tokenizer", "select_encoder", "set_thread_env"]

log = logging.getLogger(__name__)

AUTO = "auto"


BACKENDS: dict[str, TokenizerBackend] = {
    GigatokenBackend.name: GigatokenBackend(),
    FastokensBackend.name: FastokensBackend(),
    ReferenceBackend.name: ReferenceBackend(),
}
AUTO_ORDER = (GigatokenBackend.name, FastokensBackend.name)
"""Backends ``auto`` tries, fastest first (BENCHMARKS.md, "Tokenizer backends")."""


def backend_names() -> list[str]:
    """``auto`` and every registered backend: the choices of ``--tokenizer-backend``."""
    return [AUTO, *BACKENDS]


def check_backend_name(name: str) -> str:
    if name not in backend_names():
        raise InputError(f"--tokenizer-backend (tokenizer_backend in a config) {name!r} is not one of "
                         f"{', '.join(backend_names())}")
    return name


class BackedTokenizer:
    """A tokenizer (``reference``: its identity, vocabulary and token ids) whose ids come from
    the chosen backend's encoder. Satisfies ``TextTokenizer``."""

    def __init__(self, reference: TextTokenizer, backend: str, encoder: Encoder) -> None:
        self.reference = reference
        self.backend = backend
        self.encoder = encoder
        self.kind = reference.kind
        self.library = reference.library
        self.vocab_size = reference.vocab_size
        self.batch_bytes = BACKENDS[backend].batch_bytes
        self.cut_rule = None if backend == ReferenceBackend.name else indent_cut_rule(reference)
        """Where documents holding new characters may be cut (new_characters.indent_cut_rule)."""
        self.misread = BACKENDS[backend].misread + getattr(encoder, "misread", ())
        """Code points routed to the reference: the backend's, and its encoder's for this tokenizer."""

    @property
    def calls_in_flight(self) -> int:
        """Encode calls worth having at once (the encoder's ``calls_in_flight``, else 1)."""
        return max(1, int(getattr(self.encoder, "calls_in_flight", 1)))

    def identity(self) -> dict[str, Any]:
        return self.reference.identity()

    def backend_record(self) -> dict[str, Any]:
        """``{"name", "version"}`` of the backend that computed the ids (for manifests)."""
        if self.backend == ReferenceBackend.name:
            return {"name": self.backend, "library": self.library, "version": package_version(self.library)}
        return {"name": self.backend, "version": BACKENDS[self.backend].version()}

    def token_id(self, token: str | int) -> int:
        return self.reference.token_id(token)

    def encode_flat(self, texts: pa.StringArray | pa.LargeStringArray) -> FlatIds:
        flat = self.encoder.encode_flat(texts)
        if flat.values.size and int(flat.values.max()) >= self.vocab_size:  # a backend bug, not bad input
            raise BackendError(f"the {self.backend} backend returned id {int(flat.values.max())}, outside the "
                               f"vocabulary [0, {self.vocab_size}); use --tokenizer-backend reference")
        flat = FlatIds(flat.values.astype(np.uint32, copy=False), flat.offsets)
        if self.backend == ReferenceBackend.name:
            return flat
        # new characters: the reference's ids (of the lines around them, where the split regex allows)
        return encode_new_characters(texts, flat, self.reference.encode_flat,
                                     self.encoder.encode_flat, self.cut_rule, self.misread)

    def encode_batch(self, texts: pa.StringArray | pa.LargeStringArray, *, bos_id: int | None = None,
                     eos_id: int | None = None) -> pa.ListArray | pa.LargeListArray:
        return encode_with(self, self, texts, bos_id, eos_id)


def select_encoder(tokenizer: TextTokenizer, requested: str = AUTO) -> tuple[str, Encoder]:
    """The backend ``requested`` (or ``auto``'s choice) for ``tokenizer``, and its encoder."""
    check_backend_name(requested)
    if requested == ReferenceBackend.name:
        return requested, tokenizer
    if requested != AUTO:
        return requested, _explicit(BACKENDS[requested], tokenizer)
    slower = {name: BACKENDS[name].slower_for(tokenizer) for name in AUTO_ORDER}
    passed = []  # why each faster backend was passed over: said in one line
    missing = False  # a backend not installed: the line then says how to install it
    for name in [n for n in AUTO_ORDER if not slower[n]] + [n for n in AUTO_ORDER if slower[n]]:
        backend = BACKENDS[name]
        if backend.version() is None:
            passed.append(f"{name} is not installed")
            missing = True
            continue
        try:
            encoder = backend.encoder(tokenizer)
        except Unsupported as e:
            passed.append(f"{name} cannot do this tokenizer ({e})")
            continue
        deferred = [f"{n} is slower for this tokenizer ({slower[n]})" for n in AUTO_ORDER
                    if slower[n] and n != name and not slower[name]]
        if passed or deferred:
            _say_once(tokenizer, f"tokenizer backend auto: {'; '.join(deferred + passed)}; using {name}")
        return name, encoder
    install = f" ({TEXT_EXTRA})" if missing else ""
    _say_once(tokenizer, f"tokenizer backend auto: {'; '.join(passed)}; using the reference, {tokenizer.library}"
                         + install)
    return ReferenceBackend.name, tokenizer


_SAID: set[tuple[str, str]] = set()


def _say_once(tokenizer: TextTokenizer, line: str) -> None:
    """auto's INFO line, once per process and tokenizer (a run loads its tokenizer to check it
    before Ray starts, and again to plan: the user reads the line once)."""
    key = (str(getattr(tokenizer, "path", None) or getattr(tokenizer, "name", "")), line)
    if key not in _SAID:
        _SAID.add(key)
        log.info("%s", line)


def _explicit(backend: TokenizerBackend, tokenizer: TextTokenizer) -> Encoder:
    if backend.version() is None:
        raise InputError(f"--tokenizer-backend {backend.name} (tokenizer_backend in a config): the {backend.name!r} "
                         f"package is not installed; {TEXT_EXTRA}, or use --tokenizer-backend auto")
    try:
        return backend.encoder(tokenizer)
    except Unsupported as e:
        name = getattr(tokenizer, "path", None) or f"tiktoken:{getattr(tokenizer, 'name', '?')}"
        raise InputError(f"--tokenizer-backend {backend.name} (tokenizer_backend in a config) cannot encode this "
                         f"tokenizer exactly ({e}; the tokenizer {name}); use --tokenizer-backend auto or "
                         "reference") from e


def set_thread_env(num_threads: int) -> None:
    """Size every backend's thread pool for this process (before its first encode): ``num_threads``
    (0: leave the environment as it is)."""
    if num_threads:
        for name in dict.fromkeys(v for backend in BACKENDS.values() for v in backend.thread_env):
            os.environ[name] = str(num_threads)


def load_backed_tokenizer(spec: str, backend: str = AUTO) -> BackedTokenizer:
    """``load_tokenizer(spec)`` whose ids come from ``backend`` (``auto``: see the module doc)."""
    reference = load_tokenizer(spec)
    name, encoder = select_encoder(reference, backend)
    return BackedTokenizer(reference, name, encoder)
