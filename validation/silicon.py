"""End-to-end validation against measured serving benchmarks (``twin validate silicon CSV --out DIR``).

Each row of a CSV with the columns of aiconfigurator's ``silicon`` samples is simulated the way the
benchmark ran it: a closed loop of ``batch_size`` concurrent requests with fixed ISL / OSL (random
prompts, so no prefix reuse), the row's GPU, model, backend, weight format and parallelism; a
disaggregated row gets its prefill / decode pools. Predicted mean TTFT and TPOT are compared with the
measured ones. A row the twin cannot represent is skipped with its reason, never dropped silently.

The work is split by role: reading and checking the rows (:mod:`validation.measured_rows`), the benchmark
clients (:mod:`validation.protocols`), a row's spec (:mod:`validation.row_spec`, with InferenceMAX's
disaggregated configs in :mod:`validation.inferencemax_disagg`), the harnesses' launch and decoding rules
(:mod:`validation.harness_launch`, :mod:`validation.harness_decoding`), the twin config they make
(:mod:`validation.row_config`), running the rows (:mod:`validation.silicon_run`) and the accuracy summary
(:mod:`validation.accuracy`). This module is the one place callers import them from.
"""

from __future__ import annotations

from validation.measured_rows import (Parallel, REQUIRED, RowSpec, Skip, concurrency, read_rows,
                                      silicon_concurrency)
from validation.protocols import (DYNAMO, GENAI_PERF, HOPPER, INFERENCEMAX,
                                  INFERENCEMAX_TRT_TOKEN_FLOOR_SINCE, INFERENCEMAX_WARMUP_SINCE, Protocol,
                                  client_warmup, protocol)
from validation.inferencemax_disagg import DISAGG_CONFIGS, SGLANG_H100_MTP_STEPS, SGLANG_REDUNDANT_EXPERTS
from validation.row_spec import ENGINE_LIMIT_COLUMNS, WEIGHT_FORMATS, row_spec, weight_format
from validation.harness_launch import (VLLM_FULL_GRAPHS_SINCE, deployment_limits, harness_graphs, harness_kv,
                                       harness_prefix_caching, harness_skip, sglang_mem_fraction)
from validation.harness_decoding import (GENERATION_CONFIG_ENGINES, GENERATION_CONFIG_TOP_P, MTP_ACCEPTANCE,
                                         MTP_ACCEPTANCE_LATER, engine_moe_kernel, harness_moe_kernel,
                                         harness_sampling, harness_speculative, mtp_acceptance)
from validation.row_config import parse_prompt_pool, row_config
from validation.silicon_run import (UNREPRESENTABLE, measured_means, row_sha, shared_result, simulate_row,
                                    simulation_key, validate_silicon)
from validation.accuracy import error_spread, format_summary, summarize

__all__ = [
    "DISAGG_CONFIGS", "DYNAMO", "ENGINE_LIMIT_COLUMNS", "GENAI_PERF", "GENERATION_CONFIG_ENGINES",
    "GENERATION_CONFIG_TOP_P", "HOPPER", "INFERENCEMAX", "INFERENCEMAX_TRT_TOKEN_FLOOR_SINCE",
    "INFERENCEMAX_WARMUP_SINCE", "MTP_ACCEPTANCE", "MTP_ACCEPTANCE_LATER", "Parallel", "Protocol",
    "REQUIRED", "RowSpec", "SGLANG_H100_MTP_STEPS", "SGLANG_REDUNDANT_EXPERTS", "Skip", "UNREPRESENTABLE",
    "VLLM_FULL_GRAPHS_SINCE", "WEIGHT_FORMATS", "client_warmup", "concurrency", "deployment_limits",
    "engine_moe_kernel", "error_spread", "format_summary", "harness_graphs", "harness_kv",
    "harness_moe_kernel", "harness_prefix_caching", "harness_sampling", "harness_skip",
    "harness_speculative", "measured_means", "mtp_acceptance", "parse_prompt_pool", "protocol", "read_rows",
    "row_config", "row_sha", "row_spec", "sglang_mem_fraction", "shared_result", "silicon_concurrency",
    "simulate_row", "simulation_key", "summarize", "validate_silicon", "weight_format",
]
