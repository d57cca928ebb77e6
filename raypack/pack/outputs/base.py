"""What both kinds of output refuse alike, and what a run writes under an output: the names it owns.

An output is replaced whole, so ``--overwrite`` takes only an output a raypack run wrote
(:func:`refuse_foreign`); a ``--resume`` of a complete output whose manifest does not load is said as
that (:func:`refuse_damaged`). pyarrow and the output's file names only, no Ray.
"""

from __future__ import annotations

from raypack.errors import InputError
from raypack.pack.resume import RESULTS_DIR
from raypack.packed.manifest import read_manifest_json
from raypack.packed.writer import CHUNK_FILE_RE, MANIFEST_NAME, TMP_PREFIX
from raypack.tokenize.corpus import PART_FILE_RE, TOKENIZED_SUBDIR

__all__ = ["is_run_object", "refuse_damaged", "refuse_foreign"]


def refuse_damaged(out: str) -> None:
    """A resume of a published output whose manifest does not load (truncated, edited): said as that, with
    the fix, not as 'already complete'. Reads the manifest (on this refusal's path only)."""
    try:
        data, _ = read_manifest_json(out)
    except InputError as e:
        raise InputError(f"output {out} has a manifest.json that does not load ({e}); nothing to resume: pass "
                         "--overwrite instead of --resume to pack it again") from e
    if not isinstance(data, dict) or not data:
        raise InputError(f"output {out} has a manifest.json that holds no manifest; nothing to resume: pass "
                         "--overwrite instead of --resume to pack it again")


def refuse_foreign(out: str, foreign: list[str], *, overwrite: bool) -> None:
    """An output that holds anything a run does not write is refused, ``--overwrite`` or not: it replaces
    an output whole, so a mistyped ``--output`` naming a home or data directory would be deleted. The line
    says why ``--overwrite`` does not take it only where ``--overwrite`` was given (it said so to a
    ``--resume``: an operator's trial)."""
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        why = " (an output is replaced whole, so --overwrite takes only a raypack output)" if overwrite else ""
        raise InputError(f"output {out} holds {sorted(foreign)[0]!r}{more}, which raypack did not write{why}; "
                         "choose another --output, or remove those files first")


def is_run_object(name: str) -> bool:
    """An object a raypack run writes under its output prefix."""
    return (name == MANIFEST_NAME or name.startswith((f"{RESULTS_DIR}/", TMP_PREFIX, f"{TOKENIZED_SUBDIR}/"))
            or CHUNK_FILE_RE.match(name) is not None or PART_FILE_RE.match(name) is not None)
