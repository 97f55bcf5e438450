"""Plots of a results folder: gauges over time and latency CDFs (matplotlib, no display needed)."""

from __future__ import annotations

import csv
import io
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterator, Literal

import numpy as np

PLOT_NAMES = ("timeseries.png", "latency_cdf.png")
"""The figures :func:`plot_results` writes."""


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


def plot_results(folder: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write ``timeseries.png`` and ``latency_cdf.png`` for a results folder; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src = Path(folder)
    dst = Path(out) if out is not None else src
    for name in ("timeseries.csv", "requests.csv"):
        if not (src / name).is_file():
            raise FileNotFoundError(f"{src / name} not found: is {src} a folder written by `twin run --out`?")
    ts = read_csv_columns(src / "timeseries.csv", "all")  # (every gauge a number: text plotted as categories)
    if "time_s" not in ts:
        raise ValueError(f"{src / 'timeseries.csv'}: expected a numeric column 'time_s'")
    req = read_csv_columns(src / "requests.csv", ("ttft_s", "tpot_s", "e2e_s"))
    # The requests summary.json's latencies count: finished ones that arrived after run.warmup_s. A failed
    # request's TTFT (one cut off by run.max_sim_s or aborted while decoding) and a warm-up request's used
    # to be in the TTFT curve, so it did not show the distribution the summary's percentiles come from.
    counted = np.ones(len(req["ttft_s"]), dtype=bool)
    if "status" in req and req["status"].dtype == object:
        counted &= req["status"] == "finished"
    if "arrival_s" in req and req["arrival_s"].dtype == np.float64:
        counted &= ~(req["arrival_s"] < _warmup_s(src / "config.yaml"))
    dst.mkdir(parents=True, exist_ok=True)  # (only once the inputs are known good: no stray empty folder)
    written = []

    t = ts["time_s"]
    panels = [("requests", [("waiting", "waiting"), ("running", "running")])]
    if "sessions_in_wait" in ts and np.nanmax(ts["sessions_in_wait"], initial=0) > 0:
        panels.append(("sessions", [("sessions_active", "active"), ("sessions_in_wait", "in tool / think wait")]))
    panels += [
              ("KV usage", [("kv_usage", "used fraction")]),
              ("output tokens / s", [("output_tokens_per_s", "tokens/s")]),
              ("prefix-hit rate", [("prefix_hit_rate", "hit rate (window)")])]
    extra = [c for c in ts if c.startswith("staged") or c.startswith("decode_wait") or c.startswith("link")]
    if extra:
        panels.append(("disaggregation", [(c, c) for c in extra]))
    with _plotting(src / "timeseries.csv"):
        fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.3 * len(panels)), sharex=True)
        for ax, (title, series) in zip(np.atleast_1d(axes), panels):
            for col, label in series:
                if col in ts:
                    ax.plot(t, ts[col], label=label, lw=1.2)
            ax.set_ylabel(title)
            ax.grid(alpha=0.3)
            if len(series) > 1 and ax.get_legend_handles_labels()[0]:  # (none of its columns: matplotlib warned)
                ax.legend(loc="upper right", fontsize=8)
        np.atleast_1d(axes)[-1].set_xlabel("simulated time (s)")
        fig.tight_layout()
        path = dst / PLOT_NAMES[0]
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    with _plotting(src / "requests.csv"):
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
        for ax, col, label in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT (s)", "TPOT (s)", "E2E latency (s)")):
            v = np.sort(req[col][counted & np.isfinite(req[col])])
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), lw=1.5)
            ax.set_xlabel(label)
            ax.set_ylabel("CDF")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        path = dst / PLOT_NAMES[1]
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


@contextmanager
def _plotting(source: Path) -> Iterator[None]:
    """Drawing ``source``'s values: matplotlib's own error on values it cannot lay out (near 1e308, "arange:
    cannot compute length") named no file; it names ``source`` now."""
    import matplotlib.pyplot as plt

    try:
        yield
    except (ValueError, OverflowError) as exc:
        plt.close("all")
        raise ValueError(f"{source}: cannot plot its values ({exc})") from None


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
