"""tau-bench trajectories (a JSON array of ``{task_id, trial, reward, info, traj}``) -> sessions.

The file holds text only, so token counts come from :class:`workloads.tokens.ChatTokenModel` (a
BPE-like estimate of the text plus chat-template tokens; its error against exact counts is stated in
``workloads/tokens.py``: a few per cent per session). Each ``assistant`` message of ``traj`` is one call
of the agent LLM:

* the shared prefix (one ``prefix_group`` per distinct system policy) is the tool schema
  (``tools_schema_tokens``) + the system message;
* call k appends the messages since the previous assistant message (user turns, tool results), each
  costing its text + ``message_overhead_tokens``; for call 0 that is the first user message;
* its output is the assistant message: text + per tool call ``tool_call_overhead_tokens`` + name +
  arguments + the template tokens (so the stream grows exactly by what the next prompt re-reads);
* its wait is what happens before the next assistant message: for each tool result, the tool latency;
  for each user message, the user's think time (:class:`TauTimingModel`). Messages after the last
  assistant message (the user's closing ``###STOP###`` turn, or the result of a final transfer tool) are
  never sent to the agent LLM and add nothing.

``tools_schema_tokens = 2625``: the estimate of the 14 airline tool definitions (``get_info()`` of
``tau_bench/envs/airline/tools/*.py``, sierra-research/tau-bench at 59a200c, as compact JSON); the
trajectories do not record the schema they were run with.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Sequence

import attrs
import numpy as np

from workloads.convert._access import Doc, load_json
from workloads.errors import WorkloadFormatError
from workloads.sessions import Call, Session
from workloads.tokens import ChatTokenModel

PathLike = str | os.PathLike[str]

AIRLINE_TOOLS_SCHEMA_TOKENS = 2625
"""Estimated tokens of the airline tool schema (module docstring)."""


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class TauTimingModel:
    """Tool latency and simulated-user think time, seconds, from message sizes (all configurable).

    * tool: ``tool_base_s + tool_per_token_s * result_tokens`` per tool result. Defaults: 0.3 s and 0
      (a database/API round trip; tau-bench's own tools are in-process Python and take microseconds).
    * user: ``user_base_s + user_per_read_token_s * reply_tokens + user_per_write_token_s *
      message_tokens`` per user message, reading the agent's last reply and writing the next turn.
      Defaults model tau-bench's simulated user, an LLM (gpt-4o) behind an API: 0.5 s to first token and
      50 tokens/s of writing, no reading time. :meth:`human` gives a person: 1 s + reading at 5 tokens/s
      (about 230 words per minute) + typing at 1 token/s (about 45 words per minute).
    * ``sigma``: when > 0, each wait is multiplied by a log-normal factor ``exp(N(-sigma^2/2, sigma))``
      (mean 1), drawn from ``default_rng([seed, crc32(session id)])``.
    """

    tool_base_s: float = attrs.field(default=0.3, validator=_non_negative)
    tool_per_token_s: float = attrs.field(default=0.0, validator=_non_negative)
    user_base_s: float = attrs.field(default=0.5, validator=_non_negative)
    user_per_read_token_s: float = attrs.field(default=0.0, validator=_non_negative)
    user_per_write_token_s: float = attrs.field(default=0.02, validator=_non_negative)
    sigma: float = attrs.field(default=0.0, validator=_non_negative)

    @classmethod
    def human(cls) -> TauTimingModel:
        return cls(user_base_s=1.0, user_per_read_token_s=0.2, user_per_write_token_s=1.0)

    def tool_s(self, result_tokens: int) -> float:
        return self.tool_base_s + self.tool_per_token_s * result_tokens

    def user_s(self, reply_tokens: int, message_tokens: int) -> float:
        return (
            self.user_base_s
            + self.user_per_read_token_s * reply_tokens
            + self.user_per_write_token_s * message_tokens
        )


def convert_tau_bench(
    inputs: Sequence[PathLike],
    *,
    seed: int = 0,
    timing: TauTimingModel | str | dict[str, float] | None = None,
    tokens: ChatTokenModel | dict[str, int] | None = None,
    tools_schema_tokens: int = AIRLINE_TOOLS_SCHEMA_TOKENS,
) -> list[Session]:
    """All trajectories of the given tau-bench files, in file order; ids ``task{task_id}-trial{trial}``.

    ``timing`` is a :class:`TauTimingModel`, ``"llm"`` (the default) or ``"human"``, or a mapping of its
    fields; ``tokens`` a :class:`ChatTokenModel` or a mapping of its fields (so both can come from the CLI's
    ``--set timing='{"tool_base_s": 1.0}'``).
    """
    timing = _timing(timing)
    model = tokens if isinstance(tokens, ChatTokenModel) else ChatTokenModel(**(tokens or {}))
    if tools_schema_tokens < 0:
        raise ValueError(f"tools_schema_tokens must be >= 0, got {tools_schema_tokens}")
    sessions: list[Session] = []
    seen: dict[str, str] = {}
    for path in inputs:
        root = Doc(path, load_json(path))
        for entry in root.items():
            session = _convert_entry(entry, seed, timing, model, tools_schema_tokens)
            if session.id in seen:
                raise entry.fail(
                    f"duplicate trajectory {session.id!r} (first in {seen[session.id]})", entry.where
                )
            seen[session.id] = f"{path} {entry.where}"
            sessions.append(session)
    return sessions


def _timing(value: TauTimingModel | str | dict[str, float] | None) -> TauTimingModel:
    if value is None or value == "llm":
        return TauTimingModel()
    if value == "human":
        return TauTimingModel.human()
    if isinstance(value, TauTimingModel):
        return value
    if isinstance(value, dict):
        return TauTimingModel(**value)
    raise ValueError(f"timing: expected 'llm', 'human' or a mapping of TauTimingModel fields, got {value!r}")


def _convert_entry(
    entry: Doc, seed: int, timing: TauTimingModel, model: ChatTokenModel, tools_schema_tokens: int
) -> Session:
    session_id = f"task{_int(entry.get('task_id'))}-trial{_int(entry.get('trial'))}"
    traj = entry.get("traj").items()
    if not traj or traj[0].get("role").str_() != "system":
        raise entry.fail(
            "expected the trajectory to start with the system policy message", entry.where + ".traj[0]"
        )
    system = traj[0].get("content").text()
    sizes = [_message_tokens(model, m) for m in traj]
    roles = [m.get("role").str_() for m in traj]
    for m, role in zip(traj, roles):
        if role not in ("system", "user", "assistant", "tool"):
            raise m.fail(
                f"expected a role in ['assistant', 'system', 'tool', 'user'], got {role!r}", m.where + ".role"
            )
    calls_at = [i for i, role in enumerate(roles) if role == "assistant"]
    if not calls_at:
        raise entry.fail("expected at least one assistant message", entry.where + ".traj")
    rng = np.random.default_rng([seed, zlib.crc32(session_id.encode("utf-8"))])
    calls = []
    previous = 0
    for k, i in enumerate(calls_at):
        append = sum(sizes[previous + 1 : i]) if k else sum(sizes[1:i])
        wait = 0.0
        if k + 1 < len(calls_at):
            wait = _wait(timing, rng, roles, sizes, i, calls_at[k + 1])
        calls.append(Call(append_tokens=append, output_tokens=sizes[i], wait_after_s=round(wait, 6)))
        previous = i
    group = f"tau-bench/{hashlib.sha1(system.encode('utf-8')).hexdigest()[:12]}"
    return Session(
        id=session_id, calls=tuple(calls), prefix_group=group, prefix_tokens=tools_schema_tokens + sizes[0]
    )


def _wait(
    timing: TauTimingModel,
    rng: np.random.Generator,
    roles: list[str],
    sizes: list[int],
    call: int,
    next_call: int,
) -> float:
    total = 0.0
    for j in range(call + 1, next_call):
        base = timing.tool_s(sizes[j]) if roles[j] == "tool" else timing.user_s(sizes[call], sizes[j])
        if timing.sigma > 0:
            base *= float(np.exp(rng.normal(-timing.sigma**2 / 2, timing.sigma)))
        total += base
    return total


def _message_tokens(model: ChatTokenModel, message: Doc) -> int:
    text = message.get("content").text() if message.has("content") else ""
    calls = []
    if message.has("tool_calls"):
        for call in message.get("tool_calls").items():
            function = call.get("function")
            calls.append((function.get("name").str_(), function.get("arguments").str_()))
    return model.message(text, calls)


def _int(doc: Doc) -> int:
    if isinstance(doc.value, bool) or not isinstance(doc.value, int):
        raise doc.fail(f"expected an integer, got {doc.value!r}")
    return doc.value


__all__ = ["AIRLINE_TOOLS_SCHEMA_TOKENS", "TauTimingModel", "WorkloadFormatError", "convert_tau_bench"]
