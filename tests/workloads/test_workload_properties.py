"""Property tests: any valid session list survives a write / read round trip; the package stays standalone."""

from __future__ import annotations

import ast
import tempfile
from pathlib import Path

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.io import read_sessions, write_sessions
from workloads.sessions import Call, Session, prompt_tokens

PACKAGE = Path(__file__).parents[2] / "workloads"

counts = st.integers(min_value=0, max_value=10**6)
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
ID_CHARS = "abcAB019-_.:é 中"
"""Session id characters: anything but '/', which joins a sub-agent's name to its parent's."""


@st.composite
def sessions(draw: st.DrawFn, depth: int = 0) -> Session:
    n = draw(st.integers(min_value=1, max_value=4))
    calls = []
    stream = 0
    for k in range(n):
        keep = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=stream))) if k else None
        kept = stream if keep is None else keep
        call = Call(
            append_tokens=draw(counts if kept else st.integers(min_value=1, max_value=10**6)),  # a prompt
            output_tokens=draw(st.integers(min_value=1, max_value=10**6)),
            wait_after_s=draw(seconds),
            min_interval_s=draw(seconds),
            keep_tokens=keep,
            # (a sub-agent's name is parent/id, unique in the file: one per call here, named after the call)
            subagents=tuple(attrs.evolve(sub, id=f"{sub.id}.{k}")
                            for sub in draw(st.lists(sessions(depth + 1), max_size=1 if depth < 1 else 0))),
            fork_context=draw(st.booleans()),
        )
        stream = (stream if keep is None else keep) + call.append_tokens + call.output_tokens
        calls.append(call)
    group = draw(st.sampled_from([None, "g"]))
    return Session(
        id=draw(st.text(alphabet=ID_CHARS, min_size=1, max_size=8)),
        calls=tuple(calls),
        arrival_s=draw(st.one_of(st.none(), seconds)),
        prefix_group=group,
        prefix_tokens=7 if group else 0,
        priority=draw(st.integers(-3, 3)),
    )


@settings(max_examples=60, deadline=None, database=None)
@given(st.lists(sessions(), max_size=4, unique_by=lambda s: s.id), st.booleans())
def test_round_trip(items: list[Session], compress: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("w.jsonl.gz" if compress else "w.jsonl")
        write_sessions(path, items, "hypothesis")
        back = read_sessions(path)
    assert back == items
    assert [prompt_tokens(s) for s in back] == [prompt_tokens(s) for s in items]


def test_workloads_imports_no_simulator_package() -> None:
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in {"simpy", "twin", "hardware"}, f"{path} imports {name}"
