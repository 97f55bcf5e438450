"""The serving-frontier study on its smallest configuration: two measured TensorRT-LLM rows of Qwen3-32B (TP 4
on H100, concurrency 8 and 16) from the study's own copy of the measurements (never ../shared)."""

import csv
from pathlib import Path

import pytest

from experiments.serving_frontier import (COLUMNS, extract, measured_path, plot, report, run, study,
                                          write_csv)
from validation.silicon import read_rows, row_config

DATA = measured_path(study())


@pytest.fixture(scope="module")
def rows() -> list:
    return read_rows(DATA)


@pytest.fixture(scope="module")
def points(rows: list) -> list:
    small = [r for r in rows if r["backend"] == "trtllm" and r["model_path"] == "Qwen/Qwen3-32B"
             and r["batch_size"] in ("8", "16")]
    return run(small)


def test_the_measured_copy_is_the_studys_selection_with_its_attribution(rows: list, tmp_path: Path) -> None:
    # Selecting from the copy gives the copy back: every row is one the YAML asks for, none twice.
    assert extract(DATA, study(), tmp_path / "again.csv") == len(rows) == 25
    assert (tmp_path / "again.csv").read_bytes() == DATA.read_bytes()
    engines: dict = {}
    for r in rows:
        engines.setdefault(r["model_path"], set()).add(r["backend"])
    assert engines == {"Qwen/Qwen3-32B": {"vllm", "sglang", "trtllm"},
                       "deepseek-ai/DeepSeek-R1": {"sglang", "trtllm"}}
    readme = (DATA.parent / "README.md").read_text(encoding="utf-8")
    assert "frontier_measured.csv" in readme and "aiconfigurator" in readme and "Apache-2.0" in readme


def test_each_row_is_simulated_on_its_own_deployment(rows: list) -> None:
    row = next(r for r in rows if r["id"].endswith("_trtllm_agg_1024x512_c8_tp4_epnone_89"))
    cfg = row_config(row)
    assert cfg["engine"]["name"] == "trtllm" and cfg["hardware"]["gpu"] == "h100_sxm"
    parallel = (cfg["system"]["tp"], cfg["system"]["attention_dp"])
    assert parallel == (4, 1) and cfg["workload"]["arrival"]["concurrency"] == 8


def test_the_frontier_coordinates_follow_the_closed_loop_rule(points: list) -> None:
    c8, c16 = points
    assert (c8.concurrency, c16.concurrency, c8.gpus, c8.mean_osl) == (8, 16, 4, 512)
    # by hand from the row: TTFT 136.80 ms, TPOT 7.505 ms; 8 requests of 512 tokens per latency; 4 GPUs
    assert c8.user_rate(sim=False) == pytest.approx(1000 / 7.505037768749999)
    assert c8.gpu_rate(sim=False) == pytest.approx(8 * 512 / (0.13679840726 + 511 * 0.00750503776875) / 4)
    # the simulated point sits near the measured one and the curve trades per-user speed for throughput
    for p in points:
        assert p.sim_tpot_ms == pytest.approx(p.measured_tpot_ms, rel=0.25)
        assert p.row()["sim_output_tokens_per_s_per_gpu"] == pytest.approx(p.gpu_rate(sim=True), rel=0.1)
    assert c16.gpu_rate(True) > c8.gpu_rate(True) and c16.user_rate(True) < c8.user_rate(True)


def test_the_study_writes_its_csv_figure_and_summary(points: list, tmp_path: Path) -> None:
    with open(write_csv(points, tmp_path / "f.csv"), encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        out = list(reader)
    assert tuple(reader.fieldnames or ()) == COLUMNS and [r["concurrency"] for r in out] == ["8", "16"]
    assert plot(points, tmp_path / "f.png", dpi=40).stat().st_size > 0
    text = report(points)
    best = points[1]
    assert (f"measured, the highest throughput per GPU is TRT-LLM TP4 (FP8)'s {best.gpu_rate(False):,.0f} "
            f"tokens/s at concurrency 16") in text
