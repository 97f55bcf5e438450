"""Shared figure helper of the experiments: one panel per gauge, one line per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from twin.results import Results


def gauge_panels(results: Mapping[str, Results], panels: list[tuple[str, str]], path: Path,
                 extra: Callable[[Any, str, Results], None] | None = None, extra_label: str = "") -> Path:
    """Plot ``panels`` (label, timeseries column) for every run; ``extra`` draws one more panel per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(panels) + (extra is not None)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 2.1 * rows), sharex=True)
    for name, res in results.items():
        t = res.timeseries["time_s"]
        for ax, (label, col) in zip(axes, panels):
            ax.plot(t, res.timeseries[col], label=name, lw=1.1)
            ax.set_ylabel(label, fontsize=8)
        if extra is not None:
            extra(axes[-1], name, res)
    if extra is not None:
        axes[-1].set_ylabel(extra_label, fontsize=8)
        axes[-1].legend(fontsize=7, loc="upper left")
    axes[0].legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("simulated time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
