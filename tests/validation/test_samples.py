"""The measured samples shipped in the package, the CSV columns ``twin validate silicon`` reads, and the list
of them in its help and in the README (all from the package itself, never the shared reference data)."""

import argparse
import csv
import gzip
import json
import re
from pathlib import Path

import pytest

from twin.cli import build_parser, main
from validation import (harness_decoding, harness_launch, inferencemax_blackwell, inferencemax_disagg,
                        measured_rows, protocols, row_config, row_spec, silicon, silicon_run)
from validation.report import csv_argument
from validation.samples import (DATA_DIR, OPTIONAL_COLUMNS, REQUIRED_COLUMNS, SAMPLES, columns_markdown,
                                resolve_csv, sample_path)

README = Path(__file__).resolve().parents[2] / "README.md"

SAMPLE_ROWS = {"h100_h200": 1884, "blackwell_dev": 658}
"""Data rows of each shipped file, counted by hand in the reference copies it was compressed from
(silicon_h100_h200.csv: 1,885 lines, silicon_blackwell_dev.csv: 659, one of them the header)."""


@pytest.mark.parametrize("name", sorted(SAMPLE_ROWS))
def test_a_shipped_sample_loads_every_row(name: str) -> None:
    path = sample_path(name)
    assert path.parent == DATA_DIR and path.name.endswith(".csv.gz") and path.is_file()
    rows = silicon.read_rows(path)
    assert len(rows) == SAMPLE_ROWS[name]
    assert not [r["_line"] for r in rows if r.get("_bad")]
    assert len({r["id"] for r in rows}) > 1 and all(r["silicon_tpot_ms"] for r in rows)


def test_the_samples_are_the_ones_named_and_their_readme_gives_source_and_licence() -> None:
    assert set(SAMPLES) == set(SAMPLE_ROWS)
    assert sorted(p.name for p in DATA_DIR.glob("*.csv.gz")) == sorted(SAMPLES.values())
    readme = (DATA_DIR / "README.md").read_text()
    assert "ai-dynamo/aiconfigurator" in readme and "Apache" in readme
    for name, file in SAMPLES.items():
        assert f"`{name}`" in readme and f"`{file}`" in readme


def test_twin_validate_silicon_runs_on_a_shipped_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "val"
    assert main(["validate", "silicon", "h100_h200", "--limit", "2", "--out", str(out)]) == 0
    with (out / "rows.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    first = [r["id"] for r in silicon.read_rows(sample_path("h100_h200"))[:2]]
    assert [r["id"] for r in rows] == first
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"] == 2
    assert "rows: 2" in capsys.readouterr().out


def test_a_users_own_gzip_csv_reads_as_the_plain_one(tmp_path: Path) -> None:
    with gzip.open(sample_path("blackwell_dev"), "rt", newline="") as fh:
        head = "".join(fh.readline() for _ in range(4))     # the header and three rows
    plain, packed = tmp_path / "mine.csv", tmp_path / "mine.csv.gz"
    plain.write_text(head)
    packed.write_bytes(gzip.compress(head.encode()))
    assert silicon.read_rows(packed) == silicon.read_rows(plain)
    assert len(silicon.read_rows(packed)) == 3


def test_a_damaged_gzip_is_an_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv.gz"
    bad.write_text("id,backend\n")                        # not compressed
    with pytest.raises(ValueError, match=r"bad\.csv\.gz: not a readable gzip file"):
        silicon.read_rows(bad)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(sample_path("h100_h200").read_bytes()[:2000])
    with pytest.raises(ValueError, match=r"cut\.csv\.gz: not a readable gzip file"):
        silicon.read_rows(cut)


def test_a_file_wins_over_a_sample_name_and_an_unknown_name_lists_the_samples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_csv("h100_h200") == sample_path("h100_h200")
    (tmp_path / "h100_h200").write_text("id\n")
    assert resolve_csv("h100_h200") == Path("h100_h200")
    with pytest.raises(FileNotFoundError, match="nosuch: no such file.*h100_h200, blackwell_dev"):
        resolve_csv("nosuch")
    assert csv_argument("blackwell_dev") == sample_path("blackwell_dev")
    with pytest.raises(argparse.ArgumentTypeError, match="nosuch"):
        csv_argument("nosuch")


def test_twin_validate_on_an_unknown_name_says_which_samples_exist(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "silicon", str(tmp_path / "nosuch"), "--out", str(tmp_path / "v")]) == 2
    assert "no shipped sample of that name (h100_h200, blackwell_dev)" in capsys.readouterr().err


def _help_columns(text: str) -> tuple[list[str], list[str]]:
    """The column names the help lists under "required columns:" and under "optional columns": each entry's
    first line, two spaces in, names before the two spaces that start the description."""
    sections: dict[str, list[str]] = {"required": [], "optional": []}
    current = None
    for line in text.splitlines():
        if line.startswith("required columns:"):
            current = "required"
        elif line.startswith("optional columns"):
            current = "optional"
        elif current and re.match(r"  [a-z]", line):
            sections[current] += line.strip().split("  ")[0].split(", ")
        elif current and not line.startswith(" "):
            current = None
    return sections["required"], sections["optional"]


def test_the_help_lists_every_column_the_code_names(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["validate", "silicon", "--help"])
    required, optional = _help_columns(capsys.readouterr().out)
    assert tuple(required) == REQUIRED_COLUMNS == silicon.REQUIRED
    assert tuple(optional) == OPTIONAL_COLUMNS
    assert set(silicon.ENGINE_LIMIT_COLUMNS) <= set(optional)
    assert len(set(required + optional)) == len(required + optional)


def _columns_read(source: str) -> set[str]:
    """Column names the reader's source takes from a row: ``row["x"]``, ``row.get("x")``,
    ``int_cell(row, "x")``, the measured times, and the per-worker names it builds from a prefix."""
    read = set(re.findall(r"""row(?:\.get\(|\[)["']([a-z][a-z0-9_]*)["']""", source))
    read |= set(re.findall(r"""(?:int_cell|measured_ms)\(row, ["']([a-z][a-z0-9_]*)["']""", source))
    for suffix in re.findall(r'f"\{prefix\}([a-z_]+)"', source):
        read |= {suffix, f"prefill_{suffix}", f"decode_{suffix}"}
    for suffix in re.findall(r'f"\{side\}_([a-z_]+)"', source):
        read |= {f"prefill_{suffix}", f"decode_{suffix}"}
    return read


def test_the_column_list_is_every_column_the_reader_reads() -> None:
    read = set()
    for module in (measured_rows, protocols, inferencemax_disagg, row_spec, harness_launch, harness_decoding,
                   row_config, silicon_run, inferencemax_blackwell):
        read |= _columns_read(Path(module.__file__ or "").read_text(encoding="utf-8"))
    read |= set(silicon.ENGINE_LIMIT_COLUMNS)          # read in a loop over the constant
    assert read == set(REQUIRED_COLUMNS) | set(OPTIONAL_COLUMNS)


def test_the_readme_has_the_same_column_list() -> None:
    assert columns_markdown() in README.read_text(encoding="utf-8"), \
        "README.md's 'Measured data' table differs from validation.samples.columns_markdown(): paste its output"
