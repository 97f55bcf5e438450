"""The speed benchmark's machinery on a generated 20-request list (no timing assertions, no shared data)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import speed  # noqa: E402
from benchmarks.scenarios import VIDUR_LIST, vidur_list_scenario  # noqa: E402


@pytest.fixture
def vidur_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "vidur"
    folder.mkdir()
    rows = ["request_id,arrived_at,num_prefill_tokens,num_decode_tokens"]
    rows += [f"{i},{0.15 * i:.3f},{100 + 37 * i},{5 + 3 * i}" for i in range(20)]
    for n in (400, 2000):
        (folder / VIDUR_LIST.format(n=n)).write_text("\n".join(rows) + "\n")
    return folder


def test_twin_measure_counts_events(vidur_dir: Path) -> None:
    scn = vidur_list_scenario("tiny", vidur_dir / VIDUR_LIST.format(n=400))
    assert scn.skip_reason() is None
    r = speed.measure_twin(scn, repeats=2)
    assert r["requests"] == 20 and r["finished"] == 20
    # Decode fast-forward covers many steps with one event, so events and steps are not ordered.
    assert r["events"] > 0 and r["steps"] > 0
    assert r["simulated_s"] > 0.15 * 19 and len(r["wall_runs_s"]) == 2
    assert 0 < r["cpu_s"] and r["loop_s"] < r["wall_s"]


def test_main_writes_speed_json(vidur_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    speed.main(["--out", str(out), "--repeats", "1", "--only", "vidur_conv_400,vidur_conv_2000",
                "--vidur-data", str(vidur_dir), "--trace", str(tmp_path / "absent.csv")])
    data = json.loads((out / "speed.json").read_text())
    assert set(data) == {"vidur_conv_400", "vidur_conv_2000"}
    for fig in data.values():
        assert {"requests", "simulated_s", "wall_s", "events", "process_wall_s", "peak_rss_mb"} <= set(fig)
        assert fig["peak_rss_mb"] > 0 and "vidur_wall_s" not in fig
    printed = capsys.readouterr().out
    assert "Vidur comparison skipped" in printed and "vidur_conv_2000" in printed
    assert json.loads((out / "meta.json").read_text())["skipped"] == {}


def test_missing_input_is_skipped(tmp_path: Path) -> None:
    scn = vidur_list_scenario("gone", tmp_path / "nope.csv")
    assert "missing" in (scn.skip_reason() or "")


def test_unregistered_system_kind_is_skipped(tmp_path: Path) -> None:
    from benchmarks.scenarios import Scenario

    scn = Scenario(name="x", description="", config={}, needs_system="no_such_system")
    assert "not registered" in (scn.skip_reason() or "")


def test_ff_check_compares_the_results_files_and_can_tell_them_apart(vidur_dir: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    scn = vidur_list_scenario("tiny", vidur_dir / VIDUR_LIST.format(n=400))
    r = speed.ff_check(scn)
    assert r == {"ff_identical": True, "ff_files": dict.fromkeys(speed.FF_FILES, True)}
    # a run with fast-forward off that is not the same simulation (here: one cut at 2 simulated s) is caught
    import twin.config

    real = twin.config.load_config

    def other_run_when_off(source: object, overrides: list[str] = []) -> object:
        cfg = real(source, overrides)  # type: ignore[arg-type]
        if "run.fast_forward=false" in overrides:
            cfg = real(source, [*overrides, "run.max_sim_s=2.0"])  # type: ignore[arg-type]
        return cfg

    monkeypatch.setattr(twin.config, "load_config", other_run_when_off)
    r = speed.ff_check(scn)
    assert r["ff_identical"] is False and r["ff_files"]["requests.csv"] is False


def test_a_whole_process_run_reports_its_own_figures_and_its_peak_memory(vidur_dir: Path, tmp_path: Path) -> None:
    from benchmarks.scenarios import DataPaths

    paths = DataPaths(vidur_data=vidur_dir, azure_conv=tmp_path / "absent.csv")
    scn = vidur_list_scenario("vidur_conv_400", vidur_dir / VIDUR_LIST.format(n=400))
    r = speed.twin_process(scn, paths)
    assert r["requests"] == r["finished"] == 20 and r["steps"] > 0
    assert r["process_wall_s"] > r["wall_s"] > 0 and r["peak_rss_mb"] > 0


def test_the_scale_points_differ_only_in_their_number_of_requests() -> None:
    from benchmarks.scenarios import SCALE_POINTS, scenarios

    points = [s for s in scenarios() if s.name in SCALE_POINTS]
    assert [s.config["workload"]["num_requests"] for s in points] == [10_000, 100_000, 1_000_000]
    assert all(s.process_only and not s.quick and s.skip_reason() is None for s in points)
    for s in points:
        s.config["workload"].pop("num_requests")
    assert points[0].config == points[1].config == points[2].config
