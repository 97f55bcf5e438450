"""GPU specifications: datasheet numbers only, one YAML per GPU under data/gpus/."""

from __future__ import annotations

import functools
from typing import Any, Mapping

import attrs

from hardware._data import DATA_DIR, read_yaml, unknown_name

GPU_DIR = DATA_DIR / "gpus"
# Fallback order when a GPU has no tensor-core rate for a format (e.g. FP4 on Hopper runs at FP8 rate).
_FLOPS_FALLBACK = {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "bf16": ("bf16",)}


def _positive(inst: object, attr: "attrs.Attribute[Any]", value: float) -> None:
    if not value > 0:
        raise ValueError(f"GPUSpec.{attr.name} must be > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class GPUSpec:
    """One accelerator: peak rates, memory and links, all from specifications (never fitted)."""

    name: str
    display_name: str = ""
    vendor: str = "nvidia"
    arch: str = ""
    peak_flops: Mapping[str, float]
    hbm_bytes: int = attrs.field(validator=_positive)
    hbm_bw_Bps: float = attrs.field(validator=_positive)
    scaleup_bw_Bps: float = attrs.field(validator=_positive)
    scaleup_domain_gpus: int = 8
    host_bw_Bps: float = attrs.field(validator=_positive)
    nic_bw_Bps: float = attrs.field(validator=_positive)
    num_sms: int = 0
    l2_bytes: int = 0
    tdp_W: float = 0.0
    sources: str = ""

    def __attrs_post_init__(self) -> None:
        if "bf16" not in self.peak_flops:
            raise ValueError(f"GPU {self.name!r}: peak_flops needs a 'bf16' entry")

    @property
    def hbm_gib(self) -> float:
        return self.hbm_bytes / 2**30

    def flops_for(self, dtype: str) -> float:
        """Peak dense FLOP/s for a compute format, falling back to the next wider one the GPU has."""
        for d in _FLOPS_FALLBACK.get(dtype, ("bf16",)):
            if d in self.peak_flops:
                return float(self.peak_flops[d])
        return float(self.peak_flops["bf16"])


def list_gpus() -> list[str]:
    """Names of the shipped GPU specs (the names the measured data uses, e.g. 'h100_sxm')."""
    return sorted(p.stem for p in GPU_DIR.glob("*.yaml"))


@functools.cache
def load_gpu(name: str) -> GPUSpec:
    """Load a GPU spec by name; unknown names raise ValueError listing the valid ones."""
    key = name.strip().lower().replace("-", "_")
    path = GPU_DIR / f"{key}.yaml"
    if not path.is_file():
        raise unknown_name("GPU", name, list_gpus())
    raw = read_yaml(path)
    raw["peak_flops"] = {str(k): float(v) for k, v in raw["peak_flops"].items()}
    for k in ("hbm_bw_Bps", "scaleup_bw_Bps", "host_bw_Bps", "nic_bw_Bps"):
        raw[k] = float(raw[k])
    return GPUSpec(**raw)
