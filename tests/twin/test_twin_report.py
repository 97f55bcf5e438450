"""``twin report``: the HTML page of a disaggregated run and of a sweep renders in a headless Chromium (every
section there, every figure decoded, no console error) and needs no network; a folder that is neither a run
nor a sweep is an error naming it."""

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from twin.cli import main

RUN_SECTIONS = {"summary": "Summary", "timeseries": "Time series", "latency": "Latency CDFs",
                "ledger": "Cost ledger per worker", "config": "Resolved config"}
SWEEP_SECTIONS = {"sweep-table": "Sweep table", "sweep-plots": "Metrics against each parameter",
                  "points": "Points"}
SMALL = ["--quiet", "--set", "workload.num_requests=6"]
# Looking at the checks below in a page: every section's heading, every image decoded, what it logged.
PAGE_STATE = """() => ({
  headings: Object.fromEntries(Array.from(document.querySelectorAll('section[id]')).map(
      s => [s.id, (s.querySelector(':scope > h2, :scope > h3, :scope > h4') || {}).textContent || ''])),
  images: Array.from(document.images).map(i => ({
      section: (i.closest('section[id]') || {}).id, ok: i.complete && i.naturalWidth > 0})),
  links: Array.from(document.querySelectorAll('a[href^="#"]')).map(a => a.getAttribute('href').slice(1)),
  rows: Object.fromEntries(Array.from(document.querySelectorAll('section[id]')).map(
      s => [s.id, s.querySelectorAll(':scope table tbody tr').length])),
})"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The report of a small disaggregated run and of a two-point sweep that kept its runs."""
    tmp = tmp_path_factory.mktemp("report")
    assert main(["run", "--example", "disagg", "--out", str(tmp / "run"), "--no-plots", "--quiet",
                 "--set", "workload.num_users=3", "--set", "workload.num_rounds=2"]) == 0
    assert main(["sweep", "--example", "chat", *SMALL, "--grid", "scheduler.max_num_seqs=2,8",
                 "--out", str(tmp / "sweep"), "--keep-runs"]) == 0
    out = {"run": tmp / "run.html", "sweep": tmp / "sweep.html"}
    for kind, html in out.items():
        assert main(["report", str(tmp / kind), "-o", str(html)]) == 0
    return out


@pytest.fixture(scope="module")
def browser() -> Any:
    """A headless Chromium (the system's: `.ci/run` installs Debian's where there is none)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright: pip install -e '.[test]'")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("needs a chromium on PATH (apt-get install chromium; .ci/run installs it)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable)
        yield chromium
        chromium.close()


def open_page(browser: Any, html: Path, screenshot: Path) -> tuple[dict[str, Any], list[str]]:
    """The page's state (:data:`PAGE_STATE`) and what went wrong loading it: console errors, uncaught
    exceptions and any request that left the file (a page that needs the network)."""
    problems: list[str] = []
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("console", lambda msg: problems.append(f"console {msg.type}: {msg.text}")
            if msg.type in ("error", "warning") else None)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("request", lambda req: problems.append(f"request: {req.url}")
            if not req.url.startswith(("data:", "file:")) else None)
    page.goto(html.as_uri(), wait_until="load")
    state = page.evaluate(PAGE_STATE)
    page.screenshot(path=str(screenshot), full_page=True)
    page.close()
    return state, problems


def rendering_problems(state: dict[str, Any], sections: dict[str, str], figures: dict[str, int]) -> list[str]:
    """Each expected section missing or mis-titled, each figure count short, each image not decoded, each
    link to no section."""
    out = [f"section {sid!r} missing or titled {state['headings'].get(sid)!r}, not {title!r}"
           for sid, title in sections.items() if not state["headings"].get(sid, "").startswith(title)]
    for sid, n in figures.items():
        shown = sum(1 for image in state["images"] if image["section"] == sid and image["ok"])
        if shown < n:
            out.append(f"section {sid!r}: {shown} decoded figures, expected {n}")
    out += [f"image in {image['section']!r} not decoded" for image in state["images"] if not image["ok"]]
    out += [f"link to #{target}, no such section" for target in state["links"]
            if target not in state["headings"]]
    return out


def test_the_report_of_a_disaggregated_run_renders(reports, browser, tmp_path):
    state, problems = open_page(browser, reports["run"], tmp_path / "run.png")
    assert problems == []
    assert rendering_problems(state, RUN_SECTIONS, {"timeseries": 1, "latency": 1}) == []
    assert state["rows"]["ledger"] >= 2 + 3  # two workers, and at least three cost terms
    assert (tmp_path / "run.png").stat().st_size > 0
    text = reports["run"].read_text()
    for role in ("prefill", "decode"):
        assert f"<td>{role}</td>" in text  # KV capacity and the ledger per worker name both roles
    assert "kv_transfer" in text and "Fail reasons" in text


def test_the_report_of_a_sweep_renders_with_a_section_per_point(reports, browser, tmp_path):
    state, problems = open_page(browser, reports["sweep"], tmp_path / "sweep.png")
    assert problems == []
    points = {f"point-{i}": f"point {i}: scheduler.max_num_seqs={n}" for i, n in enumerate((2, 8))}
    nested = {f"point-{i}-{sid}": title for i in range(2) for sid, title in RUN_SECTIONS.items()}
    figures = {"sweep-plots": 1,
               **{f"point-{i}-{sid}": 1 for i in range(2) for sid in ("timeseries", "latency")}}
    assert rendering_problems(state, {**SWEEP_SECTIONS, **points, **nested}, figures) == []
    assert state["rows"]["sweep-table"] == 2
    assert {"point-0", "point-1"} <= set(state["links"])


def test_the_checks_catch_a_missing_section_a_broken_figure_and_a_script_error(reports, browser, tmp_path):
    """The checks above have teeth: a doctored page fails each of them."""
    text = reports["run"].read_text()
    text = re.sub(r'<section id="ledger">.*?</section>', "", text, flags=re.S)
    text = re.sub(r"base64,[A-Za-z0-9+/]{40}", "base64,AAAA", text, count=1)
    text = text.replace("</body>", "<script>undefined_function()</script></body>")
    doctored = tmp_path / "doctored.html"
    doctored.write_text(text)
    state, problems = open_page(browser, doctored, tmp_path / "doctored.png")
    assert any("undefined_function" in p for p in problems)
    found = rendering_problems(state, RUN_SECTIONS, {"timeseries": 1, "latency": 1})
    assert any("'ledger' missing" in p for p in found)
    assert any("'timeseries': 0 decoded figures" in p for p in found)


def test_the_report_needs_no_network(reports):
    for html in reports.values():
        text = html.read_text()
        assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
        assert not re.search(r"url\(\s*['\"]?\s*(https?:)?//|@import|<link\b|<script\b", text, re.I)
        assert "data:image/png;base64," in text


def test_a_sweep_without_its_runs_has_the_table_and_the_plots(tmp_path):
    assert main(["sweep", "--example", "chat", *SMALL, "--grid", "scheduler.max_num_seqs=2,8",
                 "--grid", "hardware.gpu=h100_sxm,h200_sxm", "--out", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path)]) == 0
    text = (tmp_path / "report.html").read_text()
    assert text.count('<img alt="metrics against ') == 2  # one figure per swept parameter
    assert all(f'<section id="point-{i}" class="point">' in text for i in range(4))
    assert "point-0-summary" not in text and "runs were not kept" in text


def test_a_folder_that_is_neither_a_run_nor_a_sweep_is_an_error_naming_it(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "neither a run nor a sweep folder" in err and "sweep.csv" in err
    assert not (tmp_path / "r.html").exists()
    (tmp_path / "summary.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    assert "a run folder without config.yaml" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_a_run_that_failed_every_request_has_its_fail_reasons_in_a_table(tmp_path):
    assert main(["run", "--example", "chat", *SMALL, "--set", "engine.max_model_len=100", "--no-plots",
                 "--out", str(tmp_path)]) == 1
    assert main(["report", str(tmp_path)]) == 0
    text = (tmp_path / "report.html").read_text()
    fails = re.search(r"<caption>Fail reasons</caption>.*?</table>", text).group(0)
    assert '<td class="num">6</td>' in fails and "more than the engine&#x27;s max_model_len N" in fails
    assert "<td>worker0</td><td>colocated</td>" in text
