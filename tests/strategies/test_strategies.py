"""The packing-strategy seam (raypack.strategies): the registry drives config, CLI and manifest;
a strategy registered here, in a test, flows through config -> plan -> local pack -> manifest
-> stats -> dry run -> verify without any other module knowing its name: this file holds what
would be its folder, and one registry entry (the ``stripes`` fixture) is all it adds."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raypack import strategies
from raypack.cli import build_parser, main
from raypack.cli.stats import packing_stats
from raypack.errors import InputError
from raypack.pack.config import config_keys, make_config
from raypack.pack.dry_run import dry_run
from raypack.pack.plan import make_plan, settings_for
from raypack.pack.tasks import PackSettings
from raypack.packed.manifest import load_manifest
from raypack.strategies import (
    STRATEGIES,
    configured_strategy,
    make_strategy,
    option_fields,
    strategy_names,
    strategy_of_manifest,
)
from raypack.strategies.base import PackingStrategy, StrategyFigures
from raypack.strategies.best_fit import BestFit
from raypack.strategies.concat import Concat, ConcatShardPacker, ConcatSplits
from raypack.strategies.concat.verify import ConcatStructure
from raypack.strategies.options import check_int_option
from raypack.verify import verify_output

from helpers import file_digests, pack, random_corpus, write_shards

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ----------------------------------------------------------------------------- the toy's "folder"


class StripesStructure(ConcatStructure):
    """The toy's verify structure check (its ``verify.py``): concat's layout, and its note in the report."""

    def __init__(self, manifest: dict[str, Any], *, keep_tokens: bool = False) -> None:
        super().__init__(manifest, keep_tokens=keep_tokens)
        self.tag = manifest["stripes_tag"]

    def report_note(self) -> str:
        return f"tag {self.tag}"


@dataclass(frozen=True, kw_only=True)
class Stripes(PackingStrategy):
    """A toy third strategy (its ``__init__.py``): concat's bytes under another name, with one
    option, a shard extra checked on reading, and report lines of its own. It gives the protocol's
    abstract members and what it changes; every other member is the protocol's default."""

    tag: int = field(default=3, metadata={"metavar": "N", "help": "a toy option"})

    name = "stripes"
    summary = "concat under another name (a test's toy)"
    keeps_document_order = True
    verify_structure_name = staticmethod(lambda: StripesStructure)

    def __post_init__(self) -> None:
        check_int_option(self, "tag", 1)

    def make_shard_packer(self, task, settings) -> ConcatShardPacker:
        return ConcatShardPacker(task, settings)

    def shard_row_extras(self, task) -> dict[str, Any]:
        return {"stripes_shard": task.shard_index}

    def check_manifest(self, manifest: dict[str, Any], where: str) -> None:
        found = [entry.get("stripes_shard") for entry in manifest.get("shards") or []]
        if found != list(range(len(found))):
            raise InputError(f"{where}: stripes_shard of the shards {found}, expected 0..{len(found) - 1}")

    def describe(self) -> str:
        return f"{self.name}, tag {self.tag}"

    def make_split_finder(self, context_length: int) -> ConcatSplits:
        return ConcatSplits()

    def dry_run_figures(self, per_shard_lengths, context_length: int) -> StrategyFigures:
        figures = Concat().dry_run_figures(per_shard_lengths, context_length)
        return dataclasses.replace(figures, name=self.name, notes=(f"  stripes: tag {self.tag}",))


@pytest.fixture
def stripes(monkeypatch):
    """Register the toy: the one line a third strategy's folder adds to STRATEGIES."""
    monkeypatch.setitem(STRATEGIES, "stripes", Stripes)


@pytest.fixture
def corpus(tmp_path):
    docs = random_corpus(3, 60, 20)
    return docs, write_shards(tmp_path, docs, [25, 40])


def pack_options(parser_action: str) -> Any:
    pack_parser = build_parser()._subparsers._group_actions[0].choices["pack"]
    return next(a for a in pack_parser._actions if a.dest == parser_action)


# ----------------------------------------------------------------------------- the registry


def test_registry_names_its_classes_and_their_options():
    assert strategy_names() == ("concat", "best_fit")
    assert all(cls.name == name for name, cls in STRATEGIES.items())
    assert list(option_fields()) == ["best_fit_window", "best_fit_max_segments"]
    assert make_strategy("best_fit", window=16) == configured_strategy("best_fit", {"best_fit_window": 16}) \
        == BestFit(window=16)
    assert make_strategy() == Concat() and configured_strategy("concat", {"best_fit_window": 5}) == Concat()


def test_strategies_are_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        BestFit(16)  # noqa
    with pytest.raises(dataclasses.FrozenInstanceError):
        BestFit().window = 3


def test_cli_choices_and_flags_come_from_the_registry(stripes):
    assert pack_options("strategy").choices == ("concat", "best_fit", "stripes")
    assert pack_options("best_fit_window").option_strings == ["--best-fit-window"]
    assert pack_options("stripes_tag").option_strings == ["--stripes-tag"]
    assert "stripes: concat under another name" in pack_options("strategy").help


def test_every_config_key_has_a_cli_flag():
    pack_parser = build_parser()._subparsers._group_actions[0].choices["pack"]
    dests = {a.dest for a in pack_parser._actions}
    assert set(config_keys()) <= dests, set(config_keys()) - dests


def test_unknown_strategy_lists_the_registered_ones(stripes, capsys):
    with pytest.raises(InputError, match=r"config: strategy='zigzag' must be one of concat, best_fit, stripes$"):
        make_config({"strategy": "zigzag"})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pack", "--strategy", "zigzag"])
    assert "invalid choice: 'zigzag' (choose from" in capsys.readouterr().err


def test_options_are_validated_by_their_strategy_whichever_is_chosen(stripes):
    with pytest.raises(InputError, match=r"config: stripes_tag=0 must be an integer >= 1"):
        make_config({"strategy": "concat", "stripes_tag": 0})
    with pytest.raises(InputError, match=r"best_fit_window=True must be an integer >= 0"):
        make_config({"best_fit_window": True})
    with pytest.raises(InputError, match=r"best_fit_window=9007199254740993 must be an integer >= 0 \(at most 2\*\*53\)"):
        make_config({"best_fit_window": (1 << 53) + 1})
    with pytest.raises(InputError, match=r"unknown key\(s\) stripes_width; valid keys are .*best_fit_window, best_fit_max_segments, stripes_tag"):
        make_config({"stripes_width": 2})


def test_settings_are_keyword_only_and_travel_as_a_dict(corpus):
    _, shard_dir = corpus
    config = make_config(dict(inputs=[shard_dir], context_length=8, strategy="best_fit", best_fit_window=7))
    settings = settings_for(config, make_plan(config), "out")
    assert settings.packing == BestFit(window=7) and settings.strategy_options == {"best_fit_window": 7}
    assert PackSettings(**dataclasses.asdict(settings)) == settings  # as a Ray actor receives them
    with pytest.raises(TypeError):
        PackSettings("out", 8, 0, "int32", "input_ids", 0, 1, 1)  # noqa


# ----------------------------------------------------------------------------- fingerprints, manifest


def test_fingerprints_differ_exactly_when_name_or_options_do(stripes):
    assert BestFit(window=1).fingerprint() != BestFit(window=2).fingerprint()
    assert BestFit().fingerprint() == BestFit(window=8192).fingerprint() == make_strategy("best_fit").fingerprint()
    assert Concat().fingerprint() != Stripes().fingerprint()
    assert Stripes(tag=3).fingerprint() != Stripes(tag=4).fingerprint()
    assert re.fullmatch("[0-9a-f]{64}", Concat().fingerprint())


@given(window=st.integers(0, 1 << 53))
def test_manifest_round_trip_of_best_fit_options(window):
    manifest = {**BestFit(window=window).manifest_fields(), "counts": {"chunks": 0}, "shards": []}
    assert manifest["best_fit_window"] == window and manifest["strategy"] == "best_fit"
    assert strategy_of_manifest(manifest) == BestFit(window=window)


def test_manifest_without_strategy_is_concat_and_an_unknown_one_is_refused():
    assert strategy_of_manifest({}) == Concat()
    with pytest.raises(InputError, match=r"m.json: strategy='stripes' is unknown; expected one of concat, best_fit "
                                         r"\(no strategy: concat\)"):
        strategy_of_manifest({"strategy": "stripes"}, "m.json")


@pytest.mark.parametrize("value, message", [
    (-1, r"best_fit_window=-1 must be an integer >= 0"),
    (2.0, r"best_fit_window=2\.0 must be an integer >= 0"),
    (None, r"best_fit_window=None must be an integer"),
    ("missing", r"a best_fit manifest needs best_fit_window"),
])
def test_a_packed_manifest_with_a_bad_option_is_refused(tmp_path, corpus, value, message):
    _, shard_dir = corpus
    pack(tmp_path, shard_dir, strategy="best_fit", best_fit_window=7)
    path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(path.read_text())
    if value == "missing":
        del manifest["best_fit_window"]
    else:
        manifest["best_fit_window"] = value
    path.write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=rf"manifest\.json: {message}.*the output was replaced or damaged"):
        load_manifest(str(tmp_path / "out"))


def test_a_hostile_option_value_gives_one_short_line():
    manifest = {"strategy": "best_fit", "best_fit_window": "9" * 100_000, "counts": {"chunks": 0}, "shards": []}
    with pytest.raises(InputError, match=r"m.json: best_fit_window='9999.*\.\.\. must be an integer") as e:
        strategy_of_manifest(manifest, "m.json")
    assert len(str(e.value)) < 300 and "\n" not in str(e.value)


def test_best_fit_stores_its_window_once(tmp_path, corpus):
    _, shard_dir = corpus
    pack(tmp_path, shard_dir, strategy="best_fit", best_fit_window=7)
    manifest = load_manifest(str(tmp_path / "out"))
    assert manifest["best_fit_window"] == 7 and "best_fit_window" not in manifest["config"]
    assert "strategy" not in manifest["config"]
    assert strategy_of_manifest(manifest) == BestFit(window=7)


# ----------------------------------------------------------------------------- a third strategy


def test_a_registered_third_strategy_flows_through_every_stage(tmp_path, corpus, stripes, capsys):
    docs, shard_dir = corpus
    config = make_config(dict(inputs=[shard_dir], context_length=8, strategy="stripes", stripes_tag=5))
    assert config.packing == Stripes(tag=5) and make_plan(config).packing == Stripes(tag=5)
    summary = pack(tmp_path, shard_dir, name="stripes", strategy="stripes", stripes_tag=5)
    pack(tmp_path, shard_dir, name="concat")
    out = str(tmp_path / "stripes")
    assert file_digests(out) == file_digests(str(tmp_path / "concat"))  # concat's bytes under another name
    manifest = load_manifest(out)
    assert (manifest["strategy"], manifest["stripes_tag"]) == ("stripes", 5) and "stripes_tag" not in manifest["config"]
    assert [s["stripes_shard"] for s in manifest["shards"]] == [0, 1, 2]
    assert strategy_of_manifest(manifest) == Stripes(tag=5)
    assert f"packed {out} (stripes, tag 5)" in summary.lines()[0]
    stats = packing_stats(out)
    assert stats.strategy == "stripes" and stats.split_documents == packing_stats(str(tmp_path / "concat")).split_documents
    assert stats.split_documents > 0  # the corpus splits documents: the toy's split finder is really asked
    report = dry_run(config, sample_docs=0)
    assert [s.name for s in report.strategies] == ["concat", "best_fit (window 8,192)", "stripes"]
    assert report.lines()[-1] == "  stripes: tag 5"
    for inputs in (None, []):  # verify for real: the toy's check, built from the registry, with and without inputs
        checked = verify_output(out, inputs)
        assert (checked.strategy, checked.strategy_note, checked.inputs_compared) == ("stripes", "tag 5", inputs is None)
        assert (checked.num_chunks, checked.num_tokens) == (manifest["counts"]["chunks"], sum(map(len, docs)))
    assert main(["pack", "--input", shard_dir, "--output", str(tmp_path / "cli"), "--context-length", "8",
                 "--read-batch-size", "3", "--chunks-per-record-batch", "2", "--strategy", "stripes",
                 "--stripes-tag", "5", "--local"]) == 0
    assert "(stripes, tag 5)" in capsys.readouterr().out
    assert load_manifest(str(tmp_path / "cli"))["stripes_tag"] == 5


def test_the_cli_reports_on_a_third_strategy(tmp_path, corpus, stripes, capsys):
    """``raypack pack --dry-run``, ``raypack stats`` and ``raypack verify`` on the toy's output."""
    docs, shard_dir = corpus
    out = str(tmp_path / "out")
    pack(tmp_path, shard_dir, strategy="stripes", stripes_tag=4)
    assert main(["pack", "--input", shard_dir, "--context-length", "8", "--strategy", "stripes", "--stripes-tag",
                 "4", "--dry-run", "--sample-docs", "0"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert any(re.fullmatch(r"  stripes +\d+ +\S+% +\S+% +\d+", line) for line in printed), printed
    assert printed[-1] == "  stripes: tag 4"
    assert main(["stats", out]) == 0
    assert re.search(r"^strategy +stripes$", capsys.readouterr().out, re.MULTILINE)
    assert main(["verify", out]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^  strategy +stripes  \(tag 4\)$", printed, re.MULTILINE)
    assert f"{len(docs)} documents: unpack(pack(x)) == x" in printed


def test_a_third_strategy_checks_its_own_manifest_fields(tmp_path, corpus, stripes, capsys):
    _, shard_dir = corpus
    pack(tmp_path, shard_dir, strategy="stripes")
    path = tmp_path / "out" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][1]["stripes_shard"] = 7
    path.write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"manifest\.json: stripes_shard of the shards \[0, 7, 2\], expected 0\.\.2"):
        load_manifest(str(tmp_path / "out"))
    assert main(["verify", str(tmp_path / "out")]) == 1  # verify failed, naming the toy's field
    assert "stripes_shard of the shards [0, 7, 2]" in capsys.readouterr().err


def test_an_output_of_an_unregistered_strategy_is_refused(tmp_path, corpus, monkeypatch):
    _, shard_dir = corpus
    monkeypatch.setitem(STRATEGIES, "stripes", Stripes)
    pack(tmp_path, shard_dir, strategy="stripes")
    monkeypatch.delitem(STRATEGIES, "stripes")
    with pytest.raises(InputError, match=r"strategy='stripes' is unknown; expected one of concat, best_fit"):
        packing_stats(str(tmp_path / "out"))


def test_verify_structure_hooks_import_lazily():
    from raypack.strategies.best_fit.verify import BestFitStructure

    assert Concat.verify_structure_name == "raypack.strategies.concat.verify:ConcatStructure"
    assert Concat.verify_structure() is ConcatStructure
    assert BestFit.verify_structure() is BestFitStructure
    packing = "import sys, raypack.strategies, raypack.pack.job, raypack.cli.stats; print(sorted(m for m in sys.modules " \
              "if m.startswith('raypack.verify') or m.endswith('.verify')))"
    loaded = subprocess.run([sys.executable, "-c", packing], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert loaded.stdout.strip() == "[]"  # packing, stats and the registry never import verify


def test_the_protocol_is_small_and_its_required_members_are_abstract():
    """The base's members, by the stage that asks them; the abstract ones are all a strategy must give."""
    members = {name for name in vars(PackingStrategy) if not name.startswith("_")} | set(PackingStrategy.__annotations__)
    assert members == {
        "name", "summary",  # identity
        "needs_counting_pass", "keeps_document_order", "make_shard_packer", "make_chunk_counter", "num_chunks",
        "task_starts",  # packing
        "options", "manifest_fields", "fingerprint", "check_manifest", "shard_row_extras",  # manifest fields
        "describe", "make_split_finder", "dry_run_figures",  # report lines
        "verify_structure_name", "verify_structure",  # verify structure
    }
    assert PackingStrategy.__abstractmethods__ == {"make_shard_packer", "make_split_finder", "dry_run_figures"}

    @dataclass(frozen=True, kw_only=True)
    class Unfinished(PackingStrategy):
        name = "unfinished"

        def make_shard_packer(self, task, settings):
            return ConcatShardPacker(task, settings)

    with pytest.raises(TypeError, match="abstract method"):
        Unfinished()


# ----------------------------------------------------------------------------- one seam


def test_no_module_outside_the_strategies_names_a_strategy_to_branch_on():
    """The names are spelled in raypack/strategies/ alone, verify included."""
    spelled, branches = [], []
    for folder, _, names in os.walk(os.path.join(ROOT, "raypack")):
        for name in names:
            path = os.path.relpath(os.path.join(folder, name), ROOT)
            if not name.endswith(".py"):
                continue
            text = open(os.path.join(ROOT, path)).read()
            if '"best_fit"' in text:
                spelled.append(path)
            if not path.startswith(os.path.join("raypack", "strategies")) and re.search(r"strategy\s*[!=]=", text):
                branches.append(path)
    assert len(spelled) <= 3 and all(p.startswith(os.path.join("raypack", "strategies")) for p in spelled), spelled
    assert branches == []
    assert strategies.STRATEGIES is STRATEGIES


def test_the_generic_verify_knows_no_strategy():
    """raypack/verify/ (structure, report, output, ...) says nothing of windows or of best_fit:
    a strategy's check and its report note live in the strategy's folder."""
    verify = os.path.join(ROOT, "raypack", "verify")
    modules = sorted(name for name in os.listdir(verify) if name.endswith(".py"))
    assert {"structure.py", "report.py", "output.py", "blocks.py"} <= set(modules)
    knowing = [name for name in modules if re.search(r"window|best_fit|best.fit|concat\b",
                                                     open(os.path.join(verify, name)).read(), re.IGNORECASE)]
    assert knowing == []
