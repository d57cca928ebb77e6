"""The reference backend: the tokenizer's own library (``tokenizers``, ``tiktoken``) computes the ids."""

from __future__ import annotations

from raypack.tokenize.tokenizers import Encoder, TextTokenizer


class ReferenceBackend:
    name = "reference"
    summary = "the library that defines the tokenizer: tokenizers (tokenizer.json) or tiktoken"

    def version(self) -> str | None:
        return "n/a"  # installed whenever a tokenizer loads; its library's version is recorded instead

    def encoder(self, tokenizer: TextTokenizer) -> Encoder:
        return tokenizer
