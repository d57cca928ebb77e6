"""Where things lie in a best_fit output, and how verify's messages name them.

:class:`WindowMap` holds the per-shard and per-file arrays of a best_fit manifest (as loaded by
:func:`raypack.packed.manifest.load_manifest`): which shard and which window a doc id belongs to, which
shard's chunk range holds a chunk, and the labels messages use for a doc id, a window, a chunk
position. Windows are numbered globally, shard after shard: shard k's rows ``[w*N, (w+1)*N)`` are
its window w (N = ``best_fit_window``; N=0: the whole shard, one window, none for an empty shard).
Every lookup is a ``searchsorted`` over arrays of one entry per shard or file.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raypack.packed.manifest import Manifest

__all__ = ["WindowMap"]


class WindowMap:
    """The shards, windows and files of one best_fit manifest."""

    def __init__(self, manifest: dict[str, Any]) -> None:
        manifest = Manifest.of(manifest)
        self.window = manifest.strategy.window
        files = manifest.files
        self._file_first = np.array([f["first_chunk"] for f in files], dtype=np.int64)
        self._file_names = [f["path"] for f in files]
        shards = manifest.shards
        self.shard_paths = [e["path"] for e in shards]
        self._doc_offsets = np.array([e["doc_offset"] for e in shards], dtype=np.int64)
        self._shard_docs = np.array([e["num_docs"] for e in shards], dtype=np.int64)
        self.shard_first = np.array([e["first_chunk"] for e in shards], dtype=np.int64)
        self.shard_chunks = np.array([e["num_chunks"] for e in shards], dtype=np.int64)
        self.recorded_tokens = np.array([e["num_tokens"] for e in shards], dtype=np.int64)
        n = self.window
        windows = -(-self._shard_docs // n) if n else (self._shard_docs > 0).astype(np.int64)
        self._window_base = np.concatenate([[0], np.cumsum(windows)[:-1]]).astype(np.int64)
        self.total_docs = int(self._shard_docs.sum())

    def place(self, chunk: int, position: int) -> str:
        """``output chunk {chunk} position {position} ({file} row {row})``."""
        k = int(np.searchsorted(self._file_first, chunk, side="right")) - 1
        return (f"output chunk {chunk} position {position} ({self._file_names[k]} "
                f"row {chunk - int(self._file_first[k])})")

    def shard_of_docs(self, doc_ids: np.ndarray) -> np.ndarray:
        """The shard of each doc id (-1 below the first shard)."""
        return np.searchsorted(self._doc_offsets, doc_ids, side="right") - 1

    def windows_of(self, doc_ids: np.ndarray) -> np.ndarray:
        """Global window id of each doc id (ids within the shards)."""
        shard = self.shard_of_docs(doc_ids)
        local = (doc_ids - self._doc_offsets[shard]) // self.window if self.window else 0
        return self._window_base[shard] + local

    def doc(self, doc_id: int) -> str:
        """``doc id {id} (shard {k} {path} row {row})``, or that it lies in no shard."""
        k = int(self.shard_of_docs(np.int64(doc_id)))
        if not 0 <= doc_id < self.total_docs:
            return f"doc id {doc_id} (in no shard: they hold doc ids 0..{self.total_docs - 1})"
        return f"doc id {doc_id} (shard {k} {self.shard_paths[k]} row {doc_id - int(self._doc_offsets[k])})"

    def _window_rows(self, w: int) -> tuple[int, int, int]:
        """(shard, first row, end row) of global window ``w``."""
        k = int(np.searchsorted(self._window_base, w, side="right")) - 1
        j = w - int(self._window_base[k])
        docs = int(self._shard_docs[k])
        return (k, j * self.window, min((j + 1) * self.window, docs)) if self.window else (k, 0, docs)

    def window_label(self, w: int) -> str:
        """``window {j} of shard {k} ({path} rows a..b, doc ids c..d; best_fit_window=N)``."""
        k, r0, r1 = self._window_rows(w)
        off = int(self._doc_offsets[k])
        return (f"window {(r0 // self.window) if self.window else 0} of shard {k} ({self.shard_paths[k]} rows "
                f"{r0}..{r1 - 1}, doc ids {off + r0}..{off + r1 - 1}; best_fit_window={self.window})")

    def shard_of_chunks(self, chunks: np.ndarray) -> np.ndarray:
        """The shard whose chunk range holds each chunk."""
        return np.searchsorted(self.shard_first, chunks, side="right") - 1

    def chunk_shard_label(self, chunk: int) -> str:
        """``shard {j}'s chunk range a..b ({path})`` for the shard holding ``chunk``."""
        j = int(self.shard_of_chunks(np.int64(chunk)))
        first, n = int(self.shard_first[j]), int(self.shard_chunks[j])
        return f"shard {j}'s chunk range {first}..{first + n - 1} ({self.shard_paths[j]})"
