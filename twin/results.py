"""Results of a run: the per-request table, the summary, gauge time series, the cost ledger, the config.

Metric definitions follow vLLM's benchmark client: TTFT = first token - arrival; TPOT = (E2E - TTFT) /
(output tokens - 1) for requests with more than one output token; ITL = every gap between consecutive
tokens of a request; throughput over the span from the first arrival to the last finish.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np
import yaml

from twin.core.errors import InvariantError
from twin.core.request import NO_TIME, Request, Status

NS = 1e9

REQUEST_FIELDS: list[tuple[str, str]] = [
    ("id", "i8"), ("session", "O"), ("turn", "i4"), ("worker", "i4"), ("status", "O"), ("fail_reason", "O"),
    ("priority", "i4"), ("arrival_s", "f8"), ("queued_s", "f8"), ("first_scheduled_s", "f8"),
    ("first_token_s", "f8"), ("finish_s", "f8"), ("prompt_tokens", "i8"), ("output_tokens", "i8"),
    ("cached_tokens", "i8"), ("host_hit_tokens", "i8"), ("recomputed_tokens", "i8"), ("preemptions", "i4"), ("ttft_s", "f8"),
    ("tpot_s", "f8"), ("e2e_s", "f8"), ("queue_s", "f8"), ("max_itl_s", "f8"),
    # Disaggregated systems only (NaN / -1 / empty otherwise): the KV lifecycle of the request.
    ("prefill_worker", "i4"), ("kv_state", "O"), ("kv_staged_s", "f8"), ("kv_pull_s", "f8"),
    ("kv_resident_s", "f8"), ("kv_expired_s", "f8"), ("staged_wait_s", "f8"), ("transfer_s", "f8"),
    ("transfer_bytes", "i8"), ("reused_blocks", "i8"),
]


_STATUS_NAMES = {status: status.name.lower() for status in Status}


def _kv_columns(r: Request) -> tuple[object, ...]:
    from twin.core.lifecycle import KVState

    kv = r.kv
    if kv is None:
        nan = float("nan")
        return (-1, "", nan, nan, nan, nan, nan, nan, 0, 0)
    wait = kv.staged_wait_ns
    moved = kv.transferred
    return (kv.prefill_worker, kv.state.name.lower(), kv.time_s(KVState.STAGED), kv.time_s(KVState.PULLING),
            kv.time_s(KVState.RESIDENT), kv.time_s(KVState.EXPIRED), float("nan") if wait is None else wait / NS,
            kv.transfer_ns / NS if moved else float("nan"), kv.transfer_bytes, kv.reused_blocks)


def _t(ns: int) -> float:
    return float("nan") if ns == NO_TIME else ns / NS


def request_row(r: Request) -> tuple[object, ...]:
    """The request's row of requests.csv (:data:`REQUEST_FIELDS`), as it stands now."""
    arrival = r.arrival_ns / NS
    first = _t(r.first_token_ns)
    finish = _t(r.finish_ns) if r.status is Status.FINISHED else float("nan")
    out = r.num_output_tokens
    tpot = (finish - first) / (out - 1) if out > 1 else float("nan")
    # The largest gap between two tokens: none with fewer than two (it read 0.0, a max of nothing).
    max_itl = r.max_itl_ns / NS if out > 1 else float("nan")
    return (
        r.id, r.session, r.turn, r.worker, _STATUS_NAMES[r.status], r.fail_reason, r.priority, arrival,
        _t(r.queued_ns), _t(r.first_scheduled_ns), first, _t(r.finish_ns), r.prompt_tokens, out,
        max(r.cached_tokens, 0), r.host_hit_tokens, r.recomputed_tokens, r.preemptions, first - arrival, tpot,
        finish - arrival, _t(r.first_scheduled_ns) - arrival, max_itl, *_kv_columns(r),
    )


def request_table(requests: Sequence[Request]) -> np.ndarray:
    """One row per request, in the given order (a numpy structured array)."""
    table = np.zeros(len(requests), dtype=REQUEST_FIELDS)
    for i, r in enumerate(requests):
        table[i] = request_row(r)
    return table


class RequestLog:
    """The rows of requests that have ended, written as they end, so that a run keeps no request object
    past its end: a row is a few hundred bytes, where a request with its block keys and session is tens of
    kilobytes. Rows fill fixed-size chunks; :meth:`table` puts them in request-id (submission) order.

    A row is written once nothing more happens to its request: it ended, and a disaggregated request's KV
    reached the end of its lifecycle (a request can finish while its staged KV still waits to be freed).
    Those that ended before their KV are held (:attr:`held`) and written when it ends, or at the run's end.
    """

    def __init__(self, chunk_rows: int = 16_384) -> None:
        self.chunk_rows = chunk_rows
        self._chunks: list[np.ndarray] = []
        self._chunk = np.zeros(self.chunk_rows, dtype=REQUEST_FIELDS)
        self._rows = 0
        """Rows written into the current chunk."""
        self.held: dict[int, Request] = {}
        self.count = 0
        """Requests ended so far (written or held)."""
        self.failed_without_reason: list[str] = []
        """Requests that failed with no reason given (an invariant the run checks at its end)."""
        self._table: np.ndarray | None = None

    def add(self, req: Request) -> None:
        """``req`` has ended."""
        from twin.core.lifecycle import TERMINAL

        self.count += 1
        if req.status is Status.FAILED and not req.fail_reason:
            self.failed_without_reason.append(repr(req))
        if req.kv is not None and req.kv.state not in TERMINAL:
            self.held[req.id] = req
            return
        self._write(req)
        if self.held:
            for rid in [rid for rid, r in self.held.items() if r.kv is not None and r.kv.state in TERMINAL]:
                self._write(self.held.pop(rid))

    def _write(self, req: Request) -> None:
        self._chunk[self._rows] = request_row(req)
        self._rows += 1
        if self._rows == self.chunk_rows:
            self._chunks.append(self._chunk)
            self._chunk = np.zeros(self.chunk_rows, dtype=REQUEST_FIELDS)
            self._rows = 0

    def table(self) -> np.ndarray:
        """Every row, held ones included, in request-id order (built once: the chunks are let go)."""
        if self._table is not None:
            return self._table
        for req in self.held.values():
            self._write(req)
        self.held.clear()
        chunks = self._chunks
        chunks.append(self._chunk[:self._rows])
        self._chunk = self._chunk[:0]
        n = sum(len(c) for c in chunks)
        table = np.zeros(n, dtype=REQUEST_FIELDS)
        placed = np.zeros(n, dtype=bool)
        while chunks:   # each chunk let go once placed: the table and one chunk at a time, not two tables
            part = chunks.pop()
            table[part["id"]] = part   # (ids are 0 .. n - 1: a run numbers its requests as it sends them)
            placed[part["id"]] = True
            del part
        if not placed.all():
            raise InvariantError(f"request ids are not 0 .. {n - 1}: rows of {n - int(placed.sum())} missing")
        self._table = table
        return table


PERCENTILES = (50, 90, 99)
"""The percentiles every latency is summarised by."""


def stats(values: np.ndarray) -> dict[str, float]:
    """mean, p50, p90, p99 of the finite values (NaN when there are none)."""
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99")}
    p50, p90, p99 = np.percentile(v, PERCENTILES)
    return {"mean": float(v.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def histogram_stats(counts: dict[int, int] | tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    """:func:`stats` of the gaps a histogram of nanosecond gaps counts (value -> count, or arrays of values
    and their counts, where a value may appear more than once), read off the histogram without expanding
    it: a long run counts 10^8 gaps and more. The mean is exact (the integer sum of the gaps over their
    count); the percentiles are numpy's default (``linear``) ones, computed as ``np.percentile`` computes
    them on the sorted gaps: the same two neighbours, the same interpolation, the same floats."""
    if isinstance(counts, dict):
        gaps = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        weights = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
    else:
        gaps, weights = counts
    keep = weights > 0
    gaps, weights = gaps[keep], weights[keep]
    if not len(gaps):
        return stats(np.array([]))
    order = np.argsort(gaps, kind="stable")
    gaps, weights = gaps[order], weights[order]
    n = int(weights.sum())
    total = sum(g * w for g, w in zip(gaps.tolist(), weights.tolist()))   # (Python ints: no overflow)
    ends = np.cumsum(weights)
    """Gaps at sorted positions ends[j - 1] .. ends[j] - 1 are gaps[j]."""

    def at(position: np.ndarray) -> np.ndarray:
        return gaps[np.searchsorted(ends, position, side="right")].astype(np.float64) / NS

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


def summarize(table: np.ndarray, itl_counts: dict[int, int] | tuple[np.ndarray, np.ndarray], *,
              warmup_s: float = 0.0, slo_ttft_s: float | None = None,
              slo_tpot_s: float | None = None) -> dict[str, Any]:
    """The ``summary.json`` object (requests arriving before ``warmup_s`` are left out).

    Read column by column under masks rather than through copies of the table's rows: a million-request
    table is a quarter of a gigabyte, and each row copy would be another."""
    status = table["status"]
    measured = table["arrival_s"] >= warmup_s
    done = measured & (status == "finished")
    failed = measured & (status == "failed")
    n_measured, n_done, n_failed = int(measured.sum()), int(done.sum()), int(failed.sum())
    span = (np.nanmax(table["finish_s"][done]) - table["arrival_s"][measured].min()) if n_done else float("nan")
    out_tokens = float(table["output_tokens"][done].sum())
    in_tokens = float(table["prompt_tokens"][done].sum())
    scheduled = table["first_scheduled_s"]
    admitted = measured & (scheduled == scheduled)
    prompt_sum = float(table["prompt_tokens"][admitted].sum())
    cached = int(table["cached_tokens"][admitted].sum())
    # No admitted prompt has no hit rate (NaN, null in summary.json), as a latency of no request has none;
    # 0.0 read as a cache that missed every prompt.
    hit_rate = float(cached) / prompt_sum if prompt_sum else float("nan")
    good = done
    if slo_ttft_s is not None:
        good = good & (table["ttft_s"] <= slo_ttft_s)
    if slo_tpot_s is not None:
        good = good & ~(table["tpot_s"] > slo_tpot_s)
    n_good = int(good.sum())
    return {
        "requests": {"submitted": n_measured, "completed": n_done, "failed": n_failed,
                     "pending": n_measured - n_done - n_failed},
        "ttft_s": stats(table["ttft_s"][done]),
        "tpot_s": stats(table["tpot_s"][done]),
        "itl_s": histogram_stats(itl_counts),
        "e2e_s": stats(table["e2e_s"][done]),
        "queue_s": stats(table["queue_s"][done]),
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

    def __init__(self, *, requests: np.ndarray, summary: dict[str, Any], timeseries: dict[str, np.ndarray],
                 ledger: dict[str, dict[str, float]], config: dict[str, Any],
                 token_times: dict[int, list[float]] | None = None) -> None:
        self.requests = requests
        self.summary = summary
        self.timeseries = timeseries
        self.ledger = ledger
        self.config = config
        self.token_times = token_times

    def write(self, folder: str | Path) -> Path:
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        write_table_csv(out / "requests.csv", self.requests)
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
        return (f"<Results: {r.get('submitted', len(self.requests))} requests, "
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


def write_table_csv(path: Path, table: np.ndarray) -> None:
    names = table.dtype.names or ()
    # UTF-8 whatever the locale (session names and fail reasons may hold any text; a Latin-1 or ASCII locale
    # raised UnicodeEncodeError after the run), as twin.plots reads it.
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(names)
        for row in table:
            writer.writerow([csv_cell(v) for v in row])


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
