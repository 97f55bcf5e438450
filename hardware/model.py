"""Model specifications read from Hugging Face config.json files shipped under data/models/: the ModelSpec, its
weight counts, and the registry that finds a name's config, checks its fields and builds the spec from the
layers a per-family parser (hardware.model_families) reads out of it."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import attrs

from hardware._data import DATA_DIR, is_count, is_rate, read_json, read_yaml, unknown_name, where
from hardware.dtypes import KV_DTYPES, WEIGHT_DTYPES, check_dtype
from hardware.layers import FfnSpec, Layer, MixerSpec
from hardware.model_families import DEEPSEEK_V4_TYPES, PARSERS, deepseek_v4_formats, deepseek_v4_mtp
# tests call these two parsers through hardware.model
from hardware.model_families import _deepseek_v4, _kimi_linear  # noqa: F401

MODEL_DIR = DATA_DIR / "models"


def _dense_layers(self: "ModelSpec") -> tuple[Layer, ...]:
    mixer = MixerSpec(kind="gqa", num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                      head_dim=self.head_dim)
    ffn = FfnSpec(kind="dense", intermediate_size=self.intermediate_size, gated=self.mlp_gated)
    return tuple((mixer, ffn) for _ in range(self.num_layers))


@attrs.frozen(kw_only=True)
class ModelSpec:
    """Architecture facts of one model; derived sizes are properties (vLLM AttentionSpec style).

    The scalar fields describe the main attention and dense MLP (for MoE-only models intermediate_size is
    one routed expert's width); `layers` lists every layer's (mixer, ffn) and is what the cost model reads.
    """

    name: str
    model_type: str = ""
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    mlp_gated: bool = True                 # SwiGLU gate+up+down; False for relu2 MLPs (Nemotron-H)
    default_weight_dtype: str = "bf16"
    default_kv_dtype: str = "bf16"
    dense_weight_dtype: str = ""
    """The checkpoint's format for its quantised linear layers other than the routed experts, where it differs
    from default_weight_dtype (the experts'): DeepSeek-V4's block-FP8 attention and shared experts beside
    MXFP4 / NVFP4 experts. "" when all share one format."""
    unquantised: frozenset[str] = frozenset()
    """The classes of linear layers (UNQUANTISED_CLASSES) the checkpoint keeps in BF16 beside its quantised
    ones: all of them where only the routed experts are quantised (gpt-oss, Kimi's INT4 checkpoint), those
    ModelOpt's ``exclude_modules`` names for NVIDIA's NVFP4 checkpoints (:func:`excluded_classes`)."""
    layers: tuple[Layer, ...] = attrs.field(default=attrs.Factory(_dense_layers, takes_self=True))
    mtp_layers: int = 0
    """Next-token-prediction modules in the checkpoint (config ``num_nextn_predict_layers``: 1 for
    DeepSeek-V3/R1; ``mtp_num_hidden_layers``: 1 for Qwen3.5, whose module is a full-attention MoE layer,
    vLLM's Qwen3NextMultiTokenPredictor): each a decoder layer of the last layer's kind after a projection of
    [embedding; hidden] (2 x hidden -> hidden), sharing the embedding and LM head; usable as a
    speculative-decoding draft."""
    mtp_layer: Layer | None = None
    """The MTP module's decoder layer where it is not of the last layer's kind (DeepSeek-V4: the last entry
    of compress_ratios, a window-only attention); None: the last layer's kind (Deployment.draft_layer)."""
    residual_reads: float = 0.0
    """Hidden-width vectors each sub-layer (mixer or FFN) reads or writes per token for its residual stream
    beyond a plain residual add, as a mean over the layers: Kimi-K3's block attention residuals mix the
    earlier blocks' snapshots into each sub-layer's input, DeepSeek-V4's hyper-connections keep hc_mult
    residual streams (:func:`_residual_reads`). Priced as elementwise traffic."""
    context_length: int = 2048
    """Longest sequence the checkpoint declares, read as SGLang reads it (utils/hf_transformers_utils.
    get_context_length: the first of max_sequence_length, seq_length, max_seq_len, model_max_length,
    max_position_embeddings, times the rope_scaling factor unless the scaling names
    original_max_position_embeddings or is llama3; 2048 when none is given)."""

    def __attrs_post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
                  "context_length"):
            if getattr(self, f) <= 0:
                raise ValueError(f"model {self.name!r}: {f} must be > 0, got {getattr(self, f)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name!r}: num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")
        if len(self.layers) != self.num_layers:
            raise ValueError(f"model {self.name!r}: {len(self.layers)} layers listed, num_layers "
                             f"{self.num_layers}")
        check_dtype("weight dtype", self.default_weight_dtype, WEIGHT_DTYPES)
        check_dtype("KV dtype", self.default_kv_dtype, KV_DTYPES)
        if self.dense_weight_dtype:
            check_dtype("dense weight dtype", self.dense_weight_dtype, WEIGHT_DTYPES)
        unknown = sorted(self.unquantised - set(UNQUANTISED_CLASSES))
        if unknown:
            raise ValueError(f"model {self.name!r}: unquantised classes {unknown} unknown; expected some of "
                             f"{', '.join(UNQUANTISED_CLASSES)}")

    @property
    def quant_scope(self) -> str:
        """``experts`` where the routed experts alone carry the quantised format (every class unquantised),
        else ``all``."""
        return "experts" if self.unquantised >= EXPERTS_ONLY else "all"

    def quantised(self, cls: str) -> bool:
        """Whether this checkpoint's linear layers of class ``cls`` (UNQUANTISED_CLASSES) carry its quantised
        format (False: BF16)."""
        return cls not in self.unquantised

    def weight_dtype_for(self, precision: str) -> str:
        """Map a benchmark's precision label to this checkpoint's weight format.

        'fp8' on a block-scaled checkpoint means block FP8; 'nvfp4' / 'mxfp4' mean fp4; 'int4_wo' int4;
        '' or 'bfloat16' bf16. Unknown labels raise ValueError.
        """
        p = precision.strip().lower()
        table = {"": "bf16", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "fp8": "fp8",
                 "fp8_block": "fp8_block", "fp4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4", "w4a16_mxfp4": "fp4",
                 "int4": "int4", "int4_wo": "int4"}
        if p not in table:
            raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(sorted(table))}")
        out = table[p]
        if out == "fp8" and self.default_weight_dtype == "fp8_block":
            return "fp8_block"
        return out

    @property
    def layer_groups(self) -> tuple[tuple[Layer, int], ...]:
        """Distinct (mixer, ffn) layer kinds with their counts, in first-seen order (layer folding)."""
        counts: dict[Layer, int] = {}
        for layer in self.layers:
            counts[layer] = counts.get(layer, 0) + 1
        return tuple(counts.items())

    @property
    def family(self) -> str:
        """'dense', 'moe', 'mla_moe', 'csa_moe' (DeepSeek-V4), 'hybrid' (has Mamba2 / GDN layers) for reporting."""
        mixers = {m.kind for m, _ in self.layers if m is not None}
        moe = any(f is not None and f.kind == "moe" for _, f in self.layers)
        if mixers & {"mamba2", "gdn"}:
            return "hybrid"
        if "csa" in mixers:
            return "csa_moe" if moe else "csa"
        if "mla" in mixers:
            return "mla_moe" if moe else "mla"
        return "moe" if moe else "dense"

    @property
    def is_moe(self) -> bool:
        return any(f is not None and f.kind == "moe" for _, f in self.layers)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def _layer_params(self, active: bool) -> int:
        h, total = self.hidden_size, 0
        for (mixer, ffn), n in self.layer_groups:
            p = 0
            if mixer is not None:
                p += mixer_params(mixer, h) + h
            if ffn is not None:
                p += ffn_params(ffn, h, active) + h
            total += n * p
        return total

    @property
    def param_count(self) -> int:
        """Total parameters: embeddings, LM head unless tied, every layer (all experts) and norms."""
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self._layer_params(False) + self.embedding_params + lm_head + self.hidden_size

    @property
    def active_param_count(self) -> int:
        """Parameters one token uses (routed experts counted experts_per_token times)."""
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return self._layer_params(True) + self.embedding_params + lm_head + self.hidden_size


def mixer_params(m: MixerSpec, h: int) -> int:
    """Weights of one mixer (unsharded)."""
    if m.kind == "gqa":
        q = m.num_heads * m.head_dim * (2 if m.output_gate else 1)
        kv = m.num_kv_heads * (m.head_dim + m.vdim)
        return h * (q + kv) + m.num_heads * m.vdim * h
    if m.kind == "mla":
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = h * m.q_lora_rank + m.q_lora_rank * m.num_heads * qk if m.q_lora_rank else h * m.num_heads * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.num_heads * (
            m.qk_nope_head_dim + m.vdim)
        idx = (m.q_lora_rank * m.index_n_heads * m.index_head_dim + h * m.index_head_dim
               + h * m.index_n_heads) if m.index_n_heads else 0
        gate = h * m.num_heads * m.vdim if m.output_gate else 0
        return q + kv + m.num_heads * m.vdim * h + idx + gate
    if m.kind == "csa":   # wq_a, wkv, wq_b, the grouped wo_a, wo_b; compressor and indexer where present
        width = m.num_heads * m.head_dim
        p = h * (m.q_lora_rank + m.head_dim) + m.q_lora_rank * width + m.o_lora_rank * width \
            + m.o_groups * m.o_lora_rank * h
        if m.compress_ratio:
            p += h * 2 * m.compress_overlap * m.head_dim
        if m.index_topk:
            p += m.q_lora_rank * m.index_n_heads * m.index_head_dim \
                + h * (m.index_n_heads + 2 * m.compress_overlap * m.index_head_dim)
        return p
    if m.kind == "mamba2":
        d_inner = m.num_heads * m.head_dim
        return h * (2 * d_inner + 2 * m.groups * m.state_size + m.num_heads) + d_inner * h
    # gdn
    p = m.num_heads * m.head_dim
    if m.gate_rank:   # KDA: q, k, v, output gate (full or low rank), f_a / f_b, beta, o_proj
        gate = h * p if not m.out_gate_rank else m.out_gate_rank * (h + p)
        return h * (2 * m.groups * m.state_size + p + m.num_heads) + gate + m.gate_rank * (h + p) + p * h
    return h * (2 * m.groups * m.state_size + 2 * p + 2 * m.num_heads) + p * h


def ffn_params(f: FfnSpec, h: int, active: bool = False) -> int:
    """Weights of one FFN (unsharded); `active` counts only the experts one token uses."""
    if f.kind == "dense":
        return f.mats * h * f.intermediate_size
    experts = f.experts_per_token if active else f.num_experts
    width = f.latent_size or h
    latent_proj = 2 * h * f.latent_size
    return (experts * f.mats * width * f.intermediate_size + f.mats * h * f.shared_intermediate_size
            + h * f.num_experts + latent_proj)


# --- registry --------------------------------------------------------------------------------------

@functools.cache
def _index() -> dict[str, tuple[str, dict[str, Any]]]:
    """Lower-cased name -> (canonical name, entry with 'config' and dtype overrides)."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for path in sorted(MODEL_DIR.glob("*.json")):
        if path.name.endswith(".hf_quant_config.json"):
            continue
        canonical = path.stem.replace("--", "/", 1)
        out[canonical.lower()] = (canonical, {"config": path.stem})
    for canonical, entry in read_yaml(MODEL_DIR / "aliases.yaml").items():
        for alias in [canonical, *entry.get("aliases", [])]:
            out[alias.lower()] = (canonical, entry)
    return out


@functools.cache
def list_models() -> list[str]:
    """Canonical names of every model the loader can build (configs of unsupported types are left out)."""
    names = sorted({canonical for canonical, _ in _index().values()})
    return [n for n in names if _try_load(n)]


def unsupported_models() -> dict[str, str]:
    """Shipped configs the loader cannot represent, with the reason."""
    out: dict[str, str] = {}
    for n in sorted({canonical for canonical, _ in _index().values()}):
        try:
            load_model(n)
        except NotImplementedError as exc:
            out[n] = str(exc)
    return out


def _try_load(name: str) -> bool:
    """Whether ``name`` loads. A config that does not (a user's malformed file under data/models/) is left
    out like an unsupported one: it made list_models() itself raise, so every other name's check failed."""
    try:
        load_model(name)
    except (NotImplementedError, ValueError):
        return False
    return True


def _quant_dtypes(cfg: dict[str, Any], quant: dict[str, Any] | None) -> tuple[str, str]:
    """Default weight and KV dtypes from the config's quantization block or hf_quant_config.json."""
    weight, kv = "bf16", "bf16"
    qc = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config") or {}
    method = str(qc.get("quant_method", "")).lower()
    if method == "fp8":
        weight = "fp8_block" if qc.get("weight_block_size") else "fp8"
    elif method in ("mxfp4", "nvfp4"):
        weight = "fp4"
    elif method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        weight = "fp4" if "FP4" in algo else "fp8" if "FP8" in algo else weight
        kv = "fp8" if "FP8" in str(qc.get("kv_cache_quant_algo", "")).upper() else kv
        # ModelOpt 0.41 writes the KV format as a compressed-tensors style kv_cache_scheme instead
        # (nvidia/Kimi-K2.5-NVFP4: {"num_bits": 8, "type": "float"}, an FP8 KV cache).
        scheme = qc.get("kv_cache_scheme") or {}
        if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float":
            kv = "fp8"
    elif method == "compressed-tensors":
        text = json.dumps(qc).lower()
        weight = "fp4" if "fp4" in text else "int4" if '"num_bits": 4' in text else (
            "fp8" if '"num_bits": 8' in text else weight)
    if quant is not None:
        q = quant.get("quantization", {})
        algo = str(q.get("quant_algo", "")).upper()
        if algo == "MIXED_PRECISION":     # per-layer formats: take the one most layers use
            text = json.dumps(q.get("quantized_layers", {})).upper()
            algo = "FP4" if text.count("NVFP4") >= text.count('"FP8"') else "FP8"
        weight = "fp4" if "FP4" in algo else "fp8" if "FP8" in algo else weight
        kv = "fp8" if "FP8" in str(q.get("kv_cache_quant_algo") or "").upper() else kv
    return weight, kv


UNQUANTISED_CLASSES = ("attention_in", "attention_out", "indexer", "linear_attention", "shared_experts",
                       "dense_mlp")
"""Classes of linear layers a checkpoint may keep in BF16 beside quantised ones (ModelSpec.unquantised): the
attention's input projections (GQA's q / k / v, MLA's q_a / q_b / kv_a / kv_b, an output gate), its output
projection, DSA's indexer, the linear-attention layers' (gated DeltaNet, Mamba2) projections, the MoE layers'
shared experts and the dense MLPs."""
EXPERTS_ONLY = frozenset(UNQUANTISED_CLASSES)
"""ModelSpec.unquantised of a checkpoint that quantises its routed experts alone."""

_EXCLUDED = (
    (re.compile(r"\.(self_attn|attn)(\*|\.\*)?$"), ("attention_in", "attention_out", "indexer")),
    (re.compile(r"\.self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|q_proj|k_proj|v_proj|qkv_proj)\*?$"),
     ("attention_in",)),
    (re.compile(r"\.self_attn\.o_proj\*?$"), ("attention_out",)),
    (re.compile(r"\.self_attn\.indexer"), ("indexer",)),
    (re.compile(r"\.linear_attn"), ("linear_attention",)),
    (re.compile(r"\.shared_experts?(\*|\.|$)"), ("shared_experts",)),
    (re.compile(r"\.mlp(\*|\.\*)?$"), ("dense_mlp",)),
)
"""ModelOpt exclude_modules patterns -> the classes they keep in BF16 (one layer's modules each)."""
_WHOLE_LAYER = re.compile(r"layers\.(\d+)(\*|\.\*)$")
_LAYER = re.compile(r"layers\.(\d+)\.")


def _class_layers(layers: list[Layer]) -> dict[str, set[int]]:
    """The layers that hold a linear layer of each class."""
    out: dict[str, set[int]] = {c: set() for c in UNQUANTISED_CLASSES}
    for i, (mx, ffn) in enumerate(layers):
        if mx is not None and mx.kind in ("gqa", "mla"):
            out["attention_in"].add(i)
            out["attention_out"].add(i)
            if mx.index_topk:
                out["indexer"].add(i)
        elif mx is not None and mx.kind in ("gdn", "mamba2"):
            out["linear_attention"].add(i)
        if ffn is not None and ffn.kind == "dense":
            out["dense_mlp"].add(i)
        elif ffn is not None and ffn.shared_intermediate_size:
            out["shared_experts"].add(i)
    return out


def _modelopt_exclusions(quant: dict[str, Any] | None, cfg: dict[str, Any]) -> list[Any]:
    """The module patterns a ModelOpt checkpoint keeps out of its quantised format: hf_quant_config.json's
    ``exclude_modules``, or config.json's ``quantization_config.ignore`` (quant_method modelopt, as
    nvidia/Kimi-K2.5-NVFP4 ships it). None (an empty list) for mixed-precision checkpoints, which list every
    layer's format instead."""
    q = (quant or {}).get("quantization", {})
    if quant is not None:
        return [] if str(q.get("quant_algo", "")).upper() == "MIXED_PRECISION" else list(q.get("exclude_modules") or [])
    qc = cfg.get("quantization_config") or {}
    if str(qc.get("quant_method", "")).lower() != "modelopt":
        return []
    return list(qc.get("exclude_modules") or qc.get("ignore") or [])


def excluded_classes(quant: dict[str, Any] | None, cfg: dict[str, Any], layers: list[Layer]) -> frozenset[str]:
    """ModelSpec.unquantised of a ModelOpt checkpoint: the classes whose modules its exclusions
    (:func:`_modelopt_exclusions`) keep in BF16 in at least half the layers that hold them (a pattern without a
    layer index counts for every layer; an excluded whole layer, for its dense MLP). Layers past the decoder's
    (the MTP module) do not count."""
    holders = _class_layers(layers)
    hit: dict[str, set[int]] = {c: set() for c in UNQUANTISED_CLASSES}
    for pattern in _modelopt_exclusions(quant, cfg):
        text = str(pattern)
        whole = _WHOLE_LAYER.search(text)
        if whole:
            hit["dense_mlp"].add(int(whole.group(1)))
            continue
        index = _LAYER.search(text)
        for rule, classes in _EXCLUDED:
            if rule.search(text):
                for c in classes:
                    hit[c].update(holders[c] if index is None else {int(index.group(1))})
    return frozenset(c for c in UNQUANTISED_CLASSES
                     if holders[c] and 2 * len(hit[c] & holders[c]) >= len(holders[c]))


def _ignores_attention(cfg: dict[str, Any], text: dict[str, Any]) -> bool:
    """A compressed-tensors checkpoint whose ``ignore`` list leaves the attention unquantised: Moonshot's
    Kimi-K2.5 (INT4) and Kimi-K3 (MXFP4) quantise only their routed experts, the shared experts, dense MLPs and
    attention staying BF16 (ModelSpec.unquantised EXPERTS_ONLY)."""
    qc = cfg.get("quantization_config") or text.get("quantization_config") or {}
    if str(qc.get("quant_method", "")).lower() != "compressed-tensors":
        return False
    return any("self_attn" in str(pattern) for pattern in qc.get("ignore") or [])


def _read_config(stem: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    cfg = read_json(MODEL_DIR / f"{stem}.json")
    quant_path: Path = MODEL_DIR / f"{stem}.hf_quant_config.json"
    quant = read_json(quant_path) if quant_path.is_file() else None
    return cfg, quant


_POSITIVE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "moe_intermediate_size", "vocab_size", "num_experts_per_tok",
                    "max_position_embeddings", "seq_length", "max_seq_len", "model_max_length",
                    "max_sequence_length")
"""config.json fields that, where given (and not null), must be integers >= 1."""
_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts", "top_k_experts",
                 "shared_intermediate_size", "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size",
                 "first_k_dense_replace", "decoder_sparse_step", "interleave_moe_layer_step", "sliding_window",
                 "num_nextn_predict_layers", "mtp_num_hidden_layers", "kv_lora_rank", "q_lora_rank",
                 "qk_nope_head_dim", "qk_rope_head_dim",
                 "v_head_dim", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups",
                 "linear_num_value_heads", "linear_value_head_dim", "linear_num_key_heads", "linear_key_head_dim",
                 "moe_latent_size", "attention_head_dim", "global_head_dim", "num_global_key_value_heads",
                 "swa_num_attention_heads", "swa_num_key_value_heads", "swa_head_dim", "swa_v_head_dim",
                 "index_n_heads", "index_head_dim", "index_topk", "conv_kernel", "linear_conv_kernel_dim",
                 "full_attention_interval", "dense_intermediate_size", "intermediate_size_mlp", "share_expert_dim",
                 "attn_res_block_size", "routed_expert_hidden_size", "num_shared_experts", "o_groups",
                 "o_lora_rank", "hc_mult", "num_hash_layers")
"""config.json fields that, where given (and not null), must be integers >= 0 (0: the feature is off)."""


def _check_fields(path: Path, cfg: dict[str, Any]) -> None:
    """Type-check the (text) config's scalar fields before a parser reads them.

    The parsers read ``int(cfg[key])``: a string, a list or null was a TypeError or ValueError naming no
    field, NaN / Infinity (which json reads) a ValueError or OverflowError, 1.5 was truncated to 1 without a
    word, 0 heads a ZeroDivisionError and 0 layers a StopIteration; a negative context length was kept."""
    for key, low in (*((k, 1) for k in _POSITIVE_FIELDS), *((k, 0) for k in _COUNT_FIELDS)):
        value = cfg.get(key)
        if value is None:
            continue
        if not is_count(value, low):
            raise ValueError(f"{where(path, key)}: {key} must be an integer >= {low}, got {value!r}")
    tie = cfg.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):     # bool("false") is True
        raise ValueError(f"{where(path, 'tie_word_embeddings')}: tie_word_embeddings must be true or false, "
                         f"got {tie!r}")
    scaling = cfg.get("rope_scaling")
    if scaling is not None:
        factor = scaling.get("factor", 1) if isinstance(scaling, dict) else None
        if not is_rate(factor):
            raise ValueError(f"{where(path, 'rope_scaling')}: rope_scaling must be a mapping whose factor is a "
                             f"finite number > 0, got {scaling!r}")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if not cfg.get("head_dim") and not cfg.get("kv_lora_rank") and heads and hidden and hidden % heads:
        # head_dim defaults to hidden_size // num_attention_heads, which floored it without a word (MLA
        # models size their heads by qk_nope / qk_rope / v_head_dim instead).
        raise ValueError(f"{where(path, 'hidden_size')}: hidden_size {hidden} is not a multiple of "
                         f"num_attention_heads {heads}, and no head_dim is given")


def load_model(name: str) -> ModelSpec:
    """Load a model by Hugging Face id or alias; unknown names raise ValueError listing the valid ones."""
    hit = _index().get(name.strip().lower())
    if hit is None:
        raise unknown_name("model", name, sorted({c for c, _ in _index().values()}))
    return _load_canonical(hit[0])


@functools.cache
def _load_canonical(canonical: str) -> ModelSpec:
    entry = _index()[canonical.lower()][1]
    cfg, quant = _read_config(entry["config"])
    path = MODEL_DIR / f"{entry['config']}.json"
    text = cfg.get("text_config") or cfg
    if not isinstance(text, dict):
        raise ValueError(f"{where(path, 'text_config')}: text_config must be a JSON object, got {text!r}")
    model_type = str(text.get("model_type") or cfg.get("model_type", ""))
    parser = PARSERS.get(model_type)
    if parser is None:
        raise NotImplementedError(f"model {canonical!r}: model_type {model_type!r} is not supported yet")
    _check_fields(path, text)
    # Whatever the checks above leave for a parser to trip on (a missing field, a list where a mapping is
    # read) is an error naming the file and the field, not a bare KeyError / TypeError / AttributeError.
    try:
        weight, kv = _quant_dtypes(cfg, quant)
        dense_fmt = ""
        if model_type in DEEPSEEK_V4_TYPES:
            weight, dense_fmt, kv = deepseek_v4_formats(text, weight)
        layers = parser(text)
        if not layers:
            raise ValueError("the config describes no layers")
        unquantised = entry.get("unquantised")
        if unquantised is not None:
            kept = frozenset(map(str, unquantised))
        elif model_type == "gpt_oss" or _ignores_attention(cfg, text):
            kept = EXPERTS_ONLY
        else:
            kept = excluded_classes(quant, cfg, layers)
        spec = _spec(canonical, model_type, text, layers, entry.get("weight_dtype", weight),
                     entry.get("kv_dtype", kv), kept, dense_fmt)
        if model_type in DEEPSEEK_V4_TYPES and spec.mtp_layers:
            spec = attrs.evolve(spec, mtp_layer=deepseek_v4_mtp(text, layers))
        return spec
    except KeyError as exc:
        key = str(exc.args[0]) if exc.args else ""
        raise ValueError(f"{path}: missing field {key!r} (model_type {model_type!r} needs it)") from None
    except (TypeError, AttributeError, IndexError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise ValueError(f"{path}: model {canonical!r} (model_type {model_type!r}): {exc}") from None


def _spec(name: str, model_type: str, cfg: dict[str, Any], layers: list[Layer], weight: str,
          kv: str, unquantised: frozenset[str], dense_fmt: str = "") -> ModelSpec:
    attn = next((m for m, _ in layers if m is not None and m.is_attention), None)
    main = attn or next(m for m, _ in layers if m is not None)
    dense = next((f for _, f in layers if f is not None and f.kind == "dense"), None)
    ffn = dense or next(f for _, f in layers if f is not None)
    if main.kind == "mla":
        heads, kv_heads, head_dim = main.num_heads, main.num_heads, main.qk_nope_head_dim + main.qk_rope_head_dim
    elif main.kind == "csa":   # one KV vector per entry, shared by every head
        heads, kv_heads, head_dim = main.num_heads, 1, main.head_dim
    else:
        heads, kv_heads, head_dim = main.num_heads, main.num_kv_heads or main.num_heads, main.head_dim
    return ModelSpec(
        name=name, model_type=model_type, num_layers=len(layers), hidden_size=int(cfg["hidden_size"]),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=ffn.intermediate_size,
        vocab_size=int(cfg["vocab_size"]), tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mlp_gated=ffn.gated, default_weight_dtype=weight, default_kv_dtype=kv, unquantised=unquantised,
        dense_weight_dtype=dense_fmt if dense_fmt != weight else "",
        layers=tuple(layers), mtp_layers=_mtp_layers(cfg),
        residual_reads=_residual_reads(cfg, len(layers)), context_length=_context_length(cfg))


def _mtp_layers(cfg: dict[str, Any]) -> int:
    """ModelSpec.mtp_layers: DeepSeek's ``num_nextn_predict_layers`` or Qwen3.5's ``mtp_num_hidden_layers``."""
    return int(cfg.get("num_nextn_predict_layers") or cfg.get("mtp_num_hidden_layers") or 0)


def _residual_reads(cfg: dict[str, Any], n: int) -> float:
    """ModelSpec.residual_reads from the (text) config.

    Hyper-connections (``hc_mult`` streams; DeepSeek-V4's mHC, vLLM deepseek_v4.py): the residual is hc_mult
    hidden vectors wide through every layer, each sub-layer reading all of them to mix its input and writing
    all of them back, 2 x (hc_mult - 1) vectors more than a residual add (the mixing weights' small GEMM and
    Sinkhorn iterations, under 1 % of the FLOPs, are not priced).

    Block attention residuals (``attn_res_block_size`` b; Kimi-K3, "Attention Residuals", arXiv 2603.15031;
    SGLang layers/attn_residual.py): layer l's input is a softmax-weighted mix of the cdiv(l, b) block
    snapshots frozen so far and the running partial sum, so it reads cdiv(l, b) hidden vectors more than a
    residual add would; the FFN side of a layer that freezes a snapshot (l % b == 0) reads one more.
    """
    hc = int(cfg.get("hc_mult") or 0)
    if hc > 1:
        return 2.0 * (hc - 1)
    b = int(cfg.get("attn_res_block_size") or 0)
    if b <= 0:
        return 0.0
    mixer = sum(-(-i // b) for i in range(n))
    ffn = mixer + sum(1 for i in range(n) if i % b == 0)
    return (mixer + ffn) / (2 * n)


_CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                        "max_position_embeddings")


def _context_length(cfg: dict[str, Any]) -> int:
    """ModelSpec.context_length from the (text) config."""
    scaling = cfg.get("rope_scaling") or {}
    factor = scaling.get("factor", 1)
    if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
        factor = 1
    for key in _CONTEXT_LENGTH_KEYS:
        if cfg.get(key) is not None:
            return int(factor * cfg[key])
    return 2048
