"""``raypack verify OUT --check-tokenizer [N]``: N documents of an output packed from text, read
again from their text files, encoded again with the tokenizer's reference library, and compared
with the output's tokens, token for token.

Whichever backend computed the ids (raypack.tokenize.backends), they must be the reference
library's: this checks it after the fact, on any output whose manifest records its tokenizer and
its text sources (``pack --tokenizer``, or ``tokenize`` then ``pack``). Which documents: N global
doc ids spread evenly over the output (the first and the last included), so the check is the same
on every run. The tokenizer file must still hash to the recorded sha256 (tiktoken encodings are
named, their rank files ship with bpe-openai).

A mix (raypack mix): each of its sources packed from text, N documents each.

Cost: reading the text ranges that hold the chosen documents (at most one task per document),
encoding only those documents, and one pass over the output's doc ids (``np.isin`` per batch).
Memory: one output batch plus the chosen documents' tokens, plus what the reference library needs
to encode one of them (``tokenizers``: ~110-230 bytes a byte of text). So a chosen document of more than
``max_document_bytes`` (pack's default, 16 MiB; verify's ``--max-document-bytes``) is not
re-encoded: the report counts it (an output packed with a raised limit held a 50 MB document, which
took verify to 5.1 GB).
"""

from __future__ import annotations

import os
from typing import Any, Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raypack.errors import InputError
from raypack.inputs.registry import format_named
from raypack.io.fs import is_file
from raypack.outputs import read_packed
from raypack.packed.manifest import MIX_KIND, Manifest, load_manifest, read_manifest_json
from raypack.rules.arrays import arrow_array, numpy_values
from raypack.rules.long_docs import DEFAULT_LONG_DOCS
from raypack.tokenize.tasks import MAX_DOCUMENT_BYTES
from raypack.tokenize.tokenizers import encode_naming, load_tokenizer
from raypack.verify.inputs import check_shard_sources
from raypack.verify.report import VerifyError

DEFAULT_DOCUMENTS = 64
OUTPUT_BATCH_CHUNKS = 1024


class TextSource(NamedTuple):
    """The text one packed shard came from: its file, format and task range, and its doc ids."""

    path: str
    format: str
    start: int
    end: int
    doc_offset: int
    num_docs: int


CANNOT_CHECK = ("so it cannot be checked against the output; give --check-tokenizer another count, which "
                "samples other documents")


def check_count(num_docs: int) -> None:
    """InputError for a ``--check-tokenizer`` count that is not a number of documents >= 1."""
    if isinstance(num_docs, bool) or not isinstance(num_docs, int) or num_docs < 1:
        raise InputError(f"--check-tokenizer {num_docs!r}: give a number of documents >= 1")


def check_max_document_bytes(max_document_bytes: object) -> None:
    """InputError unless ``max_document_bytes`` is a number of bytes >= 1."""
    if isinstance(max_document_bytes, bool) or not isinstance(max_document_bytes, int) or max_document_bytes < 1:
        raise InputError(f"--max-document-bytes {max_document_bytes!r}: give a number of bytes >= 1")


def check_tokenizer(out: str, num_docs: int = DEFAULT_DOCUMENTS,
                    max_document_bytes: int = MAX_DOCUMENT_BYTES, tokenizer: str | None = None) -> list[str]:
    """Re-encode ``num_docs`` documents of ``out`` with the reference tokenizer; report lines, or
    VerifyError naming the first document that differs (InputError: nothing to check against).
    A chosen document of more than ``max_document_bytes`` of text is counted, not re-encoded.
    ``tokenizer``: the tokenizer.json packed with, where it is now (the manifest's sha256 must match)."""
    check_count(num_docs)
    check_max_document_bytes(max_document_bytes)
    data, where = read_manifest_json(out)
    if isinstance(data, dict) and data.get("kind") == MIX_KIND:
        if tokenizer is not None:
            raise InputError(f"--tokenizer names one tokenizer; {out} is a mix, whose sources each record theirs: "
                             "verify a source with it instead")
        return _check_mix(out, data, where, num_docs, max_document_bytes)
    manifest = load_manifest(out)
    check_shard_sources(manifest, where)
    record = manifest.tokenizer_record
    sources = text_sources(manifest)
    if record is not None and not sources and manifest.counts.documents == 0:  # empty text files: it said
        return ["  tokenizer                     no documents to re-encode (the output holds none)"]  # "no tokenizer"
    if record is None or not sources:
        raise InputError(f"{out} was not packed from text (its manifest records no tokenizer and no text source); "
                         "--check-tokenizer needs an output of pack --tokenizer, or of tokenize then pack with "
                         "--input the tokenized corpus's directory (part files given one by one, or by a glob, are "
                         "packed as token files and carry no tokenizer)")
    tokenizer = _reference(record["identity"], out, tokenizer)
    options = record.get("options", {})
    total = sum(s.num_docs for s in sources)
    chosen = np.unique(np.linspace(0, total - 1, min(num_docs, total)).round().astype(np.int64))
    expected, longer = _encode(sources, chosen, tokenizer, options.get("text_column", "text"), options,
                               max_document_bytes)
    found = _output_documents(out, chosen)
    cut = manifest.long_docs
    for doc in chosen.tolist():
        if doc in longer:
            continue
        want, source, row = expected[doc]
        if cut != DEFAULT_LONG_DOCS and want.size > manifest.context_length:
            want = want[:manifest.context_length] if cut == "truncate" else want[:0]
        got = found.get(doc, want[:0])
        if got.size != want.size or not np.array_equal(got, want):
            at = next((i for i in range(min(got.size, want.size)) if got[i] != want[i]), min(got.size, want.size))
            raise VerifyError(f"document {doc} ({source.path} {_file_row(source, row)}) re-encoded with "
                              f"{tokenizer.library} differs from the output at token {at} ({want.size} tokens "
                              f"expected, {got.size} in the output); the text or the tokenizer changed since, "
                              "or the backend that packed it is not exact")
    said = f"  tokenizer        {len(chosen) - len(longer):>14,}  documents re-encoded with {tokenizer.library}: equal"
    if longer:
        said += (f"; {len(longer):,} longer than max_document_bytes={max_document_bytes:,} not re-encoded (doc "
                 f"{min(longer)}{', ...' if len(longer) > 1 else ''}; the reference needs ~110-230 bytes of memory a "
                 "byte of text: --max-document-bytes raises the limit)")
    return [said]


def _check_mix(out: str, data: Any, where: str, num_docs: int, max_document_bytes: int) -> list[str]:
    """A mix: each of its sources packed from text, ``num_docs`` documents each; InputError when none was."""
    from raypack.mix.dataset import MixManifest, source_location

    lines, checked = [], 0
    for k, entry in enumerate(MixManifest.from_dict(data, where).sources):
        path = source_location(out, entry.path)
        source = load_manifest(path)
        if source.tokenizer_record is None or not text_sources(source):
            lines.append(f"  source {k}: {path}: not packed from text, nothing to re-encode")
            continue
        try:
            said = check_tokenizer(path, num_docs, max_document_bytes)
        except VerifyError as e:
            raise VerifyError(f"source {k} of the mix {out} ({path}): {e}") from e
        lines += [f"  source {k}: {path}", *said]
        checked += 1
    if not checked:
        raise InputError(f"{out} is a mix none of whose sources was packed from text; --check-tokenizer needs "
                         "an output of pack --tokenizer, or of tokenize then pack")
    return lines


def _file_row(source: TextSource, row: int) -> str:
    """Text ``row`` of ``source``'s task by its place in the file ("row 157", "line 20001")."""
    try:
        return format_named(source.format).text_row(source.path, source.start, source.end, row)
    except (InputError, OSError):
        return f"row {row} of its task"


def text_sources(manifest: Manifest) -> list[TextSource]:
    """Each shard's text source, in shard order; [] when a shard has none (token inputs)."""
    sources = []
    for row in manifest.shards:
        text = row.get("text") if row.get("format") == "text" else row.get("source")
        if not isinstance(text, dict):
            return []
        path = row["path"] if row.get("format") == "text" else text.get("path")
        sources.append(TextSource(path, text["format"], int(text["start"]), int(text["end"]), int(row["doc_offset"]),
                                  int(row["num_docs"])))
    return sources


def _reference(identity: dict[str, Any], out: str, given: str | None = None):
    """The reference tokenizer of ``identity`` (from the path it records, or ``given``: where it is now)."""
    if identity.get("kind") == "tiktoken" and not isinstance(identity.get("name"), str):  # an edit (a trial: exit 2)
        raise VerifyError(f"{out}: its manifest records a tiktoken tokenizer with no encoding name "
                          f"(name={identity.get('name')!r}): the manifest was edited; pack again")
    spec = f"tiktoken:{identity.get('name')}" if identity.get("kind") == "tiktoken" else identity.get("file")
    if given is not None:
        spec = given
    if not isinstance(spec, str):
        raise InputError(f"{out}: its manifest's tokenizer {identity!r} names no file or encoding")
    if given is None and identity.get("kind") != "tiktoken" and not os.path.isfile(spec):
        raise InputError(f"{out} was packed with tokenizer {spec}, which is no longer there; --check-tokenizer "
                         "re-encodes with it: put it back at that path, or give where it is now with --tokenizer "
                         "(or verify without --check-tokenizer)")
    tokenizer = load_tokenizer(spec)
    now = tokenizer.identity()
    if now.get("sha256") != identity.get("sha256"):
        where = ("give the tokenizer it was packed with" if given is not None else
                 "put the tokenizer it was packed with back at that path, or give where it is now with --tokenizer")
        raise VerifyError(f"tokenizer {spec} is not the one {out} was packed with (sha256 "
                          f"{str(now.get('sha256'))[:16]}..., the manifest records {str(identity.get('sha256'))[:16]}"
                          f"...): {where}")
    edited = sorted(k for k in set(now) | set(identity) if k != "file" and now.get(k) != identity.get(k))
    if edited:  # the same file (its sha256), so the manifest's record of it was changed (an operator's trial)
        k = edited[0]
        raise VerifyError(f"{out}: its manifest records the tokenizer's {k}={identity.get(k)!r}, and the tokenizer "
                          f"it names (the same sha256) has {k}={now.get(k)!r}: the manifest was edited; pack again")
    return tokenizer


def _encode(sources: list[TextSource], chosen: np.ndarray, tokenizer, column: str, options: dict[str, Any],
            max_document_bytes: int) -> tuple[dict[int, tuple[np.ndarray, TextSource, int]], set[int]]:
    """``{doc id: (its ids with BOS/EOS, its source, its row in the task)}`` for the chosen docs, and
    the chosen docs longer than ``max_document_bytes`` (not encoded)."""
    bos, eos = options.get("bos_id"), options.get("eos_id")
    result: dict[int, tuple[np.ndarray, TextSource, int]] = {}
    longer: set[int] = set()
    for source in sources:
        wanted = chosen[(chosen >= source.doc_offset) & (chosen < source.doc_offset + source.num_docs)]
        if wanted.size == 0:
            continue
        if not is_file(source.path):
            raise InputError(f"{source.path}: the text of documents {source.doc_offset:,}-"
                             f"{source.doc_offset + source.num_docs - 1:,} is no longer there; --check-tokenizer "
                             "reads the text files the output was packed from, where the manifest names them: "
                             "put the file back there (or verify without --check-tokenizer)")
        rows = wanted - source.doc_offset
        seen = 0
        for texts in _texts_as_packed(source, column):
            take = (rows[(rows >= seen) & (rows < seen + len(texts))] - seen).tolist()
            if take:
                sizes = numpy_values(pc.binary_length(texts.take(arrow_array(np.array(take, dtype=np.int64)))))
                longer.update(source.doc_offset + seen + k for k, size in zip(take, sizes) if size > max_document_bytes)
                take = [k for k, size in zip(take, sizes) if size <= max_document_bytes]
            if take:
                def name(j: int, first: int = seen, taken: list = take) -> str:
                    row = first + taken[j]
                    return f"document {source.doc_offset + row} ({source.path} {_file_row(source, row)})"

                taken = texts.take(arrow_array(np.array(take, dtype=np.int64)))
                flat = encode_naming(tokenizer, taken, name, CANNOT_CHECK)
                for j, k in enumerate(take):
                    ids = flat.values[flat.offsets[j]:flat.offsets[j + 1]].astype(np.int64)
                    ids = np.concatenate([[bos] if bos is not None else [], ids, [eos] if eos is not None else []])
                    result[source.doc_offset + seen + k] = (ids.astype(np.int64), source, seen + k)
            seen += len(texts)
        if seen != source.num_docs:
            raise VerifyError(f"{source.path}: its task holds {seen} documents now, the manifest says "
                              f"{source.num_docs}; the text (or the manifest) changed since the output was packed")
    return result, longer


def _texts_as_packed(source: TextSource, column: str) -> Iterator[pa.Array]:
    """The text batches of ``source``'s task; the text failing to read as it did when packed (a
    file rewritten with other row groups, a renamed key) is a VerifyError saying so."""
    batches = format_named(source.format).iter_texts(source.path, column, source.start, source.end, 4096)
    while True:
        try:
            _, texts = next(batches)
        except StopIteration:
            return
        except InputError as e:
            seen = str(e).split("; ")[0].removeprefix(f"{source.path}: ")
            raise VerifyError(f"{source.path}: its text no longer reads as it did when the output was packed ({seen}); "
                              "the text changed since the output was packed") from None
        yield texts


def _output_documents(out: str, chosen: np.ndarray) -> dict[int, np.ndarray]:
    """The chosen documents' tokens in the output, each in stream order (int64)."""
    pieces: dict[int, list[np.ndarray]] = {}
    ds = read_packed(out)
    for batch in ds.iter_batches(OUTPUT_BATCH_CHUNKS):
        doc_ids = batch["doc_ids"].reshape(-1)
        mask = np.isin(doc_ids, chosen)
        if not mask.any():
            continue
        ids, tokens = doc_ids[mask], batch["input_ids"].reshape(-1)[mask].astype(np.int64)
        order = np.argsort(ids, kind="stable")
        ids, tokens = ids[order], tokens[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        for start, end in zip(starts, np.r_[starts[1:], ids.size]):
            pieces.setdefault(int(ids[start]), []).append(tokens[start:end])
    return {doc: np.concatenate(parts) for doc, parts in pieces.items()}
