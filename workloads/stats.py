"""Summary statistics of a workload: sizes, token and wait distributions, and its prefix-reuse potential."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from workloads.sessions import Call, Session, iter_calls, kept_stream


def workload_stats(sessions: Sequence[Session]) -> dict[str, Any]:
    """Counts, totals, distributions and prefix-reuse potential of ``sessions`` (sub-agents included).

    * ``input_tokens``: sum over calls of each call's whole prompt; ``output_tokens``, ``wait_s`` sums.
    * ``input`` / ``output`` / ``append`` / ``wait_s_per_call`` / ``calls_per_session``: ``mean``, ``p50``,
      ``p90``, ``p99``, ``max`` (linear-interpolated percentiles).
    * ``prefix_reuse``: the prompt tokens an unbounded prefix cache could serve, in file order: within a
      session, the stream kept from the previous call (its prompt and output, after ``keep``); a
      ``prefix_group``'s shared prefix for every call after the group's first; a forked sub-agent's
      parent context; for calls with ``block_hashes``, the leading blocks whose ids appeared before (ids
      are prefix identities). ``fraction`` = reusable / ``input_tokens``.
    """
    rows = [row for s in sessions for row in iter_calls(s)]
    prompts = np.array([r[3] for r in rows], dtype=np.int64)
    outputs = np.array([r[2].output_tokens for r in rows], dtype=np.int64)
    appends = np.array([r[2].append_tokens for r in rows], dtype=np.int64)
    waits = np.array([r[2].wait_after_s for r in rows], dtype=np.float64)
    reuse = _prefix_reuse(sessions)
    # Totals in Python integers: each count fits 64 bits (the reader checks), their sum need not, and
    # numpy's int64 sum wrapped around silently (two prompts of 2**63 - 1 tokens summed to -2).
    input_tokens = sum(r[3] for r in rows)
    return {
        "sessions": len(sessions),
        "subagent_sessions": sum(_subagents(s) for s in sessions),
        "calls": len(rows),
        "input_tokens": input_tokens,
        "output_tokens": sum(r[2].output_tokens for r in rows),
        "append_tokens": sum(r[2].append_tokens for r in rows),
        "wait_s": float(waits.sum()),
        "prefix_groups": len({s.prefix_group for s in sessions if s.prefix_group is not None}),
        "calls_per_session": _distribution(np.array([len(s.calls) for s in sessions], dtype=np.float64)),
        "input": _distribution(prompts),
        "output": _distribution(outputs),
        "append": _distribution(appends),
        "wait_s_per_call": _distribution(waits),
        "arrival_s": _arrivals(sessions),
        "prefix_reuse": {
            **reuse,
            "fraction": (
                (
                    reuse["session_tokens"]
                    + reuse["group_tokens"]
                    + reuse["fork_tokens"]
                    + reuse["block_tokens"]
                )
                / input_tokens
                if input_tokens
                else 0.0
            ),
        },
    }


def _subagents(session: Session) -> int:
    return sum(1 + _subagents(sub) for call in session.calls for sub in call.subagents)


def _distribution(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
    }


def _arrivals(sessions: Sequence[Session]) -> dict[str, Any]:
    times = [s.arrival_s for s in sessions if s.arrival_s is not None]
    return {
        "timed": len(times),
        "first": min(times) if times else None,
        "last": max(times) if times else None,
    }


def _prefix_reuse(sessions: Sequence[Session]) -> dict[str, int]:
    counts = {"session_tokens": 0, "group_tokens": 0, "fork_tokens": 0, "block_tokens": 0}
    groups: set[str] = set()
    blocks: set[int] = set()

    def walk(session: Session, context: int | None) -> None:
        stream = 0
        prefix = session.prefix_tokens if context is None else context
        for k, call in enumerate(session.calls):
            kept = kept_stream(call, stream)
            prompt = prefix + kept + call.append_tokens
            if call.block_hashes is not None:
                counts["block_tokens"] += min(call.append_tokens,
                                              _seen_blocks(call, blocks) * call.hash_block_tokens)
            else:
                counts["session_tokens"] += kept
                if context is not None:
                    counts["fork_tokens"] += context
                elif session.prefix_group is not None:
                    if session.prefix_group in groups:
                        counts["group_tokens"] += session.prefix_tokens
                    groups.add(session.prefix_group)
            stream = kept + call.append_tokens + call.output_tokens
            for sub in call.subagents:
                walk(sub, prompt + call.output_tokens if call.fork_context else None)

    for session in sessions:
        walk(session, None)
    return counts


def _seen_blocks(call: Call, seen: set[int]) -> int:
    assert call.block_hashes is not None
    run = 0
    for h in call.block_hashes:
        if h not in seen:
            break
        run += 1
    seen.update(call.block_hashes)
    return run


def format_stats(stats: dict[str, Any]) -> str:
    """Human-readable lines for ``twin workload stats``."""
    reuse = stats["prefix_reuse"]
    lines = [
        f"sessions        {stats['sessions']} ({stats['subagent_sessions']} sub-agent sessions, "
        f"{stats['prefix_groups']} prefix groups)",
        f"calls           {stats['calls']}",
        f"input tokens    {stats['input_tokens']} (sum of whole prompts)",
        f"output tokens   {stats['output_tokens']}",
        f"appended tokens {stats['append_tokens']}",
        f"wait            {stats['wait_s']:.3f} s in all",
        "",
        f"{'per call':16s}{'mean':>12s}{'p50':>12s}{'p90':>12s}{'p99':>12s}{'max':>12s}",
    ]
    for key, label in (
        ("input", "input tokens"),
        ("output", "output tokens"),
        ("append", "append tokens"),
        ("wait_s_per_call", "wait s"),
        ("calls_per_session", "calls/session"),
    ):
        d = stats[key]
        lines.append(
            f"{label:16s}"
            + "".join(
                f"{d[k]:12.1f}" if key != "wait_s_per_call" else f"{d[k]:12.3f}"
                for k in ("mean", "p50", "p90", "p99", "max")
            )
        )
    lines += [
        "",
        f"prefix reuse potential {100 * reuse['fraction']:.1f} % of input tokens "
        f"(session context {reuse['session_tokens']}, shared prefix {reuse['group_tokens']}, "
        f"forked context {reuse['fork_tokens']}, trace blocks {reuse['block_tokens']})",
    ]
    arrivals = stats["arrival_s"]
    if arrivals["timed"]:
        lines.append(
            f"arrivals        {arrivals['timed']} timed, {arrivals['first']:.3f} .. {arrivals['last']:.3f} s"
        )
    else:
        lines.append("arrivals        none timed (placed by the run's arrival rule)")
    return "\n".join(lines)
