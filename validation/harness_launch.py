"""The engine launch flags each harness ran a row with: scheduler limits, KV-cache dtype and memory
fraction, prefix caching and CUDA-graph settings, by benchmark client, engine, model and measurement date
(the launch scripts and generator rules cited per rule); and the rows whose launch the twin cannot
reproduce.
"""

from __future__ import annotations

import re
from typing import Any

from twin.core.kv_cache import cdiv
from validation import inferencemax_blackwell
from validation.harness_decoding import harness_speculative
from validation.measured_rows import RowSpec, measured_day
from validation.protocols import GENAI_PERF, HOPPER, INFERENCEMAX, INFERENCEMAX_TRT_TOKEN_FLOOR_SINCE, Protocol


def harness_skip(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> str | None:
    """Why the twin cannot reproduce how a row was run, read from its harness (None: it can).

    InferenceMAX gpt-oss-120b H100 vLLM, measured 2025-12-05 / 2025-12-08 (silicon_concurrency 512):
    gptoss_fp4_h100_docker.sh as of 25506e8 sent 512 concurrent requests to a server capped at
    --max-num-seqs $CONC, whose value the row does not keep. (Sources: InferenceX history, research notes
    of 2026-11-29.) The DeepSeek-R1 TRT-LLM rows measured 2026-01-14 ran MTP speculative decoding, which the
    twin represents (:func:`harness_speculative`).
    """
    if proto is not INFERENCEMAX:
        return None
    model, day = spec.model.lower(), measured_day(row)
    if "gpt-oss" in model and spec.backend == "vllm" and spec.gpu == "h100_sxm" and day in ("2025-12-05", "2025-12-08"):
        return ("harness: the client ran 512 requests at once against a server capped at --max-num-seqs CONC "
                "(gptoss_fp4_h100_docker.sh, 25506e8), and that cap is not in the row")
    return None


def blackwell_settings(row: dict[str, str], spec: "RowSpec") -> dict[str, Any]:
    """The launch settings of an aggregated row's InferenceMAX Blackwell (B300, B200) script for its launched
    layout and per-rank concurrency (empty: no script; validation/inferencemax_blackwell.py)."""
    launch = inferencemax_blackwell.find(row)
    if launch is None or spec.agg is None:
        return {}
    return inferencemax_blackwell.settings(launch, spec.agg.tp, spec.per_rank_concurrency, spec.isl,
                                           osl=spec.osl, client_conc=spec.concurrency, dp=spec.agg.dp,
                                           ep=spec.agg.ep)


def deployment_limits(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> dict[str, Any]:
    """Scheduler settings the row's harness launched the engine with (beyond the engine's defaults).

    aiconfigurator's gap analysis generates the engine config with its generator's benchmark rules
    (``--generator-set rule=benchmark``, generator/rule_plugin/benchmark/*.rule: "align generated configs
    with AIC simulation ... a stricter max batch size derived from the simulated batch size"), so the
    batch cap is the row's concurrency c: TRT-LLM and vLLM agg: max_batch_size c, max_num_tokens = c + ISL
    + 1500 (TRT-LLM rounded up to its 32-token block), TRT-LLM chunked prefill off (template default);
    SGLang agg: max_running_requests c, max_prefill_tokens = ISL + 1500. That rule file dates from 2026-01-26;
    aiconfigurator's public 2025 evaluation pipeline (961028348, 2025-08-22: cli/backends/trtllm.py,
    templates/trtllm/dynamo/extra_engine_args.1.0.0rc3.yaml.j2, eval/benchmarks/genai_perf_runner.py, whose
    genai-perf call is this protocol; the gap-analysis scripts themselves are not public) sets the same
    TRT-LLM agg values from the generator's chosen batch bs (max_batch_size bs, max_num_tokens bs + ISL + 1500,
    chunked prefill off, overlap on, CUDA graphs 1..bs), serves through Dynamo (dynamo.frontend +
    dynamo.trtllm) and runs every concurrency of its list against that one service; bs is not in the rows of
    silicon_h100_h200.csv, so c stands for it (a row's ``max_batch_size`` column, where a CSV has one, gives
    it; :data:`ENGINE_LIMIT_COLUMNS`). The rule file also turns on SGLang's
    mixed chunks (--enable-mixed-chunk, rule added 2026-01-30): the SGLang 0.5.1 rows (2025) behave
    prefill-first (TTFT of 4096x512 within 5 % prefill-first, half the measured value mixed) and keep the
    engine's default; the 0.5.6 rows (H200 Llama-3.1-8B, Qwen3-235B; measurement date not in the rows, the
    same source's 0.5.6 runs are of 2026-01-23) run mixed: over their 70 rows TPOT / TTFT MAPE 31.0 / 120.0 %
    prefill-first against 21.8 / 66.1 % mixed (Qwen3-235B alone 12.7 / 40.4 against 12.2 / 50.3 %), so
    which rule those runs had is the doubt recorded here; the 0.5.8 rows (6, KV-bound) were not re-examined. InferenceMAX
    launches vLLM with --max-num-seqs CONC and --max-num-batched-tokens 8192 (its MiniMax-M2.5 scripts: --max-num-seqs
    256 on H100, neither flag on H200); its SGLang / TRT-LLM settings are below. An engine whose profile has
    chunked prefill off by default (TRT-LLM) gets it off here. A row's own ``max_batch_size`` /
    ``max_num_tokens`` (:data:`ENGINE_LIMIT_COLUMNS`) replace the batch cap / token budget of any rule.
    InferenceMAX rows on other GPUs than Hopper take their Blackwell script's caps and, TensorRT-LLM, its
    attention-DP balance and batch-wait settings (:func:`blackwell_settings`), or the engine's defaults where no
    script matches.
    """
    import hardware

    conc = spec.per_rank_concurrency if spec.mode == "agg" else spec.concurrency
    out: dict[str, Any] = {}
    if not hardware.load_engine(spec.backend).chunked_prefill:
        out["chunked_prefill"] = False
    if proto is GENAI_PERF and spec.mode == "agg":
        bs = spec.harness_batch
        if spec.backend == "trtllm":
            out.update(max_num_seqs=bs, max_num_batched_tokens=cdiv(bs + spec.isl + 1500, 32) * 32,
                       chunked_prefill=False)
        elif spec.backend == "sglang":
            out.update(max_num_seqs=bs, max_num_batched_tokens=spec.isl + 1500)
            if row.get("backend_version", "").startswith("0.5.6"):
                out["mixed_prefill"] = True
        elif spec.backend == "vllm":
            out.update(max_num_seqs=bs, max_num_batched_tokens=bs + spec.isl + 1500)
    elif proto is INFERENCEMAX and spec.mode == "agg" and spec.gpu not in HOPPER:
        b300 = blackwell_settings(row, spec)
        out.update({k: b300[k] for k in ("max_num_seqs", "max_num_batched_tokens", "recv_interval",
                                         "attention_dp_balance", "attention_dp_timeout_iters",
                                         "attention_dp_batching_wait_iters", "batch_wait_iters",
                                         "batch_wait_max_tokens_ratio") if k in b300})
    elif proto is INFERENCEMAX and spec.mode == "agg" and spec.backend == "vllm":
        if "minimax" in spec.model.lower():
            # minimaxm2.5_fp8_h100.sh: --max-num-seqs 256; minimaxm2.5_fp8_h200.sh: neither flag (a36346339,
            # 1d5cae141): the engine's defaults.
            if spec.gpu == "h100_sxm":
                out.update(max_num_seqs=256)
        else:
            out.update(max_num_seqs=conc, max_num_batched_tokens=8192)
    elif proto is INFERENCEMAX and spec.mode == "agg" and spec.backend == "trtllm":
        out.update(_inferencemax_trtllm(spec, conc, harness_speculative(row, spec, proto), measured_day(row)))
    elif proto is INFERENCEMAX and spec.mode == "agg" and spec.backend == "sglang":
        out.update(_inferencemax_sglang(spec))
    if spec.max_batch:
        out["max_num_seqs"] = spec.max_batch
    if spec.max_tokens:
        out["max_num_batched_tokens"] = spec.max_tokens
    return out


def _inferencemax_sglang(spec: "RowSpec") -> dict[str, Any]:
    """InferenceMAX's SGLang launch flags: DeepSeek-R1/V3 (dsr1_fp8_h200.sh, 41aff0a): --chunked-prefill-size
    and --max-prefill-tokens 32768, --max-running-requests 512 at 1k/1k else 256; Qwen3.5 (f65d6b4):
    --chunked-prefill-size 16384, --max-running-requests 128. GLM-5: engine defaults."""
    model = spec.model.lower()
    if "deepseek" in model:
        return {"max_num_batched_tokens": 32768,
                "max_num_seqs": 512 if (spec.isl, spec.osl) == (1024, 1024) else 256}
    if "qwen3.5" in model:
        return {"max_num_batched_tokens": 16384, "max_num_seqs": 128}
    return {}


def _inferencemax_trtllm(spec: "RowSpec", conc: int, spec_tokens: int = 0, measured: str = "") -> dict[str, Any]:
    """InferenceMAX's trtllm-serve launch flags (SemiAnalysisAI/InferenceX benchmarks/*_h200_trt*.sh).

    ``conc``: one attention-DP rank's share of the clients; ``measured``: the row's measurement date ('' when
    the row has none). gpt-oss: --max_batch_size CONC --max_num_tokens 20000; DeepSeek-R1/V3
    (dsr1_fp8_h200_trt_slurm.sh): --max_num_tokens = CONC + ISL + 64 rounded up to 64 with CONC the client
    concurrency (every rank's limit), engine-default batch size, and from INFERENCEMAX_TRT_TOKEN_FLOOR_SINCE on at
    least 8192 (64af5a771 raised it to fit the lm-eval prompts run after the benchmark); runs before that
    date fit one 1k prompt per step beside the decodes, chunked prefill being off. With MTP (``spec_tokens``
    drafts) the MTP script's flags; Llama-3.1-70B (measured 2025-10-29,
    70b_fp8_h200_trt_slurm.sh as of 1b563c8, 2025-09-18): --max_num_tokens 16384, and for 1k/1k at TP < 8
    batch_wait_timeout_iters 20 / batch_wait_max_tokens_ratio 0.9.
    """
    model = spec.model.lower()
    if "gpt-oss" in model:
        return {"max_num_seqs": conc, "max_num_batched_tokens": 20000}
    # Both DeepSeek scripts, with attention DP: attention_dp_config batching_wait_iters 0, enable_balance
    # true, timeout_iters 60 (dsr1_fp8_h200_trt_slurm.sh 9596d23 L63-70; dsr1_fp8_h200_trt_mtp_slurm.sh
    # bf34567 L60-67).
    assert spec.agg is not None
    balance = ({"attention_dp_balance": True, "attention_dp_timeout_iters": 60,
                "attention_dp_batching_wait_iters": 0} if "deepseek" in model and spec.agg.dp > 1 else {})
    if "deepseek" in model and spec_tokens:
        # dsr1_fp8_h200_trt_mtp_slurm.sh (bf34567): --max_batch_size CONC (CONC / TP with attention DP, one
        # rank's share) and --max_num_tokens (MTP + 1) x that + ISL + 64, rounded up to 64.
        return {"max_num_seqs": conc,
                "max_num_batched_tokens": cdiv((spec_tokens + 1) * conc + spec.isl + 64, 64) * 64, **balance}
    if "deepseek" in model:
        budget = cdiv(spec.concurrency + spec.isl + 64, 64) * 64
        if not measured or measured >= INFERENCEMAX_TRT_TOKEN_FLOOR_SINCE:
            budget = max(8192, budget)
        return {"max_num_batched_tokens": budget, **balance}
    if "llama-3.1-70b" in model:
        wait = {"batch_wait_iters": 20, "batch_wait_max_tokens_ratio": 0.9} \
            if (spec.isl, spec.osl) == (1024, 1024) and spec.agg.tp < 8 else {}
        return {"max_num_batched_tokens": 16384, **wait}
    return {}


def harness_kv(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> dict[str, Any]:
    """KV-cache settings the row's harness launched the engine with: ``kv_dtype`` (model section) and
    ``gpu_memory_utilization`` (in the engine's own meaning, see EngineProfile.kv_memory_rule).

    InferenceMAX Llama-3.1-70B FP8 (70b_fp8_{h100,h200}_slurm.sh, 70b_fp8_h200_trt_slurm.sh as of
    2025-09-18): FP8 KV cache (vLLM kv-cache-dtype fp8, TRT-LLM kv_cache_config.dtype fp8), vLLM
    --gpu-memory-utilization 0.9. aiconfigurator's generated TRT-LLM configs (every
    extra_engine_args.<version>.yaml.j2 template): free_gpu_memory_fraction 0.80. aiconfigurator's quant
    defaults for dense and MoE models (cli/templates/trtllm/{dense,moe}_default.yaml) pair FP8 GEMMs with
    kvcache_quant_mode fp8, which its generator passes to every engine as kv_cache_dtype: a gap-analysis
    row with precision fp8 ran an FP8 KV cache (DeepSeek's template keeps float16; no such row here).
    InferenceMAX B300 rows: their script's KV dtype, memory fraction and vLLM --block-size (:func:`blackwell_settings`).
    """
    out: dict[str, Any] = {}
    if proto is GENAI_PERF and spec.backend == "trtllm":
        out["gpu_memory_utilization"] = 0.8
    if proto is GENAI_PERF and spec.backend == "sglang" and spec.mode == "agg":
        out["gpu_memory_utilization"] = sglang_mem_fraction(row, spec)
    if proto is GENAI_PERF and row.get("precision", "").strip().lower() == "fp8" \
            and "deepseek" not in spec.model.lower():
        out["kv_dtype"] = "fp8"
    if proto is INFERENCEMAX and spec.mode == "agg" and spec.gpu in HOPPER:
        out.update(_inferencemax_kv(spec))
    elif proto is INFERENCEMAX and spec.mode == "agg":
        b300 = blackwell_settings(row, spec)
        out.update({k: b300[k] for k in ("kv_dtype", "gpu_memory_utilization", "block_size") if k in b300})
    return out


def _inferencemax_kv(spec: "RowSpec") -> dict[str, Any]:
    """KV dtype and memory fraction of InferenceMAX's launch scripts, by model and engine, as of the rows'
    measurement dates (SemiAnalysisAI/InferenceX; the fraction in the engine's own meaning):
    Llama-3.1-70B (70b_fp8_*_slurm.sh, 9596d23): FP8 KV, vLLM 0.9; gpt-oss TRT-LLM (9596d23, d22bf9c):
    free_gpu_memory_fraction 0.85; DeepSeek-R1/V3 TRT-LLM (dsr1_fp8_h200_trt_slurm.sh): FP8 KV, 0.75;
    DeepSeek SGLang (41aff0a): mem-fraction-static 0.82; Qwen3.5 SGLang (f65d6b4): FP8 KV, 0.8; GLM-5
    SGLang (ebb48d4): 0.85; Kimi-K2.5 vLLM (749096c, 79a42e2): 0.95; MiniMax-M2.5 vLLM (a363463, 1d5cae1,
    0f78cf4): 0.95 on H200, 0.9 on H100. Everything else: the engine's defaults.
    """
    model, backend = spec.model.lower(), spec.backend
    if "llama-3.1-70b" in model:
        return {"kv_dtype": "fp8"}
    if "gpt-oss" in model and backend == "trtllm":
        return {"gpu_memory_utilization": 0.85}
    if "deepseek" in model and backend == "trtllm":
        return {"kv_dtype": "fp8", "gpu_memory_utilization": 0.75}
    if "deepseek" in model and backend == "sglang":
        return {"gpu_memory_utilization": 0.82}
    if "qwen3.5" in model and backend == "sglang":
        return {"kv_dtype": "fp8", "gpu_memory_utilization": 0.8}
    if "glm-5" in model and backend == "sglang":
        return {"gpu_memory_utilization": 0.85}
    if "kimi-k2" in model and backend == "vllm":
        return {"gpu_memory_utilization": 0.95}
    if "minimax" in model and backend == "vllm":
        return {"gpu_memory_utilization": 0.95 if spec.gpu == "h200_sxm" else 0.9}
    return {}


def sglang_mem_fraction(row: dict[str, str], spec: "RowSpec") -> float:
    """The mem_fraction_static SGLang derived for a gap-analysis row, whose launch sets none
    (aiconfigurator's SGLang cli_args templates pass no --mem-fraction-static).

    The harness sets --max-prefill-tokens (ISL + 1500, the twin's per-step budget for the row), not
    --chunked-prefill-size, so the heuristic saw the default chunk for the GPU. 0.5.6 and later: the
    engine's rule (EngineProfile.default_memory_fraction). 0.5.1.post1 (server_args.py __post_init__)
    reserved (2.8 + GPUs / 10) GiB under 35 GiB, (9.5 + GPUs / 2) GiB under 90 GiB, (12 + GPUs / 2) GiB under
    160 GiB and 32 GiB above."""
    import hardware

    assert spec.agg is not None
    engine, gpu = hardware.load_engine("sglang"), hardware.load_gpu(spec.gpu)
    gpus = spec.agg.gpus
    if row.get("backend_version", "").startswith("0.5.1"):
        mem = gpu.hbm_bytes / 2**20
        gib = (2.8 + gpus / 10 if mem < 35 * 1024 else 9.5 + gpus / 2 if mem < 90 * 1024
               else 12.0 + gpus / 2 if mem < 160 * 1024 else 32.0)
        return round((mem - gib * 1024) / mem, 3)
    chunk = engine.default_max_num_batched_tokens(gpu)
    return engine.default_memory_fraction(gpu, gpus=gpus, chunked_prefill_size=chunk,
                                          cuda_graph_max_bs=engine.cuda_graph_max_bs(gpu, gpus),
                                          dp_attention=spec.agg.dp)


NIGHTLY_LINES: dict[str, tuple[tuple[str, str], ...]] = {
    "sglang": (("2026-02-26", "0.5.10"), ("2026-04-08", "0.5.11")),
}
"""(day, version) by engine: a nightly image built on or after ``day`` (and before the next entry's day) is a
development build of ``version``. Each day is the first on which InferenceX ran the release before it
(SGLang v0.5.9: f267602ff, 2026-02-26; v0.5.10: 6f6a5fe07, 2026-04-08), so on or after that release; a
nightly from the days between a release and its first use there keeps the older line's label."""
_NIGHTLY_IMAGE = re.compile(r"image=\S*:nightly[-\w]*?-(20\d{6})-")


NVFP4_SERVED = {
    "deepseek-ai/DeepSeek-V3": "nvidia/DeepSeek-R1-0528-NVFP4-v2",
    "deepseek-ai/DeepSeek-R1": "nvidia/DeepSeek-R1-0528-NVFP4-v2",
    "Qwen/Qwen3.5-397B-A17B": "nvidia/Qwen3.5-397B-A17B-NVFP4",
    "moonshotai/Kimi-K2.5": "nvidia/Kimi-K2.5-NVFP4",
    "MiniMaxAI/MiniMax-M2.5": "nvidia/MiniMax-M2.5-NVFP4",
    "zhipuai/GLM-5": "nvidia/GLM-5-NVFP4",
}
"""The checkpoint InferenceMAX serves for an FP4 row of each model: NVIDIA's ModelOpt NVFP4 checkpoints
(``hf_model`` of every FP4 Blackwell entry in validation/harness/inferencemax_flags.json; the disaggregated
DeepSeek FP4 configs name nvidia/DeepSeek-R1-0528-NVFP4-v2, InferenceX .github/configs/nvidia-master.yaml
dsr1-fp4-gb300-dynamo-trt / -sglang at 12ba0ae07). They keep some layers in BF16 (their exclude_modules:
hardware.model.excluded_classes), which the row's own model name does not say."""


def harness_unquantised(row: dict[str, str], spec: "RowSpec") -> dict[str, list[str]]:
    """``model.unquantised`` for an FP4 row: the classes of linear layers the NVFP4 checkpoint the server
    loaded (:data:`NVFP4_SERVED`) keeps in BF16; empty for other rows (the named checkpoint's own)."""
    from hardware import load_model

    served = NVFP4_SERVED.get(row["model_path"].strip())
    if spec.weight_dtype != "fp4" or served is None:
        return {}
    return {"unquantised": sorted(load_model(served).unquantised)}


def nightly_build(backend: str, source: str) -> str | None:
    """The version a nightly image named in a row's source is a development build of (``0.5.10.dev20260401``
    for ``lmsysorg/sglang:nightly-dev-cu13-20260401-b6fe0cca``), or None (no dated nightly image, or a day
    before the engine's first entry in NIGHTLY_LINES)."""
    m = _NIGHTLY_IMAGE.search(source)
    if m is None:
        return None
    stamp = m.group(1)
    day = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:]}"
    lines = [v for since, v in NIGHTLY_LINES.get(backend, ()) if since <= day]
    return f"{lines[-1]}.dev{stamp}" if lines else None


def harness_engine_version(row: dict[str, str], spec: "RowSpec") -> dict[str, str]:
    """``{"version": ...}`` where the engine profile has host terms of the row's build (EngineProfile.builds),
    else nothing: a benchmark measured again under another version label keeps one twin config
    (simulation_key). The build is the row's backend_version, or for a nightly the release line its dated
    image belongs to (:func:`nightly_build`)."""
    import hardware

    version = row.get("backend_version", "").strip()
    if version.startswith("nightly"):
        version = nightly_build(spec.backend, row.get("silicon_data_source", "")) or version
    engine = hardware.load_engine(spec.backend)
    return {"version": version} if engine.for_version(version) is not engine else {}


def harness_prefix_caching(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> bool | None:
    """Whether the row's engine ran with its prefix cache, where the harness set it (None: the engine's
    default). InferenceMAX's aggregated scripts (validation/harness/inferencemax_flags.md, item 6, and
    ``flags.prefix_caching`` in inferencemax_flags.json) pass --no-enable-prefix-caching (vLLM),
    --disable-radix-cache (SGLang) or ``enable_block_reuse: false`` (TRT-LLM), except GLM-5 (glm5_fp8_h200.sh
    sets only mem-fraction-static: SGLang's default, radix cache on), Kimi-K2.5 before 79a42e20a
    (2026-03-27T22:21Z: the rows measured 2026-03-02) and MiniMax-M2.5 before 0f78cf4eb (2026-03-28T02:17Z:
    the rows measured 2026-03-01 and 2026-03-27), which leave vLLM's default (on). The undated Kimi-K2.5
    gap-analysis rows may come from either Kimi script, so they keep the default. The rows' prompts are
    unique, so no prompt hits the cache either way; what the cache changes is a preempted request's
    resumption, which finds its own blocks still cached only when the cache is on.

    aiconfigurator's gap analysis (genai-perf): its TRT-LLM templates set ``enable_block_reuse: {{ ... |
    default(false) }}``, off; its vLLM and SGLang templates leave the engines' prefix caches on (no
    --no-enable-prefix-caching / --disable-radix-cache unless ``disable_prefix_cache`` is set, which no rule
    sets without a prefix). InferenceMAX B300 rows: every B300 script turns the cache off (:func:`blackwell_settings`;
    none where no script matches the row)."""
    if proto is GENAI_PERF and spec.mode == "agg" and spec.backend == "trtllm":
        return False
    if proto is not INFERENCEMAX or spec.mode != "agg":
        return None
    if spec.gpu not in HOPPER:
        return blackwell_settings(row, spec).get("prefix_caching")
    model, day = spec.model.lower(), measured_day(row)
    if "glm-5" in model:
        return None
    if "kimi-k2" in model and (not day or day < "2026-03-27"):
        return None
    if "minimax-m2" in model and day < "2026-03-28":
        return None
    return False


VLLM_FULL_GRAPHS_SINCE = "2025-11-04"
"""First InferenceMAX vLLM image past v0.10.2 (7103d6608, vLLM 0.11.0): v0.10.2 replayed piecewise graphs only
(vLLM PR #25444 made FULL_AND_PIECEWISE the default in 0.11.0)."""


def harness_graphs(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> dict[str, Any]:
    """The CUDA-graph settings the row's harness ran (engine.cuda_graph_mode / engine.cuda_graph_max_size;
    empty: the engine's defaults for the row's scheduler limits). InferenceMAX (SemiAnalysisAI/InferenceX):

    * vLLM images before VLLM_FULL_GRAPHS_SINCE were v0.10.2 (70b-tmpl.yml and gptoss-tmpl.yml at 9596d23 /
      e06929c70), whose default cudagraph_mode was PIECEWISE: the Llama-3.1-70B rows of 2025-10-29 and the
      gpt-oss rows of 2025-11-02. From 0.11.0 on the default is FULL_AND_PIECEWISE; gptoss_fp4_*.sh set
      PIECEWISE explicitly from 7103d6608 (2025-11-04) until 25506e87c (2025-12-05), when no row was measured.
    * vLLM gpt-oss: ``cuda-graph-sizes: 2048`` (v0.10.2) and ``max-cudagraph-capture-size: 2048`` (0.11.2 on,
      gptoss_fp4_h100.sh / gptoss_fp4_h200.sh at cec542a9a): piecewise graphs up to 2,048 tokens, so a 1k
      prompt's step replays graphs.
    * vLLM MiniMax-M2.5 H100 (minimaxm2.5_fp8_h100.sh from ac0d2a853 until 298d8f94c, 2026-05-22):
      ``--compilation-config '{"cudagraph_mode":"PIECEWISE"}'``.
    * TRT-LLM gpt-oss (gptoss_fp4_h200_trt*.sh): cuda_graph_config max_batch_size CONC, padding on;
      DeepSeek-R1/V3 (dsr1_fp8_h200_trt*.sh): max_batch_size 128 (the default); Llama-3.1-70B
      (70b_fp8_h200_trt_slurm.sh): 1024.
    * SGLang Qwen3.5 (qwen3.5_fp8_h200.sh at f65d6b4b1): --cuda-graph-max-bs CONC; DeepSeek-R1/V3
      (dsr1_fp8_h200.sh at 41aff0afc): --cuda-graph-max-bs 512 at 1k/1k, else 256, as its
      --max-running-requests (validation/harness/inferencemax_flags.md).

    aiconfigurator's gap analysis (genai-perf): its TRT-LLM agg configs capture every batch size up to the
    batch limit (961028348 cli/backends/trtllm.py: cuda_graph_batch_sizes = 1 .. bs, bs standing for c as in
    :func:`deployment_limits`; the row's ``max_batch_size`` where it gives one), so no decode batch is padded.
    TRT-LLM disaggregated rows: the decode workers capture up to their batch limit (the Dynamo recipes name
    it, e.g. ``..._batch128_...yaml``); prefill workers run no pure-decode step. InferenceMAX B300 rows: their
    script's --cuda-graph-max-bs / --max-cudagraph-capture-size (:func:`blackwell_settings`), with the engine
    settings the script names beside them (its MoE kernel; the float32 matmul precision the MiniMax-M2.5
    scripts of 2026-04-21 export, VLLM_FLOAT32_MATMUL_PRECISION=high).
    """
    if spec.backend == "trtllm" and spec.mode == "disagg":
        return {"cuda_graph_max_size": spec.decode_batch} if spec.decode_batch else {}
    if proto is GENAI_PERF and spec.mode == "agg" and spec.backend == "trtllm":
        return {"cuda_graph_sizes": list(range(1, spec.harness_batch + 1))}
    if proto is not INFERENCEMAX or spec.mode != "agg":
        return {}
    if spec.gpu not in HOPPER:   # (and the MoE kernel the script names: --moe-runner-backend flashinfer_trtllm)
        b300 = blackwell_settings(row, spec)
        return {k: b300[k] for k in ("cuda_graph_max_size", "moe_kernel", "float32_matmul") if k in b300}
    model, day = spec.model.lower(), measured_day(row)
    out: dict[str, Any] = {}
    if spec.backend == "vllm":
        if day and day < VLLM_FULL_GRAPHS_SINCE:
            out["cuda_graph_mode"] = "piecewise"
        if "minimax" in model and spec.gpu == "h100_sxm":
            out["cuda_graph_mode"] = "piecewise"
        if "gpt-oss" in model:
            out["cuda_graph_max_size"] = 2048
    elif spec.backend == "trtllm":
        if "gpt-oss" in model:
            out["cuda_graph_max_size"] = spec.per_rank_concurrency
        elif "llama-3.1-70b" in model:
            out["cuda_graph_max_size"] = 1024
    elif spec.backend == "sglang":
        if "qwen3.5" in model:
            out["cuda_graph_max_size"] = spec.per_rank_concurrency
        elif "deepseek" in model:
            out["cuda_graph_max_size"] = 512 if (spec.isl, spec.osl) == (1024, 1024) else 256
    return out
