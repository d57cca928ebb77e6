"""Packing strategies: the registry, the one place that maps a strategy's name to its class.

A strategy is a frozen, keyword-only dataclass (:class:`~raypack.strategies.base.PackingStrategy`)
in its own folder (``concat/``, ``best_fit/``: the class, its verify structure check, its own
rules); its fields are its options (:mod:`raypack.strategies.options`). Config validation, CLI
choices and flags, the manifest's strategy fields, the plan's chunk count, the shard packer,
stats, the dry run, the run summary and verify all ask the object this registry builds. Adding a
strategy: write its folder and add one line to :data:`STRATEGIES`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from raypack.errors import InputError
from raypack.io.untrusted import show
from raypack.strategies.base import PackingStrategy, StrategyFigures
from raypack.strategies.best_fit import BestFit
from raypack.strategies.concat import Concat
from raypack.strategies.options import from_manifest, from_options, option_keys

__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "PackingStrategy", "StrategyFigures", "configured_strategy",
           "default_strategy", "make_strategy", "option_fields", "strategy_names", "strategy_of_manifest"]

STRATEGIES: dict[str, type[PackingStrategy]] = {"concat": Concat, "best_fit": BestFit}
DEFAULT_STRATEGY = "concat"
"""The strategy of a config without ``strategy`` and of a manifest without ``"strategy"``."""


def strategy_names() -> tuple[str, ...]:
    return tuple(STRATEGIES)


def strategy_class(name: Any) -> type[PackingStrategy]:
    """The registered class of ``name``; ValueError listing the registered names otherwise."""
    if not isinstance(name, str) or name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} must be one of {', '.join(strategy_names())}")
    return STRATEGIES[name]


def make_strategy(name: str = DEFAULT_STRATEGY, **options: Any) -> PackingStrategy:
    """Strategy ``name`` with ``options`` by field name (``make_strategy("best_fit", window=16)``)."""
    return strategy_class(name)(**options)


def configured_strategy(name: str, options: Mapping[str, Any]) -> PackingStrategy:
    """Strategy ``name`` from options by key (``{"best_fit_window": 16}``); other strategies' keys are ignored."""
    return from_options(strategy_class(name), dict(options))


def default_strategy() -> PackingStrategy:
    return make_strategy(DEFAULT_STRATEGY)


def option_fields() -> dict[str, tuple[type[PackingStrategy], dataclasses.Field]]:
    """``{key: (strategy class, field)}`` of every registered strategy's options, in registry order."""
    fields: dict[str, tuple[type[PackingStrategy], dataclasses.Field]] = {}
    for name, cls in STRATEGIES.items():
        if cls.name != name:
            raise RuntimeError(f"internal error: STRATEGIES[{name!r}] is {cls.__name__}, named {cls.name!r}")
        for key, field in option_keys(cls).items():
            if key in fields:
                raise RuntimeError(f"internal error: option {key} of {name} is also {fields[key][0].name}'s")
            fields[key] = (cls, field)
    return fields


def strategy_of_manifest(manifest: Mapping[str, Any], where: str = "manifest.json") -> PackingStrategy:
    """The strategy a manifest names (none: concat), its options read back and checked; InputError
    naming ``where`` when the name is unknown or an option or the strategy's own fields are bad."""
    name = manifest.get("strategy", DEFAULT_STRATEGY)
    if not isinstance(name, str) or name not in STRATEGIES:
        raise InputError(f"{where}: strategy={show(name)} is unknown; expected one of "
                         f"{', '.join(strategy_names())} (no strategy: {DEFAULT_STRATEGY})")
    return from_manifest(STRATEGIES[name], dict(manifest), where)
