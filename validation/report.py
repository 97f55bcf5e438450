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
import csv
import itertools
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import attrs
import numpy as np

from validation.samples import SAMPLES, resolve_csv

TRAIN_GPU = "h100_sxm"
STEP_HOST = (0.0, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3, 3.5e-3, 4e-3)
REQ_HOST = (0.0, 15e-6, 25e-6, 50e-6, 75e-6, 100e-6, 150e-6)
KERNEL_FLOOR = (2e-6, 3e-6, 3.5e-6, 4e-6, 4.5e-6, 5e-6, 6e-6)


def _log_score(ratios: np.ndarray) -> float:
    """Median |log(predicted / measured)|: what the grid fits minimise (ties go to the earlier point)."""
    return float(np.median(np.abs(np.log(ratios))))


def _mape(values: Iterable[float]) -> float:
    v = [abs(x) for x in values if math.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def read_results(out: Path) -> list[dict[str, Any]]:
    rows = []
    with open(out / "rows.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["skipped"]:
                continue
            rows.append({**r, "ttft_err_pct": float(r["ttft_err_pct"]), "tpot_err_pct": float(r["tpot_err_pct"])})
    return rows


def table(rows: Sequence[dict[str, Any]], key: str) -> list[str]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    lines = [f"  {'':42} {'rows':>5} {'TPOT %':>7} {'TTFT %':>7} | {'train':>5} {'TPOT %':>7} {'TTFT %':>7} | "
             f"{'held-out':>8} {'TPOT %':>7} {'TTFT %':>7}"]
    for g, rs in sorted(groups.items()):
        tr = [r for r in rs if r["system"] == TRAIN_GPU]
        ho = [r for r in rs if r["system"] != TRAIN_GPU]
        lines.append(f"  {g[-42:]:42} {len(rs):5} {_mape(r['tpot_err_pct'] for r in rs):7.1f} "
                     f"{_mape(r['ttft_err_pct'] for r in rs):7.1f} | {len(tr):5} "
                     f"{_mape(r['tpot_err_pct'] for r in tr):7.1f} {_mape(r['ttft_err_pct'] for r in tr):7.1f} | "
                     f"{len(ho):8} {_mape(r['tpot_err_pct'] for r in ho):7.1f} "
                     f"{_mape(r['ttft_err_pct'] for r in ho):7.1f}")
    return lines


def _journal_ttft_ms(journal: Path) -> dict[str, float]:
    """Row id -> predicted TTFT (ms) of the aggregated rows a ``twin validate`` journal represents."""
    pred = {}
    with open(journal) as fh:
        next(fh, None)  # the header
        for line in fh:
            rec = json.loads(line)
            if not rec.get("skipped") and rec.get("mode") == "agg":
                pred[rec["id"]] = float(rec["pred_ttft_ms"])
    return pred


def _warmup_labels(out: Path) -> dict[str, str]:
    """Row id -> client warm-up label (validation.silicon.client_warmup) for the rows of the CSV a run's journal
    names; empty when that file is not at hand."""
    from validation.silicon import client_warmup, protocol, read_rows

    journal = out / "rows.jsonl"
    if not journal.is_file():
        return {}
    with open(journal) as fh:
        head = json.loads(fh.readline())
    csv_path = Path(str(head.get("csv", "")))
    if not csv_path.is_file():
        return {}
    return {row["id"]: f"{protocol(row).name}, {client_warmup(row)}" for row in read_rows(csv_path)}


def report(out: Path) -> str:
    rows = read_results(out)
    warmup = _warmup_labels(out)
    rows = [dict(r, client=warmup[r["id"]]) if r["id"] in warmup else r for r in rows]
    summary = json.loads((out / "summary.json").read_text())
    lines = [f"rows {summary['rows']}, represented {summary['rows_represented']} "
             f"({100 * summary['rows_represented'] / max(1, summary['rows']):.1f} %), skipped "
             f"{len(summary['rows_skipped'])}"]
    for reason, n in summary.get("skip_reasons", {}).items():
        lines.append(f"  skipped {n:4} x {reason[:150]}")
    for mode in ("agg", "disagg"):
        sub = [r for r in rows if r["mode"] == mode]
        if not sub:
            continue
        lines.append(f"\n{mode}: MAPE over {len(sub)} rows (train = {TRAIN_GPU}, held-out = other GPUs)")
        for key in ("backend", "model", "protocol", "system"):
            lines.append(f" by {key}")
            lines += table(sub, key)
        if all("client" in r for r in sub):  # InferenceMAX runs before 2026-01-21 met a cold server
            lines.append(" by client warm-up")
            lines += table(sub, "client")
        allrows = [dict(r, all="all") for r in sub]
        lines += table(allrows, "all")
    return "\n".join(lines)


# --- where the error is ---------------------------------------------------------------------------

def point_table(rows: Sequence[dict[str, Any]], metric: str, keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per group of ``keys``: rows, points (summed |error| / all rows), the group's MAPE and its signed
    median error, largest points first (ties by group). The points of all groups add up to the MAPE. Rows
    whose error is not finite are left out, as the summary's MAPE leaves them out."""
    if metric not in ("ttft", "tpot"):
        raise ValueError(f"metric must be 'ttft' or 'tpot', got {metric!r}")
    col = f"{metric}_err_pct"
    groups: dict[tuple[str, ...], list[float]] = {}
    n = 0
    for r in rows:
        err = float(r[col])
        if math.isfinite(err):
            groups.setdefault(tuple(str(r[k]) for k in keys), []).append(err)
            n += 1
    out = [{"group": g, "rows": len(e), "points": sum(map(abs, e)) / n, "mape": sum(map(abs, e)) / len(e),
            "signed_median": float(np.median(e))} for g, e in groups.items()]
    return sorted(out, key=lambda t: (-t["points"], t["group"]))


def _with_csv_columns(out: Path, rows: list[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """``rows`` with the measured CSV's columns added (from the file the run's journal names), when a key
    is not a rows.csv column; a key in neither is an error naming both."""
    missing = [k for k in keys if rows and k not in rows[0]]
    if not missing:
        return rows
    from validation.silicon import read_rows

    journal = out / "rows.jsonl"
    csv_path = None
    if journal.is_file():
        with open(journal) as fh:
            csv_path = Path(str(json.loads(fh.readline()).get("csv", "")))
    if csv_path is None or not csv_path.is_file():
        raise ValueError(f"{out}: column(s) {missing} are not in rows.csv, and the measured CSV its journal "
                         f"names ({csv_path}) is not at hand")
    measured = {r["id"]: r for r in read_rows(csv_path)}
    unknown = [k for k in missing if k not in next(iter(measured.values()), {})]
    if unknown:
        raise ValueError(f"unknown column(s) {unknown}: not in {out / 'rows.csv'} ({', '.join(rows[0])}) "
                         f"nor in {csv_path}")
    absent = [r["id"] for r in rows if r["id"] not in measured]
    if absent:
        raise ValueError(f"{len(absent)} row(s) of {out / 'rows.csv'} are not in {csv_path} (first: "
                         f"{absent[0]!r}): the file changed since the run")
    return [{**measured[r["id"]], **r} for r in rows]


def points(out: Path, metric: str, keys: Sequence[str], mode: str = "agg", top: int | None = None) -> str:
    rows = [r for r in read_results(out) if r["mode"] == mode]
    if not rows:
        return f"{out}: no represented {mode} rows"
    rows = _with_csv_columns(out, rows, keys)
    table_ = point_table(rows, metric, keys)
    mape = sum(t["points"] for t in table_)
    n = sum(t["rows"] for t in table_)
    lines = [f"{n} represented {mode} rows, {metric.upper()} MAPE {mape:.2f} %; points = a group's "
             f"summed |error| / {n}",
             f"{'points':>7} {'rows':>5} {'MAPE %':>7} {'signed median %':>16}  {' / '.join(keys)}"]
    for t in table_[:top]:
        lines.append(f"{t['points']:7.2f} {t['rows']:5} {t['mape']:7.1f} {t['signed_median']:+16.1f}  "
                     f"{' / '.join(v or '-' for v in t['group'])}")
    if top is not None and len(table_) > top:
        rest = table_[top:]
        lines.append(f"{sum(t['points'] for t in rest):7.2f} {sum(t['rows'] for t in rest):5} "
                     f"{'':7} {'':16}  ({len(rest)} more groups)")
    return "\n".join(lines)


# --- the same benchmark on both GPUs --------------------------------------------------------------

PAIR_GPUS = ("h100_sxm", "h200_sxm")
PAIR_KEY = ("backend", "backend_version", "model_path", "precision", "mode", "isl", "osl", "tp_size", "pp_size",
            "attention_dp_size", "moe_tp_size", "moe_ep_size", "prefill_num_workers", "prefill_tp_size",
            "decode_num_workers", "decode_tp_size", "concurrency", "protocol", "measured")
"""What makes two rows the same benchmark on different GPUs: measured-CSV and rows.csv columns (``measured``:
the measurement date of silicon_data_source, validation.silicon._measured)."""


def _mean_ms(rows: Sequence[dict[str, Any]], col: str) -> float:
    return float(np.mean([float(r[col]) for r in rows]))


def gpu_pair_table(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per group of ``keys`` (and one line for all, group ``("all",)``): the pairs of rows that ran the same
    benchmark (PAIR_KEY) on both PAIR_GPUS, with the median measured and predicted ratio of the second GPU to
    the first, for TPOT and TTFT, and the median and mean |transfer error| (predicted / measured ratio - 1).
    ``rows``: results with the measured CSV's columns; repeated rows of a benchmark are averaged per GPU."""
    by_bench: dict[tuple[str, ...], dict[str, list[dict[str, Any]]]] = {}
    for r in rows:
        if r["system"] in PAIR_GPUS:
            by_bench.setdefault(tuple(str(r[k]) for k in PAIR_KEY), {}).setdefault(r["system"], []).append(r)
    groups: dict[tuple[str, ...], list[dict[str, float]]] = {}
    ref, other = PAIR_GPUS
    for sides in by_bench.values():
        if len(sides) < 2:
            continue
        pair = {f"{kind}_{metric}": _mean_ms(sides[other], f"{kind}_{metric}_ms")
                / _mean_ms(sides[ref], f"{kind}_{metric}_ms")
                for metric in ("tpot", "ttft") for kind in ("meas", "pred")}
        first = sides[ref][0]
        for g in (("all",), tuple(str(first[k]) for k in keys)):
            groups.setdefault(g, []).append(pair)
    out = []
    for g, pairs in groups.items():
        line: dict[str, Any] = {"group": g, "pairs": len(pairs)}
        for metric in ("tpot", "ttft"):
            meas = np.array([p[f"meas_{metric}"] for p in pairs])
            pred = np.array([p[f"pred_{metric}"] for p in pairs])
            err = pred / meas - 1.0
            line.update({f"{metric}_meas": float(np.median(meas)), f"{metric}_pred": float(np.median(pred)),
                         f"{metric}_err": float(np.median(err)), f"{metric}_abs_err": float(np.mean(np.abs(err)))})
        out.append(line)
    return sorted(out, key=lambda t: (t["group"] != ("all",), t["group"]))


def gpu_pairs(out: Path, keys: Sequence[str]) -> str:
    from validation.silicon import _measured

    rows = read_results(out)
    if not rows:
        return f"{out}: no represented rows"
    rows = _with_csv_columns(out, rows, [k for k in PAIR_KEY if k != "measured"] + list(keys))
    rows = [{**r, "measured": _measured(r)} for r in rows]
    table_ = gpu_pair_table(rows, keys)
    ref, other = PAIR_GPUS
    lines = [f"the same benchmark on {ref} and {other}: {other} / {ref}, median over pairs; transfer error = "
             f"predicted / measured ratio - 1 (median, mean |.|)",
             f"{'pairs':>5}  {'TPOT meas':>9} {'pred':>6} {'err %':>6} {'|err| %':>7}  {'TTFT meas':>9} {'pred':>6} "
             f"{'err %':>6} {'|err| %':>7}  {' / '.join(keys)}"]
    for t in table_:
        lines.append(f"{t['pairs']:5}  {t['tpot_meas']:9.3f} {t['tpot_pred']:6.3f} {100 * t['tpot_err']:+6.1f} "
                     f"{100 * t['tpot_abs_err']:7.1f}  {t['ttft_meas']:9.3f} {t['ttft_pred']:6.3f} "
                     f"{100 * t['ttft_err']:+6.1f} {100 * t['ttft_abs_err']:7.1f}  "
                     f"{' / '.join(v or '-' for v in t['group'])}")
    if not table_:
        lines.append("(no benchmark ran on both GPUs)")
    return "\n".join(lines)


# --- the host-term fit ---------------------------------------------------------------------------

def _surrogate_tpot(cm: Any, isl: int, osl: int, conc: int, max_tokens: int) -> float:
    """Mean TPOT of a closed loop: one decode step at the mean context, plus the marginal cost of the
    other requests' prefills (each mixed into a decode step) spread over this request's output."""
    from hardware import BatchShape

    kv = isl + osl // 2
    t = cm.step_cost(BatchShape.from_requests([1] * conc, [kv] * conc)).total_s
    if conc > 1:
        base = cm.step_cost(BatchShape.from_requests([1] * (conc - 1), [kv] * (conc - 1))).total_s
        chunk = min(isl, max_tokens)
        mixed = cm.step_cost(BatchShape.from_requests([1] * (conc - 1) + [chunk], [kv] * (conc - 1) + [chunk]))
        t += (conc - 1) * (mixed.total_s - base) * math.ceil(isl / chunk) / osl
    return t


def fit_host(csv_path: Path, engines: Sequence[str]) -> dict[str, dict[str, float]]:
    import hardware
    from hardware import CostModel, Deployment
    from validation.silicon import Skip, harness_sampling, protocol, read_rows, row_spec

    specs = []
    for row in read_rows(csv_path):
        try:
            s = row_spec(row)
        except Skip:
            continue
        if s.mode == "agg" and s.per_rank_concurrency <= 64 and s.osl >= 500:
            specs.append((row, s, harness_sampling(row, s, protocol(row))))
    out: dict[str, dict[str, float]] = {}
    for engine in engines:
        base = hardware.load_engine(engine)
        train = [rec for rec in specs if rec[1].backend == engine and rec[1].gpu == TRAIN_GPU]
        test = [rec for rec in specs if rec[1].backend == engine and rec[1].gpu != TRAIN_GPU]

        def ratios(params: tuple[float, float, float], subset: list[Any]) -> np.ndarray:
            eng = attrs.evolve(base, step_host_s=params[0], per_request_host_s=params[1],
                               graph_kernel_floor_s=params[2])
            cms: dict[Any, Any] = {}
            res = []
            for r, s, sampling in subset:
                key = (s.gpu, s.model, s.agg, s.weight_dtype, sampling)
                if key not in cms:
                    cms[key] = CostModel(Deployment(gpu=hardware.load_gpu(s.gpu), model=hardware.load_model(s.model),
                                                    engine=eng, tp=s.agg.tp, ep=s.agg.ep, attn_dp=s.agg.dp,
                                                    weight_dtype=s.weight_dtype, sampling=sampling))
                cm = cms[key]
                pred = _surrogate_tpot(cm, s.isl, s.osl, s.per_rank_concurrency, cm.max_num_batched_tokens)
                res.append(pred * 1e3 / float(r["silicon_tpot_ms"]))
            return np.array(res)

        if not train:
            print(f"{engine}: no train rows")
            continue
        best: tuple[float, tuple[float, float, float]] | None = None
        for params in itertools.product(STEP_HOST, REQ_HOST, KERNEL_FLOOR):
            score = _log_score(ratios(params, train))
            if best is None or score < best[0] - 1e-9:
                best = (score, params)
        assert best is not None
        p = best[1]
        tr, te = ratios(p, train) - 1, ratios(p, test) - 1
        print(f"{engine}: step_host_s {p[0]:.4g}, per_request_host_s {p[1]:.3g}, graph_kernel_floor_s {p[2]:.3g} | "
              f"train {len(tr)} rows median |error| {100 * np.median(np.abs(tr)):.1f} % | held-out {len(te)} rows "
              + (f"median |error| {100 * np.median(np.abs(te)):.1f} %" if len(te) else ""))
        out[engine] = {"step_host_s": p[0], "per_request_host_s": p[1], "graph_kernel_floor_s": p[2]}
    return out


# grid of the eager host fit; ties go to the first point, i.e. the smaller per-layer term
EAGER_LAYER_HOST = (0.0, 25e-6, 50e-6, 100e-6, 150e-6, 200e-6, 300e-6, 400e-6, 600e-6)
EAGER_MOE_HOST = (0.0, 0.1e-3, 0.25e-3, 0.5e-3, 0.75e-3, 1e-3, 1.1e-3, 1.2e-3, 1.3e-3, 1.5e-3, 2e-3, 3e-3, 4e-3,
                  5e-3, 6e-3)


def _prompt_steps(row: dict[str, str]) -> tuple[Any, list[Any], Any]:
    """The row's worker deployment (as the twin builds it), the batch shapes of the steps that carry one
    request's prompt at the mean lengths (each chunk, beside c - 1 running decodes if the engine mixes) and
    the row's resolved config (:func:`twin.system.cost_model` prices a deployment as the row's worker does:
    its scheduler limits and CUDA-graph settings)."""
    from hardware import BatchShape
    from twin.config import load_config
    from twin.system import make_deployment, resolve
    from validation.silicon import protocol, row_config, row_spec

    spec = row_spec(row)
    cfg = resolve(load_config(row_config(row)))
    assert spec.agg is not None
    dep = make_deployment(cfg, spec.agg.tp, ep=spec.agg.ep, attention_dp=spec.agg.dp)
    mean = (1.0 + protocol(row).low_frac) / 2.0
    isl, osl = max(1, round(spec.isl * mean)), max(1, round(spec.osl * mean))
    s = cfg.scheduler
    assert s.max_num_batched_tokens is not None
    chunk = min(isl, s.max_num_batched_tokens) if s.chunked_prefill is not False else isl
    others = spec.per_rank_concurrency - 1 if s.mixed_prefill else 0
    kv = isl + osl // 2
    shapes, done = [], 0
    while done < isl:
        q = min(chunk, isl - done)
        done += q
        shapes.append(BatchShape.from_requests([1] * others + [q], [kv] * others + [done]))
    return dep, shapes, cfg


def fit_eager(csv_path: Path, journal: Path, engines: Sequence[str],
              max_conc: int = 16, train_models: str | None = None,
              by_group: bool = False) -> dict[str, dict[str, float]]:
    """Grid fit of each engine's eager host terms on its TRAIN rows; ``train_models`` (a regular expression
    on model_path) adds that model's rows on any GPU to the train set, for an engine whose H100 rows cannot
    constrain a term (SGLang: dense Qwen3-32B only, no MoE layer). ``journal`` must come from a run with
    every eager host term at 0 (its header does not record the constants); the terms are priced from 0
    here whatever the shipped profiles hold. ``by_group`` also prints what each (GPU, model) group wants."""
    from twin.system import cost_model
    from validation.silicon import Skip, read_rows, row_spec

    base_ttft = _journal_ttft_ms(journal)
    out: dict[str, dict[str, float]] = {}
    for engine in engines:
        rows = []
        for row in read_rows(csv_path):
            if row["backend"] != engine or row["id"] not in base_ttft:
                continue
            try:
                spec = row_spec(row)
            except Skip:
                continue
            if spec.mode != "agg" or spec.per_rank_concurrency > max_conc:
                continue
            dep, shapes, cfg = _prompt_steps(row)
            # priced from 0: the journal's TTFT had these terms at 0, whatever the shipped profile holds now
            zeroed = attrs.evolve(dep.engine, eager_layer_host_s=0.0, eager_moe_host_s=0.0)
            dep = attrs.evolve(dep, engine=zeroed)
            rows.append((row, spec, dep, shapes, cfg))
        def trains(row: dict[str, str], spec: Any) -> bool:
            return spec.gpu == TRAIN_GPU or bool(train_models and re.search(train_models, row["model_path"]))

        train = [r for r in rows if trains(r[0], r[1])]
        test = [r for r in rows if not trains(r[0], r[1])]
        if not train:
            print(f"{engine}: no train rows at concurrency <= {max_conc}")
            continue
        zero = {id(dep): sum(cost_model(cfg, dep).step_cost(sh).total_s for sh in shapes)
                for _, _, dep, shapes, cfg in rows}

        def ratios(params: tuple[float, float], subset: list[Any]) -> np.ndarray:
            res = []
            for row, spec, dep, shapes, cfg in subset:
                eng = attrs.evolve(dep.engine, eager_layer_host_s=params[0], eager_moe_host_s=params[1])
                cm = cost_model(cfg, attrs.evolve(dep, engine=eng))
                delta_ms = (sum(cm.step_cost(sh).total_s for sh in shapes) - zero[id(dep)]) * 1e3
                res.append((base_ttft[row["id"]] + delta_ms) / float(row["silicon_ttft_ms"]))
            return np.array(res)

        best: tuple[float, tuple[float, float]] | None = None
        for params in itertools.product(EAGER_LAYER_HOST, EAGER_MOE_HOST):
            score = _log_score(ratios(params, train))
            if best is None or score < best[0] - 1e-9:
                best = (score, params)
        assert best is not None
        p = best[1]
        for name, params in (("zero", (0.0, 0.0)), ("fit", p)):
            tr, te = ratios(params, train) - 1, ratios(params, test) - 1
            print(f"{engine} {name}: eager_layer_host_s {params[0]:.3g}, eager_moe_host_s {params[1]:.3g} | "
                  f"train {len(tr)} rows median |error| {100 * np.median(np.abs(tr)):.1f} %, MAPE "
                  f"{100 * np.mean(np.abs(tr)):.1f} % | held-out {len(te)} rows "
                  + (f"median |error| {100 * np.median(np.abs(te)):.1f} %, MAPE {100 * np.mean(np.abs(te)):.1f} %"
                     if len(te) else ""))
        out[engine] = {"eager_layer_host_s": p[0], "eager_moe_host_s": p[1]}
        if by_group:
            print(_eager_by_group(engine, rows, p[0], ratios))
    return out


def _eager_by_group(engine: str, rows: list[Any], layer_s: float,
                    ratios: Callable[[tuple[float, float], list[Any]], np.ndarray]) -> str:
    """What each (GPU, model) group of an engine's rows wants: the per-MoE-layer value of the grid that
    minimises the group's median |log error|, the per-layer term held at the engine's fit. A diagnostic, not
    a fit: one constant per engine is what the profile ships."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for rec in rows:
        row, spec, dep = rec[:3]
        if dep.model.is_moe:
            groups.setdefault((spec.gpu, row["model_path"].split("/")[-1]), []).append(rec)
    lines = [f"{engine}: eager_moe_host_s each group wants (eager_layer_host_s {layer_s:.3g})"]
    for (gpu, model), sub in sorted(groups.items()):
        score, best = min((_log_score(ratios((layer_s, v), sub)), v) for v in EAGER_MOE_HOST)
        lines.append(f"  {gpu:9s} {model:28s} {len(sub):3d} rows  {1e3 * best:4.2f} ms  "
                     f"median |error| {100 * (np.exp(score) - 1):5.1f} %")
    return "\n".join(lines)


def implied_linear_rate(row: dict[str, str]) -> float | None:
    """FLOP/s per GPU the row's measurement implies for its linear layers alone (None: not aggregated, or
    not representable)."""
    from hardware import load_model
    from validation.silicon import Skip, protocol, row_spec

    try:
        spec = row_spec(row)
    except (Skip, ValueError, KeyError):
        return None
    if spec.mode != "agg" or spec.agg is None:
        return None
    mean = (1.0 + protocol(row).low_frac) / 2.0
    isl, osl = spec.isl * mean, spec.osl * mean
    e2e_s = (float(row["silicon_ttft_ms"]) + (osl - 1.0) * float(row["silicon_tpot_ms"])) / 1e3
    model = load_model(spec.model)
    linear_params = model.active_param_count - model.embedding_params
    return 2.0 * linear_params * (isl + osl) * spec.concurrency / e2e_s / spec.agg.gpus


def fastest_gemm(opdb: Path) -> dict[str, float]:
    """Per GPU, the highest FLOP/s of any row of any engine's GEMM table in an opdb folder."""
    import gzip

    best: dict[str, float] = {}
    for path in sorted(opdb.glob("*__gemm_perf__*.csv*")):
        gpu = path.name.split("__")[0]
        with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as fh:
            for rec in csv.DictReader(fh):
                rate = 2.0 * int(rec["m"]) * int(rec["n"]) * int(rec["k"]) / (float(rec["latency"]) * 1e-3)
                best[gpu] = max(best.get(gpu, 0.0), rate)
    return best


def implied_rates(csv_path: Path, opdb: Path | None, top: int) -> str:
    """The ``top`` rows implying the highest linear-layer FLOP rate, flagged against the fastest GEMM."""
    from validation.silicon import read_rows

    best = fastest_gemm(opdb) if opdb is not None else {}
    rates = [(rate, row) for row in read_rows(csv_path) if (rate := implied_linear_rate(row)) is not None]
    rates.sort(key=lambda item: -item[0])
    lines = ["TFLOP/s per GPU (linear layers alone)   fastest GEMM on the GPU   row"]
    for rate, row in rates[:top]:
        limit = best.get(row["system"])
        flag = "" if limit is None else f"{limit / 1e12:7.0f}{'  ABOVE' if rate > limit else ''}"
        lines.append(f"{rate / 1e12:10.0f}   {flag:>30}   {row['id']}")
    return "\n".join(lines)


def lone_prompt_step_ms(row: dict[str, str]) -> float:
    """The twin's cost (ms) of a step that carries one request's whole prompt (the row's mean ISL) and
    nothing else, on the row's deployment: the unit P in which queueing behind other prompts is counted."""
    from hardware import BatchShape
    from twin.system import cost_model
    from validation.silicon import protocol, row_spec

    dep, _, cfg = _prompt_steps(row)
    isl = max(1, round(row_spec(row).isl * (1.0 + protocol(row).low_frac) / 2.0))
    return cost_model(cfg, dep).step_cost(BatchShape.from_requests([isl], [isl])).total_s * 1e3


def interval_ms(osl: float, tpot_ms: float, c: int) -> float:
    """One inter-completion interval of a closed loop of ``c`` requests of ``osl`` output tokens: a request's
    lifetime (OSL x TPOT) over the requests in flight."""
    return osl * tpot_ms / c


def ttft_step_table(recs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, concurrency, ISL): medians over the rows of the measured and the twin's TTFT in units of
    the lone prompt step P, and of q = (measured - twin TTFT) / (OSL x measured TPOT / c), the share of one
    inter-completion interval of the closed loop that the excess amounts to (1: as if one request always
    waited for a seat). Each record: model, c, isl, osl, meas_ttft_ms, pred_ttft_ms, meas_tpot_ms, p_ms."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault((r["model"], r["c"], r["isl"]), []).append(r)
    out = []
    for (model, c, isl), rs in sorted(groups.items()):
        out.append({
            "model": model, "c": c, "isl": isl, "rows": len(rs),
            "meas_per_p": float(np.median([r["meas_ttft_ms"] / r["p_ms"] for r in rs])),
            "twin_per_p": float(np.median([r["pred_ttft_ms"] / r["p_ms"] for r in rs])),
            "q": float(np.median([(r["meas_ttft_ms"] - r["pred_ttft_ms"])
                                  / interval_ms(r["osl"], r["meas_tpot_ms"], r["c"]) for r in rs])),
        })
    return out


def ttft_steps(csv_path: Path, journal: Path, engine: str) -> str:
    """The genai-perf (aiconfigurator gap analysis) aggregated rows of one engine: TTFT in lone prompt steps."""
    from validation.silicon import GENAI_PERF, Skip, protocol, read_rows, row_spec

    pred = _journal_ttft_ms(journal)
    recs = []
    for row in read_rows(csv_path):
        if row["backend"] != engine or row["id"] not in pred or protocol(row) is not GENAI_PERF:
            continue
        try:
            spec = row_spec(row)
        except Skip:
            continue
        recs.append({"model": f"{spec.model} {row['backend_version']}", "c": spec.per_rank_concurrency,
                     "isl": spec.isl, "osl": spec.osl, "meas_ttft_ms": float(row["silicon_ttft_ms"]),
                     "pred_ttft_ms": pred[row["id"]], "meas_tpot_ms": float(row["silicon_tpot_ms"]),
                     "p_ms": lone_prompt_step_ms(row)})
    lines = ["model                                           c    ISL  rows  meas/P  twin/P  q (excess / interval)"]
    for t in ttft_step_table(recs):
        lines.append(f"{t['model']:46s} {t['c']:4d} {t['isl']:6d} {t['rows']:5d} {t['meas_per_p']:7.2f} "
                     f"{t['twin_per_p']:7.2f} {t['q']:7.2f}")
    return "\n".join(lines)


# --- TTFT excess against the closed loop's inter-completion interval --------------------------------

def seat_wait_fit(recs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Least-squares ``excess_ms = slope x interval_ms + intercept_ms`` over records with those two keys, and
    the correlation of the two (NaN with fewer than two distinct intervals)."""
    x = np.array([r["interval_ms"] for r in recs], dtype=float)
    y = np.array([r["excess_ms"] for r in recs], dtype=float)
    if len(x) < 2 or np.ptp(x) == 0.0:
        return {"rows": len(x), "slope": float("nan"), "intercept_ms": float("nan"), "corr": float("nan")}
    slope, intercept = np.polyfit(x, y, 1)
    corr = float(np.corrcoef(x, y)[0, 1]) if np.ptp(y) > 0.0 else float("nan")
    return {"rows": len(x), "slope": float(slope), "intercept_ms": float(intercept), "corr": corr}


def _no_minus_zero(x: float, places: int) -> float:
    """``x``, or 0.0 where it would print as a negative zero at ``places`` decimals."""
    return 0.0 if round(x, places) == 0 else x


def seat_waits(out: Path, keys: Sequence[str], max_conc: int, protocol_name: str = "genai-perf",
               detail: bool = False) -> str:
    from validation.silicon import Skip, row_spec

    rows = [r for r in read_results(out) if r["mode"] == "agg" and r["protocol"] == protocol_name]
    if not rows:
        return f"{out}: no represented aggregated {protocol_name} rows"
    # (the measured CSV's whole row: row_spec reads its parallelism for the concurrency per rank)
    rows = _with_csv_columns(out, rows, [*keys, "tp_size", "attention_dp_size", "moe_ep_size"])
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        try:
            c = row_spec(r).per_rank_concurrency
        except Skip:
            continue
        if c > max_conc:
            continue
        groups.setdefault(tuple(str(r[k]) for k in keys), []).append(
            {"interval_ms": interval_ms(float(r["osl"]), float(r["meas_tpot_ms"]), c), "excess_ms": float(r["meas_ttft_ms"]) - float(r["pred_ttft_ms"]),
             "tp": str(r["tp_size"]), "c": c})
    lines = [f"{protocol_name} aggregated rows, concurrency per rank <= {max_conc}: excess = measured - predicted "
             f"TTFT, interval = OSL x measured TPOT / c",
             f"{'rows':>5} {'slope':>6} {'intercept ms':>13} {'corr':>5}  {' / '.join(keys)}"]
    for g, recs in sorted(groups.items()):
        f = seat_wait_fit(recs)
        slope, intercept, corr = (_no_minus_zero(f[k], p) for k, p in (("slope", 2), ("intercept_ms", 0), ("corr", 2)))
        lines.append(f"{f['rows']:5d} {slope:6.2f} {intercept:13.0f} {corr:5.2f}  "
                     f"{' / '.join(v or '-' for v in g)}")
        if detail:
            cells: dict[tuple[str, int], list[float]] = {}
            for r in recs:
                cells.setdefault((r["tp"], r["c"]), []).append(r["excess_ms"] / r["interval_ms"])
            for tp in sorted({tp for tp, _ in cells}, key=lambda t: (len(t), t)):
                lines.append(f"{'':27}tp {tp}: " + ", ".join(
                    f"c{c} {float(np.median(v)):.2f}" for (t, c), v in sorted(cells.items()) if t == tp))
    return "\n".join(lines)


METRICS = ("tpot", "ttft")
REPEAT_IGNORED = ("id", "silicon_data_source", "silicon_ttft_ms", "silicon_tpot_ms")
"""Columns of the measured CSV that two measurements of one configuration may differ in."""
_CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")


def repeat_key(row: dict[str, str]) -> tuple[str, ...]:
    """What makes two rows one configuration: every column but :data:`REPEAT_IGNORED` (and the reader's
    own, such as ``_line``), and the client concurrency the data source records."""
    conc = _CONCURRENCY.search(row.get("silicon_data_source", ""))
    return (conc.group(1) if conc else "",) + tuple(v for k, v in row.items()
                                                     if k not in REPEAT_IGNORED and not k.startswith("_"))


def best_single_errors(values: Sequence[float]) -> list[float]:
    """|p / m - 1| for each measurement m of one configuration, p being the one prediction that makes their
    mean least: the median of the values weighted by 1 / m (the mean is sum |p - m| / m)."""
    v = np.sort(np.asarray(values, dtype=float))
    cum = np.cumsum(1.0 / v)
    p = float(v[int(np.searchsorted(cum, cum[-1] / 2.0))])
    return [abs(p / m - 1.0) for m in values]


def _measurements(row: dict[str, str]) -> dict[str, float]:
    """The row's measured TPOT and TTFT, ms, read as the validation reads them (validation.silicon._measured_ms);
    a row without them is an error naming it (it would be no configuration's measurement)."""
    from validation.silicon import Skip, _measured_ms

    out = {}
    for metric in METRICS:
        col = f"silicon_{metric}_ms"
        try:
            out[metric] = _measured_ms(row, col)
        except Skip:
            raise ValueError(f"row {row['id']!r} (line {row.get('_line', '?')}): {col} must be a positive number "
                             f"of milliseconds, got {row[col]!r}") from None
    return out


def repeat_table(rows: Sequence[dict[str, str]], represented: set[str] | None = None,
                 spread: float = 0.2) -> list[dict[str, Any]]:
    """Per (mode, backend): the configurations measured more than once, how many of them spread by more than
    ``spread`` (largest / smallest - 1) in TPOT and in TTFT, the largest such ratio; with ``represented``
    (ids a validation simulated), the MAPE no single prediction per configuration can beat on those rows
    (``floor_tpot`` / ``floor_ttft``, percent: the best-single errors of the repeated ones, over every row
    represented)."""
    by_backend: dict[tuple[str, str], list[list[tuple[dict[str, float], bool]]]] = {}
    configs: dict[tuple[str, ...], list[tuple[dict[str, float], bool]]] = {}
    for r in rows:
        key = repeat_key(r)
        if key not in configs:
            configs[key] = []
            by_backend.setdefault((r["mode"], r["backend"]), []).append(configs[key])
        configs[key].append((_measurements(r), represented is None or r["id"] in represented))
    table = []
    for (mode, backend), groups in sorted(by_backend.items()):
        repeated = [g for g in groups if len(g) > 1]
        t: dict[str, Any] = {"mode": mode, "backend": backend, "configs": len(groups), "repeated": len(repeated)}
        for metric in METRICS:
            ratios = [max(m[metric] for m, _ in g) / min(m[metric] for m, _ in g) for g in repeated]
            t[f"spread_{metric}"] = sum(x - 1.0 > spread for x in ratios)
            t[f"max_ratio_{metric}"] = max(ratios, default=1.0)
        if represented is not None:
            kept = [[m for m, ok in g if ok] for g in groups]
            n = sum(map(len, kept))
            for metric in METRICS:
                err = sum(sum(best_single_errors([m[metric] for m in k])) for k in kept if len(k) > 1)
                t[f"floor_{metric}"] = 100.0 * err / n if n else float("nan")
        table.append(t)
    return table


def repeats(csv_path: Path, out: Path | None = None, spread: float = 0.2) -> str:
    """The measured CSV's repeated configurations (:func:`repeat_table`), with the floors of a validation run
    in ``out`` when given."""
    from validation.silicon import read_rows

    represented = None
    if out is not None:
        represented = {r["id"] for r in read_results(out)}
    table = repeat_table(read_rows(csv_path), represented, spread)
    head = (f"{'mode':7} {'backend':8} {'configs':>7} {'repeated':>8} {'TPOT >':>7} {'TTFT >':>7} "
            f"{'max TPOT x':>10} {'max TTFT x':>10}")
    if represented is not None:
        head += f" {'floor TPOT %':>12} {'floor TTFT %':>12}"
    lines = [f"configurations measured more than once (spread: largest / smallest - 1 > {spread:.0%})", head]
    for t in table:
        line = (f"{t['mode']:7} {t['backend']:8} {t['configs']:7} {t['repeated']:8} {t['spread_tpot']:7} "
                f"{t['spread_ttft']:7} {t['max_ratio_tpot']:10.2f} {t['max_ratio_ttft']:10.2f}")
        if represented is not None:
            line += f" {t['floor_tpot']:12.1f} {t['floor_ttft']:12.1f}"
        lines.append(line)
    return "\n".join(lines)


def transfer_table(fitted: Sequence[dict[str, Any]], moved: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode (agg, disagg) on the rows both runs represent: MAPE with the constants fitted on the rows' own
    GPU and with constants moved to it (another GPU's fit, or another architecture's), and the difference."""
    theirs = {r["id"]: r for r in moved}
    out = []
    for mode in ("agg", "disagg"):
        pairs = [(r, theirs[r["id"]]) for r in fitted if r["mode"] == mode and r["id"] in theirs]
        row: dict[str, Any] = {"mode": mode, "rows": len(pairs)}
        for metric in ("tpot", "ttft"):
            a = _mape(f[f"{metric}_err_pct"] for f, _ in pairs)
            b = _mape(m[f"{metric}_err_pct"] for _, m in pairs)
            row.update({f"{metric}_fitted": a, f"{metric}_transfer": b, f"{metric}_gap": b - a})
        out.append(row)
    return out


def transfer(csv_path: Path, out: Path, systems: Sequence[str], constants: str, jobs: int = 1,
             every: int = 1, mode: str | None = None) -> str:
    """Simulate the rows measured on ``systems`` twice: with the shipped constants (fitted on tables that
    include those GPUs') and with ``hardware.constants`` = ``constants`` (fitted elsewhere), then compare.
    ``every``: only every k-th of those rows in file order (a smaller, unbiased sample); ``mode``: only the
    aggregated (``agg``) or disaggregated (``disagg``) ones. Both runs journal
    (OUT/fitted, OUT/transfer) and resume, so a repeated call only prints."""
    from validation.silicon import read_rows, validate_silicon

    ids = [r["id"] for r in read_rows(csv_path) if r["system"].strip() in systems
           and (mode is None or r["mode"].strip() == mode)][::every]
    if not ids:
        raise ValueError(f"{csv_path} has no row measured on {', '.join(systems)}")
    match = "^(?:" + "|".join(re.escape(i) for i in ids) + ")$"
    runs = {"fitted": (), "transfer": (f"hardware.constants={constants}",)}
    for name, settings in runs.items():
        validate_silicon(csv_path, out / name, jobs=jobs, match=match, progress=False, resume=True,
                         settings=settings)
    table_rows = transfer_table(read_results(out / "fitted"), read_results(out / "transfer"))
    sample = f" (every {every}th row)" if every > 1 else ""
    lines = [f"rows measured on {', '.join(systems)}: {len(ids)}{sample}; transfer constants: {constants}",
             f"  {'mode':7} {'rows':>5} | {'TPOT fitted':>11} {'transfer':>9} {'gap':>6} | "
             f"{'TTFT fitted':>11} {'transfer':>9} {'gap':>6}"]
    for r in table_rows:
        lines.append(f"  {r['mode']:7} {r['rows']:5} | {r['tpot_fitted']:10.1f}% {r['tpot_transfer']:8.1f}% "
                     f"{r['tpot_gap']:+6.1f} | {r['ttft_fitted']:10.1f}% {r['ttft_transfer']:8.1f}% "
                     f"{r['ttft_gap']:+6.1f}")
    return "\n".join(lines)


CSV_HELP = f"a measured CSV (.csv, .csv.gz) or a shipped sample's name ({', '.join(SAMPLES)})"


def csv_argument(text: str) -> Path:
    """``--csv``: a file, or a shipped sample's name (validation.samples.resolve_csv)."""
    try:
        return resolve_csv(text)
    except FileNotFoundError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="simulate the rows, then print the report")
    run.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--match", default=None)
    run.add_argument("--limit", type=int, default=None)
    run.add_argument("--waves", type=int, default=None, help="override the protocol's measured requests per slot")
    rep = sub.add_parser("report", help="print the report of an earlier run")
    rep.add_argument("--out", type=Path, required=True)
    fit = sub.add_parser("fit-host", help="fit the engine host terms on the TRAIN rows")
    fit.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    fit.add_argument("--engines", nargs="*", default=["vllm", "trtllm", "sglang"])
    eag = sub.add_parser("fit-eager", help="fit the eager-step host terms on the TRAIN rows' TTFT")
    eag.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    eag.add_argument("--journal", type=Path, required=True, help="rows.jsonl of a run with those terms at 0")
    eag.add_argument("--engines", nargs="*", default=["trtllm", "sglang"])
    eag.add_argument("--max-conc", type=int, default=16)
    eag.add_argument("--train-models", default=None,
                     help="regular expression on model_path: those rows join the train set on any GPU")
    eag.add_argument("--by-group", action="store_true",
                     help="also print the per-MoE-layer value each (GPU, model) group's rows want")
    imp = sub.add_parser("implied-rate", help="the FLOP rate each row's measurement implies (plausibility)")
    imp.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    imp.add_argument("--opdb", type=Path, default=None, help="opdb folder: flag rows above its fastest GEMM")
    imp.add_argument("--top", type=int, default=30)
    stp = sub.add_parser("ttft-steps", help="genai-perf rows' TTFT in units of the lone prompt step")
    stp.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    stp.add_argument("--journal", type=Path, required=True, help="rows.jsonl of a twin validate run")
    stp.add_argument("--engine", default="trtllm")
    pts = sub.add_parser("points", help="the share of the file's MAPE each group of rows carries")
    pts.add_argument("--out", type=Path, required=True, help="folder of a twin validate run")
    pts.add_argument("--metric", choices=("ttft", "tpot"), default="ttft")
    pts.add_argument("--by", default="backend,backend_version,system,model",
                     help="comma-separated columns of rows.csv or of the measured CSV")
    pts.add_argument("--mode", choices=("agg", "disagg"), default="agg")
    pts.add_argument("--top", type=int, default=None)
    sw = sub.add_parser("seat-wait", help="closed-loop rows' TTFT excess against one inter-completion interval")
    sw.add_argument("--out", type=Path, required=True, help="folder of a twin validate run")
    sw.add_argument("--by", default="backend,backend_version,model",
                    help="comma-separated columns of rows.csv or of the measured CSV")
    sw.add_argument("--max-conc", type=int, default=32)
    sw.add_argument("--protocol", default="genai-perf", help="rows.csv protocol column: genai-perf, inferencemax")
    sw.add_argument("--detail", action="store_true", help="also the median excess / interval per (tp_size, c)")
    gp = sub.add_parser("gpu-pairs", help="the same benchmark on both GPUs: measured vs predicted ratio")
    gp.add_argument("--out", type=Path, required=True, help="folder of a twin validate run")
    gp.add_argument("--by", default="backend,model", help="comma-separated columns of rows.csv or of the "
                                                          "measured CSV")
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
    rp = sub.add_parser("repeats", help="configurations the measured CSV holds more than once: how far apart")
    rp.add_argument("--csv", type=csv_argument, required=True, help=CSV_HELP)
    rp.add_argument("--out", type=Path, default=None,
                    help="folder of a twin validate run: also the MAPE no one prediction can beat on its rows")
    rp.add_argument("--spread", type=float, default=0.2, help="count pairs further apart than this fraction")
    args = ap.parse_args(argv)
    if args.cmd == "transfer":
        try:
            print(transfer(args.csv, args.out, [g.strip() for g in args.systems.split(",") if g.strip()],
                           args.constants, args.jobs, args.every, args.mode))
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "repeats":
        try:
            print(repeats(args.csv, args.out, args.spread))
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "run":
        from validation.silicon import validate_silicon

        validate_silicon(args.csv, args.out, jobs=args.jobs, match=args.match, limit=args.limit, waves=args.waves)
        print(report(args.out))
    elif args.cmd == "report":
        print(report(args.out))
    elif args.cmd == "fit-eager":
        print(json.dumps(fit_eager(args.csv, args.journal, args.engines, args.max_conc, args.train_models,
                                    args.by_group), indent=2))
    elif args.cmd == "ttft-steps":
        print(ttft_steps(args.csv, args.journal, args.engine))
    elif args.cmd == "implied-rate":
        print(implied_rates(args.csv, args.opdb, args.top))
    elif args.cmd in ("points", "seat-wait", "gpu-pairs"):
        keys = [k.strip() for k in args.by.split(",") if k.strip()]
        try:
            if args.cmd == "points":
                print(points(args.out, args.metric, keys, args.mode, args.top))
            elif args.cmd == "seat-wait":
                print(seat_waits(args.out, keys, args.max_conc, args.protocol, args.detail))
            else:
                print(gpu_pairs(args.out, keys))
        except (ValueError, OSError) as exc:   # an unknown column, a folder without rows.csv
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        print(json.dumps(fit_host(args.csv, args.engines), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
