"""``raypack export``: a tokenized corpus or a packed output, written in another format.

One registry, :data:`EXPORTERS`: a format is its module (an :class:`~raypack.export.base.Exporter`
subclass) plus one line here. The CLI, the checks and ``--verify`` ask the registered class.
"""

from __future__ import annotations

from raypack.export.base import Exporter, ExportMismatch
from raypack.export.mds import MdsExporter
from raypack.export.megatron import MegatronExporter

EXPORTERS: dict[str, type[Exporter]] = {
    "megatron": MegatronExporter,
    "mds": MdsExporter,
}

__all__ = ["EXPORTERS", "ExportMismatch", "Exporter", "exporter_class"]


def exporter_class(name: str) -> type[Exporter]:
    """The registered exporter ``name``; InputError listing the known ones otherwise."""
    from raypack.errors import InputError

    if name not in EXPORTERS:
        raise InputError(f"unknown export format {name!r}; known: {', '.join(EXPORTERS)}")
    return EXPORTERS[name]
