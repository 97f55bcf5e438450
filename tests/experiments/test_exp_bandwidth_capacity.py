"""The bandwidth-vs-capacity study on a tiny decode-heavy workload: its CSV, its knobs, its verdict."""

import csv
from pathlib import Path

import pytest

from experiments.bandwidth_capacity import COLUMNS, run_points, write_csv
from experiments.bandwidth_capacity_report import report

# Eight requests of 256 + 128 tokens, all in flight: 3,072 tokens of KV, which even the x0.7 pool (61,232
# tokens) holds, so no request is preempted and nothing repeats for the prefix cache.
TINY = {"kind": "synthetic", "num_requests": 8, "arrival": {"kind": "concurrency", "concurrency": 8},
        "input_tokens": 256, "output_tokens": 128}


@pytest.fixture(scope="module")
def points() -> list:
    return run_points({"tiny": TINY})


def test_the_csv_has_the_study_columns_and_one_row_per_point(points: list, tmp_path: Path) -> None:
    with open(write_csv(points, tmp_path / "bandwidth_capacity.csv"), encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert tuple(reader.fieldnames or ()) == COLUMNS
    assert [(r["workload"], r["knob"], r["scale"]) for r in rows] == [
        ("tiny", knob, scale) for knob in ("bandwidth", "capacity") for scale in ("0.7", "1", "1.4")]


def test_capacity_moves_only_the_kv_pool_and_bandwidth_speeds_decoding(points: list) -> None:
    by = {(p.knob, p.scale): p for p in points}
    for scale in (0.7, 1.4):
        (group,) = by["capacity", scale].whatif["workers"]
        assert group["decode"]["moved"] == group["prefill"]["moved"] == {}
        assert (group["kv_blocks"]["whatif"] > group["kv_blocks"]["named"]) == (scale > 1)
        # Same step prices and requests that fit every pool: the run is the factor-1 run, exactly.
        assert {**by["capacity", scale].row(), "scale": 1.0} == by["capacity", 1.0].row()
    tput = [by["bandwidth", s].row()["output_tokens_per_s"] for s in (0.7, 1.0, 1.4)]
    assert tput[0] < tput[1] < tput[2]


def test_the_summary_calls_a_decode_heavy_workload_bandwidth_bound(points: list) -> None:
    text = report(points, {"tiny": TINY})
    assert "**tiny is HBM bandwidth-bound**: more hbm_bw improves its output throughput" in text
    assert "more hbm_bytes not at all" in text
    assert "hbm_bytes x0.7 (prefill0, decode0): KV pool 9,357 -> 3,827 blocks; decode step unchanged" in text
