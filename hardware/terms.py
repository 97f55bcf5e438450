"""The step-cost ledger's vocabulary: every term a step's time is split into, with its family (throughput,
scheduler, runtime) and owner (gpu+model or engine, DESIGN section 6), the groups of terms the pricing treats
alike (token-dependent, host-side, device-side), and StepCost, one step's breakdown by term."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

import attrs

OWNER_GPU_MODEL = "gpu+model"
OWNER_ENGINE = "engine"

# term -> (family, owner); the order here is the order of StepCost.terms.
TERMS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "qkv_proj": ("throughput", OWNER_GPU_MODEL),
    "attention": ("throughput", OWNER_GPU_MODEL),
    "o_proj": ("throughput", OWNER_GPU_MODEL),
    "ssm_proj": ("throughput", OWNER_GPU_MODEL),
    "ssm_scan": ("throughput", OWNER_GPU_MODEL),
    "mlp": ("throughput", OWNER_GPU_MODEL),
    "moe_experts": ("throughput", OWNER_GPU_MODEL),
    "moe_shared": ("throughput", OWNER_GPU_MODEL),
    "elementwise": ("throughput", OWNER_GPU_MODEL),
    "lm_head": ("throughput", OWNER_GPU_MODEL),
    "sampler": ("throughput", OWNER_ENGINE),
    "spec_draft": ("throughput", OWNER_GPU_MODEL),
    "tp_allreduce": ("throughput", OWNER_GPU_MODEL),
    "ep_alltoall": ("throughput", OWNER_GPU_MODEL),
    "ep_imbalance": ("throughput", OWNER_GPU_MODEL),
    "pp_sendrecv": ("throughput", OWNER_GPU_MODEL),
    "step_host": ("scheduler", OWNER_ENGINE),
    "request_host": ("scheduler", OWNER_ENGINE),
    "cuda_graph_padding": ("scheduler", OWNER_ENGINE),
    "kernel_launch": ("runtime", OWNER_ENGINE),
    "eager_host": ("runtime", OWNER_ENGINE),
    "kv_traversal": ("runtime", OWNER_ENGINE),
    "collective_setup": ("runtime", OWNER_ENGINE),
    "dp_imbalance": ("runtime", OWNER_ENGINE),
})
# terms that depend only on (tokens, requests, decode requests) and are recomputed for CUDA-graph padding
TOKEN_TERMS = ("qkv_proj", "o_proj", "ssm_proj", "ssm_scan", "mlp", "moe_experts", "moe_shared", "elementwise",
               "lm_head", "tp_allreduce", "ep_alltoall", "ep_imbalance", "pp_sendrecv")
# the routed experts' terms, which see the distinct tokens a batch routes
ROUTED_TERMS = ("moe_experts", "ep_imbalance")
# the MoE block's GPU terms: routed and shared experts, the expert-parallel exchange and its busiest rank
MOE_BLOCK_TERMS = ("moe_experts", "moe_shared", "ep_alltoall", "ep_imbalance")
# CPU-side terms (hidden under GPU work when the engine overlaps scheduling with execution)
HOST_TERMS = ("step_host", "request_host", "kv_traversal")
DEVICE_TERMS = tuple(name for name in TERMS if name not in HOST_TERMS)


def check_terms(names: frozenset[str]) -> frozenset[str]:
    """``names``, where each is a term of TERMS; otherwise a ValueError listing the valid ones."""
    bad = sorted(n for n in names if n not in TERMS)
    if bad:
        raise ValueError(f"unknown cost term(s) {', '.join(map(repr, bad))}; valid: {', '.join(TERMS)}")
    return names


@attrs.frozen(kw_only=True)
class StepCost:
    """One step's time as named terms in seconds; total_s is their sum."""

    terms: Mapping[str, float]

    @property
    def total_s(self) -> float:
        return float(sum(self.terms.values()))

    def by_family(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, t in self.terms.items():
            out[TERMS[name][0]] = out.get(TERMS[name][0], 0.0) + t
        return out

    def by_owner(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, t in self.terms.items():
            out[TERMS[name][1]] = out.get(TERMS[name][1], 0.0) + t
        return out

