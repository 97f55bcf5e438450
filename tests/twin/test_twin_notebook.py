"""The notebook path (Results.to_pandas, write_parquet, the one-line repr) and progress bars that leave the
results as they are."""

import csv
import json
import sys

import pytest
import yaml

import twin.progress
from twin.cli import main
from twin.config import load_config
from twin.runner import Simulation

TINY = {"model": {"name": "Qwen/Qwen3-0.6B"},
        "workload": {"kind": "synthetic", "num_requests": 3, "arrival": {"kind": "all_at_once"},
                     "input_tokens": {"fixed": 20}, "output_tokens": {"fixed": 4}}}

SMALL = {"workload": {"kind": "synthetic", "num_requests": 40,
                      "arrival": {"kind": "poisson", "rate_per_s": 20.0},
                      "input_tokens": {"low": 50, "high": 400}, "output_tokens": {"low": 5, "high": 40}},
         "metrics": {"sample_interval_s": 0.05}}


@pytest.fixture(scope="module")
def tiny():
    return Simulation(load_config(TINY)).run()


def csv_shape(path):
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return rows[0], len(rows) - 1


def test_repr_is_one_line_of_headline_figures(tiny):
    """The run's own summary figures, formatted on one line."""
    s = tiny.summary
    assert repr(tiny) == (f"<Results: 3 requests, 3 completed, 0 failed; TTFT p50 {s['ttft_s']['p50'] * 1e3:.2f} ms, "
                          f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.2f} ms; "
                          f"{s['throughput']['output_tokens_per_s']:,.1f} output tok/s; "
                          f"{s['sim']['simulated_s']:.3f} s simulated>")


def test_repr_of_results_without_a_summary():
    import numpy as np

    from twin.results import Results

    empty = Results(requests=np.zeros(0), summary={}, timeseries={}, ledger={}, config={})
    assert repr(empty) == ("<Results: 0 requests, ? completed, ? failed; TTFT p50 -, TPOT p50 -; - output tok/s; "
                           "- s simulated>")


def test_to_pandas_frames_have_the_csv_columns_and_rows(tiny, tmp_path):
    pytest.importorskip("pandas")
    tiny.write(tmp_path)
    frames = tiny.to_pandas()
    for name in ("requests", "timeseries"):
        columns, rows = csv_shape(tmp_path / f"{name}.csv")
        frame = getattr(frames, name)
        assert list(frame.columns) == columns and frame.shape == (rows, len(columns))
    assert list(frames.requests["status"]) == ["finished"] * 3
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert list(frames.ledger.columns) == ["worker", "term", "seconds", "steps", "busy_s"]
    assert len(frames.ledger) == sum(len(w["terms_s"]) for w in ledger.values())
    for row in frames.ledger.itertuples():
        assert row.seconds == ledger[row.worker]["terms_s"][row.term]
        assert (row.steps, row.busy_s) == (ledger[row.worker]["steps"], ledger[row.worker]["busy_s"])


def test_parquet_round_trip(tiny, tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    tiny.write_parquet(tmp_path / "pq")
    for name, frame in tiny.to_pandas()._asdict().items():
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "pq" / f"{name}.parquet"), frame)


def test_without_pandas_the_error_names_the_extra(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # (import pandas then raises ImportError)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[pandas\]'"):
        tiny.to_pandas()


def comparable(results):
    """Everything a run writes, but the wall time."""
    summary = dict(results.summary)
    summary["sim"] = {k: v for k, v in summary["sim"].items() if k != "wall_s"}
    return summary, results.ledger


def test_a_run_with_its_progress_bar_is_the_same_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(twin.progress, "REFRESH_S", 0.0)  # a refresh at every sample
    quiet = Simulation(load_config(SMALL)).run()
    shown = Simulation(load_config(SMALL)).run(progress=True)
    err = capsys.readouterr().err
    assert err.count("requests ") > 10 and "session" in err
    quiet.write(tmp_path / "quiet")
    shown.write(tmp_path / "shown")
    for name in ("requests.csv", "timeseries.csv"):
        assert (tmp_path / "quiet" / name).read_bytes() == (tmp_path / "shown" / name).read_bytes()
    assert comparable(quiet) == comparable(shown)


@pytest.mark.parametrize("quiet", [False, True])
def test_twin_run_shows_the_bar_on_a_terminal_unless_quiet(tmp_path, monkeypatch, capsys, quiet):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    args = ["run", str(config), "--out", str(tmp_path / "out"), "--no-plots"]
    assert main(args) == 0
    assert "twin run" not in capsys.readouterr().err  # not a terminal: no bar
    monkeypatch.setattr(twin.progress, "on_terminal", lambda stream=None: True)
    assert main(args + ["--quiet"] * quiet) == 0
    captured = capsys.readouterr()
    assert ("twin run" in captured.err) is not quiet and "twin run" not in captured.out
