"""The kernel report's row classes for decode attention, on hand-computed rows."""

from experiments.kernel_report import _faster_than_hbm, _serving_decode


def _row(batch: int, step: int, latency_ms: float, kv: str = "fp8") -> dict[str, str]:
    return {"batch_size": str(batch), "step": str(step), "num_key_value_heads": "8", "head_dim": "128",
            "kv_cache_dtype": kv, "latency": str(latency_ms)}


def test_a_row_faster_than_reading_its_kv_once_at_peak_bandwidth_is_flagged():
    # 64 requests x 4,096 tokens x 8 KV heads x (K + V) x 128 x 1 byte = 536,870,912 bytes; at the H100's
    # 3.35 TB/s one read takes 160.3 us.
    assert _faster_than_hbm("h100_sxm", _row(64, 4095, 0.114))
    assert not _faster_than_hbm("h100_sxm", _row(64, 4095, 0.161))
    # The same shape with a BF16 cache is twice the bytes: 320.5 us.
    assert _faster_than_hbm("h100_sxm", _row(64, 4095, 0.300, kv="bfloat16"))
    assert not _faster_than_hbm("h100_sxm", _row(64, 4095, 0.321, kv="bfloat16"))


def test_serving_shapes_are_at_most_128_requests_of_256_to_8k_tokens():
    assert _serving_decode(_row(128, 255, 1.0)) and _serving_decode(_row(1, 8191, 1.0))
    assert not _serving_decode(_row(256, 1023, 1.0))
    assert not _serving_decode(_row(8, 127, 1.0)) and not _serving_decode(_row(8, 8192, 1.0))
