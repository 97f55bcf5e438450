"""Per-family parsers: a Hugging Face config.json (its text config) read as the model's decoder layers, each a
(mixer, ffn) pair of hardware.layers, by model_type (PARSERS), with DeepSeek-V4's checkpoint formats and MTP
layer, which its config spells its own way. hardware.model checks the config's fields before a parser reads
them and builds the ModelSpec from the layers."""

from __future__ import annotations

from typing import Any, Callable

import attrs

from hardware._data import is_count
from hardware.layers import FfnSpec, Layer, MixerSpec


def _gqa(cfg: dict[str, Any], *, window: int = 0, heads_key: str = "num_attention_heads",
         kv_key: str = "num_key_value_heads", head_dim_key: str = "head_dim",
         gate: bool = False, v_head_dim: int = 0) -> MixerSpec:
    heads = int(cfg[heads_key])
    head_dim = int(cfg.get(head_dim_key) or cfg["hidden_size"] // heads)
    return MixerSpec(kind="gqa", num_heads=heads, num_kv_heads=int(cfg.get(kv_key) or heads),
                     head_dim=head_dim, v_head_dim=v_head_dim, window=window, output_gate=gate)


def _dense(cfg: dict[str, Any]) -> list[Layer]:
    mixer = _gqa(cfg)
    ffn = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]))
    return [(mixer, ffn)] * int(cfg["num_hidden_layers"])


def _moe_ffn(cfg: dict[str, Any], experts_key: str, inter_key: str, shared: int = 0,
             k_key: str = "num_experts_per_tok", gated: bool = True) -> FfnSpec:
    return FfnSpec(kind="moe", intermediate_size=int(cfg[inter_key]), num_experts=int(cfg[experts_key]),
                   experts_per_token=int(cfg[k_key]), shared_intermediate_size=shared, gated=gated)


def _sliding(cfg: dict[str, Any], i: int) -> bool:
    types = cfg.get("layer_types") or []
    return i < len(types) and types[i] == "sliding_attention"


def _qwen3_moe(cfg: dict[str, Any]) -> list[Layer]:
    n, mixer = int(cfg["num_hidden_layers"]), _gqa(cfg)
    moe = _moe_ffn(cfg, "num_experts", "moe_intermediate_size")
    dense = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]))
    step = int(cfg.get("decoder_sparse_step") or 1)
    only = set(cfg.get("mlp_only_layers") or [])
    return [(mixer, dense if (i in only or (i + 1) % step) else moe) for i in range(n)]


def _mixtral(cfg: dict[str, Any]) -> list[Layer]:
    return [(_gqa(cfg), _moe_ffn(cfg, "num_local_experts", "intermediate_size"))] * int(
        cfg["num_hidden_layers"])


def _minimax_m2(cfg: dict[str, Any]) -> list[Layer]:
    shared = int(cfg.get("shared_intermediate_size") or 0)
    mixer = attrs.evolve(_gqa(cfg), qk_norm_across_heads=bool(cfg.get("use_qk_norm"))
                         and cfg.get("qk_norm_type", "per_layer") == "per_layer")
    moe = attrs.evolve(_moe_ffn(cfg, "num_local_experts", "intermediate_size", shared), router_fp32=True)
    return [(mixer, moe)] * int(cfg["num_hidden_layers"])


def _gpt_oss(cfg: dict[str, Any]) -> list[Layer]:
    """Alternating sliding-window (128) and full attention, BF16 attention, MXFP4 experts."""
    n, w = int(cfg["num_hidden_layers"]), int(cfg.get("sliding_window") or 0)
    moe = _moe_ffn(cfg, "num_local_experts", "intermediate_size")
    return [(_gqa(cfg, window=w if _sliding(cfg, i) else 0), moe) for i in range(n)]


def _llama4(cfg: dict[str, Any]) -> list[Layer]:
    """MoE every interleave_moe_layer_step layers with one shared expert; chunked attention costed as full."""
    n, step = int(cfg["num_hidden_layers"]), int(cfg.get("interleave_moe_layer_step") or 1)
    moe = _moe_ffn(cfg, "num_local_experts", "intermediate_size", shared=int(cfg["intermediate_size"]))
    dense = FfnSpec(kind="dense", intermediate_size=int(cfg.get("intermediate_size_mlp") or
                                                         cfg["intermediate_size"]))
    return [(_gqa(cfg), moe if (i + 1) % step == 0 else dense) for i in range(n)]


def _step3p7(cfg: dict[str, Any]) -> list[Layer]:
    n, w, k = int(cfg["num_hidden_layers"]), int(cfg.get("sliding_window") or 0), int(
        cfg.get("first_k_dense_replace") or 0)
    shared = int(cfg.get("share_expert_dim") or 0) * int(cfg.get("n_shared_experts") or 1)
    moe = _moe_ffn(cfg, "num_experts", "moe_intermediate_size", shared)
    dense = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]))
    return [(_gqa(cfg, window=w if _sliding(cfg, i) else 0), dense if i < k else moe) for i in range(n)]


def _mimo_v2(cfg: dict[str, Any]) -> list[Layer]:
    n = int(cfg["num_hidden_layers"])
    pattern, freq = cfg["hybrid_layer_pattern"], cfg["moe_layer_freq"]
    full = _gqa(cfg, v_head_dim=int(cfg.get("v_head_dim") or 0))
    swa = _gqa(cfg, window=int(cfg.get("sliding_window") or 0), heads_key="swa_num_attention_heads",
               kv_key="swa_num_key_value_heads", head_dim_key="swa_head_dim",
               v_head_dim=int(cfg.get("swa_v_head_dim") or 0))
    moe = _moe_ffn(cfg, "n_routed_experts", "moe_intermediate_size")
    dense = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]))
    return [(swa if pattern[i] else full, moe if freq[i] else dense) for i in range(n)]


def _minimax_m3(cfg: dict[str, Any]) -> list[Layer]:
    """GQA + MoE after dense first layers; its sparse-attention variant is costed as full attention."""
    n, freq = int(cfg["num_hidden_layers"]), cfg.get("moe_layer_freq") or []
    shared = int(cfg.get("shared_intermediate_size") or 0) * int(cfg.get("n_shared_experts") or 0)
    moe = _moe_ffn(cfg, "num_local_experts", "moe_intermediate_size", shared)
    dense = FfnSpec(kind="dense", intermediate_size=int(cfg.get("dense_intermediate_size") or
                                                         cfg["intermediate_size"]))
    return [(_gqa(cfg), moe if (freq[i] if i < len(freq) else 1) else dense) for i in range(n)]


def _gemma4(cfg: dict[str, Any]) -> list[Layer]:
    """Sliding (local) and global attention layers; MoE block next to a dense MLP in every layer."""
    n, w = int(cfg["num_hidden_layers"]), int(cfg.get("sliding_window") or 0)
    local = _gqa(cfg, window=w)
    glob = MixerSpec(kind="gqa", num_heads=int(cfg["num_attention_heads"]),
                     num_kv_heads=int(cfg.get("num_global_key_value_heads") or cfg["num_key_value_heads"]),
                     head_dim=int(cfg.get("global_head_dim") or cfg["head_dim"]))
    if cfg.get("enable_moe_block"):
        ffn = FfnSpec(kind="moe", intermediate_size=int(cfg["moe_intermediate_size"]),
                      num_experts=int(cfg["num_experts"]), experts_per_token=int(cfg["top_k_experts"]),
                      shared_intermediate_size=int(cfg["intermediate_size"]))
    else:
        ffn = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]))
    return [(local if _sliding(cfg, i) else glob, ffn) for i in range(n)]


def _mla_mixer(cfg: dict[str, Any]) -> MixerSpec:
    nope = int(cfg["qk_nope_head_dim"])
    rope = int(cfg.get("qk_rope_head_dim") or (int(cfg.get("qk_head_dim") or 0) - nope) or 64)
    return MixerSpec(kind="mla", num_heads=int(cfg["num_attention_heads"]),
                     num_kv_heads=int(cfg["num_attention_heads"]), head_dim=nope + rope,
                     v_head_dim=int(cfg["v_head_dim"]), q_lora_rank=int(cfg.get("q_lora_rank") or 0),
                     kv_lora_rank=int(cfg["kv_lora_rank"]), qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                     index_n_heads=int(cfg.get("index_n_heads") or 0),
                     index_head_dim=int(cfg.get("index_head_dim") or 0),
                     index_topk=int(cfg.get("index_topk") or 0))


def _deepseek(cfg: dict[str, Any]) -> list[Layer]:
    """MLA + MoE with shared experts after first_k_dense_replace dense layers (DeepSeek-V3/R1, Kimi-K2, GLM-5)."""
    n, k = int(cfg["num_hidden_layers"]), int(cfg.get("first_k_dense_replace") or 0)
    mixer = _mla_mixer(cfg)
    shared = int(cfg.get("n_shared_experts") or 0) * int(cfg["moe_intermediate_size"])
    moe = _moe_ffn(cfg, "n_routed_experts", "moe_intermediate_size", shared)
    dense = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]))
    return [(mixer, dense if i < k else moe) for i in range(n)]


def _mamba2(cfg: dict[str, Any]) -> MixerSpec:
    fp32 = "float32" in str(cfg.get("mamba_ssm_cache_dtype", ""))
    return MixerSpec(kind="mamba2", num_heads=int(cfg["mamba_num_heads"]), head_dim=int(cfg["mamba_head_dim"]),
                     state_size=int(cfg["ssm_state_size"]), groups=int(cfg.get("n_groups") or 1),
                     conv_kernel=int(cfg.get("conv_kernel") or 4), chunk_size=int(cfg.get("chunk_size") or 128),
                     state_bytes=4 if fp32 else 2)


def _nemotron_h(cfg: dict[str, Any]) -> list[Layer]:
    """Hybrid pattern, one block per character: M Mamba2, * attention, - relu2 MLP, E relu2 MoE."""
    codes = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
    pattern = str(cfg.get("hybrid_override_pattern") or "".join(
        codes.get(t, "?") for t in cfg.get("layers_block_type") or []))
    attn = _gqa(cfg, head_dim_key="head_dim" if cfg.get("head_dim") else "attention_head_dim")
    mamba = _mamba2(cfg)
    mlp = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]), gated=False)
    out: list[Layer] = []
    for ch in pattern:
        if ch == "M":
            out.append((mamba, None))
        elif ch == "*":
            out.append((attn, None))
        elif ch == "-":
            out.append((None, mlp))
        elif ch == "E":
            shared = int(cfg.get("moe_shared_expert_intermediate_size") or 0) * int(
                cfg.get("n_shared_experts") or 1)
            out.append((None, FfnSpec(kind="moe", intermediate_size=int(cfg["moe_intermediate_size"]),
                                      num_experts=int(cfg["n_routed_experts"]),
                                      experts_per_token=int(cfg["num_experts_per_tok"]),
                                      shared_intermediate_size=shared, gated=False,
                                      latent_size=int(cfg.get("moe_latent_size") or 0))))
        else:
            raise NotImplementedError(f"Nemotron-H layer code {ch!r} in {pattern!r}")
    return out


def _qwen3_5(cfg: dict[str, Any]) -> list[Layer]:
    """Gated DeltaNet linear attention with a gated full-attention layer every full_attention_interval.

    The checkpoint stores the GDN input projection as four matrices (in_proj_qkv, in_proj_z, in_proj_b,
    in_proj_a) and the engines run them as four GEMMs: SGLang 0.5.9 python/sglang/srt/models/qwen3_5.py:129-166
    ("Split projection layers (following vLLM's implementation)"), hence ``split_in_proj``.
    """
    n = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % int(cfg.get("full_attention_interval", 4)) == 0 else "linear_attention"
        for i in range(n)]
    full = _gqa(cfg, gate=bool(cfg.get("attn_output_gate", True)))
    gdn = MixerSpec(kind="gdn", num_heads=int(cfg["linear_num_value_heads"]),
                    head_dim=int(cfg["linear_value_head_dim"]), groups=int(cfg["linear_num_key_heads"]),
                    state_size=int(cfg["linear_key_head_dim"]),
                    conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4), chunk_size=64, state_bytes=4,
                    split_in_proj=True)
    if cfg.get("num_experts"):
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        ffn = _moe_ffn(cfg, "num_experts", "moe_intermediate_size", shared)
    else:
        ffn = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]))
    return [(full if types[i] == "full_attention" else gdn, ffn) for i in range(n)]


def _kimi_linear(cfg: dict[str, Any]) -> list[Layer]:
    """Kimi Linear / Kimi-K3: Kimi Delta Attention layers with an MLA layer between them (the 1-based lists
    linear_attn_config.kda_layers / full_attn_layers), dense MLP in the first first_k_dense_replace layers,
    then MoE every moe_layer_freq layers.

    KDA (Kimi Linear tech report, arXiv 2510.26692; SGLang models/kimi_k3.py, vLLM models/kimi_k3): num_heads
    heads of head_dim keys and values, short convolutions on q, k and v, a per-channel forget gate through
    a head_dim-rank bottleneck, a full-rank output gate where use_full_rank_gate (else the same low rank),
    an FP32 head_dim x head_dim state per head, costed on the GDN scan curve (the same FLA chunked
    delta-rule kernels, with a per-channel decay). MLA: DeepSeek's, with the output gate of
    mla_use_output_gate (its NoPE changes no shape). MoE: routed experts in routed_expert_hidden_size (latent
    MoE: hidden -> latent before the experts, latent -> hidden after), the shared experts one full-width
    MLP of num_shared_experts x moe_intermediate_size."""
    n = int(cfg["num_hidden_layers"])
    la = cfg["linear_attn_config"]
    kda_at, full_at = set(la.get("kda_layers") or []), set(la.get("full_attn_layers") or [])
    every = set(range(1, n + 1))
    both, neither, beyond = kda_at & full_at, every - kda_at - full_at, (kda_at | full_at) - every
    if both or neither or beyond:
        raise ValueError(f"linear_attn_config: kda_layers and full_attn_layers must split layers 1..{n} (1-based) "
                         f"between them; in both: {sorted(both)}, in neither: {sorted(neither)}, out of range: "
                         f"{sorted(beyond)}")
    heads, dim = int(la["num_heads"]), int(la["head_dim"])
    kda = MixerSpec(kind="gdn", num_heads=heads, head_dim=dim, groups=heads, state_size=dim,
                    conv_kernel=int(la.get("short_conv_kernel_size") or 4), chunk_size=64, state_bytes=4,
                    gate_rank=dim, out_gate_rank=0 if la.get("use_full_rank_gate") else dim)
    mla = attrs.evolve(_mla_mixer(cfg), output_gate=bool(cfg.get("mla_use_output_gate")))
    moe = FfnSpec(kind="moe", intermediate_size=int(cfg["moe_intermediate_size"]),
                  num_experts=int(cfg["num_experts"]), experts_per_token=int(cfg["num_experts_per_token"]),
                  shared_intermediate_size=int(cfg.get("num_shared_experts") or 0) * int(cfg["moe_intermediate_size"]),
                  latent_size=int(cfg.get("routed_expert_hidden_size") or 0))
    dense = FfnSpec(kind="dense", intermediate_size=int(cfg["intermediate_size"]))
    k, freq = int(cfg.get("first_k_dense_replace") or 0), int(cfg.get("moe_layer_freq") or 1)
    return [(kda if i + 1 in kda_at else mla, moe if i >= k and i % freq == 0 else dense) for i in range(n)]


DEEPSEEK_V4_TYPES = ("deepseek_v4", "deepseek_ref")
"""DeepSeek-V4's model types (SGLang's FP8 conversions name it deepseek_ref)."""


def deepseek_v4_formats(cfg: dict[str, Any], weight: str) -> tuple[str, str, str]:
    """(experts, other linears, KV) formats of a DeepSeek-V4 checkpoint: the projections and the shared
    expert block FP8 (128 x 128) in every release; the routed experts ``expert_dtype`` ("fp4": MXFP4 in
    DeepSeek's, NVFP4 in NVIDIA's) or, without it (SGLang's -FP8 conversions), block FP8 like the rest. The
    KV cache is FP8: vLLM refuses any other ("DeepseekV4 only supports fp8 kv-cache format") and SGLang's
    pool is the same 584-byte fp8_ds_mla entry (Deployment.csa_entry_bytes)."""
    dense = "fp8_block" if weight in ("fp8", "fp8_block", "fp4") else weight
    experts = {"fp4": "fp4", "fp8": "fp8_block"}.get(str(cfg.get("expert_dtype") or "").lower(), dense)
    return experts, dense, "fp8"


def _deepseek_v4_mixer(cfg: dict[str, Any], ratio: int) -> MixerSpec:
    """A DeepSeek-V4 layer's attention at compress ratio ``ratio`` (the indexer only at ratio 4)."""
    indexed = ratio == 4
    return MixerSpec(kind="csa", num_heads=int(cfg["num_attention_heads"]), num_kv_heads=1,
                     head_dim=int(cfg["head_dim"]), qk_rope_head_dim=int(cfg["qk_rope_head_dim"]),
                     q_lora_rank=int(cfg["q_lora_rank"]), window=int(cfg["sliding_window"]),
                     o_groups=int(cfg["o_groups"]), o_lora_rank=int(cfg["o_lora_rank"]), compress_ratio=ratio,
                     index_n_heads=int(cfg["index_n_heads"]) if indexed else 0,
                     index_head_dim=int(cfg["index_head_dim"]) if indexed else 0,
                     index_topk=int(cfg["index_topk"]) if indexed else 0)


def _deepseek_v4_ratios(cfg: dict[str, Any]) -> list[int]:
    n, ratios = int(cfg["num_hidden_layers"]), cfg["compress_ratios"]
    if not isinstance(ratios, list) or len(ratios) < n or not all(is_count(r, 0) for r in ratios):
        raise ValueError(f"compress_ratios must list one ratio (an integer >= 0) per layer, {n} at least, got "
                         f"{ratios!r}")
    return [int(r) for r in ratios]


def _deepseek_v4(cfg: dict[str, Any]) -> list[Layer]:
    """DeepSeek-V4 (DeepSeek's inference/model.py; vLLM models/deepseek_v4.py): every layer a csa mixer of its
    compress_ratios entry (0: the sliding window alone; 4: window + indexed compressed entries; 128: window +
    every compressed entry) and a MoE of n_routed_experts with n_shared_experts of the same width. The list's
    entries past num_hidden_layers belong to the MTP module (:func:`deepseek_v4_mtp`). The first
    num_hash_layers route by token id, which costs what a learned router does (the gate GEMM still runs for
    the weights)."""
    n, ratios = int(cfg["num_hidden_layers"]), _deepseek_v4_ratios(cfg)
    mixers = {r: _deepseek_v4_mixer(cfg, r) for r in set(ratios[:n])}
    shared = int(cfg.get("n_shared_experts") or 0) * int(cfg["moe_intermediate_size"])
    moe = _moe_ffn(cfg, "n_routed_experts", "moe_intermediate_size", shared)
    return [(mixers[ratios[i]], moe) for i in range(n)]


def deepseek_v4_mtp(cfg: dict[str, Any], layers: list[Layer]) -> Layer:
    """DeepSeek-V4's MTP layer: the compress_ratios entry after the main layers (0 in every release: the
    window alone; vLLM's deepseek_v4.py forces it so), with the main layers' MoE."""
    n, ratios = int(cfg["num_hidden_layers"]), _deepseek_v4_ratios(cfg)
    return _deepseek_v4_mixer(cfg, ratios[n] if len(ratios) > n else 0), layers[-1][1]


def _decilm(cfg: dict[str, Any]) -> list[Layer]:
    """Nemotron-NAS (DeciLM): per-block attention (or none) and FFN width ffn_mult."""
    h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    out: list[Layer] = []
    for block in cfg["block_configs"]:
        a, f = block["attention"], block["ffn"]
        mixer = None if a.get("no_op") else MixerSpec(
            kind="gqa", num_heads=heads, num_kv_heads=heads // int(a["n_heads_in_group"]), head_dim=h // heads)
        inter = int(2 * float(f["ffn_mult"]) * h / 3)
        inter = -(-inter // 256) * 256
        ffn = None if f.get("no_op") else FfnSpec(kind="dense", intermediate_size=inter)
        out.append((mixer, ffn))
    return out


PARSERS: dict[str, Callable[[dict[str, Any]], list[Layer]]] = {
    **{t: _dense for t in ("llama", "qwen3", "mimo", "qwen2", "mistral", "qwen3_vl", "qwen3_vl_text")},
    "qwen3_moe": _qwen3_moe, "qwen3_vl_moe": _qwen3_moe, "qwen3_vl_moe_text": _qwen3_moe,
    "mixtral": _mixtral, "minimax_m2": _minimax_m2, "minimax_m3": _minimax_m3, "gpt_oss": _gpt_oss,
    "llama4": _llama4, "llama4_text": _llama4, "step3p7": _step3p7, "mimo_v2_flash": _mimo_v2,
    "gemma4": _gemma4, "gemma4_text": _gemma4,
    "deepseek_v3": _deepseek, "deepseek_v32": _deepseek, "kimi_k2": _deepseek, "glm_moe_dsa": _deepseek,
    "nemotron_h": _nemotron_h, "qwen3_5": _qwen3_5, "qwen3_5_moe": _qwen3_5, "qwen3_5_text": _qwen3_5,
    "qwen3_5_moe_text": _qwen3_5, "nemotron-nas": _decilm, "kimi_linear": _kimi_linear,
    **{t: _deepseek_v4 for t in DEEPSEEK_V4_TYPES},
}
