"""The reference backend: the tokenizer's own library (``tokenizers``, ``tiktoken``) computes the ids."""

from __future__ import annotations

from raypack.tokenize.tokenizers import Encoder, TextTokenizer


class ReferenceBackend:
    name = "reference"
    summary = "the library that defines the tokenizer: tokenizers (tokenizer.json) or tiktoken"
    batch_bytes = 1 << 20
    """HF ``tokenizers`` builds an ``Encoding`` of about 100-300 bytes a token: 1 MiB pieces."""
    thread_env = ("RAYON_NUM_THREADS",)  # tokenizers' pool (tiktoken's threads are per call)
    misread = ()  # it is the reference

    def version(self) -> str | None:
        return "n/a"  # installed whenever a tokenizer loads; its library's version is recorded instead

    def encoder(self, tokenizer: TextTokenizer) -> Encoder:
        return tokenizer

    def slower_for(self, tokenizer: TextTokenizer) -> str | None:
        return None
