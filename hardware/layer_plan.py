"""The per-GPU plan of one deployment's layers, built once per CostModel: each folded layer kind (LayerGroup)
with its GEMMs on their roofline curves (Gemm), the all-reduces it issues, its elementwise traffic and its
kernel count, from which the step's token-dependent terms are priced. Layer folding: each distinct (mixer,
ffn) layer kind is planned once and counted as many times as the model has it."""

from __future__ import annotations

from typing import Callable

import attrs

from hardware import kernels
from hardware.calibration import Calibration, Roofline
from hardware.deployment import ACT_BYTES, Deployment, Linear
from hardware.layers import FfnSpec, MixerSpec

TERM_OF_LINEAR = {"o_proj": "o_proj", "o_a_proj": "o_proj", "in_proj": "ssm_proj", "out_proj": "ssm_proj",
                  "up_proj": "mlp", "down_proj": "mlp", "router": "moe_experts", "latent_in": "moe_experts",
                  "latent_out": "moe_experts", "shared_up": "moe_shared", "shared_down": "moe_shared"}
"""The ledger term each named linear layer is priced under (a mixer's others: qkv_proj)."""


@attrs.frozen
class Gemm:
    """One GEMM (m x k) @ (k x n) on one GPU with its roofline curve."""

    term: str
    n: int
    k: int
    w_bytes_per_elem: float
    roof: Roofline
    groof: Roofline          # the same curve with its floor under CUDA-graph replay
    peak_flops: float
    bw_Bps: float

    def time_s(self, m: int, graph: bool = False) -> float:
        return kernels.gemm_s(self.groof if graph else self.roof, m, self.n, self.k, self.w_bytes_per_elem,
                              self.peak_flops, self.bw_Bps)


@attrs.frozen
class LayerGroup:
    """One folded layer kind."""

    count: int
    mixer: MixerSpec | None
    ffn: FfnSpec | None
    gemms: tuple[Gemm, ...]
    allreduce_per_layer: int
    moe_allreduce: bool
    norm_allreduce: bool        # the q / k norm's statistics all-reduced over the TP group (qk_norm_across_heads)
    ew_bytes_per_token: float
    ew_kernels: int
    kernels: int

    @property
    def is_moe(self) -> bool:
        """Whether the layer kind's FFN is a mixture of experts."""
        return self.ffn is not None and self.ffn.kind == "moe"


def plan_gemm(dep: Deployment, lin: Linear, term: str, ecal: Calibration, gcal: Calibration) -> Gemm:
    """A linear layer as a GEMM on its weight format's curve, eager (``ecal``) and graph-replayed (``gcal``).
    A float32 one (``Linear.fp32``) has no curve of its own: the BF16 curve's efficiencies at the rate of the
    units Deployment.fp32_matmul runs it on (CUDA cores or TF32 tensor cores), over 4-byte weights."""
    wdt = dep.linear_curve_dtype(lin.quantized)
    return Gemm(term, lin.n, lin.k, dep.linear_weight_bytes(lin), ecal.gemm_for(wdt), gcal.gemm_for(wdt),
                dep.linear_peak_flops(lin), dep.gpu.hbm_bw_Bps)


@attrs.frozen
class _Block:
    """What one block of a layer (its mixer or its FFN) adds to the layer kind's plan."""

    gemms: tuple[Gemm, ...]
    allreduces: int = 0
    ew_bytes: int = 0            # elementwise bytes per token
    kernels: int = 0             # kernels besides the GEMMs, the elementwise passes and the all-reduces
    moe_allreduce: bool = False
    norm_allreduce: bool = False


def _mixer_block(dep: Deployment, mixer: MixerSpec, gemm: Callable[[Linear, str], Gemm]) -> _Block:
    gemms = tuple(gemm(lin, TERM_OF_LINEAR.get(lin.name, "qkv_proj")) for lin in dep.mixer_linears(mixer))
    allreduces = 1 if dep.tp > 1 else 0
    if not mixer.is_attention:
        return _Block(gemms, allreduces)
    qk_bytes = (dep.mixer_heads(mixer) + dep.mixer_kv_heads(mixer)) * mixer.head_dim * ACT_BYTES
    if mixer.qk_norm_across_heads and dep.tp > 1:
        # sum of squares per rank, all-reduce, then scale: a pass of its own
        return _Block(gemms, allreduces, 3 * qk_bytes, 4, norm_allreduce=True)
    return _Block(gemms, allreduces, 2 * qk_bytes, 2)


def _ffn_block(dep: Deployment, ffn: FfnSpec, gemm: Callable[[Linear, str], Gemm]) -> _Block:
    gemms = tuple(gemm(lin, TERM_OF_LINEAR[lin.name]) for lin in dep.ffn_linears(ffn))
    allreduce = 1 if dep.tp > 1 else 0
    if ffn.kind == "dense":
        inter = -(-ffn.intermediate_size // dep.tp)
        return _Block(gemms, allreduce, (3 if ffn.gated else 2) * inter * ACT_BYTES)
    kernels = 4     # top-k, permute / align, two grouped GEMMs
    if dep.attn_dp == 1:
        return _Block(gemms, allreduce, kernels=kernels)
    # attention DP: the experts' all-reduce spans the MoE TP group, priced on the group's tokens
    return _Block(gemms, kernels=kernels, moe_allreduce=dep.moe_tp > 1)


def plan_layer_group(dep: Deployment, cal: Calibration, gemm: Callable[[Linear, str], Gemm],
                     mixer: MixerSpec | None, ffn: FfnSpec | None, count: int) -> LayerGroup:
    """The plan of ``count`` layers of one (mixer, ffn) kind; ``gemm`` plans a linear layer under a term."""
    blocks: list[_Block] = []
    if mixer is not None:
        blocks.append(_mixer_block(dep, mixer, gemm))
    if ffn is not None:
        blocks.append(_ffn_block(dep, ffn, gemm))
    gemms = tuple(g for b in blocks for g in b.gemms)
    allreduces = sum(b.allreduces for b in blocks)
    norm_allreduce = any(b.norm_allreduce for b in blocks)
    ew = float(sum(b.ew_bytes for b in blocks))
    # per block, 4 hidden-width vectors plus the residual stream's extra reads (ModelSpec.residual_reads)
    ew += len(blocks) * (4 + dep.model.residual_reads) * dep.model.hidden_size * ACT_BYTES
    ew_kernels = len(blocks) * cal.elementwise_kernels_per_block
    n_kernels = sum(b.kernels for b in blocks) + len(gemms) + ew_kernels + allreduces
    return LayerGroup(count, mixer, ffn, gemms, allreduces, any(b.moe_allreduce for b in blocks), norm_allreduce,
                      ew, ew_kernels + norm_allreduce, n_kernels)
