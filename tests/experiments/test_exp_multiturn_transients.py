"""The multi-turn transients study on its smallest configuration: 3 rounds of 2,000-token histories, 1 and 3
users, each after LMBenchmark's warm-up (whose 2,000-token prompts all fit the prefill pool)."""

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from experiments.multiturn_transients import (SERIES_COLUMNS, SUMMARY_COLUMNS, WARMUP_TIME_S, plot, report,
                                              run_all, trailing_hit_rate, write_csvs)

SMALL = {"num_users": 1, "num_rounds": 3, "qps": 2.0, "shared_system_prompt": 1000,
         "user_history_prompt": 2000, "answer_len": 100}
VARIANTS = {"baseline": {}, "3 users": {"num_users": 3}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list:
    return run_all(VARIANTS, tmp_path_factory.mktemp("workloads"), baseline=SMALL)


def test_the_warmup_sends_for_ten_seconds_and_the_benchmark_starts_when_it_is_answered(runs: list) -> None:
    for run in runs:
        req = run.requests
        warm = req[req["arrival_s"] < run.start_s]
        # 20 users join every 0.5 s from 0 (ids 2..21, as the client numbers them); each sends 2 rounds,
        # but nothing goes out after --time 10.
        assert sorted(set(warm["session"].tolist())) == sorted(f"warmup-user-{n}" for n in range(2, 22))
        assert warm["arrival_s"].max() <= WARMUP_TIME_S and len(warm) < 40
        assert warm["finish_s"].max() == run.start_s
        assert (run.benchmark["arrival_s"] >= run.start_s).all()
        assert len(run.benchmark) + len(warm) == len(req)


def test_the_warmup_leaves_the_benchmark_users_first_prompts_cached(runs: list) -> None:
    one, three = (r.benchmark for r in runs)
    # The warm-up's user-2 sent the benchmark's user-2's first prompt; 2,000-token contexts all fit the
    # pool, so round 1 finds every full block of it cached (without the shared name: the system prompt only).
    (first,) = one[one["turn"] == 0]
    assert first["session"] == "user-2" and first["prompt_tokens"] == 1000 + 2000 + 20
    assert first["cached_tokens"] == first["prompt_tokens"] // 16 * 16
    # 3 users: ramp-up users 2 and 3 start part-way (questions #2 and #3), users 4-6 join with question #1;
    # the warm-up had users 2..21, all with question #1. So 2 and 3 hit their context, 4-6 the question too.
    firsts = {r["session"]: int(r["cached_tokens"]) for r in three[three["turn"] == 0]}
    assert firsts == {"user-2": 2992, "user-3": 2992, "user-4": 3008, "user-5": 3008, "user-6": 3008}


def test_the_hit_rate_window_counts_the_latest_admitted_tokens_and_keeps_phases_apart() -> None:
    admitted = np.array([1.0, 2.0, 3.0, np.nan])
    prompt = np.array([10, 20, 30, 40])
    cached = np.array([0, 10, 30, 40])
    times = np.array([0.5, 2.5, 3.0])
    rate = trailing_hit_rate(admitted, prompt, cached, times, 50)
    assert math.isnan(rate[0]) and rate[1] == pytest.approx(10 / 30) and rate[2] == pytest.approx(40 / 50)
    assert trailing_hit_rate(admitted, prompt, cached, times, 50, since_s=2.8)[2] == pytest.approx(1.0)
    assert trailing_hit_rate(admitted, prompt, cached, times, 50, since_s=2.8)[1] == pytest.approx(10 / 30)


def test_the_run_hit_rate_is_the_summarys_and_the_files_are_written(runs: list, tmp_path: Path) -> None:
    for run in runs:
        b = run.benchmark
        assert run.row()["hit_rate"] == pytest.approx(b["cached_tokens"].sum() / b["prompt_tokens"].sum())
        # a window wider than the run: the benchmark's own hit rate, the warm-up left out
        end = np.array([b["finish_s"].max()])
        assert trailing_hit_rate(run.requests["first_scheduled_s"], run.requests["prompt_tokens"],
                                 run.requests["cached_tokens"], end, 10**9, since_s=run.start_s)[0] == \
            pytest.approx(run.row()["hit_rate"])
    summary, series, _ = write_csvs(runs, tmp_path)
    with open(summary, encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == SUMMARY_COLUMNS
        assert [r["variant"] for r in reader] == list(VARIANTS)
    with open(series, encoding="utf-8") as fh:
        assert tuple(next(csv.reader(fh))) == SERIES_COLUMNS
    assert plot(runs, tmp_path / "m.png", dpi=40).stat().st_size > 0
    text = report(runs)
    row = runs[1].row()
    assert f"| 3 users | {row['warmup_requests']} requests, {row['warmup_s']:.1f} s | {row['requests']} in" \
        in text
    assert ("Of the benchmark's 5 users, 5 had their first prompt sent by the warm-up and 5 find it still "
            "cached. ") in text
