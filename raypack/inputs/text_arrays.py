"""A text column's Arrow array as the string array the tokenizers read. No Ray.

Which Arrow types are text (:func:`is_text_type`), and each batch read as a string or large_string
array (:func:`text_slices`): zero-copy for string and binary, a copy for views and dictionaries.

A dictionary is decoded a slice at a time, each slice holding about ``max_bytes`` of text (at least
one row): a batch's rows are sized from the file's stored bytes, and a dictionary column stores a
repeated text once, so a batch of 8,192 rows that all name one 1 MB text decoded to 8 GB at once (a
hostile trial: a 1 MB file took the run to 2.1 GB and a traceback, "Take operation overflowed binary
array capacity"; with a 16 MB text, a malloc of 84 GB). Cost: one pass over the batch's indices.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["is_text_type", "text_slices"]


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


def _as_text_array(texts: pa.Array) -> pa.Array:
    """``texts`` (of a type :func:`is_text_type` takes) as a string or large_string array, its
    UTF-8 not yet checked: zero-copy for string and binary, a copy for views and dictionaries
    (the whole array at once: :func:`text_slices` bounds a dictionary's)."""
    if pa.types.is_dictionary(texts.type):
        texts = texts.dictionary_decode()
    if _is_view(texts.type):
        texts = texts.cast(pa.large_binary())  # a binary view's cast to a string type would check its UTF-8 here
    if pa.types.is_binary(texts.type) or pa.types.is_large_binary(texts.type):
        string = pa.string() if pa.types.is_binary(texts.type) else pa.large_string()
        texts = pa.Array.from_buffers(string, len(texts), texts.buffers(), texts.null_count, texts.offset)
    return texts


def text_slices(texts: pa.Array, max_bytes: int) -> Iterator[pa.Array]:
    """``texts`` as :func:`_as_text_array` gives it, in order; a dictionary in slices of at most
    ``max_bytes`` of decoded text, or one row (see the module docstring)."""
    if not pa.types.is_dictionary(texts.type) or len(texts) <= 1:
        yield _as_text_array(texts)
        return
    sizes = pc.binary_length(texts.dictionary).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    indices = texts.indices.fill_null(0).to_numpy(zero_copy_only=False)
    if indices.size and (int(indices.max()) >= sizes.size or int(indices.min()) < 0):
        yield _as_text_array(texts)  # an index outside the dictionary: Arrow's decode names it, as before
        return
    ends = np.cumsum(sizes[indices])
    start, done = 0, 0  # the first row of the next slice, and the text bytes before it
    while start < len(texts):
        end = max(start + 1, int(np.searchsorted(ends, done + max_bytes, side="right")))
        yield _as_text_array(texts.slice(start, end - start))
        start, done = end, int(ends[end - 1])
