"""What one measured row says was run (:func:`row_spec`): GPU, model, engine, weight format, lengths,
concurrency and each worker's parallelism, after the data corrections each export needs and the layout the
harness's launch script actually ran (each correction recorded in the spec's notes).
"""

from __future__ import annotations

import re

from validation import inferencemax_blackwell, inferencemax_disagg
from validation.measured_rows import (Parallel, RowSpec, Skip, concurrency, int_cell, measured_day,
                                      silicon_concurrency)
from validation.protocols import HOPPER, INFERENCEMAX, inferencemax_disagg_row, protocol


WEIGHT_FORMATS = {"": "bf16", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8_block": "fp8_block",
                  "nvfp4": "fp4", "fp4": "fp4", "mxfp4": "fp4", "int4_wo": "int4", "int4": "int4"}


ENGINE_LIMIT_COLUMNS = ("max_batch_size", "max_num_tokens")
"""Optional columns of a validation CSV: engine limits the harness launched an aggregated row's engine with,
where they are known. ``max_batch_size``: the running requests one engine rank schedules at most
(TensorRT-LLM --max_batch_size, vLLM --max-num-seqs, SGLang --max-running-requests; each attention-DP rank
has its own); ``max_num_tokens``: the new tokens one step computes at most (--max_num_tokens,
--max-num-batched-tokens, SGLang's chunk size). A blank or absent cell keeps the limit the row's harness rule
gives (:func:`deployment_limits`). silicon_h100_h200.csv has neither column: its rows do not record the
batch caps aiconfigurator's generator chose (hardware/MODEL.md, "Open gaps")."""


def _engine_limit(row: dict[str, str], key: str) -> int:
    """A limit column of :data:`ENGINE_LIMIT_COLUMNS`: an integer >= 1, or 0 where the cell is blank."""
    if not (row.get(key) or "").strip():
        return 0
    value = int_cell(row, key)
    if value < 1:
        raise Skip(f"column {key}={row[key].strip()!r}: expected an integer >= 1 (blank: the harness's limit)")
    return value


def _id_gpus(row: dict[str, str]) -> int | None:
    """GPUs of the deployment as the row id spells it (``..._tp8_ep8_...`` / ``..._tp8_0_ep8_0_...``)."""
    found = re.search(r"_tp(\d+)(?:_0)?_ep(?:\d+|none)", row["id"])
    return int(found.group(1)) if found else None


def _parallel(row: dict[str, str], prefix: str, notes: list[str], *, per_rank: int | None,
              total: int | None) -> Parallel:
    """Normalise tp / attention-DP / EP of one worker (``prefix`` '' for agg, 'prefill_' / 'decode_').

    Data corrections (each recorded in ``notes``):
    * one export (the rows whose id ends ``_tpX_epY_N``) lists tp x ep as ``tp_size`` and dp x ep as
      ``attention_dp_size`` (e.g. tp 64, moe_tp 8, ep 8 for an 8-GPU tp 8 / ep 8 run; the same measurements
      appear with tp 8 in the other export). The id's ``tpX`` is the GPU count; tp or dp is scaled back to
      it. Rows without such an id but with the same signature (tp x dp = moe_tp x ep = ep^2 > one node)
      are corrected the same way.
    * ``attention_dp_size`` blank while moe_tp x ep exceeds tp: the MoE spans more GPUs than attention TP,
      which is attention data parallelism (vLLM --data-parallel-size): dp = moe_tp x ep / tp.
    * blank dp, but the client concurrency is a multiple k > 1 of ``batch_size`` = the per-rank batch:
      k attention-DP ranks (tp / k each).
    """
    tp = int_cell(row, f"{prefix}tp_size", 1) or 1
    dp = int_cell(row, f"{prefix}attention_dp_size", 0) or 1
    ep = int_cell(row, f"{prefix}moe_ep_size", 0) or 1
    moe_tp = int_cell(row, f"{prefix}moe_tp_size", 0)
    gpus_id = _id_gpus(row) if not prefix else None
    gpus = tp * dp
    if moe_tp and moe_tp * ep == gpus and moe_tp == ep and ep > 1:
        want = gpus_id if gpus_id is not None and gpus_id < gpus else (ep if gpus > 8 else None)
        if want is not None and gpus % want == 0:
            scale = gpus // want
            if dp > 1 and dp % scale == 0:
                notes.append(f"{prefix}attention_dp_size {dp} -> {dp // scale} (export lists dp x ep)")
                dp //= scale
            elif tp % scale == 0:
                notes.append(f"{prefix}tp_size {tp} -> {tp // scale} (export lists tp x ep)")
                tp //= scale
            moe_tp = tp * dp // ep
    if dp == 1 and moe_tp and moe_tp * ep > tp and (moe_tp * ep) % tp == 0:
        dp = moe_tp * ep // tp
        notes.append(f"{prefix}attention_dp_size blank, moe_tp x ep = {moe_tp * ep} > tp {tp}: dp {dp}")
    if dp == 1 and per_rank and total and total > per_rank and total % per_rank == 0:
        k = total // per_rank
        if tp % k == 0 and k > 1:
            notes.append(f"{prefix}concurrency {total} = {k} x batch_size {per_rank}: attention dp {k}, tp {tp // k}")
            tp, dp = tp // k, k
    if ep > tp * dp:
        raise Skip(f"{prefix}moe_ep_size {ep} exceeds the {tp * dp} GPUs of the worker")
    return Parallel(tp=tp, dp=dp, ep=ep)


def _inferencemax_parallel(row: dict[str, str], par: Parallel, isl: int, osl: int, conc: int,
                           notes: list[str]) -> Parallel:
    """Expert / attention-DP layout the InferenceMAX script ran where the export's columns say otherwise
    (each correction recorded in ``notes``; InferenceX history at the measured dates):

    * TRT-LLM DeepSeek-R1/V3 and gpt-oss measured 2025-11-02 (dsr1_fp8_h200_trt_slurm.sh,
      gptoss_fp4_h200_trt_slurm.sh at 9596d23): --ep_size $TP, and DeepSeek turned attention DP on for
      8k/1k at CONC > 32 (the export says ep 1).
    * vLLM MiniMax-M2.5 on or after 2026-03-13 (5e2c705, minimaxm2.5_fp8_*.sh): --enable-expert-parallel
      always (H200: the test is EP_SIZE >= 1 with EP_SIZE defaulting to 1), so EP spans the TP group; the
      2026-03-28 H100 export's tp 4 / dp 4 / ep 16 encodes the tp 4 / ep 4 search-space entry (the script
      has no DP flag).

    Other GPUs: the Blackwell (B300, B200) scripts' own layout (:func:`_inferencemax_b300_parallel`).
    """
    if row["system"].strip() not in HOPPER:
        return _inferencemax_b300_parallel(row, par, isl, osl, conc, notes)
    model, backend, day = row["model_path"].lower(), row["backend"].strip(), measured_day(row)
    gpus = par.tp * par.dp
    fixed = par
    if backend == "trtllm" and day == "2025-11-02" and ("deepseek" in model or "gpt-oss" in model):
        fixed = Parallel(tp=par.tp, dp=par.dp, ep=gpus)
        if "deepseek" in model and (isl, osl) == (8192, 1024) and conc > 32:
            fixed = Parallel(tp=1, dp=gpus, ep=gpus)
    elif backend == "vllm" and "minimax" in model and day >= "2026-03-13":
        if par.dp > 1 and par.ep > par.tp:
            fixed = Parallel(tp=par.tp, dp=1, ep=par.tp)
        else:
            fixed = Parallel(tp=par.tp, dp=par.dp, ep=gpus)
    if fixed != par:
        notes.append(f"harness layout tp {fixed.tp} / dp {fixed.dp} / ep {fixed.ep} "
                     f"(export: tp {par.tp} / dp {par.dp} / ep {par.ep})")
    return fixed


def _inferencemax_b300_parallel(row: dict[str, str], par: Parallel, isl: int, osl: int, conc: int,
                                notes: list[str]) -> Parallel:
    """The layout InferenceMAX's Blackwell script launched for an aggregated row
    (validation/inferencemax_blackwell.py, ``b300_sxm`` / ``b200_sxm`` entries of
    validation/harness/inferencemax_flags.json): the config's search-space entry the
    row's ISL / OSL, concurrency and export layout fit, launched as the script turns TP / EP_SIZE /
    DP_ATTENTION into flags on the TP GPUs the runner allocates. So the Qwen3.5 NVFP4 rows exported as tp 4 /
    moe_tp 2 / ep 2 run TP 2 / EP 2 (qwen3.5_fp4_b300.sh at 8acbd08b7: --ep-size $EP_SIZE; the grid has no
    TP 4 / EP 2), the MiniMax-M2.5 rows exported as tp T / dp E / ep T x E run TP T / EP T
    (--enable-expert-parallel) or, FP4 dp-attn entries, TP 1 / DP T / EP T, and MiniMax rows with EP_SIZE 1
    run without expert parallelism (the scripts test EP_SIZE > 1; the Hopper scripts' >= 1 does not apply).
    A row no script version matches (the 2026-04-03 wip rows, whose images no InferenceX commit names)
    keeps the export's layout and the engine's defaults."""
    launch = inferencemax_blackwell.find(row)
    if launch is None:
        notes.append(f"no InferenceX {inferencemax_blackwell.label(row)} script for the row's date and image: "
                     "the engine's defaults")
        return par
    run, why = inferencemax_blackwell.layout(launch, par.tp, par.dp, par.ep, isl, osl, conc)
    fixed = par if run is None else Parallel(tp=run[0], dp=run[1], ep=run[2])
    if fixed != par:
        notes.append(f"harness layout tp {fixed.tp} / dp {fixed.dp} / ep {fixed.ep} "
                     f"(export: tp {par.tp} / dp {par.dp} / ep {par.ep}; {why})")
    else:
        notes.append(f"harness: {why}")
    return fixed


def weight_format(row: dict[str, str]) -> str:
    """The row's weight format on the checkpoint it names (hardware.ModelSpec.weight_dtype_for).

    'fp8' on a block-scaled checkpoint is block FP8; a row whose MoE runs block FP8 has a block-FP8
    checkpoint; nvfp4 / mxfp4 experts are 4-bit.
    """
    import hardware

    model = hardware.load_model(row["model_path"])
    label = (row.get("gemm_quant_mode") or row.get("precision") or "").strip().lower()
    moe = (row.get("moe_quant_mode") or "").strip().lower()
    if label not in WEIGHT_FORMATS:
        raise Skip(f"weight format {label!r} is not modelled")
    try:
        fmt = model.weight_dtype_for(label)
    except ValueError as exc:
        raise Skip(f"weight format: {exc}") from None
    if fmt == "fp8" and moe == "fp8_block":
        fmt = "fp8_block"
    if moe in ("nvfp4", "w4a16_mxfp4", "mxfp4") and model.is_moe:
        fmt = "fp4"
    return fmt


def row_spec(row: dict[str, str]) -> RowSpec:
    """Read one row into a :class:`RowSpec` (raises :class:`Skip` with the reason when it cannot be)."""
    import hardware

    if row.get("_bad"):
        raise Skip(row["_bad"])
    gpu = row["system"].strip()
    if gpu not in hardware.list_gpus():
        raise Skip(f"GPU {gpu!r} has no spec in hardware/ (known: {', '.join(hardware.list_gpus())})")
    try:
        model = hardware.load_model(row["model_path"])
    except (ValueError, NotImplementedError) as exc:
        raise Skip(f"model: {exc}") from None
    backend = row["backend"].strip()
    if backend not in hardware.list_engines():
        raise Skip(f"backend {backend!r} has no engine profile")
    fmt = weight_format(row)
    isl, osl, conc = int_cell(row, "isl"), int_cell(row, "osl"), concurrency(row)
    if isl < 1 or osl < 1 or conc < 1:
        raise Skip(f"isl={isl}, osl={osl}, concurrency={conc}: all must be >= 1")
    # Checked before the deployment is built: a harness's token budget grows with isl (deployment_limits), so
    # a huge isl was skipped for an activation reserve that does not fit in memory, and a merely long one
    # simulated requests that the engine then refused.
    if isl + osl > model.context_length:
        raise Skip(f"isl={isl} + osl={osl} = {isl + osl} tokens is more than {model.name}'s context length, "
                   f"{model.context_length} (the engine's max_model_len): the engine refuses every request")
    notes: list[str] = []
    mode = row["mode"].strip()
    common = dict(gpu=gpu, model=row["model_path"], backend=backend, weight_dtype=fmt, isl=isl, osl=osl)
    limits = {key: _engine_limit(row, key) for key in ENGINE_LIMIT_COLUMNS}
    if mode == "agg":
        if int_cell(row, "pp_size", 1) > 1:
            raise Skip("pipeline parallelism (pp_size > 1) is not modelled")
        per_rank = int_cell(row, "batch_size", 0) or None
        par = _parallel(row, "", notes, per_rank=per_rank, total=silicon_concurrency(row))
        if protocol(row) is INFERENCEMAX:
            par = _inferencemax_parallel(row, par, isl, osl, conc, notes)
        if par.dp > 1 and silicon_concurrency(row) is None and per_rank:
            conc = per_rank * par.dp
        notes += [f"{key} {value} from the row" for key, value in limits.items() if value]
        return RowSpec(mode=mode, concurrency=conc, agg=par, max_batch=limits["max_batch_size"],
                       max_tokens=limits["max_num_tokens"], notes=tuple(notes), **common)  # type: ignore[arg-type]
    if mode == "disagg":
        given = [key for key, value in limits.items() if value]
        if given:
            raise Skip(f"column {given[0]}={row[given[0]].strip()!r}: an aggregated engine's limit; a "
                       f"disaggregated row gives its pools' batch caps as prefill_batch_size / decode_batch_size")
        sides: dict[str, Parallel] = {}
        for side in ("prefill", "decode"):
            if int_cell(row, f"{side}_pp_size", 1) > 1:
                raise Skip(f"pipeline parallelism ({side}_pp_size > 1) is not modelled")
            sides[side] = _parallel(row, f"{side}_", notes, per_rank=None, total=None)
        pw, dw = int_cell(row, "prefill_num_workers", 0), int_cell(row, "decode_num_workers", 0)
        spec_tokens = 0
        if not pw or not dw:
            if inferencemax_disagg_row(row):
                sides, pw, dw, spec_tokens = inferencemax_disagg.deployment(row, sides, isl, osl, conc, notes)
            else:
                missing = [f"{side}_num_workers" for side, n in (("prefill", pw), ("decode", dw)) if not n]
                notes.append(f"{' and '.join(missing)} empty or 0 in the row: 1 assumed "
                             f"({pw or 1} prefill + {dw or 1} decode workers)")
        return RowSpec(mode=mode, concurrency=conc, prefill=sides["prefill"], decode=sides["decode"],
                       prefill_workers=pw or 1, decode_workers=dw or 1,
                       prefill_batch=int_cell(row, "prefill_batch_size", 0), decode_batch=int_cell(row, "decode_batch_size", 0),
                       spec_tokens=spec_tokens, notes=tuple(notes), **common)  # type: ignore[arg-type]
    raise Skip(f"mode {mode!r} is neither agg nor disagg")
