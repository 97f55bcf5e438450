"""Plots of a results folder: gauges over time and latency CDFs (matplotlib, no display needed).

``timeseries.png`` has one panel per role and resource, each drawn only when the run has it: the queue and
running requests of colocated workers, or of the prefill workers and of the decode workers (staged requests
waiting for their KV); agent sessions in tool waits; KV usage per tier; staged KV on the prefill workers;
KV-link utilisation (0-1); output throughput; the prefix-hit rate; preemptions and failures. Workers are
named by role (``prefill0``, ``decode0``; ``worker0`` when colocated), all panels share the time axis, and
the title names the deployment and the workload. ``plot_results(run, compare=other)`` overlays two runs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Collection, Iterator, Literal, Sequence

import attrs
import numpy as np

PLOT_NAMES = ("timeseries.png", "latency_cdf.png")
"""The figures :func:`plot_results` writes."""
COMPARE_NAMES = ("timeseries_compare.png", "latency_cdf_compare.png")
"""The figures :func:`plot_results` writes when it overlays a second run."""
MAX_WORKER_LINES = 4
"""A role with more workers than this is drawn as totals (queues, staged KV) or mean and max (KV usage)."""
HIT_WINDOWS_PER_RUN = 20
"""The default hit-rate window is the run's admitted prompt tokens over this (rounded to 1, 2 or 5 x 10^k)."""


def read_csv_columns(path: Path, numeric: Collection[str] | Literal["all"] = ()) -> dict[str, np.ndarray]:
    """Numeric columns of a CSV written by :mod:`twin.results` (empty cells are NaN; text columns kept).

    The columns named in ``numeric`` (or every column, ``"all"``) must be there and hold numbers: a
    hand-edited cell is an error naming its line, not a column silently read as text.
    """
    # Decoded here, not by open(): a byte that is not UTF-8 then names its line (UnicodeDecodeError named
    # neither file nor line); utf-8-sig: a byte-order mark (a spreadsheet's UTF-8 export) is not part of the
    # first column's name, as the workload readers take it.
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"{path}, line {line}: not UTF-8 text ({exc.reason}), as twin.results writes it") \
            from None
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: list[tuple[int, list[str]]] = []
    try:
        for row in reader:
            if row:  # (a blank line, a hand edit's trailing newline, holds no cells; never written)
                rows.append((reader.line_num, row))
    except csv.Error as exc:  # (a cell past the field limit: the csv module's own error, no ValueError)
        raise ValueError(f"{path}, line {reader.line_num}: not readable as CSV ({exc})") from None
    if not rows:
        raise ValueError(f"{path}: empty file")
    header, body = rows[0][1], rows[1:]
    for n, r in body:
        if len(r) != len(header):
            raise ValueError(f"{path}, line {n}: {len(r)} cells where the header has {len(header)} (a cut-off file?)")
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:  # (the later column used to replace the earlier without a word)
        raise ValueError(f"{path}: the header names column {repeated[0]!r} twice")
    must = set(header) if numeric == "all" else set(numeric)
    missing = sorted(must - set(header))
    if missing:
        raise ValueError(f"{path}: expected a numeric column {missing[0]!r}")
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(header):
        values = np.empty(len(body), dtype=np.float64)
        for j, (n, r) in enumerate(body):
            cell = r[i]
            try:
                values[j] = float(cell) if cell != "" else np.nan
            except ValueError:
                if name in must:
                    raise ValueError(f"{path}, line {n}: column {name!r} holds {cell[:40]!r}: expected a "
                                     f"number (or an empty cell for none)") from None
                out[name] = np.array([r[i] for _, r in body], dtype=object)
                break
        else:
            out[name] = values
    return out


# ------------------------------------------------------------------------------------------- a run's data
@attrs.frozen(kw_only=True)
class Worker:
    """A worker as the plots name it: its column prefix (``w3``), role and name (``decode0``)."""

    wid: int
    role: str
    """prefill, decode or colocated."""
    name: str
    pool_blocks: int | None = None


@attrs.frozen(kw_only=True)
class RunData:
    """What the plots read from a results folder."""

    name: str
    timeseries: dict[str, np.ndarray]
    requests: dict[str, np.ndarray]
    config: dict[str, Any]
    summary: dict[str, Any]
    workers: tuple[Worker, ...]
    warmup_s: float = 0.0

    @property
    def time_s(self) -> np.ndarray:
        return self.timeseries["time_s"]

    def role(self, role: str) -> list[Worker]:
        return [w for w in self.workers if w.role == role]


def load_run(folder: str | Path) -> RunData:
    """Read a folder written by ``twin run --out`` (``timeseries.csv`` and ``requests.csv`` needed; the
    config and summary are used where present, for the title and the workers' roles)."""
    src = Path(folder)
    for name in ("timeseries.csv", "requests.csv"):
        if not (src / name).is_file():
            raise FileNotFoundError(f"{src / name} not found: is {src} a folder written by `twin run --out`?")
    ts = read_csv_columns(src / "timeseries.csv", "all")  # (every gauge a number: text plotted as categories)
    if "time_s" not in ts:
        raise ValueError(f"{src / 'timeseries.csv'}: expected a numeric column 'time_s'")
    req = read_csv_columns(src / "requests.csv", ("ttft_s", "tpot_s", "e2e_s"))
    warmup = _warmup_s(src / "config.yaml")
    config = _read_config(src / "config.yaml")
    summary: dict[str, Any] = {}
    if (src / "summary.json").is_file():
        try:
            loaded = json.loads((src / "summary.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{src / 'summary.json'}: not the JSON `twin run --out` writes ({exc})") \
                from None
        summary = loaded if isinstance(loaded, dict) else {}
    return RunData(name=src.resolve().name, timeseries=ts, requests=req, config=config, summary=summary,
                   workers=_workers(ts, summary), warmup_s=warmup)


def _workers(ts: dict[str, np.ndarray], summary: dict[str, Any]) -> tuple[Worker, ...]:
    """The run's workers by role, as ``summary.json``'s ``kv_capacity`` lists them (``decode0``, decode);
    without it, every worker with gauges in the time series (``worker0_waiting``, ``prefill0_waiting`` ...),
    its role read from its name."""
    listed: list[tuple[str, str, int | None]] = []
    for entry in summary.get("kv_capacity") or []:
        try:
            listed.append((str(entry["worker"]), str(entry.get("role", "colocated")), int(entry["blocks"])))
        except (KeyError, TypeError, ValueError):
            continue
    if not listed:
        names = sorted({c.split("_")[0] for c in ts if _WORKER_NAME.fullmatch(c.split("_")[0])},
                       key=lambda n: (n.rstrip("0123456789"), int(n[len(n.rstrip("0123456789")):])))
        listed = [(n, "colocated" if n.startswith("worker") else n.rstrip("0123456789"), None) for n in names]
    return tuple(Worker(wid=i, role=role, name=name, pool_blocks=blocks)
                 for i, (name, role, blocks) in enumerate(listed))


_WORKER_NAME = re.compile(r"(worker|prefill|decode)\d+")


def _read_config(path: Path) -> dict[str, Any]:
    """The folder's ``config.yaml`` as a mapping ({} without one; :func:`_warmup_s` has checked it parses)."""
    import yaml

    if not path.is_file():
        return {}
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    return config if isinstance(config, dict) else {}


# ------------------------------------------------------------------------------------------ hit rate
def hit_rate(requests: dict[str, np.ndarray], times_s: np.ndarray, window_tokens: float) -> np.ndarray:
    """Prefix-hit rate at each of ``times_s`` over a trailing window of admitted prompt tokens.

    Cached over prompt tokens of the requests admitted last by then (by ``first_scheduled_s``, whole
    requests, the fewest holding at least ``window_tokens`` prompt tokens; all of them while fewer have been
    admitted). So the rate is defined at every sample from the first admission on, however bursty the
    admissions (a gauge over one sample interval is empty whenever no prompt was admitted in it), and at the
    end of the run the window's rate is the summary's when the window spans the run.
    """
    when = requests["first_scheduled_s"]
    admitted = np.isfinite(when)
    order = np.argsort(when[admitted], kind="stable")
    when = when[admitted][order]
    prompt = np.nan_to_num(requests["prompt_tokens"][admitted][order])
    cached = np.nan_to_num(requests["cached_tokens"][admitted][order])
    cum_prompt = np.concatenate([[0.0], np.cumsum(prompt)])
    cum_cached = np.concatenate([[0.0], np.cumsum(cached)])
    end = np.searchsorted(when, times_s, side="right")
    start = np.maximum(np.searchsorted(cum_prompt, cum_prompt[end] - window_tokens, side="right") - 1, 0)
    tokens = cum_prompt[end] - cum_prompt[start]
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = (cum_cached[end] - cum_cached[start]) / tokens
    return np.where(tokens > 0, rate, np.nan)


def has_admissions(requests: dict[str, np.ndarray]) -> bool:
    """Whether a requests table has the numeric columns :func:`hit_rate` reads (a hand-made one may not)."""
    cols = ("first_scheduled_s", "prompt_tokens", "cached_tokens")
    return all(c in requests and requests[c].dtype == np.float64 for c in cols)


def default_hit_window(requests: dict[str, np.ndarray]) -> int:
    """The run's admitted prompt tokens over :data:`HIT_WINDOWS_PER_RUN`, rounded to 1, 2 or 5 x 10^k."""
    if not has_admissions(requests):
        return 1
    admitted = np.isfinite(requests["first_scheduled_s"])
    total = float(np.nansum(requests["prompt_tokens"][admitted])) / HIT_WINDOWS_PER_RUN
    if not total >= 1:
        return 1
    exp = math.floor(math.log10(total))
    return min((m * 10**exp for m in (1, 2, 5, 10)), key=lambda v: abs(math.log(v / total)))


def tokens_label(n: float) -> str:
    """1,500 -> '1.5k'; 2,000,000 -> '2M'."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


# --------------------------------------------------------------------------------------------- panels
@attrs.frozen(kw_only=True)
class Series:
    label: str
    values: np.ndarray


@attrs.frozen(kw_only=True)
class Panel:
    """One axis of the time-series figure: a title, a y label and its lines, by label."""

    title: str
    ylabel: str
    series: tuple[Series, ...]
    ylim: tuple[float, float] | None = None
    legend: bool = False
    """Name the lines even when there is one (otherwise only two or more are named)."""


PANEL_TITLES = ("requests: waiting and running", "prefill: waiting and running",
                "decode: waiting for KV and running", "sessions and tool waits", "KV usage",
                "staged KV on prefill", "KV link utilisation", "output throughput", "prefix-hit rate",
                "preemptions and failures")
"""Every panel the time-series figure can have, in its order."""


def timeseries_panels(run: RunData, hit_window_tokens: float | None = None) -> list[Panel]:
    """The panels of ``run``'s time-series figure: those its deployment and workload have."""
    ts = run.timeseries
    colocated, prefill, decode = run.role("colocated"), run.role("prefill"), run.role("decode")
    queue = [("waiting", "waiting"), ("running", "running")]
    if not run.workers:  # (a hand-made file: the totals over all workers, where it has them)
        colocated = [Worker(wid=-1, role="colocated", name="all workers")]
    panels = [
        _role_panel(PANEL_TITLES[0], "requests", ts, colocated, queue),
        _role_panel(PANEL_TITLES[1], "requests", ts, prefill, queue),
        _role_panel(PANEL_TITLES[2], "requests", ts, decode,
                    [("pull_queue", "staged, waiting for KV"), ("running", "running"),
                     ("waiting", "waiting to (re)compute")]),
    ]
    if np.nanmax(ts.get("sessions_in_wait", np.zeros(1)), initial=0) > 0:
        panels.append(Panel(title=PANEL_TITLES[3], ylabel="sessions", series=(
            Series(label="active", values=ts["sessions_active"]),
            Series(label="in a tool / think wait", values=ts["sessions_in_wait"]))))
    panels.append(_kv_usage(ts, colocated + prefill + decode))
    panels.append(_staged(ts, prefill))
    if "link_util_max" in ts:
        link = Series(label="busiest link", values=ts["link_util_max"])
        panels.append(Panel(title=PANEL_TITLES[6], ylabel="busiest link's\nshare of bandwidth",
                            series=(link,), ylim=(0, 1.05)))
    if "output_tokens_per_s" in ts:
        panels.append(Panel(title=PANEL_TITLES[7], ylabel="output tokens / s",
                            series=(Series(label="output tokens / s", values=ts["output_tokens_per_s"]),)))
    if has_admissions(run.requests):
        window = hit_window_tokens if hit_window_tokens is not None else default_hit_window(run.requests)
        panels.append(Panel(title=PANEL_TITLES[8], ylim=(0, 1.05),
                            ylabel=f"hit rate, last {tokens_label(window)}\nadmitted prompt tokens",
                            series=(Series(label="hit rate",
                                           values=hit_rate(run.requests, run.time_s, window)),)))
    panels.append(_disruptions(run))
    return [p for p in panels if p.series]


def _column(w: Worker, col: str) -> str:
    """A worker's gauge in timeseries.csv (wid -1: the total over all workers)."""
    return col if w.wid < 0 else f"{w.name}_{col}"


def _role_panel(title: str, ylabel: str, ts: dict[str, np.ndarray], workers: Sequence[Worker],
                columns: Sequence[tuple[str, str]]) -> Panel:
    """One line per worker and column (``decode0 running``), or each column's total over the role when it
    has more than :data:`MAX_WORKER_LINES` workers; a column that stays at 0 (or is absent) is left out
    unless it is the first or second (the queue and running count a reader looks for)."""
    series = []
    for i, (col, label) in enumerate(columns):
        have = [w for w in workers if _column(w, col) in ts]
        if not have:
            continue
        if len(have) > MAX_WORKER_LINES:
            total = np.sum([ts[_column(w, col)] for w in have], axis=0)
            items = [(f"{have[0].role} x{len(have)} total {label}", total)]
        else:
            items = [(f"{w.name} {label}", ts[_column(w, col)]) for w in have]
        for name, values in items:
            if i < 2 or np.nanmax(values, initial=0) > 0:
                series.append(Series(label=name, values=values))
    return Panel(title=title, ylabel=ylabel, series=tuple(series))


def _kv_usage(ts: dict[str, np.ndarray], workers: Sequence[Worker]) -> Panel:
    """Used share of each worker's GPU KV pool and, where it has one, of its host tier."""
    tiers = [("kv_usage", "GPU"), ("host_usage", "host")]
    has_host = any(_column(w, "host_usage") in ts for w in workers)
    series = []
    for role in ("colocated", "prefill", "decode"):
        mine = [w for w in workers if w.role == role]
        for col, tier in tiers:
            have = [w for w in mine if _column(w, col) in ts]
            suffix = f" {tier}" if has_host else ""
            if len(have) > MAX_WORKER_LINES:
                values = np.array([ts[_column(w, col)] for w in have])
                series += [Series(label=f"{role} x{len(have)} mean{suffix}", values=values.mean(axis=0)),
                           Series(label=f"{role} x{len(have)} max{suffix}", values=values.max(axis=0))]
            else:
                series += [Series(label=f"{w.name}{suffix}", values=ts[_column(w, col)]) for w in have]
    return Panel(title=PANEL_TITLES[4], ylabel="used share of pool", series=tuple(series), ylim=(0, 1.05))


def _staged(ts: dict[str, np.ndarray], prefill: Sequence[Worker]) -> Panel:
    """KV held on each prefill worker for requests whose decode worker has not taken it yet, in blocks (the
    worker's pool size in the legend: staged KV filling it stops new prefills)."""
    have = [w for w in prefill if f"staged_blocks_{w.name}" in ts]
    if len(have) > MAX_WORKER_LINES:
        series = [Series(label=f"prefill x{len(have)} total",
                         values=np.sum([ts[f"staged_blocks_{w.name}"] for w in have], axis=0))]
    else:
        series = [Series(label=w.name + (f" (pool {w.pool_blocks:,})" if w.pool_blocks else ""),
                         values=ts[f"staged_blocks_{w.name}"]) for w in have]
    return Panel(title=PANEL_TITLES[5], ylabel="KV blocks", series=tuple(series))


def _disruptions(run: RunData) -> Panel:
    """Preemptions, lease expiries and failed requests so far (only those the run has)."""
    ts, req = run.timeseries, run.requests
    series = []
    for col, label in (("preemptions", "preemptions"), ("lease_expiries", "lease expiries (recompute)")):
        if col in ts and np.nanmax(ts[col], initial=0) > 0:
            series.append(Series(label=label, values=ts[col]))
    if "status" in req and req["status"].dtype == object and "finish_s" in req:
        failed = np.sort(req["finish_s"][(req["status"] == "failed") & np.isfinite(req["finish_s"])])
        if len(failed):
            values = np.searchsorted(failed, run.time_s, side="right").astype(np.float64)
            series.append(Series(label="failed requests", values=values))
    return Panel(title=PANEL_TITLES[9], ylabel="count so far", series=tuple(series), legend=True)


# -------------------------------------------------------------------------------------------- titles
def describe(run: RunData) -> str:
    """Two lines naming the run's deployment and its workload, from its ``config.yaml``."""
    cfg = run.config
    model = str((cfg.get("model") or {}).get("name", "?")).split("/")[-1]
    gpu = str((cfg.get("hardware") or {}).get("gpu", "?"))
    system = cfg.get("system") or {}
    if system.get("kind") == "disaggregated":
        transfer = (cfg.get("transfer") or {}).get("kind", "pull")
        pools = " + ".join(f"{(system.get(r) or {}).get('workers', 1)} {r} ({_parallel(system.get(r) or {})})"
                           for r in ("prefill", "decode"))
        deployment = f"{pools}, KV {transfer}"
    elif system:
        n = system.get("replicas", 1)
        deployment = f"{n} replica{'s' if n != 1 else ''} ({_parallel(system)})"
    else:
        deployment = "deployment unknown"
    name = cfg.get("name") or run.name
    label = f"{run.name} ({name})" if name != run.name else name
    return f"{label}: {model} on {gpu}, {deployment}\n{_workload(cfg.get('workload') or {})}"


def _parallel(pool: dict[str, Any]) -> str:
    parts = [f"TP{pool.get('tp', 1)}"]
    if (pool.get("ep") or 1) > 1:
        parts.append(f"EP{pool['ep']}")
    if (pool.get("attention_dp") or 1) > 1:
        parts.append(f"attention DP{pool['attention_dp']}")
    if pool.get("num_blocks"):
        parts.append(f"{pool['num_blocks']:,} KV blocks")
    return ", ".join(parts)


def _workload(wl: dict[str, Any]) -> str:
    kind = wl.get("kind", "?")
    arrival = _arrival(wl.get("arrival") or {})
    if kind == "lmbenchmark_multiround":
        return (f"LMBenchmark multi-round QA: {wl.get('num_users')} users x {wl.get('num_rounds')} rounds, "
                f"qps {wl.get('qps')}, {wl.get('shared_system_prompt')} shared + "
                f"{wl.get('user_history_prompt')} history tokens, {wl.get('answer_len')}-token answers")
    if kind == "sessions":
        text = f"agent sessions: {Path(str(wl.get('path', '?'))).name}"
        if wl.get("limit"):
            text += f" (first {wl['limit']})"
        if wl.get("max_concurrent_sessions"):
            text += f", at most {wl['max_concurrent_sessions']} at once"
        return text + (f", {arrival}" if arrival else "")
    if kind == "synthetic":
        return f"synthetic: {wl.get('num_requests')} requests" + (f", {arrival}" if arrival else "")
    if kind == "trace_csv":
        return f"trace: {Path(str(wl.get('path', '?'))).name}"
    return f"workload: {kind}"


def _arrival(arrival: dict[str, Any]) -> str:
    kind = arrival.get("kind")
    if kind == "poisson":
        return f"Poisson {arrival.get('rate_per_s')}/s"
    if kind == "gamma":
        return f"gamma {arrival.get('rate_per_s')}/s (CV {arrival.get('cv')})"
    if kind == "concurrency":
        return f"{arrival.get('concurrency')} in flight"
    if kind == "all_at_once":
        return "all at once"
    return "" if kind in (None, "trace") else str(kind)


# ------------------------------------------------------------------------------------------- drawing
RUN_STYLES: tuple[Literal["-", "--"], ...] = ("-", "--")
"""Line style of the first and the second run when two are overlaid (colour tells the series apart)."""
PAPER_RC: dict[Any, Any] = {
    "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 7.5, "xtick.labelsize": 7, "ytick.labelsize": 7,
    "legend.fontsize": 6.5, "lines.linewidth": 1.1, "axes.grid": True, "grid.alpha": 0.3}
"""Sizes readable at paper print size: a 7.2-inch figure (two-column page width) at 8 pt."""
WIDTH_IN = 7.2


def plot_results(folder: str | Path, out: str | Path | None = None, *, compare: str | Path | None = None,
                 hit_window_tokens: float | None = None) -> list[Path]:
    """Write ``timeseries.png`` and ``latency_cdf.png`` for a results folder; returns their paths.

    With ``compare`` (a second results folder) both runs are overlaid, the first in solid and the second in
    dashed lines, in ``timeseries_compare.png`` and ``latency_cdf_compare.png``. The hit-rate window is
    ``hit_window_tokens`` admitted prompt tokens (default: :func:`default_hit_window` of the first run).
    """
    import matplotlib

    matplotlib.use("Agg")

    if hit_window_tokens is not None and not 0 < hit_window_tokens < math.inf:
        raise ValueError(f"the hit-rate window is {hit_window_tokens} prompt tokens; expected a number > 0")
    runs = [load_run(folder)] + ([load_run(compare)] if compare is not None else [])
    dst = Path(out) if out is not None else Path(folder)
    dst.mkdir(parents=True, exist_ok=True)  # (only once the inputs are known good: no stray empty folder)
    names = COMPARE_NAMES if compare is not None else PLOT_NAMES
    window = hit_window_tokens if hit_window_tokens is not None else default_hit_window(runs[0].requests)
    sources = [Path(folder)] + ([Path(compare)] if compare is not None else [])
    with _plotting(*(s / "timeseries.csv" for s in sources)):
        fig = timeseries_figure(runs, window)
        fig.savefig(dst / names[0], dpi=200)
        _close(fig)
    with _plotting(*(s / "requests.csv" for s in sources)):
        fig = latency_figure(runs)
        fig.savefig(dst / names[1], dpi=200)
        _close(fig)
    return [dst / names[0], dst / names[1]]


def timeseries_figure(runs: Sequence[RunData], hit_window_tokens: float) -> Any:
    """The time-series figure of one run, or of two overlaid (a matplotlib Figure)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    per_run = [{p.title: p for p in timeseries_panels(run, hit_window_tokens)} for run in runs]
    titles = [t for t in PANEL_TITLES if any(t in panels for panels in per_run)]
    cols = 1 if len(titles) <= 3 else 2
    rows = max(math.ceil(len(titles) / cols), 1)  # (a hand-made file of times alone: one empty panel)
    with plt.rc_context(PAPER_RC):
        fig, axes = plt.subplots(rows, cols, figsize=(WIDTH_IN, 0.5 + 0.35 * len(runs) + 1.55 * rows),
                                 sharex=True, squeeze=False, layout="constrained")
        flat = [axes[i // cols][i % cols] for i in range(rows * cols)]  # (row-major: the order reads across)
        for ax, title in zip(flat, titles):
            _draw_panel(ax, title, runs, [panels.get(title) for panels in per_run])
        for ax in flat[max(len(titles), 1):]:
            ax.set_visible(False)
        if not titles:
            flat[0].set_title("no gauges in timeseries.csv", loc="left")
        for c in range(cols):  # the time axis under the last panel of each column
            last = max((i for i in range(len(titles)) if i % cols == c), default=0)
            flat[last].set_xlabel("simulated time (s)")
            flat[last].xaxis.set_tick_params(labelbottom=True)
        if len(runs) > 1:
            fig.legend(handles=[Line2D([], [], color="k", linestyle=style, label=run.name)
                                for run, style in zip(runs, RUN_STYLES)],
                       loc="outside lower center", ncol=len(runs), fontsize=7.5)
        fig.suptitle("\n".join(_titled(run, style, len(runs)) for run, style in zip(runs, RUN_STYLES)),
                     fontsize=8, x=0.01, ha="left")
    return fig


def _draw_panel(ax: Any, title: str, runs: Sequence[RunData], panels: Sequence[Panel | None]) -> None:
    """One panel's lines for each run that has it: a colour per series, a line style per run."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    colours: dict[str, str] = {}
    legend, low, peak, counts = False, 0.0, 0.0, True
    ylim: tuple[float, float] | None = None
    for run, panel, style in zip(runs, panels, RUN_STYLES):
        if panel is None:
            continue
        for s in panel.series:
            counts = counts and bool(np.all(np.isnan(s.values) | (s.values == np.round(s.values))))
            low = min(low, float(np.nanmin(s.values, initial=0)))
            peak = max(peak, float(np.nanmax(s.values, initial=0)))
            colour = colours.setdefault(s.label, f"C{len(colours)}")
            ax.plot(run.time_s, s.values, style, color=colour, label=s.label)
        ax.set_ylabel(panel.ylabel)
        legend = legend or panel.legend or len(panel.series) > 1
        ylim = panel.ylim
    if ylim is not None and not ylim[0] <= low <= peak <= ylim[1]:
        ylim = None  # (a share outside 0-1, from a hand-edited file: shown as it is, not clipped)
    if ylim is None and low >= 0:  # (every gauge counts something: from 0; 0-1 when it stays at 0)
        ylim = (0.0, ax.get_ylim()[1] if peak > 0 else 1.0)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if counts and 0 <= low and peak < 2**53:  # (requests, sessions, blocks: no tick at 2.5)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title, loc="left")
    if legend:
        ax.legend(handles=[Line2D([], [], color=c, label=label) for label, c in colours.items()],
                  loc="best", ncol=min(len(colours), 2), framealpha=0.7)


def _titled(run: RunData, style: str, n: int) -> str:
    return describe(run) if n == 1 else f"[{'solid' if style == '-' else 'dashed'}] {describe(run)}"


def latency_figure(runs: Sequence[RunData]) -> Any:
    """CDFs of TTFT, TPOT and E2E latency of the requests each run's summary counts (one line per run)."""
    import matplotlib.pyplot as plt

    with plt.rc_context(PAPER_RC):
        fig, axes = plt.subplots(1, 3, figsize=(WIDTH_IN, 2.4), layout="constrained")
        for run, style in zip(runs, RUN_STYLES):
            req = run.requests
            counted = _counted(run)
            for ax, col in zip(axes, ("ttft_s", "tpot_s", "e2e_s")):
                v = np.sort(req[col][counted & np.isfinite(req[col])])
                if len(v):
                    ax.plot(v, np.arange(1, len(v) + 1) / len(v), style, color="C0" if style == "-" else "C1",
                            label=run.name)
        for ax, label in zip(axes, ("TTFT (s)", "TPOT (s)", "E2E latency (s)")):
            ax.set_xlabel(label)
            ax.set_ylabel("CDF")
        if len(runs) > 1 and axes[0].get_legend_handles_labels()[0]:
            axes[0].legend(loc="lower right")
        fig.suptitle("; ".join(describe(run).split("\n")[0] for run in runs), fontsize=8, x=0.01, ha="left")
    return fig


def _counted(run: RunData) -> np.ndarray:
    """The requests summary.json's latencies count: finished ones that arrived after ``run.warmup_s``. A
    failed request's TTFT (one cut off by run.max_sim_s or aborted while decoding) and a warm-up request's
    used to be in the TTFT curve, so it did not show the distribution the summary's percentiles come from."""
    req = run.requests
    counted = np.ones(len(req["ttft_s"]), dtype=bool)
    if "status" in req and req["status"].dtype == object:
        counted &= req["status"] == "finished"
    if "arrival_s" in req and req["arrival_s"].dtype == np.float64:
        counted &= ~(req["arrival_s"] < run.warmup_s)
    return counted


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)

@contextmanager
def _plotting(*sources: Path) -> Iterator[None]:
    """Drawing ``sources``' values: matplotlib's own error on values it cannot lay out (near 1e308, "arange:
    cannot compute length") named no file; it names the source (or sources) now."""
    import matplotlib.pyplot as plt

    try:
        yield
    except (ValueError, OverflowError) as exc:
        plt.close("all")
        raise ValueError(f"{' or '.join(map(str, sources))}: cannot plot its values ({exc})") from None


def _warmup_s(path: Path) -> float:
    """``run.warmup_s`` of a results folder's ``config.yaml`` (0 where the folder has none)."""
    import yaml

    if not path.is_file():
        return 0.0
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:  # (YAMLError is no ValueError: it was a traceback)
        raise ValueError(f"{path}: not a YAML config ({str(exc).splitlines()[0]})") from None
    run = config.get("run") if isinstance(config, dict) else None
    value = run.get("warmup_s", 0.0) if isinstance(run, dict) else 0.0
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{path}: run.warmup_s is {value!r}; expected a number of seconds >= 0")
    return float(value)
