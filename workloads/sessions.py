"""The neutral session-script format: what every reader, converter and generator produces.

A *session* is a closed-loop conversation or agent run: a sequence of LLM calls whose context grows.
Call k's prompt is: the shared prefix of the session's ``prefix_group`` (``prefix_tokens`` long), then the
session's own context stream. Before call k the stream is optionally cut to ``keep_tokens`` (history
compaction, dropped reasoning) and then ``append_tokens`` new tokens are added (user message, tool result).
After call k its ``output_tokens`` join the stream. So call k+1's prompt starts with call k's prompt and
output, and prefix caching sees the reuse a real engine would.

An open-loop request stream is the one-call case. Mooncake-style traces that name their prompt blocks
directly put them in ``Call.block_hashes`` (one id per ``hash_block_tokens`` tokens, equal ids meaning equal
prefixes) instead of relying on the stream identity: such a call's prompt is the prefix, then its
``append_tokens`` tokens named by the ids; the stream before it is dropped, and its output joins the new one.

File form (JSONL, version 1): the first line is a header object
``{"format": "servetwin-sessions", "version": 1, "source": "...", ...}``; each further line is one session
object as written by :func:`session_to_dict`. See ``workloads/FORMAT.md``.
"""

from __future__ import annotations

from typing import Any

import attrs

FORMAT_NAME = "servetwin-sessions"
FORMAT_VERSION = 1
INT64_MAX = 2**63 - 1
"""The largest count or priority a workload file may give: the twin's tables and its compiled block pool
count in 64 bits, and a prompt longer than this is no Python sequence length."""


def _non_negative(instance: Any, attribute: attrs.Attribute, value: float | int) -> None:  # type: ignore[type-arg]
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _optional_non_negative(instance: Any, attribute: attrs.Attribute, value: int | None) -> None:  # type: ignore[type-arg]
    if value is not None and value < 0:
        raise ValueError(f"{attribute.name} must be >= 0 or null, got {value!r}")


def _positive(instance: Any, attribute: attrs.Attribute, value: int) -> None:  # type: ignore[type-arg]
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value!r}")


@attrs.frozen(kw_only=True)
class Call:
    """One LLM call of a session."""

    append_tokens: int = attrs.field(validator=_non_negative)
    """Tokens added to the context before this call (for call 0: the prompt after the shared prefix)."""
    output_tokens: int = attrs.field(validator=_positive)
    """Tokens the model generates (the request's ``max_tokens`` with ignore_eos; engines want at least 1)."""
    wait_after_s: float = attrs.field(default=0.0, validator=_non_negative)
    """Time after the last output token (and after sub-agents joined) before the next call is sent."""
    min_interval_s: float = attrs.field(default=0.0, validator=_non_negative)
    """The call is sent no earlier than this long after the previous call was sent (LMBenchmark pacing)."""
    keep_tokens: int | None = attrs.field(default=None, validator=_optional_non_negative)
    """If set, the session stream is cut to its first ``keep_tokens`` tokens before appending."""
    block_hashes: tuple[int, ...] | None = None
    """Explicit prompt block identities (Mooncake ``hash_ids``), replacing the stream identity."""
    hash_block_tokens: int = 512
    """Tokens per entry of ``block_hashes``."""
    subagents: tuple[Session, ...] = ()
    """Sessions started when this call finishes; the parent waits for all of them (a join) before its wait."""
    fork_context: bool = False
    """Sub-agents start with the parent's whole context as their prefix instead of only the prefix group."""


@attrs.frozen(kw_only=True)
class Session:
    """A closed-loop sequence of calls."""

    id: str
    calls: tuple[Call, ...] = attrs.field()
    arrival_s: float | None = None
    """Absolute arrival time; ``None`` lets the workload's arrival rule place the session."""
    prefix_group: str | None = None
    """Sessions of one group share their first ``prefix_tokens`` tokens (a system prompt)."""
    prefix_tokens: int = attrs.field(default=0, validator=_non_negative)
    priority: int = 0

    @calls.validator
    def _check_calls(self, attribute: attrs.Attribute, value: tuple[Call, ...]) -> None:  # type: ignore[type-arg]
        if not value:
            raise ValueError(f"session {self.id!r} has no calls")

    def __attrs_post_init__(self) -> None:
        # A prefix belongs to a group: without one, prompt_tokens counted it but the file format (and the
        # driver) have no such prefix, so a written session read back with other prompt lengths.
        if self.prefix_tokens and self.prefix_group is None:
            raise ValueError(f"session {self.id!r}: prefix_tokens {self.prefix_tokens} needs a prefix_group")


def session_to_dict(session: Session) -> dict[str, Any]:
    """The JSON object of one session line; default-valued fields are left out."""
    out: dict[str, Any] = {"id": session.id}
    if session.arrival_s is not None:
        out["arrival_s"] = session.arrival_s
    if session.prefix_group is not None:
        out["prefix_group"] = session.prefix_group
        out["prefix_tokens"] = session.prefix_tokens
    if session.priority:
        out["priority"] = session.priority
    out["calls"] = [_call_to_dict(c) for c in session.calls]
    return out


def _call_to_dict(call: Call) -> dict[str, Any]:
    out: dict[str, Any] = {"append": call.append_tokens, "output": call.output_tokens}
    if call.wait_after_s:
        out["wait_s"] = call.wait_after_s
    if call.min_interval_s:
        out["min_interval_s"] = call.min_interval_s
    if call.keep_tokens is not None:
        out["keep"] = call.keep_tokens
    if call.block_hashes is not None:
        out["block_hashes"] = list(call.block_hashes)
        out["hash_block_tokens"] = call.hash_block_tokens
    if call.subagents:
        out["subagents"] = [session_to_dict(s) for s in call.subagents]
    if call.fork_context:
        out["fork_context"] = True
    return out


def kept_stream(call: Call, stream: int) -> int:
    """The tokens of the session stream (``stream`` long before ``call``) that ``call``'s prompt keeps after
    the prefix: all of it, its first ``keep_tokens``, or none when ``block_hashes`` name the prompt (the
    module docstring)."""
    if call.block_hashes is not None:
        return 0
    return stream if call.keep_tokens is None else min(stream, call.keep_tokens)


def prompt_tokens(session: Session, *, context_tokens: int | None = None) -> list[int]:
    """Each call's whole prompt length: prefix + the stream after keep/append (see the module docstring).

    ``context_tokens`` replaces the prefix-group length; it is the parent's whole context for a sub-agent
    started with ``fork_context``. Sub-agents' own calls are not listed (walk ``Call.subagents`` for them).
    """
    prefix = session.prefix_tokens if context_tokens is None else context_tokens
    stream = 0
    out: list[int] = []
    for call in session.calls:
        stream = kept_stream(call, stream) + call.append_tokens
        out.append(prefix + stream)
        stream += call.output_tokens
    return out


def iter_calls(session: Session, *, context_tokens: int | None = None) -> list[tuple[Session, int, Call, int]]:
    """Every call of a session and its sub-agents, depth first: ``(session, index, call, prompt_tokens)``."""
    out: list[tuple[Session, int, Call, int]] = []
    prompts = prompt_tokens(session, context_tokens=context_tokens)
    for k, (call, prompt) in enumerate(zip(session.calls, prompts)):
        out.append((session, k, call, prompt))
        for sub in call.subagents:
            out.extend(iter_calls(sub, context_tokens=prompt + call.output_tokens if call.fork_context else None))
    return out
