"""The rows the calibration keeps and the kernel report's serving shapes, on hand-computed rows."""

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
