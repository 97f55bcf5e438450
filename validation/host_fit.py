"""The engine host-term fits (``fit-host`` and ``fit-eager`` of ``python -m validation.report``): grid
searches on the TRAIN rows for the per-step, per-request and graph-floor host times (a TPOT surrogate) and
the eager-step host times (a TTFT surrogate on a journal run with those terms at 0), reported on the
held-out rows.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs
import numpy as np

from validation.report_tables import TRAIN_GPU, journal_ttft_ms


STEP_HOST = (0.0, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 2.5e-3, 3e-3, 3.5e-3, 4e-3)
REQ_HOST = (0.0, 15e-6, 25e-6, 50e-6, 75e-6, 100e-6, 150e-6)
KERNEL_FLOOR = (2e-6, 3e-6, 3.5e-6, 4e-6, 4.5e-6, 5e-6, 6e-6)


def _log_score(ratios: np.ndarray) -> float:
    """Median |log(predicted / measured)|: what the grid fits minimise (ties go to the earlier point)."""
    return float(np.median(np.abs(np.log(ratios))))


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


def prompt_steps(row: dict[str, str]) -> tuple[Any, list[Any], Any]:
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
              by_group: bool = False, versions: str | None = None) -> dict[str, dict[str, float]]:
    """Grid fit of each engine's eager host terms on its TRAIN rows; ``train_models`` (a regular expression
    on model_path) adds that model's rows on any GPU to the train set, for an engine whose H100 rows cannot
    constrain a term (SGLang: dense Qwen3-32B only, no MoE layer). ``journal`` must come from a run with
    every eager host term at 0 (its header does not record the constants); the terms are priced from 0
    here whatever the shipped profiles hold. ``by_group`` also prints what each (GPU, model) group wants.
    ``versions`` (a regular expression on backend_version) fits one engine build (EngineProfile.builds): only
    its rows are read, and they are the train set on any GPU (those of ``train_models`` alone, if given)."""
    from twin.system import cost_model
    from validation.silicon import Skip, read_rows, row_spec

    base_ttft = journal_ttft_ms(journal)
    out: dict[str, dict[str, float]] = {}
    for engine in engines:
        rows = []
        for row in read_rows(csv_path):
            if row["backend"] != engine or row["id"] not in base_ttft:
                continue
            if versions and not re.fullmatch(versions, row.get("backend_version", "")):
                continue
            try:
                spec = row_spec(row)
            except Skip:
                continue
            if spec.mode != "agg" or spec.per_rank_concurrency > max_conc:
                continue
            dep, shapes, cfg = prompt_steps(row)
            # priced from 0: the journal's TTFT had these terms at 0, whatever the shipped profile holds now
            zeroed = attrs.evolve(dep.engine, eager_layer_host_s=0.0, eager_moe_host_s=0.0)
            dep = attrs.evolve(dep, engine=zeroed)
            rows.append((row, spec, dep, shapes, cfg))
        def trains(row: dict[str, str], spec: Any) -> bool:
            if versions:
                return not train_models or bool(re.search(train_models, row["model_path"]))
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
