"""The tracked text describes the project as it is: no absolute path of one machine (a reader's checkout
sits elsewhere) and no progress label of a work diary (history lives in git)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".pyx", ".md", ".rst", ".txt", ".yaml", ".yml", ".json", ".cfg", ".toml", ".ini"}

MACHINE_PATH = re.compile(r"(?<![\w.:/~-])/(?:work|root|tmp)/|(?<![\w.:/~-])/home/\w")
"""An absolute path on a development machine. A path inside a URL or a relative one (``../shared``,
``out/val``) is preceded by a word character, a dot, a colon or a slash, and does not match."""

PROGRESS_LABEL = re.compile(r"\b[Ss]tops? \d+\b|\b[Ss]top-\d+\b|\bas of stop\b|\b(?:valruns|speedruns)\b"
                            r"|/runs/val\d+")
"""A diary's numbered entry, or the name of the folder of one of its runs."""


def _tracked_text_files() -> list[Path]:
    if shutil.which("git") is None:
        pytest.skip("git is not available")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    paths = (ROOT / name for name in done.stdout.split("\0") if name)
    this = Path(__file__).resolve()   # its examples below are what the patterns must find
    return [p for p in paths if p.suffix in TEXT_SUFFIXES and p.is_file() and p.resolve() != this]


def _hits(pattern: re.Pattern[str]) -> list[str]:
    out = []
    for path in _tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            match = pattern.search(line)
            if match:
                out.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r} in {line.strip()[:100]}")
    return out


def test_no_absolute_machine_paths() -> None:
    hits = _hits(MACHINE_PATH)
    assert not hits, "absolute machine paths (use paths relative to the checkout):\n" + "\n".join(hits)


def test_no_progress_labels() -> None:
    hits = _hits(PROGRESS_LABEL)
    assert not hits, "progress labels (describe the project as it is):\n" + "\n".join(hits)


@pytest.mark.parametrize("text", ["see /work/shared/data", "`/tmp/x`", "/root/.cache", "/home/alice/x"])
def test_machine_path_pattern_matches(text: str) -> None:
    assert MACHINE_PATH.search(text)


@pytest.mark.parametrize("text", ["../shared/data/measured", "https://example.org/work/x", "out/tmp/x",
                                  "~/work/x", "C:/tmp/x"])
def test_machine_path_pattern_spares(text: str) -> None:
    assert not MACHINE_PATH.search(text)


@pytest.mark.parametrize("text", ["Stop 12", "at stop 47", "stops 28-35", "the stop-38 curves", "as of stop",
                                  "journal valruns/x", "out/runs/val47e"])
def test_progress_label_pattern_matches(text: str) -> None:
    assert PROGRESS_LABEL.search(text)


@pytest.mark.parametrize("text", ["OUT/runs/runNNNN", "stop the worker", "stopped 3 times", "nonstop 4"])
def test_progress_label_pattern_spares(text: str) -> None:
    assert not PROGRESS_LABEL.search(text)
