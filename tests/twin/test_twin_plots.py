"""`twin plot`: the panels each kind of run gets, the hit rate at every sample, two runs overlaid."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from twin.cli import example_path, main
from twin.config import load_config
from twin.plots import (COMPARE_NAMES, default_hit_window, hit_rate, load_run, timeseries_figure,
                        timeseries_panels)
from twin.runner import run

QUEUE = "requests: waiting and running"
PREFILL, DECODE = "prefill: waiting and running", "decode: waiting for KV and running"
SESSIONS, KV = "sessions and tool waits", "KV usage"
STAGED, LINK = "staged KV on prefill", "KV link utilisation"
TPUT, HIT, DISRUPTIONS = "output throughput", "prefix-hit rate", "preemptions and failures"


def _folder(tmp_path: Path, example: str, *overrides: str) -> Path:
    out = tmp_path / example
    run(load_config(example_path(example), list(overrides)), out=out)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("runs")
    return {
        "colocated": _folder(tmp, "chat", "workload.num_requests=150"),
        "disaggregated": _folder(tmp, "disagg"),
        "agents": _folder(tmp, "agentic", "workload.limit=3"),
    }


def titles(folder: Path) -> list[str]:
    return [p.title for p in timeseries_panels(load_run(folder))]


def test_a_colocated_run_has_one_queue_panel_and_no_disaggregation_panels(folders):
    assert titles(folders["colocated"]) == [QUEUE, KV, TPUT, HIT]


def test_a_disaggregated_run_has_a_panel_per_role_staged_kv_and_the_link(folders):
    # (LMBenchmark's users wait out their pacing interval between rounds: the sessions panel shows them)
    assert titles(folders["disaggregated"]) == [PREFILL, DECODE, SESSIONS, KV, STAGED, LINK, TPUT, HIT]
    panels = {p.title: p for p in timeseries_panels(load_run(folders["disaggregated"]))}
    assert [s.label for s in panels[PREFILL].series] == ["prefill0 waiting", "prefill0 running"]
    assert [s.label for s in panels[DECODE].series] == ["decode0 staged, waiting for KV", "decode0 running"]
    assert [s.label for s in panels[KV].series] == ["prefill0", "decode0"]
    assert [s.label for s in panels[STAGED].series] == ["prefill0 (pool 27,792)"]
    assert panels[LINK].ylim == (0, 1.05)


def test_an_agent_replay_has_the_sessions_panel(folders):
    assert titles(folders["agents"]) == [QUEUE, SESSIONS, KV, TPUT, HIT]


def test_a_run_that_drops_requests_gets_the_failures_panel(tmp_path):
    """The push ablation with a decode pool of 1,000 blocks: pushed KV arrives with no room and is dropped."""
    folder = _folder(tmp_path, "disagg", "transfer.kind=push", "system.decode.num_blocks=1000")
    run_ = load_run(folder)
    failed = int(run_.summary["requests"]["failed"])
    assert failed > 0
    panel = timeseries_panels(run_)[-1]
    assert panel.title == DISRUPTIONS and [s.label for s in panel.series] == ["failed requests"]
    assert panel.series[0].values[-1] == failed


def test_the_hit_rate_is_defined_at_every_sample_after_the_first_admission(folders):
    """The monitor's per-interval rate is empty wherever no prompt was admitted in the interval (most of a
    disaggregated run's samples); the plotted rate, over a trailing window of prompt tokens, is not."""
    for name, folder in folders.items():
        data = load_run(folder)
        rate = hit_rate(data.requests, data.time_s, default_hit_window(data.requests))
        first = np.nanmin(data.requests["first_scheduled_s"])
        assert np.isfinite(rate[data.time_s >= first]).all(), name
        assert np.isnan(rate[data.time_s < first]).all(), name
        assert ((0 <= rate[data.time_s >= first]) & (rate[data.time_s >= first] <= 1)).all(), name
    gauge = load_run(folders["disaggregated"]).timeseries["prefix_hit_rate"]
    assert np.isnan(gauge).sum() > len(gauge) / 3


def test_the_hit_rate_over_an_unbounded_window_ends_at_the_summarys(folders):
    for folder in folders.values():
        data = load_run(folder)
        rate = hit_rate(data.requests, data.time_s, math.inf)
        assert rate[-1] == pytest.approx(data.summary["prefix_cache"]["hit_rate"], rel=1e-12)


def test_the_hit_rate_window_holds_the_last_requests_with_that_many_tokens():
    req = {"first_scheduled_s": np.array([1.0, 2.0, 3.0, np.nan]),  # (the fourth never admitted)
           "prompt_tokens": np.array([100.0, 100, 100, 50]), "cached_tokens": np.array([0.0, 50, 100, 0])}
    times = np.array([0.0, 1.0, 2.5, 3.0])
    # window 150: 1 s -> request 1 alone (fewer admitted); 2.5 s -> 1 and 2; 3 s -> 2 and 3 (200 tokens)
    assert hit_rate(req, times, 150).tolist()[1:] == [0.0, 0.25, 0.75]
    assert math.isnan(hit_rate(req, times, 150)[0])
    assert hit_rate(req, times, 100).tolist()[1:] == [0.0, 0.5, 1.0]
    assert default_hit_window(req) == 20  # (300 admitted tokens / 20 = 15, nearest of 10, 20: 20)


def test_compare_overlays_both_runs_on_every_shared_panel(folders, tmp_path):
    first, second = load_run(folders["disaggregated"]), load_run(folders["colocated"])
    fig = timeseries_figure([first, second], 50_000)
    drawn = {ax.get_title(loc="left"): {line.get_linestyle() for line in ax.get_lines()}
             for ax in fig.axes if ax.get_visible()}
    mine, theirs = set(titles(folders["disaggregated"])), set(titles(folders["colocated"]))
    assert set(drawn) == mine | theirs
    for title, styles in drawn.items():
        expected = {style for style, has in (("-", title in mine), ("--", title in theirs)) if has}
        assert styles == expected, title
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["disagg", "chat"]
    assert "[solid] disagg" in fig._suptitle.get_text() and "[dashed] chat" in fig._suptitle.get_text()

    assert main(["plot", str(folders["disaggregated"]), "--compare", str(folders["colocated"]),
                 "--out", str(tmp_path / "cmp")]) == 0
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == sorted(COMPARE_NAMES)


def test_the_title_names_the_deployment_and_the_workload(folders):
    fig = timeseries_figure([load_run(folders["disaggregated"])], 50_000)
    assert fig._suptitle.get_text() == (
        "disagg: Llama-3.1-8B on h100_sxm, 1 prefill (TP1) + 1 decode (TP1), KV pull\n"
        "LMBenchmark multi-round QA: 20 users x 5 rounds, qps 2.0, 1000 shared + 4000 history tokens, "
        "150-token answers")


def test_a_window_that_is_no_number_of_tokens_is_refused(folders, capsys):
    assert main(["plot", str(folders["colocated"]), "--hit-window-tokens", "0"]) == 2
    assert "the hit-rate window is 0.0 prompt tokens; expected a number > 0" in capsys.readouterr().err
