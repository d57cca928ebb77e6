"""A strategy's options, in and out: the codec every strategy shares (none overrides it).

A strategy's dataclass fields are its options (e.g. best_fit's ``window``). Outside the
strategy an option is named ``{strategy name}_{field}`` (``best_fit_window``): that one key is
the config key, the manifest key and, with dashes, the CLI flag (``--best-fit-window``), so two
strategies' options never collide with each other or with the job's own keys. A field's metadata
may give ``help``, ``metavar``, ``doc``, ``type`` (the CLI type when the default is None),
``aliases`` (more CLI spellings) and ``only_when_chosen`` (set with another strategy chosen, the
config is refused rather than the option ignored).

The registry (raypack.strategies) reads options from a config (:func:`from_options`) and from a
manifest (:func:`from_manifest`); a strategy checks its own in ``__post_init__``, e.g. with
:func:`check_int_option`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from raypack.errors import InputError
from raypack.io.untrusted import show

if TYPE_CHECKING:
    from raypack.strategies.base import PackingStrategy

MAX_OPTION_INT = 1 << 53
"""Largest integer option (as :data:`raypack.packed.manifest.MAX_COUNT`): far inside int64 arithmetic."""


def option_key(cls: type[PackingStrategy], field_name: str) -> str:
    """The config / manifest key of option ``field_name`` (``best_fit`` + ``window``)."""
    return f"{cls.name}_{field_name}"


def option_keys(cls: type[PackingStrategy]) -> dict[str, dataclasses.Field]:
    """``{key: field}`` of every option of ``cls``, in field order."""
    return {option_key(cls, f.name): f for f in dataclasses.fields(cls)}


def options_of(strategy: PackingStrategy) -> dict[str, Any]:
    """``{key: value}`` of every option that is set: an option whose default is None (e.g. a
    limit that is off unless asked for) is left out while it is None, so adding one changes no
    existing manifest, fingerprint or resume record."""
    return {option_key(type(strategy), f.name): getattr(strategy, f.name) for f in dataclasses.fields(strategy)
            if getattr(strategy, f.name) is not None}


def from_options(cls: type[PackingStrategy], options: dict[str, Any]) -> PackingStrategy:
    """``cls`` built from the keys of ``options`` that are its own (others are ignored); a
    missing option takes its default. ValueError names a bad value by its key."""
    return cls(**{f.name: options[key] for key, f in option_keys(cls).items() if key in options})


def from_manifest(cls: type[PackingStrategy], manifest: dict[str, Any], where: str) -> PackingStrategy:
    """``cls`` with its options read back from a manifest's top level; InputError naming ``where``
    when one is missing or bad. Then the strategy's own :meth:`~PackingStrategy.check_manifest`."""
    missing = [key for key, f in option_keys(cls).items() if key not in manifest and f.default is not None]
    if missing:
        raise InputError(f"{where}: a {cls.name} manifest needs {', '.join(missing)}; "
                         "the output was replaced or damaged")
    try:
        strategy = from_options(cls, manifest)
    except (TypeError, ValueError) as e:
        raise InputError(f"{where}: {e}; the output was replaced or damaged") from e
    strategy.check_manifest(manifest, where)
    return strategy


def check_int_option(strategy: PackingStrategy, field_name: str, least: int) -> None:
    """Raise ValueError naming the option's key unless it is an int (not bool) in ``[least, 2**53]``."""
    value = getattr(strategy, field_name)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_OPTION_INT:
        raise ValueError(f"{option_key(type(strategy), field_name)}={show(value)} must be an integer >= {least} "
                         f"(at most 2**53)")
