"""best_fit with ``best_fit_max_segments=K`` (``--best-fit-max-segments``, ``--max-segments``): no chunk
holds more than K segments, counted as the collate counts them (documents plus a padding segment
unless full), so every chunk fits ``max_segments=K``; against a naive reference; unset, nothing changes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.cli import main
from raypack.errors import InputError
from raypack.pack.config import make_config
from raypack.rules.masks import cu_seqlens, pad_cu_seqlens
from raypack.strategies.best_fit.rules import BestFitChunkCounter, best_fit_decreasing, pack_best_fit
from raypack.verify import verify_output

from helpers import pack, read_output, write_shards
from reference import naive_best_fit

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def naive_limited_best_fit(docs: list[list[int]], c: int, window: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The best_fit rules one piece at a time, a chunk "holding" a piece only if it then has at
    most k segments: its pieces, plus one for padding unless it is full."""
    rows_tokens, rows_ids = [], []
    step = window or max(1, len(docs))
    for first in range(0, len(docs), step):
        pieces = [(d, docs[d][at:at + c]) for d in range(first, min(len(docs), first + step))
                  for at in range(0, len(docs[d]), c)]
        chunks: list[list[int]] = []
        for p in sorted(range(len(pieces)), key=lambda j: (-len(pieces[j][1]), j)):
            size = len(pieces[p][1])
            fitting = []
            for index, chunk in enumerate(chunks):
                room = c - sum(len(pieces[j][1]) for j in chunk)
                segments = len(chunk) + 1 + (1 if room > size else 0)
                if room >= size and segments <= k:
                    fitting.append((room, index))
            if fitting:
                chunks[min(fitting)[1]].append(p)
            else:
                chunks.append([p])
        for chunk in chunks:
            tokens, ids = [], []
            for p in sorted(chunk, key=lambda j: pieces[j][0]):
                tokens += pieces[p][1]
                ids += [pieces[p][0]] * len(pieces[p][1])
            rows_tokens.append(tokens + [0] * (c - len(tokens)))
            rows_ids.append(ids + [-1] * (c - len(ids)))
    return np.array(rows_tokens, np.int64).reshape(-1, c), np.array(rows_ids, np.int64).reshape(-1, c)


def segments_per_chunk(doc_ids: np.ndarray) -> list[int]:
    """The collate's count for each chunk alone (raypack.rules.masks.cu_seqlens: runs of one id, padding included)."""
    return [cu_seqlens(row).cu_seqlens.size - 1 for row in doc_ids]


@st.composite
def corpora(draw):
    c = draw(st.integers(2, 12))
    lengths = draw(st.lists(st.one_of(st.integers(0, c), st.integers(1, 3), st.integers(0, 3 * c)), max_size=30))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return c, [rng.integers(1, 100, size=n).tolist() for n in lengths]


def test_literal_limit():
    # C = 8, K = 3: four documents of 2 tokens. Without K one chunk holds all four (4 segments).
    docs = [[1, 1], [2, 2], [3, 3], [4, 4]]
    _, unlimited = pack_best_fit(docs, 8, 0)
    assert unlimited.tolist() == [[0, 0, 1, 1, 2, 2, 3, 3]]
    _, ids = pack_best_fit(docs, 8, 0, max_segments=3)
    assert ids.tolist() == [[0, 0, 1, 1, -1, -1, -1, -1], [2, 2, 3, 3, -1, -1, -1, -1]]  # 2 documents + padding
    # a chunk of K - 1 documents still takes one that fills it exactly (K segments, no padding)
    _, ids = pack_best_fit([[1] * 5, [2] * 2, [3]], 8, 0, max_segments=3)
    assert ids.tolist() == [[0, 0, 0, 0, 0, 1, 1, 2]]
    _, ids = pack_best_fit([[1] * 5, [2] * 2, [3]], 8, 0, max_segments=2)  # K = 2: one document per chunk ...
    assert ids.tolist() == [[0] * 5 + [-1] * 3, [1] * 2 + [-1] * 6, [2] + [-1] * 7]
    _, ids = pack_best_fit([[1] * 5, [2] * 2, [3] * 3], 8, 0, max_segments=2)  # ... unless two fill it exactly
    assert ids.tolist() == [[0] * 5 + [2] * 3, [1] * 2 + [-1] * 6]


@SETTINGS
@given(corpus=corpora(), k=st.integers(2, 6), window=st.sampled_from([0, 1, 3, 7]))
def test_packer_matches_the_naive_reference_and_fits_the_collate(corpus, k, window):
    c, docs = corpus
    tokens, ids = pack_best_fit(docs, c, 0, window=window, max_segments=k)
    want_tokens, want_ids = naive_limited_best_fit(docs, c, window, k)
    assert np.array_equal(ids, want_ids) and np.array_equal(tokens, want_tokens)
    assert all(n <= k for n in segments_per_chunk(ids))
    for row in ids:  # what the collate does with one chunk and max_segments=k: never raises
        assert pad_cu_seqlens(cu_seqlens(row).cu_seqlens, k).shape == (k + 1,)
    counter = BestFitChunkCounter(c, window=window, max_segments=k)
    counter.push(np.array([len(d) for d in docs], np.int64))
    assert counter.finish() == ids.shape[0]  # the counting pass counts with the same rule


@SETTINGS
@given(lengths=st.lists(st.integers(1, 16), max_size=40))
def test_without_a_limit_nothing_changes(lengths):
    bins, n = best_fit_decreasing(np.array(lengths), 16)
    ref_tokens, ref_ids = naive_best_fit([[1] * m for m in lengths], 16, 0)
    assert n == ref_ids.shape[0]
    big_bins, big_n = best_fit_decreasing(np.array(lengths), 16, max_segments=len(lengths) + 2)
    assert big_n == n and np.array_equal(big_bins, bins)  # a limit never reached: the same layout


@pytest.mark.slow  # imports torch (the property above checks raypack.rules.masks.pad_cu_seqlens, the collate's)
def test_collate_refuses_a_chunk_with_more_segments():
    torch_data = pytest.importorskip("raypack.torch_data")
    docs = [[1, 1], [2, 2], [3, 3], [4, 4], [5]]
    tokens, ids = pack_best_fit(docs, 8, 0)
    with pytest.raises(ValueError, match="segments"):
        torch_data.build_batch(tokens[:1], ids[:1], "varlen", max_segments=3)
    tokens, ids = pack_best_fit(docs, 8, 0, max_segments=3)
    for row in range(ids.shape[0]):
        batch = torch_data.build_batch(tokens[row:row + 1], ids[row:row + 1], "varlen", max_segments=3)
        assert batch["cu_seqlens"].shape == (4,) and batch["num_segments"] <= 3


def test_job_with_a_limit_verifies_and_records_it(tmp_path):
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 100, size=n).tolist() for n in rng.integers(0, 12, size=40)]
    shard_dir = write_shards(tmp_path, docs, [13, 29])
    default = pack(tmp_path, shard_dir, name="default", strategy="best_fit", best_fit_window=8).manifest
    limited = pack(tmp_path, shard_dir, name="limited", strategy="best_fit", best_fit_window=8,
                   best_fit_max_segments=2).manifest
    assert "best_fit_max_segments" not in default and limited["best_fit_max_segments"] == 2
    _, ids, _ = read_output(str(tmp_path / "limited"))
    assert max(segments_per_chunk(ids)) == 2 < max(segments_per_chunk(read_output(str(tmp_path / "default"))[1]))
    verify_output(str(tmp_path / "limited"))


def test_cli_spellings_and_bad_values(tmp_path, capsys):
    shard_dir = write_shards(tmp_path, [[1, 2], [3], [4, 5, 6]], [])
    base = ["pack", "--input", shard_dir, "--context-length", "8", "--local", "--strategy", "best_fit"]
    assert main([*base, "--output", str(tmp_path / "a"), "--max-segments", "2"]) == 0
    assert main([*base, "--output", str(tmp_path / "b"), "--best-fit-max-segments", "2"]) == 0
    capsys.readouterr()
    assert read_output(str(tmp_path / "a"))[2]["best_fit_max_segments"] == 2
    for bad in ("0", "1"):
        assert main([*base, "--output", str(tmp_path / "c"), "--best-fit-max-segments", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"--best-fit-max-segments {bad}: must be an integer >= 2" in err
    concat = ["pack", "--input", shard_dir, "--context-length", "8", "--local", "--output", str(tmp_path / "d")]
    assert main([*concat, "--max-segments", "4"]) == 2
    err = capsys.readouterr().err
    # a new user's trial: it named a flag not typed and spoke config keys (strategy=concat) to a command line
    assert err == ("raypack: error: --best-fit-max-segments (--max-segments) 4 is an option of strategy best_fit, "
                   "which alone can honour it; --strategy concat cannot: pass --strategy best_fit, or drop "
                   "--best-fit-max-segments\n"), err
    with pytest.raises(InputError, match="best_fit_max_segments=0 must be an integer >= 2"):
        make_config({"strategy": "best_fit", "best_fit_max_segments": 0})


def test_verify_refuses_a_chunk_over_the_recorded_limit(tmp_path):
    import json

    from raypack.verify import VerifyError

    shard_dir = write_shards(tmp_path, [[1, 1], [2, 2], [3, 3], [4]], [])
    pack(tmp_path, shard_dir, strategy="best_fit")  # one chunk of 5 segments
    manifest_path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["best_fit_max_segments"] = 4  # claims a limit the chunks do not keep
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(VerifyError, match=r"\(chunk 0\): 5 segments, more than best_fit_max_segments=4"):
        verify_output(str(tmp_path / "out"), [])
