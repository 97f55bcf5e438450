"""Synthetic request streams: arrival processes, ISL / OSL samplers, open-loop and LMBenchmark multi-round QA.

Every random function takes a ``numpy.random.Generator`` explicitly, so one seeded generator per run makes
the whole workload reproducible.
"""

from __future__ import annotations

import math
from typing import Sequence, overload

import numpy as np
import numpy.typing as npt

from workloads.sessions import Call, Session


def poisson_arrivals(rng: np.random.Generator, rate_per_s: float, n: int, start_s: float = 0.0) -> np.ndarray:
    """``n`` arrival times of a Poisson process (exponential gaps, mean ``1 / rate_per_s``) after ``start_s``.

    The first arrival is one gap after ``start_s``, as in vLLM's benchmark client.
    """
    _check_rate(rate_per_s, n)
    gaps = rng.exponential(1.0 / rate_per_s, size=n)
    return start_s + np.cumsum(gaps)


def gamma_arrivals(
    rng: np.random.Generator, rate_per_s: float, cv: float, n: int, start_s: float = 0.0
) -> np.ndarray:
    """``n`` arrivals with gamma gaps of mean ``1 / rate_per_s`` and coefficient of variation ``cv``.

    Shape ``k = 1 / cv**2`` and scale ``1 / (rate * k)``: ``cv = 1`` is Poisson, ``cv > 1`` is burstier
    (vLLM's ``--burstiness`` is ``1 / cv**2``).
    """
    _check_rate(rate_per_s, n)
    if not cv > 0 or not math.isfinite(cv):
        raise ValueError(f"cv must be a finite number > 0, got {cv!r}")
    shape = 1.0 / (cv * cv)
    gaps = rng.gamma(shape, 1.0 / (rate_per_s * shape), size=n)
    return start_s + np.cumsum(gaps)


def sample_lengths(
    rng: np.random.Generator,
    n: int,
    *,
    fixed: int | None = None,
    low: int | None = None,
    high: int | None = None,
) -> np.ndarray:
    """``n`` token lengths: all ``fixed``, or uniform integers in ``[low, high]`` inclusive (InferenceX).

    The fixed case draws nothing from ``rng``, so switching a length between fixed and ranged does not shift
    the other random streams only when they use their own generators.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if fixed is not None:
        if low is not None or high is not None:
            raise ValueError("give either fixed or low/high, not both")
        if fixed < 0:
            raise ValueError(f"fixed must be >= 0, got {fixed}")
        return np.full(n, fixed, dtype=np.int64)
    if low is None or high is None:
        raise ValueError("give fixed, or both low and high")
    if not 0 <= low <= high:
        raise ValueError(f"need 0 <= low <= high, got low={low}, high={high}")
    return rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)


def open_loop_sessions(
    arrivals_s: npt.ArrayLike | None,
    input_tokens: npt.ArrayLike,
    output_tokens: npt.ArrayLike,
    *,
    id_prefix: str = "req",
    prefix_group: str | None = None,
    prefix_tokens: int = 0,
) -> list[Session]:
    """One one-call session per request; ``arrivals_s=None`` leaves arrivals to the workload's rule.

    ``input_tokens`` are whole prompt lengths; with a ``prefix_group`` the first ``prefix_tokens`` of each
    prompt are the shared prefix and the rest is the call's append. Ids are ``{id_prefix}-{i}``.
    """
    return list(OpenLoopSessions(arrivals_s, input_tokens, output_tokens, id_prefix=id_prefix,
                                 prefix_group=prefix_group, prefix_tokens=prefix_tokens))


class OpenLoopSessions(Sequence[Session]):
    """:func:`open_loop_sessions` as a sequence that makes each session when it is read: a million-request
    workload holds three arrays of lengths instead of a million session objects. Reading session i twice
    gives two equal sessions."""

    def __init__(self, arrivals_s: npt.ArrayLike | None, input_tokens: npt.ArrayLike,
                 output_tokens: npt.ArrayLike, *, id_prefix: str = "req", prefix_group: str | None = None,
                 prefix_tokens: int = 0) -> None:
        inputs = np.asarray(input_tokens, dtype=np.int64).reshape(-1)
        outputs = np.asarray(output_tokens, dtype=np.int64).reshape(-1)
        if len(inputs) != len(outputs):
            raise ValueError(f"{len(inputs)} input lengths but {len(outputs)} output lengths")
        arrivals = None
        if arrivals_s is not None:
            arrivals = np.asarray(arrivals_s, dtype=np.float64).reshape(-1)
            if len(arrivals) != len(inputs):
                raise ValueError(f"{len(arrivals)} arrivals but {len(inputs)} requests")
        if prefix_group is None and prefix_tokens:
            raise ValueError("prefix_tokens needs a prefix_group")
        short = np.flatnonzero(inputs < prefix_tokens)
        if len(short):
            i = int(short[0])
            raise ValueError(f"request {i}: input {int(inputs[i])} is shorter than the shared prefix {prefix_tokens}")
        self._inputs, self._outputs, self._arrivals = inputs, outputs, arrivals
        self._id_prefix, self._group, self._prefix = id_prefix, prefix_group, prefix_tokens

    def __len__(self) -> int:
        return len(self._inputs)

    @overload
    def __getitem__(self, i: int) -> Session: ...
    @overload
    def __getitem__(self, i: slice) -> list[Session]: ...

    def __getitem__(self, i: int | slice) -> Session | list[Session]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"session {i} of {n}")
        i %= n
        return Session(
            id=f"{self._id_prefix}-{i}",
            arrival_s=None if self._arrivals is None else float(self._arrivals[i]),
            prefix_group=self._group,
            prefix_tokens=self._prefix,
            calls=(Call(append_tokens=int(self._inputs[i]) - self._prefix, output_tokens=int(self._outputs[i])),),
        )


POOL_SAMPLINGS = ("sequential", "random", "shuffle")
"""How a benchmark client picks each request's prompt from its dataset of ``pool`` entries (aiperf's
``--dataset-sampling-strategy``): ``sequential`` takes entry i mod pool for request i (perf_analyzer under
genai-perf walks its input data so); ``random`` draws entries uniformly with replacement (aiperf's only rule
before it had samplers, DatasetManager._return_any_conversation at db4f639, 2025-10); ``shuffle`` walks a
permutation and draws a fresh one after each pass (aiperf's default for synthetic data in its later versions)."""


def pool_draws(rng: np.random.Generator, pool: int, n: int, sampling: str) -> np.ndarray:
    """The dataset entry (0 .. pool - 1) each of ``n`` requests sends, in request order."""
    if pool < 1 or n < 0:
        raise ValueError(f"need a pool of at least 1 entry and n >= 0, got pool={pool}, n={n}")
    if sampling == "sequential":
        return np.arange(n, dtype=np.int64) % pool
    if sampling == "random":
        return rng.integers(0, pool, size=n, dtype=np.int64)
    if sampling == "shuffle":
        passes = -(-n // pool)
        return np.concatenate([rng.permutation(pool) for _ in range(passes)] or [np.zeros(0, np.int64)])[:n]
    raise ValueError(f"sampling must be one of {', '.join(POOL_SAMPLINGS)}, got {sampling!r}")


def pooled_sessions(entry: npt.ArrayLike, input_tokens: npt.ArrayLike, output_tokens: npt.ArrayLike, *,
                    id_prefix: str = "req", group_prefix: str = "prompt-pool/") -> list[Session]:
    """One one-call session per request, request i sending dataset entry ``entry[i]``: the entry's whole
    prompt (``input_tokens[entry]`` tokens) is the prefix group ``{group_prefix}{entry}``, so requests that
    send one entry send the same tokens (the engine's prefix cache finds the repeat), and the entry fixes the
    output length too (``output_tokens[entry]``, the payload's max_tokens with ignore_eos)."""
    entries = np.asarray(entry, dtype=np.int64).reshape(-1)
    inputs = np.asarray(input_tokens, dtype=np.int64).reshape(-1)
    outputs = np.asarray(output_tokens, dtype=np.int64).reshape(-1)
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} input lengths but {len(outputs)} output lengths")
    if len(entries) and not (0 <= entries.min() and entries.max() < len(inputs)):
        raise ValueError(f"entries must lie in 0 .. {len(inputs) - 1}")
    return [Session(id=f"{id_prefix}-{i}", prefix_group=f"{group_prefix}{k}", prefix_tokens=int(inputs[k]),
                    calls=(Call(append_tokens=0, output_tokens=int(outputs[k])),))
            for i, k in enumerate(entries.tolist())]


def lmbenchmark_multiround(
    num_users: int,
    num_rounds: int,
    qps: float,
    shared_system_prompt: int,
    user_history_prompt: int,
    answer_len: int,
    *,
    question_len: int = 20,
    duration_s: float | None = None,
    prefix_group: str = "lmbenchmark-system",
) -> list[Session]:
    """LMBenchmark's synthetic multi-round QA client (``multi-round-qa.py``) as sessions, with its pacing.

    Followed from the client's ``UserSessionManager`` / ``UserSession`` (LMCache/LMBenchmark, Apache-2.0),
    with the same floating-point arithmetic, so the times are the client's own with its 0.1 s polling
    removed (a request goes out at the instant its condition becomes true):

    * ``interval = num_users / qps``; ``gap = interval * (num_rounds - 1) / num_users`` between joining users.
    * Every user's first prompt is the shared system prompt (``shared_system_prompt`` tokens: the prefix
      group) + its own context (``user_history_prompt``) + a question (``question_len``, default 20: the
      client's "Here's question #N: can you tell me a new long story with a happy ending?" is 19 Llama-3
      tokens; the few framing words around the dummy text are not counted). Each later round appends a
      question after the previous answer (``answer_len`` tokens, which the stream already holds).
    * A user sends a round only after its previous answer finished and at least ``interval`` after its
      previous request: ``Call.min_interval_s = interval`` on every call after the first.
    * Pre-staggered start (the client's ramp-up): ramp user ``i`` (``0 <= i < num_users``) is placed
      ``offset = num_users * gap - i * gap`` into its life: it has already "asked" ``q = int(offset /
      interval) + 1`` questions (none were sent: its history starts empty), so it sends its first request
      at ``-offset + q * interval`` and ``num_rounds - q`` requests in all; a user with no rounds left is
      not emitted. These are ids ``user-1 .. user-{num_users}``.
    * New users join at ``0, gap, 2 gap, ...`` (ids from ``user-{num_users + 1}``) while their join time is
      ``< duration_s``, each with all ``num_rounds`` rounds; ``duration_s=None`` means one session
      lifetime, ``interval * (num_rounds - 1)``. Stopping requests at the end of the run is the runner's
      job (the client also stops sending after ``--time``).

    Sessions are listed in user-id order.
    """
    _check_multiround(num_users, num_rounds, qps, duration_s, shared_system_prompt=shared_system_prompt,
                      user_history_prompt=user_history_prompt, answer_len=answer_len, question_len=question_len)
    interval_s = num_users / qps
    alive_s = interval_s * (num_rounds - 1)
    gap_s = alive_s / (num_users + 0)
    ramp_up_s = num_users * gap_s
    end_s = alive_s if duration_s is None else duration_s

    def user(user_id: int, arrival_s: float, rounds: int) -> Session:
        first = Call(append_tokens=user_history_prompt + question_len, output_tokens=answer_len)
        rest = [
            Call(append_tokens=question_len, output_tokens=answer_len, min_interval_s=interval_s)
            for _ in range(rounds - 1)
        ]
        return Session(
            id=f"user-{user_id}",
            arrival_s=arrival_s,
            prefix_group=prefix_group,
            prefix_tokens=shared_system_prompt,
            calls=(first, *rest),
        )

    sessions = []
    for i in range(num_users):
        offset_s = ramp_up_s - i * gap_s
        asked = int(offset_s / interval_s) + 1
        if asked < num_rounds:
            last_request_s = 0.0 - offset_s + (asked - 1) * interval_s
            sessions.append(user(i + 1, last_request_s + interval_s, num_rounds - asked))
    j = 0
    while j * gap_s < end_s:
        sessions.append(user(num_users + 1 + j, j * gap_s, num_rounds))
        j += 1
    return sessions


def _check_multiround(num_users: int, num_rounds: int, qps: float, duration_s: float | None,
                      **lengths: int) -> None:
    """:func:`lmbenchmark_multiround`'s arguments, each error naming the argument (``lengths``: token counts)."""
    if num_users < 1 or num_rounds < 2:
        raise ValueError(f"need num_users >= 1 and num_rounds >= 2, got {num_users}, {num_rounds}")
    if not qps > 0 or not math.isfinite(qps):
        raise ValueError(f"qps must be a finite number > 0, got {qps!r}")
    for name, value in lengths.items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if lengths["answer_len"] < 1:  # (a Call refused 0 later, as output_tokens, a name the caller never gave)
        raise ValueError(f"answer_len must be >= 1 (engines reject max_tokens 0), got {lengths['answer_len']}")
    if duration_s is not None and not (duration_s >= 0 and math.isfinite(duration_s)):
        # users join every gap while their join time is < duration_s: an infinite one never stopped
        raise ValueError(f"duration_s must be a finite number >= 0 or None, got {duration_s!r}")


def _check_rate(rate_per_s: float, n: int) -> None:
    if not rate_per_s > 0 or not math.isfinite(rate_per_s):
        raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s!r}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")


# The trace reader lives with the other readers; it is part of the generator API too.
from workloads.traces import read_request_csv  # noqa: E402

__all__ = [
    "gamma_arrivals",
    "lmbenchmark_multiround",
    "open_loop_sessions",
    "poisson_arrivals",
    "read_request_csv",
    "sample_lengths",
]
