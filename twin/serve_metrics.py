"""vLLM's latency histograms for ``twin serve``'s ``/metrics``, in Prometheus text format.

Names, help texts and bucket edges are vLLM's (``vllm/v1/metrics/loggers.py``, edges from
``vllm/v1/metrics/buckets.py``): time to first token (PREFILL_LATENCY edges), inter-token latency (the
TOKEN_STEP_LATENCY edges; ``vllm:inter_token_latency_seconds`` replaced ``time_per_output_token_seconds``)
and end-to-end latency (ACCUMULATED_PHASE_LATENCY edges). As vLLM V1 observes them: one inter-token gap per
engine step that gave a request tokens (a speculative step's accepted drafts are one gap), the end-to-end
latency of finished requests only. Times are simulated seconds (the wall clock runs ``time_scale`` times
that), observed when a request ends. Pure: no SimPy, no HTTP.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from twin.core.request import NO_TIME, Request, Status

TTFT_EDGES_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_EDGES_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_EDGES_S = (0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    """A Prometheus histogram: counts per upper edge (``le``), their sum and count."""

    def __init__(self, name: str, help: str, edges_s: Sequence[float]) -> None:
        self.name = name
        self.help = help
        self.edges_s = tuple(edges_s)
        self.counts = [0] * (len(self.edges_s) + 1)
        """Observations per bucket, not cumulative; the last is above every edge (+Inf)."""
        self.sum_s = 0.0

    def observe(self, value_s: float) -> None:
        self.counts[bisect.bisect_left(self.edges_s, value_s)] += 1  # (le: an edge counts a value equal to it)
        self.sum_s += value_s

    def lines(self, labels: str) -> list[str]:
        """The text-format lines: cumulative ``_bucket`` counts per ``le``, then ``_sum`` and ``_count``."""
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        total = 0
        for edge, count in zip([*map(repr, self.edges_s), "+Inf"], self.counts):
            total += count
            out.append(f'{self.name}_bucket{{{labels},le="{edge}"}} {total}')
        return out + [f"{self.name}_sum{{{labels}}} {self.sum_s!r}", f"{self.name}_count{{{labels}}} {total}"]


class LatencyHistograms:
    """vLLM's three request-latency histograms, fed with each request as it ends."""

    def __init__(self) -> None:
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_EDGES_S)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_EDGES_S)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             E2E_EDGES_S)

    def observe(self, req: Request) -> None:
        """An ended request: its first token's latency and its steps' gaps if it made tokens (an aborted one
        too, as vLLM observes them as they come), its end-to-end latency if it finished."""
        if req.first_token_ns != NO_TIME:
            self.ttft.observe((req.first_token_ns - req.arrival_ns) / 1e9)
        times = req.token_times_ns or []
        for before, after in zip(times, times[1:]):
            if after != before:  # (tokens of one step share its time)
                self.itl.observe((after - before) / 1e9)
        if req.status is Status.FINISHED:
            self.e2e.observe((req.finish_ns - req.arrival_ns) / 1e9)

    def lines(self, labels: str) -> list[str]:
        return [*self.ttft.lines(labels), *self.itl.lines(labels), *self.e2e.lines(labels)]
