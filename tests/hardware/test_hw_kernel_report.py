"""The rows the calibration keeps and the kernel report's serving shapes, on hand-computed rows."""

import pytest

from experiments.kernel_report import _serving_decode
from hardware.calibrate import possible


def _row(batch: int, step: int, latency_ms: float, kv: str = "fp8") -> dict[str, str]:
    return {"batch_size": str(batch), "step": str(step), "num_key_value_heads": "8", "head_dim": "128",
            "kv_cache_dtype": kv, "latency": str(latency_ms)}


def test_a_row_faster_than_reading_its_kv_once_at_peak_bandwidth_is_impossible():
    # 64 requests x 4,096 tokens x 8 KV heads x (K + V) x 128 x 1 byte = 536,870,912 bytes; at the H100's
    # 3.35 TB/s one read takes 160.3 us.
    assert not possible(_row(64, 4095, 0.114), "generation_attention_perf", "h100_sxm")
    assert possible(_row(64, 4095, 0.161), "generation_attention_perf", "h100_sxm")
    # The same shape with a BF16 cache is twice the bytes: 320.5 us.
    assert not possible(_row(64, 4095, 0.300, kv="bfloat16"), "generation_attention_perf", "h100_sxm")
    assert possible(_row(64, 4095, 0.321, kv="bfloat16"), "generation_attention_perf", "h100_sxm")


def test_serving_shapes_are_at_most_128_requests_of_256_to_8k_tokens():
    assert _serving_decode(_row(128, 255, 1.0)) and _serving_decode(_row(1, 8191, 1.0))
    assert not _serving_decode(_row(256, 1023, 1.0))
    assert not _serving_decode(_row(8, 127, 1.0)) and not _serving_decode(_row(8, 8192, 1.0))


def test_a_gemm_row_must_read_its_weights_once():
    # 4096 x 4096 FP8 weights: 16,777,216 bytes, 5.0 us at 3.35 TB/s.
    row = {"m": "8", "n": "4096", "k": "4096", "gemm_dtype": "fp8"}
    assert not possible({**row, "latency": "0.004"}, "gemm_perf", "h100_sxm")
    assert possible({**row, "latency": "0.0051"}, "gemm_perf", "h100_sxm")


def _gemm(m: int, latency_ms: float, device: str) -> dict[str, str]:
    return {"framework": "VLLM", "device": device, "gemm_dtype": "fp8", "m": str(m), "n": "4096", "k": "4096",
            "latency": str(latency_ms)}


def test_gpu_transfer_pairs_the_shapes_both_gpus_time_and_sets_ratio_against_ratio():
    from experiments.kernel_report import regime, shape_key, transfer_pairs

    ref = [_gemm(8, 0.010, "H100"), _gemm(512, 0.040, "H100"), _gemm(64, 0.020, "H100"),
           _gemm(8, 0.011, "H100")]                      # a repeated shape: only its first row is paired
    other = [_gemm(512, 0.036, "H200"), _gemm(8, 0.007, "H200")]   # m = 64 is not timed on this GPU
    assert shape_key(ref[0]) == shape_key(other[1]) != shape_key(ref[1])
    pairs = transfer_pairs(ref, other, lambda r: 2.0 * float(r["m"]), lambda r: 1.5 * float(r["m"]))
    assert [r["m"] for r, _, _ in pairs] == ["8", "512"]
    assert [(meas, pred) for _, meas, pred in pairs] == [pytest.approx((0.7, 0.75)),
                                                         pytest.approx((0.9, 0.75))]
    assert [regime("gemm", r) for r, _, _ in pairs] == ["m <= 256", "m > 256"]
    assert regime("moe", {"num_tokens": "257"}) == "tokens > 256" and regime("allreduce", ref[0]) == ""


def _attn(batch: int, step: int, latency_ms: float, window: int = 0) -> dict[str, str]:
    return {"framework": "TRTLLM", "version": "x", "op_name": "generation_attention", "batch_size": str(batch),
            "isl": "1", "num_heads": "32", "num_key_value_heads": "8", "head_dim": "128",
            "window_size": str(window), "kv_cache_dtype": "fp8", "step": str(step), "latency": str(latency_ms)}


def _write(path, rows: list[dict[str, str]]) -> None:
    import csv
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=sorted({k for r in rows for k in r}))
        w.writeheader()
        w.writerows(rows)


def test_check_prices_a_foreign_table_with_the_shipped_constants(tmp_path):
    from experiments.kernel_report import check_table, predict_generation
    from hardware import load_calibration

    rows = [_attn(8, 1023, 0.030), _attn(64, 4095, 0.250), _attn(256, 1023, 0.400),
            _attn(8, 1023, 0.030, window=128)]          # windowed attention: not priced, as in the report
    _write(tmp_path / "t.csv", rows)
    out = {r["table"]: r for r in check_table(tmp_path / "t.csv", "trtllm", "h200_sxm")}
    assert out["generation_attention"]["rows"] == 3
    assert out["generation_attention @h200_sxm"]["rows"] == 3
    assert out["generation_attention[kv fp8, serving]"]["rows"] == 2       # 256 requests is not a serving shape
    cal = load_calibration("trtllm")
    errs = sorted(predict_generation(cal, "h200_sxm", r) / (float(r["latency"]) * 1e-3) - 1.0 for r in rows[:3])
    assert out["generation_attention"]["median_signed_err_pct"] == round(100 * errs[1], 1)


def test_check_names_the_file_and_line_of_a_row_it_cannot_price(tmp_path):
    from experiments.kernel_report import check_table, main

    _write(tmp_path / "t.csv", [_attn(8, 1023, 0.030), {**_attn(8, 1023, 0.030), "op_name": "rmsnorm"}])
    with pytest.raises(ValueError, match=r"t\.csv line 3: op_name 'rmsnorm' is not one the report prices "
                                         r"\(expected one of \['all_reduce', 'context_attention', 'gemm', "
                                         r"'generation_attention', 'mla_context', 'mla_generation', 'moe'\]\)"):
        check_table(tmp_path / "t.csv", "trtllm", "h200_sxm")
    _write(tmp_path / "u.csv", [{"batch_size": "8", "latency": "0.03"}])
    with pytest.raises(ValueError, match=r"u\.csv: missing column\(s\) \['op_name'\]"):
        check_table(tmp_path / "u.csv", "trtllm", "h200_sxm")
    (tmp_path / "v.json").write_text("{}")
    with pytest.raises(ValueError, match=r"v\.json: expected a \.csv, \.csv\.gz or \.parquet kernel table"):
        check_table(tmp_path / "v.json", "trtllm", "h200_sxm")
    bad = _attn(8, 1023, 0.030)
    del bad["head_dim"]
    _write(tmp_path / "w.csv", [bad])
    with pytest.raises(ValueError, match=r"w\.csv line 2: no column 'head_dim' \(generation_attention rows"):
        check_table(tmp_path / "w.csv", "trtllm", "h200_sxm")
    _write(tmp_path / "x.csv", [{**_attn(8, 1023, 0.030), "latency": "fast"}])
    with pytest.raises(ValueError, match=r"x\.csv line 2: could not convert string to float: 'fast'"):
        check_table(tmp_path / "x.csv", "trtllm", "h200_sxm")
    assert main(["--check", str(tmp_path / "t.csv"), "--engines", "trtllm"]) == 2      # no --gpu
    _write(tmp_path / "y.csv", [_attn(8, 1023, 0.030)])
    assert main(["--check", str(tmp_path / "y.csv"), "--engines", "trtllm", "--gpu", "h200_sxm",
                 "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "kernel_check.csv").read_text().startswith("engine,table,rows,")


def test_check_of_a_folder_prices_each_table_against_the_engine_and_gpu_its_name_gives(tmp_path):
    from experiments.kernel_report import check_folder, check_table, table_name_parts

    assert table_name_parts("h200_sxm__moe_perf__sglang-0.5.6.post2.parquet") == (
        "h200_sxm", "moe_perf", "sglang", "0.5.6.post2")
    assert table_name_parts("h200_sxm__moe_perf.csv") is None and table_name_parts("a__b__c-1.json") is None
    _write(tmp_path / "h200_sxm__generation_attention_perf__trtllm-9.9.csv", [_attn(8, 1023, 0.030)])
    _write(tmp_path / "h100_sxm__generation_attention_perf__trtllm-9.9.csv", [_attn(8, 1023, 0.030, window=64)])
    _write(tmp_path / "h200_sxm__generation_attention_perf__mlc-1.0.csv", [_attn(8, 1023, 0.030)])
    _write(tmp_path / "notes.csv", [_attn(8, 1023, 0.030)])
    rows, notes = check_folder(tmp_path, ["vllm", "sglang", "trtllm"])
    assert {(r["file"], r["version"], r["gpu"], r["table"]) for r in rows} >= {
        ("h200_sxm__generation_attention_perf__trtllm-9.9.csv", "9.9", "h200_sxm", "generation_attention")}
    one = check_table(tmp_path / "h200_sxm__generation_attention_perf__trtllm-9.9.csv", "trtllm", "h200_sxm")
    assert [{k: v for k, v in r.items() if k not in ("file", "version", "gpu")} for r in rows] == one
    assert [n.split(":")[0] for n in notes] == ["h100_sxm__generation_attention_perf__trtllm-9.9.csv",
                                                "h200_sxm__generation_attention_perf__mlc-1.0.csv", "notes.csv"]
    assert "no row the report prices" in notes[0] and "no constants for engine 'mlc'" in notes[1]
    assert check_folder(tmp_path, ["vllm"]) == ([], notes[1:])     # trtllm's tables not asked for
    from experiments.kernel_report import main
    assert main(["--check", str(tmp_path), "--gpu", "h200_sxm"]) == 2  # a folder's names give the GPUs
