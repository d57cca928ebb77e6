"""Command line: ``raypack pack ...``, ``raypack tokenize ...``. Bad input: one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

from raypack.config import load_config
from raypack.errors import InputError
from raypack.strategies import DEFAULT_STRATEGY, STRATEGIES, option_fields, strategy_names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raypack", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    pack = commands.add_parser("pack", help="pack sharded tokenized corpora into fixed-length chunks")
    pack.add_argument("--config", help="a TOML config (configs/*.toml); flags override its keys")
    pack.add_argument("--input", dest="inputs", action="append", metavar="PATH",
                      help="shard file, directory or glob (repeatable; order kept)")
    pack.add_argument("--output", help="output directory")
    pack.add_argument("--context-length", type=int)
    pack.add_argument("--pad-token", type=int)
    pack.add_argument("--token-column")
    pack.add_argument("--token-dtype")
    pack.add_argument("--workers", dest="num_workers", type=int, help="packer actors")
    pack.add_argument("--read-batch-size", type=int, help="documents per record batch read")
    pack.add_argument("--read-batch-tokens", type=int, metavar="TOKENS",
                      help="with read batch size 0: tokens per read batch (default 1048576)")
    pack.add_argument("--chunks-per-record-batch", type=int, metavar="N", help="chunks per Arrow record batch written")
    pack.add_argument("--worker-num-cpus", type=float, metavar="CPUS", help="CPUs each packer actor reserves")
    _add_strategy_arguments(pack)
    pack.add_argument("--dry-run", action="store_true",
                      help="print what every strategy would give on a sample; write nothing")
    pack.add_argument("--sample-docs", type=int, default=100_000, metavar="N",
                      help="with --dry-run: the first N documents of the stream (0: all; default 100000)")
    pack.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded local Ray)")
    pack.add_argument("--overwrite", action="store_true", default=None, help="replace a non-empty output directory")
    pack.add_argument("--resume", action="store_true",
                      help="finish an interrupted run: keep shards whose output verifies, pack the rest")
    pack.add_argument("--progress-timeout", dest="progress_timeout_s", type=float, metavar="SECONDS",
                      help="report a packer that makes no progress on its shard for this long (0: never; "
                           "default 600)")
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
    tokenize = commands.add_parser("tokenize", help="tokenize text (Parquet or JSON Lines) into a tokenized corpus")
    tokenize.add_argument("--input", dest="inputs", action="append", metavar="PATH", required=True,
                          help="text file, directory or glob (repeatable; order kept)")
    tokenize.add_argument("--output", required=True, help="output directory")
    tokenize.add_argument("--tokenizer", metavar="SPEC", required=True,
                          help="a tokenizer.json, a directory holding one, or tiktoken:NAME")
    tokenize.add_argument("--token-dtype", default="auto",
                          help="auto (narrowest holding the vocabulary), uint8, uint16, uint32")
    tokenize.add_argument("--workers", dest="num_workers", type=int, default=2, help="tokenizer actors")
    tokenize.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded local Ray)")
    tokenize.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    tokenize.add_argument("--resume", action="store_true",
                          help="finish an interrupted run: keep tasks whose output verifies")
    tokenize.add_argument("--local", action="store_true", help="tokenize in this process, without Ray")
    _add_text_arguments(tokenize)
    verify = commands.add_parser("verify", help="audit a packed output against its manifest and its inputs")
    verify.add_argument("output", metavar="OUT", help="packed output directory")
    verify.add_argument("--input", dest="inputs", action="append", metavar="PATH",
                        help="input shards to compare with (default: the manifest's shards, if present)")
    verify.add_argument("--no-inputs", action="store_true", help="check the output alone")
    verify.add_argument("--token-column", help="token column of the inputs (default: the manifest's)")
    stats = commands.add_parser("stats", help="how well an output packed: padding, split documents, fragments")
    stats.add_argument("output", metavar="OUT", help="packed output directory")
    stats.add_argument("--plot", metavar="PNG", help="also write a plot (needs matplotlib)")
    return parser


def _add_strategy_arguments(pack: argparse.ArgumentParser) -> None:
    """``--strategy`` with the registered names, and one flag per strategy option (its key with dashes)."""
    pack.add_argument("--strategy", choices=strategy_names(),
                      help="; ".join(f"{name}{' (default)' if name == DEFAULT_STRATEGY else ''}: {cls.summary}"
                                     for name, cls in STRATEGIES.items()))
    for key, (_, field) in option_fields().items():
        kind = type(field.default)  # an option has a default; a bool one is a switch
        how = {"action": "store_true", "default": None} if kind is bool else {"type": kind,
                                                                               "metavar": field.metadata.get("metavar")}
        pack.add_argument("--" + key.replace("_", "-"), help=field.metadata.get("help"), **how)


_TEXT_ARGUMENTS = ("text_column", "bos", "eos", "task_rows", "task_bytes")


def _add_text_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text-column", help="the text column (Parquet) or key (JSON Lines); default text")
    parser.add_argument("--bos", metavar="TOKEN|ID", help="a token (or, if digits, an id) put before every document")
    parser.add_argument("--eos", metavar="TOKEN|ID", help="a token (or, if digits, an id) put after every document")
    parser.add_argument("--task-rows", type=int,
                        help="Parquet: rows per tokenize task (whole row groups; default 65536)")
    parser.add_argument("--task-bytes", type=int, help="JSON Lines: bytes per tokenize task (default 64 MiB)")


def _text_options(args: argparse.Namespace, token_dtype: str = "auto"):
    from raypack.tokenize_job import TextOptions

    given = {k: getattr(args, k) for k in _TEXT_ARGUMENTS if getattr(args, k) is not None}
    return TextOptions(tokenizer=args.tokenizer, token_dtype=token_dtype, **given)


def _run_tokenize(args: argparse.Namespace) -> int:
    from raypack.tokenize_job import TokenizeConfig, run_tokenize

    if args.num_workers < 1:
        raise InputError(f"--workers={args.num_workers} must be >= 1")
    config = TokenizeConfig(inputs=tuple(args.inputs), output=args.output, text=_text_options(args, args.token_dtype),
                            num_workers=args.num_workers, overwrite=args.overwrite, address=args.address)
    summary = run_tokenize(config, engine="local" if args.local else "ray", resume=args.resume)
    print("\n".join(summary.lines()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        runners = {"pack": _run_pack, "verify": _run_verify, "stats": _run_stats, "tokenize": _run_tokenize}
        return runners[args.command](args)
    except InputError as e:
        print(f"raypack: error: {e}", file=sys.stderr)
        return 2


def _run_verify(args: argparse.Namespace) -> int:
    from raypack.verify import VerifyError, verify_output

    inputs = [] if args.no_inputs else args.inputs
    try:
        report = verify_output(args.output, inputs, token_column=args.token_column)
    except VerifyError as e:
        print(f"raypack: verify failed: {e}", file=sys.stderr)
        return 1
    print("\n".join(report.lines()))
    return 0


def _run_stats(args: argparse.Namespace) -> int:
    from raypack.stats import packing_stats, plot_stats

    report = packing_stats(args.output)
    print("\n".join(report.lines()))
    if args.plot:
        try:
            print(f"plot written to {plot_stats(report, args.plot)}")
        except ImportError as e:
            raise InputError(f"--plot needs matplotlib ({e}); pip install matplotlib") from e
    return 0


def _pack_text_options(config, args: argparse.Namespace):
    from raypack.tokenize_job import TextOptions

    given = {k: getattr(args, k) for k in ("task_rows", "task_bytes") if getattr(args, k) is not None}
    return TextOptions(tokenizer=config.tokenizer, text_column=config.text_column, bos=config.bos, eos=config.eos,
                       **given)


def _run_pack(args: argparse.Namespace) -> int:
    from raypack.job import run_pack

    skip = ("command", "config", "local", "resume", "dry_run", "sample_docs", "task_rows", "task_bytes")
    overrides = {k: v for k, v in vars(args).items() if k not in skip}
    config = load_config(args.config, **overrides)  # tokenizer, text_column, bos, eos: flags or TOML keys
    text = _pack_text_options(config, args) if config.tokenizer else None
    if text is None and (any(getattr(args, k) is not None for k in _TEXT_ARGUMENTS)
                         or (config.text_column, config.bos, config.eos) != ("text", None, None)):
        raise InputError("--text-column, --bos, --eos, --task-rows and --task-bytes need --tokenizer")
    if args.dry_run:
        from raypack.dry_run import dry_run

        if text is not None:
            raise InputError("--dry-run reads tokenized shards; run raypack tokenize first, "
                             "then pack --dry-run over its output")

        if args.sample_docs < 0:
            raise InputError(f"--sample-docs={args.sample_docs} must be >= 0 (0: every document)")
        print("\n".join(dry_run(config, sample_docs=args.sample_docs).lines()))
        return 0
    summary = run_pack(config, engine="local" if args.local else "ray", resume=args.resume, text=text)
    print("\n".join(summary.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
