"""Found by fuzzing the results, their files, `twin plot` and the printed summary with edge cases: runs where
every request fails, one-token requests, runs cut by run.max_sim_s, hand-edited or damaged result files."""

import csv
import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pytest

from twin.cli import format_summary, main
from twin.config import load_config
from twin.plots import read_csv_columns
from twin.runner import Simulation

matplotlib.use("Agg")

BASE = {"model": {"name": "Qwen/Qwen3-0.6B"},
        "workload": {"kind": "synthetic", "num_requests": 3, "arrival": {"kind": "all_at_once"},
                     "input_tokens": {"fixed": 20}, "output_tokens": {"fixed": 4}}}


def _run(*overrides):
    return Simulation(load_config(BASE, list(overrides))).run()


def test_max_itl_of_a_request_with_fewer_than_two_tokens_is_empty(tmp_path):
    """A one-token request and one that failed before its first token had max_itl_s 0.0, a max of no gaps
    (its TPOT was already empty)."""
    one = _run("workload.num_requests=1", "workload.output_tokens.fixed=1")
    assert one.requests["output_tokens"][0] == 1 and math.isnan(one.requests["max_itl_s"][0])
    failed = _run("engine.max_model_len=16")
    assert list(failed.requests["status"]) == ["failed"] * 3 and np.isnan(failed.requests["max_itl_s"]).all()
    failed.write(tmp_path)
    with open(tmp_path / "requests.csv", newline="") as fh:
        assert [row["max_itl_s"] for row in csv.DictReader(fh)] == ["", "", ""]
    four = _run("workload.num_requests=1")  # (two or more tokens: the largest gap, as before)
    assert four.requests["max_itl_s"][0] == pytest.approx(0.001833732)


def test_a_run_where_every_request_fails_has_no_hit_rate_and_prints_dashes(tmp_path):
    """No prompt was admitted, yet the hit rate read 0.0 (a cache that missed everything) and the printed
    summary said "nan output tok/s"; a NaN in kv_transfer was printed as a NaN literal, which is no JSON."""
    res = _run("engine.max_model_len=16")
    assert math.isnan(res.summary["prefix_cache"]["hit_rate"])
    res.write(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["prefix_cache"] == {
        "hit_rate": None, "cached_tokens": 0, "host_hit_tokens": 0, "prompt_tokens": 0}
    lines = format_summary(res.summary).splitlines()
    assert lines[7] == "throughput: - output tok/s, - input tok/s, - req/s (goodput - req/s)"
    assert lines[8] == "prefix-cache hit rate: -; preemptions: 0"
    res.summary["kv_transfer"] = {"pulls": 0, "staged_s": {"mean": float("nan")}}
    assert 'kv_transfer: {"pulls": 0, "staged_s": {"mean": null}}' in format_summary(res.summary)
    ok = format_summary(_run().summary).splitlines()  # (a normal run prints its numbers as before)
    assert ok[7].startswith("throughput: ") and "-" not in ok[7]
    assert ok[8] == "prefix-cache hit rate: 0.000; preemptions: 0"


def test_result_files_are_utf8_in_any_locale(tmp_path):
    """Under an ASCII (or Latin-1, or Windows) locale a session name outside ASCII raised UnicodeEncodeError
    while requests.csv was written, after the whole run."""
    script = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from twin.results import REQUEST_FIELDS, Results\n"
        "from twin.plots import read_csv_columns\n"
        "t = np.zeros(1, dtype=REQUEST_FIELDS)\n"
        "t['session'] = 'caf\\u00e9-\\u30bb'; t['status'] = 'finished'\n"
        "t['fail_reason'] = ''; t['kv_state'] = ''\n"
        "Results(requests=t, summary={}, timeseries={'time_s': np.array([0.0])}, ledger={},\n"
        "        config={}).write(sys.argv[1])\n"
        "print(ascii(read_csv_columns(Path(sys.argv[1]) / 'requests.csv')['session'][0]))\n"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "'caf\\xe9-\\u30bb'"
    assert "café-セ".encode("utf-8") in (tmp_path / "requests.csv").read_bytes()


@pytest.mark.parametrize("body, message", [
    (b"time_s,kv_usage\n0,0.5\n1,0.\xe9\n", "t.csv, line 3: not UTF-8 text (invalid continuation byte), "
                                            "as twin.results writes it"),
    (b"time_s,kv_usage\n0,0.5\n1," + b"9" * 200_000 + b"\n",
     "t.csv, line 3: not readable as CSV (field larger than field limit (131072))"),
    (b"time_s,kv_usage\n0,0.5\n1,high\n", "t.csv, line 3: column 'kv_usage' holds 'high': expected a number "
                                          "(or an empty cell for none)"),
    (b"time_s,kv_usage,time_s\n0,0.5,1\n", "t.csv: the header names column 'time_s' twice"),
    (b"kv_usage\n0.5\n", "t.csv: expected a numeric column 'time_s'"),
])
def test_a_damaged_csv_names_its_file_and_line(tmp_path, body, message):
    """A byte that is not UTF-8 gave UnicodeDecodeError's message naming neither file nor line; a cell past
    the csv module's field limit a bare _csv.Error traceback; a text cell in a gauge or a repeated column
    went unnoticed (the gauge plotted as categories, the later column replacing the earlier)."""
    path = tmp_path / "t.csv"
    path.write_bytes(body)
    with pytest.raises(ValueError) as info:
        read_csv_columns(path, ("time_s", "kv_usage"))
    assert str(info.value) == f"{tmp_path}/{message}"


def test_plot_of_a_damaged_file_is_an_error_message_not_a_traceback(tmp_path, capsys):
    res = _run()
    res.write(tmp_path)
    (tmp_path / "requests.csv").write_bytes((tmp_path / "requests.csv").read_bytes() + b"x" * 200_000 + b"\n")
    assert main(["plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"twin: error: {tmp_path}/requests.csv, line 5: not readable as CSV "
                                       f"(field larger than field limit (131072))\n")


def test_a_spreadsheet_export_reads_as_written(tmp_path):
    """A UTF-8 byte-order mark (a spreadsheet's export) made the first column '\\ufefftime_s', so `twin plot`
    said time_s was missing; a trailing blank line was "0 cells where the header has 2 (a cut-off file?)"."""
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbftime_s,kv_usage\r\n0,0.5\r\n1,\r\n\r\n")
    cols = read_csv_columns(path, "all")
    assert list(cols) == ["time_s", "kv_usage"] and cols["time_s"].tolist() == [0.0, 1.0]
    assert cols["kv_usage"][0] == 0.5 and math.isnan(cols["kv_usage"][1])


def _folder(tmp_path, config):
    (tmp_path / "timeseries.csv").write_text("time_s\n0.0\n1.0\n")
    (tmp_path / "requests.csv").write_text(
        "status,arrival_s,ttft_s,tpot_s,e2e_s\n"
        "finished,0.0,9.0,0.01,9.5\n"      # before run.warmup_s: not in the summary
        "finished,2.0,0.5,0.02,1.5\n"
        "failed,2.0,0.7,,\n")               # cut off by run.max_sim_s while decoding
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)


def test_the_latency_cdf_plots_what_the_summary_counts(tmp_path, monkeypatch):
    """The TTFT curve held failed requests (cut off by run.max_sim_s after their first token) and warm-up
    requests, which summary.json's percentiles leave out."""
    from matplotlib.axes import Axes

    _folder(tmp_path, "run:\n  warmup_s: 1.0\n")
    plotted = []
    original = Axes.plot
    monkeypatch.setattr(Axes, "plot",
                        lambda ax, *a, **k: (plotted.append(list(a[0])), original(ax, *a, **k))[1])
    from twin.plots import plot_results

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a panel none of whose columns is there warned about its legend)
        plot_results(tmp_path)
    assert plotted[-3:] == [[0.5], [0.02], [1.5]]  # (the CDFs of TTFT, TPOT, E2E: the one counted request)


@pytest.mark.parametrize("config, message", [
    ("run: [1\n", "config.yaml: not a YAML config (while parsing a flow sequence)"),
    ("run:\n  warmup_s: soon\n", "config.yaml: run.warmup_s is 'soon'; expected a number of seconds >= 0"),
])
def test_a_broken_config_yaml_names_itself(tmp_path, config, message):
    _folder(tmp_path, config)
    from twin.plots import plot_results

    with pytest.raises(ValueError) as info:
        plot_results(tmp_path)
    assert str(info.value) == f"{tmp_path}/{message}"
    assert not (tmp_path / "timeseries.png").exists()


def test_run_without_plots_removes_an_earlier_runs_plots(tmp_path, capsys):
    """`twin run --no-plots` into a folder an earlier run had plotted into left that run's PNGs beside the
    new tables."""
    for name in ("timeseries.png", "latency_cdf.png"):
        (tmp_path / name).write_bytes(b"old")
    assert main(["run", "--set", "workload.num_requests=2", "--no-plots", "--out", str(tmp_path)]) == 0
    assert not (tmp_path / "timeseries.png").exists() and not (tmp_path / "latency_cdf.png").exists()
    assert (tmp_path / "summary.json").exists()


def test_values_matplotlib_cannot_lay_out_name_their_file(tmp_path, capsys):
    """Found by fuzzing: hand-edited gauges of +-1e308 made matplotlib fail with "arange: cannot compute
    length", a message naming no file; `twin plot` names the file now."""
    (tmp_path / "timeseries.csv").write_text("time_s,kv_usage\n0.0,1e308\n1.0,-1e308\n")
    (tmp_path / "requests.csv").write_text("status,arrival_s,ttft_s,tpot_s,e2e_s\nfinished,0.0,0.5,0.01,0.9\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (matplotlib's own overflow warnings on the way)
        assert main(["plot", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"twin: error: {tmp_path}/timeseries.csv: cannot plot its values "
                                       f"(arange: cannot compute length)\n")
