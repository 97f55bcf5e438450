"""mini-swe-agent trajectories (``*.traj.json``, ``mini-swe-agent-1`` and ``-1.1`` formats) -> sessions.

Each assistant message is one LLM call. Its ``extra.response.usage`` gives the exact ``prompt_tokens`` P_k
and ``completion_tokens`` O_k; the converted session reproduces both exactly (``prompt_tokens(session)[k]
== P_k``, ``output == O_k``). The two formats are told apart by their structure, not only by their
``trajectory_format`` string: 1.1 (mini-swe-agent 2.x) uses native tool calls (``tool_calls`` on assistant
messages, ``tool`` role results, ``extra.timestamp`` on messages); 1 (mini-swe-agent 1.x) writes the
command in the text and returns observations as ``user`` messages, with only the provider's whole-second
``created`` stamp. Unseen versions convert when they keep this structure.

Context rule, for call k >= 1 with P = P_{k-1}, O = O_{k-1}, R = its reported reasoning tokens
(``completion_tokens_details.reasoning_tokens``, 0 when absent), N = P_k:

* extension: if R == 0 and N >= P + O, the previous prompt and output are kept whole and
  ``append = N - P - O`` (all shared DeepSeek trajectories).
* rewrite: otherwise the output did not stay in the context as generated (reasoning dropped, the reply
  re-rendered, or the provider's count shrank). The stream is cut to ``keep = min(P, N - E) - prefix``
  (at least 0), where E estimates the messages added after the previous prompt (the visible reply and the
  observations, :class:`workloads.tokens.ChatTokenModel`), and ``append = N - prefix - keep``. So the
  previous prompt is reused as far as the counts allow and the new messages are never counted as reused.

Shared prefix: sessions whose system message (and tool use) are equal form one ``prefix_group``. Its length
is an estimate (usage does not split the prompt): 320 tokens for tool-calling trajectories — 20 of the 23
DeepSeek trajectories report ``prompt_cache_hit_tokens = 320`` on their first call, i.e. a cross-instance
shared prefix (tool schema + system message) of 320-383 tokens at DeepSeek's 64-token cache granularity —
and the estimated system message for text-based ones. ``prefix_tokens=`` overrides it (0 = no group). A
session with a prompt shorter than the prefix has no group (the prefix heads every prompt).

Tool wait after call k (until the next call is sent): with timestamps, ``ts(last observation before call
k+1) - ts(call k)`` (the assistant stamp is taken when the response returned, the tool stamp when the
command finished). Without them, a draw from :data:`TOOL_WAIT_QUANTILES_S` (fitted on the timestamped
trajectories), capped by the provider's ``created`` stamps: ``created(k+1) - created(k) + 1 s`` bounds the
tool time plus the next call's own time. The draws use ``numpy.random.default_rng([seed, crc32(id)])``,
so a session's waits do not depend on which other files are converted. The last call waits 0.

Clock quirks: the two stamps are taken at different points, and real trajectories sometimes stamp an
observation up to about a second before the call that asked for it. An inversion of at most
:data:`CLOCK_SKEW_TOLERANCE_S` is taken as that skew: the wait is 0 and one
:class:`~workloads.errors.WorkloadWarning` per file counts the calls and gives the largest inversion. A
larger one is not skew but a broken file, an error naming the message and both stamps.
"""

from __future__ import annotations

import hashlib
import os
import warnings
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from workloads.convert._access import Doc, load_json
from workloads.errors import WorkloadFormatError, WorkloadWarning
from workloads.sessions import Call, Session
from workloads.tokens import ChatTokenModel

PathLike = str | os.PathLike[str]

TOOL_CALLING_PREFIX_TOKENS = 320
"""Shared prefix of tool-calling trajectories: DeepSeek's first-call cache hits (module docstring)."""

CLOCK_SKEW_TOLERANCE_S = 10.0
"""Largest observation-before-call inversion taken as clock skew (wait 0 and a warning), seconds; a larger
one is an error. Seen in real output: up to about 1 s; tool waits reach 60 s, so 10 s is far from both."""

TOOL_WAIT_QUANTILES = (
    0.0,
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    0.95,
    0.97,
    0.98,
    0.99,
    0.993,
    0.996,
    0.998,
    0.999,
    1.0,
)
TOOL_WAIT_QUANTILES_S = (
    0.091,
    0.143,
    0.167,
    0.198,
    0.228,
    0.255,
    0.277,
    0.298,
    0.327,
    0.39,
    0.531,
    0.955,
    1.802,
    3.884,
    8.519,
    9.73,
    11.459,
    17.121,
    31.478,
    60.06,
)
"""Empirical inverse CDF of the tool wait, seconds, linear between knots.

Provenance: the 1,820 tool executions of the 23 mini-swe-agent 2.2.7 DeepSeek SWE-bench Lite dev
trajectories (SWE-agent/mini-swe-agent PR 816, Docker environment), wait = ts(tool) - ts(assistant).
Data: mean 0.557 s, median 0.277 s, p90 0.531 s, max 60.06 s (the command timeout); the table's mean is
0.559 s. A log-normal fit (mu -1.181, sigma 0.694 of ln s) matches the median but has mean 0.39 s: the
tail of long test runs matters, hence the table.
"""

_FORMATS = ("mini-swe-agent-1", "mini-swe-agent-1.1")
_ROLES = frozenset({"system", "user", "assistant", "tool", "exit"})


def sample_tool_wait_s(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` draws from the fitted tool-wait distribution (inverse CDF of :data:`TOOL_WAIT_QUANTILES_S`)."""
    return np.interp(rng.random(n), TOOL_WAIT_QUANTILES, TOOL_WAIT_QUANTILES_S)


def trajectory_files(inputs: Sequence[PathLike]) -> list[Path]:
    """Files given, plus every ``*.traj.json`` under given directories (sorted, recursively)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            found = sorted(path.rglob("*.traj.json"))
            if not found:
                raise WorkloadFormatError(
                    path, "expected a directory holding *.traj.json trajectories, found none"
                )
            files.extend(found)
        else:
            files.append(path)
    return files


def convert_mini_swe_agent(
    inputs: Sequence[PathLike],
    *,
    seed: int = 0,
    prefix_tokens: int | None = None,
    tokens: ChatTokenModel | None = None,
) -> list[Session]:
    """One session per trajectory file (directories are searched for ``*.traj.json``); see the module doc."""
    model = tokens or ChatTokenModel()
    sessions: list[Session] = []
    first_file: dict[str, Path] = {}
    for path in trajectory_files(inputs):
        session = convert_trajectory(path, seed=seed, prefix_tokens=prefix_tokens, tokens=model)
        if session.id in first_file:
            raise WorkloadFormatError(
                path,
                f"session id {session.id!r} already came from {first_file[session.id]}; "
                "expected one trajectory per instance",
                field="instance_id",
            )
        first_file[session.id] = path
        sessions.append(session)
    return sessions


def convert_trajectory(
    path: PathLike, *, seed: int = 0, prefix_tokens: int | None = None, tokens: ChatTokenModel | None = None
) -> Session:
    """One trajectory file -> one session."""
    model = tokens or ChatTokenModel()
    doc = Doc(path, load_json(path))
    doc.obj()
    fmt = doc.get("trajectory_format").str_()
    if not fmt.startswith("mini-swe-agent"):
        raise doc.fail(
            f"expected a mini-swe-agent format such as {list(_FORMATS)}, got {fmt!r}", "trajectory_format"
        )
    messages = doc.get("messages").items()
    for m in messages:
        role = m.get("role").str_()
        if role not in _ROLES:
            raise m.fail(f"expected a role in {sorted(_ROLES)}, got {role!r}", m.where + ".role")
    calls_at = [i for i, m in enumerate(messages) if m.value["role"] == "assistant"]
    if not calls_at:
        raise doc.fail("expected at least one assistant message (an LLM call)", "messages")
    session_id = doc.get("instance_id").str_() if doc.has("instance_id") else Path(path).name.split(".")[0]
    usage = [messages[i].get("extra").get("response").get("usage") for i in calls_at]
    prompts = [u.get("prompt_tokens").count(1) for u in usage]  # every call has a prompt
    outputs = [u.get("completion_tokens").count(1) for u in usage]  # and generates a token at least
    reasoning = [_reasoning_tokens(u) for u in usage]

    tool_calling = any(messages[i].has("tool_calls") for i in calls_at)
    system_text = messages[0].get("content").text() if messages[0].value["role"] == "system" else ""
    if prefix_tokens is None:
        prefix = TOOL_CALLING_PREFIX_TOKENS if tool_calling else model.message(system_text)
    else:
        prefix = prefix_tokens
    group: str | None = None
    # The prefix heads every prompt, so it must fit under the shortest one, not only the first: a later
    # prompt shorter than it gave a negative append, a bare ValueError naming no file.
    if prefix > 0 and prefix <= min(prompts):
        digest = hashlib.sha1(system_text.encode("utf-8")).hexdigest()[:12]
        group = f"mini-swe-agent/{'tools' if tool_calling else 'text'}/{digest}"
    else:
        prefix = 0

    waits, skews_s = _waits(messages, calls_at, seed, session_id)
    if skews_s:
        calls_word = "call" if len(skews_s) == 1 else "calls"
        warnings.warn(
            WorkloadWarning(
                f"{path}: {len(skews_s)} {calls_word} with a tool observation stamped before the call "
                f"(clock skew, at most {max(skews_s):.3f} s): tool wait taken as 0"
            ),
            stacklevel=2,
        )
    calls: list[Call] = []
    for k, i in enumerate(calls_at):
        keep: int | None = None
        if k == 0:
            append = prompts[0] - prefix
        else:
            p, o, n = prompts[k - 1], outputs[k - 1], prompts[k]
            if reasoning[k - 1] == 0 and n >= p + o:
                append = n - p - o
            else:
                added = sum(_message_tokens(model, messages[j]) for j in range(calls_at[k - 1], i))
                keep = max(0, min(p, n - added) - prefix)
                append = n - prefix - keep
        calls.append(
            Call(
                append_tokens=append,
                output_tokens=outputs[k],
                wait_after_s=round(waits[k], 6),
                keep_tokens=keep,
            )
        )
    return Session(id=session_id, calls=tuple(calls), prefix_group=group, prefix_tokens=prefix)


def _reasoning_tokens(usage: Doc) -> int:
    if not usage.has("completion_tokens_details"):
        return 0
    details = usage.get("completion_tokens_details")
    return details.get("reasoning_tokens").count() if details.has("reasoning_tokens") else 0


def _message_tokens(model: ChatTokenModel, message: Doc) -> int:
    text = message.get("content").text() if message.has("content") else ""
    calls = []
    if message.has("tool_calls"):
        for call in message.get("tool_calls").items():
            function = call.get("function")
            calls.append((function.get("name").str_(), function.get("arguments").str_()))
    return model.message(text, calls)


def _timestamp(message: Doc) -> float | None:
    if not message.has("extra"):
        return None
    extra = message.get("extra")
    return extra.get("timestamp").number() if extra.has("timestamp") else None


def _created(message: Doc) -> float | None:
    response = message.get("extra").get("response")
    return response.get("created").number() if response.has("created") else None


def _waits(
    messages: list[Doc], calls_at: list[int], seed: int, session_id: str
) -> tuple[list[float], list[float]]:
    """Measured tool waits where timestamps exist, fitted draws (bounded by ``created`` stamps) otherwise;
    and the inversions, seconds, of the calls whose observation is stamped before them (their wait is 0)."""
    rng = np.random.default_rng([seed, zlib.crc32(session_id.encode("utf-8"))])
    draws = sample_tool_wait_s(rng, len(calls_at))
    waits: list[float] = []
    skews_s: list[float] = []
    for k, i in enumerate(calls_at):
        if k + 1 == len(calls_at):
            waits.append(0.0)
            break
        nxt = calls_at[k + 1]
        sent = _timestamp(messages[i])
        done: float | None = None
        done_at = i
        for j in range(i + 1, nxt):
            stamp = _timestamp(messages[j])
            if stamp is not None:
                done, done_at = stamp, j
        if sent is not None and done is not None:
            if done < sent:
                skews_s.append(_skew_s(messages[i], messages[done_at], sent, done))
            waits.append(max(0.0, done - sent))
            continue
        wait = float(draws[k])
        start, end = _created(messages[i]), _created(messages[nxt])
        if start is not None and end is not None:
            wait = min(wait, max(0.0, end - start + 1.0))
        waits.append(wait)
    return waits, skews_s


def _skew_s(call: Doc, observation: Doc, sent: float, done: float) -> float:
    """How far ``observation`` is stamped before ``call``; beyond :data:`CLOCK_SKEW_TOLERANCE_S`, an error."""
    skew_s = sent - done
    if skew_s > CLOCK_SKEW_TOLERANCE_S:
        raise observation.fail(
            f"expected a timestamp at or after the call's ({call.where}: {sent}), got {done}: "
            f"{skew_s:.3f} s before it, more than the {CLOCK_SKEW_TOLERANCE_S:g} s taken as clock skew",
            observation.where + ".extra.timestamp",
        )
    return skew_s
