"""Serving frontier: throughput per GPU against tokens/s per user, simulated and measured (issue 51).

For each deployment of ``serving_frontier.yaml`` (beside this file) the measured rows are aiconfigurator's
public silicon measurements (copied into ``experiments/data/frontier_measured.csv``, see the README there):
Qwen3-32B on 4 H100 SXM (TP 4, ISL 1,024 / OSL 512) under vLLM, SGLang and TensorRT-LLM, and DeepSeek-R1 on
8 H200 SXM (ISL 1,024 / OSL 1,024) under SGLang (TP 8) and TensorRT-LLM (TP 8 / EP 8, and attention DP 8 /
EP 8); the sample has no model with rows of all three engines on H200, and no vLLM DeepSeek-R1 rows. Each
measured row is simulated with the twin config ``validation.silicon.row_config`` builds for it (the row's
GPU, engine, weight format, parallelism, its harness's engine limits and benchmark client), so the sweep of
concurrency is the measured one.

A point of the frontier is (1000 / TPOT, throughput per GPU) from the mean TTFT and TPOT, as aiconfigurator
draws it: a closed-loop client of concurrency c completes c requests per request latency TTFT + (OSL - 1) x
TPOT, so throughput per GPU = c x OSL / (TTFT + (OSL - 1) x TPOT) / GPUs, where OSL is the client's mean
output length (InferenceMAX draws lengths from [0.8 L, L]: 0.9 L; genai-perf sends L). The same rule makes
the measured and the simulated points; the simulation's own output throughput is in the CSV beside it.

Writes ``serving_frontier.csv`` (one row per measured row: its deployment, measured and simulated TTFT, TPOT
and frontier coordinates), ``serving_frontier.png`` (one panel per model: a simulated curve per deployment,
the measured points on top, labelled with their concurrency) and ``summary.md``.

    python experiments/serving_frontier.py --out out/serving_frontier
    python experiments/serving_frontier.py --extract ../shared/data/measured/silicon_h100_h200.csv  # the rows
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import attrs

from experiments.tables import finish, write_rows
from twin.config import load_config
from twin.config_codec import read_yaml
from twin.runner import Simulation
from validation.silicon import client_warmup, measured_means, protocol, read_rows, row_config, row_spec

STUDY = Path(__file__).with_suffix(".yaml")
ENGINES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TRT-LLM"}
COLOURS = {"vllm": "tab:blue", "sglang": "tab:orange", "trtllm": "tab:green"}
COLUMNS = ("model", "gpu", "deployment", "backend", "weights", "gpus", "concurrency", "mean_osl",
           "measured_ttft_ms", "measured_tpot_ms", "sim_ttft_ms", "sim_tpot_ms", "tpot_err_pct",
           "measured_tokens_per_s_per_user", "sim_tokens_per_s_per_user", "measured_tokens_per_s_per_gpu",
           "sim_tokens_per_s_per_gpu", "gpu_rate_err_pct", "sim_output_tokens_per_s_per_gpu", "client_warmup",
           "row_id")


def study() -> dict[str, Any]:
    """``serving_frontier.yaml`` as a mapping."""
    return read_yaml(STUDY)


def measured_path(spec: Mapping[str, Any]) -> Path:
    return STUDY.parent / spec["measured"]


def layout(row: dict[str, str]) -> tuple[str, int, int, int]:
    """(backend, tp, attention dp, ep) of an aggregated row as the twin reads it (export quirks corrected)."""
    par = row_spec(row).agg
    assert par is not None
    return row["backend"], par.tp, par.dp, par.ep


def panel_of(row: dict[str, str], panels: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the study panel whose deployments include the row, else None."""
    if row.get("mode") != "agg":
        return None
    for i, p in enumerate(panels):
        what = (row["model_path"], row["system"], int(row["isl"]), int(row["osl"]))
        if what != (p["model"], p["gpu"], p["isl"], p["osl"]):
            continue
        if "source_file" in p and f"source_file={p['source_file']}" not in row.get("silicon_data_source", ""):
            continue
        if layout(row) in {(d["backend"], d["tp"], d["dp"], d["ep"]) for d in p["deployments"]}:
            return i
    return None


def extract(source: Path, spec: Mapping[str, Any], out: Path) -> int:
    """Copy the rows of ``source`` (the silicon sample) that the study plots into ``out``, every column kept,
    one row per (deployment, concurrency): the first in the file. Returns the rows written."""
    rows = read_rows(source)
    seen: set[tuple[Any, ...]] = set()
    keep = []
    for row in rows:
        i = panel_of(row, spec["panels"])
        if i is None:
            continue
        key = (i, *layout(row), row_spec(row).concurrency)
        if key not in seen:
            seen.add(key)
            keep.append(row)
    with open(source, encoding="utf-8-sig", newline="") as fh:
        fields = next(csv.reader(fh))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(keep)
    return len(keep)


def frontier_rate(concurrency: int, mean_osl: float, ttft_ms: float, tpot_ms: float, gpus: int) -> float:
    """Output tokens/s per GPU of a closed loop of ``concurrency`` at these mean latencies."""
    return concurrency * mean_osl / ((ttft_ms + (mean_osl - 1) * tpot_ms) / 1e3) / gpus


@attrs.frozen(kw_only=True)
class Point:
    """One measured row and its simulation."""

    row_id: str
    model: str
    gpu: str
    backend: str
    tp: int
    dp: int
    ep: int
    weights: str
    isl: int
    osl: int
    """The row's nominal lengths (the client may draw shorter ones: mean_osl)."""
    concurrency: int
    mean_osl: float
    measured_ttft_ms: float
    measured_tpot_ms: float
    sim_ttft_ms: float
    sim_tpot_ms: float
    sim_output_tokens_per_s: float
    client_warmup: str = "unknown"
    """Whether the measuring client warmed the server up first (validation.silicon.client_warmup)."""

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def deployment(self) -> str:
        ep = f" EP{self.ep}" if self.ep > 1 else ""
        par = f"DP{self.dp}{ep}" if self.dp > 1 else f"TP{self.tp}{ep}"
        weights = self.weights.upper().replace("_BLOCK", "")
        return f"{ENGINES.get(self.backend, self.backend)} {par} ({weights})"

    def user_rate(self, sim: bool) -> float:
        return 1e3 / (self.sim_tpot_ms if sim else self.measured_tpot_ms)

    def gpu_rate(self, sim: bool) -> float:
        if sim:
            ttft, tpot = self.sim_ttft_ms, self.sim_tpot_ms
        else:
            ttft, tpot = self.measured_ttft_ms, self.measured_tpot_ms
        return frontier_rate(self.concurrency, self.mean_osl, ttft, tpot, self.gpus)

    def row(self) -> dict[str, Any]:
        return {"model": self.model, "gpu": self.gpu, "deployment": self.deployment, "backend": self.backend,
                "weights": self.weights, "gpus": self.gpus, "concurrency": self.concurrency,
                "mean_osl": self.mean_osl, "measured_ttft_ms": self.measured_ttft_ms,
                "measured_tpot_ms": self.measured_tpot_ms, "sim_ttft_ms": self.sim_ttft_ms,
                "sim_tpot_ms": self.sim_tpot_ms,
                "tpot_err_pct": 100 * (self.sim_tpot_ms / self.measured_tpot_ms - 1),
                "measured_tokens_per_s_per_user": self.user_rate(False),
                "sim_tokens_per_s_per_user": self.user_rate(True),
                "measured_tokens_per_s_per_gpu": self.gpu_rate(False),
                "sim_tokens_per_s_per_gpu": self.gpu_rate(True),
                "gpu_rate_err_pct": 100 * (self.gpu_rate(True) / self.gpu_rate(False) - 1),
                "sim_output_tokens_per_s_per_gpu": self.sim_output_tokens_per_s / self.gpus,
                "client_warmup": self.client_warmup, "row_id": self.row_id}


def simulate(row: dict[str, str]) -> Point:
    """Run the row's twin config (validation.silicon.row_config) and pair it with the row's measurement."""
    spec = row_spec(row)
    assert spec.agg is not None
    res = Simulation(load_config(row_config(row))).run()
    if res.summary["requests"]["failed"]:
        raise RuntimeError(f"{row['id']}: {res.summary['requests']['failed']} simulated requests failed: "
                           f"{res.summary['fail_reasons']}")
    ttft_s, tpot_s, _ = measured_means(res.requests)
    return Point(row_id=row["id"], model=spec.model, gpu=spec.gpu, backend=spec.backend, tp=spec.agg.tp,
                 dp=spec.agg.dp, ep=spec.agg.ep, weights=spec.weight_dtype, isl=spec.isl, osl=spec.osl,
                 concurrency=spec.concurrency,
                 mean_osl=spec.osl * (1 + protocol(row).low_frac) / 2,
                 measured_ttft_ms=float(row["silicon_ttft_ms"]),
                 measured_tpot_ms=float(row["silicon_tpot_ms"]),
                 sim_ttft_ms=ttft_s * 1e3, sim_tpot_ms=tpot_s * 1e3,
                 sim_output_tokens_per_s=float(res.summary["throughput"]["output_tokens_per_s"]),
                 client_warmup=client_warmup(row))


def run(rows: Iterable[dict[str, str]]) -> list[Point]:
    """Every row simulated, each deployment's points in order of concurrency."""
    points = [simulate(r) for r in rows]
    return sorted(points, key=lambda p: (p.model, p.backend, p.dp, p.tp, p.concurrency))


def write_csv(points: Iterable[Point], path: Path) -> Path:
    return write_rows((p.row() for p in points), COLUMNS, path)


def deployments(points: Sequence[Point]) -> dict[tuple[str, str], list[Point]]:
    """The points by (model, deployment), in the order given."""
    out: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        out.setdefault((p.model, p.deployment), []).append(p)
    return out


def plot(points: Sequence[Point], path: Path, dpi: int = 90) -> Path:
    """One panel per model: per deployment a simulated curve over its concurrencies (line, open markers) and
    the measured points (filled), labelled with their concurrency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    models = list(dict.fromkeys(p.model for p in points))
    fig, axes = plt.subplots(1, len(models), figsize=(5.6 * len(models), 4.6), squeeze=False)
    styles = ["-", "--", ":"]
    for ax, model in zip(axes[0], models):
        seen: dict[str, int] = {}
        for (m, name), mine in deployments(points).items():
            if m != model:
                continue
            colour = COLOURS.get(mine[0].backend, "0.3")
            style = styles[seen.setdefault(mine[0].backend, 0) % len(styles)]
            seen[mine[0].backend] += 1
            ax.plot([p.user_rate(True) for p in mine], [p.gpu_rate(True) for p in mine], style, color=colour,
                    marker="o", mfc="white", ms=4, lw=1.4,
                    label=f"{name} (c {mine[0].concurrency}-{mine[-1].concurrency})")
            ax.scatter([p.user_rate(False) for p in mine], [p.gpu_rate(False) for p in mine], color=colour,
                       marker="D", s=22, zorder=3, edgecolor="black", lw=0.4)
            for p in mine:
                ax.annotate(str(p.concurrency), (p.user_rate(False), p.gpu_rate(False)), fontsize=6,
                            xytext=(3, 3), textcoords="offset points", color=colour)
        first = next(p for p in points if p.model == model)
        ax.set_title(f"{model} on {first.gpu.replace('_sxm', '').upper()} SXM, ISL {first.isl:,} / OSL "
                     f"{first.osl:,}", fontsize=9, loc="left")
        ax.set_xlabel("tokens/s per user (1000 / TPOT ms)", fontsize=8)
        ax.set_ylabel("output tokens/s per GPU", fontsize=8)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        handles, labels = ax.get_legend_handles_labels()
        handles += [Line2D([], [], color="0.3", marker="o", mfc="white", ms=4, lw=1.2),
                    Line2D([], [], color="0.3", marker="D", ms=4, lw=0, markeredgecolor="black")]
        labels += ["simulated (line)", "measured (aiconfigurator; label: concurrency)"]
        ax.legend(handles, labels, fontsize=6.5, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def report(points: Sequence[Point]) -> str:
    """``summary.md``: every number from the points."""
    lines = ["# Serving frontier: simulated vs measured", "",
             "Each measured aggregated row (aiconfigurator's silicon sample, "
             "`experiments/data/frontier_measured.csv`) simulated with `validation.silicon.row_config`. A "
             "point is (1000 / TPOT, c x OSL / (TTFT + (OSL - 1) x TPOT) / GPUs) from the mean TTFT and "
             "TPOT, measured or simulated alike. Errors are simulated against measured.", "",
             "| model | deployment | concurrency | TPOT error, median (range) "
             "| tokens/s/GPU error, median (range) |",
             "|---|---|---|---|---|"]
    groups = deployments(points)
    for (model, name), mine in groups.items():
        t = [p.row()["tpot_err_pct"] for p in mine]
        g = [p.row()["gpu_rate_err_pct"] for p in mine]
        lines.append(f"| {model} | {name} | {', '.join(str(p.concurrency) for p in mine)} | "
                     f"{statistics.median(t):+.0f}% ({min(t):+.0f} to {max(t):+.0f}) | "
                     f"{statistics.median(g):+.0f}% ({min(g):+.0f} to {max(g):+.0f}) |")
    lines += ["", "## What the figure shows", ""]
    for model in dict.fromkeys(p.model for p in points):
        lines.append(f"* {_model_story(model, points)}")
    return "\n".join(lines) + "\n"


def _best(points: Sequence[Point], sim: bool) -> Point:
    return max(points, key=lambda p: p.gpu_rate(sim))


def _model_story(model: str, points: Sequence[Point]) -> str:
    mine = [p for p in points if p.model == model]
    groups = {name: ps for (m, name), ps in deployments(mine).items()}
    order = {sim: sorted(groups, key=lambda n: -_best(groups[n], sim).gpu_rate(sim)) for sim in (False, True)}
    meas, simu = _best(mine, False), _best(mine, True)
    text = (f"**{model}**: measured, the highest throughput per GPU is {meas.deployment}'s "
            f"{meas.gpu_rate(False):,.0f} tokens/s at concurrency {meas.concurrency} "
            f"({meas.user_rate(False):.0f} tokens/s per user); simulated, {simu.deployment}'s "
            f"{simu.gpu_rate(True):,.0f} at {simu.concurrency} ({simu.user_rate(True):.0f} per user). "
            f"Deployments by their best throughput per GPU, measured: {' > '.join(order[False])}; simulated: "
            f"{' > '.join(order[True])}")
    text += " (the same order)." if order[False] == order[True] else " (the order differs)."
    worst = max(mine, key=lambda p: abs(p.row()["gpu_rate_err_pct"]))
    w = worst.row()
    text += (f" The largest gap is {worst.deployment} at concurrency {worst.concurrency}: "
             f"{w['sim_tokens_per_s_per_gpu']:,.0f} simulated against "
             f"{w['measured_tokens_per_s_per_gpu']:,.0f} measured tokens/s per GPU (TTFT "
             f"{worst.sim_ttft_ms:,.0f} vs {worst.measured_ttft_ms:,.0f} ms, TPOT "
             f"{worst.sim_tpot_ms:.1f} vs {worst.measured_tpot_ms:.1f} ms)")
    cold = [p for p in groups[worst.deployment] if p.client_warmup == "no warm-up"]
    if cold:
        many = "all" if len(cold) == len(groups[worst.deployment]) else str(len(cold))
        text += (f"; the client of {many} of that deployment's measured rows ran without a warm-up, so their "
                 f"TTFT may hold first-request costs "
                 f"(compilation, autotuning) the twin does not model")
    return text + "."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/serving_frontier")
    parser.add_argument("--extract", metavar="SILICON_CSV", default=None,
                        help="copy the study's rows from this silicon sample into the measured CSV, and stop")
    args = parser.parse_args(argv)
    spec = study()
    if args.extract:
        n = extract(Path(args.extract), spec, measured_path(spec))
        print(f"wrote {n} rows to {measured_path(spec)}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    points = run(read_rows(measured_path(spec)))
    csv_path = write_csv(points, out / "serving_frontier.csv")
    png = plot(points, out / "serving_frontier.png")
    finish(out, report(points), [csv_path, png], start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
