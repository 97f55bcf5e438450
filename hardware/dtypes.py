"""Bytes per element of the number formats the model knows about."""

from __future__ import annotations

from typing import Mapping

# fp4 is NVFP4 / MXFP4: 4-bit values plus one 8-bit scale per 16 (NVFP4) or 32 (MXFP4) elements;
# we charge the NVFP4 figure, 4.5 bits per element.
DTYPE_BYTES: Mapping[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0,      # FP8 with one FP32 scale per 128 x 128 block (DeepSeek-style): scales negligible
    "int8": 1.0,
    "fp4": 0.5625,
    "int4": 0.5625,
}

WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "fp8_block", "fp4", "int4")
KV_DTYPES = ("bf16", "fp16", "fp8")

# Which tensor-core rate a weight format computes at (W4A16 int4 computes at bf16 rate).
COMPUTE_DTYPE: Mapping[str, str] = {
    "bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "fp4": "fp4", "int4": "bf16",
}


def quantised_kv(kv_bytes: float) -> bool:
    """A KV cache stored below BF16 width (FP8): its decode kernels dequantise K and V in their inner loop
    (hardware.kernels.decode_attention_work, Calibration.gqa_decode)."""
    return kv_bytes < DTYPE_BYTES["bf16"]


def check_dtype(kind: str, dtype: str, valid: tuple[str, ...]) -> None:
    """Raise a ValueError naming the bad dtype and the valid ones."""
    if dtype not in valid:
        raise ValueError(f"unknown {kind} {dtype!r}; valid: {', '.join(valid)}")
