"""What ``raypack verify`` raises (:class:`VerifyError`) and returns (:class:`VerifyReport`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VerifyError", "VerifyReport"]


class VerifyError(ValueError):
    """The output breaks the format or differs from its inputs; the message says where and how."""


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`raypack.verify.verify_output` checked; every count was read, and matched the manifest."""

    output: str
    num_files: int
    num_bytes: int
    num_chunks: int
    context_length: int
    num_tokens: int
    num_padding_positions: int
    num_documents: int
    """The manifest's document count (>= max doc id + 1; equal to the inputs' when compared)."""
    num_split_documents: int
    num_segments: int
    content_sha256: str
    inputs_compared: bool
    num_shards: int
    """Input shards compared (0 when inputs were not compared)."""
    seconds: float
    strategy: str
    """The manifest's strategy (raypack.strategies)."""
    strategy_note: str = ""
    """Shown beside the strategy's name, in parentheses: its structure check's
    :meth:`~raypack.verify.structure.Structure.report_note` ("": nothing)."""
    input_paths: tuple[str, ...] = ()
    """The input shards read, in order (empty when inputs were not compared)."""
    long_docs: str = "split"
    """The manifest's long-document policy: split, truncate or drop."""
    long_doc_counts: tuple[int, int] = (0, 0)
    """(documents, tokens) truncated or dropped, as the manifest counts them and verify re-counted."""
    extra_columns: tuple[str, ...] = ()
    """Side columns checked with the tokens (``name type fill=F``), if any."""
    inputs_note: str = ""
    """Why the inputs were not compared (text tokenized inside the run, shards gone, ...), "" when they were."""

    def lines(self) -> list[str]:
        rate = self.num_tokens / self.seconds if self.seconds > 0 else 0.0
        kept = "x" if self.long_docs == "split" else f"{self.long_docs}(x)"
        inputs = (f"{self.num_shards} shard(s), {self.num_documents:,} documents: unpack(pack(x)) == {kept}"
                  if self.inputs_compared else "not compared" + (f" ({self.inputs_note})" if self.inputs_note else ""))
        cut = ([] if self.long_docs == "split" else
               [f"  long documents   {self.long_docs:>14}  ({self.long_doc_counts[0]:,} documents, "
                f"{self.long_doc_counts[1]:,} tokens {'cut off' if self.long_docs == 'truncate' else 'left out'})"])
        return [
            f"verified {self.output}",
            f"  files            {self.num_files:>14,}  ({self.num_bytes:,} bytes, sha256 ok)",
            f"  chunks           {self.num_chunks:>14,}  of {self.context_length} tokens",
            f"  strategy         {self.strategy:>14}" + (f"  ({self.strategy_note})" if self.strategy_note else ""),
            f"  tokens           {self.num_tokens:>14,}",
            f"  padding          {self.num_padding_positions:>14,}",
            f"  documents        {self.num_documents:>14,}",
            f"  split documents  {self.num_split_documents:>14,}",
            *cut,
            *([f"  side columns     {', '.join(self.extra_columns)}"] if self.extra_columns else []),
            f"  inputs           {inputs}",
            *(f"    read {path}" for path in self.input_paths[:3]),
            *([f"    ... and {len(self.input_paths) - 3:,} more shard(s)"] if len(self.input_paths) > 3 else []),
            f"  content_sha256   {self.content_sha256}",
            f"  time             {self.seconds:>14.2f}s  ({rate / 1e6:,.1f}M tokens/s)",
        ]
