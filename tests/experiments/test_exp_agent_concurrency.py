"""The agent-concurrency study on its smallest configuration: the first 8 SWE-bench sessions, one agent at a
time and all 8 at once. Together their contexts outgrow the L40S's KV pool: throughput grows, but the pool
fills, the hit rate falls and prompts are recomputed."""

import csv

import pytest

from experiments.agent_concurrency import COLUMNS, plot, point, report, write_csv


@pytest.fixture(scope="module")
def points() -> list:
    return [point("SWE-bench", n, limit=8) for n in (1, 8)]


def test_one_agent_at_a_time_hits_its_own_context_and_never_fills_the_pool(points):
    one = points[0].row()
    assert one["sessions"] == 8 and one["failed"] == 0 and one["preemptions"] == 0
    assert one["hit_rate"] > 0.98 and one["kv_usage_peak"] < 0.5
    assert one["in_tool_wait_mean"] > 0  # (the sessions' tool waits are replayed)


def test_eight_agents_share_the_gpu_until_their_contexts_evict_each_other(points):
    one, eight = (p.row() for p in points)
    assert eight["sessions"] == 8 and eight["calls"] == one["calls"] and eight["failed"] == 0
    assert eight["output_tokens_per_s"] > 2.5 * one["output_tokens_per_s"]
    assert eight["kv_usage_peak"] > 0.99 and eight["preemptions"] > 0
    assert eight["hit_rate"] < one["hit_rate"] - 0.05
    assert eight["uncached_prompt_tokens"] > 4 * one["uncached_prompt_tokens"]
    assert eight["ttft_p99_s"] > 10 * one["ttft_p99_s"]


def test_the_study_writes_its_csv_figure_and_summary(points, tmp_path):
    with open(write_csv(points, tmp_path / "agent_concurrency.csv"), encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert tuple(reader.fieldnames or ()) == COLUMNS and [r["agents"] for r in rows] == ["1", "8"]
    assert plot(points, tmp_path / "a.png", featured={"SWE-bench": (1, 8)}, dpi=50).stat().st_size > 0
    text = report(points)
    one, eight = (p.row() for p in points)
    assert (f"Throughput rises from {one['output_tokens_per_s']:.0f} output tokens/s with 1 agent to a "
            f"peak of {eight['output_tokens_per_s']:.0f} with 8") in text
