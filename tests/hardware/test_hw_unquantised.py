"""Linear layers a quantised checkpoint keeps in BF16 (ModelSpec.unquantised): read from NVIDIA's ModelOpt
``exclude_modules``, priced as BF16 GEMMs, settable from the config (model.unquantised) and set by the
harness for the NVFP4 checkpoints InferenceMAX served."""

from __future__ import annotations

import attrs
import pytest

from hardware import Deployment, load_engine, load_gpu, load_model
from hardware.dtypes import DTYPE_BYTES
from hardware.model import excluded_classes
from twin.config import load_config
from twin.core.errors import ConfigError
from twin.system import make_deployment


@pytest.mark.parametrize("name, classes", [
    # q_a / q_b / kv_a_proj_with_mqa / kv_b_proj of every layer; o_proj, shared experts, dense MLPs quantised
    ("nvidia/DeepSeek-V3.1-NVFP4", {"attention_in"}),
    ("nvidia/DeepSeek-V3.2-NVFP4", {"attention_in", "indexer"}),
    ("nvidia/GLM-5-NVFP4", {"attention_in", "attention_out", "indexer"}),
    # self_attn* of the 15 full-attention layers, linear_attn* of the 45 DeltaNet ones, shared_expert*
    ("nvidia/Qwen3.5-397B-A17B-NVFP4", {"attention_in", "attention_out", "linear_attention", "shared_experts"}),
    # layers.0* (the dense layer), shared_experts*, self_attn*
    ("nvidia/Kimi-K2.6-NVFP4", {"attention_in", "attention_out", "shared_experts", "dense_mlp"}),
    # config.json's quantization_config.ignore (quant_method modelopt), self_attn* only
    ("nvidia/Kimi-K2.5-NVFP4", {"attention_in", "attention_out"}),
    ("nvidia/MiniMax-M2.5-NVFP4", {"attention_in", "attention_out"}),
    ("nvidia/Qwen3-235B-A22B-NVFP4", set()),                    # the routers and lm_head only
    ("nvidia/DeepSeek-V4-Pro-NVFP4", set()),                     # mixed precision: formats listed per layer
    ("nvidia/DeepSeek-R1-0528-NVFP4-v2", {"attention_in"}),     # aliases.yaml, as DeepSeek-V3.1-NVFP4
    ("deepseek-ai/DeepSeek-V3", set()),
])
def test_shipped_checkpoints_keep_these_classes_bf16(name: str, classes: set[str]) -> None:
    assert load_model(name).unquantised == classes


def test_a_class_needs_half_its_layers_excluded() -> None:
    """Patterns naming a few layers (or the MTP layer past the decoder) leave the class quantised."""
    layers = list(load_model("deepseek-ai/DeepSeek-V3").layers)      # 61 MLA layers, 3 dense, 58 MoE
    quant = {"quantization": {"quant_algo": "NVFP4", "exclude_modules": [
        *(f"model.layers.{i}.self_attn.o_proj" for i in range(30)),          # 30 of 61: not half
        *(f"model.layers.{i}.self_attn.q_a_proj" for i in range(31)),        # 31 of 61
        "model.layers.61*", "model.layers.0*", "model.layers.1*", "model.layers.2*", "lm_head"]}}
    assert excluded_classes(quant, {}, layers) == {"attention_in", "dense_mlp"}


def _by_name(dep: Deployment) -> dict[str, bool]:
    model = dep.model
    (mixer, _), _ = model.layer_groups[-1]
    moe = next(f for _, f in model.layers if f is not None and f.kind == "moe")
    dense = next(f for _, f in model.layers if f is not None and f.kind == "dense")
    assert mixer is not None
    lins = dep.mixer_linears(mixer) + dep.ffn_linears(moe) + dep.ffn_linears(dense)
    return {lin.name: lin.quantized for lin in lins}


def test_deepseek_nvfp4_prices_its_mla_projections_bf16() -> None:
    gpu, engine = load_gpu("b300_sxm"), load_engine("trtllm")
    nvfp4 = Deployment(gpu=gpu, model=load_model("nvidia/DeepSeek-R1-0528-NVFP4-v2"), engine=engine, tp=8, ep=8)
    assert _by_name(nvfp4) == {"q_a_proj": False, "q_b_proj": False, "kv_a_proj": False, "o_proj": True,
                               "router": False, "shared_up": True, "shared_down": True, "up_proj": True,
                               "down_proj": True}
    every = attrs.evolve(nvfp4, model=attrs.evolve(nvfp4.model, unquantised=frozenset()))
    # The four projections of a layer (kv_b inside attention) take 2 bytes a weight instead of NVFP4's
    mla = next(m for m, _ in nvfp4.model.layers if m is not None)
    elems = sum(lin.n * lin.k for lin in nvfp4.mixer_linears(mla) if lin.name != "o_proj") + nvfp4.mla_kv_b_elems(mla)
    per_layer = elems * (2.0 - DTYPE_BYTES["fp4"])
    assert nvfp4.weight_bytes_per_gpu - every.weight_bytes_per_gpu == pytest.approx(61 * per_layer, rel=1e-9)


def test_qwen35_nvfp4_keeps_deltanet_and_shared_experts_bf16() -> None:
    dep = Deployment(gpu=load_gpu("b300_sxm"), model=load_model("nvidia/Qwen3.5-397B-A17B-NVFP4"),
                     engine=load_engine("sglang"), tp=4)
    gdn = next(m for m, _ in dep.model.layers if m is not None and m.kind == "gdn")
    moe = next(f for _, f in dep.model.layers if f is not None and f.kind == "moe")
    assert {lin.quantized for lin in dep.mixer_linears(gdn)} == {False}
    assert [lin.quantized for lin in dep.ffn_linears(moe)] == [False, False, False]   # router, shared up / down


def test_config_sets_the_classes() -> None:
    base = {"hardware": {"gpu": "b300_sxm"}, "engine": {"name": "vllm"}}
    cfg = load_config({**base, "model": {"name": "moonshotai/Kimi-K2.5", "weight_dtype": "fp4",
                                         "unquantised": ["attention_in", "attention_out"]}})
    dep = make_deployment(cfg, 8)
    # the INT4 checkpoint quantises its routed experts alone; the NVFP4 layout also its shared experts
    assert (dep.model.quant_scope, dep.model.unquantised) == ("all", {"attention_in", "attention_out"})
    assert _by_name(dep)["shared_up"] and not _by_name(dep)["q_a_proj"]
    plain = make_deployment(load_config({**base, "model": {"name": "moonshotai/Kimi-K2.5", "weight_dtype": "fp4"}}), 8)
    assert plain.model.quant_scope == "experts" and not _by_name(plain)["shared_up"]
    with pytest.raises(ConfigError, match="model.unquantised.*attention_in.*'attn'"):
        load_config({**base, "model": {"name": "moonshotai/Kimi-K2.5", "unquantised": ["attn"]}})


def test_harness_names_the_served_checkpoints_classes() -> None:
    from validation.harness_launch import harness_unquantised
    from validation.row_spec import row_spec

    row = {"id": "r", "silicon_data_source": "", "backend": "trtllm", "backend_version": "", "model_path":
           "deepseek-ai/DeepSeek-R1", "system": "b300_sxm", "precision": "fp4", "mode": "agg", "isl": "1024",
           "osl": "1024", "batch_size": "4", "tp_size": "8", "pp_size": "1", "attention_dp_size": "1",
           "moe_tp_size": "1", "moe_ep_size": "8", "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"}
    assert harness_unquantised(row, row_spec(row)) == {"unquantised": ["attention_in"]}
    fp8 = {**row, "precision": "fp8"}
    assert harness_unquantised(fp8, row_spec(fp8)) == {}
