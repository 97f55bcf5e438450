"""The configuration reference is generated from the config classes and kept in step with them."""

import json
from pathlib import Path

import pytest

from twin.cli import main
from twin.config_reference import reference, schema

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_is_the_generated_reference() -> None:
    """docs/config.md is what `twin config reference` prints: regenerate it after changing a config class
    (twin config reference > docs/config.md)."""
    assert DOC.read_text(encoding="utf-8") == reference()


def test_every_field_has_a_meaning() -> None:
    rows = [line for line in reference().splitlines() if line.startswith("| `")]
    bare = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("|  |")]
    assert len(rows) > 100 and bare == []


def test_the_schema_lists_sections_kinds_and_field_types(capsys: pytest.CaptureFixture[str]) -> None:
    s = schema()
    assert s["additionalProperties"] is False and set(s["properties"]) >= {"hardware", "workload", "run"}
    hw = s["properties"]["hardware"]
    assert hw["properties"]["scale"]["properties"]["hbm_bw"] == {
        "type": "number", "description": "HBM bandwidth: the memory-bound side of every kernel (weights, KV reads, "
                                         "activations).", "default": 1.0}
    kinds = {k["properties"]["kind"]["const"] for k in s["properties"]["workload"]["anyOf"]}
    assert {"synthetic", "trace_csv", "sessions", "lmbenchmark_multiround"} <= kinds
    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == s
