"""``raypack verify MIX``: a mix (raypack.mix.dataset) is checked through its sources.

  1. The mix's manifest passes :func:`raypack.mix.dataset.check_mix_manifest` (fields typed and in
     range, shares and passes equal to the rules' apportionment of its weights).
  2. Every source's manifest still records the ``content_sha256``, chunk count, context length,
     token dtype and pad token the mix recorded (:func:`raypack.mix.dataset.check_sources`): a source
     that changed is one line naming it, since the mix's items would no longer be what it promised.
  3. Every source is verified as an output of its own, without its inputs
     (:func:`raypack.verify.verify_output` with ``inputs=[]``: every byte hashed, the structure
     checked, ``content_sha256`` recomputed from the chunks). Verify a source with its inputs
     by running ``raypack verify SOURCE``.
Cost: the sum of the sources' verifications; the mix itself adds O(sources).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from raypack.errors import InputError
from raypack.verify.report import VerifyError, VerifyReport

if TYPE_CHECKING:
    from raypack.mix.dataset import MixManifest

__all__ = ["MixVerifyReport", "verify_mix"]


@dataclass(frozen=True)
class MixVerifyReport:
    output: str
    manifest: MixManifest
    sources: tuple[tuple[str, VerifyReport], ...]
    """(resolved path, its report) per source, in order."""

    def lines(self) -> list[str]:
        m = self.manifest
        out = [f"verified mix {self.output}",
               f"  items            {m.num_chunks:>14,}  of {m.context_length} tokens, seed {m.seed}",
               f"  sources          {len(self.sources):>14,}  (each as recorded, each verified; inputs not compared)"]
        for k, (path, report) in enumerate(self.sources):
            out.append(f"    {k}: {path}  {report.num_chunks:,} chunks, {report.num_files:,} files, sha256 ok, "
                       f"content_sha256 {report.content_sha256[:16]}...")
        return out


def verify_mix(out: str, data: Any, where: str, inputs: Sequence[str] | None = None) -> MixVerifyReport:
    """Check the mix at ``out`` (parsed manifest ``data`` read from ``where``); VerifyError at the first
    discrepancy. ``inputs`` must be None or empty: a mix has no inputs of its own."""
    from raypack.mix.dataset import MixManifest, check_sources, source_location
    from raypack.verify.output import verify_packed

    if inputs:
        raise InputError(f"{out} is a mix: it has no inputs of its own; verify each source with its inputs "
                         "(raypack verify SOURCE --input ...)")
    try:
        manifest = MixManifest.from_dict(data, where)
        datasets = check_sources(out, manifest, where)
    except InputError as e:
        raise VerifyError(str(e)) from e
    for ds in datasets:
        ds.close()
    reports = []
    for k, entry in enumerate(manifest.sources):
        path = source_location(out, entry.path)
        try:
            reports.append((path, verify_packed(path, [])))
        except VerifyError as e:
            raise VerifyError(f"source {k} of the mix {out}: {e}") from e
    return MixVerifyReport(out, manifest, tuple(reports))
