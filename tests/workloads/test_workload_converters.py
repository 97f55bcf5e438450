"""tau-bench, LMBenchmark ShareGPT, Mooncake and Azure converters, the registry and the token estimate."""

from __future__ import annotations

import attrs
import json
from pathlib import Path
from typing import Any

import pytest

from workloads.convert import CONVERTERS, convert, register_converter
from workloads.convert.mooncake import convert_mooncake
from workloads.convert.sharegpt import convert_lmbenchmark_sharegpt
from workloads.convert.tau_bench import AIRLINE_TOOLS_SCHEMA_TOKENS, TauTimingModel, convert_tau_bench
from workloads.errors import WorkloadFormatError
from workloads.sessions import Call, Session, prompt_tokens
from workloads.tokens import ChatTokenModel, estimate_tokens

FIXTURES = Path(__file__).parent / "fixtures"
TAU = FIXTURES / "tau_airline_2.json"


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("Hello, world!", 4),
        ("The quick brown fox jumps over the lazy dog.", 10),
        ("def f(x):\n    return x + 1\n", 12),
        ("1234567", 3),
        ("supercalifragilisticexpialidocious", 6),
    ],
)
def test_estimate_tokens_is_pinned(text: str, tokens: int) -> None:
    assert estimate_tokens(text) == tokens


def test_chat_token_model_adds_template_tokens() -> None:
    model = ChatTokenModel()
    assert model.message("Hello, world!") == 4 + 5
    assert model.message("", [("get_user_details", '{"user_id": "mia_li_3668"}')]) == (
        5 + 25 + estimate_tokens("get_user_details") + estimate_tokens('{"user_id": "mia_li_3668"}')
    )


def test_tau_bench_is_pinned() -> None:
    first, second = convert_tau_bench([TAU])
    assert first.id == "task0-trial0" and second.id == "task1-trial0"
    assert first.prefix_group == second.prefix_group == "tau-bench/403729c57364"
    assert first.prefix_tokens == AIRLINE_TOOLS_SCHEMA_TOKENS + 1608 == 4233
    assert prompt_tokens(first) == [
        4261,
        4308,
        4510,
        4847,
        5124,
        5307,
        6341,
        6643,
        6692,
        6793,
        6987,
        7096,
        7145,
        7248,
        7661,
    ]
    assert [c.output_tokens for c in first.calls] == [
        31,
        136,
        43,
        52,
        147,
        53,
        283,
        41,
        82,
        168,
        104,
        41,
        83,
        168,
        206,
    ]
    # After call 0 the user answers (16 tokens): 0.5 + 0.02 * 16; after call 2 a tool result: 0.3 s.
    assert [c.wait_after_s for c in first.calls] == [
        0.82,
        1.82,
        0.3,
        0.3,
        1.22,
        0.3,
        0.88,
        0.3,
        0.88,
        0.3,
        0.3,
        0.3,
        0.9,
        0.3,
        0.0,
    ]
    assert prompt_tokens(second) == [4293, 4366, 4498, 4609, 4746]


def test_tau_bench_timing_models() -> None:
    human = convert_tau_bench([TAU], timing=TauTimingModel.human())[0]
    # 1 s + 0.2 s x 31 reply tokens + 1 s x 16 typed tokens.
    assert human.calls[0].wait_after_s == pytest.approx(23.2)
    jittered = convert_tau_bench([TAU], timing=TauTimingModel(sigma=0.5), seed=4)[0]
    assert jittered == convert_tau_bench([TAU], timing=TauTimingModel(sigma=0.5), seed=4)[0]
    assert jittered.calls[0].wait_after_s == 0.656013
    assert convert_tau_bench([TAU], timing="human")[0] == human
    assert convert_tau_bench([TAU], timing={"tool_base_s": 1.0})[0].calls[2].wait_after_s == 1.0
    with pytest.raises(ValueError, match="timing: expected 'llm', 'human'"):
        convert_tau_bench([TAU], timing="robot")
    with pytest.raises(TypeError):
        convert_tau_bench([TAU], timing={"tool_s": 1.0})
    no_schema = convert_tau_bench([TAU], tools_schema_tokens=0)[0]
    assert no_schema.prefix_tokens == 1608
    with pytest.raises(ValueError, match="tool_base_s must be >= 0"):
        TauTimingModel(tool_base_s=-1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d[1]["traj"][2].__setitem__("role", "bot"), "[1].traj[2].role: expected a role in"),
        (
            lambda d: d[0]["traj"][6]["tool_calls"][0]["function"].pop("arguments"),
            "[0].traj[6].tool_calls[0].function.arguments: missing",
        ),
        (lambda d: d[0].__setitem__("task_id", "zero"), "[0].task_id: expected an integer, got 'zero'"),
        (lambda d: d[1].__setitem__("task_id", 0), "[1]: duplicate trajectory 'task0-trial0'"),
        (lambda d: d[0]["traj"].pop(0), "[0].traj[0]: expected the trajectory to start with the system"),
        (lambda d: d[0]["traj"][1].__setitem__("content", 7), "[0].traj[1].content: expected text"),
    ],
)
def test_tau_bench_errors(tmp_path: Path, change: Any, message: str) -> None:
    doc = json.loads(TAU.read_text())
    change(doc)
    path = tmp_path / "tau.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(WorkloadFormatError) as info:
        convert_tau_bench([path])
    assert str(info.value).startswith(f"{path}: {message}")


def test_sharegpt_chains_rounds_into_sessions() -> None:
    first, second = convert_lmbenchmark_sharegpt([FIXTURES / "sharegpt_run_small.json"])
    interval = 1 / 1.34
    assert first == Session(
        id="conv-0",
        arrival_s=0.0,
        calls=(
            Call(append_tokens=875, output_tokens=275),
            Call(append_tokens=414, output_tokens=289, keep_tokens=870, min_interval_s=interval),
            Call(append_tokens=411, output_tokens=307, keep_tokens=1279, min_interval_s=interval),
        ),
    )
    # Only the previous round's text (870 tokens) is reused: the next prompt has the dataset's answer.
    assert prompt_tokens(first) == [875, 1284, 1690]
    assert second == Session(
        id="conv-1", arrival_s=3 * interval, calls=(Call(append_tokens=600, output_tokens=332),)
    )
    slow = convert_lmbenchmark_sharegpt([FIXTURES / "sharegpt_run_small.json"], qps=0.5)
    assert slow[1].arrival_s == 6.0 and slow[0].calls[1].min_interval_s == 2.0


def test_sharegpt_errors(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text('[{"input": "a", "output_length": 3}, {"input": "ab", "output_len": 3}]')
    with pytest.raises(WorkloadFormatError, match=r"run.json: \[1\].output_len: unknown key"):
        convert_lmbenchmark_sharegpt([path])
    for bad in ("-3", "0"):  # 0 used to pass here and fail later without the file or field
        path.write_text(f'[{{"input": "a", "output_length": {bad}}}]')
        with pytest.raises(WorkloadFormatError, match=r"\[0\].output_length: expected a token count \(integer >= 1\)"):
            convert_lmbenchmark_sharegpt([path])


MOONCAKE = [
    {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [0, 1]},
    {"timestamp": 250, "input_length": 1025, "output_length": 5, "hash_ids": [0, 1, 2, 3][:3]},
]


def test_mooncake(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MOONCAKE))
    assert convert_mooncake([path]) == [
        Session(
            id="trace-0",
            arrival_s=0.0,
            calls=(Call(append_tokens=1000, output_tokens=10, block_hashes=(0, 1)),),
        ),
        Session(
            id="trace-1",
            arrival_s=0.25,
            calls=(Call(append_tokens=1025, output_tokens=5, block_hashes=(0, 1, 2)),),
        ),
    ]


def test_blank_lines_of_a_mooncake_trace_are_skipped(tmp_path: Path) -> None:
    """A blank line (a trailing one, as editors leave) was refused as "empty line"; it holds no request, and the
    requests keep their ids and an error after it keeps its line number."""
    path = tmp_path / "trace.jsonl"
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in MOONCAKE))
    path.write_text(json.dumps(MOONCAKE[0]) + "\n\n  \n" + json.dumps(MOONCAKE[1]) + "\n\n")
    assert convert_mooncake([path]) == [attrs.evolve(s, id=s.id.replace("plain", "trace"))
                                        for s in convert_mooncake([plain])]
    path.write_text(json.dumps(MOONCAKE[0]) + "\n\n" + '{"timestamp": 1' + "\n")
    with pytest.raises(WorkloadFormatError, match=":3: invalid JSON"):
        convert_mooncake([path])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"timestamp": 1, "input_length": 1000, "output_length": 1, "hash_ids": [0]}',
            ":2: hash_ids: expected ceil(1000 / 512) = 2 ids, got 1",
        ),
        (
            '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [0], "extra": 1}',
            ":2: extra: unknown key",
        ),
        (
            '{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [0]}',
            ":2: timestamp: expected milliseconds >= 0",
        ),
        (
            '{"timestamp": 1, "input_length": 10, "output_length": 1.5, "hash_ids": [0]}',
            ":2: output_length: expected an integer >= 1",
        ),
        (
            '{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}',
            ":2: hash_ids[0]: expected an integer id >= 0",
        ),
        (  # found by fuzzing: converted, then refused by the sessions reader
            '{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}',
            ":2: input_length: expected an integer >= 1 (a request has a prompt",
        ),
        ('{"timestamp": 1, "input_length": 10', ":2: invalid JSON"),
    ],
)
def test_mooncake_errors(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(MOONCAKE[0]) + "\n" + line + "\n")
    with pytest.raises(WorkloadFormatError) as info:
        convert_mooncake([path])
    assert str(info.value).startswith(str(path) + message)


def test_trace_files_whose_ids_would_repeat_and_bad_block_sizes_are_errors(tmp_path: Path) -> None:
    """Found by fuzzing: two files named alike gave duplicate session ids; a block size of 0 divided by 0."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    paths = [tmp_path / d / "t.jsonl" for d in ("a", "b")]
    for p in paths:
        p.write_text(json.dumps(MOONCAKE[0]) + "\n")
    with pytest.raises(WorkloadFormatError, match=r"ids \(t-N\) would repeat those of"):
        convert_mooncake(paths)
    with pytest.raises(ValueError, match="block_tokens must be an integer >= 1, got 0"):
        convert_mooncake(paths[:1], block_tokens=0)
    csvs = [tmp_path / d / "code.csv" for d in ("a", "b")]
    for p in csvs:
        p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,374,44\n")
    with pytest.raises(WorkloadFormatError, match=r"ids \(code-N\) would repeat those of"):
        convert("azure", csvs)


def test_azure_and_registry(tmp_path: Path) -> None:
    path = tmp_path / "code.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,374,44\n"
        "2023-11-16 18:15:47.25,10,2\n"
    )
    sessions = convert("azure", [path])
    assert [(s.id, s.arrival_s) for s in sessions] == [("code-0", 0.0), ("code-1", 0.75)]
    assert sorted(CONVERTERS) == ["azure", "lmbenchmark-sharegpt", "mini-swe-agent", "mooncake", "tau-bench"]
    with pytest.raises(ValueError, match="unknown format 'vidur'"):
        convert("vidur", [path])
    with pytest.raises(ValueError, match="already registered"):
        register_converter("azure", convert_mooncake)


def test_bytes_that_are_not_utf8_name_the_file(tmp_path: Path) -> None:
    """Found by fuzzing: a byte that is not UTF-8 in a Mooncake trace or a request CSV was a bare
    UnicodeDecodeError ("'utf-8' codec can't decode byte 0xff ..."), naming no file."""
    from workloads.traces import read_request_csv

    trace = tmp_path / "m.jsonl"
    trace.write_bytes(b'{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1], "x": "\xff"}\n')
    with pytest.raises(WorkloadFormatError) as info:
        convert_mooncake([trace])
    assert str(info.value) == (f"{trace}: expected UTF-8 text ('utf-8' codec can't decode byte 0xff in position "
                               "80: invalid start byte)")
    table = tmp_path / "t.csv"
    table.write_bytes(b"arrival_s,input_tokens,output_tokens,id\n0,10,10,\xff\n")
    with pytest.raises(WorkloadFormatError, match=rf"^{table}: expected UTF-8 text \('utf-8' codec can't decode"):
        read_request_csv(table)
