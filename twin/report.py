"""HTML reports (``twin report``): one self-contained page to read or share a run or a sweep folder.

The page is built from the files ``twin run --out`` or ``twin sweep --out`` wrote, never from a live run, and
nothing is written into that folder. It opens with no network: the CSS is inline and every figure is a PNG
embedded as base64 (a run's figures are :func:`twin.plots.plot_results`'s, drawn into a temporary folder; a
sweep's metric-vs-parameter figures are drawn here). A run's page holds its summary (latencies, fail reasons,
KV capacity per worker and every other figure of ``summary.json``), the time-series and latency-CDF figures,
the cost ledger per worker and the resolved config; a sweep's page holds the sweep table, one figure per swept
parameter and a section per point (the point's whole run page where the sweep kept its runs).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from twin.core.errors import TwinError

RUN_FILES = ("summary.json", "config.yaml", "ledger.json", "requests.csv", "timeseries.csv")
"""What a run folder holds (:meth:`twin.results.Results.write`) and a run's page is built from."""
SWEEP_TABLE = "sweep.csv"
FIRST_METRIC = "completed"
"""The first metric column of ``sweep.csv``; the grid's come before it (:func:`twin.sweep.run_point`)."""

SWEEP_PANELS: list[tuple[str, tuple[str, str], str, str]] = [
    # title, where summary.json holds it, and the sweep.csv column (and its title) used without kept runs:
    # the table has no p50s, so their panels show the mean.
    ("output tokens / s", ("throughput", "output_tokens_per_s"), "output_tokens_per_s", "output tokens / s"),
    ("TTFT p50 (s)", ("ttft_s", "p50"), "ttft_mean_s", "TTFT mean (s)"),
    ("TTFT p99 (s)", ("ttft_s", "p99"), "ttft_p99_s", "TTFT p99 (s)"),
    ("TPOT p50 (s)", ("tpot_s", "p50"), "tpot_mean_s", "TPOT mean (s)"),
]
LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"), ("queue_s", "queue"))

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
h3, h4 { margin-bottom: .4em; }
table { border-collapse: collapse; margin: .5em 0 1em; } caption { text-align: left; font-weight: 600; }
th, td { border: 1px solid #ddd; padding: 2px 8px; } th { background: #f3f3f3; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #fafafa; }
img { max-width: 100%; height: auto; display: block; margin: .5em 0; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: 12px; }
nav ul { columns: 3; } .note { color: #666; } .error { color: #a00; } div.wide { overflow-x: auto; }
div.tables { display: flex; flex-wrap: wrap; gap: 0 2em; align-items: flex-start; }
section.point { border-left: 3px solid #ddd; padding-left: 1em; margin: 1.5em 0; }
"""


def write_report(folder: str | Path, out: str | Path) -> Path:
    """Write the HTML page of a run or sweep folder to ``out``; returns ``out``."""
    src = Path(folder)
    kind = folder_kind(src)
    sections = sweep_sections(src) if kind == "sweep" else run_sections(src)
    title = f"ServeTwin {kind}: {src.resolve().name}"
    dst = Path(out)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(page(title, sections), encoding="utf-8")
    return dst


def folder_kind(src: Path) -> Literal["run", "sweep"]:
    """Whether ``src`` is a sweep folder (``sweep.csv``) or a run folder (every file of :data:`RUN_FILES`)."""
    expected = (f"expected a run folder ({', '.join(RUN_FILES)}, as `twin run --out` writes) or a sweep "
                f"folder ({SWEEP_TABLE}, as `twin sweep --out` writes)")
    if not src.is_dir():
        raise TwinError(f"{src}: no such folder; {expected}")
    if (src / SWEEP_TABLE).is_file():
        return "sweep"
    missing = [name for name in RUN_FILES if not (src / name).is_file()]
    if not missing:
        return "run"
    if len(missing) < len(RUN_FILES):
        raise TwinError(f"{src}: a run folder without {', '.join(missing)}; {expected}")
    raise TwinError(f"{src} is neither a run nor a sweep folder; {expected}")


# --- HTML pieces --------------------------------------------------------------------------------------------

Section = tuple[str, str, str]
"""(id, title, HTML content) of one section of the page."""


def page(title: str, sections: Sequence[Section]) -> str:
    nav = "".join(f'<li><a href="#{sid}">{html.escape(name)}</a></li>' for sid, name, _ in sections)
    body = "".join(render(s, 2) for s in sections)
    head = f'<meta charset="utf-8"><title>{html.escape(title)}</title><style>{CSS}</style>'
    return (f'<!DOCTYPE html>\n<html lang="en"><head>{head}</head><body><h1>{html.escape(title)}</h1>'
            f"<nav><ul>{nav}</ul></nav>{body}</body></html>\n")


def render(section: Section, level: int, cls: str = "") -> str:
    sid, title, content = section
    attr = f' class="{cls}"' if cls else ""
    return f'<section id="{sid}"{attr}><h{level}>{html.escape(title)}</h{level}>{content}</section>'


def fmt(v: Any) -> str:
    """A cell: "-" for none or NaN, integers with thousands separators, floats to 4 significant digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], caption: str = "") -> str:
    def cell(v: Any) -> str:
        if isinstance(v, _Raw):
            return f"<td>{v}</td>"
        num = isinstance(v, (int, float)) and not isinstance(v, bool)
        return f'<td class="num">{html.escape(fmt(v))}</td>' if num else f"<td>{html.escape(fmt(v))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f'<div class="wide"><table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


class _Raw(str):
    """A table cell that is already HTML (a link)."""


def image(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def note(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{html.escape(text)}</p>'


# --- a run --------------------------------------------------------------------------------------------------

def run_sections(src: Path, prefix: str = "") -> list[Section]:
    """The sections of a run folder's page; ``prefix`` keeps ids apart when a sweep holds several runs."""
    summary = _read_json(src / "summary.json")
    ledger = _read_json(src / "ledger.json")
    figures = _run_figures(src)
    # plot_results' figures by name: the latency CDFs apart, every other one a time series.
    cdfs = [image(png, name) for name, png in figures.items() if "cdf" in name]
    series = [image(png, name) for name, png in figures.items() if "cdf" not in name]
    return [
        (f"{prefix}summary", "Summary", summary_html(summary)),
        (f"{prefix}timeseries", "Time series", "".join(series) or note("no time-series figure")),
        (f"{prefix}latency", "Latency CDFs (TTFT, TPOT, E2E)", "".join(cdfs) or note("no latency figure")),
        (f"{prefix}ledger", "Cost ledger per worker",
         ledger_html(ledger, {w["worker"]: w["role"] for w in summary.get("kv_capacity", [])})),
        (f"{prefix}config", "Resolved config",
         f"<pre>{html.escape((src / 'config.yaml').read_text(encoding='utf-8'))}</pre>"),
    ]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not the JSON `twin run --out` writes ({exc})") from None


def _run_figures(src: Path) -> dict[str, bytes]:
    """:func:`twin.plots.plot_results`'s PNGs of ``src``, drawn afresh (the folder's own may be stale or
    absent: ``twin run --no-plots``)."""
    from twin.plots import plot_results

    with tempfile.TemporaryDirectory() as tmp:
        return {path.name: path.read_bytes() for path in plot_results(src, tmp)}


def summary_html(summary: dict[str, Any]) -> str:
    """Latencies in ms, failures by kind, KV capacity per worker, then every other figure of summary.json."""
    parts = [table(["", "mean (ms)", "p50 (ms)", "p90 (ms)", "p99 (ms)"],
                   [[label, *(_ms(summary.get(key, {}).get(q)) for q in ("mean", "p50", "p90", "p99"))]
                    for key, label in LATENCIES if key in summary], caption="Latencies")]
    reasons = sorted(summary.get("fail_reasons", {}).items(), key=lambda kv: -kv[1]["count"])
    parts.append(table(["count", "kind", "first reason in full"],
                       [[e["count"], kind, e["example"]] for kind, e in reasons], caption="Fail reasons")
                 if reasons else "<h4>Fail reasons</h4>" + note("no request failed"))
    kv = summary.get("kv_capacity", [])
    if kv:
        parts.append(table(["worker", "role", "blocks", "tokens", "GiB per GPU"],
                           [[w["worker"], w["role"], w["blocks"], w["tokens"], w["gib_per_gpu"]] for w in kv],
                           caption="KV capacity per worker"))
    # Every other figure, a table per section of summary.json (its top-level numbers together).
    shown = {key for key, _ in LATENCIES} | {"fail_reasons", "kv_capacity"}
    groups: dict[str, list[tuple[str, Any]]] = {}
    for name, value in summary.items():
        if name not in shown:
            group = name if isinstance(value, dict) else "counts"
            flat = _flat(name, value)
            groups.setdefault(group, []).extend((key.removeprefix(f"{group}."), v) for key, v in flat)
    tables = "".join(table(["figure", "value"], rows, caption=group) for group, rows in groups.items())
    return "".join(parts) + f'<div class="tables">{tables}</div>'


def _ms(v: Any) -> Any:
    return v * 1e3 if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _flat(name: str, value: Any) -> list[tuple[str, Any]]:
    """Nested mappings as dotted keys (``throughput.output_tokens_per_s``)."""
    if isinstance(value, dict):
        return [pair for key, v in value.items() for pair in _flat(f"{name}.{key}", v)]
    return [(name, json.dumps(value) if isinstance(value, list) else value)]


def ledger_html(ledger: dict[str, Any], roles: dict[str, str]) -> str:
    """Steps and busy time per worker, then seconds per cost term (those no worker spent time on left out)."""
    workers = {name: e for name, e in ledger.items() if isinstance(e, dict) and "terms_s" in e}
    parts = []
    if workers:
        parts.append(table(["worker", "role", "steps", "busy (s)"],
                           [[w, roles.get(w, "-"), e["steps"], e["busy_s"]] for w, e in workers.items()],
                           caption="Workers"))
        terms = [t for t in next(iter(workers.values()))["terms_s"]
                 if any(e["terms_s"].get(t) for e in workers.values())]
        header = ["term"] + [f"{w} (s)" for w in workers] + [f"{w} (% busy)" for w in workers]
        rows = [[t, *(e["terms_s"].get(t, 0.0) for e in workers.values()),
                 *(100 * e["terms_s"].get(t, 0.0) / e["busy_s"] if e["busy_s"] else None
                   for e in workers.values())]
                for t in terms]
        parts.append(table(header, rows, caption="Time per cost term"))
    else:
        parts.append(note("the ledger has no worker"))
    for name, entry in ledger.items():
        if name in workers:
            continue
        text = json.dumps(entry, indent=2)
        if name == "hardware_whatif":
            from twin.whatif import describe

            text = "\n".join(describe(entry))
        parts.append(f"<h4>{html.escape(name)}</h4><pre>{html.escape(text)}</pre>")
    return "".join(parts)


# --- a sweep ------------------------------------------------------------------------------------------------

def sweep_sections(src: Path) -> list[Section]:
    """The sweep table, a figure per swept parameter, and a section per point."""
    header, rows = _read_sweep(src / SWEEP_TABLE)
    grid = header[: header.index(FIRST_METRIC)]
    runs = [src / "runs" / f"run{i:04d}" for i in range(len(rows))]
    kept = [run if all((run / name).is_file() for name in RUN_FILES) else None for run in runs]
    summaries = [_read_json(run / "summary.json") if run else None for run in kept]
    links = [_Raw(f'<a href="#point-{i}">{i}</a>') for i in range(len(rows))]
    sweep_table = table(["point", *header],
                        [[link, *(_cell(row[k]) for k in header)] for link, row in zip(links, rows)])
    ok = [s for s, row in zip(summaries, rows) if not row.get("error")]
    from_runs = bool(ok) and None not in ok
    panels = _panel_values(rows, summaries, from_runs)
    figures = "".join(image(_sweep_figure(grid, p, rows, panels), f"metrics against {p}") for p in grid)
    if not from_runs:
        figures = note("The sweep's runs were not kept (`twin sweep --keep-runs`) and sweep.csv has no p50s: "
                       "the p50 panels show the mean.") + figures
    points = "".join(render(_point_section(i, row, grid, run), 3, "point")
                     for i, (row, run) in enumerate(zip(rows, kept)))
    return [("sweep-table", "Sweep table", sweep_table),
            ("sweep-plots", "Metrics against each parameter", figures), ("points", "Points", points)]


def _read_sweep(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            header = list(reader.fieldnames or [])
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path}: not the table `twin sweep` writes ({exc})") from None
    if FIRST_METRIC not in header or not rows:
        raise ValueError(f"{path}: expected the table `twin sweep` writes: grid columns, then "
                         f"{FIRST_METRIC!r} and the other metrics, one row per point")
    return header, rows


def _cell(text: str) -> Any:
    """A sweep.csv cell as a number where it is one (so the table aligns and formats it)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text) if text else None
    except ValueError:
        return text


def _number(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _point_section(i: int, row: dict[str, str], grid: Sequence[str], run: Path | None) -> Section:
    title = f"point {i}: " + ", ".join(f"{k}={row[k]}" for k in grid)
    content = note(f"error: {row['error']}", "error") if row.get("error") else ""
    if run is None:
        metrics = [(k, _cell(v)) for k, v in row.items() if k not in grid and k != "error"]
        content += table(["metric", "value"], metrics)
        content += note("run folder not kept (`twin sweep --keep-runs`)")
    else:
        content += note(f"run folder: {run.parent.name}/{run.name}")
        content += "".join(render(s, 4) for s in run_sections(run, prefix=f"point-{i}-"))
    return f"point-{i}", title, content


def _panel_values(rows: Sequence[dict[str, str]], summaries: Sequence[dict[str, Any] | None],
                  from_runs: bool) -> list[tuple[str, list[float]]]:
    """Each panel's title and value per point (NaN for a failed point): from the kept runs' summaries, or
    from sweep.csv's columns."""
    if from_runs:
        return [(title, [_number((s or {}).get(section, {}).get(stat)) for s in summaries])
                for title, (section, stat), _, _ in SWEEP_PANELS]
    return [(column_title, [_number(row[column]) for row in rows])
            for _, _, column, column_title in SWEEP_PANELS]


def _sweep_figure(grid: Sequence[str], param: str, rows: Sequence[dict[str, str]],
                  panels: Sequence[tuple[str, list[float]]]) -> bytes:
    """A row of panels (:data:`SWEEP_PANELS`) against ``param``, a line per setting of the others."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(row[param] for row in rows))
    numeric = all(not math.isnan(_number(v)) for v in labels)
    position = {v: (_number(v) if numeric else float(j)) for j, v in enumerate(labels)}
    others = [k for k in grid if k != param]
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(tuple(row[k] for k in others), []).append(i)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2))
    for ax, (title, values) in zip(axes, panels):
        for key, members in groups.items():
            members = sorted(members, key=lambda i: position[rows[i][param]])
            ax.plot([position[rows[i][param]] for i in members], [values[i] for i in members], marker="o",
                    lw=1.3, label=", ".join(f"{k}={v}" for k, v in zip(others, key)) or None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(param, fontsize=9)
        if not numeric:
            ax.set_xticks(list(position.values()), labels, fontsize=8, rotation=20)
        ax.grid(alpha=0.3)
    if others:
        axes[-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
