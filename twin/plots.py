"""Plots of a results folder: gauges over time and latency CDFs (matplotlib, no display needed)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def read_csv_columns(path: Path) -> dict[str, np.ndarray]:
    """Numeric columns of a CSV written by :mod:`twin.results` (empty cells are NaN; text columns kept)."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        raise ValueError(f"{path}: empty file")
    header, body = rows[0], rows[1:]
    for n, r in enumerate(body, start=2):
        if len(r) != len(header):
            raise ValueError(f"{path}, line {n}: {len(r)} cells where the header has {len(header)} (a cut-off file?)")
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(header):
        cells = [r[i] for r in body]
        try:
            out[name] = np.array([float(c) if c != "" else np.nan for c in cells], dtype=np.float64)
        except ValueError:
            out[name] = np.array(cells, dtype=object)
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
    ts = read_csv_columns(src / "timeseries.csv")
    req = read_csv_columns(src / "requests.csv")
    needed = ((ts, ("time_s",), "timeseries.csv"), (req, ("ttft_s", "tpot_s", "e2e_s"), "requests.csv"))
    for table, columns, name in needed:
        for col in columns:
            if col not in table or table[col].dtype != np.float64:
                raise ValueError(f"{src / name}: expected a numeric column {col!r}")
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
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.3 * len(panels)), sharex=True)
    for ax, (title, series) in zip(np.atleast_1d(axes), panels):
        for col, label in series:
            if col in ts:
                ax.plot(t, ts[col], label=label, lw=1.2)
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(loc="upper right", fontsize=8)
    np.atleast_1d(axes)[-1].set_xlabel("simulated time (s)")
    fig.tight_layout()
    path = dst / "timeseries.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, col, label in zip(axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT (s)", "TPOT (s)", "E2E latency (s)")):
        v = np.sort(req[col][np.isfinite(req[col])])
        if len(v):
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), lw=1.5)
        ax.set_xlabel(label)
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = dst / "latency_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
