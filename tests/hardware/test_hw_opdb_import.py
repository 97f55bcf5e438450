"""The one-time conversion of aiconfigurator's kernel tables (hardware.opdb_import) on a made-up checkout,
and where the calibration and the kernel report look for the tables when no --data is given."""

import gzip
import sys
from pathlib import Path

import pytest

from experiments import kernel_report
from hardware import calibrate
from hardware.calibrate import SSM_TABLES, TABLE_SETS
from hardware.opdb_import import (DEFAULT_DIR, EXPECTED_ROWS, TABLES, check, convert, csv_text, data_root, plan,
                                  write_gz)

CURRENT = "aic-core/src/aiconfigurator_core/systems/data"


def _touch(root: Path, *rels: str) -> None:
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")


def test_the_tables_written_are_the_ones_each_architecture_is_fitted_on() -> None:
    for tables in TABLE_SETS.values():
        gpus, versions = TABLES[tables.source]
        assert gpus == tables.gpus
        for engine, version in tables.engines.items():
            assert "gemm_perf" in versions[version] and "moe_perf" in versions[version], (engine, version)
        for version in set(SSM_TABLES.values()):
            assert "gdn_perf" in versions[version], version
    assert set(EXPECTED_ROWS) == set(TABLES)


def test_plan_maps_both_checkout_layouts_to_opdb_names(tmp_path: Path) -> None:
    new, old = tmp_path / "new", tmp_path / "old"
    _touch(new / CURRENT, "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet",
           "h100_sxm/gemm/vllm/0.19.0/gemm_perf.parquet",                      # another version: left out
           "h100_sxm/encoder_attention/vllm/0.24.0/encoder_attention_perf.parquet",   # not read: left out
           "h200_sxm/mla/sglang/0.5.9/context_mla_perf.parquet",
           "h100_sxm/linear_attention/trtllm/1.3.0rc20/gdn_perf.parquet",
           "h100_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet",                 # Hopper fits TRT-LLM 1.2.0rc5
           "b300_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet",
           "b300_sxm/comm/nccl/2.29.2/nccl_perf.parquet")
    _touch(old / "src/aiconfigurator/systems/data", "h100_sxm/vllm/0.24.0/gemm_perf.parquet")
    assert data_root(new) == new / CURRENT and data_root(new / CURRENT) == new / CURRENT
    got = plan(data_root(new))
    assert sorted(got["opdb"]) == ["h100_sxm__gdn_perf__trtllm-1.3.0rc20.csv.gz",
                                   "h100_sxm__gemm_perf__vllm-0.24.0.csv.gz",
                                   "h200_sxm__context_mla_perf__sglang-0.5.9.csv.gz"]
    assert got["opdb"]["h100_sxm__gemm_perf__vllm-0.24.0.csv.gz"] == \
        new / CURRENT / "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet"
    assert sorted(got["opdb-blackwell"]) == ["b300_sxm__gemm_perf__trtllm-1.3.0rc20.csv.gz",
                                             "b300_sxm__nccl_perf__nccl-2.29.2.csv.gz"]
    assert list(plan(data_root(old))["opdb"]) == ["h100_sxm__gemm_perf__vllm-0.24.0.csv.gz"]
    with pytest.raises(ValueError, match="no aiconfigurator systems/data folder"):
        data_root(tmp_path)


def test_values_are_written_as_text_as_the_calibration_reads_them(tmp_path: Path) -> None:
    text = csv_text({"framework": ["VLLM", "VLLM"], "m": [1, 4096], "gemm_dtype": ["fp8", None],
                     "latency": [0.007526222202512953, 1.5]})
    assert text == "framework,m,gemm_dtype,latency\nVLLM,1,fp8,0.007526222202512953\nVLLM,4096,,1.5\n"
    a, b = tmp_path / "a.csv.gz", tmp_path / "b.csv.gz"
    write_gz(a, text)
    write_gz(b, text)
    assert a.read_bytes() == b.read_bytes()                   # no name or time in the gzip header
    assert calibrate.read_table_file(a) == [
        {"framework": "VLLM", "m": "1", "gemm_dtype": "fp8", "latency": "0.007526222202512953"},
        {"framework": "VLLM", "m": "4096", "gemm_dtype": "", "latency": "1.5"}]
    assert gzip.decompress(a.read_bytes()).decode() == text


def test_a_row_count_other_than_the_fitted_tables_is_a_warning() -> None:
    assert list(check(EXPECTED_ROWS)) == []
    (warning,) = check({"opdb": EXPECTED_ROWS["opdb"] - 1})
    assert "opdb has" in warning and "check out aiconfigurator" in warning


def test_without_pyarrow_the_conversion_says_what_to_install(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match="needs pyarrow"):
        convert(tmp_path, tmp_path / "out")


def test_convert_writes_each_parquet_table_as_csv_gz(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "aic" / CURRENT / "h100_sxm/gemm/sglang/0.5.9/gemm_perf.parquet"
    src.parent.mkdir(parents=True)
    pq.write_table(pa.table({"framework": ["SGLang"], "m": [224], "latency": [0.007526222202512953]}), src)
    assert convert(tmp_path / "aic", tmp_path / "out", log=lambda _: None) == {"opdb": 1, "opdb-blackwell": 0}
    rows = calibrate.read_table(tmp_path / "out" / "opdb", "h100_sxm", "gemm_perf", "sglang-0.5.9")
    assert rows == [{"framework": "SGLang", "m": "224", "latency": "0.007526222202512953"}]


@pytest.mark.parametrize("argv, folder", [([], "opdb"), (["--arch", "blackwell"], "opdb-blackwell")])
def test_calibrate_reads_kernel_tables_by_default_and_says_how_to_fetch_them(
        argv: list[str], folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert calibrate.main([*argv, "--out", str(tmp_path / "sets")]) == 2
    err = capsys.readouterr().err
    assert f"--data {DEFAULT_DIR / folder} is not a folder" in err and "python -m hardware.opdb_import" in err


def test_the_kernel_report_reads_kernel_tables_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert kernel_report.main([]) == 2
    err = capsys.readouterr().err
    assert f"--data {DEFAULT_DIR / 'opdb'} is not a folder" in err and "python -m hardware.opdb_import" in err
