"""How a row's engine decoded, beyond its launch limits: MTP speculative decoding and its acceptance, the
sampler the requests asked for, and the routed-expert (MoE) kernel the harness or the engine version chose.
"""

from __future__ import annotations

from validation import inferencemax_blackwell
from validation.measured_rows import RowSpec, measured_day
from validation.protocols import GENAI_PERF, HOPPER, INFERENCEMAX, Protocol


MTP_ACCEPTANCE = 0.85
"""Acceptance probability of the first MTP draft of DeepSeek-R1, from a published source and not fitted on
the rows: the DeepSeek-V3 Technical Report (arXiv 2412.19437, section 5.4.3 "Multi-Token Prediction
Evaluation") measures the acceptance of the second token predicted by the MTP module at 85-90 % "across
various generation topics" (DeepSeek-V3's own outputs, one draft token); the lower end is used because
InferenceMAX's prompts are random tokens (vLLM benchmark_serving --dataset-name random, through the chat
template), on which no acceptance is published. DeepSeek-R1 keeps DeepSeek-V3's MTP module (same
architecture)."""

MTP_ACCEPTANCE_LATER = 0.63
"""Conditional acceptance of each later MTP draft (2nd, 3rd, ...: TensorRT-LLM's MTP Eagle path and SGLang's
EAGLE worker re-run the one module on its own drafts), from a published source and not fitted on the rows:
nebius/MTP-DeepSeek-V3-0324's model card (2026) measures DeepSeek-V3-0324's original MTP module at an
average acceptance length of 3.20 tokens per verification with 7 drafts at temperature 0 (MT-bench,
HumanEval and GSM8K; the length counts the verified token), and explains the shortfall: the module "was
trained primarily for first-token prediction and reused autoregressively for later positions, causing
degraded acceptance rates at later draft positions". With the first draft at MTP_ACCEPTANCE, a constant
conditional rate q for the other six gives 1 + 0.85 (1 + q + ... + q^6) = 3.20 at q = 0.629. Chains of 3
drafts then verify 2.72 tokens a step (3.19 with 0.85 at every position)."""


def mtp_acceptance(drafts: int) -> list[float]:
    """Per-position conditional acceptance of a chain of ``drafts`` MTP drafts (MTP_ACCEPTANCE, then
    MTP_ACCEPTANCE_LATER)."""
    return [MTP_ACCEPTANCE] + [MTP_ACCEPTANCE_LATER] * (drafts - 1)


def harness_speculative(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> int:
    """MTP draft tokens the row's harness ran (0: none).

    InferenceMAX DeepSeek-R1 TRT-LLM aggregated rows measured 2026-01-14: the run that merge bf34567
    triggered queued only the dsr1-*-trt-mtp configurations; dsr1_fp8_h200_trt_mtp_slurm.sh (bf34567) sets
    speculative_config decoding_type MTP with num_nextn_predict_layers 3, or 1 when DP_ATTENTION is true
    (nvidia-master.yaml dsr1-fp8-h200-trt-mtp: dp-attn from CONC 128 at 1k/1k, 256 at 1k/8k, 64 at 8k/1k,
    which the rows' attention-DP columns carry). Disaggregated rows: the matched config entry's recipe
    (:func:`inferencemax_disagg.deployment`). Aggregated InferenceMAX rows on Blackwell: the
    ``speculative_tokens`` of their script's launch (SGLang's EAGLE chain: --speculative-num-steps drafts with
    top-k 1; validation/inferencemax_blackwell.py).
    """
    if spec.mode == "disagg":
        return spec.spec_tokens
    if proto is INFERENCEMAX and "deepseek" in spec.model.lower() and spec.backend == "trtllm" \
            and measured_day(row) == "2026-01-14":
        assert spec.agg is not None
        return 1 if spec.agg.dp > 1 else 3
    if proto is INFERENCEMAX and spec.gpu not in HOPPER:
        launch = inferencemax_blackwell.find(row)
        return int(launch["launch"].get("speculative_tokens", 0)) if launch is not None else 0
    return 0


def harness_spec_overlap(spec: "RowSpec") -> bool | None:
    """Whether the row's launch keeps the overlap scheduler on while drafting, where it sets what the engine
    would not do by itself (None: the engine's rule, EngineProfile.speculative_overlap).

    SGLang disaggregated MTP rows: their srt-slurm recipes set SGLANG_ENABLE_SPEC_V2=1 on the prefill and
    decode workers (recipes/h200/1k1k/bs256-1p6d-dep-mtp.yaml, the copy in csahithi/srt-slurm at 44b22ab;
    the other recipes of the configs in validation/harness/inferencemax_disagg.json were not read), which keeps
    SGLang's overlap scheduler on under EAGLE. The single-node scripts set no such variable.
    """
    if spec.mode == "disagg" and spec.backend == "sglang":
        return True
    return None


GENERATION_CONFIG_TOP_P = frozenset({
    "Qwen/Qwen3-32B", "Qwen/Qwen3-235B-A22B-FP8",                               # temperature 0.6, top_k 20, top_p 0.95
    "meta-llama/Llama-3.1-8B-Instruct", "nvidia/Llama-3.1-8B-Instruct-FP8",     # temperature 0.6, top_p 0.9
})
"""The genai-perf rows' models whose generation_config.json (their Hugging Face repositories) sets a top-p
filter, so a request that inherits its defaults samples with top-k / top-p."""
GENERATION_CONFIG_ENGINES = ("vllm",)
"""Engines that apply a model's generation_config sampling defaults to requests that set none: vLLM
(--generation-config, whose default ModelConfig sets to ``auto``, the model's own file, in the 2025
releases before 0.12; the option came with vllm-project/vllm#11164, defaulting to none at first)."""


def harness_sampling(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> str:
    """What the row's requests asked the sampler for (engine.sampling).

    genai-perf as aiconfigurator runs it (961028348 eval/benchmarks/genai_perf_runner.py) sends max_tokens,
    min_tokens and ignore_eos and no sampling parameters, so an engine of GENERATION_CONFIG_ENGINES samples
    with the model's defaults (GENERATION_CONFIG_TOP_P): top-k / top-p. InferenceMAX's benchmark_serving
    asks for temperature 0.0 (utils/bench_serving/backend_request_func.py at e28c038f8): greedy.
    """
    if proto is GENAI_PERF and spec.backend in GENERATION_CONFIG_ENGINES \
            and spec.model in GENERATION_CONFIG_TOP_P:
        return "top_k_top_p"
    return "greedy"


def harness_moe_kernel(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> str:
    """The routed-expert kernel family the row's harness selected (``default``: the engine's own).

    InferenceMAX gpt-oss-120b on vLLM from cec542a9a (merged 2026-03-27T08:01:48Z, vLLM 0.18.0; the rows
    measured 2026-03-27): gptoss_fp4_h100.sh:28 and gptoss_fp4_h200.sh:47 export VLLM_MXFP4_USE_MARLIN=1,
    so the MXFP4 experts run vLLM's Marlin w4a16 kernel instead of OpenAI's triton_kernels (the opdb times
    both: validation/harness/inferencemax_flags.md). The 2025-11 scripts do not set it.
    """
    if proto is INFERENCEMAX and spec.backend == "vllm" and "gpt-oss" in spec.model.lower() \
            and measured_day(row) >= "2026-03-27":
        return "marlin"
    return "default"


def engine_moe_kernel(row: dict[str, str], spec: "RowSpec") -> str:
    """The routed-expert kernel the row's engine version picks by default (``default``: the engine profile's).

    vLLM 0.12 on Hopper with block-FP8 experts runs DeepGEMM's contiguous grouped GEMM at every batch size,
    decode included (vllm-project/vllm at the 0.12 line):
    * quantization/fp8.py get_fp8_moe_backend: block-quantized weights on SM90 with VLLM_USE_DEEP_GEMM and
      VLLM_MOE_USE_DEEP_GEMM (both default on) and deep_gemm installed -> Fp8MoeBackend.DEEPGEMM; only
      "TP size >= 8" turns it off by default (PR #29346, merged 2025-11-24; before it, not even that);
    * utils/deep_gemm.py is_deep_gemm_e8m0_used() is true on Hopper by default since PR #26197 ("Enable E8M0
      by Default on Hopper for DeepGEMM", Oct 2025), so TritonOrDeepGemmExperts picks DeepGemmExperts for
      any M (``is_deep_gemm_e8m0_used() or _valid_deep_gemm(...)``: the M >= 128 shape test that would send
      decode to Triton is short-circuited);
    * fused_moe/deep_gemm_utils.py compute_aligned_M sizes the layout to M x topk + local_experts x 127 rows
      when the per-expert counts are not on the CPU (no EP all-to-all), and DeepGEMM's SM90 contiguous
      kernel walks every 128-row block of it (is_computation_valid only skips the MMAs of padding blocks).
    The serving images carry DeepGEMM (ai-dynamo/dynamo container/deps/vllm/install_vllm.sh installs it with
    vLLM's tools/install_deepgemm.sh). Applied to vLLM 0.12.x rows with block-FP8 experts on Hopper with
    fewer than 8 GPUs per engine (both readings of the TP >= 8 rule, attention TP or the MoE group, agree
    there).

    Later versions do not run DeepGEMM for these configurations by default (read from the v0.16.0 and v0.18.0
    release sources on PyPI; the InferenceMAX MiniMax-M2.5 scripts set no VLLM_* variable and no
    --moe-backend, and the vllm/vllm-openai images carry both DeepGEMM and FlashInfer, docker/Dockerfile
    install_deepgemm.sh and flashinfer-cubin / flashinfer-jit-cache 0.6.3 resp. 0.6.6); on Hopper block-FP8 they run:
    * 0.16.0: fused_moe/oracle/fp8.py:154-166 tries AITER, FLASHINFER_TRTLLM, FLASHINFER_CUTLASS, DEEPGEMM, ...
      in that order on every GPU (:317-338); FLASHINFER_TRTLLM is Blackwell-only (flashinfer_trtllm_moe.py:30-33)
      and FlashInferExperts accepts block-FP8 on SM90
      (flashinfer_cutlass_moe.py:121-125, device check :86-97), so Hopper block-FP8 MoE runs FlashInfer's
      CUTLASS fused MoE, with or without EP (vllm issue #34249 reports it on 0.15.2rc1 H100; 0.18.0 below
      reorders it). InferenceMAX MiniMax-M2.5 H200 TP4 (a36346339, no --enable-expert-parallel).
    * 0.18.0: oracle/fp8.py:85-95 puts TRITON first on SM90 block-FP8 when ep_size == 1 and FLASHINFER_CUTLASS
      first when ep_size > 1 (--enable-expert-parallel: ep_size = TP, fused_moe/config.py:1083-1124).
      InferenceMAX MiniMax-M2.5 H100 TP4 / EP4 and H200 TP8 / EP8 (1d5cae141, 0f78cf4eb: both pass
      --enable-expert-parallel) run FlashInfer CUTLASS.
    So vLLM 0.16.x rows with block-FP8 experts on Hopper, and 0.18.x ones with expert parallelism (the EP the
    harness ran: _inferencemax_parallel maps the 0.18 MiniMax rows' --enable-expert-parallel to EP over the
    TP group even where the export says ep 1), get ``flashinfer``: the curve fitted on the vLLM 0.24 opdb
    fp8_block rows of kernel_source vllm_fp8moe_flashinfer_cutlass_flashinferexperts (hardware.calibrate
    moe_curve_subsets). 0.18.x without EP keeps the default curve, fitted on the same table's Triton rows.
    The opdb times FlashInfer CUTLASS only at moe_tp 1 with EP 2-256; the 0.16 TP4 rows (moe_tp 4, EP 1)
    take the curve at a shard width it was not timed at.

    SGLang keeps the default everywhere. Checked for the InferenceMAX Qwen3.5-397B-A17B-FP8 H200 runs
    (lmsysorg/sglang:v0.5.9-cu129-amd64, f65d6b4b1:.github/configs/nvidia-master.yaml:1977-1978; script
    qwen3.5_fp8_h200.sh:30-53: --tp 8 --expert-parallel-size 8, no --moe-a2a-backend / --moe-runner-backend,
    no SGLANG_* variable), read from the sglang 0.5.9 PyPI sdist (paths under sglang/srt/):
    * server_args.py:495-498 defaults moe_a2a_backend "none", moe_runner_backend "auto"; the Qwen3.5 branch
      (:1579-1605) changes the runner only on SM100 (flashinfer_trtllm), and _handle_a2a_moe (:2177-2228)
      touches nothing without an a2a backend;
    * layers/moe/ep_moe/layer.py:686-714 get_moe_impl_class -> FusedMoE (DeepEPMoE needs deepep / mooncake);
    * layers/quantization/fp8.py:689-701 + :1347-1351 Fp8MoEMethod: auto -> DEEP_GEMM only with
      ENABLE_JIT_DEEPGEMM *and* a deepep / mooncake a2a backend, else TRITON;
    * layers/moe/token_dispatcher/standard.py:147-174 maps other ranks' experts to -1;
      layers/moe/moe_runner/triton.py:454-456 aligns only the local experts (BLOCK_SIZE_M per expert), and
      fused_moe_triton_kernels.py:192-199 writes zeros for the -1 blocks (no weight load, no MMA): a
      batch-dependent grouped GEMM over the rank's own (token, expert) pairs, no fixed-capacity padding.
      No tuned config ships for E=64, N=1024 on H200 (fused_moe_triton/configs), so the default block-FP8
      config (BLOCK_SIZE_M 64, fused_moe_triton_config.py:175-184) runs.
    That is the kernel of the opdb sglang-0.5.9 fp8_block moe_perf rows (kernel_source
    sglang_fused_moe_triton, moe_ep_size 1-256, incl. shapes without tuned configs) that the default
    fp8_block curve is fitted on. The gated-DeltaNet decode there is FLA Triton
    fused_sigmoid_gating_delta_rule_update (hybrid_linear_attn_backend.py:845-857; the CuTe DSL kernel is
    opt-in, environ.py:189 SGLANG_USE_CUTEDSL_GDN_DECODE=False), per-request state, no padding either.
    """
    import hardware

    version = row.get("backend_version", "").strip()
    if spec.backend != "vllm" or not version.startswith(("0.12.", "0.16.", "0.18.")):
        return "default"
    if spec.weight_dtype != "fp8_block" or spec.gpu not in HOPPER or not hardware.load_model(spec.model).is_moe:
        return "default"
    if version.startswith("0.16."):
        return "flashinfer"
    pars = [spec.agg] if spec.mode == "agg" else [spec.prefill, spec.decode]
    if version.startswith("0.18."):
        return "flashinfer" if all(p is not None and p.ep > 1 for p in pars) else "default"
    if any(p is None or p.gpus >= 8 for p in pars):
        return "default"
    return "deepgemm"
