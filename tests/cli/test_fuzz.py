"""Seeded mutants of every file raypack reads, each run through the CLI under a 2 GiB address-space
limit and a timeout (tests/fuzz_child.py): every mutant is one line (exit 2, or exit 1 from verify)
or a correct output. Kinds: a Parquet shard (bytes flipped, cut, its footer's length edited), a
packed output's manifest (a value replaced by a hostile one) and chunk file (bytes flipped), a
tokenized corpus's manifest and a mix's manifest.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.cli import main

from helpers import random_corpus, write_shards

LIMIT = 2 << 30
CHILD = Path(__file__).resolve().parent.parent / "fuzz_child.py"
HOSTILE = [-1, 2**63, 2**64 + 7, "x", "", [], {}, None, 1.5, True, [{}] * 3, "ff" * 32, "../../etc/passwd",
           "a" * 300]


class Child:
    def __init__(self) -> None:
        repo = str(CHILD.parent.parent)
        # MALLOC_ARENA_MAX: glibc gives each new thread an arena that reserves 64 MiB of address
        # space, which RLIMIT_AS counts though it is not memory; with a packer's threads (two packers
        # on --local) up to 16 arenas took the child to the 2 GiB cap ("can't start new thread").
        env = {**os.environ, "PYTHONPATH": repo, "MALLOC_ARENA_MAX": "2"}
        self.proc = subprocess.Popen([sys.executable, str(CHILD), str(LIMIT)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.count = 0

    def run(self, argv: list[str], timeout: int = 20) -> dict[str, Any]:
        self.count += 1
        self.proc.stdin.write(json.dumps({"id": self.count, "argv": argv, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the fuzz child died (rc {self.proc.wait()}) on {argv}: a crash, not one line")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def one_line(reply: dict[str, Any]) -> bool:
    lines = [line for line in reply["stderr"].splitlines() if line.strip()]
    return reply["rc"] in (1, 2) and len(lines) == 1 and lines[0].startswith("raypack:")


def flip_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 9))):
        out[int(rng.integers(0, len(out)))] = int(rng.integers(0, 256))
    return bytes(out)


def parquet_mutants(data: bytes, rng: np.random.Generator, n: int) -> Iterator[bytes]:
    footer = len(data) - 8 - struct.unpack("<I", data[-8:-4])[0]
    for k in range(n):
        kind = k % 4
        if kind == 0:
            yield flip_bytes(data, rng)
        elif kind == 1:  # bytes flipped inside the footer: counts, sizes, offsets, types
            out = bytearray(data)
            for _ in range(int(rng.integers(1, 4))):
                out[int(rng.integers(footer, len(data) - 8))] = int(rng.integers(0, 256))
            yield bytes(out)
        elif kind == 2:
            yield data[:int(rng.integers(1, len(data)))]
        else:  # the footer's length lies
            yield data[:-8] + struct.pack("<I", int(rng.integers(0, 2**32))) + b"PAR1"


def json_mutants(doc: Any, rng: np.random.Generator, n: int) -> Iterator[Any]:
    paths = list(_paths(doc, ()))
    for _ in range(n):
        path = paths[int(rng.integers(0, len(paths)))]
        value = HOSTILE[int(rng.integers(0, len(HOSTILE)))]
        yield _replaced(doc, path, value)


def _paths(value: Any, prefix: tuple) -> Iterator[tuple]:
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for k, item in enumerate(value[:3]):
            yield from _paths(item, (*prefix, k))


def _replaced(doc: Any, path: tuple, value: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@pytest.fixture(scope="module")
def child():
    worker = Child()
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz")
    shards = Path(write_shards(root, random_corpus(11, 60, 40), [20, 45]))
    assert main(["pack", "--local", "--input", str(shards), "--output", str(root / "out"),
                 "--context-length", "16"]) == 0
    texts = [f"text {i} " + "word " * (i % 9) for i in range(50)]
    (root / "text").mkdir()
    pq.write_table(pa.table({"text": texts}), root / "text" / "p.parquet")
    assert main(["tokenize", "--local", "--input", str(root / "text"), "--output", str(root / "tok"),
                 "--tokenizer", "tiktoken:cl100k_base"]) == 0
    assert main(["mix", "--source", str(root / "out"), "--weight", "1", "--num-chunks", "30",
                 "--output", str(root / "mix")]) == 0
    return {"root": root, "shards": shards, "out": root / "out", "tok": root / "tok", "mix": root / "mix"}


def mutate_and_run(child: Child, path: Path, mutants: Iterator[bytes], commands: list[Callable[[], list[str]]],
                   correct: Callable[[], bool] | None = None) -> dict[str, int]:
    """Write each mutant over ``path``, run every command; restore the file. The tally of outcomes."""
    original = path.read_bytes()
    tally = {"mutants": 0, "one_line": 0, "correct": 0}
    try:
        for mutant in mutants:
            path.write_bytes(mutant)
            tally["mutants"] += 1
            for command in commands:
                reply = child.run(command())
                if reply["rc"] == 0 and (correct is None or correct()):
                    tally["correct"] += 1
                elif one_line(reply):
                    tally["one_line"] += 1
                else:
                    raise AssertionError(f"mutant {tally['mutants']} of {path.name}: {command()} gave rc "
                                         f"{reply['rc']}, stderr:\n{reply['stderr']}")
                tally["worst_s"] = max(tally.get("worst_s", 0), reply["seconds"])
                tally["peak_mib"] = reply["peak_rss"] >> 20
    finally:
        path.write_bytes(original)
    return tally


def test_parquet_shard_mutants(world, child, tmp_path):
    shard = sorted(world["shards"].iterdir())[0]
    out = tmp_path / "o"

    def pack():
        shutil.rmtree(out, ignore_errors=True)
        return ["pack", "--local", "--input", str(world["shards"]), "--output", str(out), "--context-length", "16"]

    def verified():  # exit 0: the output must be right for the (mutated) inputs
        return child.run(["verify", str(out), "--input", str(world["shards"])])["rc"] == 0

    tally = mutate_and_run(child, shard, parquet_mutants(shard.read_bytes(), np.random.default_rng(0), 40),
                           [pack], verified)
    print("parquet", tally)
    assert tally["mutants"] == 40 and tally["one_line"] >= 20, tally


@pytest.mark.parametrize("kind", ["out", "tok", "mix"])
def test_manifest_mutants(world, child, tmp_path, kind):
    path = world[kind] / "manifest.json"
    doc = json.loads(path.read_text())
    mutants = (json.dumps(m).encode() for m in json_mutants(doc, np.random.default_rng(1), 30))
    commands = {
        "out": [lambda: ["stats", str(world["out"])], lambda: ["verify", str(world["out"]), "--no-inputs"]],
        "tok": [lambda: ["pack", "--local", "--input", str(world["tok"]), "--output", str(_fresh(tmp_path / "p")),
                         "--context-length", "16"],
                lambda: ["export", str(world["tok"]), "--format", "megatron", "--output", str(_fresh(tmp_path / "e"))]],
        "mix": [lambda: ["stats", str(world["mix"])], lambda: ["verify", str(world["mix"])]],
    }[kind]
    tally = mutate_and_run(child, path, mutants, commands)
    print(kind, tally)
    assert tally["mutants"] == 30 and tally["one_line"] >= 10, tally


def test_chunk_file_mutants(world, child):
    name = json.loads((world["out"] / "manifest.json").read_text())["files"][0]["path"]
    path = world["out"] / name
    rng = np.random.default_rng(2)
    mutants = (flip_bytes(path.read_bytes(), rng) for _ in range(25))
    commands = [lambda: ["stats", str(world["out"])], lambda: ["verify", str(world["out"]), "--no-inputs"]]
    tally = mutate_and_run(child, path, mutants, commands)
    print("chunks", tally)
    assert tally["mutants"] == 25 and tally["one_line"] >= 25, tally  # verify at least: the hash differs


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    for prefix in (path.with_suffix(".bin"), path.with_suffix(".idx")):
        prefix.unlink(missing_ok=True)
    return path
