"""The manifest's ``content_sha256`` (format version 3), recomputed from the decoded chunks.

Fed every block in global order by :func:`raypack.verify.structure.output_pieces`, after the
block's file passed its sha256 check, so the digest is of the bytes the manifest vouches for.
Definition: raypack.rules.content_digest and docs/FORMAT.md. Cost: each chunk's bytes hashed once,
three hashlib calls per chunk, O(1) memory. A version 2 manifest's ``content_sha256`` hashes the
files' digests instead and is checked with them (:mod:`raypack.verify.files`).
"""

from __future__ import annotations

from typing import Any

from raypack.packed.manifest import side_columns_of
from raypack.rules.content_digest import ContentHasher
from raypack.rules.side_columns import split_fields
from raypack.verify.blocks import Block
from raypack.verify.report import VerifyError

__all__ = ["ContentCheck"]


class ContentCheck:
    """Recompute ``content_sha256`` block by block; :meth:`finish` compares it with the manifest's."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        self.expected = manifest.content_sha256
        self._hasher = ContentHasher(manifest.token_dtype.name, manifest.context_length,
                                     manifest.num_chunks, manifest.content_group_chunks,
                                     extra_columns=side_columns_of(manifest))

    def add(self, block: Block) -> None:
        tokens, sides = split_fields(block.input_ids)
        self._hasher.add_chunks(tokens, block.segment_offsets, block.segment_doc_ids, block.segment_lengths, sides)

    def finish(self, where: str) -> None:
        """Raise VerifyError naming ``where`` (the manifest) when the digests differ."""
        found = self._hasher.hexdigest()
        if found != self.expected:
            raise VerifyError(f"{where}: content_sha256={self.expected}, but the chunks hash to {found} "
                              "(docs/FORMAT.md, content_sha256); the manifest or the chunks were changed")
