"""Arrival processes, length samplers, open-loop sessions, trace CSVs and LMBenchmark multi-round pacing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from workloads.errors import WorkloadFormatError
from workloads.generators import (
    gamma_arrivals,
    lmbenchmark_multiround,
    open_loop_sessions,
    poisson_arrivals,
    pool_draws,
    pooled_sessions,
    read_request_csv,
    sample_lengths,
)
from workloads.sessions import Call, Session, prompt_tokens


def test_poisson_arrivals_are_pinned_for_a_seed() -> None:
    times = poisson_arrivals(np.random.default_rng(0), 2.0, 4, start_s=1.0)
    assert times.tolist() == [1.3399659519844547, 1.8497645027173872, 1.8596678340119148, 1.860802497352529]


def test_gamma_arrivals_are_pinned_and_have_the_asked_mean_and_cv() -> None:
    times = gamma_arrivals(np.random.default_rng(0), 2.0, 2.0, 4)
    assert times.tolist() == [0.32921774695742384, 0.3292233838955036, 1.2465478768028468, 1.5174061285564877]
    gaps = np.diff(gamma_arrivals(np.random.default_rng(1), 5.0, 1.5, 200_000), prepend=0.0)
    assert gaps.mean() == pytest.approx(0.2, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1.5, rel=0.01)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_rates_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="rate_per_s"):
        poisson_arrivals(np.random.default_rng(0), bad, 3)
    with pytest.raises(ValueError, match="cv"):
        gamma_arrivals(np.random.default_rng(0), 1.0, bad if bad <= 0 or bad != bad else float("inf"), 3)


def test_sample_lengths_fixed_and_inclusive_range() -> None:
    assert sample_lengths(np.random.default_rng(0), 3, fixed=128).tolist() == [128, 128, 128]
    assert sample_lengths(np.random.default_rng(0), 6, low=100, high=103).tolist() == [
        103,
        102,
        102,
        101,
        101,
        100,
    ]
    drawn = sample_lengths(np.random.default_rng(2), 5000, low=1, high=3)
    assert set(drawn.tolist()) == {1, 2, 3}
    assert sample_lengths(np.random.default_rng(0), 4, low=7, high=7).tolist() == [7, 7, 7, 7]


@pytest.mark.parametrize(
    "kwargs", [{}, {"fixed": 1, "low": 1, "high": 2}, {"low": 5, "high": 4}, {"low": 1}, {"fixed": -1}]
)
def test_sample_lengths_rejects_bad_arguments(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        sample_lengths(np.random.default_rng(0), 3, **kwargs)


def test_open_loop_sessions() -> None:
    sessions = open_loop_sessions(
        np.array([0.5, 1.0]),
        [300, 400],
        np.array([10, 20]),
        id_prefix="r",
        prefix_group="sys",
        prefix_tokens=100,
    )
    assert sessions == [
        Session(
            id="r-0",
            arrival_s=0.5,
            prefix_group="sys",
            prefix_tokens=100,
            calls=(Call(append_tokens=200, output_tokens=10),),
        ),
        Session(
            id="r-1",
            arrival_s=1.0,
            prefix_group="sys",
            prefix_tokens=100,
            calls=(Call(append_tokens=300, output_tokens=20),),
        ),
    ]
    assert [prompt_tokens(s) for s in sessions] == [[300], [400]]
    assert type(sessions[0].calls[0].append_tokens) is int and type(sessions[0].arrival_s) is float
    closed = open_loop_sessions(None, [5], [6])
    assert closed == [Session(id="req-0", calls=(Call(append_tokens=5, output_tokens=6),))]
    with pytest.raises(ValueError, match="shorter than the shared prefix"):
        open_loop_sessions(None, [50], [1], prefix_group="g", prefix_tokens=100)
    with pytest.raises(ValueError, match="2 arrivals but 1"):
        open_loop_sessions([0.0, 1.0], [5], [6])


def test_open_loop_sessions_made_when_read_are_the_sessions_of_the_list() -> None:
    from workloads.generators import OpenLoopSessions

    args = (np.array([0.5, 1.0, 2.5]), [300, 400, 101], np.array([10, 20, 30]))
    lazy = OpenLoopSessions(*args, id_prefix="r", prefix_group="sys", prefix_tokens=100)
    eager = open_loop_sessions(*args, id_prefix="r", prefix_group="sys", prefix_tokens=100)
    assert len(lazy) == 3 and list(lazy) == eager and lazy[1] == lazy[1] == eager[1]
    assert lazy[-1] == eager[2] and lazy[1:] == eager[1:]
    assert type(lazy[0].calls[0].output_tokens) is int and type(lazy[0].arrival_s) is float
    assert OpenLoopSessions(None, [5], [6])[0].arrival_s is None
    with pytest.raises(IndexError, match="session 3 of 3"):
        lazy[3]
    with pytest.raises(ValueError, match="request 1: input 50 is shorter than the shared prefix 100"):
        OpenLoopSessions(None, [150, 50], [1, 1], prefix_group="g", prefix_tokens=100)


def test_read_request_csv_vidur_plain_and_azure(tmp_path: Path) -> None:
    vidur = tmp_path / "vidur.csv"
    vidur.write_text(
        "request_id,arrived_at,num_prefill_tokens,num_decode_tokens\n0,0.158,395,112\n1,0.162,1030,403\n"
    )
    assert read_request_csv(vidur) == [
        Session(id="0", arrival_s=0.158, calls=(Call(append_tokens=395, output_tokens=112),)),
        Session(id="1", arrival_s=0.162, calls=(Call(append_tokens=1030, output_tokens=403),)),
    ]
    plain = tmp_path / "plain.csv"
    plain.write_text("input_tokens,output_tokens,arrival_s\n7,8,2.5\n")
    assert read_request_csv(plain) == [
        Session(id="req-0", arrival_s=2.5, calls=(Call(append_tokens=7, output_tokens=8),))
    ]
    azure = tmp_path / "azure.csv"
    azure.write_bytes(
        b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        b"2023-11-16 18:15:46.6805900,374,44\r\n"
        b"2023-11-16 18:15:50.7486191,396,109\r\n"
        b"2023-11-17 00:00:00,1,2"
    )
    sessions = read_request_csv(azure)
    assert [s.arrival_s for s in sessions] == [0.0, 4.0680291, (5 * 3600 + 44 * 60 + 13) + 0.31941]
    assert [(s.calls[0].append_tokens, s.calls[0].output_tokens) for s in sessions] == [
        (374, 44),
        (396, 109),
        (1, 2),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b,c\n1,2,3\n", ":1: expected a header with one of the column sets"),
        (
            "arrival_s,input_tokens,output_tokens,extra\n1,2,3,4\n",
            ":1: unexpected or repeated column(s) ['extra']",
        ),
        (
            "arrival_s,input_tokens,output_tokens\n1,2,3\n1,2.5,3\n",
            ":3: input_tokens: expected an integer >= 1 (a request has a prompt and generates at least one token), got '2.5'",
        ),
        ("arrival_s,input_tokens,output_tokens\n1,2\n", ":2: expected 3 cells, got 2"),
        (
            "arrival_s,input_tokens,output_tokens\nx,2,3\n",
            ":2: arrival_s: expected a time in seconds, got 'x'",
        ),
        ("arrival_s,input_tokens,output_tokens\n-1,2,3\n", ":2: arrival_s: expected a time >= 0, got '-1'"),
        (
            "arrival_s,input_tokens,output_tokens\n1,2,-3\n",
            ":2: output_tokens: expected an integer >= 1",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2\n2023-11-16 18:15:45,1,2\n",
            ":3: TIMESTAMP: expected a time at or after the first row's, got '2023-11-16 18:15:45'",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n16/11/2023 18:15,1,2\n",
            ":2: TIMESTAMP: expected a datetime",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-30 18:15:46,1,2\n",
            ":2: TIMESTAMP: expected a valid calendar",
        ),
        (
            "id,arrival_s,input_tokens,output_tokens\na,1,2,3\na,1,2,3\n",
            ":3: id: expected a unique non-empty id, got 'a'",
        ),
        ("", ":1: empty file"),
    ],
)
def test_read_request_csv_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(WorkloadFormatError) as info:
        read_request_csv(path)
    assert str(info.value).startswith(str(path) + message)


def test_lmbenchmark_pacing_follows_the_client() -> None:
    # num_users=10, qps=0.5: interval 20 s, session life 80 s, a user joins every 8 s.
    sessions = lmbenchmark_multiround(10, 5, 0.5, 1000, 2000, 100)
    got = [(s.id, s.arrival_s, len(s.calls)) for s in sessions]
    assert got == [
        ("user-2", 8.0, 1),
        ("user-3", 16.0, 1),
        ("user-4", 4.0, 2),
        ("user-5", 12.0, 2),
        ("user-6", 20.0, 2),
        ("user-7", 8.0, 3),
        ("user-8", 16.0, 3),
        ("user-9", 4.0, 4),
        ("user-10", 12.0, 4),
        ("user-11", 0.0, 5),
        ("user-12", 8.0, 5),
        ("user-13", 16.0, 5),
        ("user-14", 24.0, 5),
        ("user-15", 32.0, 5),
        ("user-16", 40.0, 5),
        ("user-17", 48.0, 5),
        ("user-18", 56.0, 5),
        ("user-19", 64.0, 5),
        ("user-20", 72.0, 5),
    ]
    user = sessions[-1]
    assert user.prefix_group == "lmbenchmark-system" and user.prefix_tokens == 1000
    assert user.calls[0] == Call(append_tokens=2020, output_tokens=100)
    assert user.calls[1:] == (Call(append_tokens=20, output_tokens=100, min_interval_s=20.0),) * 4
    assert prompt_tokens(user) == [3020, 3140, 3260, 3380, 3500]
    # Pre-staggered users restart their history (the client's ramp-up sends no earlier rounds).
    assert sessions[0].calls == (Call(append_tokens=2020, output_tokens=100),)


def test_lmbenchmark_duration_controls_joining_users() -> None:
    sessions = lmbenchmark_multiround(4, 3, 2.0, 10, 20, 5, question_len=3, duration_s=5.0)
    # interval 2 s, gap 1 s. Ramp user i sits offset = 4 - i s into its life, has asked int(offset / 2) + 1
    # questions and sends the next one at -offset + asked * 2: user 1 has none left; users 2, 3, 4 send at
    # 1, 2, 1 s. Joiners arrive at 0, 1, 2, 3, 4 (< duration 5 s).
    assert [(s.id, s.arrival_s, len(s.calls)) for s in sessions] == [
        ("user-2", 1.0, 1),
        ("user-3", 2.0, 1),
        ("user-4", 1.0, 2),
        ("user-5", 0.0, 3),
        ("user-6", 1.0, 3),
        ("user-7", 2.0, 3),
        ("user-8", 3.0, 3),
        ("user-9", 4.0, 3),
    ]
    with pytest.raises(ValueError, match="num_rounds >= 2"):
        lmbenchmark_multiround(4, 1, 2.0, 10, 20, 5)


def test_a_trace_count_past_64_bits_names_file_line_and_column(tmp_path: Path) -> None:
    """Found by fuzzing: a length past 64 bits was read, and the run failed with "cannot fit 'int' into an
    index-sized integer", naming nothing; 2**63 - 1 is still read (the engine refuses it on arrival)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,9223372036854775807,1\n0,10,9223372036854775808\n")
    with pytest.raises(WorkloadFormatError) as info:
        read_request_csv(trace)
    assert str(info.value) == (f"{trace}:3: output_tokens: expected an integer of at most 2**63 - 1 (64 bits), "
                               "got '9223372036854775808'")
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,9223372036854775807,1\n")
    assert read_request_csv(trace)[0].calls[0].append_tokens == 2**63 - 1


def test_a_trace_with_a_byte_order_mark_reads_as_without_it(tmp_path: Path) -> None:
    """Found by fuzzing: a trace saved with a UTF-8 byte-order mark (Excel's "CSV UTF-8") was refused, its
    header read as ['\\ufeffarrival_s', ...]; it reads as the file without the mark, CRLF line ends too."""
    trace = tmp_path / "t.csv"
    trace.write_bytes(b"\xef\xbb\xbfarrival_s,input_tokens,output_tokens\r\n0.5,10,3\r\n")
    (session,) = read_request_csv(trace)
    assert (session.id, session.arrival_s, session.calls) == ("req-0", 0.5, (Call(append_tokens=10, output_tokens=3),))


def test_blank_lines_of_a_trace_are_skipped_and_later_lines_keep_their_numbers(tmp_path: Path) -> None:
    """Found by fuzzing: a trailing blank line (as many editors and exports leave) was refused as "empty row";
    a line with no cells holds no request, before the header too. A row of empty cells (",,") is still an
    error, on its own line as counted with the blank lines."""
    trace = tmp_path / "t.csv"
    trace.write_text("\narrival_s,input_tokens,output_tokens\n0.5,10,3\n\n\n1.5,20,4\n\n")
    assert read_request_csv(trace) == [
        Session(id="req-0", arrival_s=0.5, calls=(Call(append_tokens=10, output_tokens=3),)),
        Session(id="req-1", arrival_s=1.5, calls=(Call(append_tokens=20, output_tokens=4),)),
    ]
    trace.write_bytes(b"arrival_s,input_tokens,output_tokens\r\n\r\n0.5,10,3\r\n\r\n,,\r\n")
    with pytest.raises(WorkloadFormatError) as info:
        read_request_csv(trace)
    assert str(info.value) == f"{trace}:5: arrival_s: expected a time in seconds, got ''"
    trace.write_text("\n\nx,input_tokens,output_tokens\n")
    with pytest.raises(WorkloadFormatError, match=r"t.csv:3: expected a header with one of the column sets"):
        read_request_csv(trace)
    trace.write_text("\n\n")
    with pytest.raises(WorkloadFormatError, match=r"t.csv:1: empty file; expected a header row"):
        read_request_csv(trace)


def test_a_trace_with_both_id_columns_is_refused(tmp_path: Path) -> None:
    """Found by fuzzing: with request_id and id both present, request_id was taken and id ignored without a
    word; one id column is taken as it is."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens,request_id,id\n0.5,10,3,a,b\n")
    with pytest.raises(WorkloadFormatError) as info:
        read_request_csv(trace)
    assert str(info.value) == f"{trace}:1: two id columns ['request_id', 'id']; expected at most one"
    trace.write_text("arrival_s,input_tokens,output_tokens,id\n0.5,10,3,b\n")
    assert [s.id for s in read_request_csv(trace)] == ["b"]


def test_pool_draws_sequential_shuffle_and_random() -> None:
    assert pool_draws(np.random.default_rng(0), 3, 7, "sequential").tolist() == [0, 1, 2, 0, 1, 2, 0]
    shuffled = pool_draws(np.random.default_rng(0), 5, 13, "shuffle").tolist()
    # every whole pass is a permutation of the entries, and the partial last pass repeats none
    assert sorted(shuffled[:5]) == sorted(shuffled[5:10]) == list(range(5))
    assert len(set(shuffled[10:])) == 3 and shuffled[:5] != shuffled[5:10]
    # with replacement: over n = pool draws the share of requests sending an entry already sent tends to
    # 1 - (1 - 1/e) = 0.368 (the mean over i of 1 - (1 - 1/pool)**i)
    drawn = pool_draws(np.random.default_rng(1), 20_000, 20_000, "random")
    assert drawn.min() >= 0 and drawn.max() < 20_000
    repeats = 1 - len(np.unique(drawn)) / len(drawn)
    assert abs(repeats - np.exp(-1)) < 0.01
    for pool, n, how in ((0, 3, "random"), (3, -1, "shuffle"), (3, 3, "lru")):
        with pytest.raises(ValueError):
            pool_draws(np.random.default_rng(0), pool, n, how)


def test_pooled_sessions_share_the_whole_prompt_of_an_entry() -> None:
    sessions = pooled_sessions([1, 0, 1], [100, 200], [5, 7])
    assert [(s.id, s.prefix_group, s.prefix_tokens) for s in sessions] == [
        ("req-0", "prompt-pool/1", 200), ("req-1", "prompt-pool/0", 100), ("req-2", "prompt-pool/1", 200)]
    assert [prompt_tokens(s)[0] for s in sessions] == [200, 100, 200]
    assert [s.calls[0].output_tokens for s in sessions] == [7, 5, 7]
    with pytest.raises(ValueError, match="entries must lie in 0 .. 1"):
        pooled_sessions([2], [100, 200], [5, 7])
