"""A text column's Arrow array as the string array the tokenizers read. No Ray.

Which Arrow types are text (:func:`is_text_type`), and each batch read as a string or large_string
array (:func:`as_text_array`): zero-copy for string and binary, a copy for views and dictionaries.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["as_text_array", "is_text_type"]


def _is_view(t: pa.DataType) -> bool:
    return any(getattr(pa.types, f"is_{kind}_view", lambda _: False)(t) for kind in ("string", "binary"))


def _is_plain_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
        or pa.types.is_large_binary(t) or _is_view(t)


def is_text_type(t: pa.DataType) -> bool:
    """Whether a text column of Arrow type ``t`` is read as text: the string types, binary ones (as
    older writers store strings; their UTF-8 is checked row by row like any text) and dictionaries
    of them (pandas' categoricals)."""
    return _is_plain_text(t.value_type if pa.types.is_dictionary(t) else t)


def as_text_array(texts: pa.Array) -> pa.Array:
    """``texts`` (of a type :func:`is_text_type` takes) as a string or large_string array, its
    UTF-8 not yet checked: zero-copy for string and binary, a copy for views and dictionaries."""
    if pa.types.is_dictionary(texts.type):
        texts = texts.dictionary_decode()
    if _is_view(texts.type):
        texts = texts.cast(pa.large_binary())  # a binary view's cast to a string type would check its UTF-8 here
    if pa.types.is_binary(texts.type) or pa.types.is_large_binary(texts.type):
        string = pa.string() if pa.types.is_binary(texts.type) else pa.large_string()
        texts = pa.Array.from_buffers(string, len(texts), texts.buffers(), texts.null_count, texts.offset)
    return texts
