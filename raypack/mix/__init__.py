"""Mixes: the weighted, seeded training order and the index-only output that reads several packed outputs."""
