"""Results of a run: the per-request table, the summary, gauge time series, the cost ledger, the config.

Metric definitions follow vLLM's benchmark client: TTFT = first token - arrival; TPOT = (E2E - TTFT) /
(output tokens - 1) for requests with more than one output token; ITL = every gap between consecutive
tokens of a request; throughput over the span from the first arrival to the last finish.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import yaml

from twin.request_log import NS, REQUEST_FIELDS, RequestTable

PERCENTILES = (50, 90, 99)
"""The percentiles every latency is summarised by."""


def stats(values: np.ndarray, where: np.ndarray | None = None) -> dict[str, float]:
    """mean, p50, p90, p99 of the finite values (of those ``where`` selects; NaN when there are none)."""
    v = values[np.isfinite(values) if where is None else where & np.isfinite(values)]
    if len(v) == 0:
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99")}
    p50, p90, p99 = np.percentile(v, PERCENTILES)
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def exact_dot(a: np.ndarray, b: np.ndarray, chunk: int = 8192) -> int:
    """The sum of ``a * b`` (integer arrays) as a Python int, exact however large (int64 products and sums
    may overflow), made a chunk of Python ints at a time rather than a list of all of them."""
    return sum(sum(x * y for x, y in zip(a[i:i + chunk].tolist(), b[i:i + chunk].tolist()))
               for i in range(0, len(a), chunk))


class SpilledGaps:
    """The parts of a run's inter-token gap histograms that left memory (:attr:`twin.core.gaps.GapHistogram.
    spill`): sorted runs of distinct gaps with their cumulative counts, in an anonymous file, and each run's
    count and exact sum. A long run's distinct gaps grow with its steps (about one a step); kept here, its
    memory does not."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self.runs: list[tuple[int, int, int, int]] = []
        """Each run: where it starts in the file, its distinct gaps, their count and their sum (exact)."""

    def add(self, gaps: np.ndarray, counts: np.ndarray) -> None:
        """Keep ``gaps`` (distinct, sorted, nanoseconds) counted ``counts`` times."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="twin-gaps-")
        at = self._file.seek(0, os.SEEK_END)
        ends = np.cumsum(counts, dtype=np.int64)
        self._file.write(np.ascontiguousarray(gaps, dtype=np.int64).tobytes())
        self._file.write(ends.tobytes())
        total = exact_dot(gaps, counts)
        self.runs.append((at, len(gaps), int(ends[-1]) if len(ends) else 0, total))

    def read(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each run as arrays mapped from the file (gaps, cumulative counts): a search reads a few pages."""
        if self._file is None:
            return []
        self._file.flush()
        return [(np.memmap(self._file, dtype=np.int64, mode="r", offset=at, shape=(n,)),
                 np.memmap(self._file, dtype=np.int64, mode="r", offset=at + 8 * n, shape=(n,)))
                for at, n, _, _ in self.runs if n]

    def __del__(self) -> None:
        if self._file is not None:
            self._file.close()


def histogram_stats(counts: dict[int, int] | tuple[np.ndarray, np.ndarray],
                    spilled: SpilledGaps | None = None) -> dict[str, float]:
    """:func:`stats` of the gaps a histogram of nanosecond gaps counts (value -> count, or arrays of values
    and their counts, where a value may appear more than once, with the runs ``spilled`` to disk), read off
    the histogram without expanding it: a long run counts 10^8 gaps and more. The mean is exact (the integer
    sum of the gaps over their count); the percentiles are numpy's default (``linear``) ones, computed as
    ``np.percentile`` computes them on the sorted gaps: the same two neighbours, the same interpolation, the
    same floats."""
    if isinstance(counts, dict):
        gaps = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        weights = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
    else:
        gaps, weights = counts
    keep = weights > 0
    gaps, weights = gaps[keep], weights[keep]
    order = np.argsort(gaps, kind="stable")
    gaps, weights = gaps[order], weights[order]
    ends = np.cumsum(weights)
    """Gaps at sorted positions ends[j - 1] .. ends[j] - 1 are gaps[j]."""
    n = int(ends[-1]) if len(ends) else 0
    total = exact_dot(gaps, weights)
    runs = spilled.read() if spilled is not None else []
    for _, _, count, run_total in spilled.runs if spilled is not None else ():
        n += count
        total += run_total
    if not n:
        return stats(np.array([]))
    if len(gaps):
        runs.append((gaps, ends))

    def at_one(position: int) -> int:
        """The gap at ``position`` of all of them sorted: the least gap with more than ``position`` at or
        below it (a bisection over values; each run answers how many it has at or below one)."""
        lo = min(int(g[0]) for g, _ in runs)
        hi = max(int(g[-1]) for g, _ in runs)
        while lo < hi:
            mid = (lo + hi) // 2
            below = 0
            for g, e in runs:
                i = int(np.searchsorted(g, mid, side="right"))
                below += int(e[i - 1]) if i else 0
            if below > position:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def at(position: np.ndarray) -> np.ndarray:
        return np.array([at_one(int(p)) for p in position], dtype=np.int64).astype(np.float64) / NS

    q = np.true_divide(np.array(PERCENTILES), 100)
    virtual = (n - 1) * q
    previous = np.floor(virtual)
    following = previous + 1
    last = virtual >= n - 1
    previous[last] = following[last] = n - 1
    gamma = virtual - np.where(last, -1, previous)  # (numpy's gamma where both neighbours are the last)
    a, b = at(previous.astype(np.int64)), at(following.astype(np.int64))
    diff = b - a
    values = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    p50, p90, p99 = (float(v) for v in values)
    return {"mean": total / n / NS, "p50": p50, "p90": p90, "p99": p99}


def summarize(table: np.ndarray | RequestTable, itl_counts: dict[int, int] | tuple[np.ndarray, np.ndarray], *,
              warmup_s: float = 0.0, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None,
              itl_spilled: SpilledGaps | None = None) -> dict[str, Any]:
    """The ``summary.json`` object (requests arriving before ``warmup_s`` are left out).

    Read a column at a time under masks: a long run's table is on disk (:class:`RequestTable`), and what
    this holds at once is one column (8 bytes a request) and the masks (one byte each)."""
    arrival = table["arrival_s"]
    measured = arrival >= warmup_s
    first_arrival = arrival[measured].min() if measured.any() else float("nan")
    del arrival
    status = table["status"]
    done = measured & (status == "finished")
    failed = measured & (status == "failed")
    del status
    n_measured, n_done, n_failed = int(measured.sum()), int(done.sum()), int(failed.sum())
    span = (np.nanmax(table["finish_s"][done]) - first_arrival) if n_done else float("nan")
    out_tokens = float(table["output_tokens"][done].sum())
    scheduled = table["first_scheduled_s"]
    admitted = measured & (scheduled == scheduled)
    del scheduled
    prompts = table["prompt_tokens"]
    in_tokens = float(prompts[done].sum())
    prompt_sum = float(prompts[admitted].sum())
    del prompts
    cached = int(table["cached_tokens"][admitted].sum())
    # No admitted prompt has no hit rate (NaN, null in summary.json), as a latency of no request has none;
    # 0.0 read as a cache that missed every prompt.
    hit_rate = float(cached) / prompt_sum if prompt_sum else float("nan")
    good = done
    ttft = table["ttft_s"]
    if slo_ttft_s is not None:
        good = good & (ttft <= slo_ttft_s)
    ttft_stats = stats(ttft, done)
    del ttft
    tpot = table["tpot_s"]
    if slo_tpot_s is not None:
        good = good & ~(tpot > slo_tpot_s)
    tpot_stats = stats(tpot, done)
    del tpot
    n_good = int(good.sum())
    return {
        "requests": {"submitted": n_measured, "completed": n_done, "failed": n_failed,
                     "pending": n_measured - n_done - n_failed},
        "ttft_s": ttft_stats,
        "tpot_s": tpot_stats,
        "itl_s": histogram_stats(itl_counts, itl_spilled),
        "e2e_s": stats(table["e2e_s"], done),
        "queue_s": stats(table["queue_s"], done),
        "throughput": {
            "output_tokens_per_s": out_tokens / span if span > 0 else float("nan"),
            "input_tokens_per_s": in_tokens / span if span > 0 else float("nan"),
            "requests_per_s": n_done / span if span > 0 else float("nan"),
            "goodput_requests_per_s": n_good / span if span > 0 else float("nan"),
        },
        "prefix_cache": {"hit_rate": hit_rate,
                         "cached_tokens": cached,
                         "host_hit_tokens": int(table["host_hit_tokens"][admitted].sum()),
                         "prompt_tokens": int(prompt_sum)},
        "preemptions": int(table["preemptions"][measured].sum()),
        "recomputed_tokens": int(table["recomputed_tokens"][measured].sum()),
        "fail_reasons": _count(table["fail_reason"][failed]),
    }


_NUMBER = re.compile(r"\d[\d,_]*(?:\.\d+)?(?:e[-+]?\d+)?")


def fail_kind(reason: str) -> str:
    """A failure reason with its request's numbers taken out (``needs N blocks but the pool has N``), so the
    failures of one cause group together."""
    return _NUMBER.sub("N", reason) if reason else "unknown"


def _count(values: np.ndarray) -> dict[str, dict[str, Any]]:
    """Failures by kind (:func:`fail_kind`): how many, and the first one's reason in full."""
    out: dict[str, dict[str, Any]] = {}
    for v in values:
        entry = out.setdefault(fail_kind(str(v)), {"count": 0, "example": str(v) or "unknown"})
        entry["count"] += 1
    return out


def nothing_completed(summary: dict[str, Any]) -> str | None:
    """Why a run that completed no request failed (its most common failure, with an example), or None."""
    r = summary["requests"]
    if r["completed"] or not r["submitted"]:
        return None
    reasons = sorted(summary["fail_reasons"].items(), key=lambda kv: -kv[1]["count"])
    if not reasons:
        return f"no request completed ({r['submitted']} submitted)"
    kind, top = reasons[0]
    return f"no request completed: {top['count']} of {r['submitted']} failed with {top['example']!r}" + (
        f" ({len(reasons) - 1} other kind{'s' if len(reasons) > 2 else ''} of failure)" if len(reasons) > 1 else "")


PANDAS_HINT = "pip install -e '.[pandas]'"


class Frames(NamedTuple):
    """A run's tables as pandas DataFrames (:meth:`Results.to_pandas`)."""

    requests: Any
    """One row per request, the columns of requests.csv."""
    timeseries: Any
    """One row per sample, the columns of timeseries.csv."""
    ledger: Any
    """One row per worker and cost term: worker, term, seconds, and the worker's steps and busy_s."""


def _need(module: str, what: str) -> Any:
    """Import an optional package of the ``pandas`` extra, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{what} needs {module}, an optional dependency: {PANDAS_HINT}") from None


def _latency(v: Any) -> str:
    """A latency for :meth:`Results.__repr__`: ms below 10 s, "-" where undefined (no request finished)."""
    if not isinstance(v, (int, float)) or v != v:
        return "-"
    return f"{v * 1e3:.2f} ms" if v < 10 else f"{v:.2f} s"


class Results:
    """Everything a run produced; :meth:`write` puts it in a folder."""

    def __init__(self, *, requests: np.ndarray | RequestTable, summary: dict[str, Any],
                 timeseries: dict[str, np.ndarray], ledger: dict[str, dict[str, float]], config: dict[str, Any],
                 token_times: dict[int, list[float]] | None = None) -> None:
        self._source = requests
        self._requests = requests if isinstance(requests, np.ndarray) else None
        self.summary = summary
        self.timeseries = timeseries
        self.ledger = ledger
        self.config = config
        self.token_times = token_times

    @property
    def requests(self) -> np.ndarray:
        """One row per request in submission order (:data:`~twin.request_log.REQUEST_FIELDS`), in memory: a
        run's table is read from its files the first time it is asked for. Where a long run's table should
        stay on disk, :meth:`request_column` reads one column and :meth:`write` streams it."""
        if self._requests is None:
            assert isinstance(self._source, RequestTable)
            self._requests = self._source.table()
        return self._requests

    def request_column(self, name: str) -> np.ndarray:
        """One column of :attr:`requests` (read from the run's files alone if the table is not in memory)."""
        return (self._requests if self._requests is not None else self._source)[name]

    def write(self, folder: str | Path) -> Path:
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        write_table_csv(out / "requests.csv", self._source)
        with open(out / "timeseries.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            cols = list(self.timeseries)
            writer.writerow(cols)
            for row in zip(*(self.timeseries[c] for c in cols)):
                writer.writerow([csv_cell(v) for v in row])
        (out / "summary.json").write_text(json.dumps(jsonable(self.summary), indent=2, sort_keys=False) + "\n")
        (out / "ledger.json").write_text(json.dumps(jsonable(self.ledger), indent=2) + "\n")
        (out / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        times = out / "token_times.json"
        if self.token_times is not None:
            times.write_text(json.dumps({str(k): v for k, v in self.token_times.items()}))
        else:  # (an earlier run's in a reused folder would pass for this one's)
            times.unlink(missing_ok=True)
        return out

    def __repr__(self) -> str:
        """One line of headline figures (a notebook echoes it; the tables are in the attributes)."""
        s = self.summary
        r = s.get("requests", {})
        ttft = s.get("ttft_s", {}).get("p50")
        tpot = s.get("tpot_s", {}).get("p50")
        tput = s.get("throughput", {}).get("output_tokens_per_s", float("nan"))
        sim_s = s.get("sim", {}).get("simulated_s", float("nan"))
        return (f"<Results: {r.get('submitted', len(self._source))} requests, "
                f"{r.get('completed', '?')} completed, {r.get('failed', '?')} failed; TTFT p50 {_latency(ttft)}, TPOT p50 {_latency(tpot)}; "
                f"{'-' if tput != tput else f'{tput:,.1f}'} output tok/s; "
                f"{'-' if sim_s != sim_s else f'{sim_s:.3f}'} s simulated>")

    def to_pandas(self) -> Frames:
        """The requests, time series and ledger as DataFrames, for a notebook (needs the ``pandas`` extra).

        The ledger is tidy: one row per worker and cost term, the worker's steps and busy seconds repeated
        on its rows (a hardware what-if, ``ledger["hardware_whatif"]``, is left in :attr:`ledger`).
        """
        pd = _need("pandas", "Results.to_pandas()")
        workers: dict[str, Any] = self.ledger  # (per worker: steps, busy_s and terms_s, a mapping)
        rows = [(worker, term, seconds, entry["steps"], entry["busy_s"])
                for worker, entry in workers.items() if isinstance(entry, dict) and "terms_s" in entry
                for term, seconds in entry["terms_s"].items()]
        ledger = pd.DataFrame(rows, columns=["worker", "term", "seconds", "steps", "busy_s"])
        return Frames(requests=pd.DataFrame(self.requests), timeseries=pd.DataFrame(dict(self.timeseries)),
                      ledger=ledger.astype({"seconds": "float64", "steps": "int64", "busy_s": "float64"}))

    def write_parquet(self, folder: str | Path) -> Path:
        """requests.parquet, timeseries.parquet and ledger.parquet (:meth:`to_pandas`'s frames) in ``folder``;
        needs the ``pandas`` extra (pyarrow)."""
        _need("pyarrow", "Results.write_parquet()")
        frames = self.to_pandas()
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        for name, frame in frames._asdict().items():
            frame.to_parquet(out / f"{name}.parquet", engine="pyarrow", index=False)
        return out


def write_table_csv(path: Path, table: np.ndarray | RequestTable) -> None:
    """A table as CSV (cells as :func:`csv_cell` writes them), a chunk of rows at a time: one on disk
    (:class:`RequestTable`) is read as it is written."""
    chunks = table.chunks(8192) if isinstance(table, RequestTable) else (
        table[lo:lo + 8192] for lo in range(0, len(table), 8192))
    names = [name for name, _ in REQUEST_FIELDS] if isinstance(table, RequestTable) else list(table.dtype.names or ())
    # UTF-8 whatever the locale (session names and fail reasons may hold any text; a Latin-1 or ASCII locale
    # raised UnicodeEncodeError after the run), as twin.plots reads it.
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        for chunk in chunks:
            columns: list[list[Any]] = []
            for name in names:
                values = chunk[name].tolist()   # (Python numbers: what csv_cell makes of numpy's, in bulk)
                if chunk.dtype[name].kind == "f":
                    values = ["" if v != v else repr(v) for v in values]
                columns.append(values)
            writer.writerows(zip(*columns))


def csv_cell(v: Any) -> Any:
    """CSV cells: floats with repr precision (exact round trip), NaN as empty."""
    if isinstance(v, (float, np.floating)):
        return "" if v != v else repr(float(v))
    if isinstance(v, np.integer):
        return int(v)
    return v


def jsonable(obj: Any) -> Any:
    """``obj`` as strict JSON takes it: NaN and infinities (not JSON) become null, numpy scalars Python's."""
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
