"""The ``twin`` command: run, plot, report, workload tools. Errors print one message and exit non-zero."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Callable, Sequence

from twin.core.errors import TwinError

EXAMPLES_PACKAGE = "twin.examples"
COMMANDS_GROUP = "servetwin.commands"
"""Entry-point group of sub-command registrars: callables taking argparse's sub-parsers."""


def list_examples() -> dict[str, str]:
    """Built-in example configs: name -> first comment line."""
    out = {}
    for entry in sorted(resources.files(EXAMPLES_PACKAGE).iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            first = entry.read_text().splitlines()[0].lstrip("# ").strip()
            out[entry.name[: -len(".yaml")]] = first
    return out


def example_path(name: str) -> Path:
    examples = list_examples()
    if name not in examples:
        raise TwinError(f"unknown example {name!r}; built-in examples: {', '.join(examples)}")
    return Path(str(resources.files(EXAMPLES_PACKAGE).joinpath(f"{name}.yaml")))


def _fmt_s(v: float) -> str:
    if v != v:
        return "-"
    return f"{v * 1e3:9.1f} ms" if v < 10 else f"{v:9.2f} s "


def _fmt_n(v: float, spec: str) -> str:
    """A rate or fraction, or "-" where it is undefined (no request finished, no prompt admitted), as
    :func:`_fmt_s` prints a latency of no request: "nan" read as a number the run produced."""
    return "-" if v != v else format(v, spec)


def format_summary(summary: dict[str, Any]) -> str:
    from twin.results import jsonable

    r = summary["requests"]
    lines = [f"requests: {r['submitted']} submitted, {r['completed']} completed, {r['failed']} failed"]
    lines.append(f"{'':10}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queue_s", "queue")):
        s = summary[key]
        lines.append(f"{label:10}" + "".join(f"{_fmt_s(s[k]):>12}" for k in ("mean", "p50", "p90", "p99")))
    t = summary["throughput"]
    lines.append(f"throughput: {_fmt_n(t['output_tokens_per_s'], '.1f')} output tok/s, "
                 f"{_fmt_n(t['input_tokens_per_s'], '.1f')} input tok/s, "
                 f"{_fmt_n(t['requests_per_s'], '.3f')} req/s "
                 f"(goodput {_fmt_n(t['goodput_requests_per_s'], '.3f')} req/s)")
    lines.append(f"prefix-cache hit rate: {_fmt_n(summary['prefix_cache']['hit_rate'], '.3f')}; preemptions: "
                 f"{summary['preemptions']}")
    for kind, entry in sorted(summary["fail_reasons"].items(), key=lambda kv: -kv[1]["count"]):
        lines.append(f"failed: {entry['count']} x {entry['example']}" + (" (and similar)" if entry["count"] > 1 else ""))
    for key in ("kv_transfer",):
        if key in summary:  # (as summary.json holds it: an undefined statistic null, not NaN, no JSON)
            lines.append(f"{key}: {json.dumps(jsonable(summary[key]))}")
    pools: dict[tuple[str, int, int, float], int] = {}
    for kv in summary.get("kv_capacity", []):   # workers of one role and size on one line
        pool = (kv["role"], kv["blocks"], kv["tokens"], kv["gib_per_gpu"])
        pools[pool] = pools.get(pool, 0) + 1
    for (role, blocks, tokens, gib), n in pools.items():
        lines.append(f"KV cache: {n} {role} worker{'s' if n != 1 else ''} x {blocks:,} blocks ({tokens:,} tokens, "
                     f"{gib:,.1f} GiB per GPU)")
    sim = summary["sim"]
    lines.append(f"simulated {sim['simulated_s']:.1f} s in {sim['wall_s']:.2f} s wall ({sim['steps']} steps)")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    from twin.config import load_config
    from twin.progress import on_terminal
    from twin.results import nothing_completed
    from twin.runner import build

    if args.list_examples:
        for name, text in list_examples().items():
            print(f"{name:12} {text}")
        return 0
    if args.config and args.example:
        raise TwinError("give a config file or --example, not both")
    source = Path(args.config) if args.config else example_path(args.example or "chat")
    overrides = list(args.set or [])
    if args.seed is not None:
        given = [text for text in overrides if text.partition("=")[0].strip() == "run.seed"]
        if given:  # (the later of the two was taken without a word)
            raise TwinError(f"--seed {args.seed} and --set {given[0]} both set run.seed; give one")
        overrides.append(f"run.seed={args.seed}")
    config = load_config(source, overrides)
    name = config.name or source.stem
    out = Path(args.out) if args.out else Path("results") / name
    out.mkdir(parents=True, exist_ok=True)  # an unusable --out fails now, not after the run
    results = build(config, source, overrides).run(progress=not args.quiet and on_terminal())
    results.write(out)
    if not args.no_plots:
        from twin.plots import plot_results

        plot_results(out)
    else:  # (an earlier run's plots in a reused folder would pass for this one's, as token_times.json would)
        from twin.plots import PLOT_NAMES

        for png in PLOT_NAMES:
            (out / png).unlink(missing_ok=True)
    print(format_summary(results.summary))
    failed = nothing_completed(results.summary)
    if "hardware_whatif" in results.ledger:
        from twin.whatif import describe

        print("\n".join(describe(results.ledger["hardware_whatif"])))
    print(f"results written to {out}/")
    if failed:
        print(f"twin: error: {failed}", file=sys.stderr)
        return 1
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from twin.plots import plot_results

    for path in plot_results(args.folder, args.out, compare=args.compare, hit_window_tokens=args.hit_window_tokens):
        print(path)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from twin.report import write_report

    print(write_report(args.folder, args.out or Path(args.folder) / "report.html"))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from twin.config_reference import reference, schema

    if args.config_command == "schema":
        print(json.dumps(schema(), indent=2))
    else:
        print(reference(), end="")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from twin.config import load_config
    from twin.serve import serve

    if args.config and args.example:
        raise TwinError("give a config file or --example, not both")
    source = Path(args.config) if args.config else example_path(args.example or "chat")
    config = load_config(source, list(args.set or []))
    httpd, sim = serve(config, args.host, args.port, args.time_scale, args.served_model_name)
    print(f"serving {sim.model_name} ({config.system.kind}) on http://{args.host}:{httpd.server_port}/v1 "
          f"(one simulated second = {args.time_scale} s); Ctrl-C stops", flush=True)
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        sim.stop()
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from twin.progress import on_terminal
    from twin.sweep import make_executor, parse_grid, sweep, write_table

    if args.config and args.example:
        raise TwinError("give a config file or --example, not both")
    source = str(example_path(args.example)) if args.example else args.config
    grid = parse_grid(args.grid)
    Path(args.out).mkdir(parents=True, exist_ok=True)  # an unusable --out fails now, not after the sweep
    executor, shutdown = make_executor(args.jobs, args.dask)
    try:
        rows = sweep(source, grid, overrides=list(args.set or []), executor=executor,
                     out=Path(args.out) / "runs" if args.keep_runs else None,
                     progress=not args.quiet and on_terminal(),
                     journal=Path(args.out) / "sweep.jsonl", resume=args.resume)
    finally:
        shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_table(out / "sweep.csv", rows)
    keys = list(grid) + ["ttft_mean_s", "tpot_mean_s", "output_tokens_per_s", "failed"]
    print("  ".join(f"{k:>22}" for k in keys))
    for row in rows:
        print("  ".join(f"{row[k]:>22.4g}" if isinstance(row[k], float) else f"{str(row[k]):>22}" for k in keys))
    print(f"wrote {out / 'sweep.csv'}")
    failed = [row for row in rows if row["error"]]
    for row in failed:
        point = ", ".join(f"{k}={row[k]}" for k in grid)
        print(f"twin: error: sweep point {point}: {row['error']}", file=sys.stderr)
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="twin", description="ServeTwin: a digital twin of LLM serving.")
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("run", help="run a simulation (the built-in 'chat' example without a config)")
    p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("--example", help="run a built-in example by name")
    p.add_argument("--list-examples", action="store_true", help="list the built-in examples")
    p.add_argument("--out", help="results folder (default: results/<name>)")
    p.add_argument("--set", action="append", metavar="PATH=VALUE", help="override a config field")
    p.add_argument("--seed", type=int, help="shorthand for --set run.seed=N")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (shown on stderr only when it is a terminal)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("plot", help="plot a results folder")
    p.add_argument("folder")
    p.add_argument("--out", help="where to write the PNGs (default: the results folder)")
    p.add_argument("--compare", metavar="OTHER_RUN",
                   help="overlay a second results folder (dashed): writes timeseries_compare.png and "
                        "latency_cdf_compare.png")
    p.add_argument("--hit-window-tokens", type=float, metavar="N",
                   help="prefix-hit rate over the last N admitted prompt tokens (default: the run's / 20)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("report", help="one self-contained HTML page of a run or sweep folder")
    p.add_argument("folder", help="a folder written by `twin run --out` or `twin sweep --out`")
    p.add_argument("-o", "--out", help="the HTML file (default: FOLDER/report.html)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("serve", help="an OpenAI-compatible endpoint backed by the simulation")
    p.add_argument("config", nargs="?", help="YAML config (its workload is ignored; default: the chat example)")
    p.add_argument("--example", help="serve a built-in example's deployment")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="wall seconds per simulated second (0.1 runs ten times faster than real time)")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the model name clients send (default: the config's model.name); others get a 404")
    p.add_argument("--set", action="append", metavar="PATH=VALUE", help="override a config field")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("sweep", help="run a grid of config overrides and gather one table")
    p.add_argument("config", nargs="?", help="base YAML config (default: the built-in chat example)")
    p.add_argument("--example", help="base the sweep on a built-in example")
    p.add_argument("--grid", action="append", required=True, metavar="PATH=V1,V2,...",
                   help="a swept field and its values (repeat for a grid)")
    p.add_argument("--set", action="append", metavar="PATH=VALUE", help="override a field in every run")
    p.add_argument("--out", required=True)
    p.add_argument("--jobs", type=at_least_one, default=1, help="local worker processes")
    p.add_argument("--dask", metavar="ADDRESS", help="run on a Dask distributed scheduler instead")
    p.add_argument("--keep-runs", action="store_true", help="also write every run's results folder, OUT/runs/runNNNN in grid order "
                   "(an earlier sweep's runNNNN folders there are removed first)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the points already run in OUT/sweep.jsonl (an interrupted sweep) and run the rest")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (shown on stderr only when it is a terminal)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("config", help="the configuration reference (every section, kind and field)")
    csub = p.add_subparsers(dest="config_command", required=True)
    csub.add_parser("reference", help="Markdown: every field with its type, default and meaning (docs/config.md)")
    csub.add_parser("schema", help="a JSON Schema of a config file, for editors")
    p.set_defaults(func=cmd_config)

    for register in _optional_commands():
        register(sub)
    return parser


def _optional_commands() -> list[Callable[[Any], None]]:
    """Sub-command groups of other modules (workload tools, validation), present when installed."""
    out: list[Callable[[Any], None]] = []
    try:
        from workloads.cli import register as register_workload
    except ImportError:
        pass
    else:
        def add_workload(sub: Any) -> None:
            p = sub.add_parser("workload", help="convert and inspect workload files")
            register_workload(p.add_subparsers(dest="workload_command", required=True))

        out.append(add_workload)
    # Packages beside the simulator (the measured-benchmark harnesses) add their commands through this
    # entry-point group, so the simulator never imports them.
    for entry in sorted(metadata.entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            out.append(entry.load())
        except ImportError:
            pass
    return out


def at_least_one(text: str) -> int:
    """argparse type: a whole number >= 1 (0 or -2 workers, or -1 rows, used to be taken as something else)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["run", *(argv or [])])
    try:
        code = args.func(args)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stdout = open(os.devnull, "w")
        return 0
    except (TwinError, ValueError, OSError, OverflowError, re.error) as exc:
        # Bad input, a file or folder that cannot be read or written, a port in use: a message and exit 2.
        what = f"bad regular expression ({exc})" if isinstance(exc, re.error) else str(exc)
        print(f"twin: error: {what}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
