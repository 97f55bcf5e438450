"""The session-script format: round trips; every kind of malformed line fails with file, line, field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from workloads.errors import WorkloadFormatError
from workloads.io import read_sessions, read_workload, write_sessions
from workloads.sessions import Call, Session, iter_calls, prompt_tokens

HEADER = '{"format":"servetwin-sessions","version":1,"source":"test"}'


def make_sessions() -> list[Session]:
    sub = Session(id="s1/sub0", calls=(Call(append_tokens=5, output_tokens=2),))
    return [
        Session(
            id="s0",
            arrival_s=0.25,
            prefix_group="sys",
            prefix_tokens=100,
            calls=(
                Call(append_tokens=50, output_tokens=10, wait_after_s=1.5),
                Call(append_tokens=20, output_tokens=5, keep_tokens=40, min_interval_s=2.0),
            ),
        ),
        Session(
            id="s1",
            priority=2,
            calls=(
                Call(append_tokens=1030, output_tokens=3, block_hashes=(7, 8, 9), hash_block_tokens=512),
                Call(append_tokens=10, output_tokens=4, subagents=(sub,), fork_context=True),
            ),
        ),
    ]


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("name", ["w.jsonl", "w.jsonl.gz"])
def test_round_trip(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    write_sessions(path, make_sessions(), "unit-test", seed=3)
    header, sessions = read_workload(path)
    assert header == {"format": "servetwin-sessions", "version": 1, "source": "unit-test", "seed": 3}
    assert sessions == make_sessions()


def test_gzip_output_is_byte_stable(tmp_path: Path) -> None:
    write_sessions(tmp_path / "a.jsonl.gz", make_sessions(), "x")
    write_sessions(tmp_path / "b.jsonl.gz", make_sessions(), "x")
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()
    assert gzip.decompress((tmp_path / "a.jsonl.gz").read_bytes()).startswith(
        b'{"format":"servetwin-sessions"'
    )


def test_written_lines_are_compact_and_default_free(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    write_sessions(path, make_sessions()[:1], "x")
    lines = path.read_text().splitlines()
    assert lines[1] == (
        '{"id":"s0","arrival_s":0.25,"prefix_group":"sys","prefix_tokens":100,"calls":['
        '{"append":50,"output":10,"wait_s":1.5},{"append":20,"output":5,"min_interval_s":2.0,'
        '"keep":40}]}'
    )


def test_prompt_tokens_follow_keep_then_append() -> None:
    s0, s1 = make_sessions()
    # call 0: 100 + 50; stream 60 after; call 1: keep 40, +20 -> 100 + 60.
    assert prompt_tokens(s0) == [150, 160]
    assert prompt_tokens(s1) == [1030, 1043]
    # The forked sub-agent's prefix is the parent's whole context after call 1: 1043 + 4.
    assert [(s.id, k, p) for s, k, _, p in iter_calls(s1)] == [
        ("s1", 0, 1030),
        ("s1", 1, 1043),
        ("s1/sub0", 0, 1052),
    ]


def test_blank_lines_are_skipped_and_later_lines_keep_their_numbers(tmp_path: Path) -> None:
    """A blank line (a trailing one, as editors leave) was refused as "empty line"; it holds no session."""
    first = '{"id":"s","calls":[{"append":1,"output":2}]}'
    second = '{"id":"t","calls":[{"append":4,"output":1}]}'
    plain = read_sessions(write_lines(tmp_path / "plain.jsonl", HEADER, first, second))
    assert read_sessions(write_lines(tmp_path / "blank.jsonl", HEADER, "", first, "  ", second, "")) == plain
    assert len(plain) == 2
    with pytest.raises(WorkloadFormatError) as info:
        read_sessions(write_lines(tmp_path / "bad.jsonl", HEADER, first, "", "[1]"))
    assert info.value.line == 4


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"id":"a","calls":[{"append":1,"output":2},{"append":1,"outpt":2}]}',
            "bad.jsonl:3: calls[1].outpt: unknown key",
        ),
        ('{"id":"a","calls":[{"append":1}]}', "bad.jsonl:3: calls[0].output: missing"),
        (
            '{"id":"a","calls":[{"append":1,"output":2.5}]}',
            "bad.jsonl:3: calls[0].output: expected an integer >= 1, got number 2.5",
        ),
        (
            '{"id":"a","calls":[{"append":1,"output":true}]}',
            "bad.jsonl:3: calls[0].output: expected an integer >= 1, got boolean true",
        ),
        (
            '{"id":"a","calls":[{"append":10,"output":0}]}',
            "bad.jsonl:3: calls[0].output: expected an integer >= 1, got 0",
        ),
        (
            '{"id":"a","calls":[{"append":10,"output":5},{"keep":0,"append":0,"output":5}]}',
            "bad.jsonl:3: calls[1].append: expected a prompt of at least one token (prefix + kept stream + append is 0)",
        ),
        (
            '{"id":"a","calls":[{"append":-1,"output":2}]}',
            "bad.jsonl:3: calls[0].append: expected an integer >= 0, got -1",
        ),
        (
            '{"id":"a","calls":[{"append":1,"output":2,"wait_s":"x"}]}',
            "bad.jsonl:3: calls[0].wait_s: expected a finite number >= 0, got string 'x'",
        ),
        ('{"id":"a","calls":[{"append":1,"output":2,"wait_s":NaN}]}', "bad.jsonl:3: invalid JSON"),
        ('{"id":"a","calls":[]}', "bad.jsonl:3: calls: expected a non-empty list of calls"),
        (
            '{"id":"a","calls":[{"append":1,"output":2,"keep":0}, {"append":1,"output":2,"keep":4}]}',
            "bad.jsonl:3: calls[1].keep: expected at most the stream length before this call (3), got 4",
        ),
        (
            '{"id":"a","calls":[{"append":1030,"output":2,"block_hashes":[1,2]}]}',
            "bad.jsonl:3: calls[0].block_hashes: expected ceil(1030 appended tokens / 512) = 3 ids (they name the prompt after the prefix), got 2",
        ),
        (
            '{"id":"a","prefix_tokens":5,"calls":[{"append":1,"output":2}]}',
            "bad.jsonl:3: prefix_tokens: expected only together with 'prefix_group'",
        ),
        (
            '{"id":"a","calls":[{"append":1,"output":2,"subagents":'
            '[{"id":"b","calls":[{"append":"1","output":1}]}]}]}',
            "bad.jsonl:3: calls[0].subagents[0].calls[0].append: expected an integer >= 0, got string '1'",
        ),
        (
            '{"id":"s","calls":[{"append":1,"output":2}]}',
            "bad.jsonl:3: id: duplicate session id 's' (first on line 2)",
        ),
        (
            '{"id":"b","prefix_group":"g","prefix_tokens":4,"calls":[{"append":1,"output":2}]}',
            "bad.jsonl:3: prefix_tokens: expected 3 for group 'g' (as on line 2), got 4",
        ),
        (
            # two sub-agents of one parent with one id would be one session to the twin (found by fuzzing)
            '{"id":"p","calls":[{"append":8,"output":2,"subagents":[{"id":"a","calls":[{"append":65,"output":2}]}]},'
            '{"append":8,"output":2,"subagents":[{"id":"a","calls":[{"append":65,"output":2}]}]}]}',
            "bad.jsonl:3: calls[1].subagents[0].id: session name 'p/a' is also that of the session at line 3, "
            "field calls[0].subagents[0].id",
        ),
        (
            # a sub-agent of the group gives it another length (found by fuzzing)
            '{"id":"p","calls":[{"append":8,"output":2,"subagents":[{"id":"a","prefix_group":"g",'
            '"prefix_tokens":16,"calls":[{"append":5,"output":2}]}]}]}',
            "bad.jsonl:3: calls[0].subagents[0].prefix_tokens: expected 3 for group 'g' (as on line 2), got 16",
        ),
        ("[1, 2]", "bad.jsonl:3: expected a session object, got array"),
        ('{"id":"a","calls":[{"append":1,"output":2}]', "bad.jsonl:3: invalid JSON"),
    ],
)
def test_malformed_lines_name_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    first = '{"id":"s","prefix_group":"g","prefix_tokens":3,"calls":[{"append":1,"output":2}]}'
    path = write_lines(tmp_path / "bad.jsonl", HEADER, first, line)
    with pytest.raises(WorkloadFormatError) as info:
        read_sessions(path)
    assert str(info.value).startswith(str(tmp_path / message.split(":")[0]) + ":" + message.split(":", 1)[1])
    assert isinstance(info.value, ValueError)
    assert info.value.line == 3


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (
            '{"format":"servetwin-sessions","version":2,"source":"x"}',
            ":1: version: expected version 1 (the version this reader knows), got 2",
        ),
        (
            '{"format":"other","version":1,"source":"x"}',
            ":1: format: expected 'servetwin-sessions', got 'other'",
        ),
        ('{"format":"servetwin-sessions","version":1}', ":1: source: expected a string, got None"),
        ("not json", ":1: invalid JSON"),
    ],
)
def test_bad_header(tmp_path: Path, header: str, message: str) -> None:
    path = write_lines(tmp_path / "h.jsonl", header)
    with pytest.raises(
        WorkloadFormatError, match="^" + str(path) + message.replace("(", r"\(").replace(")", r"\)")
    ):
        read_sessions(path)


def test_empty_file_and_truncated_gzip(tmp_path: Path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(WorkloadFormatError, match="e.jsonl:1: empty file"):
        read_sessions(empty)
    path = tmp_path / "t.jsonl.gz"
    write_sessions(path, make_sessions() * 1, "x")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 12])
    with pytest.raises(WorkloadFormatError, match="t.jsonl.gz"):
        read_sessions(path)


def test_header_only_is_an_empty_workload(tmp_path: Path) -> None:
    assert read_sessions(write_lines(tmp_path / "h.jsonl", HEADER)) == []


def test_reserved_meta_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reserved"):
        write_sessions(tmp_path / "x.jsonl", [], "x", version=2)


def test_written_file_is_plain_json_per_line(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    write_sessions(path, make_sessions(), "x")
    objs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [o.get("id") for o in objs] == [None, "s0", "s1"]


def test_a_session_named_as_another_sessions_sub_agent_is_refused(tmp_path: Path) -> None:
    """Sub-agent x of session s is named s/x: a session with that id elsewhere in the file would share its
    name, its results rows and its token identity."""
    parent = '{"id":"s","calls":[{"append":1,"output":2,"subagents":[{"id":"x","calls":[{"append":3,"output":1}]}]}]}'
    other = '{"id":"s/x","calls":[{"append":1,"output":2}]}'
    for first, second, field, where in ((parent, other, "id", "line 2, field calls[0].subagents[0].id"),
                                        (other, parent, "calls[0].subagents[0].id", "line 2")):
        path = write_lines(tmp_path / "bad.jsonl", HEADER, first, second)
        with pytest.raises(WorkloadFormatError) as info:
            read_sessions(path)
        assert str(info.value).startswith(f"{path}:3: {field}: session name 's/x' is also that of the session "
                                          f"at {where};")


def test_a_call_with_block_hashes_names_the_prompt_after_the_prefix(tmp_path: Path) -> None:
    """A call with block_hashes: its prompt is the prefix then its appended tokens, which the ids name; the
    stream before it is dropped and its output starts the new one. The simulated prompts are these (after an
    earlier call the reader counted the stream, which the simulator drops; found by fuzzing)."""
    from twin.config import load_config
    from twin.runner import Simulation

    s = Session(id="s", calls=(Call(append_tokens=40, output_tokens=5),
                               Call(append_tokens=70, output_tokens=2, block_hashes=(7, 8, 9), hash_block_tokens=32),
                               Call(append_tokens=4, output_tokens=1)), arrival_s=0.0)
    assert prompt_tokens(s) == [40, 70, 76]
    path = tmp_path / "w.jsonl"
    write_sessions(path, [s], "test")
    assert read_sessions(path) == [s]
    res = Simulation(load_config({"model": {"name": "Qwen/Qwen3-0.6B"},
                                  "workload": {"kind": "sessions", "path": str(path)}})).run()
    assert [int(p) for p in res.requests["prompt_tokens"]] == prompt_tokens(s)
    line = json.loads(path.read_text().splitlines()[1])
    line["calls"][1]["block_hashes"] = [7, 8]
    bad = write_lines(tmp_path / "bad.jsonl", HEADER, json.dumps(line))
    with pytest.raises(WorkloadFormatError) as info:
        read_sessions(bad)
    assert "calls[1].block_hashes: expected ceil(70 appended tokens / 32) = 3 ids" in str(info.value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"id":"a","calls":[{"append":10,"output":99999999999999999999999}]}',
            "calls[0].output: expected an integer of at most 2**63 - 1 (64 bits), got 99999999999999999999999",
        ),
        (
            '{"id":"a","priority":-99999999999999999999999,"calls":[{"append":10,"output":5}]}',
            "priority: expected an integer of at most 2**63 - 1 in size (64 bits), got -99999999999999999999999",
        ),
        (
            '{"id":"a","prefix_group":"g","prefix_tokens":9223372036854775807,"calls":[{"append":10,"output":5}]}',
            "calls[0].append: expected a prompt of at most 2**63 - 1 tokens (prefix + kept stream + append is "
            "9223372036854775817)",
        ),
        (
            '{"id":"a","calls":[{"append":9223372036854775807,"output":5},{"append":0,"output":5}]}',
            "calls[1].append: expected a prompt of at most 2**63 - 1 tokens (prefix + kept stream + append is "
            "9223372036854775812)",
        ),
    ],
)
def test_counts_past_64_bits_name_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    """Found by fuzzing: a count or priority past 64 bits, or a prompt (prefix + stream) that sums past them,
    was read, and the run failed with "cannot fit 'int' into an index-sized integer" or "Python int too large
    to convert to C long", naming nothing. The largest 64-bit prompt is still read (the engine refuses it)."""
    path = write_lines(tmp_path / "bad.jsonl", HEADER, line)
    with pytest.raises(WorkloadFormatError) as info:
        read_sessions(path)
    assert str(info.value) == f"{path}:2: {message}"
    edge = write_lines(tmp_path / "edge.jsonl", HEADER, '{"id":"a","calls":[{"append":9223372036854775807,"output":1}]}')
    assert read_sessions(edge)[0].calls[0].append_tokens == 2**63 - 1


def test_a_session_cannot_hold_a_prefix_without_its_group() -> None:
    """Found by fuzzing: Session(prefix_tokens=32) with no group counted the prefix in prompt_tokens, but the
    writer left it out (the format has no prefix without a group), so the session read back with other
    prompt lengths. It is refused where it is made, as the reader refuses such a line."""
    with pytest.raises(ValueError, match=r"^session 'a': prefix_tokens 32 needs a prefix_group$"):
        Session(id="a", prefix_tokens=32, calls=(Call(append_tokens=1, output_tokens=1),))
    assert prompt_tokens(Session(id="a", prefix_group="g", prefix_tokens=32,
                                 calls=(Call(append_tokens=1, output_tokens=1),))) == [33]
