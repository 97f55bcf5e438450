"""The benchmark clients that measured the rows (InferenceMAX, aiconfigurator's genai-perf runs, Dynamo's
aiperf driver): how each drove its closed loop, which one a row came from, and whether it warmed the server
up first.
"""

from __future__ import annotations

import attrs

from validation.measured_rows import measured_day


@attrs.frozen
class Protocol:
    """How the benchmark client drove one row (closed loop at the row's concurrency c).

    ``low_frac``: ISL and OSL drawn uniformly from [low_frac x L, L] (1.0: fixed); ``waves``: measured
    requests per client slot. Every client here starts its measured requests on an idle server (a warm-up
    runs to completion first), so none is simulated and every request counts.

    Every measured request is simulated: these closed loops reach no steady state in a few waves that the
    rest could be extrapolated from. Simulating 3 or 4 waves and scaling the middle ones up to ``waves`` (the
    first and last waves kept whole) moved the predicted mean TTFT by 10-85 % on the genai-perf rows (fixed
    lengths keep the waves in lockstep) and by up to 150 % (TPOT up to 47 %) on disaggregated DeepSeek rows
    whose prefill queue grows through the whole run; TPOT moved by under 1 % on most other rows (measured on
    the 27 costliest rows of silicon_h100_h200.csv).
    """

    name: str
    low_frac: float
    waves: int


# InferenceMAX (SemiAnalysis) client, which produced the rows with a workflow / export source: vLLM's
# benchmark_serving.py with --dataset-name random --random-range-ratio 0.8 (lengths uniform in
# [0.8 L, L]), --num-prompts 10 x CONC, --max-concurrency CONC, --request-rate inf. Since
# INFERENCEMAX_WARMUP_SINCE (InferenceX benchmark_lib.sh, --num-warmups 2 x CONC) a warm-up of 2 x CONC copies
# of the first prompt runs to completion first; the measured run then starts from an idle server exactly as a
# run without warm-up does, so none is simulated (the warm-up only primes JIT caches, which the twin does not
# model; earlier runs sent their first measured requests to a cold server: client_warmup).
INFERENCEMAX = Protocol("inferencemax", 0.8, 10)
INFERENCEMAX_WARMUP_SINCE = "2026-01-21"
INFERENCEMAX_TRT_TOKEN_FLOOR_SINCE = "2026-01-22"
"""First measurement date of InferenceMAX's DeepSeek TRT-LLM script with its 8192-token floor on --max_num_tokens
(InferenceX 64af5a771, 2026-01-21 23:05 UTC; no row is dated 2026-01-21)."""
# aiconfigurator's own evaluation (source 'aic-auto-gap-analysis'): genai-perf with fixed lengths
# (stddev 0), --request-count 10 x c after --warmup-request-count 2 x c. perf_analyzer runs the warm-up as
# a load phase of its own and joins every worker thread when it is done (ConcurrencyManager::PerformWarmup,
# LoadManager::WaitForWarmupAndCleanup: src/concurrency_manager.cc, src/load_manager.cc of
# triton-inference-server/perf_analyzer); the measured 10 x c requests then start together on an idle
# server, so their means include the first wave's queue, as InferenceMAX's runs do. None is simulated.
GENAI_PERF = Protocol("genai-perf", 1.0, 10)


# Disaggregated rows of no known harness: Dynamo's own benchmark driver (benchmarks/utils/aiperf.py) sends
# max(3 x concurrency, 10) requests of fixed length.
DYNAMO = Protocol("dynamo-aiperf", 1.0, 3)


HOPPER = ("h100_sxm", "h100_pcie", "h200_sxm")


def inferencemax_disagg_row(row: dict[str, str]) -> bool:
    """An InferenceMAX multinode (Dynamo) row: its source names the measured time and the image."""
    source = row.get("silicon_data_source", "")
    return row["mode"].strip() == "disagg" and "measured=" in source and "image=" in source


def protocol(row: dict[str, str]) -> Protocol:
    """The benchmark client of a row, from the harness its ``silicon_data_source`` names.

    InferenceMAX's multinode (Dynamo) runs are benchmarked by srt-slurm's sa-bench (the recipes named in
    nvidia-master.yaml, validation/harness/inferencemax_disagg.json): vLLM's benchmark_serving with
    --dataset-name random --random-range-ratio 0.8 at --max-concurrency c, as the single-node runs. The
    request count differs between sa-bench versions (5 x c after a separate 5 x c warm-up run, or 10 x c
    after 2 x c warm-ups; ishandhanani/srt-slurm src/srtctl/benchmarks/scripts/sa-bench/bench.sh at
    09211b6 and 2ef1b6d); the measurement dates do not say which, and the steady state is the same.
    """
    if "aic-auto-gap-analysis" in row.get("silicon_data_source", ""):
        return GENAI_PERF
    if row.get("mode", "").strip() != "disagg" or inferencemax_disagg_row(row):
        return INFERENCEMAX
    return DYNAMO


def client_warmup(row: dict[str, str]) -> str:
    """Whether the row's client warmed the server up before measuring: ``warm-up`` (genai-perf's 2 x c
    requests; InferenceMAX single-node runs from INFERENCEMAX_WARMUP_SINCE), ``no warm-up`` (InferenceMAX
    single-node runs before it), or ``unknown`` (no measurement date, other clients). The twin simulates
    both alike (it has no JIT or autotuning caches to prime); the validation report groups rows by it."""
    proto = protocol(row)
    if proto is GENAI_PERF:
        return "warm-up"
    day = measured_day(row)
    if proto is INFERENCEMAX and row.get("mode", "").strip() == "agg" and day:
        return "warm-up" if day >= INFERENCEMAX_WARMUP_SINCE else "no warm-up"
    return "unknown"
