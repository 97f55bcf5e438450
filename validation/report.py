"""End-to-end validation report on the measured serving rows, and the engine host-term fit.

    python -m validation.report run --csv h100_h200 \
        --out out/val --jobs 2            # simulate every row (validation.silicon), then print the tables
    python -m validation.report report --out out/val   # tables from an earlier run
    python -m validation.report fit-host --csv h100_h200   # engine host terms
    python -m validation.report fit-eager --csv h100_h200 \
        --journal out/zero_c16/rows.jsonl [--engines trtllm vllm]   # eager-step host terms
    python -m validation.report fit-eager --csv h100_h200 \
        --journal out/zero_c16/rows.jsonl --engines sglang --train-models deepseek [--by-group]
    python -m validation.report implied-rate --csv h100_h200 \
        [--opdb kernel-tables/opdb] [--top 30]   # FLOP rate each row's measurement implies
    python -m validation.report ttft-steps --csv h100_h200 \
        --journal out/eager/rows.jsonl [--engine trtllm]   # genai-perf TTFT in prompt steps
    python -m validation.report points --out out/val [--metric tpot] \
        [--by backend,backend_version,system,model] [--top 20]   # where the file's MAPE comes from
    python -m validation.report seat-wait --out out/val [--by backend,backend_version,model] \
        [--max-conc 32] [--detail]   # closed-loop TTFT excess against one inter-completion interval
    python -m validation.report gpu-pairs --out out/val [--by backend,model]
                                     # the same benchmark on both GPUs: measured vs predicted H200 / H100
    python -m validation.report repeats --csv h100_h200 [--out out/val] \
        [--spread 0.2]   # configurations measured more than once: how far apart, and what that costs
    python -m validation.report transfer --csv h100_h200 --out out/transfer \
        --systems h200_sxm --constants validation/constants/h100_only   # H200 rows: own fit vs H100's
    python -m validation.report transfer --csv blackwell_dev --out out/bw \
        --systems b300_sxm,gb300 --constants hopper   # Blackwell rows: B300 kernels vs the spec alone

Tables: MAPE of TPOT and TTFT per backend, per model and per benchmark protocol, for the aggregated rows the
twin represents and separately for the disaggregated ones, each split into TRAIN (H100 SXM rows, on which the
engine host terms were fitted) and HELD-OUT (H200 SXM rows, a GPU nothing was fitted on).

fit-host: the engine-level constants the kernel tables cannot give (per-step and per-request host time,
hidden under GPU work by async scheduling, and the per-kernel floor inside a replayed CUDA graph) are fitted
once per engine on the TRAIN rows (H100 SXM, concurrency <= 64, OSL >= 500, where TPOT is decode-dominated)
by a grid search on the median |log(predicted / measured TPOT)| of a decode surrogate (one decode step at
the mean context plus the other requests' prefills spread over the output), and reported on the held-out
H200 rows. The chosen values are written by hand into hardware/data/engines/*.yaml with this provenance.

fit-eager: the host time of a step that runs without CUDA graphs (SGLang / TRT-LLM prefill and mixed steps),
per decoder layer and extra per MoE layer (engine eager_layer_host_s, eager_moe_host_s), fitted once per engine
on the TRAIN rows (H100 SXM, aggregated, concurrency per rank <= 16, where TTFT is mostly the request's own
prefill step) by a grid search on the median |log(predicted / measured TTFT)| of a TTFT surrogate: the
twin's closed-loop TTFT with eager host time 0 (a journal of `twin validate` with the engine's constants at
0) plus what the eager host term adds to the steps that carry the request's prompt (each chunk, with the
running decodes beside it when the engine mixes them). Reported on the held-out H200 rows. SGLang has no MoE
row on H100, so its train set also takes its DeepSeek rows (H200, ``--train-models deepseek``) and the rows
of its other models are the held-out set. ``--by-group`` also prints, per (GPU, model) group of MoE rows,
the per-MoE-layer value that group alone would choose (a diagnostic of how far one constant per engine is
from each model).

points: the share of the file's MAPE that each group of rows carries, in percentage points: the group's
summed |error| over the number of represented rows of the mode, so the groups' points add up to the MAPE. A
group's points are what the file's figure would lose if its rows were predicted exactly. Groups are formed
on any column of rows.csv, or of the measured CSV the run's journal names (backend_version, tp_size ...),
joined on the row id.

seat-wait: a closed loop of c clients whose engine serves one request fewer than c at a time makes every
request wait about one inter-completion interval, OSL x TPOT / c (the measured lifetime over the requests in
flight), before its prompt is scheduled; a latency outside the engine (client, HTTP, frontend) adds the same
time whatever the output length. Per group of aggregated closed-loop rows (genai-perf by default, c per rank
<= --max-conc), the least-squares line excess = slope x interval + intercept, with excess = measured -
predicted TTFT: slope near 1 with a high correlation is a missing seat; slope near 0, a latency or the prompts'
own queue. ``--detail`` adds the median excess / interval per (tp_size, c).

gpu-pairs: the rows that ran the same benchmark (backend and version, model, precision, layout, ISL, OSL,
concurrency, protocol, measurement date) on both GPUs are a pair, and the pair's measured H200 / H100 ratio of
TPOT and of TTFT is set against the ratio the twin predicts. The twin changes only the GPU spec between the two
(hardware/MODEL.md, "Calibration"), so the transfer error, predicted / measured ratio - 1, is how far
that alone moves a deployment as the measurements move it; repeated rows of a benchmark are averaged first.

implied-rate: a plausibility check of the measurements, independent of the twin. A closed loop of c clients
that each send ISL prompt tokens and get OSL output tokens per request, with e2e = TTFT + (OSL - 1) x TPOT,
makes the engine run 2 x (active parameters without embeddings) x (ISL + OSL) x c / e2e FLOP/s through its
linear layers alone (attention, norms and collectives not counted), spread over the row's GPUs. Lengths
are the client's means (InferenceMAX draws them from [0.8 L, L]). A row that implies more than the fastest
GEMM ever measured on that GPU (the opdb tables, any shape, any engine) cannot have run as recorded.

repeats: rows equal in every column of the measured CSV but their id, data source and measurements, and
in the client concurrency the data source records, are one configuration measured more than once (on
different dates). Per mode and backend: how many configurations repeat, how many spread by more than
--spread in TPOT or TTFT (largest / smallest - 1), and the largest ratio. With --out, the floor: the MAPE
that no single prediction per configuration can beat on the rows that run represented (each repeated
configuration scored at its best constant, the median of its values weighted by 1 / value), in percent
as the MAPE is. The twin predicts one value per configuration, so its error there cannot be lower.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from validation.gpu_transfer import PAIR_GPUS, PAIR_KEY, gpu_pair_table, gpu_pairs, transfer, transfer_table
from validation.host_fit import (EAGER_LAYER_HOST, EAGER_MOE_HOST, KERNEL_FLOOR, REQ_HOST, STEP_HOST, fit_eager,
                                 fit_host)
from validation.measured_checks import (METRICS, REPEAT_IGNORED, best_single_errors, fastest_gemm,
                                        implied_linear_rate, implied_rates, repeat_key, repeat_table, repeats)
from validation.report_tables import TRAIN_GPU, point_table, points, read_results, report, table
from validation.samples import SAMPLES, resolve_csv
from validation.ttft_excess import (interval_ms, lone_prompt_step_ms, seat_wait_fit, seat_waits, ttft_step_table,
                                    ttft_steps)

__all__ = [
    "CSV_HELP", "EAGER_LAYER_HOST", "EAGER_MOE_HOST", "KERNEL_FLOOR", "METRICS", "PAIR_GPUS", "PAIR_KEY",
    "REPEAT_IGNORED", "REQ_HOST", "STEP_HOST", "TRAIN_GPU", "best_single_errors", "csv_argument", "fastest_gemm",
    "fit_eager", "fit_host", "gpu_pair_table", "gpu_pairs", "implied_linear_rate", "implied_rates",
    "interval_ms", "lone_prompt_step_ms", "main", "point_table", "points", "read_results", "repeat_key",
    "repeat_table", "repeats", "report", "seat_wait_fit", "seat_waits", "table", "transfer", "transfer_table",
    "ttft_step_table", "ttft_steps",
]

CSV_HELP = f"a measured CSV (.csv, .csv.gz) or a shipped sample's name ({', '.join(SAMPLES)})"


def csv_argument(text: str) -> Path:
    """``--csv``: a file, or a shipped sample's name (validation.samples.resolve_csv)."""
    try:
        return resolve_csv(text)
    except FileNotFoundError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


Command = Callable[[argparse.Namespace], str]


def _command(p: argparse.ArgumentParser, run: Command, *, user_errors: bool = False) -> None:
    """What a subcommand prints; ``user_errors``: a ValueError / OSError (an unknown column, a folder without
    rows.csv) is one line on stderr and exit status 2 instead of a traceback."""
    p.set_defaults(command=run, user_errors=user_errors)


def _keys(args: argparse.Namespace) -> list[str]:
    return [k.strip() for k in args.by.split(",") if k.strip()]


def _run_and_report(args: argparse.Namespace) -> str:
    from validation.silicon import validate_silicon

    validate_silicon(args.csv, args.out, jobs=args.jobs, match=args.match, limit=args.limit, waves=args.waves)
    return report(args.out)


def _add_run_commands(sub: Any) -> None:
    """run, report: simulate the rows and print the tables, or print those of an earlier run."""
    run = sub.add_parser("run", help="simulate the rows, then print the report")
    run.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--match", default=None)
    run.add_argument("--limit", type=int, default=None)
    run.add_argument("--waves", type=int, default=None, help="override the protocol's measured requests per slot")
    _command(run, _run_and_report)
    rep = sub.add_parser("report", help="print the report of an earlier run")
    rep.add_argument("--out", type=Path, required=True)
    _command(rep, lambda a: report(a.out))


def _add_fit_commands(sub: Any) -> None:
    """fit-host, fit-eager: the engine host-term grid fits."""
    fit = sub.add_parser("fit-host", help="fit the engine host terms on the TRAIN rows")
    fit.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    fit.add_argument("--engines", nargs="*", default=["vllm", "trtllm", "sglang"])
    _command(fit, lambda a: json.dumps(fit_host(a.csv, a.engines), indent=2))
    eag = sub.add_parser("fit-eager", help="fit the eager-step host terms on the TRAIN rows' TTFT")
    eag.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    eag.add_argument("--journal", type=Path, required=True, help="rows.jsonl of a run with those terms at 0")
    eag.add_argument("--engines", nargs="*", default=["trtllm", "sglang"])
    eag.add_argument("--max-conc", type=int, default=16)
    eag.add_argument("--train-models", default=None,
                     help="regular expression on model_path: those rows join the train set on any GPU")
    eag.add_argument("--by-group", action="store_true",
                     help="also print the per-MoE-layer value each (GPU, model) group's rows want")
    eag.add_argument("--versions", default=None,
                     help="regular expression on backend_version: fit that engine build alone (its rows, any "
                          "GPU, are the train set; the profile's builds)")
    _command(eag, lambda a: json.dumps(fit_eager(a.csv, a.journal, a.engines, a.max_conc, a.train_models,
                                                 a.by_group, a.versions), indent=2))


def _add_per_row_commands(sub: Any) -> None:
    """implied-rate, ttft-steps: one number per measured row, in the hardware's units."""
    imp = sub.add_parser("implied-rate", help="the FLOP rate each row's measurement implies (plausibility)")
    imp.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    imp.add_argument("--opdb", type=Path, default=None, help="opdb folder: flag rows above its fastest GEMM")
    imp.add_argument("--top", type=int, default=30)
    _command(imp, lambda a: implied_rates(a.csv, a.opdb, a.top))
    stp = sub.add_parser("ttft-steps", help="genai-perf rows' TTFT in units of the lone prompt step")
    stp.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    stp.add_argument("--journal", type=Path, required=True, help="rows.jsonl of a twin validate run")
    stp.add_argument("--engine", default="trtllm")
    _command(stp, lambda a: ttft_steps(a.csv, a.journal, a.engine))


def _add_group_commands(sub: Any) -> None:
    """points, seat-wait, gpu-pairs: a run's rows by groups of columns."""
    pts = sub.add_parser("points", help="the share of the file's MAPE each group of rows carries")
    pts.add_argument("--out", type=Path, required=True, help="folder of a twin validate run")
    pts.add_argument("--metric", choices=("ttft", "tpot"), default="ttft")
    pts.add_argument("--by", default="backend,backend_version,system,model",
                     help="comma-separated columns of rows.csv or of the measured CSV")
    pts.add_argument("--mode", choices=("agg", "disagg"), default="agg")
    pts.add_argument("--top", type=int, default=None)
    _command(pts, lambda a: points(a.out, a.metric, _keys(a), a.mode, a.top), user_errors=True)
    sw = sub.add_parser("seat-wait", help="closed-loop rows' TTFT excess against one inter-completion interval")
    sw.add_argument("--out", type=Path, required=True, help="folder of a twin validate run")
    sw.add_argument("--by", default="backend,backend_version,model",
                    help="comma-separated columns of rows.csv or of the measured CSV")
    sw.add_argument("--max-conc", type=int, default=32)
    sw.add_argument("--protocol", default="genai-perf", help="rows.csv protocol column: genai-perf, inferencemax")
    sw.add_argument("--detail", action="store_true", help="also the median excess / interval per (tp_size, c)")
    _command(sw, lambda a: seat_waits(a.out, _keys(a), a.max_conc, a.protocol, a.detail), user_errors=True)
    gp = sub.add_parser("gpu-pairs", help="the same benchmark on both GPUs: measured vs predicted ratio")
    gp.add_argument("--out", type=Path, required=True, help="folder of a twin validate run")
    gp.add_argument("--by", default="backend,model", help="comma-separated columns of rows.csv or of the "
                                                          "measured CSV")
    _command(gp, lambda a: gpu_pairs(a.out, _keys(a)), user_errors=True)


def _add_comparison_commands(sub: Any) -> None:
    """transfer, repeats: rows against other constants, or against their own repeats."""
    tr = sub.add_parser("transfer", help="rows of some GPUs with their own fitted constants against constants "
                                         "fitted elsewhere")
    tr.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    tr.add_argument("--out", type=Path, required=True)
    tr.add_argument("--systems", required=True, help="comma-separated GPUs whose rows to predict (h200_sxm)")
    tr.add_argument("--constants", required=True,
                    help="hardware.constants of the transfer run: an architecture (hopper) or a folder of sets")
    tr.add_argument("--jobs", type=int, default=1)
    tr.add_argument("--every", type=int, default=1, help="only every k-th of the GPUs' rows, in file order")
    tr.add_argument("--mode", choices=("agg", "disagg"), default=None, help="only aggregated or disaggregated rows")
    _command(tr, lambda a: transfer(a.csv, a.out, [g.strip() for g in a.systems.split(",") if g.strip()],
                                    a.constants, a.jobs, a.every, a.mode), user_errors=True)
    rp = sub.add_parser("repeats", help="configurations the measured CSV holds more than once: how far apart")
    rp.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    rp.add_argument("--out", type=Path, default=None,
                    help="folder of a twin validate run: also the MAPE no one prediction can beat on its rows")
    rp.add_argument("--spread", type=float, default=0.2, help="count pairs further apart than this fraction")
    _command(rp, lambda a: repeats(a.csv, a.out, a.spread), user_errors=True)


def parser() -> argparse.ArgumentParser:
    """The command line: one subcommand per report (the module docstring describes each)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for add in (_add_run_commands, _add_fit_commands, _add_per_row_commands, _add_group_commands, _add_comparison_commands):
        add(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.user_errors:
        print(args.command(args))
        return 0
    try:
        print(args.command(args))
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
