"""Exports of raypack outputs into other formats; one module per format (``mds``: MosaicML streaming)."""
