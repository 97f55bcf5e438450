"""Workload statistics, the convert / stats subcommands, and the shipped datasets."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from workloads.cli import register
from workloads.io import read_sessions, read_workload, write_sessions
from workloads.sessions import Call, Session, prompt_tokens
from workloads.stats import format_stats, workload_stats

FIXTURES = Path(__file__).parent / "fixtures"
DATA = Path(__file__).parents[2] / "workloads" / "data"


def tiny() -> list[Session]:
    sub = Session(id="a/sub", calls=(Call(append_tokens=10, output_tokens=1),))
    return [
        Session(
            id="a",
            prefix_group="g",
            prefix_tokens=100,
            calls=(
                Call(append_tokens=50, output_tokens=10, wait_after_s=2.0),  # prompt 150
                Call(append_tokens=20, output_tokens=5, subagents=(sub,), fork_context=True),  # prompt 180
                Call(append_tokens=5, output_tokens=5, keep_tokens=30, wait_after_s=1.0),  # prompt 135
            ),
        ),
        Session(id="b", prefix_group="g", prefix_tokens=100, calls=(Call(append_tokens=1, output_tokens=1),)),
        Session(
            id="c", arrival_s=3.0, calls=(Call(append_tokens=1024, output_tokens=2, block_hashes=(1, 2)),)
        ),
        Session(
            id="d", arrival_s=4.0, calls=(Call(append_tokens=1100, output_tokens=2, block_hashes=(1, 3, 4)),)
        ),
    ]


def test_stats_are_exact() -> None:
    stats = workload_stats(tiny())
    # The forked sub-agent's prompt: the parent's context after call 1 (180 + 5) + 10.
    assert [prompt_tokens(s) for s in tiny()] == [[150, 180, 135], [101], [1024], [1100]]
    assert (stats["sessions"], stats["subagent_sessions"], stats["calls"]) == (4, 1, 7)
    assert stats["input_tokens"] == 150 + 180 + 135 + 195 + 101 + 1024 + 1100
    assert stats["output_tokens"] == 10 + 5 + 1 + 5 + 1 + 2 + 2
    assert stats["append_tokens"] == 50 + 20 + 10 + 5 + 1 + 1024 + 1100
    assert stats["wait_s"] == 3.0
    assert stats["input"]["max"] == 1100 and stats["input"]["p50"] == 180
    assert stats["prefix_reuse"] == {
        "session_tokens": 60 + 30,  # call 1 keeps 50 + 10; call 2 cuts to 30
        "group_tokens": 100 * 3,  # every call of group g after its first
        "fork_tokens": 185,
        "block_tokens": 512,  # d's first block was c's
        "fraction": (90 + 300 + 185 + 512) / stats["input_tokens"],
    }
    assert stats["arrival_s"] == {"timed": 2, "first": 3.0, "last": 4.0}
    text = format_stats(stats)
    assert (
        "sessions        4 (1 sub-agent sessions, 1 prefix groups)" in text
        and "prefix reuse potential" in text
    )


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="twin workload")
    register(parser.add_subparsers(required=True))
    args = parser.parse_args(list(argv))
    code: int = args.func(args)
    return code


def test_cli_convert_and_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tau.jsonl.gz"
    assert (
        run_cli(
            "convert",
            "tau-bench",
            str(FIXTURES / "tau_airline_2.json"),
            "-o",
            str(out),
            "--seed",
            "1",
            "--set",
            "tools_schema_tokens=0",
        )
        == 0
    )
    header, sessions = read_workload(out)
    assert header["source"] == "tau-bench" and header["inputs"] == ["tau_airline_2.json"]
    assert header["options"] == {"seed": 1, "tools_schema_tokens": 0}
    assert len(sessions) == 2 and sessions[0].prefix_tokens == 1608
    capsys.readouterr()
    assert run_cli("stats", str(out), "--json") == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["sessions"], stats["calls"], stats["input_tokens"]) == (
        2,
        20,
        workload_stats(sessions)["input_tokens"],
    )
    assert run_cli("stats", str(out)) == 0
    assert "calls           20" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["convert", "nope", "x", "-o", "y"], "error: unknown format 'nope'"),
        (
            ["convert", "azure", "x.csv", "-o", "y", "--seed", "2"],
            "error: format 'azure' takes no option 'seed'",
        ),
        (["convert", "mooncake", "missing.jsonl", "-o", "y"], "error: [Errno 2] No such file"),
        (
            ["convert", "tau-bench", str(FIXTURES / "sharegpt_run_small.json"), "-o", "y"],
            "[0].task_id: missing",
        ),
        (["convert", "tau-bench", "x", "-o", "y", "--set", "novalue"], "error: --set expects KEY=VALUE"),
        (["stats", str(FIXTURES / "tau_airline_2.json")], ":1: invalid JSON"),
    ],
)
def test_cli_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = [a if a != "y" else str(tmp_path / "y.jsonl") for a in argv]
    assert run_cli(*argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_shipped_datasets() -> None:
    expected = {
        "swe_bench_dev.jsonl": (23, 1843),
        "tau_bench_airline.jsonl": (200, 2454),
        "lmbenchmark_sharegpt.jsonl": (55, 252),
    }
    total = 0
    for name, (n_sessions, n_calls) in expected.items():
        stats = workload_stats(read_sessions(DATA / name))
        assert (stats["sessions"], stats["calls"]) == (n_sessions, n_calls), name
        total += (DATA / name).stat().st_size
    swe = workload_stats(read_sessions(DATA / "swe_bench_dev.jsonl"))
    assert (swe["input_tokens"], swe["output_tokens"]) == (39000961, 376068)
    assert total < 1_000_000


def test_written_then_read_stats_agree(tmp_path: Path) -> None:
    write_sessions(tmp_path / "t.jsonl", tiny(), "tiny")
    assert workload_stats(read_sessions(tmp_path / "t.jsonl")) == workload_stats(tiny())
