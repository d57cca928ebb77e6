"""A mix: an index-only output that reads several packed outputs in one weighted, seeded order.

``raypack mix`` writes a directory holding ``manifest.json`` alone (kind "mix"): no chunk is
copied. The manifest names each source output by path and ``content_sha256`` and records
the seed, the number of items N and each source's weight, share and passes; the order itself
is computed per item from the seed (raypack.mix.order, the rules; docs/MIX.md), so the index costs
0 bytes per chunk. This module holds the mix's three sides:

  * writing: :class:`MixConfig` (flags or TOML), :func:`run_mix` (checks the sources agree on
    context length, token dtype and pad token; publishes like a pack: lock, staging, rename);
  * reading: :func:`open_mix` (what ``read_packed(MIX)`` calls) gives a :class:`MixedDataset`,
    a drop-in for :class:`raypack.packed.reader.PackedDataset` whose items add ``"source"``;
  * checking: :func:`check_mix_manifest` (the manifest as untrusted input) and
    :func:`check_sources` (each source's manifest still has the recorded content_sha256,
    chunk count, context length, dtype and pad token; a changed source is refused).

Source paths: a local mix records a local source relative to the mix directory (so a tree
moved whole still reads), a URI source as its URI; a mix on an object store records absolute
paths or URIs only. A relative path is resolved against the mix directory when read.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import operator
import os
from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence

import numpy as np
import numpy.typing as npt

from raypack.errors import InputError
from raypack.io.config_file import read_config_file
from raypack.io.fs import is_uri, same_file_key
from raypack.io.untrusted import MAX_COUNT, int_field, is_hex, show, token_dtype_field
from raypack.mix.order import ORDER_NAME, MixOrder, apportion
from raypack.packed.manifest import MIX_KIND, ChunkLayout, read_manifest_json, write_manifest
from raypack.packed.reader import BatchReads, PackedDataset, open_packed
from raypack.rules.core import MAX_CONTEXT_LENGTH

__all__ = ["MIX_FORMAT_VERSION", "MixConfig", "MixManifest", "MixedDataset", "MixStats", "MixSummary",
           "check_mix_manifest", "check_sources", "is_mix", "load_mix_config", "mix_stats", "open_mix", "run_mix"]

MIX_FORMAT_VERSION = 1
MAX_SOURCES = 1 << 16
"""Most sources a mix may list (a manifest claiming more is refused unread)."""
MAX_SEED = (1 << 64) - 1
_DAMAGED = "the mix was damaged; make it again (raypack mix)"
_SOURCE_KEYS = ("path", "content_sha256", "num_chunks", "strategy", "weight", "share", "passes")


# ----------------------------------------------------------------------------- config


def check_weight(weight: Any, where: str) -> float | int:
    """``weight`` when it is a positive finite number, else InputError naming ``where``. A zero
    weight is refused too: drop the source instead."""
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight <= 0:
        raise InputError(f"{where}: weight={weight!r} must be a positive finite number (weights need not sum "
                         "to 1; a zero weight is refused: drop that source)")
    return weight


@dataclass(frozen=True, kw_only=True)
class MixConfig:
    """What ``raypack mix`` needs; validated here (ValueError), turned into InputError by the loader."""

    sources: tuple[tuple[str, float | int], ...]
    """(packed output path or URI, weight) per source, in order: item ``source`` k is the k-th."""
    output: str
    num_chunks: int
    """N, items of the mix."""
    seed: int = 0
    overwrite: bool = False
    allow_mixed_tokenizers: bool = False
    """Mix sources whose manifests name different tokenizers (their ids mean different things)."""

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("a mix needs at least one source (--source OUT --weight W, or [[sources]] in TOML)")
        if len(self.sources) > MAX_SOURCES:
            raise ValueError(f"{len(self.sources)} sources, more than {MAX_SOURCES}")
        for k, (path, weight) in enumerate(self.sources):
            if not isinstance(path, str) or not path:
                raise ValueError(f"sources[{k}]: path={path!r} must be a non-empty string")
            check_weight(weight, f"source {k} ({path})")
        if not isinstance(self.output, str) or not self.output:
            raise ValueError("--output (or output in --config) is required")
        _check_int("num_chunks", self.num_chunks, 1, MAX_COUNT)
        _check_int("seed", self.seed, 0, MAX_SEED)
        for flag in ("overwrite", "allow_mixed_tokenizers"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag}={getattr(self, flag)!r} must be true or false")


def _check_int(name: str, value: Any, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{name}={value!r} must be an integer in {minimum}..{maximum}")


CONFIG_KEYS = ("sources", "output", "num_chunks", "seed", "overwrite", "allow_mixed_tokenizers")


def load_mix_config(path: str | None = None, **overrides: Any) -> MixConfig:
    """A TOML config (keys CONFIG_KEYS; ``[[sources]]`` tables of ``path`` and ``weight``) with
    non-None ``overrides`` on top (``sources``: a list of (path, weight) replacing the TOML's)."""
    values: dict[str, Any] = {}
    where = "mix config"
    if path is not None:
        where = str(path)
        values = read_config_file(path)
        unknown = sorted(set(values) - set(CONFIG_KEYS))
        if unknown:
            raise InputError(f"{path}: unknown key(s) {', '.join(unknown)}; valid keys are {', '.join(CONFIG_KEYS)}")
        values["sources"] = _toml_sources(values.get("sources", []), where)
    values.update({k: v for k, v in overrides.items() if v is not None})
    values.setdefault("sources", ())
    for key in ("output", "num_chunks"):
        if key not in values:
            raise InputError(f"--{key.replace('_', '-')} is required (or {key} in --config)")
    try:
        return MixConfig(**{**values, "sources": tuple(tuple(s) for s in values["sources"])})
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: {e}") from e


def _toml_sources(sources: Any, where: str) -> list[tuple[str, Any]]:
    if not isinstance(sources, list):
        raise InputError(f"{where}: sources must be [[sources]] tables of path and weight")
    out = []
    for k, table in enumerate(sources):
        if not isinstance(table, dict) or sorted(table) != ["path", "weight"]:
            raise InputError(f"{where}: sources[{k}]={show(table)} must hold exactly path and weight")
        out.append((table["path"], table["weight"]))
    return out


# ----------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class MixSummary:
    output: str
    manifest: dict[str, Any]

    def lines(self) -> list[str]:
        m = self.manifest
        return [f"mixed {self.output}: {m['num_chunks']:,} chunks of {m['context_length']} tokens from "
                f"{len(m['sources'])} source(s), seed {m['seed']} (index only, nothing copied)",
                *source_table(m)]


def run_mix(config: MixConfig) -> MixSummary:
    """Check the sources, then publish the mix's manifest (lock, staging, one rename; raypack.pack.publish)."""
    from raypack.pack.publish import run_published

    def plan() -> dict[str, Any]:
        _refuse_a_source_twice(config)
        return build_mix_manifest(config, [_open_source(path, k) for k, (path, _) in enumerate(config.sources)])

    def write(target, manifest: dict[str, Any]) -> dict[str, Any]:
        target.sweep(set())
        write_manifest(target.work_dir, manifest)
        return manifest

    _refuse_output_over_source(config)
    return MixSummary(config.output, run_published(config.output, overwrite=config.overwrite, resume=False,
                                                   plan=plan, write=write, resumable=False))


def _open_source(path: str, k: int) -> PackedDataset:
    data, where = read_manifest_json(path)
    if is_mix(data):
        raise InputError(f"source {k} ({path}) is itself a mix; a mix of mixes is not supported: list its sources")
    ds = open_packed(path, data, where)
    if len(ds) == 0:
        raise InputError(f"source {k} ({path}) holds no chunks; a mix draws chunks from every source: drop it")
    return ds


def _refuse_a_source_twice(config: MixConfig) -> None:
    """One output listed twice (under any spelling) is one line: each entry took its own share and passes,
    so chunks repeated within what read as one pass (a new user's trial); its weights add up instead."""
    seen: dict[str, int] = {}
    for k, (path, _) in enumerate(config.sources):
        first = seen.setdefault(same_file_key(path), k)
        if first != k:
            weights = config.sources[first][1] + config.sources[k][1]
            raise InputError(f"source {k} ({path}) is source {first} ({config.sources[first][0]}) again; list it once, "
                             f"with the sum of its weights ({weights:g})")


def _refuse_output_over_source(config: MixConfig) -> None:
    if is_uri(config.output):
        return
    out = os.path.abspath(config.output)
    for k, (path, _) in enumerate(config.sources):
        if not is_uri(path) and os.path.commonpath([out, os.path.abspath(path)]) in (out, os.path.abspath(path)):
            raise InputError(f"--output {config.output} and source {k} ({path}) overlap; write the mix elsewhere")


def build_mix_manifest(config: MixConfig, datasets: Sequence[PackedDataset]) -> dict[str, Any]:
    """The mix's manifest (docs/FORMAT.md, "Mix"); InputError when the sources disagree on context
    length, token dtype or pad token (naming both sources and values)."""
    first = datasets[0]
    for k, ds in enumerate(datasets[1:], 1):
        for what in ("context_length", "token_dtype", "pad_token"):
            if getattr(ds, what) != getattr(first, what):
                raise InputError(f"source {k} ({config.sources[k][0]}) has {what}={getattr(ds, what)} but source 0 "
                                 f"({config.sources[0][0]}) has {what}={getattr(first, what)}; mix outputs packed "
                                 "with the same context length, token dtype and pad token")
        if ds.extra_columns != first.extra_columns:
            raise InputError(_side_columns_differ(k, config.sources[k][0], ds, config.sources[0][0], first))
    if not config.allow_mixed_tokenizers:
        _refuse_mixed_tokenizers(config, datasets)
    weights = [w for _, w in config.sources]
    shares = apportion(weights, config.num_chunks)
    return {
        "kind": MIX_KIND,
        "format_version": MIX_FORMAT_VERSION,
        "created_by": f"raypack {_version()}",
        "context_length": first.context_length,
        "pad_token": first.pad_token,
        "token_dtype": first.token_dtype.name,
        "num_chunks": config.num_chunks,
        "seed": config.seed,
        "order": ORDER_NAME,
        "sources": [{"path": _recorded_path(path, config.output), "content_sha256": ds.manifest.content_sha256,
                     "num_chunks": len(ds), "strategy": ds.manifest.strategy_name,
                     "weight": weight, "share": share, "passes": share // len(ds)}
                    for (path, weight), ds, share in zip(config.sources, datasets, shares)],
    }


def _refuse_mixed_tokenizers(config: MixConfig, datasets: Sequence[PackedDataset]) -> None:
    """Sources whose manifests record different tokenizers: one line naming two of them. A source
    packed from token ids records none and is not compared."""
    named = [(k, ds.manifest.tokenizer_identity) for k, ds in enumerate(datasets)
             if ds.manifest.tokenizer_identity is not None]
    for k, identity in named[1:]:
        first, first_identity = named[0]
        if identity != first_identity:
            raise InputError(f"source {k} ({config.sources[k][0]}) was tokenized with {_tokenizer_name(identity)} but "
                             f"source {first} ({config.sources[first][0]}) with {_tokenizer_name(first_identity)}: "
                             "their ids mean different tokens; mix outputs of one tokenizer, or pass "
                             "--allow-mixed-tokenizers if that is what you mean")


def _tokenizer_name(identity: dict[str, Any]) -> str:
    if identity.get("name"):
        return f"{identity.get('kind')} {identity['name']}"
    return f"a tokenizer.json (sha256 {str(identity.get('sha256', ''))[:12]}...)"


def _recorded_path(path: str, output: str) -> str:
    """A local source of a local mix relative to the mix directory; otherwise absolute or the URI."""
    if is_uri(path):
        return path
    if is_uri(output):
        return os.path.abspath(path)
    # real paths, as source_location joins to the mix directory's real path
    return os.path.relpath(os.path.realpath(path), os.path.realpath(output)).replace(os.sep, "/")


def _version() -> str:
    from raypack import __version__

    return __version__


# ----------------------------------------------------------------------------- checking


class MixSource(NamedTuple):
    """One source of a mix as its manifest records it (checked)."""

    path: str
    content_sha256: str
    num_chunks: int
    strategy: str
    weight: float | int
    share: int
    passes: int


class MixManifest(ChunkLayout):
    """A mix's manifest, checked (:meth:`from_dict`: :func:`check_mix_manifest`); ``manifest[key]``
    gives a JSON field, readers use the typed properties."""

    __slots__ = ()

    @classmethod
    def from_dict(cls, data: Any, where: str) -> MixManifest:
        check_mix_manifest(data, where)
        return cls(data)


    @property
    def num_chunks(self) -> int:
        return self._data["num_chunks"]

    @property
    def seed(self) -> int:
        return self._data["seed"]

    @property
    def order(self) -> str:
        return self._data["order"]

    @property
    def sources(self) -> tuple[MixSource, ...]:
        return tuple(MixSource(*(entry[key] for key in _SOURCE_KEYS)) for entry in self._data["sources"])


def is_mix(data: Any) -> bool:
    """Whether parsed manifest JSON is a mix's."""
    return isinstance(data, dict) and data.get("kind") == MIX_KIND


def check_mix_manifest(data: Any, where: str) -> None:
    """Raise InputError naming ``where``, the entry and the value unless ``data`` is a well-formed
    mix manifest: every field typed and in range, shares equal to the rule's apportionment of
    num_chunks by the weights, passes = share // num_chunks. O(sources)."""
    if not is_mix(data) or data.get("format_version") != MIX_FORMAT_VERSION:
        raise InputError(f"{where}: format_version={show(data.get('format_version'))} of a mix is not "
                         f"{MIX_FORMAT_VERSION}; read it with the raypack version that wrote it")
    if data.get("order") != ORDER_NAME:
        raise InputError(f"{where}: order={show(data.get('order'))}, this reader computes {ORDER_NAME!r} only")
    int_field(data, "context_length", where, 1, MAX_CONTEXT_LENGTH)
    dtype = token_dtype_field(data, where)
    int_field(data, "pad_token", where, int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    num_chunks = int_field(data, "num_chunks", where, 1)
    int_field(data, "seed", where, 0, MAX_SEED)
    sources = data.get("sources")
    if not isinstance(sources, list) or not 1 <= len(sources) <= MAX_SOURCES:
        raise InputError(f"{where}: sources={show(sources)}, expected a list of 1..{MAX_SOURCES} sources; {_DAMAGED}")
    for k, entry in enumerate(sources):
        _check_source_entry(entry, f"{where}: sources[{k}]")
    shares = apportion([s["weight"] for s in sources], num_chunks)
    for k, (entry, share) in enumerate(zip(sources, shares)):
        if entry["share"] != share or entry["passes"] != share // entry["num_chunks"]:
            raise InputError(f"{where}: sources[{k}] share={entry['share']} passes={entry['passes']}, but the "
                             f"weights give share={share} passes={share // entry['num_chunks']}; {_DAMAGED}")


def _check_source_entry(entry: Any, label: str) -> None:
    if not isinstance(entry, dict) or any(key not in entry for key in _SOURCE_KEYS):
        raise InputError(f"{label}={show(entry)} lacks one of {', '.join(_SOURCE_KEYS)}; {_DAMAGED}")
    if not isinstance(entry["path"], str) or not entry["path"] or "\0" in entry["path"]:
        raise InputError(f"{label}: path={show(entry['path'])}, expected a path; {_DAMAGED}")
    if not is_hex(entry["content_sha256"], 64):
        raise InputError(f"{label}: content_sha256={show(entry['content_sha256'])}, expected 64 hex digits; "
                         f"{_DAMAGED}")
    if not isinstance(entry["strategy"], str):
        raise InputError(f"{label}: strategy={show(entry['strategy'])}, expected a string; {_DAMAGED}")
    int_field(entry, "num_chunks", label, 1)
    int_field(entry, "share", label)
    int_field(entry, "passes", label)
    check_weight(entry["weight"], label)


def source_location(mix_path: str, recorded: str) -> str:
    """Where a recorded source path points: URIs and absolute paths as they are, a relative path
    joined to the (local) mix directory."""
    if is_uri(recorded) or os.path.isabs(recorded):
        return recorded
    if is_uri(mix_path):
        raise InputError(f"{mix_path}: source path {recorded!r} is relative, but a mix on an object store must "
                         f"name its sources by URI; {_DAMAGED}")
    # the mix directory's real path: through a symbolic link, '..' is the link target's parent (a trial)
    return os.path.normpath(os.path.join(os.path.realpath(mix_path), recorded))


def check_sources(mix_path: str, manifest: MixManifest, where: str) -> list[PackedDataset]:
    """Open every source (each checked by ``read_packed`` as untrusted input) and compare its manifest
    with what the mix recorded; a changed source is one InputError naming it. One manifest read per
    distinct source path; O(sources) comparisons."""
    datasets, opened = [], {}  # a path listed many times is opened once (65,536 of one output took 29 s)
    for k, entry in enumerate(manifest.sources):
        path = source_location(mix_path, entry.path)
        ds = opened[path] if path in opened else opened.setdefault(path, _open_moved(path, k, entry.path, where))
        found = {"content_sha256": ds.manifest.content_sha256, "num_chunks": len(ds),
                 "context_length": ds.context_length, "token_dtype": ds.token_dtype.name, "pad_token": ds.pad_token}
        recorded = {"context_length": manifest.context_length, "token_dtype": manifest.token_dtype.name,
                    "pad_token": manifest.pad_token, "content_sha256": entry.content_sha256,
                    "num_chunks": entry.num_chunks}
        for key, value in found.items():
            if value != recorded[key]:
                raise InputError(f"{where}: source {k} ({path}) changed since the mix was made: {key}={value}, the "
                                 f"mix recorded {recorded[key]}; make the mix again (raypack mix ... --overwrite)")
        if datasets and ds.extra_columns != datasets[0].extra_columns:  # a mix made before mix refused it
            raise InputError(f"{where}: " + _side_columns_differ(k, path, ds, "its first source", datasets[0]))
        datasets.append(ds)
    return datasets


def _open_moved(path: str, k: int, recorded: str, where: str) -> PackedDataset:
    """:func:`_open_source`, where a source that is not there says how the mix names it (a mix copied away
    from its sources said only "PATH: no such output directory": a new user's trial)."""
    if is_uri(path) or os.path.exists(path):
        return _open_source(path, k)
    relative = not os.path.isabs(recorded)
    how = "relative to the mix: a mix and its sources move together" if relative else "by that path"
    raise InputError(f"{where}: source {k} is not there: {path} (the mix records it as {recorded!r}, {how}); "
                     "put it back, or make the mix again from where the sources are now")


def _side_columns_differ(k: int, path: str, ds: PackedDataset, first_path: str, first: PackedDataset) -> str:
    """Sources with other side columns: a batch of the mix would have a column for some rows only (it read
    uninitialised memory for the others, and a collate dropped the column for all)."""
    def names(d: PackedDataset) -> str:
        return ", ".join(f"{c.name} ({c.type})" for c in d.extra_columns) or "none"

    return (f"source {k} ({path}) has side columns {names(ds)} but source 0 ({first_path}) has {names(first)}; "
            "mix outputs packed with the same --extra-columns")


# ----------------------------------------------------------------------------- reading


def open_mix(path: str, data: Any, where: str) -> MixedDataset:
    """The mix at ``path`` whose parsed manifest is ``data`` (read from ``where``): checked, its
    sources opened and compared with the recorded ones (:func:`check_sources`)."""
    manifest = MixManifest.from_dict(data, where)
    return MixedDataset(path, manifest, check_sources(path, manifest, where))


class MixedDataset(BatchReads):
    """The items of a mix in its order, read lazily from the source outputs.

    The interface of :class:`raypack.packed.reader.PackedDataset`: ``ds[i]`` -> ``{"input_ids": (C,),
    "doc_ids": (C,) int64, "source": int}`` (the source's chunk as its reader gives it, plus
    the source's index), batches add ``"source"`` (n,) int64. Doc ids are the source's own.
    Cost of ``ds[i]``: two keyed permutations (raypack.mix.order, a few µs) and the source's ``ds[j]``.
    """

    def __init__(self, path: str, manifest: MixManifest, sources: Sequence[PackedDataset]) -> None:
        self.path = path
        self.manifest = manifest
        self.sources = list(sources)
        self.context_length = manifest.context_length
        self.pad_token = manifest.pad_token
        self.token_dtype = manifest.token_dtype
        sources = manifest.sources
        self.order = MixOrder(manifest.seed, [s.share for s in sources], [s.num_chunks for s in sources])

    def __len__(self) -> int:
        return len(self.order)

    @property
    def content_sha256(self) -> str:
        """A digest of what the mix reads in which order: its rules, seed and item count, and each
        source's content_sha256, chunk count and share (sha256 of their canonical JSON). Not stored:
        a mix manifest records its sources' digests, which this one hashes."""
        fields = {"order": self.manifest["order"], "seed": self.manifest["seed"], "num_chunks": len(self),
                  "sources": [[s["content_sha256"], s["num_chunks"], s["share"]] for s in self.manifest["sources"]]}
        return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def __repr__(self) -> str:
        return (f"MixedDataset({self.path!r}, chunks={len(self)}, sources={len(self.sources)}, "
                f"seed={self.order.seed}, context_length={self.context_length})")

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Item ``index`` (negative counts from the end): the source's chunk and ``"source"``."""
        i = operator.index(index)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"chunk index {index} is out of range for {len(self)} chunks")
        k, chunk = self.order.locate(i)
        item = self.sources[k][chunk]
        item["source"] = k
        return item

    def get_batch(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Items ``[start, stop)``: ``{"input_ids": (n, C), "doc_ids": (n, C) int64, "source": (n,) int64}``."""
        start, stop = operator.index(start), operator.index(stop)
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"get_batch({start}, {stop}) is out of range; need 0 <= start <= stop <= {len(self)}")
        return self.take(np.arange(start, stop, dtype=np.int64))

    def take(self, items: npt.ArrayLike) -> dict[str, np.ndarray]:
        """Items at the positions ``items`` (each in [0, len)), as :meth:`get_batch` gives them. The
        chunks are read grouped by source, each source's in increasing chunk order (file order)."""
        items = np.asarray(items, dtype=np.int64).reshape(-1)
        if items.size and not (0 <= items.min() and items.max() < len(self)):
            raise IndexError(f"take: positions {items.min()}..{items.max()} are out of range for {len(self)} chunks")
        draws = self.order.locate_array(items)
        n, c = draws.sources.size, self.context_length
        batch = {"input_ids": np.empty((n, c), self.token_dtype), "doc_ids": np.empty((n, c), np.int64)}
        for k in np.unique(draws.sources).tolist():
            rows = np.flatnonzero(draws.sources == k)
            rows = rows[np.argsort(draws.chunks[rows], kind="stable")]
            for row, chunk in zip(rows.tolist(), draws.chunks[rows].tolist()):
                for key, value in self.sources[k][chunk].items():
                    if key not in batch:
                        batch[key] = np.empty((n, *np.shape(value)), np.asarray(value).dtype)
                    batch[key][row] = value
        batch["source"] = draws.sources
        return batch

    def to_ray_dataset(self, batch_rows: int | None = None):
        """A ``ray.data.Dataset`` of the items in order (columns ``input_ids``, ``doc_ids``,
        ``source``); :func:`raypack.engine.pipeline.mixed_to_ray_dataset`, imported on first use."""
        from raypack.engine.pipeline import mixed_to_ray_dataset

        return mixed_to_ray_dataset(self, batch_rows)

    def close(self) -> None:
        """Close every source's open files; reading again reopens them."""
        for source in self.sources:
            source.close()

    def __enter__(self) -> MixedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- stats


def source_table(manifest: dict[str, Any]) -> list[str]:
    """One line per source: weight, share (items), whole passes + remainder, fraction of the mix."""
    total = manifest["num_chunks"]
    weights = sum(s["weight"] for s in manifest["sources"])
    lines = [f"  {'source':<6} {'weight':>10} {'share':>14} {'passes':>22} {'fraction':>9}  path"]
    for k, s in enumerate(manifest["sources"]):
        remainder = s["share"] - s["passes"] * s["num_chunks"]
        passes = f"{s['passes']:,} + {remainder:,}/{s['num_chunks']:,}"
        lines.append(f"  {k:<6} {s['weight'] / weights:>10.4f} {s['share']:>14,} {passes:>22} "
                     f"{s['share'] / total:>9.4f}  {s['path']}")
    return lines


@dataclass(frozen=True)
class MixStats:
    """``raypack stats MIX``: the sources' shares and passes (from the checked manifest; every
    source opened and compared with the recorded one)."""

    path: str
    manifest: dict[str, Any]

    def lines(self) -> list[str]:
        m = self.manifest
        return [f"mix              {m['num_chunks']:>14,}  chunks of {m['context_length']} tokens "
                f"({m['token_dtype']}), seed {m['seed']}, order {m['order']}",
                "  (weight: normalised; passes: whole passes + chunks of the last partial pass / source chunks)",
                *source_table(m)]


def mix_stats(path: str, data: Any, where: str) -> MixStats:
    ds = open_mix(path, data, where)
    ds.close()
    return MixStats(path, ds.manifest)
