"""Opening any output raypack writes by its path: a packed output or a mix, read the same way.

The one function here sits above both readers, so neither imports the other: a packed output
opens as a :class:`raypack.packed.reader.PackedDataset`, a mix (``raypack mix``) as a
:class:`raypack.mix.dataset.MixedDataset`.
"""

from __future__ import annotations

from raypack.mix.dataset import MixedDataset, is_mix, open_mix
from raypack.packed.manifest import read_manifest_json
from raypack.packed.reader import PackedDataset, open_packed

__all__ = ["read_packed"]


def read_packed(path: str) -> PackedDataset | MixedDataset:
    """Open the output directory ``path`` (local path or URI) for reading: a packed output
    (:func:`raypack.packed.reader.open_packed`), or a mix (:func:`raypack.mix.dataset.open_mix`).

    Reads and checks the manifest only; chunk files open on first use. Raises InputError for a
    directory without a manifest (unfinished job) and for a manifest that fails its checks.
    """
    data, where = read_manifest_json(path)
    if is_mix(data):
        return open_mix(path, data, where)
    return open_packed(path, data, where)
