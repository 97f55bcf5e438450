"""Why each cost term exists: one ledger term switched off at a time, and the error on the measured rows of
the serving condition it is for (issue 51).

The rows are aiconfigurator's aggregated silicon rows shipped with ``validation``
(``silicon_h100_h200.csv.gz``); ``term_ablation.yaml`` (beside this file) lists, per serving condition
(prefill, small-batch decode, attention-DP decode, long context), the metric it is read by (TTFT or TPOT), the
rule that chose its rows and the ids the rule chose (``--select`` prints them again). Each row is simulated
with the twin config ``validation.silicon.row_config`` builds for it, once with every term on (the baseline,
once per row) and once per term of the YAML with that term in ``hardware.disabled_terms``. A term's growth for
a condition is the MAPE of the condition's metric over its rows with the term off minus the MAPE with every
term on, in points: > 0, the term earns its place there; < 0, the rows are over-predicted and lose error with
any time taken away; no change, the term takes no time on those rows (not priced there, or hidden under the
GPU step).

Writes ``term_ablation.csv`` (term, condition, rows, mape_on, mape_off, growth_points),
``term_ablation_rows.csv`` (every row's measured, baseline and ablated value of its metric),
``term_ablation.png`` (growth in points, terms x conditions) and ``summary.md``.

    python experiments/term_ablation.py --out out/term_ablation
    python experiments/term_ablation.py --select      # the rows the YAML's rules choose, to paste into it
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import attrs

from experiments.tables import cell, write_rows
from hardware.cost import TERMS
from twin.config import load_config
from twin.config_codec import read_yaml
from twin.runner import Simulation
from validation.samples import sample_path
from validation.silicon import (RowSpec, Skip, measured_means, protocol, read_rows, row_config, row_spec,
                                simulation_key)

STUDY = Path(__file__).with_suffix(".yaml")
METRICS = {"ttft": "silicon_ttft_ms", "tpot": "silicon_tpot_ms"}
"""A condition's metric -> the row's measured column."""
COLUMNS = ("term", "condition", "rows", "mape_on", "mape_off", "growth_points")
ROW_COLUMNS = ("condition", "metric", "row_id", "model", "gpu", "backend", "tp", "attention_dp", "ep", "isl",
               "osl", "concurrency", "measured_ms", "term", "sim_ms", "err_pct")
BASELINE = "all on"
NO_CHANGE_PCT = 0.01
"""A term whose removal moves no row's prediction by this many percent or more changes nothing there."""


def study() -> dict[str, Any]:
    """``term_ablation.yaml`` as a mapping."""
    return read_yaml(STUDY)


def silicon_rows(spec: Mapping[str, Any]) -> list[dict[str, str]]:
    """The sample the YAML names (``validation.samples``), every row."""
    return read_rows(sample_path(spec["sample"]))


def _field(spec: RowSpec, name: str) -> int:
    assert spec.agg is not None
    return {"concurrency": spec.concurrency, "isl": spec.isl, "osl": spec.osl, "tp": spec.agg.tp,
            "attention_dp": spec.agg.dp, "ep": spec.agg.ep}[name]


def matches(spec: RowSpec, rule: Mapping[str, int]) -> bool:
    """Whether an aggregated row's spec meets every bound of ``rule`` (``<field>_min`` / ``<field>_max``)."""
    if spec.agg is None:
        return False
    for key, bound in rule.items():
        name, _, side = key.rpartition("_")
        value = _field(spec, name)
        if (side == "min" and value < bound) or (side == "max" and value > bound):
            return False
    return True


def select(rows: Iterable[dict[str, str]], rule: Mapping[str, int], count: int) -> list[str]:
    """Ids of ``count`` represented aggregated rows meeting ``rule``, spread over models and engines: one row
    from each (model, engine) group in turn, round after round, the groups in order of their first id with
    dense and MoE models' groups interleaved (the more numerous kind's last ones after), each group's rows in
    id order. A row whose twin config is one already taken (the same benchmark under another id, or measured
    again) is passed over."""
    import hardware

    groups: dict[tuple[str, str], list[dict[str, str]]] = {}
    for row in sorted(rows, key=lambda r: r["id"]):
        if row.get("mode") != "agg":
            continue
        try:
            spec = row_spec(row)
        except Skip:
            continue
        if matches(spec, rule) and simulation_key(row) is not None:
            groups.setdefault((spec.model, spec.backend), []).append(row)
    kinds: dict[bool, list[list[dict[str, str]]]] = {False: [], True: []}
    for (model, _), group in groups.items():
        kinds[hardware.load_model(model).is_moe].append(list(group))
    order = [q for pair in itertools.zip_longest(kinds[False], kinds[True]) for q in pair if q is not None]
    chosen: list[str] = []
    seen: set[str | None] = set()
    while len(chosen) < count and any(order):
        for queue in order:
            while queue and len(chosen) < count:
                row = queue.pop(0)
                key = simulation_key(row)
                if key not in seen:
                    seen.add(key)
                    chosen.append(row["id"])
                    break
    return chosen


def selection(rows: Sequence[dict[str, str]], spec: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every condition's ids as its rule chooses them from ``rows``."""
    count = spec["rows_per_condition"]
    return {name: select(rows, c["rule"], count) for name, c in spec["conditions"].items()}


def simulate(row: dict[str, str], waves: int, disabled: Sequence[str] = ()) -> dict[str, float]:
    """Mean TTFT and TPOT (ms) of the row's twin config with ``disabled`` ledger terms switched off."""
    cfg = row_config(row, waves=waves)
    if disabled:
        cfg["hardware"] = {**cfg["hardware"], "disabled_terms": list(disabled)}
    res = Simulation(load_config(cfg)).run()
    if res.summary["requests"]["failed"]:
        raise RuntimeError(f"{row['id']} ({', '.join(disabled) or BASELINE}): "
                           f"{res.summary['requests']['failed']} simulated requests failed")
    ttft_s, tpot_s, _ = measured_means(res.requests)
    return {"ttft": ttft_s * 1e3, "tpot": tpot_s * 1e3}


@attrs.frozen(kw_only=True)
class RowRun:
    """One measured row of a condition: its measured metric, the baseline and each term off."""

    condition: str
    metric: str
    row: Mapping[str, str]
    measured_ms: float
    sim_ms: Mapping[str, float]
    """Term (or BASELINE) -> the simulated metric (ms)."""

    def err_pct(self, term: str) -> float:
        return 100 * (self.sim_ms[term] / self.measured_ms - 1)

    def rows(self) -> list[dict[str, Any]]:
        spec = row_spec(dict(self.row))
        assert spec.agg is not None
        head = {"condition": self.condition, "metric": self.metric, "row_id": self.row["id"],
                "model": spec.model, "gpu": spec.gpu, "backend": spec.backend, "tp": spec.agg.tp,
                "attention_dp": spec.agg.dp, "ep": spec.agg.ep, "isl": spec.isl, "osl": spec.osl,
                "concurrency": spec.concurrency, "measured_ms": self.measured_ms}
        return [{**head, "term": t, "sim_ms": v, "err_pct": self.err_pct(t)} for t, v in self.sim_ms.items()]


def condition_waves(spec: Mapping[str, Any], condition: str) -> int:
    """Measured requests per client slot the condition's rows are simulated with (``row_config(waves=)``)."""
    return int(spec["conditions"][condition].get("waves", spec["waves"]))


def run(rows: Sequence[dict[str, str]], spec: Mapping[str, Any], terms: Sequence[str] | None = None,
        waves: int | None = None) -> list[RowRun]:
    """Every listed row of every condition simulated with all terms on and with each term off (``terms``:
    the YAML's unless given; ``waves``: each condition's unless given). A row listed under two conditions
    with the same waves is simulated once per term."""
    by_id = {r["id"]: r for r in rows}
    terms = list(spec["terms"] if terms is None else terms)
    cache: dict[tuple[str, int, str], dict[str, float]] = {}
    out = []
    for name, cond in spec["conditions"].items():
        w = condition_waves(spec, name) if waves is None else waves
        for row_id in cond["rows"]:
            row = by_id[row_id]
            sims = {}
            for term in (BASELINE, *terms):
                if (row_id, w, term) not in cache:
                    cache[row_id, w, term] = simulate(row, w, () if term == BASELINE else (term,))
                sims[term] = cache[row_id, w, term][cond["metric"]]
            out.append(RowRun(condition=name, metric=cond["metric"], row=row,
                              measured_ms=float(row[METRICS[cond["metric"]]]), sim_ms=sims))
    return out


def mape(values: Iterable[float]) -> float:
    v = [abs(x) for x in values]
    return sum(v) / len(v) if v else math.nan


@attrs.frozen(kw_only=True)
class Cell:
    """One (term, condition): the condition's MAPE with every term on and with the term off."""

    term: str
    condition: str
    rows: int
    mape_on: float
    mape_off: float
    largest_change_pct: float
    """The largest |change| of one row's simulated metric when the term is off (0: it takes no time there)."""

    @property
    def growth_points(self) -> float:
        return self.mape_off - self.mape_on

    @property
    def changes(self) -> bool:
        """Whether switching the term off moves some row's prediction by NO_CHANGE_PCT or more."""
        return self.largest_change_pct >= NO_CHANGE_PCT

    def row(self) -> dict[str, Any]:
        return {"term": self.term, "condition": self.condition, "rows": self.rows, "mape_on": self.mape_on,
                "mape_off": self.mape_off, "growth_points": self.growth_points}


def cells(runs: Sequence[RowRun], terms: Sequence[str]) -> list[Cell]:
    """Per (term, condition), in the order of ``terms`` and of the conditions."""
    conditions = list(dict.fromkeys(r.condition for r in runs))
    out = []
    for term in terms:
        for cond in conditions:
            mine = [r for r in runs if r.condition == cond]
            change = max(abs(r.sim_ms[term] / r.sim_ms[BASELINE] - 1) for r in mine)
            out.append(Cell(term=term, condition=cond, rows=len(mine),
                            mape_on=mape(r.err_pct(BASELINE) for r in mine),
                            mape_off=mape(r.err_pct(term) for r in mine), largest_change_pct=100 * change))
    return out


def write_csv(table: Iterable[Cell], path: Path) -> Path:
    return write_rows((c.row() for c in table), COLUMNS, path)


def write_rows_csv(runs: Iterable[RowRun], path: Path) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(ROW_COLUMNS))
        writer.writeheader()
        for r in runs:
            writer.writerows({k: cell(v) for k, v in line.items()} for line in r.rows())
    return path


def plot(table: Sequence[Cell], labels: Mapping[str, str], path: Path, dpi: int = 110) -> Path:
    """Heatmap of growth in points, terms (rows) x conditions (columns), on a scale linear within +-1 point
    and logarithmic beyond; each cell annotated, white where the term changes no prediction of the
    condition's rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import SymLogNorm

    terms = list(dict.fromkeys(c.term for c in table))
    conds = list(dict.fromkeys(c.condition for c in table))
    grid = np.full((len(terms), len(conds)), np.nan)
    inert = np.zeros_like(grid, dtype=bool)
    for c in table:
        i, j = terms.index(c.term), conds.index(c.condition)
        grid[i, j] = c.growth_points
        inert[i, j] = not c.changes
    span = max(1.0, float(np.nanmax(np.abs(grid))))
    fig, ax = plt.subplots(figsize=(1.9 * len(conds) + 2.6, 0.36 * len(terms) + 1.7))
    shown = np.ma.masked_where(inert, grid)
    cmap = plt.get_cmap("RdBu_r").with_extremes(bad="white")
    image = ax.imshow(shown, cmap=cmap, norm=SymLogNorm(linthresh=1.0, vmin=-span, vmax=span), aspect="auto")
    for i in range(len(terms)):
        for j in range(len(conds)):
            v = grid[i, j]
            text = "no change" if inert[i, j] else f"{v:+.1f}"
            dark = not inert[i, j] and abs(v) > span ** 0.6
            ax.text(j, i, text, ha="center", va="center", fontsize=8 if not inert[i, j] else 7,
                    color="white" if dark else ("0.55" if inert[i, j] else "black"))
    ax.set_xticks(range(len(conds)), [labels.get(c, c) for c in conds], fontsize=8.5)
    ax.set_yticks(range(len(terms)), [f"{t} off" for t in terms], fontsize=8.5)
    ax.tick_params(length=0)
    ax.set_xticks(np.arange(len(conds) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(terms) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="0.85", lw=0.6)
    ax.tick_params(which="minor", length=0)
    ax.xaxis.tick_top()
    ticks = [t for t in (-30, -10, -3, -1, 0, 1, 3, 10, 30) if abs(t) <= span]
    bar = fig.colorbar(image, ax=ax, fraction=0.05, pad=0.02, ticks=ticks)
    bar.ax.set_yticklabels([f"{t:+d}" if t else "0" for t in ticks])
    bar.set_label("MAPE growth, points (term off - all on)", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    on = {c.condition: c.mape_on for c in table}
    ax.set_xlabel("MAPE with every term on: " + ", ".join(f"{labels.get(k, k).splitlines()[0]} {v:.1f}%"
                                                           for k, v in on.items()), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


THRESHOLD_POINTS = 1.0
"""Growth of at least this many points counts as the term mattering for the condition."""
HOST_HIDDEN = ("host work, which the engines' overlap scheduler hides under the GPU step: only "
               "max(0, host - GPU) is exposed, and the condition it is for, a step whose host work outlasts "
               "its GPU work (a small model at a small batch, an engine without overlap), is absent from "
               "these rows or too short to show")
WHY_NO_CHANGE = {
    "moe_experts": "dense models have no routed experts",
    "moe_shared": "only models with shared experts have the term",
    "ep_imbalance": "it is priced only with expert parallelism, ep > 1",
    "ep_alltoall": "it is priced only with attention DP and expert parallelism together, attention_dp > 1 "
                   "and ep > 1; a tensor-parallel engine's experts combine through the all-reduce",
    "tp_allreduce": "no row has tp > 1 or an all-reduce after its experts",
    "sampler": "it is priced only where requests sample top-k / top-p: the genai-perf rows on vLLM of the "
               "models whose generation_config sets a top-p, validation.silicon.harness_sampling; "
               "InferenceMAX's client asks for greedy",
    "spec_draft": "it is priced only with MTP draft tokens, engine.speculative",
    "step_host": HOST_HIDDEN,
    "request_host": HOST_HIDDEN,
    "kv_traversal": HOST_HIDDEN,
    "eager_host": "only steps run without CUDA graphs pay it, and only for their host time beyond their GPU "
                  "time",
    "kernel_launch": "only kernels launched outside CUDA graphs pay it",
    "cuda_graph_padding": "only pure-decode batches padded up to a capture size pay it",
    "collective_setup": "it is priced only for a deployment that never captures CUDA graphs, whose "
                        "all-reduces launch eagerly; every row here runs with graphs, so the condition the "
                        "term is for is absent from them",
    "dp_imbalance": "a simulation never prices it: the twin steps attention-DP ranks in lockstep "
                    "(twin.shell.attention_dp, CostModel.price_in_group) and books each rank's wait for the slowest as "
                    "dp_wait, so the simulated wait replaces the term; only a caller pricing one rank alone "
                    "(CostModel.price / step_cost) gets it, so it earns no place in a simulated prediction",
}
"""Why a term changes no prediction of some rows (hardware/MODEL.md, "Ledger terms"; hardware.cost)."""


def report(table: Sequence[Cell], runs: Sequence[RowRun], spec: Mapping[str, Any]) -> str:
    """``summary.md``: every number from the cells and the runs."""
    conds = spec["conditions"]
    lines = ["# Why each cost term exists: one ledger term off at a time", "", _method(runs, spec), "",
             "## Rows", ""]
    for name, c in conds.items():
        rule = ", ".join(f"{k} {v}" for k, v in c["rule"].items())
        mine = [r for r in runs if r.condition == name]
        head = f"**{name}** ({c['metric'].upper()}, W = {condition_waves(spec, name)}; rule: {rule})"
        on = mape(r.err_pct(BASELINE) for r in mine)
        lines.append(f"* {head}: {len(mine)} rows, MAPE {on:.1f}% with every term on: "
                     + "; ".join(_describe(r) for r in mine) + ".")
    terms = list(dict.fromkeys(c.term for c in table))
    names = list(conds)
    by = {(c.term, c.condition): c for c in table}
    lines += ["", "## Growth in points, term x condition", "",
              "MAPE with the term off - MAPE with every term on; \"no change\": no row's prediction moves by "
              f"{NO_CHANGE_PCT:g}% or more.", "",
              "| term off | " + " | ".join(names) + " |", "|---|" + "---|" * len(names),
              "| (MAPE, every term on) | " + " | ".join(f"{by[terms[0], n].mape_on:.1f}%" for n in names)
              + " |"]
    for t in terms:
        lines.append(f"| {t} | " + " | ".join(f"{by[t, n].growth_points:+.1f}" if by[t, n].changes else
                                                "no change" for n in names) + " |")
    matter = [t for t in terms if any(by[t, n].growth_points >= THRESHOLD_POINTS for n in names)]
    inert = [t for t in terms if not any(by[t, n].changes for n in names)]
    lines += ["", "## Verdict", "",
              f"* Terms whose removal costs at least {THRESHOLD_POINTS:g} point of MAPE on some condition: "
              + ", ".join(f"`{t}` ({_best_condition([by[t, n] for n in names])})" for t in matter) + "."]
    if inert:
        lines.append("* Terms whose removal changes no prediction of any row here, and why:")
        lines += [f"  * `{t}`: {WHY_NO_CHANGE.get(t, 'it is not priced on these rows')}." for t in inert]
    lines += ["", "## Term by term", ""]
    lines += [f"* {_term_story(t, [by[t, n] for n in names], runs)}" for t in terms]
    return "\n".join(lines) + "\n"


def _method(runs: Sequence[RowRun], spec: Mapping[str, Any]) -> str:
    conds = spec["conditions"]
    waves = {name: condition_waves(spec, name) for name in conds}
    full = {name: max(protocol(dict(r.row)).waves for r in runs if r.condition == name) for name in conds}
    reduced = [name for name in conds if waves[name] < full[name]]
    text = (f"Aggregated rows of the shipped `{spec['sample']}` sample (validation/data/), each simulated "
            "with its `validation.silicon.row_config(row, waves=W)` config, once with every term on and "
            "once per term with `hardware.disabled_terms: [term]`. Growth = MAPE of the condition's metric "
            "with the term off - MAPE with every term on, in points. Switching a term off can only shorten a "
            "prediction, so growth < 0 means the condition's rows are over-predicted where the term is "
            "priced.")
    if reduced:
        text += (" Changed from the measurement protocol to keep the study short: "
                 + ", ".join(f"the {n} rows are simulated with W = {waves[n]} instead of the protocol's "
                             f"{full[n]}" for n in reduced)
                 + " (the client sends W x concurrency requests, at least 10), for the baseline and every "
                 "ablation alike.")
        if "prefill" in conds and "prefill" not in reduced:
            text += (" The prefill rows keep the protocol's: a mean TTFT depends on the share of requests in "
                     "the first wave, whose prompts queue together.")
    return text


def _describe(r: RowRun) -> str:
    spec = row_spec(dict(r.row))
    assert spec.agg is not None
    par = f"DP{spec.agg.dp}" if spec.agg.dp > 1 else f"TP{spec.agg.tp}"
    par += f" EP{spec.agg.ep}" if spec.agg.ep > 1 else ""
    return (f"{spec.model.split('/')[-1]} {spec.backend} {par} {spec.gpu.replace('_sxm', '').upper()} "
            f"{spec.isl}/{spec.osl} c{spec.concurrency} ({r.err_pct(BASELINE):+.0f}%)")


def _best_condition(row: Sequence[Cell]) -> str:
    best = max(row, key=lambda c: c.growth_points)
    return f"most for {best.condition}, {best.growth_points:+.1f}"


def _moved_most(term: str, condition: str, runs: Sequence[RowRun]) -> str:
    """The condition's row whose prediction the term moves most, with its error on and off."""
    mine = [r for r in runs if r.condition == condition]
    r = max(mine, key=lambda r: abs(r.sim_ms[term] / r.sim_ms[BASELINE] - 1))
    return f"{_describe(r).rsplit(' (', 1)[0]}: {r.err_pct(BASELINE):+.0f}% -> {r.err_pct(term):+.0f}%"


def _term_story(term: str, row: Sequence[Cell], runs: Sequence[RowRun]) -> str:
    family, owner = TERMS[term]
    inert = [c.condition for c in row if not c.changes]
    matters = sorted((c for c in row if c.growth_points >= THRESHOLD_POINTS), key=lambda c: -c.growth_points)
    lowers = [c for c in row if c.growth_points <= -THRESHOLD_POINTS]
    small = [c for c in row if c.changes and abs(c.growth_points) < THRESHOLD_POINTS]
    parts = []
    if matters:
        top = matters[0].condition
        parts.append("matters for " + ", ".join(f"{c.condition} ({c.growth_points:+.1f})" for c in matters)
                     + f"; the {top} row it moves most: {_moved_most(term, top, runs)}")
    if lowers:
        parts.append("its removal lowers the error of " + ", ".join(
            f"{c.condition} ({c.growth_points:+.1f}; mostly {_moved_most(term, c.condition, runs)})"
            for c in lowers) + ": rows the twin over-predicts, so taking any time away lowers their error, "
                     "which says nothing for or against the term")
    if small:
        parts.append("moves " + ", ".join(f"{c.condition} by at most {c.largest_change_pct:.2g}%"
                                            for c in small) + " of a row's prediction (under "
                     f"{THRESHOLD_POINTS:g} point of MAPE)")
    if inert:
        parts.append(f"changes nothing on the {', '.join(inert)} rows"
                     + (f": {WHY_NO_CHANGE[term]}" if term in WHY_NO_CHANGE else ""))
    return f"`{term}` ({family}, {owner}): " + "; ".join(parts) + "."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/term_ablation")
    parser.add_argument("--select", action="store_true",
                        help="print the ids each condition's rule chooses from the sample, and stop")
    args = parser.parse_args(argv)
    spec = study()
    rows = silicon_rows(spec)
    if args.select:
        for name, ids in selection(rows, spec).items():
            print(f"{name}:\n" + "".join(f"  - {i}\n" for i in ids), end="")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, cpu = time.perf_counter(), time.process_time()
    runs = run(rows, spec)
    table = cells(runs, spec["terms"])
    labels = {k: c["label"] for k, c in spec["conditions"].items()}
    paths = [write_csv(table, out / "term_ablation.csv"),
             write_rows_csv(runs, out / "term_ablation_rows.csv"),
             plot(table, labels, out / "term_ablation.png")]
    text = report(table, runs, spec)
    (out / "summary.md").write_text(text, encoding="utf-8")
    print(text, end="")
    sims = len({r.row["id"] for r in runs}) * (1 + len(spec["terms"]))
    print(f"wrote {', '.join(map(str, paths))} and {out / 'summary.md'}: {sims} simulations in "
          f"{time.perf_counter() - start:.0f} s ({time.process_time() - cpu:.0f} s of CPU, one core)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
