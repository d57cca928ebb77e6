"""Command line: ``raypack pack``, ``tokenize``, ``verify``, ``stats``, ``export``, ``mix``. Bad input: exit 2."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import os
import sys
from typing import Any, Mapping, NoReturn, Sequence

from raypack.io.allocator import purge_freed_pages, tokenizes

if tokenizes(sys.argv[1:]):  # Arrow's pool, set before the imports below load pyarrow (raypack.io.allocator)
    purge_freed_pages()

from raypack import __version__
from raypack.cli.messages import NO_THREAD, NO_THREAD_WORKERS, storage_failed, stray_paths_hint, unknown_flags_hint
from raypack.errors import InputError, install_extra
from raypack.io.terminal import command_done, escaped_line
from raypack.pack.config import TEXT_KEYS, TOKEN_DTYPES, PackConfig, flag_of, load_config
from raypack.strategies import DEFAULT_STRATEGY, STRATEGIES, option_fields, strategy_names
from raypack.tokenize.backends import BACKENDS, backend_names

DESCRIPTION = "Pack tokenized corpora into fixed-length context windows with Ray Data, identically at any parallelism."


class _Parser(argparse.ArgumentParser):
    """argparse's errors as one line (not the usage block), with where to see the flags. A flag is taken only
    as spelt in full: argparse's prefixes (``--context 512``) would change meaning in scripts the day a longer
    flag of that prefix is added (a new user's trial); a prefix gets the "did you mean" line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        them = "its flags" if " " in self.prog else "them"
        self.exit(2, f"raypack: error: {message}; {self.prog} --help lists {them}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="raypack", description=DESCRIPTION,
                                     epilog="raypack COMMAND --help shows a command's flags and their defaults")
    parser.add_argument("--version", action="version", version=f"raypack {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    pack = commands.add_parser("pack", help="pack sharded corpora (token ids, or text with --tokenizer) into "
                                            "fixed-length chunks")
    pack.add_argument("--config", help="a TOML config (configs/*.toml); flags override its keys")
    pack.add_argument("--input", dest="inputs", action="append", metavar="PATH",
                      help="shard file, directory or glob (repeatable; order kept)")
    pack.add_argument("--output", help="output directory")
    pack.add_argument("--context-length", type=int, metavar="C",
                      help="tokens per chunk (required, or context_length in --config)")
    pack.add_argument("--pad-token", type=int, metavar="ID", help="token id that fills the end of the last chunk")
    pack.add_argument("--token-column", metavar="NAME", help="the inputs' column (or key) of token ids")
    pack.add_argument("--token-dtype", metavar="DTYPE",
                      help=f"the output's token type, one of {', '.join(TOKEN_DTYPES)} (auto: the narrowest type "
                           "every input's type fits in)")
    pack.add_argument("--extra-columns", type=_comma_list, metavar="NAME[=FILL],...",
                      help="per-token list columns of the inputs (integers or bools, one value per token) packed "
                           "with the tokens, e.g. loss_mask,labels=-100 (FILL: the value on padding, default 0)")
    pack.add_argument("--workers", dest="num_workers", type=int,
                      help="packers: Ray actors, or with --local threads of this process (token inputs); "
                           "with --local --tokenizer, 1 tokenizes and packs each task in turn (one task held)")
    pack.add_argument("--read-batch-size", type=int,
                      help="documents per record batch read (0: from each shard's mean document length)")
    pack.add_argument("--read-batch-tokens", type=int, metavar="TOKENS",
                      help="tokens a packer takes at once (memory): per read batch with read batch size 0, "
                           "and at most per slice of a long document")
    pack.add_argument("--max-document-tokens", type=int, metavar="TOKENS",
                      help="refuse a longer document (a packer reads a document whole; see BENCHMARKS.md for its "
                           "memory per token)")
    pack.add_argument("--long-docs", metavar="split|truncate|drop",
                      help="a document longer than C: split it across chunks, truncate it to its first C tokens, "
                           "or drop it")
    pack.add_argument("--chunks-per-record-batch", type=int, metavar="N", help="chunks per Arrow record batch written")
    pack.add_argument("--task-tokens", type=int, metavar="TOKENS",
                      help="split a larger Parquet / Arrow IPC shard into tasks of whole row groups / record "
                           "batches of at least this many tokens (0: one task per shard)")
    pack.add_argument("--worker-num-cpus", type=float, metavar="CPUS", help="CPUs each packer actor reserves")
    _add_strategy_arguments(pack)
    pack.add_argument("--dry-run", action="store_true",
                      help="print what every strategy would give on a sample (with --tokenizer: the "
                           "sample tokenized in memory); write nothing")
    pack.add_argument("--sample-docs", type=int, metavar="N",
                      help="with --dry-run: the first N documents of the stream (0: all)")
    pack.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded local Ray)")
    pack.add_argument("--overwrite", action="store_true", default=None, help=OVERWRITE_HELP)
    pack.add_argument("--resume", action="store_true",
                      help="finish an interrupted run: keep the tasks (shards, or parts of them) whose output "
                           "verifies, pack the rest")
    pack.add_argument("--progress-timeout", dest="progress_timeout_s", type=float, metavar="SECONDS",
                      help="report a packer that makes no progress on its shard for this long (0: never)")
    pack.add_argument("--restart-stalled", action="store_true", default=None,
                      help="on Ray, also end a stalled packer so that Ray restarts it and packs its shard again")
    pack.add_argument("--verify-inputs", action="store_true", default=None,
                      help="identify inputs by the sha256 of all their bytes, not only size and first/last MiB "
                           "(and Parquet footer): costs one more full read of every shard when packing, and of "
                           "every kept shard on --resume; a record made without it is not reused with it")
    pack.add_argument("--local", action="store_true", help="pack in this process, without Ray")
    pack.add_argument("--tokenizer", metavar="SPEC",
                      help="the inputs are text: tokenize them first (tokenizer.json, its directory, or tiktoken:NAME)")
    _add_text_arguments(pack)
    text_defaults = {k: v for k, v in _text_defaults().items() if k in _TEXT_ARGUMENTS}
    _show_defaults(pack, {**PackConfig().to_dict(), **text_defaults, "sample_docs": _sample_docs_default()})
    tokenize = commands.add_parser("tokenize", help="tokenize text (Parquet or JSON Lines) into a tokenized corpus")
    tokenize.add_argument("--config", help="a pack TOML config (configs/*.toml): its inputs, tokenizer and text keys "
                          "are used (its other keys are pack's); flags override them")
    tokenize.add_argument("--input", dest="inputs", action="append", metavar="PATH",
                          help="text file, directory or glob (repeatable; order kept; required, or inputs in --config)")
    tokenize.add_argument("--output", required=True, help="output directory")
    tokenize.add_argument("--tokenizer", metavar="SPEC",
                          help="a tokenizer.json, a directory holding one, or tiktoken:NAME (required, or tokenizer in "
                               "--config)")
    tokenize.add_argument("--token-dtype", default=_text_defaults()["token_dtype"],
                          help="auto (narrowest holding the vocabulary), uint8, uint16, uint32")
    tokenize.add_argument("--workers", dest="num_workers", type=int, default=_tokenize_defaults()["num_workers"],
                          help="tokenizer actors")
    tokenize.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded local Ray)")
    tokenize.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    tokenize.add_argument("--resume", action="store_true",
                          help="finish an interrupted run: keep tasks whose output verifies")
    tokenize.add_argument("--local", action="store_true", help="tokenize in this process, without Ray")
    _add_text_arguments(tokenize)
    for sub in (pack, tokenize):
        sub.add_argument("-v", "--verbose", action="store_true", help="also show Ray's own logs on the terminal")
    _show_defaults(tokenize, _text_defaults())
    verify = commands.add_parser("verify", help="audit a packed output against its manifest and its inputs",
                                 epilog="exit status: 0 the output passed; 1 it failed the audit, a damaged manifest "
                                        "included (the line names the file and the difference); 2 verify could not "
                                        "run (a flag, a path that holds no output: the line says which)")
    verify.add_argument("output", metavar="OUT", help="packed output directory")
    verify.add_argument("--input", dest="inputs", action="append", metavar="PATH",
                        help="input shards to compare with (default: the manifest's shards, if present)")
    verify.add_argument("--no-inputs", action="store_true", help="check the output alone")
    verify.add_argument("--token-column", help="token column of the inputs (default: the manifest's)")
    verify.add_argument("--max-document-tokens", type=int, metavar="TOKENS",
                        help="refuse a longer input document, as pack does (default: pack's default; verify "
                             "reads a document whole)")
    verify.add_argument("--check-tokenizer", type=int, nargs="?", const=64, metavar="N",
                        help="an output packed from text: re-encode N of its documents (default 64) from their "
                             "text files with the tokenizer's reference library and compare, token for token")
    verify.add_argument("--tokenizer", metavar="PATH",
                        help="--check-tokenizer: the tokenizer.json the output was packed with, where it is now "
                             "(moved since; it must hash to the sha256 the manifest records)")
    verify.add_argument("--max-document-bytes", type=int, metavar="BYTES",
                        help="--check-tokenizer: a chosen document of more text is counted, not re-encoded (default: "
                             "pack's default, 16 MiB; the reference library needs ~110-230 bytes of memory a byte)")
    stats = commands.add_parser("stats", help="how well an output packed: padding, split documents, fragments")
    stats.add_argument("output", metavar="OUT", help="packed output directory")
    stats.add_argument("--plot", metavar="PNG", help=f"also write a plot (needs {PLOT_EXTRA})")
    _add_export_parser(commands)
    _add_mix_parser(commands)
    return parser


def _add_mix_parser(commands) -> None:
    mix = commands.add_parser("mix", help="an index-only training order over packed outputs: weighted shares, "
                                          "passes and a seeded shuffle (docs/MIX.md)")
    mix.add_argument("--config", help="a TOML config: output, num_chunks, seed, [[sources]] path and weight")
    mix.add_argument("--source", dest="sources", action="append", metavar="OUT",
                     help="a packed output (repeatable, order kept; replaces the config's sources)")
    mix.add_argument("--weight", dest="weights", action="append", metavar="W",
                     help="the weight of the --source at the same place (positive; need not sum to 1)")
    mix.add_argument("--num-chunks", type=int, metavar="N", help="items of the mix")
    mix.add_argument("--seed", type=int, help="the order's seed, 0..2**64-1 (default: 0)")
    mix.add_argument("--output", help="the mix directory (holds a manifest only)")
    mix.add_argument("--overwrite", action="store_true", default=None, help=OVERWRITE_HELP)
    mix.add_argument("--allow-mixed-tokenizers", action="store_true", default=None,
                     help="mix sources whose manifests name different tokenizers (refused otherwise)")


def _run_mix(args: argparse.Namespace) -> int:
    from raypack.mix.dataset import load_mix_config, run_mix

    sources = args.sources or []
    weights = args.weights or []
    if len(sources) != len(weights):
        raise InputError(f"{len(sources)} --source but {len(weights)} --weight; give one --weight after each --source")
    pairs = [(path, _number(text)) for path, text in zip(sources, weights)] or None
    config = load_mix_config(args.config, sources=pairs, output=args.output, num_chunks=args.num_chunks,
                             seed=args.seed, overwrite=args.overwrite,
                             allow_mixed_tokenizers=args.allow_mixed_tokenizers)
    print("\n".join(map(escaped_line, run_mix(config).lines())))
    return 0


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError as e:
        raise InputError(f"--weight {text}: not a number") from e


def _add_export_parser(commands) -> None:
    from raypack.export import EXPORTERS

    export = commands.add_parser("export", help="write a tokenized corpus or a packed output in another format")
    export.add_argument("source", metavar="SRC", help="a tokenized corpus (raypack tokenize) or a packed output")
    export.add_argument("--format", required=True,
                        help="; ".join(f"{name}: {cls.summary}" for name, cls in EXPORTERS.items()))
    export.add_argument("--output", required=True, help="where to write (the format says what: a prefix, a directory)")
    export.add_argument("--token-dtype", metavar="DTYPE", help="the exported token type (default: the source's)")
    export.add_argument("--workers", type=int, default=1, help="local processes writing parts (default: 1)")
    export.add_argument("--overwrite", action="store_true", help="replace an existing export")
    export.add_argument("--verify", action="store_true", help="after writing, compare the export with its source")
    export.add_argument("--verify-only", action="store_true",
                        help="write nothing: compare an existing export with its source")


PLOT_EXTRA = install_extra("plot")


def _comma_list(text: str) -> tuple[str, ...]:
    """``a,b=1`` -> ``("a", "b=1")`` (empty items dropped)."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _show_defaults(parser: argparse.ArgumentParser, defaults: Mapping[str, Any]) -> None:
    """Append ``(default: X)`` to every flag's help that names no default, X taken from ``defaults`` by
    the flag's dest, else from the flag's own default; flags without one (None, "", ()) are left as they are."""
    for action in parser._actions:
        if action.dest == "help" or "default" in (action.help or "") or "required" in (action.help or ""):
            continue
        value = defaults.get(action.dest, action.default)
        if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
            continue
        shown = ("on" if value else "off") if isinstance(value, bool) else value
        action.help = f"{action.help} (default: {shown})" if action.help else f"default: {shown}"


def _text_defaults() -> dict[str, Any]:
    """TextOptions' field defaults by name (the text flags of pack and tokenize)."""
    from raypack.tokenize.job import TextOptions

    return {f.name: f.default for f in dataclasses.fields(TextOptions) if f.default is not dataclasses.MISSING}


def _tokenize_defaults() -> dict[str, Any]:
    from raypack.tokenize.job import TokenizeConfig

    return {f.name: f.default for f in dataclasses.fields(TokenizeConfig) if f.default is not dataclasses.MISSING}


def _sample_docs_default() -> int:
    from raypack.pack.dry_run import dry_run

    return inspect.signature(dry_run).parameters["sample_docs"].default


def _add_strategy_arguments(pack: argparse.ArgumentParser) -> None:
    """``--strategy`` with the registered names, and one flag per strategy option (its key with dashes)."""
    pack.add_argument("--strategy", choices=strategy_names(),
                      help="; ".join(f"{name}{' (default)' if name == DEFAULT_STRATEGY else ''}: {cls.summary}"
                                     for name, cls in STRATEGIES.items()))
    for key, (_, field) in option_fields().items():
        kind = field.metadata.get("type", type(field.default))  # a default of None names its type; a bool: a switch
        how = {"action": "store_true", "default": None} if kind is bool else {"type": kind,
                                                                               "metavar": field.metadata.get("metavar")}
        pack.add_argument("--" + key.replace("_", "-"), *field.metadata.get("aliases", ()),
                          help=field.metadata.get("help"), **how)


_TEXT_ARGUMENTS = TEXT_KEYS  # the text flags are the config's text keys


def _add_text_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text-column", help="the text column (Parquet) or key (JSON Lines)")
    parser.add_argument("--bos", metavar="TOKEN|ID", help="a token (or, if digits, an id) put before every document")
    parser.add_argument("--eos", metavar="TOKEN|ID", help="a token (or, if digits, an id) put after every document")
    parser.add_argument("--task-rows", type=int,
                        help="Parquet: rows per tokenize task (whole row groups)")
    parser.add_argument("--task-bytes", type=int,
                        help="bytes of text per tokenize task (Parquet: whole row groups, up to this many "
                             "bytes or --task-rows rows; JSON Lines: line-aligned byte ranges); pack --tokenizer "
                             "on Ray, with best_fit or with --workers 1 holds at most a quarter this many ids of a "
                             "task in memory (the rest of a larger row group waits in a spill file); with --local, "
                             "concat packs a task as it is tokenized")
    parser.add_argument("--max-document-bytes", type=int, metavar="BYTES",
                        help="a longer text is refused, naming it, before it is encoded (default: 16 MiB)")
    parser.add_argument("--tokenizer-backend", choices=backend_names(),
                        help="who computes the ids (the same ids whichever): auto, the fastest installed backend "
                             "that can do the tokenizer, else the reference; "
                             + "; ".join(f"{name}: {b.summary}" for name, b in BACKENDS.items()))


OVERWRITE_HELP = "replace an earlier raypack output (a directory holding other files is refused)"


def _refuse_contradictions(args: argparse.Namespace, rules: Sequence[tuple[str, str, str]]) -> None:
    """Raise InputError naming the first pair of flags (dest, dest) given together, with ``why``."""
    for first, second, why in rules:
        if _given(args, first) and _given(args, second):
            raise InputError(f"{flag_of(first)} and {flag_of(second)} cannot be used together: {why}")


def _given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the flag was on the command line (the flags that matter here default to None or False)."""
    value = getattr(args, dest)
    return value is not None and value is not False


_RERUN_RULES = (
    ("resume", "overwrite", "--resume keeps the finished part of an output, --overwrite replaces it; pass one"),
    ("local", "address", "--local runs without Ray, --address names a Ray cluster; pass one"),
)
_PACK_RULES = (
    *_RERUN_RULES,
    ("dry_run", "resume", "--dry-run writes nothing, so there is nothing to resume; drop --resume"),
    ("dry_run", "overwrite", "--dry-run writes nothing, so there is nothing to overwrite; drop --overwrite"),
    ("dry_run", "address", "--dry-run reads its sample in this process, without Ray; drop --address"),
)


def _run_tokenize(args: argparse.Namespace) -> int:
    from raypack.tokenize.job import TokenizeConfig, run_tokenize

    _refuse_contradictions(args, _RERUN_RULES)
    if args.num_workers < 1:
        raise InputError(f"--workers {args.num_workers}: must be an integer >= 1")
    keys = ("inputs", "tokenizer", *_TEXT_ARGUMENTS)
    pack_config = load_config(args.config, required=("inputs", "tokenizer"), **{k: getattr(args, k) for k in keys})
    text = dataclasses.replace(_pack_text_options(pack_config), token_dtype=args.token_dtype)
    config = TokenizeConfig(inputs=pack_config.inputs, output=args.output, text=text, num_workers=args.num_workers,
                            overwrite=args.overwrite, address=args.address or pack_config.address)
    refuse_output_in_rays_copy(config.output)
    summary = run_tokenize(config, engine="local" if args.local else "ray", resume=args.resume)
    command_done()  # published: a Ctrl-C or SIGTERM as the summary shows does not undo it
    print("\n".join(map(escaped_line, summary.lines())))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Bad input: one line, exit 2. A Ray worker that failed otherwise, or the storage (an OSError that is not
    bad input): one line, exit 1. Ctrl-C: one line with the ``--resume`` command, exit 130 (SIGTERM under
    the console script: the same, 143). A closed stdout (``| head``): quiet, exit 141. A thread the system
    refused: one line, exit 1."""
    from raypack.errors import PublishFailed, WorkerError
    from raypack.io.terminal import (
        RAY_VERBOSE,
        configure_logging,
        interrupted_code,
        interrupted_line,
        silence_stdout,
    )

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        hint = stray_paths_hint(args, argv, extra) or unknown_flags_hint(parser, args.command, extra)
        print(f"raypack: error: {escaped_line(hint)}", file=sys.stderr)
        return 2
    configure_logging()
    RAY_VERBOSE.set(bool(vars(args).pop("verbose", False)))
    try:
        runners = {"pack": _run_pack, "verify": _run_verify, "stats": _run_stats, "tokenize": _run_tokenize,
                   "export": _run_export, "mix": _run_mix}
        code = runners[args.command](args)
        command_done()  # a signal as the summary shows (it is flushed next) does not undo the finished run
        sys.stdout.flush()  # a closed pipe shows here, not in Python's flush at exit
        return code
    except InputError as e:
        print(f"raypack: error: {escaped_line(str(e))}", file=sys.stderr)
        return 2
    except WorkerError as e:
        print(f"raypack: error: {escaped_line(str(e))}", file=sys.stderr)
        return 1
    except PublishFailed as e:
        print(f"raypack: error: {escaped_line(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        kept = getattr(e, "kept", None)
        if kept is None and args.command in ("pack", "tokenize"):  # before the run took its output (Ray's start)
            from raypack.pack.publish import work_kept

            kept = work_kept(getattr(args, "output", None))
        print(interrupted_line(argv, kept), file=sys.stderr)
        return interrupted_code()
    except BrokenPipeError:
        silence_stdout()
        return 141
    except OSError as e:  # the storage failed under the command: a store that stopped answering, an I/O error
        print(f"raypack: error: {escaped_line(storage_failed(e, args.command))}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # threading's words when the OS refuses a thread (ulimit -u, ulimit -v)
        if "can't start new thread" not in str(e):
            raise
        has_workers = "num_workers" in vars(args) or "workers" in vars(args)
        print(f"raypack: error: {NO_THREAD}{NO_THREAD_WORKERS if has_workers else ''}", file=sys.stderr)
        return 1


def _refuse_unfinished(output: str, then: str) -> None:
    """An output that is not there yet while an interrupted run's work waits: one line naming it, not
    "no such output directory" (``then``: what to do once the run is finished)."""
    from raypack.pack.publish import work_kept

    kept = None if os.path.exists(output) else work_kept(output)
    if kept is not None:
        raise InputError(f"{output}: no output here yet: an unfinished run's work is in {kept}; finish it with "
                         f"the run's own command and --resume, then {then}")


def _run_verify(args: argparse.Namespace) -> int:
    from raypack.verify import VerifyError, verify_output
    from raypack.verify.tokenizer import check_count, check_max_document_bytes, check_tokenizer

    _refuse_contradictions(args, (
        ("no_inputs", "inputs", "--no-inputs checks the output alone; drop one"),
        ("no_inputs", "token_column", "--token-column names the inputs' column, which --no-inputs does not read"),
    ))
    inputs = [] if args.no_inputs else args.inputs
    _refuse_unfinished(args.output, "verify")
    if args.check_tokenizer is not None:  # before the audit, which takes a while and prints its notes
        check_count(args.check_tokenizer)
        if args.max_document_bytes is not None:
            check_max_document_bytes(args.max_document_bytes)
    elif args.max_document_bytes is not None:
        raise InputError("--max-document-bytes limits what --check-tokenizer re-encodes: add --check-tokenizer, "
                         "or drop it")
    elif args.tokenizer is not None:
        raise InputError("--tokenizer names the tokenizer --check-tokenizer re-encodes with: add --check-tokenizer, "
                         "or drop it")
    try:
        limit = {} if args.max_document_tokens is None else {"max_document_tokens": args.max_document_tokens}
        report = verify_output(args.output, inputs, token_column=args.token_column, **limit)
        text_limit = {} if args.max_document_bytes is None else {"max_document_bytes": args.max_document_bytes}
        if args.tokenizer is not None:
            text_limit["tokenizer"] = args.tokenizer
        extra = [] if args.check_tokenizer is None else check_tokenizer(args.output, args.check_tokenizer, **text_limit)
    except VerifyError as e:
        print(f"raypack: verify failed: {escaped_line(str(e))}", file=sys.stderr)
        return 1
    print("\n".join(map(escaped_line, [*report.lines(), *extra])))
    return 0


def _run_export(args: argparse.Namespace) -> int:
    from raypack.export import ExportMismatch
    from raypack.export.job import run_export, verify_export

    _refuse_contradictions(args, (
        ("verify_only", "overwrite", "--verify-only writes nothing; drop --overwrite"),
        ("verify_only", "verify", "--verify-only already verifies; drop --verify"),
    ))
    try:
        if args.verify_only:
            lines = verify_export(args.source, args.format, args.output, token_dtype=args.token_dtype)
        else:
            lines = run_export(args.source, args.format, args.output, token_dtype=args.token_dtype,
                               workers=args.workers, overwrite=args.overwrite, verify=args.verify).lines()
    except ExportMismatch as e:
        print(f"raypack: verify failed: {escaped_line(str(e))}", file=sys.stderr)
        return 1
    print("\n".join(map(escaped_line, lines)))
    return 0


def _check_plot_path(path: str) -> None:
    """A --plot path a PNG can be written to, said before the report (a directory, another suffix or a
    missing folder gave a traceback after it, or a file other than the one named: a new user's trial)."""
    folder = os.path.dirname(path) or "."
    if not path.lower().endswith(".png") or os.path.isdir(path):
        raise InputError(f"--plot {path}: give a file name ending in .png (the plot is a PNG)")
    if not os.path.isdir(folder):
        raise InputError(f"--plot {path}: {folder} is not a directory; create it, or give a path in one")


def _run_stats(args: argparse.Namespace) -> int:
    from raypack.cli.stats import packing_stats, plot_stats
    from raypack.mix.dataset import MixStats

    _refuse_unfinished(args.output, "run stats")
    report = packing_stats(args.output)
    if args.plot and isinstance(report, MixStats):
        raise InputError(f"--plot draws a packed output's fragments; {args.output} is a mix (its sources have plots)")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before the report, not after it
        raise InputError(f"--plot needs matplotlib, which is not installed; {PLOT_EXTRA}")
    if args.plot:
        _check_plot_path(args.plot)
    print("\n".join(map(escaped_line, report.lines())))
    if args.plot:
        try:
            print(f"plot written to {plot_stats(report, args.plot)}")
        except ImportError as e:
            raise InputError(f"--plot needs matplotlib ({e}); {PLOT_EXTRA}") from e
    return 0


def _pack_text_options(config):
    from raypack.tokenize.job import TextOptions

    given = {k: getattr(config, k) for k in ("task_rows", "task_bytes", "max_document_bytes")
             if getattr(config, k) is not None}
    return TextOptions(tokenizer=config.tokenizer, text_column=config.text_column, bos=config.bos, eos=config.eos,
                       tokenizer_backend=config.tokenizer_backend, **given)


def _run_pack(args: argparse.Namespace) -> int:
    from raypack.pack.job import run_pack

    _refuse_contradictions(args, _PACK_RULES)
    if args.sample_docs is not None and not args.dry_run:
        raise InputError("--sample-docs applies only with --dry-run; add --dry-run or drop --sample-docs")
    skip = ("command", "config", "local", "resume", "dry_run", "sample_docs")
    overrides = {k: v for k, v in vars(args).items() if k not in skip}
    config = load_config(args.config, required=("context_length",), **overrides)  # tokenizer etc.: flags or TOML
    text = _pack_text_options(config) if config.tokenizer else None
    if text is None and config.text_keys_given():
        keys = config.text_keys_given()
        flags = [flag_of(k) for k in keys if getattr(args, k) is not None]
        if flags:
            it = "it applies" if len(flags) == 1 else "they apply"
            raise InputError(f"{', '.join(flags)} {'needs' if len(flags) == 1 else 'need'} --tokenizer: "
                             f"{it} to text inputs, which are tokenized with it")
        it = "it applies" if len(keys) == 1 else "they apply"
        raise InputError(f"{args.config}: {', '.join(keys)} {'needs' if len(keys) == 1 else 'need'} tokenizer: "
                         f"{it} to text inputs; set tokenizer there or pass --tokenizer")
    if text is not None and (args.token_column is not None or config.token_column != PackConfig.token_column):
        raise InputError(f"--token-column {config.token_column} names the column of token ids in token inputs; with "
                         "--tokenizer the inputs are text: name their column with --text-column")
    if args.dry_run:
        from raypack.pack.dry_run import dry_run

        sample_docs = _sample_docs_default() if args.sample_docs is None else args.sample_docs
        if sample_docs < 0:
            raise InputError(f"--sample-docs={sample_docs} must be >= 0 (0: every document)")
        if text is not None:
            from raypack.tokenize.job import dry_run_text

            report = dry_run_text(config, text, sample_docs)
        else:
            report = dry_run(config, sample_docs=sample_docs)
        print("\n".join(map(escaped_line, report.lines())))
        return 0
    refuse_output_in_rays_copy(config.output)
    summary = run_pack(config, engine="local" if args.local else "ray", resume=args.resume, text=text)
    command_done()  # published: a Ctrl-C or SIGTERM as the summary shows does not undo it
    print("\n".join(map(escaped_line, summary.lines())))
    return 0


RAYS_COPY = f"{os.sep}runtime_resources{os.sep}working_dir_files{os.sep}"
"""Where a job from ``ray job submit --working-dir`` runs: Ray's copy of that directory, removed as Ray sees fit."""


def refuse_output_in_rays_copy(output: str, cwd: str | None = None) -> None:
    """A relative ``--output`` in a submitted job would land in Ray's copy of the working directory, and the
    job would succeed (an operator's trial): one line instead."""
    cwd = os.getcwd() if cwd is None else cwd
    if output and RAYS_COPY in cwd + os.sep and not os.path.isabs(output) and "://" not in output:
        raise InputError(f"--output {output} is relative, and this job runs in Ray's copy of its working directory "
                         f"({cwd}), which Ray removes: the output would be lost there; give an absolute path on "
                         "storage every node sees, or a URI")

