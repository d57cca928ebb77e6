"""The Ray Data engine: the only place that imports Ray."""
