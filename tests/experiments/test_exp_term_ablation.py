"""The term-ablation study on its smallest configuration: one measured long-context row (Llama-3.1-70B FP8,
vLLM TP 2 on H100, 8,192 / 1,024 tokens, concurrency 16) read by TPOT and by TTFT, one wave of requests, with
attention and the expert-parallel all-to-all switched off; and the YAML's row lists against its rules. The
rows come from the sample shipped in the package (never ../shared)."""

import csv
from pathlib import Path

import pytest

from experiments.term_ablation import (BASELINE, COLUMNS, cells, matches, plot, report, run, selection,
                                       silicon_rows, simulate, study, write_csv)
from validation.silicon import row_spec

ROW = "2026_04_06_llama_3_1_70b_h100_sxm_vllm_fp8_agg_8192x1024_c16_tp2_ep1_830"
TERMS = ("attention", "ep_alltoall")
LONG = {"label": "long context", "metric": "tpot",
        "rule": {"attention_dp_max": 1, "isl_min": 8000, "concurrency_min": 16}, "rows": [ROW]}
PREFILL = {"label": "prefill", "metric": "ttft", "rule": {"isl_min": 2000}, "rows": [ROW]}
TINY = {"sample": "h100_h200", "waves": 1, "rows_per_condition": 1, "terms": list(TERMS),
        "conditions": {"long_context": LONG, "prefill": PREFILL}}


@pytest.fixture(scope="module")
def rows() -> list:
    return silicon_rows(study())


@pytest.fixture(scope="module")
def runs(rows: list) -> list:
    return run(rows, TINY)


def test_the_yaml_lists_the_rows_its_rules_choose(rows: list) -> None:
    spec = study()
    chosen = selection(rows, spec)
    assert chosen == {name: c["rows"] for name, c in spec["conditions"].items()}
    by_id = {r["id"]: r for r in rows}
    for name, ids in chosen.items():
        assert len(ids) == spec["rows_per_condition"] == len(set(ids))
        specs = [row_spec(by_id[i]) for i in ids]
        assert all(matches(s, spec["conditions"][name]["rule"]) for s in specs)
        assert len({s.model for s in specs}) >= 4  # spread over models, not one deployment's sweep
    dp = [row_spec(by_id[i]).agg for i in chosen["attention_dp_decode"]]
    assert all(par is not None and par.dp > 1 for par in dp)


def test_attention_off_shortens_a_long_context_row_and_an_absent_term_changes_nothing(runs: list) -> None:
    tpot, ttft = runs
    assert (tpot.condition, tpot.metric) == ("long_context", "tpot")
    assert (ttft.condition, ttft.metric) == ("prefill", "ttft")
    assert tpot.measured_ms == pytest.approx(34.62533664177535)  # the row's silicon_tpot_ms
    assert ttft.measured_ms == pytest.approx(1284.1146045480855)  # its silicon_ttft_ms
    for r in runs:
        # attention over 8k-token contexts is a large share of both the decode step and the prefill
        assert r.sim_ms["attention"] < 0.9 * r.sim_ms[BASELINE]
        # TP 2 without expert parallelism or attention DP (and a dense model): no all-to-all to remove
        assert r.sim_ms["ep_alltoall"] == r.sim_ms[BASELINE]
    # the row under two conditions is simulated once per term: its TTFT and TPOT come from one run
    again = simulate(tpot.row, 1, ("attention",))
    assert (again["tpot"], again["ttft"]) == (tpot.sim_ms["attention"], ttft.sim_ms["attention"])


def test_growth_is_the_mape_with_the_term_off_minus_all_on(runs: list) -> None:
    table = {(c.term, c.condition): c for c in cells(runs, TERMS)}
    tpot = runs[0]
    cell = table["attention", "long_context"]
    assert cell.rows == 1
    assert cell.mape_on == pytest.approx(abs(tpot.sim_ms[BASELINE] / tpot.measured_ms - 1) * 100)
    assert cell.growth_points == pytest.approx(abs(tpot.err_pct("attention")) - abs(tpot.err_pct(BASELINE)))
    assert tpot.err_pct(BASELINE) < 0 and cell.growth_points > 5  # under-predicted: removing time hurts
    assert cell.changes and not table["ep_alltoall", "long_context"].changes
    assert table["ep_alltoall", "prefill"].growth_points == 0.0


def test_the_study_writes_its_csv_figure_and_summary(runs: list, tmp_path: Path) -> None:
    table = cells(runs, TERMS)
    with open(write_csv(table, tmp_path / "t.csv"), encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        out = list(reader)
    schema = ("term", "condition", "rows", "mape_on", "mape_off", "growth_points")
    assert tuple(reader.fieldnames or ()) == COLUMNS == schema
    pairs = [(t, c) for t in TERMS for c in ("long_context", "prefill")]
    assert [(r["term"], r["condition"]) for r in out] == pairs
    assert float(out[2]["growth_points"]) == 0.0
    labels = {k: c["label"] for k, c in TINY["conditions"].items()}
    assert plot(table, labels, tmp_path / "t.png", dpi=40).stat().st_size > 0
    text = report(table, runs, TINY)
    assert "| ep_alltoall | no change | no change |" in text
    assert "the long_context rows are simulated with W = 1 instead of the protocol's 10" in text
    assert "* Terms whose removal changes no prediction of any row here, and why:\n  * `ep_alltoall`: " \
        in text
