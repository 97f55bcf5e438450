"""Per-layer building blocks: a token mixer (attention or a linear-recurrent layer) and a feed-forward.

Every model is a sequence of (mixer, ffn) pairs; identical pairs are costed once (layer folding).
"""

from __future__ import annotations

import attrs

MIXER_KINDS = ("gqa", "mla", "mamba2", "gdn", "csa")
FFN_KINDS = ("dense", "moe")


@attrs.frozen(kw_only=True)
class MixerSpec:
    """Token mixer of one layer.

    gqa: num_heads / num_kv_heads / head_dim (v_head_dim if different), optional sliding window, output gate.
    mla: DeepSeek multi-head latent attention (q_lora_rank, kv_lora_rank, qk_nope/rope dims, v_head_dim),
         optional DSA indexer (index_n_heads, index_head_dim, index_topk), optional output gate (Kimi-K3:
         g_proj hidden -> heads x v_head_dim, a sigmoid on the attention output before o_proj).
    mamba2: num_heads x head_dim values, state_size, groups (n_groups), conv_kernel, chunk_size.
    csa: DeepSeek-V4 attention: num_heads query heads (q through q_lora_rank) over one shared head_dim-wide
         KV vector per entry, used as key and value (the last qk_rope_head_dim dims rotated), a sliding
         window of the last ``window`` raw tokens plus, with compress_ratio r > 0, a stream of one entry per
         r tokens (r = 4: overlapping windows of 2r tokens, of which an indexer of index_n_heads x
         index_head_dim picks index_topk per query; larger r: every entry attended), and a grouped low-rank
         output (o_groups groups of heads, each to o_lora_rank, then to hidden).
    gdn: gated delta net (Qwen3.5 linear attention): num_heads value heads x head_dim, groups key heads x
         state_size key dim, conv_kernel; split_in_proj: the input projection runs as four GEMMs (qkv, z,
         b, a) instead of one. With gate_rank > 0 it is Kimi Delta Attention (Kimi Linear / Kimi-K3): the
         forget gate decays each key channel, not each head, through a rank-gate_rank bottleneck (f_a:
         hidden -> gate_rank, whole on every rank; f_b: gate_rank -> heads x head_dim), and the output gate
         is full rank (hidden -> heads x head_dim) unless out_gate_rank > 0 (g_a / g_b the same way).
    qk_norm_across_heads: the RMSNorm of q and of k spans every head of the layer, not one head (MiniMax-M2's
         ``qk_norm_type: per_layer``), so a tensor-parallel rank holding some heads cannot normalise alone: the
         engines compute each token's sum of squares per rank, all-reduce it over the TP group and then scale
         (vLLM ``MiniMaxText01RMSNormTP.forward_qk``): one more small all-reduce and one more elementwise
         pass per layer.
    """

    kind: str
    num_heads: int
    num_kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    window: int = 0
    output_gate: bool = False
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    state_size: int = 0
    groups: int = 0
    conv_kernel: int = 4
    chunk_size: int = 128
    state_bytes: int = 4            # SSM / recurrent state element size (FP32 unless the config says BF16)
    split_in_proj: bool = False     # gdn: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a as separate GEMMs
    compress_ratio: int = 0         # csa: raw tokens per compressed entry (0: the window alone)
    o_groups: int = 0               # csa: groups of heads in the low-rank output projection
    o_lora_rank: int = 0            # csa: each group's output rank
    gate_rank: int = 0              # gdn: KDA's per-channel forget gate through this rank (0: GDN, one per head)
    out_gate_rank: int = 0          # gdn with gate_rank: the output gate's rank (0: full rank)
    qk_norm_across_heads: bool = False  # gqa: q and k RMS-normalised over all heads at once (see below)

    def __attrs_post_init__(self) -> None:
        if self.kind not in MIXER_KINDS:
            raise ValueError(f"unknown mixer kind {self.kind!r}; valid: {', '.join(MIXER_KINDS)}")
        if self.num_heads <= 0:
            raise ValueError(f"{self.kind} mixer: num_heads must be > 0, got {self.num_heads}")
        if self.split_in_proj and self.kind != "gdn":
            raise ValueError(f"{self.kind} mixer: split_in_proj applies to gdn mixers only")
        if self.kind == "csa" and not (self.window > 0 and self.o_groups > 0 and self.o_lora_rank > 0
                                       and self.num_heads % self.o_groups == 0 and self.compress_ratio >= 0
                                       and (self.compress_ratio != 4 or self.index_topk > 0)):
            raise ValueError(f"csa mixer: need window, o_groups (dividing num_heads {self.num_heads}) and "
                             f"o_lora_rank > 0, compress_ratio >= 0 and an indexer (index_topk > 0) at ratio 4; "
                             f"got window {self.window}, o_groups {self.o_groups}, o_lora_rank {self.o_lora_rank}, "
                             f"compress_ratio {self.compress_ratio}, index_topk {self.index_topk}")
        if (self.compress_ratio or self.o_groups or self.o_lora_rank) and self.kind != "csa":
            raise ValueError(f"{self.kind} mixer: compress_ratio / o_groups / o_lora_rank apply to csa mixers only")
        if (self.gate_rank or self.out_gate_rank) and self.kind != "gdn":
            raise ValueError(f"{self.kind} mixer: gate_rank / out_gate_rank apply to gdn mixers only")
        if self.gate_rank < 0 or self.out_gate_rank < 0 or (self.out_gate_rank and not self.gate_rank):
            raise ValueError(f"gdn mixer: need gate_rank >= 0 and out_gate_rank >= 0 (only with gate_rank), got "
                             f"{self.gate_rank} / {self.out_gate_rank}")
        if self.gate_rank and self.split_in_proj:
            raise ValueError("gdn mixer: a KDA mixer (gate_rank > 0) has its own projection layout; "
                             "split_in_proj applies to GDN")

    @property
    def vdim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def compress_overlap(self) -> int:
        """csa: raw-token windows each compressed entry pools, as multiples of compress_ratio (2 at ratio 4,
        where windows of 2r tokens overlap; else 1; DeepSeek's inference/model.py Compressor ``coff``)."""
        return 2 if self.compress_ratio == 4 else 1

    @property
    def is_attention(self) -> bool:
        return self.kind in ("gqa", "mla", "csa")


@attrs.frozen(kw_only=True)
class FfnSpec:
    """Feed-forward of one layer: dense (SwiGLU or 2-matrix) or mixture of experts."""

    kind: str
    intermediate_size: int          # dense width, or one routed expert's width
    gated: bool = True
    num_experts: int = 0
    experts_per_token: int = 0
    shared_intermediate_size: int = 0   # all shared experts together
    latent_size: int = 0                # latent MoE (Nemotron-3): experts work in this width, 0 = hidden
    router_fp32: bool = False
    """The router's GEMM runs in float32 (weights and input cast up): MiniMax-M2's gate, ``self.gate(hidden_states
    .to(torch.float32))`` over float32 weights in vLLM's and SGLang's minimax_m2.py. Else it runs in the
    activation format (BF16)."""

    def __attrs_post_init__(self) -> None:
        if self.kind not in FFN_KINDS:
            raise ValueError(f"unknown ffn kind {self.kind!r}; valid: {', '.join(FFN_KINDS)}")
        if self.intermediate_size < 1:   # 0 or negative priced the FFN at nothing (or less) without a word
            raise ValueError(f"{self.kind} ffn: intermediate_size must be >= 1, got {self.intermediate_size}")
        if self.kind == "moe" and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(f"moe ffn: need 0 < experts_per_token <= num_experts, got "
                             f"{self.experts_per_token} of {self.num_experts}")

    @property
    def mats(self) -> int:
        return 3 if self.gated else 2


Layer = tuple[MixerSpec | None, FfnSpec | None]
