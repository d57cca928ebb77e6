"""docs/ADDING.md's worked examples, run as written: its code blocks define a toy export format and
a toy tokenizer backend and register them; each then runs through the real CLI."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.cli import main

from helpers import pack, random_corpus, train_byte_level_bpe, write_shards

DOC = Path(__file__).resolve().parent.parent / "docs" / "ADDING.md"


def doc_block(defines: str) -> str:
    """The page's python block that defines class ``defines``."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    found = [b for b in blocks if f"class {defines}" in b]
    assert len(found) == 1, f"docs/ADDING.md has {len(found)} python blocks defining {defines}"
    return found[0]


@pytest.fixture
def registries():
    """The doc's registry lines change the real registries: put them back afterwards."""
    from raypack.export import EXPORTERS
    from raypack.tokenize.backends import BACKENDS

    saved = dict(EXPORTERS), dict(BACKENDS)
    yield
    for registry, before in zip((EXPORTERS, BACKENDS), saved):
        registry.clear()
        registry.update(before)


def test_the_toy_export_format_exports_and_verifies(tmp_path, registries, capsys):
    exec(compile(doc_block("IdsText"), str(DOC), "exec"), {})
    docs = random_corpus(5, 40, 30)
    pack(tmp_path, write_shards(tmp_path, docs, [10, 25]))
    assert main(["export", str(tmp_path / "out"), "--format", "ids-text", "--output", str(tmp_path / "ids"),
                 "--verify"]) == 0  # (--workers N pickles it for N processes: a module's class, not this exec)
    lines = [line.split() for f in sorted(os.listdir(tmp_path / "ids")) for line in open(tmp_path / "ids" / f)]
    assert [list(map(int, line)) for line in lines] == [list(d) for d in docs]
    assert "verified" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "out"), "--format", "ids-text", "--output", str(tmp_path / "ids")]) == 2


def test_the_toy_tokenizer_backend_gives_the_references_ids(tmp_path, registries):
    exec(compile(doc_block("SlicedBackend"), str(DOC), "exec"), {})
    texts = [f"document {i}: " + " ".join(["déjà vu", "emoji 🙂", "x" * (i % 7)] * (i % 5)) for i in range(700)]
    (tmp_path / "text").mkdir()
    pq.write_table(pa.table({"text": texts}), tmp_path / "text" / "part-0.parquet")
    train_byte_level_bpe(texts, 300).save(str(tmp_path / "tok.json"))
    outputs = {}
    for backend in ("reference", "sliced"):
        out = tmp_path / backend
        assert main(["tokenize", "--local", "--input", str(tmp_path / "text"), "--output", str(out),
                     "--tokenizer", str(tmp_path / "tok.json"), "--tokenizer-backend", backend]) == 0
        outputs[backend] = out
    manifest = json.loads((outputs["sliced"] / "manifest.json").read_text())
    assert manifest["backend"] == {"name": "sliced", "version": "0.1"}
    parts = sorted(p.name for p in outputs["reference"].iterdir() if p.suffix == ".parquet")
    assert parts and all(pq.read_table(outputs["sliced"] / p).equals(pq.read_table(outputs["reference"] / p))
                         for p in parts)
    ids = pq.read_table(outputs["sliced"] / parts[0]).column("input_ids").combine_chunks()
    assert len(ids) == len(texts) and np.asarray(ids.values).size > len(texts)  # 700 documents, many ids


def test_the_input_format_example_is_the_tested_toy():
    """The page shows the toy format that tests/inputs/test_input_formats.py packs: the same code."""
    block = doc_block("SpaceSeparatedFormat").split("\n\n\nregistry.FORMATS")[0]
    toy = (DOC.parent.parent / "tests" / "inputs" / "test_input_formats.py").read_text()
    assert block.strip() and block.strip() in toy
