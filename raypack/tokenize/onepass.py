"""``raypack pack --tokenizer`` in one pass: text in, packed chunks out, no tokenized corpus on disk.

A text task (raypack.tokenize.tasks.TextTask: row groups of a Parquet file, a byte range of a
JSONL file) is tokenized into memory (:func:`tokenize_held`: the backend's flat ids become Arrow
list arrays without a Python list per document) and *reports* its counts: documents, tokens and,
when the plan counts (best_fit, ``long_docs`` truncate/drop), its chunks and what ``long_docs``
leaves out, from the document lengths it holds. The driver's :class:`Placer` gives task k its
offsets (doc id, kept-token position, first chunk) once tasks 0..k-1 have reported: running sums,
exactly the cumsums :func:`raypack.pack.plan.make_plan` and ``place_counts`` compute over a
``raypack tokenize`` output. The task is then packed from the ids it holds
(:func:`raypack.pack.packer.pack_documents`) into its chunk file, and the ids are dropped.

Same bytes as the two-step ``raypack tokenize`` + ``raypack pack``: one text task is one pack task
there too (a tokenized part is never split), so the chunk files, their names, the resume records'
results and the manifest (whose ``shards`` rows name the text each task came from) are the
same, whatever the engine or the number of workers.

With ``--local`` (concat; a fresh run, or a resume that keeps no task) each task is instead packed as
it is tokenized (:func:`_run_streamed`): placed :meth:`Placer.ahead`, as every task before it is packed,
and settled by its report at its end; at most three of its pieces are in memory, whatever its size
(four with two encode calls in flight: raypack.tokenize.pieces.encode_across).

Memory otherwise: a worker holds the ids of the tasks it has tokenized and not yet packed: at most two
tasks per Ray actor (raypack.engine.pipeline.pack_texts) and with ``--local`` (one packed while the
next is tokenized on a thread), one with ``--local --workers 1`` (each task tokenized, then packed,
on the caller's thread); one more while a task whose resume record did not hold is tokenized
again. Of each, at most ``held_tokens`` ids (``task_bytes // 4``, at least 1 Mi: about the ids of
``task_bytes`` of English text with a byte-level BPE) of ``itemsize`` bytes (the manifest's token dtype) stay in
memory, plus int64 lengths per document; the ids past them (a Parquet row group of more than
``task_bytes`` of text is one task; denser text) go to a spill file (:class:`Spill`) that is read
back, a piece at a time, as the task is packed. A task's ids are freed piece by piece as it is
packed (:func:`pack_held`), so a task being packed and the next one tokenized beside it hold about
one task's ids between them, plus the piece being packed and the one before it. A task that spills
gives back its freed memory after each spilled piece (``give_back_freed_memory``: Arrow's pool
keeps freed pages about a second, glibc's arenas until trimmed, and over a long task they grew
with it: BENCHMARKS.md, one task of 10x the text 1.42x -> 0.92x the peak of one); other tasks do
not, as faulting the pages in again costs more than they hold.

Resume: task k's record is the packer's (``_results/task-NNNNNN.json``, raypack.pack.resume) with
the text task and the tokenize settings in its input identity; a record whose text task and
settings match gives its counts without tokenizing, and it is kept once its offsets equal the
running sums (:meth:`Placer.advance` checks it with ``load_verified_result``), else the task is
tokenized again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from raypack.errors import InputError
from raypack.inputs.base import DocumentBatch, ShardInfo, check_document_lengths
from raypack.io.fs import is_uri, resolve_filesystem
from raypack.io.prefetch import handed_over
from raypack.io.threads import stop_pool
from raypack.pack.config import PackConfig
from raypack.pack.packer import (
    count_lengths,
    give_back_freed_memory,
    local_publisher,
    local_run_base,
    pack_documents,
    trim_freed_heap,
)
from raypack.pack.plan import Plan, resolve_token_dtype, settings_for
from raypack.pack.resume import identify_input, load_verified_result, recorded_task, sampled_identity, say_inputs_gone
from raypack.pack.tasks import PackSettings, ShardResult, ShardTask, TaskCounts
from raypack.packed.writer import Committer
from raypack.rules.arrays import numpy_values
from raypack.rules.long_docs import CutCounts
from raypack.tokenize.pieces import EncodeAhead, document_name
from raypack.tokenize.spill import Spill
from raypack.tokenize.tasks import (
    TextTask,
    TokenizeSettings,
    check_planned,
    record_settings,
    say_redone,
    settings_changed,
    tokenize_in_memory,
)

log = logging.getLogger(__name__)

IDENTITY_KEY = "text"
"""The key of the text task and tokenize settings in a one-pass resume record's input identity."""


class TaskReport(NamedTuple):
    """What a tokenized task tells the driver before it is packed."""

    num_docs: int
    num_tokens: int
    counts: TaskCounts

    def to_dict(self) -> dict[str, int]:
        return {"num_docs": self.num_docs, "num_tokens": self.num_tokens, "num_chunks": self.counts.num_chunks,
                **self.counts.cut.as_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> TaskReport:
        cut = CutCounts(*(int(d[key]) for key in CutCounts._fields))
        return cls(int(d["num_docs"]), int(d["num_tokens"]), TaskCounts(int(d["num_chunks"]), cut))


@dataclass
class HeldTask:
    """A text task tokenized into memory, waiting for its offsets."""

    task: TextTask
    pieces: list[pa.Array]
    """list<token_dtype> arrays, in document order: the task's first ``held_tokens`` ids."""
    report: TaskReport
    identity: dict[str, Any]
    """The input's identity, taken before its text was read (for the resume record)."""
    started_at: float
    spill: Spill | None = None
    """The pieces after those, when there are more."""
    stream: Iterator[tuple] | None = None
    """A task packed as it is tokenized (:func:`_run_streamed`): its pieces, then its report, as the
    tokenize thread puts them (:func:`tokenize_held`'s ``put``); ``pieces`` stays empty."""
    trim_after: int | None = None
    """A streamed task past this many ids gives glibc's free pages back after each piece, as a spilling
    task does: over a long task they grew with it (10one 1.12x -> 1.05x the peak of one task), but giving
    them back after every piece of every task cost 10-17% of the speed (BENCHMARKS.md, "stop 63")."""

    def discard(self) -> None:
        """Free what the task holds (its spill file included), unpacked."""
        self.pieces.clear()
        if self.spill is not None:
            self.spill.discard()


def _same_file(a: str, b: str) -> bool:
    """Whether two different local paths name one file (a link to a directory); False for URIs."""
    if a == b or is_uri(a) or is_uri(b):
        return False
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _split_changed(task: TextTask, record: dict[str, Any], edges: dict[str, str | None]) -> str:
    """Why a task's record is for other tasks than today's: its file changed (in size, or, at one size, in its
    first or last MiB: a same-size edit said "another split", an operator's trial), or the split did."""
    path = task.path
    if record.get("size") != _size_or_none(path):
        return f"{path} changed (its size differs), and its text splits into other tasks"
    if path not in edges:  # read once a file, on this reason's path only
        try:
            edges[path] = sampled_identity(path, task.format)["edges_sha256"]
        except (OSError, ValueError, InputError):
            edges[path] = None
    if edges[path] is not None and record.get("edges_sha256") not in (None, edges[path]):
        return f"{path} changed (its first or last MiB differs), and its text splits into other tasks"
    return "its record was made for another split of the text into tasks"


def _size_or_none(path: str) -> int | None:
    """The file's size now, for a resume's reason line (None where it cannot be told)."""
    try:
        fs, fs_path = resolve_filesystem(path)
        return fs.get_file_info(fs_path).size
    except (OSError, ValueError):
        return None


def text_identity(task: TextTask, settings: TokenizeSettings) -> dict[str, Any]:
    return json.loads(json.dumps({"task": asdict(task), "settings": record_settings(settings)}))


def tokenize_held(task: TextTask, settings: TokenizeSettings, tokenizer, pack: PackSettings,
                  put: Callable[[tuple], None] | None = None,
                  encoded: Iterator | None = None) -> HeldTask:
    """Tokenize ``task`` into memory and count it (documents longer than ``max_document_tokens``
    are refused, as the packer's reader refuses them). ``put`` (the local engine's streamed pass,
    :func:`_run_streamed`): each piece is handed to the packer as it is made, none held, after a
    ``("start", identity, started_at)`` and before an ``("end", report)``. ``encoded``: the task's
    pieces read and encoded ahead (:class:`raypack.tokenize.pieces.EncodeAhead`), taken once its identity is
    checked."""
    started_at = time.time()
    identity = identify_input(ShardTask(task.task_index, task.path, task.format, 0, 0, 0, 0), pack)
    check_planned(task, identity)
    identity[IDENTITY_KEY] = text_identity(task, settings)
    if put is not None:
        put(("start", identity, started_at))
    pieces, lengths, row, tokens, spill = [], [], 0, 0, None
    try:
        for ids in tokenize_in_memory(task, settings, tokenizer, encoded):
            check_document_lengths(ids, pack.max_document_tokens, path=task.path, first_row=row,
                                   where=lambda k: document_name(task, k))
            lengths.append(np.diff(numpy_values(ids.offsets)).astype(np.int64))
            row += len(ids)
            tokens += int(lengths[-1].sum())
            if put is not None:
                put(("piece", ids))
                del ids
                continue
            if spill is None and tokens > settings.held_tokens:
                spill = Spill(pack.out_dir, task.task_index, ids.type)
            if spill is None:
                pieces.append(ids)
            else:
                spill.write(ids)
                del ids
                give_back_freed_memory()  # a long task: else its allocators' free pages grow with it
        if spill is not None:
            spill.close()
    except BaseException:
        if spill is not None:
            spill.discard()
        raise
    report = TaskReport(row, tokens, count_lengths(lengths, pack))
    if put is not None:
        put(("end", report))
    return HeldTask(task, pieces, report, identity, started_at, spill)


def pack_held(held: HeldTask, task: ShardTask, settings: PackSettings, committer: Committer | None = None,
              placed: Callable[[], ShardTask] | None = None) -> ShardResult:
    """Pack ``held`` as ``task`` (its offsets placed) from the ids in memory. The pieces are taken
    out of ``held`` as they are packed, so each is freed once its chunks are written (while the next
    task is tokenized beside this one, the two tasks' ids hold about one task's worth, not two).
    ``committer`` and ``placed`` (a ``held.stream``, whose counts are known at its end): as for
    :func:`raypack.pack.packer.pack_documents`."""
    try:
        return pack_documents(task, settings, _consumed(held), held.identity, held.started_at, committer, placed)
    finally:
        held.discard()


def _consumed(held: HeldTask) -> Iterator[DocumentBatch]:
    """``held``'s pieces as document batches in order, each removed from the list before it is
    yielded, then its spilled pieces; or its stream's pieces, until its report."""
    if held.stream is not None:
        row = tokens = 0
        for message in held.stream:
            if message[0] == "end":
                held.report = message[1]
                return
            yield DocumentBatch(row, message[1])
            row += len(message[1])
            offsets = numpy_values(message[1].offsets)
            tokens += int(offsets[-1] - offsets[0])
            del message, offsets
            if held.trim_after is not None and tokens > held.trim_after:
                trim_freed_heap()  # a long task: else what the threads free piles up in glibc's arenas
        raise RuntimeError(f"internal error: text task {held.task.task_index}'s pieces ended without its report")
    pieces = held.pieces
    pieces.reverse()
    row = 0
    while pieces:
        ids = pieces.pop()
        yield DocumentBatch(row, ids)
        row += len(ids)
        del ids
    if held.spill is not None:
        for ids in held.spill.read():
            yield DocumentBatch(row, ids)
            row += len(ids)


class Step(NamedTuple):
    """What the engine does next for a task: ``"pack"`` it (``task`` placed), it was ``"kept"``
    (``result`` from its resume record) or ``"tokenize"`` it (``text``: its record did not hold)."""

    kind: str
    index: int
    task: ShardTask | None = None
    result: ShardResult | None = None
    text: TextTask | None = None


class Placer:
    """The driver's side of the one pass: reports in, offsets out, in task order."""

    def __init__(self, tasks: list[TextTask], settings: PackSettings, text_settings: TokenizeSettings,
                 resume: bool) -> None:
        self.tasks, self.settings = tasks, settings
        self.reports: dict[int, TaskReport] = {}
        self.candidates: dict[int, ShardTask] = {}
        self.placed: list[ShardTask] = []
        self.doc = self.token = self.chunk = 0
        self.kept = 0
        """Tasks kept from their resume records."""
        self.moved = 0
        """Tasks whose records hold, but whose documents now start elsewhere (a task before them changed)."""
        redone: dict[str, list[TextTask]] = {}
        edges: dict[str, str | None] = {}  # a file's first and last MiB now, for the reason lines
        if resume:
            for t in tasks:
                found = recorded_task(t.task_index, settings, also=lambda identity: _text_changed(
                    identity, text_settings))
                if isinstance(found, str):
                    redone.setdefault(found, []).append(t)
                    continue
                if not found:
                    continue
                if (found[0].task_index, found[0].path, found[0].format) != (t.task_index, t.path, t.format):
                    # a task number now of another file: counted (it said "2 recorded tasks" of 37: a new user's trial)
                    why = "its record was made for another split of the text into tasks"
                    if _same_file(found[0].path, t.path):  # said as a split (an operator's trial: a linked dir)
                        why = ("its record names its file by another path (the inputs were given as another path to "
                               "the same files; give them as the run before did to keep its tasks)")
                    redone.setdefault(why, []).append(t)
                    continue
                recorded = found[1].get(IDENTITY_KEY)
                if recorded == text_identity(t, text_settings):
                    self.candidates[t.task_index] = found[0]
                    continue
                if not isinstance(recorded, dict) or recorded.get("task") != asdict(t):
                    why = _split_changed(t, found[1], edges)
                else:
                    why = settings_changed(recorded.get("settings"), text_settings) or "its record differs"
                redone.setdefault(why, []).append(t)
        say_redone(redone)

    def to_tokenize(self) -> list[TextTask]:
        """The tasks to tokenize, in order (those without a matching resume record)."""
        return [t for t in self.tasks if t.task_index not in self.candidates]

    @property
    def next_index(self) -> int:
        return len(self.placed)

    @property
    def done(self) -> bool:
        return len(self.placed) == len(self.tasks)

    def report(self, index: int, report: TaskReport) -> None:
        self.reports[index] = report

    def advance(self) -> list[Step]:
        """Place every task that can be placed now, in order."""
        steps = []
        while not self.done:
            k = self.next_index
            if k in self.candidates:
                recorded = self.candidates.pop(k)
                task = self._placed(k, TaskReport(recorded.num_docs, recorded.num_tokens,
                                                  TaskCounts(recorded.num_chunks, recorded.cut)))
                if _moved(recorded, task):  # a task before it changed: not its record's fault, one line for all
                    if not self.moved:
                        log.info("resume: text task %d (%s) and those after it whose documents moved are tokenized "
                                 "again: its documents now start at doc %d, token %d (its record: doc %d, token %d), "
                                 "as a task before it changed", k, task.path, task.doc_offset, task.token_offset,
                                 recorded.doc_offset, recorded.token_offset)
                    self.moved += 1
                    steps.append(Step("tokenize", k, text=self.tasks[k]))
                    break
                result = load_verified_result(task, self.settings)
                if result is not None:
                    self._commit(task)
                    self.kept += 1
                    steps.append(Step("kept", k, task, result))
                    continue
                steps.append(Step("tokenize", k, text=self.tasks[k]))
                break
            if k not in self.reports:
                break
            task = self._placed(k, self.reports.pop(k))
            self._commit(task)
            steps.append(Step("pack", k, task))
        return steps

    def ahead(self, k: int) -> ShardTask:
        """Task ``k`` placed before it is tokenized, to be packed as it is (:func:`_run_streamed`): every task
        before it is placed and the strategy has no counting pass (concat), so its offsets are all its packer
        needs; its counts are -1 until :meth:`settle`."""
        if k != self.next_index or k in self.candidates or self.settings.packing.needs_counting_pass:
            raise RuntimeError(f"internal error: text task {k} cannot be placed before it is tokenized")
        text = self.tasks[k]
        return ShardTask(k, text.path, text.format, self.doc, self.token, -1, -1, task_index=k)

    def settle(self, ahead: ShardTask, report: TaskReport) -> ShardTask:
        """The task placed :meth:`ahead`, placed by its report once it is tokenized (and committed)."""
        k = ahead.task_index
        self.report(k, report)
        steps = self.advance()
        if [(s.kind, s.index) for s in steps] != [("pack", k)] or (
                steps[0].task.doc_offset, steps[0].task.token_offset) != (ahead.doc_offset, ahead.token_offset):
            raise RuntimeError(f"internal error: text task {k} placed ahead at {ahead} but then by {steps}")
        return steps[0].task

    def _placed(self, k: int, report: TaskReport) -> ShardTask:
        counting = self.settings.packing.needs_counting_pass
        text = self.tasks[k]
        return ShardTask(k, text.path, text.format, self.doc, self.token, report.num_docs, report.num_tokens,
                         first_chunk=self.chunk if counting else -1,
                         num_chunks=report.counts.num_chunks if counting else -1, task_index=k,
                         **report.counts.cut.as_dict())

    def _commit(self, task: ShardTask) -> None:
        self.placed.append(task)
        self.doc += task.num_docs
        self.token += task.num_kept_tokens
        self.chunk += max(task.num_chunks, 0)

    def plan(self, skeleton: Plan) -> Plan:
        """The plan of the whole run (what ``make_plan`` + ``place_counts`` give over the tokenized
        corpus), once every task is placed."""
        if not self.done:
            raise RuntimeError(f"internal error: {len(self.placed)} of {len(self.tasks)} text tasks placed")
        shards = tuple(ShardInfo(t.path, t.format, t.num_docs, t.num_tokens, skeleton.token_dtype, "manifest",
                                 source={"path": x.path, "format": x.format, "start": x.start, "end": x.end})
                       for t, x in zip(self.placed, self.tasks))
        cut = sum((t.cut for t in self.placed), CutCounts())
        return replace(skeleton, shards=shards, tasks=tuple(self.placed), num_docs=self.doc,
                       num_tokens=sum(t.num_tokens for t in self.placed), cut=cut)


def _text_changed(identity: Any, text_settings: TokenizeSettings) -> str | None:
    """What else a record whose packing settings changed was made with: other text settings, or None."""
    recorded = identity.get(IDENTITY_KEY) if isinstance(identity, dict) else None
    why = settings_changed(recorded.get("settings"), text_settings) if isinstance(recorded, dict) else None
    return why.replace("its record was made with other settings", "other text settings") if why else None


def _moved(recorded: ShardTask, placed: ShardTask) -> bool:
    """``placed`` is ``recorded`` but for where its documents, tokens or chunks start."""
    offsets = {"doc_offset": 0, "token_offset": 0, "first_chunk": 0}
    return replace(recorded, **offsets) == replace(placed, **offsets) and recorded != placed


def skeleton_plan(config: PackConfig, token_dtype: str, tokenizer_record: dict[str, Any]) -> Plan:
    """The plan before any task is placed: what the settings need (token dtype, strategy, long_docs)."""
    info = ShardInfo("", "parquet", 0, 0, token_dtype, "manifest")
    return Plan((), (), resolve_token_dtype(config, [info]), 0, 0, config.context_length, config.packing,
                tokenizer_record, text_inputs=True, long_docs=config.long_docs)


def run_onepass(work_dir: str, config: PackConfig, tasks: list[TextTask], text_settings: TokenizeSettings,
                tokenizer_record: dict[str, Any], tokenizer, engine: str, resume: bool,
                on_ray: Callable | None = None, progress=None) -> tuple[Plan, PackSettings, list[ShardResult]]:
    """Tokenize and pack every task; the plan, settings and results for the driver to stitch and publish.

    ``on_ray(placer, text_settings, settings)``: the Ray engine's loop (raypack.engine.pipeline.pack_texts)."""
    skeleton = skeleton_plan(config, text_settings.token_dtype, tokenizer_record)
    settings = settings_for(config, skeleton, work_dir)
    placer = Placer(tasks, settings, text_settings, resume)
    if resume:  # before this run's records take the task numbers of the runs before
        say_inputs_gone(settings.out_dir, (t.path for t in tasks))
    if engine == "local" or on_ray is None:
        results = _run_locally(placer, text_settings, settings, tokenizer, progress, config.num_workers)
    else:
        results = on_ray(placer, text_settings, settings)
    if resume:
        log.info("resume: %d of %d text tasks kept (verified), %d tokenized and packed", placer.kept, len(tasks),
                 len(tasks) - placer.kept)
    return placer.plan(skeleton), settings, sorted(results, key=lambda r: r.task_index)


def _run_locally(placer: Placer, text_settings: TokenizeSettings, settings: PackSettings, tokenizer,
                 progress, workers: int = 2) -> list[ShardResult]:
    """Task after task, in order, with one task tokenized ahead on a thread while the one before is
    packed (the backend and the Parquet reader release the GIL): at most two tasks' ids held. With
    ``workers`` 1 (``--workers 1``), no such thread: each task is tokenized, then packed, in this
    thread, so one task's ids are held (BENCHMARKS.md: two tokenize threads, or one thread per
    task, were faster by 5-16% and held up to 1.5x the memory). Each result's ``peak_rss_bytes`` is
    what this process grew by, at its peak, from here to the task's end, its tokenizing included."""
    if workers > 1 and not placer.candidates and not settings.packing.needs_counting_pass:
        return _run_streamed(placer, text_settings, settings, tokenizer, progress)
    base = local_run_base()
    queue, results, held = list(placer.to_tokenize()), [], {}
    ahead: list[tuple[TextTask, Future]] = []
    threaded = workers > 1
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raypack-tokenize") if threaded else None

    submitted: list[Future] = []  # the tokenize job last given to the pool
    with local_publisher(1) as committer, _ending(pool, submitted):
        def start_next() -> None:
            if not ahead and queue:
                text = queue.pop(0)
                args = (text, text_settings, tokenizer, settings)
                if threaded:
                    submitted[:] = [pool.submit(tokenize_held, *args)]  # not the earlier ones: their ids are freed
                ahead.append((text, submitted[-1] if threaded else _done(tokenize_held(*args))))

        steps = placer.advance()
        try:
            while True:
                for step in steps:
                    if step.kind == "kept":
                        results.append(step.result)
                    elif step.kind == "tokenize":
                        queue.insert(0, step.text)
                    else:
                        if threaded:
                            start_next()
                        result = pack_held(held.pop(step.index), step.task, settings, committer)
                        results.append(replace(result, peak_rss_bytes=max(0, result.peak_rss_bytes - base)))
                    if progress is not None and step.kind != "tokenize":
                        progress.add(step.task.num_tokens, kept=step.kind == "kept")
                if placer.done:
                    return results
                start_next()
                if not ahead:
                    raise RuntimeError(f"internal error: text task {placer.next_index} is neither recorded nor queued")
                text, future = ahead.pop()
                held[text.task_index] = future.result()
                placer.report(text.task_index, held[text.task_index].report)
                steps = placer.advance()
        finally:
            for _, future in ahead:
                future.cancel()



def _run_streamed(placer: Placer, text_settings: TokenizeSettings, settings: PackSettings, tokenizer,
                  progress) -> list[ShardResult]:
    """Every task packed as it is tokenized, in order: a thread tokenizes task after task, handing each
    piece over as it is made (at most one waiting: ``handed_over``'s depth), and this thread packs it as
    task ``k`` placed :meth:`Placer.ahead` (every task before it is packed, so its offsets are known; its
    counts are settled at its end). Memory: the piece being packed, the one waiting and the one being
    encoded (two with two calls in flight), whatever a task's size (BENCHMARKS.md, "stop 63": one task of
    10x the text, and ten tasks, 1.00-1.05x the peak of one). For concat, in a fresh run or a resume that
    keeps no task; the others hold each task (:func:`_run_locally`): a resume that keeps some places the
    records' tasks in turn, and best_fit's windows of documents, packed while the next pieces are encoded,
    raised its peak (one task of 10x the text 345 -> 411-423 MiB, where one task is ~295). The bytes are
    the same either way."""
    base = local_run_base()
    texts, results = placer.to_tokenize(), []

    def produce(put: Callable[[tuple], None]) -> None:
        ahead = EncodeAhead(texts, text_settings, tokenizer)  # the next task's first pieces encoded beside this one's
        try:
            for text in texts:
                tokenize_held(text, text_settings, tokenizer, settings, put, ahead.encoded(text))
        finally:
            ahead.close()

    messages = handed_over(produce, depth=1, name="raypack-tokenize")
    with local_publisher(1) as committer, closing(messages):
        for text in texts:
            task = placer.ahead(text.task_index)
            first = next(messages, None)
            if first is None or first[0] != "start":
                raise RuntimeError(f"internal error: text task {text.task_index} began with {first!r}")
            held = HeldTask(text, [], TaskReport(0, 0, TaskCounts(-1, CutCounts())), first[1], first[2],
                            stream=messages, trim_after=text_settings.held_tokens)
            result = pack_held(held, task, settings, committer,
                               lambda held=held, task=task: placer.settle(task, held.report))
            results.append(replace(result, peak_rss_bytes=max(0, result.peak_rss_bytes - base)))
            if progress is not None:
                progress.add(placer.placed[-1].num_tokens, kept=False)
    return results


@contextmanager
def _ending(pool: ThreadPoolExecutor | None, submitted: list[Future]) -> Iterator[None]:
    """``pool`` shut down as the block ends: after its job, or, on Ctrl-C or SIGTERM, after at most a bounded
    wait for it (a read that hangs on a store that stopped answering: raypack.io.threads)."""
    interrupted = False
    try:
        yield
    except KeyboardInterrupt:
        interrupted = True
        if pool is not None:
            stop_pool(pool, submitted)
        raise
    finally:
        if pool is not None and not interrupted:
            pool.shutdown(wait=True)


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
