"""GPU, model and engine loaders: names, aliases, errors, derived sizes."""

import pytest

from hardware import (DTYPE_BYTES, Deployment, list_engines, list_gpus, list_models, load_engine, load_gpu,
                      load_model)


def test_measured_gpu_names_load() -> None:
    for name in ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "gb200", "h100_pcie", "mi300x", "l40s"):
        assert load_gpu(name).name == name
    assert set(list_gpus()) >= {"a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "gb200"}


def test_h100_numbers_from_datasheet() -> None:
    gpu = load_gpu("h100_sxm")
    assert gpu.hbm_bw_Bps == 3.35e12
    assert gpu.peak_flops["bf16"] == 989e12 and gpu.peak_flops["fp8"] == 1979e12
    assert gpu.scaleup_bw_Bps == 450e9 and gpu.nic_bw_Bps == 50e9
    assert gpu.flops_for("fp4") == 1979e12      # no FP4 tensor cores on Hopper: FP8 rate


def test_unknown_names_raise_with_valid_list() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU 'h900'.*h100_sxm"):
        load_gpu("h900")
    with pytest.raises(ValueError, match=r"unknown model 'nope/Model'.*meta-llama/Llama-3.1-8B"):
        load_model("nope/Model")
    with pytest.raises(ValueError, match=r"unknown engine 'tgi'.*vllm"):
        load_engine("tgi")


def test_model_aliases_and_measured_paths() -> None:
    base = load_model("meta-llama/Llama-3.1-8B")
    assert load_model("meta-llama/Meta-Llama-3.1-8B") is base
    assert load_model("meta-llama/Llama-3.1-8B-Instruct") is base
    assert load_model("nvidia/Llama-3.1-8B-Instruct-FP8").default_weight_dtype == "fp8"
    assert load_model("meta-llama/Llama-3.1-70B").num_layers == 80
    assert load_model("Qwen/Qwen3-32B").head_dim == 128
    assert {"meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B", "Qwen/Qwen3-32B"} <= set(list_models())


def test_llama8b_dims_and_params() -> None:
    m = load_model("meta-llama/Llama-3.1-8B")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (32, 4096, 32, 8, 128)
    assert (m.intermediate_size, m.vocab_size, m.tie_word_embeddings) == (14336, 128256, False)
    per_layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert m.param_count == 32 * per_layer + 2 * 128256 * 4096 + 4096   # 8.03 B


def test_engine_yaml_fields_are_checked_by_name_and_type(tmp_path) -> None:
    from hardware.engine import engine_from_yaml
    path = tmp_path / "e.yaml"
    path.write_text("name: e\nsampler_s_per_vocab: 1e-10\n")   # YAML 1.1 reads this as the text '1e-10'
    with pytest.raises(ValueError, match=r"e.yaml: sampler_s_per_vocab must be a number, got '1e-10'"):
        engine_from_yaml(path)
    path.write_text("name: e\nhost_overlap: 1\n")
    with pytest.raises(ValueError, match="host_overlap must be true or false, got 1"):
        engine_from_yaml(path)
    path.write_text("name: e\nsampler_s_per_token: 1.0e-10\n")
    with pytest.raises(ValueError, match="unknown field 'sampler_s_per_token'; valid: name, version"):
        engine_from_yaml(path)
    path.write_text("name: e\nsampler_s_per_vocab: 1.0e-10\nversion: 1.0\n")
    assert engine_from_yaml(path).sampler_s_per_vocab == 1e-10 and engine_from_yaml(path).version == "1.0"


def test_engine_defaults() -> None:
    vllm = load_engine("vllm")
    assert (vllm.block_size, vllm.gpu_memory_utilization) == (16, 0.9)
    assert vllm.default_max_num_batched_tokens(load_gpu("h100_sxm")) == 8192
    assert vllm.default_max_num_seqs(load_gpu("h200_sxm")) == 1024
    assert vllm.default_max_num_batched_tokens(load_gpu("a100_sxm")) == 2048
    assert vllm.default_max_num_seqs(load_gpu("l40s")) == 256
    assert set(list_engines()) == {"vllm", "sglang", "trtllm"}


def test_vllm_capture_sizes() -> None:
    sizes = load_engine("vllm").cuda_graph_sizes(max_num_seqs=1024, max_num_batched_tokens=8192)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-2:] == (496, 512)
    assert 248 in sizes and 256 in sizes and 264 not in sizes and 272 in sizes
    small = load_engine("vllm").cuda_graph_sizes(max_num_seqs=8, max_num_batched_tokens=2048)
    assert small == (1, 2, 4, 8, 16)          # max = min(2 * 8, 512) = 16
    assert load_engine("vllm").cuda_graph_sizes(256, 100)[-1] == 96   # clamped by the token budget


def test_sglang_capture_sizes() -> None:
    sizes = load_engine("sglang").cuda_graph_sizes(1024, 8192, gpu=load_gpu("h100_sxm"), tp=1)
    assert sizes[:6] == (1, 2, 4, 8, 12, 16) and sizes[-1] == 256
    sizes8 = load_engine("sglang").cuda_graph_sizes(1024, 8192, gpu=load_gpu("h100_sxm"), tp=8)
    assert sizes8[-1] == 512 and 496 in sizes8 and 272 in sizes8


def test_trtllm_capture_sizes_follow_cuda_graph_config() -> None:
    """TRT-LLM CudaGraphConfig with enable_padding: [1, 2, 4] + multiples of 8 to 128, then powers of two
    below max_batch_size and max_batch_size itself (0 / unset: 128), never above the batch limit."""
    trt = load_engine("trtllm")
    default = trt.cuda_graph_sizes(2048, 8192)
    assert default == (1, 2, 4, *range(8, 129, 8))
    assert trt.cuda_graph_sizes(2048, 8192, max_size=1024)[-4:] == (128, 256, 512, 1024)
    assert trt.cuda_graph_sizes(2048, 8192, max_size=300)[-3:] == (128, 256, 300)
    assert trt.cuda_graph_sizes(16, 8192, max_size=16) == (1, 2, 4, 8, 16)
    assert trt.cuda_graph_sizes(12, 8192) == (1, 2, 4, 8, 12)      # capped by max_batch_size, itself captured


def test_capture_size_override_per_engine() -> None:
    """max_size replaces the engine's default largest capture (vLLM max_cudagraph_capture_size, SGLang
    cuda_graph_max_bs); the engines' own caps (token budget, running requests) still apply."""
    vllm = load_engine("vllm")
    sizes = vllm.cuda_graph_sizes(4, 8192, max_size=2048)   # gpt-oss InferenceMAX: --max-num-seqs CONC
    assert sizes[-3:] == (2016, 2032, 2048) and 264 not in sizes and 272 in sizes
    assert vllm.cuda_graph_sizes(4, 1000, max_size=2048)[-1] == 992
    sglang = load_engine("sglang")
    assert sglang.cuda_graph_sizes(1024, 8192, gpu=load_gpu("h100_sxm"), max_size=64)[-1] == 64
    # --max-running-requests 9: the pool size joins the list (get_batch_sizes_to_capture)
    assert sglang.cuda_graph_sizes(9, 8192, gpu=load_gpu("h100_sxm")) == (1, 2, 4, 8, 9)
    # an explicit list replaces the engine's, under the same caps
    assert vllm.cuda_graph_sizes(4, 512, sizes=(1, 2, 3, 100, 600)) == (1, 2, 3, 100)
    assert sglang.cuda_graph_sizes(8, 8192, gpu=load_gpu("h100_sxm"), sizes=(1, 2, 3, 10)) == (1, 2, 3, 8)
    assert load_engine("trtllm").cuda_graph_sizes(12, 8192, sizes=tuple(range(1, 13))) == tuple(range(1, 13))
    assert vllm.default_graph_mode == "full_and_piecewise"
    assert sglang.default_graph_mode == load_engine("trtllm").default_graph_mode == "full_decode_only"


def _llama8b(**kw: object) -> Deployment:
    return Deployment(gpu=load_gpu("h100_sxm"), model=load_model("meta-llama/Llama-3.1-8B"),
                      engine=load_engine("vllm"), **kw)  # type: ignore[arg-type]


def test_kv_bytes_per_token() -> None:
    assert _llama8b().kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert _llama8b(tp=2).kv_bytes_per_token == 131072 // 2
    assert _llama8b(tp=8).kv_bytes_per_token == 32 * 2 * 1 * 128 * 2
    assert _llama8b(kv_dtype="fp8").kv_bytes_per_token == 65536
    assert _llama8b().bytes_per_block(16) == 16 * 131072
    assert DTYPE_BYTES["bf16"] == 2


def test_kv_heads_replicated_when_fewer_than_tp() -> None:
    d = _llama8b(tp=16)                  # 8 KV heads over 16 GPUs: each GPU keeps one (replicated)
    assert d.kv_heads_per_gpu == 1
    assert d.kv_bytes_per_token == 32 * 2 * 1 * 128 * 2


def test_weight_bytes_and_capacity_known_case() -> None:
    dep = _llama8b()
    weights = 8030261248 * 2                        # every Llama-3.1-8B parameter in BF16
    assert dep.weight_bytes_per_gpu == weights
    activation = 8192 * (2 * 4096 + 3 * 14336) * 2 + 2 * 1024 * 128256 * 4
    reserve = activation + 2**30
    budget = 80 * 2**30 * 0.9
    expected = int((budget - weights - reserve) // (16 * 131072))
    assert dep.kv_capacity_blocks(16, 0.9) == expected == 27792


def test_static_memory_rule_leaves_the_activations_outside_the_fraction() -> None:
    """SGLang's mem_fraction_static covers weights + KV pool: only the runtime reserve is taken besides
    the weights (the activation peak and the graph buffers live in the rest of the HBM)."""
    import attrs
    dep = attrs.evolve(_llama8b(), engine=load_engine("sglang"))
    assert dep.engine.kv_memory_rule == "static"
    weights = 8030261248 * 2
    expected = int((80 * 2**30 * 0.836 - weights - 2**30) // 131072)
    assert dep.kv_capacity_blocks(1, 0.836) == expected == 417156   # blocks of one token (page size 1)
    # the same fraction under the vLLM rule also gives up the activation peak and the logits buffers
    total = attrs.evolve(_llama8b(), engine=attrs.evolve(load_engine("sglang"), kv_memory_rule="total"))
    assert total.kv_capacity_blocks(1, 0.836) < expected


def test_sglang_mem_fraction_static_heuristic_by_hand() -> None:
    """reserved MiB = 512 + 1.5 x max(chunk, 2048) + 2 x cuda_graph_max_bs + 1024 x GPUs / 8, at least
    10 GiB on GPUs over 60 GiB; fraction = round((memory - reserved) / memory, 3)."""
    sgl = load_engine("sglang")
    h100, h200, l40s = load_gpu("h100_sxm"), load_gpu("h200_sxm"), load_gpu("l40s")
    # H100 (81,920 MiB), TP1: 512 + 12288 + 512 + 128 = 13,440 MiB -> 68,480 / 81,920 = 0.8359
    assert sgl.default_memory_fraction(h100, gpus=1, chunked_prefill_size=8192, cuda_graph_max_bs=256) == 0.836
    # H200 (144,384 MiB), TP8: 512 + 12288 + 1024 + 1024 = 14,848 MiB -> 0.89716
    assert sgl.default_memory_fraction(h200, gpus=8, chunked_prefill_size=8192, cuda_graph_max_bs=512) == 0.897
    # a small chunk hits the 10 GiB floor: (81,920 - 10,240) / 81,920 = 0.875
    assert sgl.default_memory_fraction(h100, gpus=1, chunked_prefill_size=1024, cuda_graph_max_bs=8) == 0.875
    # DP attention (4 groups, graphs to 512): + 3 x 512 x 4 + 1.5 x 512 x 4 = 9,216 MiB beyond 14,848
    assert sgl.default_memory_fraction(h200, gpus=8, chunked_prefill_size=8192, cuda_graph_max_bs=512,
                                       dp_attention=4) == round((144384 - 14848 - 9216) / 144384, 3) == 0.833
    # an MTP / EAGLE draft: 2 GiB more
    assert sgl.default_memory_fraction(h100, gpus=1, chunked_prefill_size=8192, cuda_graph_max_bs=256,
                                       speculative=True) == round((81920 - 13440 - 2048) / 81920, 3) == 0.811
    # L40S (46,068 MiB, under 60 GiB: no floor): 512 + 6144 + 64 + 128 = 6,848 MiB -> 0.85135
    assert sgl.default_memory_fraction(l40s, gpus=1, chunked_prefill_size=4096, cuda_graph_max_bs=32) == 0.851
    # the defaults it is fed follow SGLang's memory tiers
    assert [sgl.default_max_num_batched_tokens(g) for g in (l40s, h100, h200, load_gpu("b200_sxm"))] == \
        [4096, 8192, 8192, 16384]
    assert [sgl.cuda_graph_max_bs(g, tp) for g in (l40s, h200) for tp in (1, 4)] == [32, 160, 256, 512]
    assert sgl.cuda_graph_max_bs(load_gpu("b200_sxm"), 1) == 512
    # vLLM keeps its fixed default whatever the deployment
    assert load_engine("vllm").default_memory_fraction(h100, gpus=8, chunked_prefill_size=8192,
                                                       cuda_graph_max_bs=512) == 0.9


def test_sglang_running_request_cap_from_its_kv_pool_by_hand() -> None:
    """min(T // 2, min(max(int(T / context x 512), 2048), 4096)) for a pool of T tokens; vLLM's is fixed."""
    sgl = load_engine("sglang")
    assert sgl.derives_max_num_seqs and not load_engine("vllm").derives_max_num_seqs
    # Llama-3.1 (131,072): 200,000 tokens -> int(781.25) = 781 -> 2,048 (floor), below 100,000
    assert sgl.pool_max_num_seqs(200_000, 131_072) == 2048
    # Qwen3 (40,960): 2,000,000 tokens -> 25,000 -> 4,096 (cap)
    assert sgl.pool_max_num_seqs(2_000_000, 40_960) == 4096
    # 300,000 tokens at 40,960: int(3,750.0) = 3,750
    assert sgl.pool_max_num_seqs(300_000, 40_960) == 3750
    # a small pool: 3,000 tokens -> 1,500 (half the pool) below 2,048
    assert sgl.pool_max_num_seqs(3_000, 131_072) == 1500
    assert load_engine("vllm").pool_max_num_seqs(200_000, 131_072) is None


def test_context_length_read_as_sglang_reads_it() -> None:
    from hardware.model import _context_length
    assert load_model("meta-llama/Llama-3.1-8B").context_length == 131072      # llama3 rope: factor ignored
    assert load_model("openai/gpt-oss-120b").context_length == 131072           # yarn with an original length
    assert load_model("Qwen/Qwen3-32B").context_length == 40960                  # no rope scaling
    linear = {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}
    assert _context_length(linear) == 16384
    assert _context_length({"seq_length": 8192, "max_position_embeddings": 4096}) == 8192   # key order
    assert _context_length({}) == 2048


def test_deployment_feeds_the_heuristic_its_own_limits() -> None:
    import attrs
    dep = Deployment(gpu=load_gpu("h100_sxm"), model=load_model("Qwen/Qwen3-32B"), engine=load_engine("sglang"),
                     tp=4)
    # 4 GPUs, default chunk 8192 and cuda_graph_max_bs 512 (TP >= 4): 512 + 12288 + 1024 + 512 = 14,336 MiB
    assert dep.default_memory_fraction() == round((81920 - 14336) / 81920, 3) == 0.825
    assert dep.default_memory_fraction(max_num_batched_tokens=16384, cuda_graph_max_bs=64) == \
        round((81920 - (512 + 24576 + 128 + 512)) / 81920, 3)
    with pytest.raises(ValueError, match="memory_fraction_rule 'guess'"):
        attrs.evolve(load_engine("sglang"), memory_fraction_rule="guess")


def test_free_memory_rule_takes_the_fraction_after_weights() -> None:
    """TensorRT-LLM's free_gpu_memory_fraction applies to what weights and the reserve leave over."""
    import attrs
    dep = attrs.evolve(_llama8b(), engine=attrs.evolve(load_engine("vllm"), kv_memory_rule="free"))
    weights = 8030261248 * 2
    reserve = 8192 * (2 * 4096 + 3 * 14336) * 2 + 2 * 1024 * 128256 * 4 + 2**30
    expected = int((80 * 2**30 - weights - reserve) * 0.9 // (16 * 131072))
    assert dep.kv_capacity_blocks(16, 0.9) == expected == 28699   # 907 blocks more than the total rule (27792)
    assert load_engine("trtllm").kv_memory_rule == "free"
    with pytest.raises(ValueError, match="kv_memory_rule 'half'"):
        attrs.evolve(load_engine("vllm"), kv_memory_rule="half")


def test_model_too_big_raises_with_numbers() -> None:
    dep = Deployment(gpu=load_gpu("h100_sxm"), model=load_model("meta-llama/Llama-3.1-70B"),
                     engine=load_engine("vllm"), tp=1)
    with pytest.raises(ValueError, match=r"does not fit on h100_sxm.*weights 1[0-9][0-9]\.\d\d GiB"):
        dep.kv_capacity_blocks(16, 0.9)


def test_bad_deployment_values() -> None:
    with pytest.raises(ValueError, match="weight_dtype 'int3'"):
        _llama8b(weight_dtype="int3")
    with pytest.raises(ValueError, match="tp=3"):
        _llama8b(tp=3)
    with pytest.raises(ValueError, match="tp must be >= 1"):
        _llama8b(tp=0)


def test_import_is_light() -> None:
    """hardware never imports simpy or twin, and reads no data file at import time."""
    import subprocess
    import sys
    code = ("import sys, hardware, hardware.model as m, hardware.gpu as g; "
            "assert 'simpy' not in sys.modules and 'twin' not in sys.modules; "
            "assert m._index.cache_info().currsize == 0 and g._load_shipped.cache_info().currsize == 0")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_precision_labels_map_to_checkpoint_formats() -> None:
    assert load_model("deepseek-ai/DeepSeek-R1").weight_dtype_for("fp8") == "fp8_block"   # block-scaled ckpt
    assert load_model("nvidia/Llama-3.1-70B-Instruct-FP8").weight_dtype_for("fp8") == "fp8"
    assert load_model("openai/gpt-oss-120b").weight_dtype_for("nvfp4") == "fp4"
    assert load_model("Qwen/Qwen3-32B").weight_dtype_for("") == "bf16"
    with pytest.raises(ValueError, match="unknown precision 'fp3'"):
        load_model("Qwen/Qwen3-32B").weight_dtype_for("fp3")


def test_nvidia_deepseek_nvfp4_checkpoints_load_as_nvfp4_with_fp8_kv() -> None:
    """nvidia/DeepSeek-R1-NVFP4 (and the -0528-NVFP4-v2 name InferenceMAX runs) is DeepSeek-R1 with NVFP4
    weights and an FP8 KV cache, as nvidia/DeepSeek-V3.1-NVFP4's hf_quant_config.json says."""
    import hardware

    base = hardware.load_model("deepseek-ai/DeepSeek-R1")
    for name in ("nvidia/DeepSeek-R1-NVFP4", "nvidia/DeepSeek-R1-0528-NVFP4-v2", "nvidia/DeepSeek-R1-FP4"):
        m = hardware.load_model(name)
        assert m.name == "nvidia/DeepSeek-R1-NVFP4"
        assert (m.default_weight_dtype, m.default_kv_dtype) == ("fp4", "fp8")
        assert m.layers == base.layers and m.mtp_layers == 1
    v3 = hardware.load_model("nvidia/DeepSeek-V3-0324-FP4")
    assert (v3.name, v3.default_weight_dtype, v3.default_kv_dtype) == ("nvidia/DeepSeek-V3-NVFP4", "fp4", "fp8")


def test_qwen3_5_mtp_module_is_a_full_attention_moe_layer() -> None:
    """Qwen3.5 names its next-token-prediction module ``mtp_num_hidden_layers`` (DeepSeek:
    ``num_nextn_predict_layers``); the draft is a full-attention MoE layer (vLLM's Qwen3NextMultiTokenPredictor
    builds it with layer_type full_attention), which is the kind of the model's last layer. Its KV counts only
    when the deployment drafts with it."""
    model = load_model("Qwen/Qwen3.5-397B-A17B")
    assert model.mtp_layers == 1 and load_model("Qwen/Qwen3-32B").mtp_layers == 0
    plain = Deployment(gpu=load_gpu("b300_sxm"), model=model, engine=load_engine("sglang"), tp=4)
    drafting = Deployment(gpu=load_gpu("b300_sxm"), model=model, engine=load_engine("sglang"), tp=4, spec_tokens=3)
    mixer, ffn = drafting.draft_layer
    assert mixer is not None and mixer.kind == "gqa" and ffn is not None and ffn.kind == "moe"
    full_layers = sum(n for (m, _), n in model.layer_groups if m is not None and m.kind == "gqa")
    assert full_layers == 15
    assert drafting.kv_bytes_per_token * full_layers == plain.kv_bytes_per_token * (full_layers + 1)


def test_modelopt_kv_cache_scheme_of_8_bit_floats_is_an_fp8_kv_cache() -> None:
    """nvidia/Kimi-K2.5-NVFP4's config.json gives its KV format as kv_cache_scheme {num_bits 8, type float}."""
    import hardware

    m = hardware.load_model("nvidia/Kimi-K2.5-NVFP4")
    assert (m.default_weight_dtype, m.default_kv_dtype) == ("fp4", "fp8")
