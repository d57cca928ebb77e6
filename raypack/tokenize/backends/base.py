"""What a tokenizer backend is: the protocol, its one error, and how versions are read."""

from __future__ import annotations

import importlib.metadata
from typing import Protocol

from raypack.tokenize.tokenizers import Encoder, TextTokenizer


class Unsupported(Exception):
    """A backend cannot encode this tokenizer exactly; the message says what it lacks (one line)."""


class TokenizerBackend(Protocol):
    name: str
    summary: str
    batch_bytes: int
    """Bytes of text per encode call by default (``TextOptions.batch_bytes``): large enough that a
    call's fixed cost is small, small enough that what the encoder builds per token stays bounded."""

    def version(self) -> str | None:
        """The installed version, or None when the backend is not installed (nothing is imported)."""
        ...

    def encoder(self, tokenizer: TextTokenizer) -> Encoder:
        """An encoder giving ``tokenizer``'s ids; raises ``Unsupported`` naming what it lacks."""
        ...


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None if it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
