"""The seams of raypack.verify: the strategy -> structure check registry, the check classes'
common constructor, and the expected best-fit layout against the packer's own best-fit decreasing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.pack.config import make_config
from raypack.pack.job import run_pack
from raypack.packed.manifest import load_manifest
from raypack.strategies import STRATEGIES
from raypack.strategies.best_fit.layout import expected_layout
from raypack.strategies.best_fit.rules import best_fit_decreasing, split_items
from raypack.strategies.best_fit.verify import BestFitStructure
from raypack.strategies.concat.verify import ConcatStructure
from raypack.verify import VerifyError, verify_output
from raypack.verify.structure import Structure

C = 8


def packed(tmp_path, strategy: str) -> str:
    """A small packed output of 12 documents (0..13 tokens) in two shards."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 1000, size=n).tolist() for n in rng.integers(0, 14, size=12)]
    (tmp_path / "shards").mkdir()
    for k, part in enumerate((docs[:5], docs[5:])):
        table = pa.table({"input_ids": pa.array(part, pa.list_(pa.int32()))})
        pq.write_table(table, tmp_path / "shards" / f"part-{k}.parquet")
    out = str(tmp_path / "out")
    run_pack(make_config(dict(inputs=[str(tmp_path / "shards")], output=out, context_length=C,
                              pad_token=0, strategy=strategy)), engine="local")
    return out


# ----------------------------------------------------------------------------- the registry


def test_every_strategy_has_a_structure_check():
    checks = {name: cls.verify_structure() for name, cls in STRATEGIES.items()}
    assert checks == {"concat": ConcatStructure, "best_fit": BestFitStructure}
    assert all(issubclass(cls, Structure) for cls in checks.values())


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_verify_builds_the_registered_check(tmp_path, monkeypatch, strategy):
    """Replacing one registry entry changes the check verify runs, with keep_tokens as documented."""
    out = packed(tmp_path, strategy)
    built = []

    class Refusing(STRATEGIES[strategy].verify_structure()):
        def __init__(self, manifest, *, keep_tokens):
            super().__init__(manifest, keep_tokens=keep_tokens)
            built.append(keep_tokens)

        def pieces(self, block):
            raise VerifyError(f"refused by the registered {strategy} check")

    monkeypatch.setattr(STRATEGIES[strategy], "verify_structure_name", lambda: Refusing)
    with pytest.raises(VerifyError, match=f"refused by the registered {strategy} check"):
        verify_output(out)
    with pytest.raises(VerifyError, match="refused"):
        verify_output(out, [])
    assert built == [True, False]


@pytest.mark.parametrize("cls", [ConcatStructure, BestFitStructure])
def test_check_classes_share_one_constructor(tmp_path, cls):
    manifest = load_manifest(packed(tmp_path, "best_fit"))
    for keep_tokens in (True, False):
        check = cls(manifest, keep_tokens=keep_tokens)
        assert (check.keep_tokens, check.context_length, check.next_chunk) == (keep_tokens, C, 0)


# ----------------------------------------------------------------------------- expected layout


def test_expected_layout_of_two_windows_literal():
    """Window 3: lengths 5, 3, 4, 4, 10 -> pieces 5, 3, 4, 4, 8, 2; best-fit decreasing opens the 8
    (chunk 0), the 5 (1), a 4 (2, as nothing has room), puts the other 4 in 2 and the 3 in 1, then
    opens chunk 3 for the 2. Window 4 (all pieces > C/2: the vectorised path): 6, 7, 5 -> one
    chunk each, longest first."""
    docs = np.arange(10, 18, dtype=np.int64)
    totals = np.array([5, 3, 4, 4, 10, 6, 7, 5], dtype=np.int64)
    doc_windows = np.array([3, 3, 3, 3, 3, 4, 4, 4], dtype=np.int64)
    layout = expected_layout(np.array([3, 4]), docs, totals, doc_windows, C)
    assert layout.doc_ids.tolist() == [10, 11, 12, 13, 14, 14, 15, 16, 17]
    assert layout.lengths.tolist() == [5, 3, 4, 4, 8, 2, 6, 7, 5]
    assert layout.window_of_item.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert (layout.item_starts.tolist(), layout.item_counts.tolist()) == ([0, 6], [6, 3])
    assert layout.bins.tolist() == [1, 1, 2, 2, 0, 3, 1, 0, 2]
    assert layout.num_bins.tolist() == [4, 3]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(1, 3 * C), min_size=1, max_size=8), min_size=1, max_size=5))
def test_expected_layout_is_best_fit_decreasing_per_window(windows):
    """Each window laid out as best_fit_decreasing lays out its split_items (fast path included)."""
    totals = np.array([n for w in windows for n in w], dtype=np.int64)
    doc_windows = np.repeat(np.arange(len(windows), dtype=np.int64) * 2, [len(w) for w in windows])
    layout = expected_layout(np.unique(doc_windows), np.arange(totals.size) + 7, totals, doc_windows, C)
    for r, lengths in enumerate(windows):
        items = split_items(np.array(lengths), C)
        bins, num_bins = best_fit_decreasing(items.lengths, C)
        s = slice(int(layout.item_starts[r]), int(layout.item_starts[r] + layout.item_counts[r]))
        assert layout.lengths[s].tolist() == items.lengths.tolist()
        assert layout.bins[s].tolist() == bins.tolist() and int(layout.num_bins[r]) == num_bins


@pytest.mark.parametrize("strategy", ["concat", "best_fit"])
def test_report_shows_the_window_of_the_strategy_check(tmp_path, strategy):
    out = packed(tmp_path, strategy)
    report = verify_output(out)
    window = load_manifest(out).get("best_fit_window") if strategy == "best_fit" else None
    note = "" if window is None else f"windows of {window:,} documents" if window else "windows of a whole shard"
    assert (report.strategy, report.strategy_note) == (strategy, note)
    assert strategy == "concat" or window is not None
    line = next(line for line in report.lines() if line.startswith("  strategy "))
    assert line == f"  strategy         {strategy:>14}" + (f"  ({note})" if note else "")
