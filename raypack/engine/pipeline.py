"""The Ray Data engine: the only module that imports Ray.

One task (a shard, or a range of a large shard's row groups or record batches: raypack.pack.plan) is
one row of a dataset built with ``from_items`` (one block per task), mapped by a pool of stateful
packer actors with ``batch_size=1``: each call streams one whole task in order, so the carry
between record batches never leaves the actor, and Ray's block shaping, scheduling order and
retries cannot change what is packed. Actors write their own chunk files (kept out of the object
store) and return one small Arrow row: counts, the file written and the edge fragments. Actors
reserve a fraction of a CPU so that Ray Data's read and output tasks can always be scheduled beside
them (whole-CPU actors deadlock a 2-CPU machine). Each actor holds its next task queued (two calls
in flight, run one after the other), so it starts that task as soon as it ends one. The first pass
of best_fit and ``long_docs`` keeps no state: it maps Ray tasks instead (:func:`count_chunks`).

Terminal: quiet unless ``-v`` (:func:`init_ray`). Bad input met by an actor comes back as an
error row (``task_index``, ``error``), not as an exception through Ray, and the driver raises it
as one InputError once the pipeline has ended. Without ``-v`` the workers' own output, including
the packers' watchdog warnings (raypack.pack.watchdog), lands only in Ray's worker logs
(:func:`logs_dir`, files ``worker-*.err``); the driver prints that directory once.

It also holds the Ray side of reading packed output back: :func:`packed_to_ray_dataset`
(``PackedDataset.to_ray_dataset``), one read task per chunk file, and :func:`mixed_to_ray_dataset`
(``MixedDataset.to_ray_dataset``), one read task per range of a mix's items.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import ray

from raypack.engine.connect import connect_hint, resolve_address
from raypack.engine.reaper import end_processes, reaping, session_glob, session_workers, start_reaper
from raypack.engine.workers import ShardPackerActor, TextPackerActor, TextTokenizerActor, count_tasks
from raypack.errors import InputError, worker_error_from_text
from raypack.io.terminal import RAY_VERBOSE, quiet_console, stderr_off, terminated
from raypack.io.threads import time_left
from raypack.pack.tasks import PackSettings, ShardResult, ShardTask, TaskCounts, table_to_results
from raypack.packed.chunk_files import chunks_table, iter_file_tables
from raypack.rules.arrays import from_stream_bytes
from raypack.rules.core import Chunks
from raypack.rules.long_docs import CutCounts

if TYPE_CHECKING:
    from raypack.packed.reader import PackedDataset

log = logging.getLogger(__name__)



def leave(code: int) -> None:
    """End this process once a command on Ray has ended, with ``code``, without the interpreter's
    teardown: there Ray's threads crashed (exit 139) when a Ctrl-C came a few seconds into a run.
    Output already written is flushed first. An embedded Ray whose reaper runs
    (:mod:`raypack.engine.reaper`) is left to it: ``ray.shutdown`` sets SIGTERM back to its default
    action while it runs (~1.4 s), so a SIGTERM then killed a finished run (-15), though the command
    ignores it by then. A cluster's driver disconnects with ``ray.shutdown`` first."""
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    if not (_EMBEDDED and reaping()):
        ray.shutdown()
    os._exit(code)


def end_workers() -> None:
    """End this process's embedded Ray's workers now (SIGKILL), waiting for them at most what is left of the stop's
    deadline, 2 s at most: a stopped command calls it before it gives its output's lock back. Ray's own kill
    (``ray.kill`` of an actor) and the reaper end them only later, and an actor went on packing meanwhile: an
    operator's stop trial found a chunk file written into the staging directory 80 ms after the command had exited,
    where a ``--resume`` started at once could have met it. On a cluster, Ray's kill is all there is."""
    if not _EMBEDDED:
        return
    session = _node_path("get_session_dir_path", "")
    if session:
        left = end_processes(session_workers(session, exclude=(os.getpid(),)), time_left(2.0))
        if left:
            log.debug("Ray workers %s had not ended within the stop's deadline", left)


def init_ray(address: str | None = None, *, verbose: bool | None = None) -> None:
    """Connect to ``address`` (or RAY_ADDRESS), else start an embedded local Ray.

    Quiet unless ``verbose``: Ray's own log lines, the workers' output and Ray Data's progress
    go to Ray's log files only (:func:`logs_dir`). A cluster that cannot be reached or refuses
    the client's token raises :class:`InputError` naming the fix, within seconds (raypack.engine.connect).
    ``verbose`` None: the CLI's ``-v`` (:data:`raypack.io.terminal.RAY_VERBOSE`).
    """
    check_cwd_does_not_shadow()  # a Ray started by the caller starts its workers here too
    if ray.is_initialized():
        return
    if verbose is None:
        verbose = RAY_VERBOSE.get()
    quiet = {"log_to_driver": verbose, "logging_level": logging.INFO if verbose else logging.ERROR}
    given = "--address" if address else "RAY_ADDRESS"  # which one to name when nothing is there
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        address = resolve_address(address, given, _ray_temp_dir())  # one line for a wrong one, not a hang
    if not verbose:
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")  # the driver's C++ core worker (E ... lines)
    on_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with stderr_off(not verbose), _keep_handler(signal.SIGTERM, on_sigterm):  # the core worker's own
            if address:
                ray.init(address=address, **quiet)
            else:
                # its processes end with this one, even after a SIGKILL, a Ctrl-C or a SIGKILL while it starts too
                start_reaper(session_glob(_ray_temp_dir(), os.getpid()), since=time.time())
                ray.init(address="local", include_dashboard=False, **quiet)
                global _EMBEDDED
                _EMBEDDED = True
    except (ConnectionError, ray.exceptions.AuthenticationError) as e:  # the latter: token mode, no token
        raise InputError(connect_hint(address, e)) from None
    except SystemExit as e:  # a SIGTERM while Ray starts meets Ray's own handlers, which sys.exit
        if e.code not in (signal.SIGTERM, 1) or not callable(on_sigterm):
            raise
        terminated()
        raise KeyboardInterrupt from None  # the command's own line: terminated, the work kept
    _DATA_VERBOSE[:] = [verbose]  # Ray Data is set up on its first use (_data), if the run has one
    if not verbose:
        _quiet_error_messages()
        log.info("Ray's logs are in %s (-v shows them here)", logs_dir())


_DATA_VERBOSE: list[bool] = []
"""What :func:`init_ray` asked of Ray Data's console, until its first use (:func:`_data`)."""


def _data():
    """``ray.data``, quiet unless ``-v`` from its first use after :func:`init_ray`. Imported only where a
    run maps a dataset: the one pass runs plain actors, and importing Ray Data cost its driver ~0.3 s
    and 50 MiB (BENCHMARKS.md, "stop 60")."""
    if _DATA_VERBOSE:
        verbose = _DATA_VERBOSE.pop()
        context = ray.data.DataContext.get_current()  # first use of ray.data configures its loggers
        if not verbose:
            quiet_console("ray.data")
        context.enable_progress_bars = verbose
        context.print_on_execution_start = verbose
    return ray.data


@contextlib.contextmanager
def _keep_handler(signum: int, handler):
    """Put ``handler`` (this process's Python handler of ``signum``) back after ``ray.init``, whose
    core worker installs a C++ one that prints a stack trace (``*** SIGTERM received ...``) over the
    command's own line (raypack.io.terminal.stop_on_sigterm). Only a Python handler, on the main thread."""
    try:
        yield
    finally:
        if callable(handler) and threading.current_thread() is threading.main_thread():
            signal.signal(signum, handler)


MAX_ACTOR_REPLACEMENTS = 8
"""Tokenizing packers that may die in one ``pack --tokenizer`` run before it fails (then ``--resume``)."""
_EMBEDDED = False  # this process started the Ray it uses (an embedded local Ray: its CPUs are all there is)


def check_actors_fit(worker_num_cpus: float) -> None:
    """An actor asking for more CPUs than any node has never starts, and Ray waits for it forever:
    on the embedded Ray, an InputError; on a cluster (which may add larger nodes), a warning."""
    largest = max((float(node.get("Resources", {}).get("CPU", 0)) for node in ray.nodes() if node.get("Alive")),
                  default=0.0)
    if worker_num_cpus <= largest:
        return
    said = _too_large(worker_num_cpus, largest, embedded=_EMBEDDED)
    if _EMBEDDED:
        raise InputError(said)
    log.warning("%s; waiting for the cluster to add a node that large", said)


def check_actors_fit_before_start(worker_num_cpus: float, address: str | None) -> None:
    """:func:`check_actors_fit` before an embedded Ray takes seconds to start, against the CPUs the
    machine has (Ray counts no more than these; a container's quota can make it count fewer, which
    :func:`check_actors_fit` then catches)."""
    if address or os.environ.get("RAY_ADDRESS") or ray.is_initialized():
        return
    cpus = float(os.cpu_count() or 1)
    if worker_num_cpus > cpus:
        raise InputError(_too_large(worker_num_cpus, cpus, embedded=True))


def _too_large(worker_num_cpus: float, largest: float, *, embedded: bool) -> str:
    return (f"--worker-num-cpus {worker_num_cpus:g}: each worker asks for {worker_num_cpus:g} CPUs, and "
            f"{'this machine' if embedded else 'the largest node of the Ray cluster'} has {largest:g}, so no worker "
            f"could start; give at most {largest:g} (workers need little: the default is 0.5)")


def check_cwd_does_not_shadow(cwd: str | None = None) -> None:
    """Raise InputError when the working directory holds a ``raypack/`` folder that is not this package.

    Ray's workers put the driver's working directory first on ``sys.path``: run from the folder
    that holds a clone, they would import the clone's top folder as a namespace package instead of
    the installed raypack and die with an ImportError. Checked before Ray starts or anything is written.
    """
    folder = Path(cwd or os.getcwd()) / "raypack"
    installed = Path(__file__).resolve().parent.parent
    if folder.is_dir() and folder.resolve() != installed:
        raise InputError(f"the working directory holds a folder named raypack ({folder}) that Ray's workers would "
                         f"import instead of the installed raypack ({installed}); run from another directory "
                         f"(e.g. cd {folder})")


def _quiet_error_messages() -> None:
    """Ray's driver prints the cluster's error messages ("(raylet) A worker died ...", "Task failed ... retries
    remaining") on the terminal whatever ``log_to_driver`` says (an operator's trial: after a worker was
    killed they stood among and after the run's lines, with colour codes). Quiet, they go to this module's
    logger at DEBUG; Ray's logs hold them, and a failure is raypack's one line naming those logs."""
    worker = ray._private.worker
    shown = worker.print_to_stdstream
    if getattr(shown, "raypack_quiet", False):
        return

    def to_log(data, ignore_prefix):
        if data.get("pid") != "raylet":
            return shown(data, ignore_prefix)
        for line in data.get("lines", ()):
            log.debug("(raylet) %s", line)

    to_log.raypack_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_log


def _ray_temp_dir() -> str:
    """Where an embedded Ray makes ``ray/session_*`` (RAY_TMPDIR, else TMPDIR on Linux, else /tmp)."""
    try:
        from ray._common.utils import get_default_system_temp_dir
        return get_default_system_temp_dir()
    except (ImportError, AttributeError):
        return os.environ.get("RAY_TMPDIR") or "/tmp"


def logs_dir() -> str:
    """Where this Ray session keeps its logs (on the head node), for messages to the user."""
    return _node_path("get_logs_dir_path", "/tmp/ray/session_latest/logs")


def _node_path(getter: str, default: str) -> str:
    node = getattr(ray._private.worker, "_global_node", None)
    try:
        return getattr(node, getter)()
    except AttributeError:
        return default


def _raise_first_error(errors: dict[int, str]) -> None:
    """After the pipeline: bad input as one InputError, the lowest task's (what ``--local`` meets first)."""
    if errors:
        raise worker_error_from_text(errors[min(errors)])


def _blocks(blocks: Iterator[pa.Table], errors: dict[int, str]) -> Iterator[pa.Table]:
    """The result blocks; error rows are taken out into ``errors`` (task index -> message)."""
    for block in blocks:
        if "error" in block.column_names:
            errors.update(zip(block.column("task_index").to_pylist(), block.column("error").to_pylist()))
        else:
            yield block


def pack_shards(
    tasks: Sequence[ShardTask], settings: PackSettings, *, num_workers: int, worker_num_cpus: float,
    on_result: Callable[[ShardResult], None] | None = None,
) -> list[ShardResult]:
    """Pack every shard on a pool of actors; results in shard order. ``on_result`` sees each as it arrives.

    Bad input in any shard raises InputError once the pipeline has ended (the lowest shard's).
    """
    errors: dict[int, str] = {}
    results = []
    for block in _blocks(_map_shards(ShardPackerActor, tasks, settings, num_workers, worker_num_cpus), errors):
        for result in table_to_results(block):
            results.append(result)
            if on_result is not None:
                on_result(result)
    _raise_first_error(errors)
    return sorted(results, key=lambda r: r.task_index)


def count_chunks(
    tasks: Sequence[ShardTask], settings: PackSettings, *, num_workers: int, worker_num_cpus: float
) -> list[TaskCounts]:
    """The first pass: every task's counts (raypack.pack.packer.count_task), in task order."""
    if not tasks:
        return []
    counts, errors = {}, {}
    mapped = _task_rows(tasks).map_batches(count_tasks, fn_kwargs={"settings": asdict(settings)}, batch_size=1,
                                 batch_format="pyarrow", num_cpus=worker_num_cpus,
                                 compute=_data().TaskPoolStrategy(size=max(1, min(num_workers, len(tasks)))))
    for block in _blocks(mapped.iter_batches(batch_size=None, batch_format="pyarrow"), errors):
        for row in block.to_pylist():
            cut = CutCounts(*(row[key] for key in CutCounts._fields))
            counts[row["task_index"]] = TaskCounts(row["num_chunks"], cut)
    _raise_first_error(errors)
    return [counts[t.task_index] for t in tasks]


def _map_shards(actor_class: type, tasks: Sequence[ShardTask], settings: PackSettings, num_workers: int,
                worker_num_cpus: float, in_flight: int = 2) -> Iterator[pa.Table]:
    """Run ``actor_class`` over the tasks, one per call, on a pool of stateful actors, handed
    out in the order given. ``in_flight``: calls queued per actor (1 hands each task to the
    first actor that is free: best for long tasks of uneven size)."""
    if not tasks:
        return iter(())
    check_actors_fit(worker_num_cpus)
    mapped = _task_rows(tasks).map_batches(
        actor_class,
        fn_constructor_kwargs={"settings": asdict(settings)},
        batch_size=1,
        batch_format="pyarrow",
        compute=_data().ActorPoolStrategy(size=max(1, min(num_workers, len(tasks))),
                                           max_tasks_in_flight_per_actor=in_flight),
        num_cpus=worker_num_cpus,
    )
    return mapped.iter_batches(batch_size=None, batch_format="pyarrow")


def _task_rows(tasks: Sequence[ShardTask]) -> ray.data.Dataset:
    """One row, and one block, per task, in task order."""
    return _data().from_items([asdict(t) for t in tasks], override_num_blocks=len(tasks))


def original_error(error: BaseException) -> BaseException:
    """The user's exception inside Ray's wrappers (RayTaskError, UserCodeException)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None:
            error = error.cause
        elif error.__cause__ is not None:
            error = error.__cause__
        else:
            break
    return error


# ----------------------------------------------------------------------------- reading packed output


def packed_to_ray_dataset(packed: PackedDataset, batch_rows: int | None = None) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of ``packed``'s chunks in global order, one row per chunk.

    Also ``packed.to_ray_dataset(batch_rows)``. Columns: ``input_ids``
    fixed_size_list<token>[C] and ``doc_ids`` fixed_size_list<int64>[C]. One read task per
    file; each yields one block per record batch, or blocks of ``batch_rows`` chunks. Order is
    kept (``preserve_order`` is set on this dataset's own context, not globally). Masks are not
    in the dataset; build them per batch. Ray's "numpy" batch format turns fixed_size_list
    columns into object arrays of rows, so stack them first::

        from raypack.rules.masks import build_intra_document_mask
        for batch in ds.to_ray_dataset().iter_batches(batch_size=8, batch_format="numpy"):
            doc_ids = np.stack(batch["doc_ids"])         # (8, C) int64
            mask = build_intra_document_mask(doc_ids)    # (8, C, C)
    """
    if batch_rows is not None and operator.index(batch_rows) < 1:
        raise ValueError(f"batch_rows={batch_rows} must be >= 1 or None")
    init_ray()  # as quiet as the CLI's Ray; a no-op when the caller already started or joined one
    items = packed.file_items()
    if not items:
        return _data().from_arrow(chunks_table(Chunks.empty(packed.context_length, packed.token_dtype)))
    dataset = _data().from_items(items, override_num_blocks=len(items))
    dataset.context.execution_options.preserve_order = True
    return dataset.map_batches(
        _read_file_blocks, batch_size=1, batch_format="pyarrow",
        fn_kwargs={"filesystem": packed.filesystem, "base": packed.base, "context_length": packed.context_length,
                   "token_dtype": packed.token_dtype.name, "batch_rows": batch_rows,
                   "extra_columns": tuple(tuple(c) for c in packed.extra_columns)},
    )


def _read_file_blocks(items: pa.Table, **options: Any) -> Iterator[pa.Table]:
    """Ray map_batches function: the chunk tables of the files described by ``items``, in order."""
    for item in items.to_pylist():
        yield from iter_file_tables(item, **options)


MIX_BLOCK_ROWS = 1024
"""Items per block of :func:`mixed_to_ray_dataset` when ``batch_rows`` is None."""


def mixed_to_ray_dataset(mixed, batch_rows: int | None = None) -> ray.data.Dataset:
    """A ``ray.data.Dataset`` of a mix's items in its order (``MixedDataset.to_ray_dataset``).

    Columns ``input_ids`` fixed_size_list<token>[C], ``doc_ids`` fixed_size_list<int64>[C] and
    ``source`` int64. One read task per range of ``batch_rows`` items (default MIX_BLOCK_ROWS);
    each task gets the dataset pickled without open files and reads its range with
    ``get_batch`` (raypack.mix.dataset). Order is kept, as in :func:`packed_to_ray_dataset`.
    """
    rows = MIX_BLOCK_ROWS if batch_rows is None else operator.index(batch_rows)
    if rows < 1:
        raise ValueError(f"batch_rows={batch_rows} must be >= 1 or None")
    init_ray()
    starts = list(range(0, len(mixed), rows))
    items = [{"start": s, "stop": min(s + rows, len(mixed))} for s in starts]
    dataset = _data().from_items(items, override_num_blocks=len(items))
    dataset.context.execution_options.preserve_order = True
    return dataset.map_batches(_read_mix_ranges, batch_size=1, batch_format="pyarrow", fn_kwargs={"mixed": mixed})


def _read_mix_ranges(items: pa.Table, mixed) -> Iterator[pa.Table]:
    """Ray map_batches function: the item tables of the mix ranges described by ``items``, in order."""
    for item in items.to_pylist():
        batch = mixed.get_batch(item["start"], item["stop"])
        table = _dense_table(batch["input_ids"], batch["doc_ids"])
        yield table.append_column("source", pa.array(batch["source"], pa.int64()))
    mixed.close()


def _dense_table(input_ids: np.ndarray, doc_ids: np.ndarray) -> pa.Table:
    """(n, C) tokens and doc ids as fixed_size_list columns, like :func:`raypack.packed.chunk_files.chunks_table`."""
    c = input_ids.shape[1]
    return pa.table({
        "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(input_ids.reshape(-1)), c),
        "doc_ids": pa.FixedSizeListArray.from_arrays(pa.array(doc_ids.reshape(-1)), c),
    })


# ----------------------------------------------------------------------------- tokenize


def tokenize_texts(tasks: Sequence, settings, *, num_workers: int, worker_num_cpus: float,
                   on_result: Callable | None = None) -> list:
    """Run every text task (raypack.tokenize.tasks) on a pool of tokenizer actors, handed out in
    the order given, one at a time to whichever actor is free; results in task order.

    Each actor's tokenizer gets ``cluster CPUs // actors`` threads (rayon_threads says why).
    """
    from dataclasses import replace

    from raypack.tokenize.tasks import TextResult, rayon_threads

    num_actors = max(1, min(num_workers, len(tasks)))
    cpus = ray.cluster_resources().get("CPU", os.cpu_count() or 1)
    settings = replace(settings, num_threads=rayon_threads(cpus, num_actors))
    errors: dict[int, str] = {}
    results = []
    for block in _blocks(_map_shards(TextTokenizerActor, tasks, settings, num_workers, worker_num_cpus, in_flight=1),
                         errors):
        for row in block.to_pylist():
            results.append(TextResult(**row))
            if on_result is not None:
                on_result(results[-1])
    _raise_first_error(errors)
    return sorted(results, key=lambda r: r.task_index)


# ----------------------------------------------------------------------------- pack --tokenizer, one pass


def pack_texts(placer, text_settings, settings: PackSettings, *, num_workers: int, worker_num_cpus: float,
               on_result: Callable[..., None] | None = None, max_held: int = 2) -> list[ShardResult]:
    """``pack --tokenizer`` on Ray Core actors, pipelined: tasks are tokenized in order, each
    actor holding at most ``max_held`` tokenized-or-tokenizing tasks; a task's report goes to
    ``placer`` (raypack.tokenize.onepass.Placer), and as soon as it is placed (every earlier task
    has reported) the actor that holds it packs it. An actor runs its calls in the order sent, so it
    tokenizes its next task while others report. The task that placement waits for is sent even
    to a full actor (no deadlock). Bad input raises InputError (the first met) once the calls in
    flight have ended. ``on_result(result)`` sees each packed task as it ends, and
    ``on_result(result, kept=True)`` each task kept from its resume record."""
    from collections import deque
    from dataclasses import replace

    from raypack.tokenize.onepass import TaskReport
    from raypack.tokenize.tasks import rayon_threads

    queue = deque(placer.to_tokenize())
    if queue:
        check_actors_fit(worker_num_cpus)
    cpus = ray.cluster_resources().get("CPU", os.cpu_count() or 1)
    fit = max(1, int(cpus / worker_num_cpus + 1e-9))  # an actor that never starts stalls its tasks, in order
    if num_workers > fit:
        log.info("%d workers (--workers, num_workers in a config) of %g CPU each (--worker-num-cpus): %d fit in the "
                 "cluster's %g CPUs; using %d", num_workers, worker_num_cpus, fit, cpus, fit)
    num_actors = max(1, min(num_workers, len(queue), fit))
    text_settings = replace(text_settings, num_threads=rayon_threads(cpus, num_actors))
    remote = ray.remote(TextPackerActor).options(num_cpus=worker_num_cpus, max_restarts=0)
    actors = [remote.remote(asdict(text_settings), asdict(settings)) for _ in range(num_actors)] if queue else []
    holding: list[set[int]] = [set() for _ in actors]
    owner: dict[int, int] = {}
    tokenizing: dict[Any, tuple[int, int]] = {}
    packing: dict[Any, tuple[int, int]] = {}
    placed: dict[int, dict] = {}
    """Each task whose pack call was sent: its placed task (sent again, after its text, if its actor dies)."""
    results: list[ShardResult] = []
    errors: dict[int, str] = {}
    replacements = 0

    def send_pack(a: int, k: int) -> None:
        packing[actors[a].pack.remote(placed[k])] = (a, k)

    def handle(steps) -> None:
        for step in steps:
            if step.kind == "kept":
                results.append(step.result)
                if on_result is not None:
                    on_result(step.result, kept=True)
            elif step.kind == "tokenize":
                queue.appendleft(step.text)
            else:
                placed[step.index] = asdict(step.task)
                send_pack(owner[step.index], step.index)

    def dispatch() -> None:
        while queue and not errors:
            a = min(range(len(actors)), key=lambda i: len(holding[i]))
            if len(holding[a]) >= max_held and queue[0].task_index != placer.next_index:
                return
            task = queue.popleft()
            holding[a].add(task.task_index)
            owner[task.task_index] = a
            tokenizing[actors[a].tokenize.remote(asdict(task))] = (a, task.task_index)

    def replace_actor(a: int, error: BaseException) -> None:
        """Actor ``a`` died (its process killed, its node lost): a new one tokenizes the tasks it held
        again, in order, and packs those already placed (an actor runs its calls in the order sent),
        as Ray Data restarts a token packer. The ids are the same, so the reports and offsets hold."""
        nonlocal replacements
        replacements += 1
        if replacements > MAX_ACTOR_REPLACEMENTS:
            raise error
        log.warning("a tokenizing packer died (%s); a new one tokenizes its %d tasks again", type(error).__name__,
                    len(holding[a]))
        for refs in (tokenizing, packing):
            for ref in [r for r, (b, _) in refs.items() if b == a]:
                del refs[ref]
        actors[a] = remote.remote(asdict(text_settings), asdict(settings))
        by_index = {t.task_index: t for t in placer.tasks}
        for k in sorted(holding[a]):
            tokenizing[actors[a].tokenize.remote(asdict(by_index[k]))] = (a, k)
            if k in placed:
                send_pack(a, k)

    try:
        handle(placer.advance())
        while tokenizing or packing or (not placer.done and not errors):
            dispatch()
            if not tokenizing and not packing:
                raise RuntimeError(f"internal error: text task {placer.next_index} is neither recorded nor queued")
            ready, _ = ray.wait([*tokenizing, *packing], num_returns=1)
            ref = ready[0]
            a, k = tokenizing[ref] if ref in tokenizing else packing[ref]
            try:
                value = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                replace_actor(a, e)
                continue
            if ref in tokenizing:
                del tokenizing[ref]
                if "error" in value:
                    errors[k] = value["error"]
                    continue
                if k in placed:
                    continue  # tokenized again after its actor died; its pack call follows it
                placer.report(k, TaskReport.from_dict(value))
                if not errors:
                    handle(placer.advance())
            else:
                del packing[ref]
                holding[a].discard(k)
                value = from_stream_bytes(value)
                if "error" in value.column_names:
                    errors.update(zip(value.column("task_index").to_pylist(), value.column("error").to_pylist()))
                    continue
                for result in table_to_results(value):
                    results.append(result)
                    if on_result is not None:
                        on_result(result)
    finally:
        for actor in actors:
            ray.kill(actor)
    _raise_first_error(errors)
    return sorted(results, key=lambda r: r.task_index)
