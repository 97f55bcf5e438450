"""A model placed on GPUs by one engine: per-GPU linear shapes, weights, KV, state and capacity arithmetic.

Parallelism: `tp` GPUs share each attention layer (heads split), `attn_dp` data-parallel attention groups
(SGLang / TRT-LLM DP attention), so tp x attn_dp GPUs per pipeline stage; MoE experts are split over `ep`
GPUs and each expert's width over `moe_tp` (default tp x attn_dp / ep). `pp` pipeline stages.
"""

from __future__ import annotations

import math

import attrs

from hardware.calibration import MOE_KERNELS
from hardware.dtypes import COMPUTE_DTYPE, DTYPE_BYTES, KV_DTYPES, WEIGHT_DTYPES, check_dtype
from hardware.engine import EngineProfile
from hardware.gpu import GPUSpec
from hardware.kernels import SERVING_ROUTINGS
from hardware.layers import FfnSpec, MixerSpec
from hardware.model import ModelSpec

ACT_BYTES = 2          # activations are BF16
LOGIT_BYTES = 4        # the sampler works on FP32 logits
SAMPLINGS = ("greedy", "top_k_top_p")
"""What the requests ask the sampler for (Deployment.sampling)."""
FP32_MATMUL = ("highest", "high")
"""PyTorch float32 matmul precisions (Deployment.fp32_matmul)."""
CONV_STATE_BYTES = 2   # Mamba / GDN convolution state is kept in the activation dtype


class DeploymentError(ValueError):
    """A deployment that cannot be built, and the :class:`Deployment` field whose value is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _pos(inst: object, attr: "attrs.Attribute[int]", value: int) -> None:
    if value < 1:
        raise DeploymentError(attr.name, f"Deployment.{attr.name} must be >= 1, got {value}")


WEIGHT_ONLY_CURVE = "int4"
"""The curve key of an engine's weight-only kernels (W4A16 tables, computing in BF16: dtypes.COMPUTE_DTYPE)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@attrs.frozen
class Linear:
    """One weight matrix per GPU: y (m x n) = x (m x k) @ W (k x n); `quantized` uses the weight dtype,
    `fp32` float32 weights and input (a float32 matmul: Deployment.fp32_matmul says which units run it)."""

    name: str
    n: int
    k: int
    quantized: bool = True
    fp32: bool = False


@attrs.frozen(kw_only=True)
class Deployment:
    """GPU + model + engine + parallelism + dtypes; every size here is per GPU."""

    gpu: GPUSpec
    model: ModelSpec
    engine: EngineProfile
    tp: int = attrs.field(default=1, validator=_pos)
    pp: int = attrs.field(default=1, validator=_pos)
    ep: int = attrs.field(default=1, validator=_pos)
    attn_dp: int = attrs.field(default=1, validator=_pos)
    moe_tp: int = attrs.field(
        default=attrs.Factory(lambda self: max(1, self.tp * self.attn_dp // self.ep), takes_self=True),
        validator=_pos)
    weight_dtype: str = attrs.field(
        default=attrs.Factory(lambda self: self.model.default_weight_dtype, takes_self=True))
    kv_dtype: str = attrs.field(
        default=attrs.Factory(lambda self: self.model.default_kv_dtype, takes_self=True))
    dense_weight_dtype: str = attrs.field(
        default=attrs.Factory(lambda self: self.model.dense_weight_dtype or self.weight_dtype, takes_self=True))
    """The format of the quantised linear layers other than the routed experts (attention, shared experts,
    dense MLPs): the weight format, unless the checkpoint keeps them in another (ModelSpec.dense_weight_dtype:
    DeepSeek-V4's block-FP8 projections beside its MXFP4 experts)."""
    moe_kernel: str = "default"
    """Routed-expert kernel family: ``default`` (the engine's own kernel for the weight format),
    ``marlin`` (weight-only Marlin, e.g. vLLM with VLLM_MXFP4_USE_MARLIN=1), ``flashinfer`` (FlashInfer's
    CUTLASS fused MoE, vLLM's FlashInferExperts) (each priced with that family's fitted curve,
    Calibration.moe_for) or ``deepgemm`` (block-FP8 only: DeepGEMM's contiguous-layout grouped
    GEMM as vLLM's DeepGemmExperts launches it, over the worst-case padded row count whatever the batch;
    priced with the engine's block-FP8 GEMM curve, hardware.kernels.deepgemm_moe_s)."""

    moe_routing: str = "power_law"
    """How the router spreads a step's tokens over the experts (hardware.kernels.SERVING_ROUTINGS):
    ``power_law`` (default), the skewed per-expert loads aiconfigurator prices MoE layers with by default
    (kernels.power_law_load: fewer distinct experts than independent draws, a busier busiest rank), or
    ``uniform``, independent top-k draws (E (1 - (1 - k/E)^T) experts)."""

    redundant_experts: int = 0
    """Redundant expert slots added to every MoE layer's E routed experts (expert-parallel load balancing,
    EPLB): SGLang ``--ep-num-redundant-experts R`` (E + R physical experts, (E + R) / ep on each EP rank:
    sglang/srt/eplb/expert_location.py), TensorRT-LLM ``moe_config.load_balancer.num_slots`` = E + R (the
    srt-slurm recipes' ``eplbN``). It lets an EP size that does not divide E run (DeepSeek-R1's 256 experts at
    ep 48: 288 slots, 6 a GPU). Each slot holds a whole expert's weights, so a GPU keeps (E + R) / ep
    experts' weights (the extra ones come out of the KV pool). Priced as if the routed (token, expert) pairs
    spread over E + R slots (:meth:`expert_slots`, hardware.cost._moe_s): the balancer's replicas split their
    experts' load, so the mean rank's pairs stay T k / ep, it may stream up to (E + R) / ep experts' weights,
    and under ``power_law`` routing the busiest rank's share shrinks (its hottest loads spread over more
    slots).
    Not modelled: which experts the balancer replicates and where it puts them (SGLang's DeepSeek EPLB
    algorithm replicates the most loaded experts from recorded statistics and packs the slots onto GPUs by
    load, TensorRT-LLM's balancer updates them online; SGLang without ``--init-expert-location`` /
    ``--enable-eplb`` keeps its trivial layout, slot i holding expert i mod E, so the R extra slots copy
    experts 0..R-1 whatever their load), the per-rank dispatch choice among replicas, and the weight moves
    of an online rebalance. 0 (default): no extra slots, the layout and prices of plain EP."""

    spec_tokens: int = 0
    """Draft tokens per decode step of MTP speculative decoding (0: off). The draft is the model's own
    next-token-prediction module (ModelSpec.mtp_layers), run spec_tokens times in a chain (TensorRT-LLM's
    MTP Eagle path, SGLang's NEXTN with one layer), so its weights and its KV cache are resident."""

    sampling: str = "greedy"
    """What every request asks the sampler for (SAMPLINGS): ``greedy`` (temperature 0: an argmax) or
    ``top_k_top_p`` (random sampling with a top-k and / or top-p filter, e.g. a model's generation_config
    defaults, which vLLM applies to requests that set none), priced by the engine's sampler_s_per_vocab."""

    fp32_matmul: str = "highest"
    """PyTorch's float32 matmul precision in the engine's process (FP32_MATMUL), which sets the units a
    float32 GEMM (a :class:`Linear` with ``fp32``: MiniMax-M2's router) runs on: ``highest`` (PyTorch's
    default), the CUDA cores at the GPU's ``peak_flops.fp32``; ``high``, TF32 tensor cores at
    ``peak_flops.tf32``. vLLM sets it from VLLM_FLOAT32_MATMUL_PRECISION (torch.set_float32_matmul_precision
    in its GPU worker; default "highest")."""

    def __attrs_post_init__(self) -> None:
        if self.spec_tokens < 0:
            raise DeploymentError("spec_tokens", f"spec_tokens must be >= 0, got {self.spec_tokens}")
        if self.spec_tokens and not self.model.mtp_layers:
            raise DeploymentError("spec_tokens", f"MTP speculative decoding needs a next-token-prediction module, "
                                  f"and {self.model.name} has none "
                                  f"(no num_nextn_predict_layers / mtp_num_hidden_layers)")
        for field, dtype, valid in (("weight_dtype", self.weight_dtype, WEIGHT_DTYPES),
                                    ("dense_weight_dtype", self.dense_weight_dtype, WEIGHT_DTYPES),
                                    ("kv_dtype", self.kv_dtype, KV_DTYPES)):
            try:
                check_dtype(field, dtype, valid)
            except ValueError as exc:
                raise DeploymentError(field, str(exc)) from None
        if self.moe_kernel not in MOE_KERNELS:
            raise DeploymentError("moe_kernel", f"moe_kernel must be one of {', '.join(MOE_KERNELS)}, "
                                  f"got {self.moe_kernel!r}")
        if self.moe_routing not in SERVING_ROUTINGS:
            raise DeploymentError("moe_routing", f"moe_routing must be one of {', '.join(SERVING_ROUTINGS)}, "
                                  f"got {self.moe_routing!r}")
        if self.sampling not in SAMPLINGS:
            raise DeploymentError("sampling", f"sampling must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}")
        if self.fp32_matmul not in FP32_MATMUL:
            raise DeploymentError("fp32_matmul", f"fp32_matmul must be one of {', '.join(FP32_MATMUL)}, "
                                  f"got {self.fp32_matmul!r}")
        if "fp32" not in self.gpu.peak_flops and any(f is not None and f.router_fp32
                                                     for (_, f), _ in self.model.layer_groups):
            raise DeploymentError("gpu", f"{self.model.name}'s router runs a float32 GEMM, and {self.gpu.name}'s spec "
                                         f"gives no peak_flops.fp32 (the CUDA cores' FLOP/s) to price it: add it")
        if self.moe_kernel == "deepgemm" and self.weight_dtype != "fp8_block":
            raise DeploymentError("moe_kernel", f"moe_kernel deepgemm runs block-FP8 weights only, got weight_dtype "
                                  f"{self.weight_dtype!r}")
        for field, dtype, weight_only in (("weight_dtype", self.weight_dtype, self.weight_only),
                                          ("dense_weight_dtype", self.dense_weight_dtype, self.dense_weight_only)):
            if weight_only and not self.engine.weight_only_kernels:
                raise DeploymentError(field, f"engine {self.engine.name!r} runs {dtype} weights on FP8 / FP4 tensor "
                                             f"cores (Ada, Hopper or newer), which {self.gpu.name} does not have: use "
                                             f"bf16 weights, or an engine with weight-only kernels (vllm, sglang)")
        if self.weight_only and self.moe_kernel == "deepgemm":
            raise DeploymentError("moe_kernel", f"moe_kernel deepgemm needs FP8 tensor cores, which "
                                  f"{self.gpu.name} does not have")
        m = self.model
        archs = self.engine.csa_archs
        if archs and self.gpu.arch not in archs and any(mx is not None and mx.kind == "csa" for mx, _ in m.layers):
            raise DeploymentError("gpu", f"engine {self.engine.name!r} runs {m.name}'s compressed attention on "
                                         f"{', '.join(archs)} GPUs only, and {self.gpu.name} is {self.gpu.arch or 'unknown'}")
        if m.num_heads % self.tp:
            raise DeploymentError("tp", f"tp={self.tp} does not divide {m.name}'s {m.num_heads} attention heads")
        if m.num_kv_heads % self.tp and self.tp % m.num_kv_heads:
            raise DeploymentError("tp", f"tp={self.tp} and {m.name}'s {m.num_kv_heads} KV heads: one must divide "
                                  f"the other")
        if self.pp > m.num_layers:
            raise DeploymentError("pp", f"pp={self.pp} exceeds {m.name}'s {m.num_layers} layers")
        if not m.is_moe and self.ep != 1:  # (it was ignored: the run had no expert parallelism to speak of)
            raise DeploymentError("ep", f"ep={self.ep} splits MoE experts over GPUs, and {m.name} is a dense model "
                                  f"(no experts): ep must be 1")
        routed = sorted({f.num_experts for _, f in m.layers if f is not None and f.kind == "moe"})
        self._check_expert_slots(routed)
        if m.is_moe and self.moe_tp * self.ep != self.tp * self.attn_dp:
            raise DeploymentError("ep", f"moe_tp x ep = {self.moe_tp} x {self.ep} must equal tp x attn_dp = "
                                  f"{self.tp} x {self.attn_dp} GPUs")

    def _check_expert_slots(self, routed: list[int]) -> None:
        """Every MoE layer's E + redundant_experts slots must split evenly over the ep GPUs."""
        r, m = self.redundant_experts, self.model
        if r < 0:
            raise DeploymentError("redundant_experts", f"redundant_experts must be >= 0, got {r}")
        if r and not m.is_moe:
            raise DeploymentError("redundant_experts", f"redundant_experts={r} adds expert slots, and "
                                  f"{m.name} is a dense model (no experts): it must be 0")
        if r and self.ep == 1:
            raise DeploymentError("redundant_experts", f"redundant_experts={r} replicates experts over "
                                  f"expert-parallel GPUs: it needs ep > 1 (ep=1 holds every expert)")
        if not any((n + r) % self.ep for n in routed):
            return
        fits = {(-n) % self.ep for n in routed}   # the R (mod ep) that makes E + R divide, per layer kind
        hint = (f"; redundant_experts={fits.pop()} would make it divide" if len(fits) == 1
                else "; no count of redundant experts makes every layer's divide")
        experts = ' / '.join(map(str, routed))
        if not r:  # (the error of plain EP, with the way out)
            raise DeploymentError("ep", f"ep={self.ep} does not divide {m.name}'s {experts} routed experts "
                                  f"(each GPU holds an equal share){hint}")
        slots = ' / '.join(str(n + r) for n in routed)
        raise DeploymentError("redundant_experts", f"ep={self.ep} does not divide {m.name}'s {experts} "
                              f"routed experts + redundant_experts={r} = {slots} expert slots (each GPU "
                              f"holds an equal share){hint}")

    # --- sharding -------------------------------------------------------------------------------
    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tp * self.attn_dp * self.pp

    @property
    def heads_per_gpu(self) -> int:
        return self.model.num_heads // self.tp

    @property
    def kv_heads_per_gpu(self) -> int:
        """KV heads sharded over TP; replicated (one per GPU) when num_kv_heads < tp."""
        return max(1, self.model.num_kv_heads // self.tp)

    def mixer_heads(self, m: MixerSpec) -> int:
        return _cdiv(m.num_heads, self.tp)

    def mixer_kv_heads(self, m: MixerSpec) -> int:
        return max(1, _cdiv(m.num_kv_heads or m.num_heads, self.tp))

    def mixer_groups(self, m: MixerSpec) -> int:
        return max(1, _cdiv(m.groups, self.tp))

    @property
    def layers_per_gpu(self) -> int:
        """Layers held by one pipeline stage (the largest stage when pp does not divide evenly)."""
        return math.ceil(self.model.num_layers / self.pp)

    @property
    def weight_only(self) -> bool:
        """Quantised weights the GPU has no tensor cores for (FP8 or FP4 on Ampere: GPUSpec.has_tensor_cores_for).
        vLLM and SGLang run them weight-only, dequantised into BF16 MMAs by Marlin kernels (vLLM
        marlin_utils_fp8: "For GPUs that lack FP8 hardware support, we can leverage the Marlin kernel for fast
        weight-only FP8 quantization"), priced as :attr:`curve_dtype` says. The FP8 and FP4 curves were fitted
        on Hopper kernels at Hopper's FP8 rate; read at an Ampere BF16 peak they priced kernels that do not run
        there (Mixtral-8x7B FP8, TP4, on A100 under vLLM: 112 ms a decode step at c8, against 11 ms in BF16 at
        TP8)."""
        return self._runs_weight_only(self.weight_dtype)

    def _runs_weight_only(self, dtype: str) -> bool:
        """Whether the GPU lacks tensor cores for weights in ``dtype`` (:attr:`weight_only`)."""
        return not self.gpu.has_tensor_cores_for(COMPUTE_DTYPE[dtype])

    @property
    def curve_dtype(self) -> str:
        """The format whose curves price the quantised GEMMs and routed experts: the weight format, or, for
        weights run weight-only (:attr:`weight_only`), ``int4``: the engine's weight-only kernels (its MoE
        curve fitted on the W4A16 expert tables; no table times a weight-only dense GEMM, so the GEMMs fall
        back to the BF16 curve), computing at the BF16 peak. The bytes streamed stay the weight format's."""
        return WEIGHT_ONLY_CURVE if self.weight_only else self.weight_dtype

    @property
    def weight_bytes_per_elem(self) -> float:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_bytes_per_elem(self) -> float:
        return DTYPE_BYTES[self.kv_dtype]

    def linear_bytes_per_elem(self, quantized: bool) -> float:
        return DTYPE_BYTES[self.dense_weight_dtype] if quantized else ACT_BYTES

    def linear_weight_bytes(self, lin: Linear) -> float:
        """Bytes per weight of a linear layer: float32 ones (``fp32``) 4, else :meth:`linear_bytes_per_elem`."""
        return 4.0 if lin.fp32 else self.linear_bytes_per_elem(lin.quantized)

    def linear_peak_flops(self, lin: Linear) -> float:
        """The peak a linear layer's GEMM runs at: a float32 one on the units :attr:`fp32_matmul` names (CUDA
        cores, or TF32 tensor cores under ``high``), else its curve format's tensor-core rate."""
        if lin.fp32:
            return self.gpu.flops_for("tf32" if self.fp32_matmul == "high" else "fp32")
        return self.gpu.flops_for(COMPUTE_DTYPE[self.linear_curve_dtype(lin.quantized)])

    @property
    def dense_weight_only(self) -> bool:
        """:attr:`weight_only` for :attr:`dense_weight_dtype`."""
        return self._runs_weight_only(self.dense_weight_dtype)

    def linear_curve_dtype(self, quantized: bool) -> str:
        """The format whose GEMM curve and peak price a linear layer: :attr:`dense_weight_dtype` if it is
        quantised (the weight-only curve where the GPU has no tensor cores for it, as :attr:`curve_dtype`)."""
        if not quantized:
            return "bf16"
        return WEIGHT_ONLY_CURVE if self.dense_weight_only else self.dense_weight_dtype

    @property
    def _dense_quantized(self) -> bool:
        """Linear layers of no class of their own (a latent MoE's projections, DeepSeek-V4's attention) are
        quantised unless the checkpoint quantises its routed experts alone."""
        return self.model.quant_scope == "all"

    # --- linear layers ------------------------------------------------------------------------
    def mixer_linears(self, m: MixerSpec) -> list[Linear]:
        """Projection GEMMs of one mixer on one GPU (QKV-like first, output projection last)."""
        h, heads = self.model.hidden_size, self.mixer_heads(m)
        q, qo = self.model.quantised("attention_in"), self.model.quantised("attention_out")
        if m.kind == "gqa":
            out = heads * m.head_dim * (2 if m.output_gate else 1) + self.mixer_kv_heads(m) * (
                m.head_dim + m.vdim)
            return [Linear("qkv_proj", out, h, q), Linear("o_proj", h, heads * m.vdim, qo)]
        if m.kind == "mla":
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            lins = []
            if m.q_lora_rank:
                lins += [Linear("q_a_proj", m.q_lora_rank, h, q), Linear("q_b_proj", heads * qk, m.q_lora_rank, q)]
            else:
                lins += [Linear("q_proj", heads * qk, h, q)]
            lins += [Linear("kv_a_proj", m.kv_lora_rank + m.qk_rope_head_dim, h, q)]
            if m.index_n_heads:
                lins += [Linear("indexer_q", m.index_n_heads * m.index_head_dim, m.q_lora_rank or h,
                                self.model.quantised("indexer")),
                         Linear("indexer_k", m.index_head_dim + m.index_n_heads, h, False)]
            if m.output_gate:
                lins += [Linear("g_proj", heads * m.vdim, h, q)]
            return lins + [Linear("o_proj", h, heads * m.vdim, qo)]
        if m.kind == "csa":
            return self._csa_linears(m, heads)
        q = self.model.quantised("linear_attention")
        if m.kind == "mamba2":
            d_inner, groups = heads * m.head_dim, self.mixer_groups(m)
            return [Linear("in_proj", 2 * d_inner + 2 * groups * m.state_size + heads, h, q),
                    Linear("out_proj", h, d_inner, q)]
        groups = self.mixer_groups(m)   # gdn
        qkv, z = 2 * groups * m.state_size + heads * m.head_dim, heads * m.head_dim
        if m.gate_rank:
            # Kimi Delta Attention as SGLang's kimi_k3.py runs it: q, k, v and the full-rank output gate in one
            # GEMM (sharded by heads), f_a (whole on every rank) with beta in a second small one, f_b (by
            # heads) the third; vLLM folds f_a and beta into the wide GEMM, the same work in one launch fewer.
            # The gate projections stay BF16 (K3 quantises only its routed experts).
            lins = [Linear("in_proj", qkv + (0 if m.out_gate_rank else z), h, q),
                    Linear("in_proj", m.gate_rank + heads, h, False),
                    Linear("in_proj", z, m.gate_rank, False)]
            if m.out_gate_rank:   # a low-rank output gate (Kimi-Linear-48B): g_a whole, g_b by heads
                lins += [Linear("in_proj", m.out_gate_rank, h, False), Linear("in_proj", z, m.out_gate_rank, False)]
            return [*lins, Linear("out_proj", h, z, q)]
        if m.split_in_proj:
            # q / k / v, output gate z, beta b, decay a: one GEMM each. b and a stay BF16 under block FP8:
            # SGLang 0.5.9 refuses a column-parallel block-FP8 shard narrower than the block (layers/
            # quantization/fp8.py:286-295), and they are heads / tp wide (8 of 128 for Qwen3.5-397B at TP 8).
            ins = [Linear("in_proj", qkv, h, q), Linear("in_proj", z, h, q),
                   Linear("in_proj", heads, h, False), Linear("in_proj", heads, h, False)]
        else:
            ins = [Linear("in_proj", qkv + z + 2 * heads, h, q)]
        return [*ins, Linear("out_proj", h, heads * m.head_dim, q)]

    def _csa_linears(self, m: MixerSpec, heads: int) -> list[Linear]:
        """DeepSeek-V4 attention on one GPU, as vLLM's deepseek_v4.py shards it: wq_a and wkv fused into one
        GEMM whole on every rank (hidden -> q_lora_rank + head_dim), wq_b by heads, the grouped wo_a by
        groups (each group's (heads / o_groups) x head_dim -> o_lora_rank: a batched GEMM whose work and
        weights are those of one GEMM of o_groups x o_lora_rank columns over a group's width), wo_b by rows.
        The compressor (its KV and gate projections, MixerSpec.compress_overlap x head_dim each) and the indexer (its query from the q latent, its head weights, its own
        compressor at index_head_dim) are BF16 and whole on every rank, except the indexer's query (FP8)."""
        h, q = self.model.hidden_size, self._dense_quantized
        groups = _cdiv(m.o_groups, self.tp)
        lins = [Linear("q_a_proj", m.q_lora_rank + m.head_dim, h, q),
                Linear("q_b_proj", heads * m.head_dim, m.q_lora_rank, q)]
        if m.compress_ratio:
            lins.append(Linear("compressor", 2 * m.compress_overlap * m.head_dim, h, False))
        if m.index_topk:
            lins += [Linear("indexer_q", m.index_n_heads * m.index_head_dim, m.q_lora_rank, q),
                     Linear("indexer_k", m.index_n_heads + 2 * m.compress_overlap * m.index_head_dim, h, False)]
        return lins + [Linear("o_a_proj", groups * m.o_lora_rank, m.num_heads // m.o_groups * m.head_dim, q),
                       Linear("o_proj", h, groups * m.o_lora_rank, q)]

    def mla_kv_b_elems(self, m: MixerSpec) -> int:
        """kv_b_proj (latent -> per-head K_nope and V) on one GPU; used inside MLA attention."""
        return m.kv_lora_rank * self.mixer_heads(m) * (m.qk_nope_head_dim + m.vdim)

    def ffn_linears(self, f: FfnSpec) -> list[Linear]:
        """Dense FFN GEMMs, or a MoE layer's router and shared-expert GEMMs, on one GPU."""
        h, q = self.model.hidden_size, self._dense_quantized
        if f.kind == "dense":
            inter = _cdiv(f.intermediate_size, self.tp)
            up = 2 * inter if f.gated else inter
            qd = self.model.quantised("dense_mlp")
            return [Linear("up_proj", up, h, qd), Linear("down_proj", h, inter, qd)]
        lins = [Linear("router", f.num_experts, h, False, fp32=f.router_fp32)]
        if f.latent_size:
            lat = _cdiv(f.latent_size, 1)
            lins += [Linear("latent_in", lat, h, q), Linear("latent_out", h, lat, q)]
        if f.shared_intermediate_size:
            inter = _cdiv(f.shared_intermediate_size, self.tp)
            qs = self.model.quantised("shared_experts")
            lins += [Linear("shared_up", (2 if f.gated else 1) * inter, h, qs),
                     Linear("shared_down", h, inter, qs)]
        return lins

    def expert_slots(self, f: FfnSpec) -> int:
        """Physical expert slots of a MoE layer: its routed experts plus :attr:`redundant_experts`."""
        return f.num_experts + self.redundant_experts

    def experts_per_gpu(self, f: FfnSpec) -> int:
        """Expert slots (whole experts' weights, each sharded over moe_tp) one GPU holds."""
        return _cdiv(self.expert_slots(f), self.ep)

    def expert_elems(self, f: FfnSpec) -> int:
        """Weights of one routed expert's shard on one GPU."""
        return f.mats * (f.latent_size or self.model.hidden_size) * _cdiv(f.intermediate_size, self.moe_tp)

    # --- KV cache and per-request state ---------------------------------------------------------
    def _mixer_kv_bytes_per_token(self, m: MixerSpec) -> float:
        if m.kind == "gqa":
            return self.mixer_kv_heads(m) * (m.head_dim + m.vdim) * self.kv_bytes_per_elem
        if m.kind == "mla":   # latent + rope key, replicated on every TP rank; DSA indexer keys in FP8 + scale
            idx = (m.index_head_dim + 4) if m.index_n_heads else 0
            return (m.kv_lora_rank + m.qk_rope_head_dim) * self.kv_bytes_per_elem + idx
        if m.kind == "csa":   # one entry per compress_ratio tokens (the window is per-request state)
            if not m.compress_ratio:
                return 0.0
            idx = (m.index_head_dim + 4) if m.index_topk else 0
            return (self.csa_entry_bytes(m) + idx) / m.compress_ratio
        return 0.0

    def csa_entry_bytes(self, m: MixerSpec) -> float:
        """One DeepSeek-V4 KV entry (a raw window token or a compressed one): with an FP8 cache vLLM's and
        SGLang's fp8_ds_mla layout, the unrotated dims in FP8 with a scale per 64, the rotated ones BF16 and a
        pad byte (448 + 128 + 7 + 1 = 584 B, FlashMLA's MODEL1 layout); otherwise head_dim x the KV dtype."""
        if self.kv_dtype == "fp8":
            nope = m.head_dim - m.qk_rope_head_dim
            return nope + m.qk_rope_head_dim * ACT_BYTES + _cdiv(nope, 64) + 1
        return m.head_dim * self.kv_bytes_per_elem

    def _stage_fraction(self) -> float:
        return self.layers_per_gpu / self.model.num_layers

    def _windowed(self, m: MixerSpec) -> bool:
        """A sliding-window GQA layer whose KV the engine bounds by the window (EngineProfile.windowed_kv). A
        DeepSeek-V4 (csa) layer's window is per-request state in every engine; its per-token KV is the
        compressed stream (_mixer_kv_bytes_per_token)."""
        return m.kind == "gqa" and bool(m.window) and self.engine.windowed_kv

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """K and V bytes of one token in one full-attention layer of the main kind."""
        main = next((mx for mx, _ in self.model.layers if mx is not None and mx.is_attention), None)
        return int(self._mixer_kv_bytes_per_token(main)) if main is not None else 0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token on one GPU over the full-attention layers this GPU holds.

        Sliding-window layers are not here: their window is constant per-request state (see
        state_bytes_per_request), as vLLM's hybrid allocator bounds them by the window, unless the engine
        keeps full-length KV for them (EngineProfile.windowed_kv: TensorRT-LLM).
        """
        total = 0.0
        for (mixer, _), n in self.model.layer_groups:
            if mixer is not None and mixer.is_attention and not self._windowed(mixer):
                total += n * self._mixer_kv_bytes_per_token(mixer)
        if self.spec_tokens:  # the MTP layer keeps its own KV cache (last pipeline stage: counted in full)
            draft = self.draft_layer[0]
            if draft is not None and draft.is_attention:
                total += self._mixer_kv_bytes_per_token(draft) / self._stage_fraction()
        return int(round(total * self._stage_fraction()))

    @property
    def draft_layer(self) -> tuple[MixerSpec | None, FfnSpec | None]:
        """The MTP module's decoder layer: ModelSpec.mtp_layer where the checkpoint says (DeepSeek-V4), else of
        the kind of the model's last layer (MoE for DeepSeek-V3/R1)."""
        return self.model.mtp_layer or self.model.layers[-1]

    @property
    def draft_proj(self) -> Linear:
        """The MTP module's projection of [normed embedding; normed hidden state] (2 x hidden -> hidden):
        BF16 and whole on every GPU, as SGLang's DeepseekModelNextN builds its eh_proj (a plain nn.Linear)."""
        h = self.model.hidden_size
        return Linear("draft_proj", h, 2 * h, False)

    @property
    def state_bytes_per_request(self) -> int:
        """Constant per-request memory on one GPU: Mamba2 / GDN recurrent + conv state, sliding-window KV."""
        ssm, conv, other = self._state_parts()
        return int(round((ssm + conv + other) * self._stage_fraction()))

    def _state_parts(self) -> tuple[float, float, float]:
        """A request's constant state over all layers, before the pipeline stage's share: the Mamba2 / GDN
        layers' SSM state and their conv windows, and everything else (sliding-window KV, DeepSeek-V4
        compressor rows). Each part is a sum of whole byte counts, so any order of adding them is exact."""
        ssm = conv = other = 0.0
        for (m, _), n in self.model.layer_groups:
            if m is None:
                continue
            heads = self.mixer_heads(m)
            if m.kind in ("mamba2", "gdn"):
                ssm += n * heads * m.head_dim * m.state_size * m.state_bytes
                groups = self.mixer_groups(m)
                # conv channels: Mamba2's x, B and C; GDN's q, k and v
                channels = (heads * m.head_dim + 2 * groups * m.state_size if m.kind == "mamba2"
                            else 2 * groups * m.state_size + heads * m.head_dim)
                conv += n * channels * (m.conv_kernel - 1) * CONV_STATE_BYTES
            elif m.kind == "csa":
                other += n * (m.window * self.csa_entry_bytes(m) + self._csa_compressor_state(m))
            elif m.is_attention and self._windowed(m):
                other += n * m.window * self._mixer_kv_bytes_per_token(m)
        return ssm, conv, other

    @property
    def held_state_bytes_per_request(self) -> int:
        """What one admitted request holds of the pool for its constant state: state_bytes_per_request, and
        under speculative decoding on an engine that keeps a state slot per verified position
        (EngineProfile.verify_states: slots, vLLM's 1 + num_speculative_blocks Mamba blocks) k more copies
        of its recurrent and conv state."""
        state = self.state_bytes_per_request
        if not self.spec_tokens or self.engine.verify_states != "slots":
            return state
        ssm, conv, _ = self._state_parts()
        return state + int(round(self.spec_tokens * (ssm + conv) * self._stage_fraction()))

    def verify_snapshot_bytes(self, max_num_seqs: int | None = None) -> int:
        """The speculative verify's SSM snapshot pool on one GPU where the engine keeps one
        (EngineProfile.verify_states: snapshots, SGLang's intermediate_ssm cache): (max running requests + 1) x
        (1 + k) SSM states per recurrent layer, allocated with the KV pool; 0 otherwise. The conv windows it
        keeps beside them (under 1 % of it for Qwen3.5) are left out."""
        if not self.spec_tokens or self.engine.verify_states != "snapshots":
            return 0
        ssm, _, _ = self._state_parts()
        seqs = max_num_seqs or self.engine.default_max_num_seqs(self.gpu)
        return int(round((seqs + 1) * (1 + self.spec_tokens) * ssm * self._stage_fraction()))

    @staticmethod
    def _csa_compressor_state(m: MixerSpec) -> float:
        """A DeepSeek-V4 layer's compressor state per request: FP32 KV and score rows, 2 x coff x dim each, for the
        coff x ratio raw tokens its next entries pool (coff: MixerSpec.compress_overlap; vLLM
        CompressorStateCache, SGLang's ring), the indexer's compressor at index_head_dim too where there is one."""
        if not m.compress_ratio:
            return 0.0
        coff = m.compress_overlap
        return coff * m.compress_ratio * 2 * coff * (m.head_dim + m.index_head_dim) * 4

    def bytes_per_block(self, block_size: int) -> int:
        """Bytes of one KV block of `block_size` tokens on one GPU."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return block_size * self.kv_bytes_per_token

    def state_blocks_per_request(self, block_size: int) -> int:
        """KV blocks one request's constant state occupies when it shares the block pool (0 if none)."""
        state = self.held_state_bytes_per_request
        return _cdiv(state, self.bytes_per_block(block_size)) if state else 0

    # --- weights -------------------------------------------------------------------------------
    def _linears_bytes(self, lins: list[Linear]) -> float:
        return sum(lin.n * lin.k * self.linear_weight_bytes(lin) for lin in lins)

    @property
    def linear_weight_bytes_per_layer(self) -> int:
        """Weights of the first layer's kind on one GPU (the whole layer for uniform dense models)."""
        (mixer, ffn), _ = self.model.layer_groups[0]
        return int(self._layer_bytes(mixer, ffn))

    def _layer_bytes(self, mixer: MixerSpec | None, ffn: FfnSpec | None) -> float:
        b = 0.0
        if mixer is not None:
            b += self._linears_bytes(self.mixer_linears(mixer))
            if mixer.kind == "mla":
                b += self.mla_kv_b_elems(mixer) * self.linear_bytes_per_elem(self.model.quantised("attention_in"))
        if ffn is not None:
            b += self._linears_bytes(self.ffn_linears(ffn))
            if ffn.kind == "moe":
                b += self.experts_per_gpu(ffn) * self.expert_elems(ffn) * self.weight_bytes_per_elem
        return b

    @property
    def embedding_bytes_per_gpu(self) -> int:
        """Vocab-parallel embedding (or LM head) shard; kept in BF16 by quantized checkpoints."""
        return math.ceil(self.model.vocab_size / self.tp) * self.model.hidden_size * ACT_BYTES

    @property
    def weight_bytes_per_gpu(self) -> int:
        """Weights resident on one GPU: its layers, norms, and embedding / LM head shards.

        With pp > 1 a stage holds either the embedding or the LM head (same size), so one of them counts.
        """
        m = self.model
        layers = sum(n * self._layer_bytes(mx, f) for (mx, f), n in m.layer_groups) * self._stage_fraction()
        sub_blocks = sum(n * ((mx is not None) + (f is not None)) for (mx, f), n in m.layer_groups)
        norms = (sub_blocks * self._stage_fraction() + 1) * m.hidden_size * ACT_BYTES
        embeds = 1 if (self.pp > 1 or m.tie_word_embeddings) else 2
        if self.spec_tokens:  # the MTP module: one layer, its projection and four norms (embedding, LM head shared)
            layers += self._layer_bytes(*self.draft_layer) + self._linears_bytes([self.draft_proj])
            norms += 4 * m.hidden_size * ACT_BYTES
        return int(round(layers + norms)) + embeds * self.embedding_bytes_per_gpu

    # --- memory budget -------------------------------------------------------------------------
    def activation_reserve_bytes(self, max_num_batched_tokens: int, max_num_seqs: int) -> int:
        """Peak activation memory of the engine's profiling forward pass plus the sampler.

        Formula (documented assumption, after vLLM's profile_run): max_num_batched_tokens tokens live at
        once with the residual stream and hidden state (2 x hidden) plus the widest per-layer
        intermediate (the largest GEMM output, + one SiLU output for gated MLPs), in BF16; plus FP32 logits
        and probabilities for max_num_seqs sampled rows over the full vocabulary.
        """
        m = self.model
        widest = 0
        for (mixer, ffn), _ in m.layer_groups:
            if mixer is not None:
                widest = max(widest, max(lin.n for lin in self.mixer_linears(mixer)))
            if ffn is not None:
                if ffn.kind == "dense":
                    inter = _cdiv(ffn.intermediate_size, self.tp)
                    widest = max(widest, (3 if ffn.gated else 2) * inter)
                else:
                    inter = _cdiv(ffn.intermediate_size, self.moe_tp)
                    widest = max(widest, ffn.experts_per_token * (3 if ffn.gated else 2) * inter)
        per_token = (2 * m.hidden_size + widest) * ACT_BYTES
        sampler = 2 * max_num_seqs * m.vocab_size * LOGIT_BYTES
        return max_num_batched_tokens * per_token + sampler

    def reserve_bytes(self, max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None) -> int:
        """Activation peak plus the engine's fixed runtime reserve (CUDA context, graphs, comm buffers)."""
        mnbt = max_num_batched_tokens or self.engine.default_max_num_batched_tokens(self.gpu)
        mns = max_num_seqs or self.engine.default_max_num_seqs(self.gpu)
        return self.activation_reserve_bytes(mnbt, mns) + self.engine.runtime_reserve_bytes

    def default_memory_fraction(self, *, max_num_batched_tokens: int | None = None,
                                cuda_graph_max_bs: int | None = None) -> float:
        """The engine's KV-memory fraction for this deployment when the user sets none
        (EngineProfile.default_memory_fraction): its per-step token budget stands for SGLang's
        chunked_prefill_size, and the largest captured batch for cuda_graph_max_bs (None: the engine's
        defaults for this GPU and its tp x attn_dp GPUs, SGLang's tp_size)."""
        chunk = max_num_batched_tokens or self.engine.default_max_num_batched_tokens(self.gpu)
        graphs = cuda_graph_max_bs or self.engine.cuda_graph_max_bs(self.gpu, self.tp * self.attn_dp)
        return self.engine.default_memory_fraction(self.gpu, gpus=self.gpus, chunked_prefill_size=chunk,
                                                   cuda_graph_max_bs=graphs, dp_attention=self.attn_dp,
                                                   speculative=self.spec_tokens > 0)

    def kv_capacity_blocks(self, block_size: int, gpu_memory_utilization: float, *,
                           max_num_batched_tokens: int | None = None,
                           max_num_seqs: int | None = None) -> int:
        """floor((HBM x utilisation - weights - reserve) / bytes per block), or with the engine's ``free``
        rule (TensorRT-LLM) floor((HBM - weights - reserve) x utilisation / bytes per block), or with its
        ``static`` rule (SGLang) floor((HBM x utilisation - weights - runtime reserve) / bytes per block), the
        activation peak lying outside the fraction there; ValueError if nothing fits.

        Per-request state (Mamba, sliding windows) is not subtracted here: it is taken from the same pool
        per admitted request (state_blocks_per_request). A speculative verify's SSM snapshot pool
        (verify_snapshot_bytes, sized by ``max_num_seqs``) is.
        """
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        per_block = self.bytes_per_block(block_size)
        if per_block <= 0:
            raise ValueError(f"{self.model.name} has no full-attention KV cache: block capacity is undefined")
        weights = self.weight_bytes_per_gpu
        rule = self.engine.kv_memory_rule
        # static (SGLang): the activation peak lies outside the fraction; only the runtime reserve is taken
        reserve = (self.engine.runtime_reserve_bytes if rule == "static"
                   else self.reserve_bytes(max_num_batched_tokens, max_num_seqs))
        hbm = self.gpu.hbm_bytes
        if rule == "free":
            free = (hbm - weights - reserve) * gpu_memory_utilization
            how = (f"(HBM {hbm / 2**30:.1f} GiB - weights {weights / 2**30:.2f} GiB - reserve "
                   f"{reserve / 2**30:.2f} GiB) x {gpu_memory_utilization}")
        else:
            free = hbm * gpu_memory_utilization - weights - reserve
            how = (f"HBM {hbm / 2**30:.1f} GiB x {gpu_memory_utilization} - weights {weights / 2**30:.2f} GiB "
                   f"- reserve {reserve / 2**30:.2f} GiB")
        snapshots = self.verify_snapshot_bytes(max_num_seqs)
        if snapshots:
            free -= snapshots
            how += f" - verify snapshots {snapshots / 2**30:.2f} GiB"
        blocks = math.floor(free / per_block) if free > 0 else 0
        if blocks <= 0:
            raise ValueError(
                f"{self.model.name} does not fit on {self.gpu.name} (tp={self.tp}, pp={self.pp}, "
                f"ep={self.ep}, {self.weight_dtype} weights): {how} leaves {free / 2**30:.2f} GiB < one "
                f"block ({per_block} B)")
        return blocks
