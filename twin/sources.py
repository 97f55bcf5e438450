"""Workload and arrival kinds: how a config's ``workload`` section becomes sessions with start times."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs
import numpy as np

from twin.config import (CLOCK_MAX_S, ArrivalSpec, WorkloadSpec, non_negative, on_clock, one_of, positive,
                         rate_on_clock)
from twin.core.errors import ConfigError
from twin.registry import register
from twin.core.clock import CLOCK_RANGE
from workloads.generators import POOL_SAMPLINGS
from workloads.sessions import Session

PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@attrs.frozen(kw_only=True)
class WorkloadPlan:
    sessions: Sequence[Session]
    start_s: np.ndarray
    max_concurrent: int | None = None
    wait_scale: float = 1.0

    def __attrs_post_init__(self) -> None:
        # A time past the clock's range stalled the run (the queues take nothing queued past 2**62 ns) and
        # the monitor then ticked through the gap (a hang); a trace in epoch milliseconds read as seconds
        # is such a case, and an infinite time a traceback naming nothing.
        start = np.asarray(self.start_s, dtype=np.float64)
        late = np.flatnonzero(~(start <= CLOCK_MAX_S))
        if len(late):
            i = int(late[0])
            raise ConfigError("workload", f"session {self.sessions[i].id!r} starts at {float(start[i])!r} s, past "
                              f"{CLOCK_RANGE}")
        for session, t in zip(self.sessions, start.tolist()):
            if len(session.calls) > 1 or session.calls[0].subagents:
                waits = _waits_s(session, self.wait_scale)
                if not t + waits <= CLOCK_MAX_S:
                    raise ConfigError("workload", f"session {session.id!r} starts at {t!r} s and its waits add up "
                                      f"to {waits!r} s (wait_s x wait_scale and min_interval_s, its sub-agents' "
                                      f"included), past {CLOCK_RANGE}")


def _waits_s(session: Session, wait_scale: float) -> float:
    """The waits and pacing intervals of ``session`` and its sub-agents, summed as the driver takes them (no
    wait after the last call): its calls are sent no later than its start plus these and the service times."""
    last = len(session.calls) - 1
    return sum((c.wait_after_s * wait_scale if k < last else 0.0) + c.min_interval_s
               + sum(_waits_s(s, wait_scale) for s in c.subagents) for k, c in enumerate(session.calls))


def resolve_data_path(path: str) -> Path:
    """A path as given, or ``pkg:<path>`` inside the installed project (shipped data)."""
    if path.startswith("pkg:"):
        return PACKAGE_ROOT / path[4:]
    return Path(path)


def read_workload_file(read: Callable[[Path], list[Session]], path: str) -> list[Session]:
    """The sessions ``read`` takes from the workload's file; one that cannot be opened names the field (a
    bare OSError named neither the field nor the config), and so does one with no sessions: the readers take
    a header alone as an empty workload (``twin workload stats`` counts it), which ran 0 requests to null
    metrics."""
    try:
        sessions = read(resolve_data_path(path))
    except OSError as exc:
        raise ConfigError("workload.path", f"cannot read {path!r}: {exc.strerror or exc}") from None
    if not sessions:
        raise ConfigError("workload.path", f"no requests in {path!r}: the file has a header and nothing after it")
    return sessions


# ------------------------------------------------------------------------------------------ arrivals
@register("arrival", "trace")
@attrs.frozen(kw_only=True)
class TraceArrival(ArrivalSpec):
    """Each session starts at its own ``arrival_s`` (times multiplied by ``time_scale``)."""

    time_scale: float = attrs.field(default=1.0, validator=positive)
    """Factor on every session's arrival_s (0.5 replays twice as fast)."""

    def start_times(self, rng: np.random.Generator, sessions: Sequence[Session]) -> tuple[np.ndarray, int | None]:
        missing = [s.id for s in sessions if s.arrival_s is None]
        if missing:
            raise ConfigError("workload.arrival", f"kind 'trace' needs arrival_s on every session; "
                                                  f"{len(missing)} have none (first: {missing[0]!r})")
        return np.array([s.arrival_s for s in sessions], dtype=np.float64) * self.time_scale, None


@register("arrival", "poisson")
@attrs.frozen(kw_only=True)
class PoissonArrival(ArrivalSpec):
    rate_per_s: float = attrs.field(validator=[positive, rate_on_clock])
    """Mean session starts per second (required)."""
    start_s: float = attrs.field(default=0.0, validator=[non_negative, on_clock])
    """Time the process starts, in seconds; the first session starts one gap after it."""

    def start_times(self, rng: np.random.Generator, sessions: Sequence[Session]) -> tuple[np.ndarray, int | None]:
        from workloads.generators import poisson_arrivals

        return poisson_arrivals(rng, self.rate_per_s, len(sessions), self.start_s), None


@register("arrival", "gamma")
@attrs.frozen(kw_only=True)
class GammaArrival(ArrivalSpec):
    """Gamma inter-arrival gaps with coefficient of variation ``cv`` (1 = Poisson, > 1 burstier)."""

    rate_per_s: float = attrs.field(validator=[positive, rate_on_clock])
    """Mean session starts per second (required)."""
    cv: float = attrs.field(default=1.0, validator=positive)
    """Coefficient of variation of the gaps (1: Poisson; > 1: burstier; vLLM's --burstiness is 1 / cv**2)."""
    start_s: float = attrs.field(default=0.0, validator=[non_negative, on_clock])
    """Time the process starts, in seconds; the first session starts one gap after it."""

    def __attrs_post_init__(self) -> None:
        # The gaps' shape is 1 / cv**2 and their scale 1 / (rate x shape): past float range either way they
        # divided by zero in the run (a traceback).
        cv2 = self.cv * self.cv
        shape = 1.0 / cv2 if cv2 > 0 else math.inf
        if not (0 < shape < math.inf and 0 < self.rate_per_s * shape < math.inf):
            raise ValueError(f"cv gives gaps of shape 1 / cv**2 = {shape!r} and scale 1 / (rate_per_s x "
                             f"shape), which must be finite numbers > 0; got cv={self.cv!r}, "
                             f"rate_per_s={self.rate_per_s!r}")

    def start_times(self, rng: np.random.Generator, sessions: Sequence[Session]) -> tuple[np.ndarray, int | None]:
        from workloads.generators import gamma_arrivals

        return gamma_arrivals(rng, self.rate_per_s, self.cv, len(sessions), self.start_s), None


@register("arrival", "all_at_once")
@attrs.frozen(kw_only=True)
class AllAtOnce(ArrivalSpec):
    at_s: float = attrs.field(default=0.0, validator=[non_negative, on_clock])
    """Simulated time at which every session starts, in seconds."""

    def start_times(self, rng: np.random.Generator, sessions: Sequence[Session]) -> tuple[np.ndarray, int | None]:
        return np.full(len(sessions), self.at_s), None


@register("arrival", "concurrency")
@attrs.frozen(kw_only=True)
class FixedConcurrency(ArrivalSpec):
    """Closed loop: ``concurrency`` sessions in flight; the next starts when one finishes."""

    concurrency: int = attrs.field(validator=positive)
    """Sessions in flight at once (required)."""

    def start_times(self, rng: np.random.Generator, sessions: Sequence[Session]) -> tuple[np.ndarray, int | None]:
        return np.zeros(len(sessions)), self.concurrency


# ----------------------------------------------------------------------------------------- workloads
@attrs.frozen(kw_only=True)
class Lengths:
    """Token lengths: ``fixed``, or uniform integers in ``[low, high]``. A bare integer means fixed."""

    fixed: int | None = attrs.field(default=None, validator=positive)
    """Every length, in tokens."""
    low: int | None = attrs.field(default=None, validator=positive)
    """Smallest length of the uniform draw, in tokens (inclusive)."""
    high: int | None = attrs.field(default=None, validator=positive)
    """Largest length of the uniform draw, in tokens (inclusive)."""

    def __attrs_post_init__(self) -> None:
        if (self.fixed is None) == (self.low is None or self.high is None) or (
                self.fixed is not None and (self.low is not None or self.high is not None)):
            raise ValueError("give either fixed, or both low and high")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low must be <= high, got low={self.low}, high={self.high}")

    @property
    def longest(self) -> int:
        """The longest length this draws: ``fixed``, or ``high``."""
        longest = self.fixed if self.fixed is not None else self.high
        assert longest is not None   # (checked when built: fixed, or low and high)
        return longest

    @classmethod
    def from_scalar(cls, value: Any) -> Lengths:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer or a mapping with fixed / low and high, got {value!r}")
        return cls(fixed=value)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        from workloads.generators import sample_lengths

        return sample_lengths(rng, n, fixed=self.fixed, low=self.low, high=self.high)


def _plan(sessions: Sequence[Session], arrival: ArrivalSpec, rng: np.random.Generator,
          wait_scale: float = 1.0, max_concurrent: int | None = None) -> WorkloadPlan:
    start, cap = arrival.start_times(rng, sessions)  # type: ignore[attr-defined]
    if max_concurrent is not None:
        cap = max_concurrent if cap is None else min(cap, max_concurrent)
    return WorkloadPlan(sessions=sessions, start_s=start, max_concurrent=cap, wait_scale=wait_scale)


def _default_poisson() -> ArrivalSpec:
    return PoissonArrival(rate_per_s=10.0)


@register("workload", "synthetic")
@attrs.frozen(kw_only=True)
class SyntheticWorkload(WorkloadSpec):
    """Open-loop single-call requests with sampled lengths and an arrival process."""

    num_requests: int = attrs.field(default=1000, validator=positive)
    """Requests generated, each a session of one call."""
    arrival: ArrivalSpec = attrs.Factory(_default_poisson)
    """When the requests start (default: Poisson, 10 per second)."""
    input_tokens: Lengths = attrs.Factory(lambda: Lengths(low=128, high=2048))
    """Prompt length of each request in tokens, shared prefix included: an integer (fixed) or a Lengths
    section (default: uniform in [128, 2048])."""
    output_tokens: Lengths = attrs.Factory(lambda: Lengths(low=16, high=512))
    """Output tokens each request generates: an integer (fixed) or a Lengths section (default: uniform in [16,
    512])."""
    prefix_group: str | None = None
    """Name of the prefix every request's prompt starts with (null: none); needed by prefix_tokens."""
    prefix_tokens: int = attrs.field(default=0, validator=non_negative)
    """Tokens of that shared prefix, at most every prompt's length (0: none)."""
    prompt_pool: int | None = attrs.field(default=None, validator=positive)
    """Distinct prompts the requests draw from, as a benchmark client's dataset (genai-perf's and aiperf's
    ``--num-dataset-entries``, 100 unless given): each entry has its own sampled lengths, and requests that
    send one entry send the same tokens, which the prefix cache finds. Null: every request has a prompt of
    its own."""
    pool_sampling: str = attrs.field(default="sequential", validator=one_of(*POOL_SAMPLINGS))
    """How each request picks its entry: sequential | random (with replacement) | shuffle
    (``workloads.generators.POOL_SAMPLINGS``)."""

    def __attrs_post_init__(self) -> None:
        if self.prompt_pool is not None and (self.prefix_group is not None or self.prefix_tokens):
            raise ValueError("prompt_pool gives each dataset entry's whole prompt its own identity; a shared "
                             "prefix_group / prefix_tokens on top of it is not modelled (leave one of them out)")
        if self.prompt_pool is None and self.pool_sampling != "sequential":
            raise ValueError(f"pool_sampling {self.pool_sampling!r} needs prompt_pool (the number of dataset "
                             f"entries to draw from)")

    def build(self, rng: np.random.Generator) -> WorkloadPlan:
        from workloads.generators import OpenLoopSessions, pool_draws, pooled_sessions

        if self.prompt_pool is not None:
            isl = self.input_tokens.sample(rng, self.prompt_pool)
            osl = self.output_tokens.sample(rng, self.prompt_pool)
            entry = pool_draws(rng, self.prompt_pool, self.num_requests, self.pool_sampling)
            return _plan(pooled_sessions(entry, isl, osl), self.arrival, rng)
        isl = self.input_tokens.sample(rng, self.num_requests)
        osl = self.output_tokens.sample(rng, self.num_requests)
        short = np.flatnonzero(isl < self.prefix_tokens)
        if len(short):
            i = int(short[0])
            raise ConfigError("workload.prefix_tokens", f"every prompt starts with the {self.prefix_tokens} shared "
                              f"tokens, but request {i} drew {int(isl[i])} input tokens from workload.input_tokens")
        try:
            sessions = OpenLoopSessions(None, isl, osl, prefix_group=self.prefix_group,
                                        prefix_tokens=self.prefix_tokens)
        except ValueError as exc:
            raise ConfigError("workload", str(exc)) from None
        return _plan(sessions, self.arrival, rng)


def _trace() -> ArrivalSpec:
    return TraceArrival()


@register("workload", "trace_csv")
@attrs.frozen(kw_only=True)
class TraceCsvWorkload(WorkloadSpec):
    """Replay of a CSV of arrival time + input and output lengths (Vidur, Azure or plain columns)."""

    path: str
    """The CSV file, with Vidur, Azure or plain columns (workloads.traces.read_request_csv); relative: to the
    working directory, else the config's folder; ``pkg:`` inside the project."""
    limit: int | None = attrs.field(default=None, validator=positive)
    """Replay only the first this many rows (null: all)."""
    arrival: ArrivalSpec = attrs.Factory(_trace)
    """When the requests start (default ``trace``: each row's own arrival time)."""

    def build(self, rng: np.random.Generator) -> WorkloadPlan:
        from workloads.generators import read_request_csv

        sessions = read_workload_file(read_request_csv, self.path)
        if self.limit is not None:
            sessions = sessions[: self.limit]
        return _plan(sessions, self.arrival, rng)


@register("workload", "sessions")
@attrs.frozen(kw_only=True)
class SessionsWorkload(WorkloadSpec):
    """A session-script file (``twin workload convert`` output); ``pkg:`` paths name shipped data."""

    path: str
    """The session-script file (relative: to the working directory, else the config's folder; ``pkg:`` inside
    the project)."""
    arrival: ArrivalSpec | None = None
    """How sessions start; by default their own ``arrival_s`` (all must have one)."""
    max_concurrent_sessions: int | None = attrs.field(default=None, validator=positive)
    """Most sessions in flight at once: a session whose start time has come waits for one to finish (null: no
    cap; with arrival kind ``concurrency``, the smaller of the two)."""
    wait_scale: float = attrs.field(default=1.0, validator=non_negative)
    """Multiplies every tool / think wait (0 removes them)."""
    limit: int | None = attrs.field(default=None, validator=positive)
    """Run only the first this many sessions of the file (null: all)."""

    def build(self, rng: np.random.Generator) -> WorkloadPlan:
        from workloads.io import read_sessions

        sessions = read_workload_file(read_sessions, self.path)
        if self.limit is not None:
            sessions = sessions[: self.limit]
        return _plan(sessions, self.arrival or TraceArrival(), rng, self.wait_scale, self.max_concurrent_sessions)


def _rounds(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    if value < 2:
        raise ValueError(f"{attr.name} must be >= 2 (LMBenchmark's users ask in rounds; one round each is a "
                         f"synthetic workload), got {value!r}")


@register("workload", "lmbenchmark_multiround")
@attrs.frozen(kw_only=True)
class LMBenchmarkWorkload(WorkloadSpec):
    """LMBenchmark's synthetic multi-round QA with its own pacing (see ``workloads.generators``)."""

    num_users: int = attrs.field(default=10, validator=positive)
    """Concurrent users (LMBenchmark --num-users): the run starts with users part-way through their rounds,
    as the client's ramp-up leaves them, and a new one joins every (num_rounds - 1) / qps s."""
    num_rounds: int = attrs.field(default=5, validator=_rounds)
    """Questions each user asks, one request each (LMBenchmark --num-rounds; at least 2); users present at
    the start have fewer left."""
    qps: float = attrs.field(default=1.0, validator=[positive, rate_on_clock])
    """Requests per second over all users (LMBenchmark --qps): a user sends its next round once its previous
    answer is done and at least num_users / qps s after its previous request."""
    shared_system_prompt: int = attrs.field(default=1000, validator=non_negative)
    """Tokens of the system prompt every user's requests start with, shared by all users (LMBenchmark
    --shared-system-prompt)."""
    user_history_prompt: int = attrs.field(default=2000, validator=non_negative)
    """Tokens of each user's own context, sent after the system prompt in its first request (LMBenchmark
    --user-history-prompt)."""
    answer_len: int = attrs.field(default=100, validator=positive)
    """Output tokens of every answer (LMBenchmark --answer-len); each later round's prompt holds the earlier
    answers."""
    duration_s: float | None = attrs.field(default=None, validator=[positive, on_clock])
    """New users join while their join time is below this, in seconds (LMBenchmark --time; run.duration_s
    stops the sends). Null: one user's lifetime, num_users / qps x (num_rounds - 1) s."""

    def build(self, rng: np.random.Generator) -> WorkloadPlan:
        from workloads.generators import lmbenchmark_multiround

        sessions = lmbenchmark_multiround(self.num_users, self.num_rounds, self.qps, self.shared_system_prompt,
                                          self.user_history_prompt, self.answer_len, duration_s=self.duration_s)
        return _plan(sessions, TraceArrival(), rng)
