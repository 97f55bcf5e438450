"""The bandwidth-vs-runtime study on its smallest configuration: eight short requests (one per attention-DP
rank) of DeepSeek-R1 on 8 H200s, with the HBM lever, one scheduler term off and every host-side term off."""

import csv
from pathlib import Path

import pytest

from experiments.bandwidth_vs_runtime import (ALL_OFF, BASELINE, COLUMNS, HBM, RUNTIME_TERMS, SCHEDULER_TERMS,
                                              host_check, plot, report, run_points, write_csv)

TINY = {"tiny": {"concurrency": 8, "num_requests": 8, "input_tokens": 256, "output_tokens": 64}}
LEVERS = (BASELINE, HBM, "step_host off", ALL_OFF)


@pytest.fixture(scope="module")
def points() -> dict:
    return {p.lever: p for p in run_points(TINY, LEVERS)}


def test_more_hbm_bandwidth_shortens_decode_but_less_than_in_proportion(points: dict) -> None:
    base, hbm = points[BASELINE], points[HBM]
    change = hbm.tpot_ms / base.tpot_ms - 1
    # x1.4 bandwidth can cut a step by at most 1 - 1 / 1.4 = 29 %, and only where the step is HBM-bound
    assert -0.29 < change < -0.05
    assert hbm.throughput > base.throughput


def test_host_terms_switched_off_are_gone_from_the_ledger_yet_change_nothing(points: dict) -> None:
    host_side = SCHEDULER_TERMS + RUNTIME_TERMS
    # (the baseline's prefill steps launch their attention kernels outside CUDA graphs)
    assert sum(points[BASELINE].terms_s.get(t, 0.0) for t in host_side) > 0
    assert all(points[ALL_OFF].terms_s.get(t, 0.0) == 0.0 for t in host_side)
    for lever in ("step_host off", ALL_OFF):
        assert points[lever].tpot_ms == pytest.approx(points[BASELINE].tpot_ms, rel=2e-3)


def test_the_typical_step_hides_its_host_work_under_the_gpu(points: dict) -> None:
    check = host_check("tiny", TINY["tiny"])
    assert check.batch == 1 and check.context == 256 + 32
    assert check.host_s["step_host"] == pytest.approx(0.0025)  # TensorRT-LLM's per-step host time
    assert 0 < sum(check.host_s.values()) < check.gpu_s and sum(check.exposed_s.values()) == 0.0
    # the lone request per rank decodes at the priced step's pace (its context grows from 256 to 320)
    assert check.gpu_s * 1e3 == pytest.approx(points[BASELINE].tpot_ms, rel=0.05)


def test_the_study_writes_its_csv_figure_and_verdict(points: dict, tmp_path: Path) -> None:
    pts = list(points.values())
    with open(write_csv(pts, tmp_path / "b.csv"), encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert tuple(reader.fieldnames or ()) == COLUMNS and [r["lever"] for r in rows] == list(LEVERS)
    assert float(rows[0]["tpot_change_pct"]) == 0.0
    check = host_check("tiny", TINY["tiny"])
    assert plot(pts, tmp_path / "b.png", [check], dpi=40).stat().st_size > 0
    text = report(pts, [check])
    hbm = points[HBM].row(points[BASELINE])
    assert (f"* tiny: {HBM} (TPOT {hbm['tpot_change_pct']:+.1f}%, throughput "
            f"{hbm['throughput_change_pct']:+.1f}%) helps; the other 2 levers change TPOT and throughput by "
            f"less than 1%.") in text
