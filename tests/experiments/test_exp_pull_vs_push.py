"""The pull-vs-push study at its own 2,000-block decode pool: pull completes everything with the staged KV
filling the prefill worker, push drops requests and ends their users' sessions."""

import csv
from pathlib import Path

import pytest

from experiments.pull_vs_push import COLUMNS, TRANSFERS, point, report, write_csv


@pytest.fixture(scope="module")
def featured() -> dict:
    return {t: point(t) for t in TRANSFERS}


def test_pull_completes_every_request_while_its_staged_kv_fills_the_prefill_pool(featured):
    pull = featured["pull"].row()
    assert pull["decode_blocks"] == 2000
    assert pull["failed"] == 0 and pull["completed"] == pull["submitted"] == 360
    assert pull["sessions_finished"] == pull["sessions_started"] == 25
    assert pull["staged_peak_share"] > 0.9 and pull["pull_queue_peak"] >= 10  # (one prompt is ~1,400 blocks)
    assert pull["ttft_p50_s"] > 5


def test_push_drops_requests_and_with_them_their_users(featured):
    push, pull = featured["push"].row(), featured["pull"].row()
    assert push["dropped"] == push["failed"] > 0
    assert push["sessions_finished"] < push["sessions_started"] == 25
    assert push["submitted"] < pull["submitted"]
    assert push["staged_peak_blocks"] < 1500  # (the KV leaves the prefill worker at once: nothing backs up)
    reasons = featured["push"].results.summary["fail_reasons"]
    assert list(reasons) == ["pushed KV arrived at decode worker N with no room (N free blocks)"]


def test_the_csv_and_the_summary_say_so(featured, tmp_path):
    points = list(featured.values())
    with open(write_csv(points, tmp_path / "pull_vs_push.csv"), encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert tuple(reader.fieldnames or ()) == COLUMNS and [r["transfer"] for r in rows] == ["pull", "push"]
    text = report(featured, points)
    assert "**Pull completes every request**: 360 of 360, all 25 users' sessions" in text
    drops = featured["push"].row()["dropped"]
    assert f"**Push drops what does not fit**: {drops} pushed prompts" in text
    assert "Pull completes every request at every budget" in text
