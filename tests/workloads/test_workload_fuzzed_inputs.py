"""Malformed and extreme inputs found by fuzzing the readers, converters, writer, stats and CLI: each gives
a WorkloadFormatError (or ValueError) naming the file, line and field, never a bare traceback or a
silently wrong result."""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from workloads.cli import register
from workloads.convert.azure import convert_azure
from workloads.convert.mini_swe_agent import convert_trajectory
from workloads.convert.mooncake import convert_mooncake
from workloads.convert.sharegpt import convert_lmbenchmark_sharegpt
from workloads.convert.tau_bench import convert_tau_bench
from workloads.errors import WorkloadFormatError
from workloads.generators import lmbenchmark_multiround
from workloads.io import read_sessions, write_sessions
from workloads.sessions import INT64_MAX, Call, Session, prompt_tokens
from workloads.stats import workload_stats
from workloads.tokens import ChatTokenModel, estimate_tokens
from workloads.traces import read_request_csv

FIXTURES = Path(__file__).parent / "fixtures"
HEADER = '{"format":"servetwin-sessions","version":1,"source":"test"}'
HUGE = "9" * 400  # a JSON integer beyond the largest float
DEEP = "[" * 100_000 + "]" * 100_000


def one_call(sid: str = "a", **call: Any) -> Session:
    return Session(id=sid, calls=(Call(append_tokens=call.pop("append", 1), output_tokens=1, **call),))


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ('{"id":"a","arrival_s":%s,"calls":[{"append":1,"output":1}]}', "arrival_s"),
        ('{"id":"a","calls":[{"append":1,"output":1,"wait_s":%s}]}', "calls[0].wait_s"),
        ('{"id":"a","calls":[{"append":1,"output":1,"min_interval_s":-%s}]}', "calls[0].min_interval_s"),
    ],
)
def test_a_number_past_the_float_range_names_file_line_and_field(tmp_path: Path, line: str, field: str) -> None:
    """Was a bare OverflowError ("int too large to convert to float") from math.isfinite."""
    path = tmp_path / "w.jsonl"
    path.write_text(HEADER + "\n" + line % HUGE + "\n")
    with pytest.raises(WorkloadFormatError) as info:
        read_sessions(path)
    sign = "-" if "-%s" in line else ""
    assert str(info.value) == f"{path}:2: {field}: expected a finite number >= 0, got number {sign}{HUGE}"


def test_a_converter_number_past_the_float_range_names_file_and_field(tmp_path: Path) -> None:
    """mini-swe-agent timestamps (Doc.number) and Mooncake timestamps were bare OverflowErrors."""
    traj = json.loads((FIXTURES / "deepseek_head.traj.json").read_text())
    calls_at = [i for i, m in enumerate(traj["messages"]) if m["role"] == "assistant"]
    traj["messages"][calls_at[0]]["extra"]["timestamp"] = int(HUGE)
    path = tmp_path / "x.traj.json"
    path.write_text(json.dumps(traj))
    with pytest.raises(WorkloadFormatError) as info:
        convert_trajectory(path)
    assert str(info.value) == (
        f"{path}: messages[{calls_at[0]}].extra.timestamp: expected a finite number, got number {HUGE}"
    )
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp":%s,"input_length":10,"output_length":5,"hash_ids":[1]}\n' % HUGE)
    with pytest.raises(WorkloadFormatError) as info:
        convert_mooncake([trace])
    assert str(info.value) == f"{trace}:1: timestamp: expected milliseconds >= 0, got {HUGE}"


def test_a_damaged_gzip_file_names_the_file(tmp_path: Path) -> None:
    """Damaged compressed bytes (not a cut file) were a bare zlib.error."""
    path = tmp_path / "w.jsonl.gz"
    data = bytearray(gzip.compress((HEADER + "\n" + '{"id":"a","calls":[{"append":1,"output":1}]}\n' * 50).encode()))
    for i in range(12, 30):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    with pytest.raises(WorkloadFormatError) as info:
        read_sessions(path)
    assert str(info.value).startswith(f"{path}: cannot read: Error -3 while decompressing data: ")


def test_json_nested_too_deeply_or_with_too_many_digits_names_the_file(tmp_path: Path) -> None:
    """Deep nesting was a bare RecursionError in every JSON reader; an integer of over 4,300 digits was a
    ValueError naming no file in the converters."""
    session_file = tmp_path / "w.jsonl"
    session_file.write_text(HEADER + "\n" + DEEP + "\n")
    with pytest.raises(WorkloadFormatError) as info:
        read_sessions(session_file)
    assert str(info.value) == f"{session_file}:2: invalid JSON (nested too deeply)"
    for text, detail in ((DEEP, "nested too deeply"), ('[{"input":"a","output_length":%s}]' % ("9" * 5000),
                                                        "Exceeds the limit (4300 digits)")):
        doc = tmp_path / "run.json"
        doc.write_text(text)
        with pytest.raises(WorkloadFormatError) as info:
            convert_lmbenchmark_sharegpt([doc])
        assert str(info.value).startswith(f"{doc}: invalid JSON ({detail}")
        trace = tmp_path / "m.jsonl"
        trace.write_text(text.replace("[{", "{").replace("}]", "}") + "\n")
        with pytest.raises(WorkloadFormatError) as info:
            convert_mooncake([trace])
        assert str(info.value).startswith(f"{trace}:1: invalid JSON ({detail}")


def test_converted_counts_past_64_bits_name_the_input(tmp_path: Path) -> None:
    """Counts past 2**63 - 1 were converted, and the written file was refused by the reader."""
    doc = tmp_path / "run.json"
    doc.write_text(json.dumps([{"input": "a", "output_length": 2**64}]))
    with pytest.raises(WorkloadFormatError) as info:
        convert_lmbenchmark_sharegpt([doc])
    assert str(info.value) == (
        f"{doc}: [0].output_length: expected a token count of at most 2**63 - 1 (64 bits), got {2**64}"
    )
    trace = tmp_path / "m.jsonl"
    for key, value, message in (
        ("output_length", 2**64, f"output_length: expected an integer of at most 2**63 - 1 (64 bits), got {2**64}"),
        ("hash_ids", [2**64], f"hash_ids[0]: expected an integer id >= 0 of at most 2**63 - 1 (64 bits), got {2**64}"),
    ):
        line = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1], key: value}
        trace.write_text(json.dumps(line) + "\n")
        with pytest.raises(WorkloadFormatError) as info:
            convert_mooncake([trace])
        assert str(info.value) == f"{trace}:1: {message}"


def test_stats_totals_do_not_wrap_around_64_bits(tmp_path: Path) -> None:
    """Two prompts of 2**63 - 1 tokens (each readable) summed to -2 in numpy's int64."""
    path = tmp_path / "w.jsonl"
    write_sessions(path, [one_call("a", append=INT64_MAX), one_call("b", append=INT64_MAX)], "test")
    stats = workload_stats(read_sessions(path))
    assert stats["input_tokens"] == stats["append_tokens"] == 2 * INT64_MAX
    assert stats["output_tokens"] == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chars_per_piece": 0}, "chars_per_piece must be an integer >= 1, got 0"),
        ({"message_overhead_tokens": -100}, "message_overhead_tokens must be an integer >= 0, got -100"),
        ({"tool_call_overhead_tokens": 1.5}, "tool_call_overhead_tokens must be an integer >= 0, got 1.5"),
    ],
)
def test_a_bad_token_model_is_refused_by_name(options: dict[str, Any], message: str) -> None:
    """``--set tokens='{"chars_per_piece": 0}'`` was a ZeroDivisionError traceback; a negative overhead a
    ValueError about ``append_tokens``."""
    with pytest.raises(ValueError) as info:
        convert_tau_bench([FIXTURES / "tau_airline_2.json"], tokens=options)
    assert str(info.value) == message
    with pytest.raises(ValueError, match="^chars_per_piece must be >= 1, got 0$"):
        estimate_tokens("abcdefghijkl", chars_per_piece=0)


def test_trace_files_whose_ids_would_repeat_are_refused(tmp_path: Path) -> None:
    """Two ShareGPT files of one name (a/run.json, b/run.json) gave duplicate ids run/conv-0; the same path
    object given twice to the Azure or Mooncake converter passed their ``is`` check, with duplicate ids."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "run.json").write_text(json.dumps([{"input": "hi", "output_length": 3}]))
    with pytest.raises(WorkloadFormatError) as info:
        convert_lmbenchmark_sharegpt([tmp_path / "a" / "run.json", tmp_path / "b" / "run.json"])
    assert str(info.value) == (
        f"{tmp_path / 'b' / 'run.json'}: its session ids (run/conv-N) would repeat those of "
        f"{tmp_path / 'a' / 'run.json'}, whose name starts the same"
    )
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,input_tokens,output_tokens\n0,1,1\n")
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp":0,"input_length":10,"output_length":5,"hash_ids":[1]}\n')
    for convert, path, stem in ((convert_azure, csv, "t"), (convert_mooncake, trace, "m")):
        with pytest.raises(WorkloadFormatError) as info:
            convert([path, path])
        assert str(info.value) == (
            f"{path}: its session ids ({stem}-N) would repeat those of {path}, whose name starts the same"
        )


@pytest.mark.parametrize(
    ("sessions", "message"),
    [
        ([Session(id="a", arrival_s=float("nan"), calls=(Call(append_tokens=1, output_tokens=1),))],
         "w.jsonl:2: arrival_s: expected a finite number >= 0, got number nan"),
        ([one_call("a"), one_call("b", wait_after_s=float("inf"))],
         "w.jsonl:3: calls[0].wait_s: expected a finite number >= 0, got number inf"),
        ([one_call("")], "w.jsonl:2: id: expected a non-empty string, got string ''"),
        ([one_call("a"), one_call("a")], "w.jsonl:3: id: duplicate session id 'a' (first on line 2)"),
        ([one_call("a", append=True)], "w.jsonl:2: calls[0].append: expected an integer >= 0, got boolean true"),
    ],
)
def test_the_writer_refuses_what_the_reader_would_and_writes_nothing(
    tmp_path: Path, sessions: list[Session], message: str
) -> None:
    """A NaN arrival left a file cut after the header, which read back as an empty workload; an empty id, a
    duplicate or a bool count gave a file the reader refuses."""
    path = tmp_path / "w.jsonl"
    with pytest.raises(WorkloadFormatError) as info:
        write_sessions(path, sessions, "test")
    assert str(info.value) == f"{tmp_path / message}; nothing was written"
    assert not path.exists()


def test_a_later_prompt_shorter_than_the_estimated_prefix_gives_no_group(tmp_path: Path) -> None:
    """A later call's prompt_tokens below the 320-token tool prefix was a bare ValueError ("append_tokens
    must be >= 0, got -220") naming no file."""
    traj = json.loads((FIXTURES / "deepseek_head.traj.json").read_text())
    calls_at = [i for i, m in enumerate(traj["messages"]) if m["role"] == "assistant"]
    traj["messages"][calls_at[1]]["extra"]["response"]["usage"]["prompt_tokens"] = 100
    path = tmp_path / "x.traj.json"
    path.write_text(json.dumps(traj))
    session = convert_trajectory(path)
    assert session.prefix_group is None and session.prefix_tokens == 0
    assert prompt_tokens(session)[:2] == [1671, 100]


def test_a_csv_cell_past_the_field_limit_names_file_and_line(tmp_path: Path) -> None:
    """Was a bare _csv.Error."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,1,1\n0," + "1" * 200_000 + ",1\n")
    with pytest.raises(WorkloadFormatError) as info:
        read_request_csv(path)
    assert str(info.value) == f"{path}:3: expected CSV (field larger than field limit (131072))"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        # (duration_s=inf, refused by the same check, is left out: without it the test would never end)
        ({"duration_s": float("nan")}, "duration_s must be a finite number >= 0 or None, got nan"),
        ({"duration_s": -1.0}, "duration_s must be a finite number >= 0 or None, got -1.0"),
        ({"answer_len": 0}, "answer_len must be >= 1 (engines reject max_tokens 0), got 0"),
    ],
)
def test_lmbenchmark_refuses_an_endless_duration_and_empty_answers(kwargs: dict[str, Any], message: str) -> None:
    """duration_s=inf looped forever adding users; nan or a negative one added none silently; answer_len 0
    passed the check and failed later as output_tokens."""
    args: dict[str, Any] = {"num_users": 2, "num_rounds": 3, "qps": 1.0, "shared_system_prompt": 10,
                            "user_history_prompt": 10, "answer_len": 5, **kwargs}
    with pytest.raises(ValueError) as info:
        lmbenchmark_multiround(**args)
    assert str(info.value) == message
    if "duration_s" in kwargs:
        with pytest.raises(ValueError, match="^duration_s must be a finite number >= 0 or None, got inf$"):
            lmbenchmark_multiround(**{**args, "duration_s": float("inf")})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seed", "1", "--set", "seed=2"], "error: option 'seed' is given twice, by --seed 1 and by --set seed=2"),
        (["--set", "seed=1", "--set", "seed=2"],
         "error: option 'seed' is given twice, by --set seed=1 and by --set seed=2"),
    ],
)
def test_cli_refuses_an_option_given_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    """The later one won silently (the header recorded seed 2)."""
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="cmd", required=True))
    out = tmp_path / "o.jsonl"
    args = parser.parse_args(["convert", "mini-swe-agent", str(FIXTURES / "deepseek_head.traj.json"),
                              "-o", str(out), *extra])
    assert args.func(args) == 2
    assert capsys.readouterr().err == message + "\n"
    assert not out.exists()


def test_a_float_version_is_refused(tmp_path: Path) -> None:
    """1.0 == 1, so version 1.0 was read as version 1."""
    path = tmp_path / "h.jsonl"
    path.write_text('{"format":"servetwin-sessions","version":1.0,"source":"x"}\n')
    with pytest.raises(WorkloadFormatError) as info:
        read_sessions(path)
    assert str(info.value) == f"{path}:1: version: expected version 1 (the version this reader knows), got 1.0"
