"""Sweeps: grid parsing, the grid order of rows, equality with single runs, and bad values failing early."""

import csv
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from twin.cli import main
from twin.core.errors import ConfigError
from twin.runner import run
from twin.sweep import parse_grid, points, sweep

BASE = {"workload": {"kind": "synthetic", "num_requests": 15, "arrival": {"kind": "poisson", "rate_per_s": 10.0},
                     "input_tokens": {"fixed": 100}, "output_tokens": {"fixed": 10}}}


def test_grid_parsing_and_order():
    grid = parse_grid(["scheduler.max_num_seqs=4,64", "hardware.gpu=h100_sxm,h200_sxm"])
    assert grid == {"scheduler.max_num_seqs": [4, 64], "hardware.gpu": ["h100_sxm", "h200_sxm"]}
    assert points(grid)[:2] == [{"scheduler.max_num_seqs": 4, "hardware.gpu": "h100_sxm"},
                                {"scheduler.max_num_seqs": 4, "hardware.gpu": "h200_sxm"}]
    with pytest.raises(ValueError, match="expected path=value1"):
        parse_grid(["scheduler.max_num_seqs"])


def test_sweep_rows_equal_single_runs_with_any_executor():
    grid = {"scheduler.max_num_seqs": [2, 32]}
    here = sweep(BASE, grid)
    with ThreadPoolExecutor(max_workers=2) as pool:
        pooled = sweep(BASE, grid, executor=pool)
    assert [r["scheduler.max_num_seqs"] for r in here] == [2, 32]
    for row_a, row_b in zip(here, pooled):
        assert {k: v for k, v in row_a.items() if k != "wall_s"} == {k: v for k, v in row_b.items() if k != "wall_s"}
    single = run(BASE, overrides=("scheduler.max_num_seqs=2",)).summary
    assert here[0]["ttft_mean_s"] == single["ttft_s"]["mean"]
    assert here[0]["ttft_mean_s"] > here[1]["ttft_mean_s"]  # two seats queue requests


def test_bad_grid_value_fails_before_any_run():
    with pytest.raises(ConfigError, match="scheduler.max_num_seqs"):
        sweep(BASE, {"scheduler.max_num_seqs": [8, 0]})


def test_a_failing_point_is_a_row_with_its_reason_and_the_sweep_goes_on(tmp_path, capsys):
    """Found by fuzzing: a point refused only when its deployment is built (a host tier too small for one
    block) raised out of the sweep after the other points had run, and no sweep.csv was written."""
    rows = sweep(BASE, {"kv_cache.host_memory_gib": [1.0, 1e-6]})
    assert rows[0]["error"] == "" and rows[0]["completed"] == 15
    assert "kv_cache.host_memory_gib" in rows[1]["error"] and rows[1]["completed"] is None
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "out"
    assert main(["sweep", str(config), "--grid", "kv_cache.host_memory_gib=1.0,1e-6", "--out", str(out)]) == 1
    table = list(csv.DictReader(open(out / "sweep.csv")))
    assert [row["error"] == "" for row in table] == [True, False]
    assert "sweep point kv_cache.host_memory_gib=1e-06: " in capsys.readouterr().err


def test_an_override_the_grid_replaces_in_every_point_is_refused(tmp_path, capsys):
    """Found by fuzzing: --set workload.num_requests=2 beside --grid workload.num_requests=3,4 was dropped
    without a word (the grid's values apply after the overrides), as was a field inside a swept section; an
    override refining a swept section's kind still applies."""
    with pytest.raises(ValueError, match=r"^override 'workload.num_requests=2' is replaced in every point by the "
                                         r"grid's workload.num_requests; give workload.num_requests in the grid "
                                         r"or as an override, not both$"):
        sweep(BASE, {"workload.num_requests": [3, 4]}, overrides=["workload.num_requests=2"])
    with pytest.raises(ValueError, match=r"^override 'workload.arrival.cv=2' is replaced in every point by the "
                                         r"grid's workload.arrival;"):
        sweep(BASE, {"workload.arrival": [{"kind": "gamma", "rate_per_s": 5.0}]}, overrides=["workload.arrival.cv=2"])
    rows = sweep(BASE, {"workload.arrival.kind": ["gamma"]},
                 overrides=["workload.arrival.rate_per_s=5", "workload.arrival.cv=2"])
    assert [row["error"] for row in rows] == [""]
    assert main(["sweep", "--grid", "run.seed=1,2", "--set", "run.seed=3", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("twin: error: override 'run.seed=3' is replaced in every point")
    assert not (tmp_path / "sweep.csv").exists()


def test_grid_values_that_are_lists_or_quoted_keep_their_commas():
    """Found by fuzzing: the values were cut at every comma, so a list-valued field could not be swept
    (engine.cuda_graph_sizes=[8,16],[32] failed on '[8': "while parsing a flow sequence")."""
    grid = parse_grid(["engine.cuda_graph_sizes=[8,16],[32]", "name='a,b',c", "scheduler.max_num_seqs=4,64"])
    assert grid == {"engine.cuda_graph_sizes": [[8, 16], [32]], "name": ["a,b", "c"],
                    "scheduler.max_num_seqs": [4, 64]}
    rows = sweep(BASE, {"engine.cuda_graph_sizes": grid["engine.cuda_graph_sizes"]})
    assert [row["error"] for row in rows] == ["", ""]


def test_kept_run_folders_are_this_sweeps_only(tmp_path):
    """Found reading the sweep: a second sweep into the same folder left the first one's run0002 (three
    points, then two), and a point that fails writes no folder, so an old one passed for its results. Run
    folders of an earlier sweep are removed first; anything else in the folder is left alone."""
    runs = tmp_path / "runs"
    sweep(BASE, {"scheduler.max_num_seqs": [2, 8, 32]}, out=runs)
    assert sorted(p.name for p in runs.iterdir()) == ["run0000", "run0001", "run0002"]
    (runs / "notes.txt").write_text("mine")
    rows = sweep(BASE, {"kv_cache.host_memory_gib": [1.0, 1e-6]}, out=runs)
    assert rows[1]["error"] != ""
    assert sorted(p.name for p in runs.iterdir()) == ["notes.txt", "run0000"]
    assert (runs / "run0000" / "requests.csv").exists()


def test_an_interrupted_sweep_resumes_from_its_journal(tmp_path, monkeypatch):
    """Each point's row is journalled as it ends; --resume reuses the rows whose place and resolved config
    match and runs the rest (here: the journal of a three-point sweep cut inside its second line)."""
    import twin.sweep

    grid = {"scheduler.max_num_seqs": [2, 8, 32]}
    journal = tmp_path / "sweep.jsonl"
    full = sweep(BASE, grid, journal=journal)
    lines = journal.read_text().splitlines()
    assert len(lines) == 3
    journal.write_text(lines[0] + "\n" + lines[1][:40])  # interrupted while writing the second row
    ran: list[dict] = []
    real = twin.sweep.run_point
    monkeypatch.setattr(twin.sweep, "run_point", lambda b, o, p, out: ran.append(p) or real(b, o, p, out))
    resumed = sweep(BASE, grid, journal=journal, resume=True)
    assert ran == [{"scheduler.max_num_seqs": 8}, {"scheduler.max_num_seqs": 32}]
    assert resumed[0] == full[0]  # reused as journalled, its wall time included
    assert [{k: v for k, v in r.items() if k != "wall_s"} for r in resumed] == \
        [{k: v for k, v in r.items() if k != "wall_s"} for r in full]
    assert len(journal.read_text().splitlines()) == 3
    ran.clear()
    sweep(BASE, grid, journal=journal, resume=True, overrides=["run.seed=1"])  # another config: nothing reused
    assert len(ran) == 3


def test_resume_with_kept_runs_reruns_a_point_whose_folder_is_gone(tmp_path, capsys, monkeypatch):
    """With --keep-runs a journalled point is reused only while its run folder is there (the progress bar,
    shown on a terminal, counts it)."""
    import twin.progress

    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "out"
    args = ["sweep", str(config), "--grid", "scheduler.max_num_seqs=2,8", "--out", str(out), "--keep-runs"]
    assert main(args) == 0
    import shutil
    shutil.rmtree(out / "runs" / "run0001")
    capsys.readouterr()
    monkeypatch.setattr(twin.progress, "on_terminal", lambda stream=None: True)
    assert main([*args, "--resume"]) == 0
    printed = capsys.readouterr().err
    assert "twin sweep" in printed and "1/1" in printed and "1 reused" in printed
    assert (out / "runs" / "run0000" / "summary.json").exists() and (out / "runs" / "run0001" / "summary.json").exists()


def test_an_undefined_metric_is_an_empty_cell_of_sweep_csv(tmp_path):
    """A point where nothing finished (every prompt over max_model_len) has NaN latencies; sweep.csv wrote
    the text "nan", where the run's own requests.csv leaves such a cell empty."""
    from twin.sweep import write_table

    write_table(tmp_path / "s.csv", [{"x": 1, "ttft_mean_s": float("nan"), "completed": 0, "error": ""},
                                     {"x": 2, "ttft_mean_s": 0.25, "completed": 3, "error": ""}])
    assert (tmp_path / "s.csv").read_text(encoding="utf-8").splitlines() == [
        "x,ttft_mean_s,completed,error", "1,,0,", "2,0.25,3,"]
