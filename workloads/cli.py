"""``workload convert`` and ``workload stats`` subcommands, added to a caller's argparse subparsers.

Each subcommand sets ``func`` on the parsed namespace: ``args.func(args)`` runs it and returns the exit
code (0 ok, 2 bad input or options); errors are printed as one line on stderr, without a traceback, and so
are the converters' warnings (:class:`~workloads.errors.WorkloadWarning`: input converted with a correction).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import warnings
from typing import Any

from workloads.convert import CONVERTERS
from workloads.errors import WorkloadFormatError, WorkloadWarning
from workloads.io import read_sessions, write_sessions
from workloads.stats import format_stats, workload_stats


def register(subparsers: Any) -> None:
    """Add ``convert`` and ``stats`` to an ``argparse`` subparsers object."""
    convert = subparsers.add_parser(
        "convert",
        help="convert traces / trajectories to a session script",
        description="Convert a public trace or trajectory format to a servetwin-sessions JSONL file.",
    )
    convert.add_argument("format", metavar="FORMAT", help=f"one of: {', '.join(sorted(CONVERTERS))}")
    convert.add_argument(
        "inputs", metavar="INPUT", nargs="+", help="input files (or directories, for mini-swe-agent)"
    )
    convert.add_argument(
        "-o", "--output", required=True, metavar="OUT.jsonl", help="output file (.gz to compress)"
    )
    convert.add_argument("--seed", type=int, help="seed for modelled waits (mini-swe-agent, tau-bench)")
    convert.add_argument("--qps", type=float, help="request rate (lmbenchmark-sharegpt)")
    convert.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other converter option; VALUE is parsed as JSON when it can be",
    )
    convert.set_defaults(func=run_convert)

    stats = subparsers.add_parser(
        "stats",
        help="summarise a session script",
        description="Print sessions, calls, token and wait distributions and the "
        "prefix-reuse potential of a session script.",
    )
    stats.add_argument("file", metavar="FILE")
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.set_defaults(func=run_stats)


def run_convert(args: argparse.Namespace) -> int:
    """Convert ``args.inputs`` with the named converter and write ``args.output``."""
    converter = CONVERTERS.get(args.format)
    if converter is None:
        return _error(f"unknown format {args.format!r}; expected one of {sorted(CONVERTERS)}")
    options: dict[str, Any] = {}
    given: dict[str, str] = {}  # option -> the argument that gave it
    if args.seed is not None:
        options["seed"], given["seed"] = args.seed, f"--seed {args.seed}"
    if args.qps is not None:
        options["qps"], given["qps"] = args.qps, f"--qps {args.qps}"
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            return _error(f"--set expects KEY=VALUE, got {item!r}")
        if key in options:  # the later one silently won (--seed 1 --set seed=2 converted with seed 2)
            return _error(f"option {key!r} is given twice, by {given[key]} and by --set {item}")
        options[key], given[key] = _parse_value(value), f"--set {item}"
    accepted = inspect.signature(converter).parameters
    for key in options:
        if key not in accepted or key == "inputs":
            names = [n for n, p in accepted.items() if p.kind == p.KEYWORD_ONLY]
            return _error(f"format {args.format!r} takes no option {key!r}; its options: {names}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", WorkloadWarning)  # one per file, even for equal messages
            sessions = converter(list(args.inputs), **options)
        for warning in caught:
            _warn(warning)
        write_sessions(
            args.output,
            sessions,
            args.format,
            inputs=[os.path.basename(os.path.normpath(p)) for p in args.inputs],
            options={k: v for k, v in options.items() if _jsonable(v)},
        )
    except (WorkloadFormatError, OSError, ValueError, TypeError) as exc:
        return _error(str(exc))
    print(f"wrote {len(sessions)} sessions to {args.output}")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    """Print the statistics of ``args.file``."""
    try:
        stats = workload_stats(read_sessions(args.file))
    except (WorkloadFormatError, OSError) as exc:
        return _error(str(exc))
    print(json.dumps(stats, indent=1) if args.json else format_stats(stats))
    return 0


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def _warn(warning: warnings.WarningMessage) -> None:
    """A converter's warning as one line on stderr; any other warning as Python shows it."""
    if issubclass(warning.category, WorkloadWarning):
        print(f"warning: {warning.message}", file=sys.stderr)
    else:
        warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
