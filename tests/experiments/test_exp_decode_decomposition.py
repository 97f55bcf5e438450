"""The decode-decomposition study on three batch sizes: its CSV, its shares, its ledger, its hand check."""

import csv
from collections import defaultdict
from pathlib import Path

import pytest

from experiments.decode_decomposition import COLUMNS, decode_shape, run, study, write_csv
from experiments.decode_decomposition_report import WEIGHT_TERMS, report, weight_read_check


@pytest.fixture(scope="module")
def spec() -> dict:
    return {**study(), "batches": [1, 64, 512]}


@pytest.fixture(scope="module")
def built(spec: dict) -> tuple:
    return run(spec)


def test_the_csv_has_the_study_columns_and_shares_that_add_up_per_step(built: tuple, tmp_path: Path) -> None:
    with open(write_csv(built[1], tmp_path / "decode_decomposition.csv"), encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert tuple(reader.fieldnames or ()) == COLUMNS
    shares: dict[tuple, float] = defaultdict(float)
    for r in rows:
        shares[r["model"], r["gpu"], int(r["batch"])] += float(r["share"])
    assert len(shares) == 11   # 4 workers x 3 batches, less Qwen3-235B's 512 on H100 (its KV pool holds 452)
    assert ("Qwen3-235B-A22B FP8, TP 8 / EP 8", "h100_sxm", 512) not in shares
    assert all(s == pytest.approx(1.0, abs=1e-4) for s in shares.values())


def test_each_step_is_the_simulators_step_cost_term_by_term(built: tuple, spec: dict) -> None:
    workers, points = built
    by = {(w.model, w.gpu): w for w in workers}
    for p in points:
        cost = by[p.model, p.gpu].cost.step_cost(decode_shape(p.batch, spec["context_tokens"]))
        assert sum(r["seconds"] for r in p.rows()) == pytest.approx(cost.total_s, rel=1e-12)
        assert {r["term"]: r["seconds"] for r in p.rows()} == {t: s for t, s in cost.terms.items() if s > 0}


def test_one_llama_token_on_h100_is_the_weight_read_within_the_fitted_efficiency(built: tuple, spec: dict) -> None:
    workers, points = built
    worker = next(w for w in workers if w.model.startswith("Llama") and w.gpu == "h100_sxm")
    step = next(p for p in points if (p.model, p.gpu, p.batch) == (worker.model, worker.gpu, 1)).step
    gemms = sum(step.terms.get(t, 0.0) for t in WEIGHT_TERMS)
    assert gemms == pytest.approx(weight_read_check(worker)["expected_s"], rel=0.02)
    assert gemms > 0.6 * step.total_s
    assert "The bottleneck moves mlp -> attention at B = 512" in report(workers, points, spec)
