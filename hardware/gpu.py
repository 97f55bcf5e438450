"""GPU specifications: datasheet numbers only, one YAML per GPU under data/gpus/."""

from __future__ import annotations

import functools
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import attrs

from hardware._data import DATA_DIR, is_count, is_integer, is_number, is_rate, located, read_yaml, unknown_name, where

GPU_DIR = DATA_DIR / "gpus"
# Fallback order when a GPU has no rate of its own for a format (e.g. FP4 on Hopper runs at FP8 rate). The
# single-precision rates: ``fp32``, the CUDA cores' (a float32 matmul under PyTorch's default "highest"
# precision), and ``tf32``, the tensor cores' (under "high"), which falls back to ``fp32`` and never to a
# narrower format's rate.
_FLOPS_FALLBACK = {"fp4": ("fp4", "fp8", "bf16"), "fp8": ("fp8", "bf16"), "bf16": ("bf16",),
                   "tf32": ("tf32", "fp32"), "fp32": ("fp32",)}
FP32_FORMATS = ("fp32", "tf32")
"""The formats a spec without an ``fp32`` rate cannot price (GPUSpec.flops_for says which field to add)."""


def _positive(inst: object, attr: "attrs.Attribute[Any]", value: float) -> None:
    # Finite too: an infinite bandwidth priced every memory-bound kernel at its floor without a word.
    if not is_rate(value):
        raise ValueError(f"GPUSpec.{attr.name} must be a finite number > 0, got {value!r}")


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
    launch_hbm_bytes: int = 0
    """The memory the engines' launch defaults are chosen for (their memory tiers: vLLM's token budget and
    batch cap, SGLang's chunk and CUDA-graph sizes); 0: ``hbm_bytes``. A capacity factor keeps the named
    GPU's here, so a what-if on memory moves the KV pool and not the launch settings."""

    @property
    def tier_bytes(self) -> int:
        """The memory the engines' launch defaults read (``launch_hbm_bytes``, else ``hbm_bytes``)."""
        return self.launch_hbm_bytes or self.hbm_bytes

    def __attrs_post_init__(self) -> None:
        if "bf16" not in self.peak_flops:
            raise ValueError(f"GPU {self.name!r}: peak_flops needs a 'bf16' entry")
        # A zero rate divided the roofline by zero, a NaN one made every step cost NaN.
        for dtype, rate in self.peak_flops.items():
            if not is_rate(rate):
                raise ValueError(f"GPU {self.name!r}: peak_flops.{dtype} must be a finite number > 0 (FLOP/s), "
                                 f"got {rate!r}")
        if not is_count(self.scaleup_domain_gpus, 1):
            raise ValueError(f"GPU {self.name!r}: scaleup_domain_gpus must be an integer >= 1, got "
                             f"{self.scaleup_domain_gpus!r}")

    @property
    def hbm_gib(self) -> float:
        return self.hbm_bytes / 2**30

    def has_tensor_cores_for(self, dtype: str) -> bool:
        """Whether the GPU has a tensor-core rate below BF16 for a compute format: its own or one it falls back
        to (FP4 on Hopper runs at the FP8 rate); False where only BF16 is left (FP8 or FP4 on Ampere)."""
        return dtype == "bf16" or any(d in self.peak_flops for d in _FLOPS_FALLBACK.get(dtype, ()) if d != "bf16")

    def flops_for(self, dtype: str) -> float:
        """Peak dense FLOP/s for a compute format, falling back to the next wider one the GPU has."""
        for d in _FLOPS_FALLBACK.get(dtype, ("bf16",)):
            if d in self.peak_flops:
                return float(self.peak_flops[d])
        if dtype in FP32_FORMATS:
            raise ValueError(f"GPU {self.name!r}: peak_flops has no fp32 entry (the CUDA cores' single-precision "
                             f"FLOP/s), which a float32 matmul ({dtype}) is priced at: add it to the GPU's spec")
        return float(self.peak_flops["bf16"])


def list_gpus() -> list[str]:
    """Names of the shipped GPU specs (the names the measured data uses, e.g. 'h100_sxm')."""
    return sorted(p.stem for p in GPU_DIR.glob("*.yaml"))


def is_gpu_file(name: str) -> bool:
    """Whether ``hardware.gpu`` names a GPU YAML file (a path) rather than a shipped spec."""
    return name.endswith((".yaml", ".yml")) or "/" in name or "\\" in name


def load_gpu(name: str) -> GPUSpec:
    """Load a GPU spec by shipped name, or from a user's YAML file by path (the same fields and checks as a
    shipped one); unknown names raise ValueError listing the valid ones."""
    if is_gpu_file(name):
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"GPU spec file {name!r} does not exist (a GPU is a shipped name, one of "
                             f"{', '.join(list_gpus())}, or the path of a GPU YAML file)")
        return gpu_from_yaml(path)
    return _load_shipped(name)


@functools.cache
def _load_shipped(name: str) -> GPUSpec:
    key = name.strip().lower().replace("-", "_")
    path = GPU_DIR / f"{key}.yaml"
    if not path.is_file():
        raise unknown_name("GPU", name, list_gpus())
    return gpu_from_yaml(path)


SPEC_VALUES = ("peak_flops", "hbm_bytes", "hbm_bw_Bps", "scaleup_bw_Bps", "scaleup_domain_gpus", "host_bw_Bps",
               "nic_bw_Bps")
"""The fields of a GPU spec a config may set to a value of its own (hardware.<field>)."""
SCALE_KNOBS: Mapping[str, str] = MappingProxyType({
    "flops": "peak_flops", "flops_bf16": "peak_flops.bf16", "flops_fp8": "peak_flops.fp8",
    "flops_fp4": "peak_flops.fp4", "flops_tf32": "peak_flops.tf32", "flops_fp32": "peak_flops.fp32",
    "hbm_bytes": "hbm_bytes", "hbm_bw": "hbm_bw_Bps",
    "scaleup_bw": "scaleup_bw_Bps", "host_bw": "host_bw_Bps", "nic_bw": "nic_bw_Bps",
})
"""Factors a config may put on a GPU's spec (hardware.scale.<knob>) and the field each multiplies: ``flops``
every compute format's peak, ``flops_<format>`` one format's (on top of ``flops``)."""


def derive_gpu(base: GPUSpec, values: Mapping[str, Any] | None = None,
               scale: Mapping[str, float] | None = None) -> GPUSpec:
    """``base`` with some fields replaced (``values``: field -> value, ``peak_flops`` merged by format) and
    then multiplied (``scale``: knob of :data:`SCALE_KNOBS` -> factor). The result keeps ``base``'s name and
    architecture, so the engine rules and constants that go with them stay; its rates pass the same checks
    as a shipped spec's. Errors name the field."""
    values, scale = dict(values or {}), dict(scale or {})
    for key in values:
        if key not in SPEC_VALUES:
            raise ValueError(f"{key} is not a GPU spec value; expected one of {', '.join(SPEC_VALUES)}")
    for key, factor in scale.items():
        if key not in SCALE_KNOBS:
            raise ValueError(f"scale.{key} is not a GPU spec factor; expected one of {', '.join(SCALE_KNOBS)}")
        if not is_rate(factor):
            raise ValueError(f"scale.{key} must be a finite number > 0, got {factor!r}")
    peak = dict(base.peak_flops)
    peak.update({str(k): v for k, v in (values.pop("peak_flops", None) or {}).items()})
    fields: dict[str, Any] = {**values, "peak_flops": peak}
    for knob, factor in scale.items():
        target = SCALE_KNOBS[knob]
        if knob == "flops":
            peak.update({d: r * factor for d, r in peak.items()})
        elif target.startswith("peak_flops."):
            dtype = target.partition(".")[2]
            if dtype not in peak:
                raise ValueError(f"scale.{knob} cannot apply: {base.name} has no {dtype} rate of its own (it runs {dtype} at the "
                                 f"rate of a wider format); give one as peak_flops.{dtype} to scale it")
            peak[dtype] *= factor
        elif target == "hbm_bytes":
            unscaled = fields.get(target, base.hbm_bytes)
            fields[target] = int(round(unscaled * factor))
            fields["launch_hbm_bytes"] = base.launch_hbm_bytes or unscaled
        else:
            fields[target] = fields.get(target, getattr(base, target)) * factor
    if fields.get("peak_flops") == dict(base.peak_flops) and len(fields) == 1:
        return base
    return attrs.evolve(base, **fields)


def spec_fields(gpu: GPUSpec) -> dict[str, Any]:
    """The datasheet fields of a spec, as a config or a results file writes them."""
    out: dict[str, Any] = {k: getattr(gpu, k) for k in SPEC_VALUES}
    out["peak_flops"] = dict(gpu.peak_flops)
    return out


_RATES = ("hbm_bw_Bps", "scaleup_bw_Bps", "host_bw_Bps", "nic_bw_Bps")
_TEXT_FIELDS = ("name", "display_name", "vendor", "arch", "sources")


def _rate(path: Path, key: str, value: Any) -> float:
    """A rate written as a YAML number or as text float() reads (PyYAML reads ``3.35e12``, without a dot
    in the exponent's sign, as text, and the shipped specs are written so)."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        return float(value)
    except ValueError:
        raise ValueError(f"{where(path, key)}: {key} must be a number, got {value!r}") from None


def gpu_from_yaml(path: Path) -> GPUSpec:
    """A GPU spec from one YAML mapping. A missing or unknown field, a value of the wrong type or an
    impossible one (zero, negative, NaN or infinite rates and sizes) is a ValueError naming the file, the
    line and the field (a KeyError, TypeError or AttributeError before, or a ZeroDivisionError or NaN step
    costs later)."""
    raw = read_yaml(path)
    fields = attrs.fields_dict(GPUSpec)
    for key in raw:
        if key not in fields:
            raise ValueError(f"{where(path, str(key))}: unknown field {key!r}; valid: {', '.join(fields)}")
    missing = [n for n, f in fields.items() if f.default is attrs.NOTHING and n not in raw]
    if missing:
        raise ValueError(f"{path}: missing field(s) {', '.join(missing)}")
    peak = raw["peak_flops"]
    if not isinstance(peak, dict):
        raise ValueError(f"{where(path, 'peak_flops')}: peak_flops must be a mapping of compute format to "
                         f"dense FLOP/s (bf16: 989.0e12), got {peak!r}")
    raw["peak_flops"] = {str(k): _rate(path, f"peak_flops.{k}", v) for k, v in peak.items()}
    for k in _RATES:
        raw[k] = _rate(path, k, raw[k])
    for k in ("hbm_bytes", "scaleup_domain_gpus", "num_sms", "l2_bytes", "launch_hbm_bytes"):
        if k in raw and not is_integer(raw[k]):
            raise ValueError(f"{where(path, k)}: {k} must be an integer, got {raw[k]!r}")
    if "tdp_W" in raw and not is_number(raw["tdp_W"]):
        raise ValueError(f"{where(path, 'tdp_W')}: tdp_W must be a number, got {raw['tdp_W']!r}")
    for k in _TEXT_FIELDS:
        if k in raw and not isinstance(raw[k], str):
            raise ValueError(f"{where(path, k)}: {k} must be text, got {raw[k]!r}")
    try:
        return GPUSpec(**raw)
    except ValueError as exc:
        raise located(path, exc, (*fields, *(f"peak_flops.{d}" for d in raw["peak_flops"]))) from None
