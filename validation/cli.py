"""``twin validate``: the measured-benchmark commands, registered with the ``twin`` CLI through the
``servetwin.commands`` entry point (the simulator does not import this package)."""

from __future__ import annotations

import argparse
from typing import Any

from twin.cli import at_least_one
from validation.samples import SAMPLES, columns_help


def cmd_validate(args: argparse.Namespace) -> int:
    from validation.samples import resolve_csv
    from validation.silicon import format_summary, validate_silicon

    summary = validate_silicon(resolve_csv(args.csv), args.out, jobs=args.jobs, limit=args.limit, match=args.match,
                               waves=args.waves, resume=args.resume, prompt_pool=args.prompt_pool,
                               settings=args.set or ())
    print(format_summary(summary))
    print(f"wrote {args.out}/rows.csv and {args.out}/summary.json")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="compare predictions with measured benchmarks")
    vsub = p.add_subparsers(dest="validate_command", required=True)
    v = vsub.add_parser("silicon", help="simulate each row of a silicon-sample CSV (TTFT / TPOT)",
                        description="Simulate each row of a measured CSV as its benchmark ran and compare the\n"
                                    "predicted mean TTFT and TPOT with the measured ones.",
                        epilog=columns_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    v.add_argument("csv", metavar="CSV",
                   help=f"a measured CSV (.csv or .csv.gz) with the columns below, or the name of a shipped "
                        f"sample: {', '.join(SAMPLES)} (a file of that name, where there is one, wins)")
    v.add_argument("--out", required=True, help="folder for rows.csv, rows.jsonl and summary.json")
    v.add_argument("--jobs", type=at_least_one, default=1, help="worker processes")
    v.add_argument("--limit", type=at_least_one, help="only the first N rows")
    v.add_argument("--match", help="only rows whose id matches this regular expression")
    v.add_argument("--waves", type=at_least_one, default=None,
                   help="override the row's protocol: measured requests per client slot (default: as the benchmark ran)")
    v.add_argument("--prompt-pool", metavar="SAMPLING:K", default=None,
                   help="what-if for genai-perf rows: their requests draw prompts from K x c dataset entries, "
                        "SAMPLING sequential | random | shuffle (aiperf's --num-dataset-entries and "
                        "--dataset-sampling-strategy), so repeats hit the prefix cache (default: every prompt unique)")
    v.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="a config override every row takes on top of its harness's (a what-if over the rows)")
    v.add_argument("--resume", action="store_true",
                   help="reuse the rows already simulated in OUT/rows.jsonl (an interrupted run) and do the rest")
    v.set_defaults(func=cmd_validate)

