"""mini-swe-agent conversion: exact usage counts for every shared trajectory, waits, context rule, errors."""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workloads.cli import register
from workloads.convert.mini_swe_agent import (
    CLOCK_SKEW_TOLERANCE_S,
    TOOL_WAIT_QUANTILES,
    TOOL_WAIT_QUANTILES_S,
    convert_mini_swe_agent,
    convert_trajectory,
    sample_tool_wait_s,
)
from workloads.errors import WorkloadFormatError, WorkloadWarning
from workloads.io import read_sessions
from workloads.sessions import Call, prompt_tokens

FIXTURES = Path(__file__).parent / "fixtures"
DATA = Path(__file__).parents[2] / "workloads" / "data"


def all_trajectories() -> list[dict[str, Any]]:
    """The 27 shared trajectories with their text removed (see fixtures/make_fixtures.py)."""
    return json.loads(gzip.decompress((FIXTURES / "mini_swe_agent_calls.json.gz").read_bytes()))


def materialise(root: Path) -> dict[str, list[dict[str, Any]]]:
    """Write each derivative as a valid ``*.traj.json`` under ``root/<folder>``; return its usage per id."""
    usage = {}
    for entry in all_trajectories():
        path = root / entry["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "info": {},
            "messages": entry["messages"],
            "trajectory_format": entry["trajectory_format"],
            "instance_id": entry["instance_id"],
        }
        path.write_text(json.dumps(doc))
        usage[entry["instance_id"]] = [
            m["extra"]["response"]["usage"] for m in entry["messages"] if m["role"] == "assistant"
        ]
    return usage


def test_every_shared_trajectory_reproduces_its_usage_exactly(tmp_path: Path) -> None:
    usage = materialise(tmp_path)
    sessions = convert_mini_swe_agent([tmp_path / "swe-deepseek-dev", tmp_path / "swe-gemini"])
    assert len(sessions) == len(usage) == 27
    for session in sessions:
        calls = usage[session.id]
        assert prompt_tokens(session) == [u["prompt_tokens"] for u in calls], session.id
        assert [c.output_tokens for c in session.calls] == [u["completion_tokens"] for u in calls], session.id
    assert sum(len(s.calls) for s in sessions) == 1843 + 215


def test_context_rule_extends_deepseek_and_rewrites_gemini(tmp_path: Path) -> None:
    usage = materialise(tmp_path)
    deepseek = convert_mini_swe_agent([tmp_path / "swe-deepseek-dev"])
    gemini = convert_mini_swe_agent([tmp_path / "swe-gemini"])
    assert all(c.keep_tokens is None for s in deepseek for c in s.calls)
    # Gemini: the stream is cut exactly after a call with reasoning tokens or before a prompt shorter than
    # the previous prompt + output (18 of them, down to -835 tokens).
    for session in gemini:
        u = usage[session.id]
        rewritten = [
            k
            for k in range(1, len(u))
            if u[k - 1].get("completion_tokens_details", {}).get("reasoning_tokens", 0)
            or u[k]["prompt_tokens"] < u[k - 1]["prompt_tokens"] + u[k - 1]["completion_tokens"]
        ]
        assert [k for k, c in enumerate(session.calls) if c.keep_tokens is not None] == rewritten
    assert sum(c.keep_tokens is not None for s in gemini for c in s.calls) == 21


def test_measured_waits_are_the_timestamp_gaps(tmp_path: Path) -> None:
    materialise(tmp_path)
    sessions = convert_mini_swe_agent([tmp_path / "swe-deepseek-dev"])
    assert all(s.prefix_tokens == 320 and s.prefix_group == sessions[0].prefix_group for s in sessions)
    waits = [c.wait_after_s for s in sessions for c in s.calls]
    assert sum(1 for w in waits if w > 0) == 1820 and all(s.calls[-1].wait_after_s == 0 for s in sessions)
    assert sum(waits) == pytest.approx(1014.047, abs=1e-3)


def test_shipped_swe_bench_set_is_the_conversion_of_the_shared_trajectories(tmp_path: Path) -> None:
    materialise(tmp_path)
    assert read_sessions(DATA / "swe_bench_dev.jsonl") == convert_mini_swe_agent(
        [tmp_path / "swe-deepseek-dev"]
    )


def test_verbatim_deepseek_trajectory_is_pinned() -> None:
    session = convert_trajectory(FIXTURES / "deepseek_head.traj.json")
    assert session.id == "pydicom__pydicom-1256" and session.prefix_tokens == 320
    assert session.calls == (
        Call(append_tokens=1351, output_tokens=88, wait_after_s=0.237018),
        Call(append_tokens=48, output_tokens=51, wait_after_s=0.258784),
        Call(append_tokens=550, output_tokens=77, wait_after_s=0.285449),
        Call(append_tokens=2596, output_tokens=72, wait_after_s=0.195191),
        Call(append_tokens=248, output_tokens=137, wait_after_s=0.19316),
        Call(append_tokens=37, output_tokens=60, wait_after_s=0.0),
    )
    assert prompt_tokens(session) == [1671, 1807, 2408, 5081, 5401, 5575]


def test_verbatim_gemini_trajectory_is_pinned() -> None:
    session = convert_trajectory(FIXTURES / "gemini_django-11163.traj.json")
    assert session.prefix_group == "mini-swe-agent/text/7ed0611ff364" and session.prefix_tokens == 138
    assert prompt_tokens(session) == [
        1397,
        1551,
        4323,
        5063,
        5179,
        5365,
        5474,
        5716,
        6427,
        7558,
        7624,
        7713,
        7776,
    ]
    # Calls 1 and 2 follow calls with reasoning tokens (dropped from the context): the stream is cut.
    assert [c.keep_tokens for c in session.calls[:4]] == [None, 1259, 1384, None]
    # No timestamps: fitted draws, capped by the 1 s `created` stamps; the same seed gives the same waits.
    waits = [c.wait_after_s for c in session.calls]
    assert waits[:3] == [0.286178, 0.274474, 0.181971] and waits[-1] == 0.0
    assert convert_trajectory(FIXTURES / "gemini_django-11163.traj.json", seed=1) != session


def test_prefix_override_and_no_group() -> None:
    session = convert_trajectory(FIXTURES / "deepseek_head.traj.json", prefix_tokens=0)
    assert session.prefix_group is None and prompt_tokens(session)[0] == 1671
    assert convert_trajectory(FIXTURES / "deepseek_head.traj.json", prefix_tokens=1000).prefix_tokens == 1000


def test_tool_wait_table_matches_its_provenance() -> None:
    q, s = np.array(TOOL_WAIT_QUANTILES), np.array(TOOL_WAIT_QUANTILES_S)
    mean = float(np.sum(np.diff(q) * (s[1:] + s[:-1]) / 2))
    assert mean == pytest.approx(0.5588, abs=1e-4)  # data mean 0.557 s
    draws = sample_tool_wait_s(np.random.default_rng(0), 200_000)
    assert np.median(draws) == pytest.approx(0.277, abs=0.003)


def edit(tmp_path: Path, change: Any, name: str = "x.traj.json") -> Path:
    doc = json.loads((FIXTURES / "deepseek_head.traj.json").read_text())
    change(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=1))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["messages"][2]["extra"]["response"]["usage"].__setitem__("prompt_tokens", "12"),
            "messages[2].extra.response.usage.prompt_tokens: "
            "expected a token count (integer >= 1), got string '12'",
        ),
        (  # a call generates a token at least: this used to pass here and fail later without the field
            lambda d: d["messages"][4]["extra"]["response"]["usage"].__setitem__("completion_tokens", 0),
            "messages[4].extra.response.usage.completion_tokens: "
            "expected a token count (integer >= 1), got number 0",
        ),
        (
            lambda d: d["messages"][4]["extra"]["response"]["usage"].pop("completion_tokens"),
            "messages[4].extra.response.usage.completion_tokens: missing",
        ),
        (lambda d: d["messages"][4]["extra"].pop("response"), "messages[4].extra.response: missing"),
        (
            lambda d: d["messages"][3].__setitem__("role", "observer"),
            "messages[3].role: "
            "expected a role in ['assistant', 'exit', 'system', 'tool', 'user'], got 'observer'",
        ),
        (
            lambda d: d.__setitem__("trajectory_format", "swe-agent"),
            "trajectory_format: expected a mini-swe-agent format such as",
        ),
        (lambda d: d.pop("trajectory_format"), "trajectory_format: missing"),
        (
            lambda d: d["messages"][3]["extra"].__setitem__("timestamp", 1.0),
            "messages[3].extra.timestamp: expected a timestamp at or after the call's",
        ),
        (
            lambda d: d.__setitem__("messages", [m for m in d["messages"] if m["role"] != "assistant"]),
            "messages: expected at least one assistant message",
        ),
        (lambda d: d.__setitem__("messages", {}), "messages: expected an array, got an object"),
    ],
)
def test_edited_trajectories_fail_with_the_field(tmp_path: Path, change: Any, message: str) -> None:
    path = edit(tmp_path, change)
    with pytest.raises(WorkloadFormatError) as info:
        convert_mini_swe_agent([path])
    assert str(info.value).startswith(f"{path}: {message}")


def test_truncated_trajectory_names_the_line(tmp_path: Path) -> None:
    text = (FIXTURES / "deepseek_head.traj.json").read_text()
    path = tmp_path / "cut.traj.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(WorkloadFormatError, match=r"cut.traj.json:\d+: invalid JSON at column \d+"):
        convert_mini_swe_agent([path])


def test_directories_duplicates_and_empty_dirs(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(FIXTURES / "deepseek_head.traj.json", tmp_path / "a" / "one.traj.json")
    shutil.copy(FIXTURES / "deepseek_head.traj.json", tmp_path / "b" / "two.traj.json")
    assert len(convert_mini_swe_agent([tmp_path / "a"])) == 1
    with pytest.raises(WorkloadFormatError, match="already came from"):
        convert_mini_swe_agent([tmp_path])
    (tmp_path / "empty").mkdir()
    with pytest.raises(WorkloadFormatError, match="found none"):
        convert_mini_swe_agent([tmp_path / "empty"])


def stamped(path: Path, observed_after_s: list[float]) -> Path:
    """A tiny tool-calling trajectory: call k sent at 100 + 10 k s, its observation stamped
    ``observed_after_s[k]`` after it (negative: before it, as real clock quirks do); then one last call."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Fix the bug."},
    ]
    for k in range(len(observed_after_s) + 1):
        sent_s = 100.0 + 10 * k
        function = {"name": "bash", "arguments": '{"command": "ls"}'}
        call = {"id": f"c{k}", "type": "function", "function": function}
        usage = {"prompt_tokens": 1000 + 100 * k, "completion_tokens": 20}
        messages.append(
            {"role": "assistant", "content": "", "tool_calls": [call],
             "extra": {"timestamp": sent_s, "response": {"usage": usage}}}
        )
        if k < len(observed_after_s):
            messages.append(
                {"role": "tool", "tool_call_id": f"c{k}", "content": "ok",
                 "extra": {"timestamp": sent_s + observed_after_s[k]}}
            )
    doc = {"trajectory_format": "mini-swe-agent-1.1", "instance_id": path.stem.split(".")[0]}
    path.write_text(json.dumps({**doc, "messages": messages}))
    return path


def test_observations_stamped_slightly_before_their_call_wait_0_and_each_file_warns(tmp_path: Path) -> None:
    """Issue 52 item 8: real output stamps an observation up to ~1 s before its call; one such message made
    the whole batch fail. Within the tolerance the wait is 0 and each file warns once, with the count."""
    a = stamped(tmp_path / "a.traj.json", [0.5, -0.8, 2.0, -0.25])
    b = stamped(tmp_path / "b.traj.json", [-CLOCK_SKEW_TOLERANCE_S])  # the tolerance itself is still skew
    clean = stamped(tmp_path / "c.traj.json", [1.0])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sessions = convert_mini_swe_agent([a, b, clean])
    assert [[c.wait_after_s for c in s.calls] for s in sessions] == [
        [0.5, 0.0, 2.0, 0.0, 0.0],
        [0.0, 0.0],
        [1.0, 0.0],
    ]
    assert [(w.category, str(w.message)) for w in caught] == [
        (WorkloadWarning, f"{a}: 2 calls with a tool observation stamped before the call "
                          "(clock skew, at most 0.800 s): tool wait taken as 0"),
        (WorkloadWarning, f"{b}: 1 call with a tool observation stamped before the call "
                          "(clock skew, at most 10.000 s): tool wait taken as 0"),
    ]


def test_an_observation_stamped_far_before_its_call_is_an_error(tmp_path: Path) -> None:
    path = stamped(tmp_path / "far.traj.json", [0.5, -12.0])
    with pytest.raises(WorkloadFormatError) as info:
        convert_mini_swe_agent([path])
    assert str(info.value) == (
        f"{path}: messages[5].extra.timestamp: expected a timestamp at or after the call's "
        "(messages[4]: 110.0), got 98.0: 12.000 s before it, more than the 10 s taken as clock skew"
    )


def test_cli_prints_each_clock_skew_warning_as_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="twin workload")
    register(parser.add_subparsers(required=True))
    a = stamped(tmp_path / "a.traj.json", [-0.8, -0.3])
    b = stamped(tmp_path / "b.traj.json", [-0.8, -0.3])  # the same counts: still its own line
    args = parser.parse_args(["convert", "mini-swe-agent", str(a), str(b), "-o", str(tmp_path / "o.jsonl")])
    assert args.func(args) == 0
    assert read_sessions(tmp_path / "o.jsonl")[0].calls[0].wait_after_s == 0.0
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"warning: {path}: 2 calls with a tool observation stamped before the call "
        "(clock skew, at most 0.800 s): tool wait taken as 0"
        for path in (a, b)
    ]
    far = stamped(tmp_path / "far.traj.json", [-12.0])
    args = parser.parse_args(["convert", "mini-swe-agent", str(far), "-o", str(tmp_path / "f.jsonl")])
    assert args.func(args) == 2
    assert capsys.readouterr().err.startswith(f"error: {far}: messages[3].extra.timestamp: ")
