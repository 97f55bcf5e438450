"""KV page sizes the engines pick by GPU and model when the launch sets none."""

from hardware import load_engine, load_gpu, load_model


def test_sglang_takes_64_token_pages_for_deepseek_v3_on_blackwell() -> None:
    """SGLang's trtllm_mla default on SM100 for DeepseekV3ForCausalLM forces pages of 64 tokens; elsewhere
    its radix cache pages one token, and vLLM's default stays 16."""
    sglang, vllm = load_engine("sglang"), load_engine("vllm")
    r1 = load_model("deepseek-ai/DeepSeek-R1").model_type
    assert r1 == "deepseek_v3"
    assert [sglang.default_block_size(load_gpu(g), r1) for g in ("b200_sxm", "gb200", "b300_sxm", "gb300")] == [64] * 4
    assert sglang.default_block_size(load_gpu("h200_sxm"), r1) == 1
    assert sglang.default_block_size(load_gpu("b300_sxm"), load_model("Qwen/Qwen3-32B").model_type) == 1
    assert vllm.default_block_size(load_gpu("b300_sxm"), r1) == 16


def test_sglang_selects_the_trtllm_gen_moe_for_quantised_deepseek_on_blackwell() -> None:
    """server_args' SM100 adjustment for DeepseekV3ForCausalLM: fp8 / modelopt_fp8 / modelopt_fp4 checkpoints
    run --moe-runner-backend flashinfer_trtllm unless told otherwise; BF16, Hopper, attention-DP engines,
    other models and other engines keep their own kernel."""
    sglang, vllm = load_engine("sglang"), load_engine("vllm")
    b300, h200 = load_gpu("b300_sxm"), load_gpu("h200_sxm")
    assert [sglang.default_moe_kernel(b300, "deepseek_v3", w) for w in ("fp8_block", "fp8", "fp4", "bf16")] == \
        ["flashinfer_trtllm"] * 3 + ["default"]
    assert sglang.default_moe_kernel(h200, "deepseek_v3", "fp8_block") == "default"
    assert sglang.default_moe_kernel(b300, "deepseek_v3", "fp4", attn_dp=8) == "default"   # DeepEP recipes
    assert sglang.default_moe_kernel(b300, "qwen3_moe", "fp8_block") == "default"
    # The family handler also takes DeepSeek-V3.2 and GLM-5 (GlmMoeDsaForCausalLM), sparse attention and all.
    assert [sglang.default_moe_kernel(b300, t, "fp8_block") for t in ("deepseek_v32", "glm_moe_dsa")] == \
        ["flashinfer_trtllm"] * 2
    assert sglang.default_moe_kernel(h200, "glm_moe_dsa", "fp8_block") == "default"
    assert vllm.default_moe_kernel(b300, "deepseek_v3", "fp4") == "default"
