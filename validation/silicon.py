"""End-to-end validation against measured serving benchmarks (``twin validate silicon CSV --out DIR``).

Each row of a CSV with the columns of aiconfigurator's ``silicon`` samples is simulated the way the
benchmark ran it: a closed loop of ``batch_size`` concurrent requests with fixed ISL / OSL (random
prompts, so no prefix reuse), the row's GPU, model, backend, weight format and parallelism; a
disaggregated row gets its prefill / decode pools. Predicted mean TTFT and TPOT are compared with the
measured ones. A row the twin cannot represent is skipped with its reason, never dropped silently.
"""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import json
import math
import re
import zlib
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from datetime import datetime, time, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Sequence, TextIO

import attrs
import numpy as np

from twin.errors import TwinError
from twin.kv_cache import cdiv
from twin.results import jsonable
from validation import inferencemax_blackwell
from validation.samples import REQUIRED_COLUMNS
from workloads.errors import utf8_lines

WEIGHT_FORMATS = {"": "bf16", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8_block": "fp8_block",
                  "nvfp4": "fp4", "fp4": "fp4", "mxfp4": "fp4", "int4_wo": "int4", "int4": "int4"}
REQUIRED = REQUIRED_COLUMNS   # (validation.samples lists every column read, for the help and the docs)


class Skip(Exception):
    """This row cannot be represented; the message says why."""


def _open_csv(path: str | Path) -> TextIO:
    """A measured CSV as text, gzip-compressed where its name ends .gz."""
    # utf-8-sig: a byte-order mark (Excel writes one) is not part of the first column's name
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt", newline="", encoding="utf-8-sig")
    return open(path, newline="", encoding="utf-8-sig")


def _gzip_lines(path: str | Path, lines: Iterable[str]) -> Iterator[str]:
    """The lines of an opened CSV; a damaged .gz is an error naming the file (a bare BadGzipFile named none)."""
    try:
        yield from lines
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: not a readable gzip file ({exc or 'truncated'})") from None


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The CSV's rows (.csv, or gzip-compressed .csv.gz); a missing column or an unreadable file is an error
    naming the file."""
    with _open_csv(path) as fh:
        reader = csv.DictReader(utf8_lines(path, _gzip_lines(path, fh)))
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; expected the silicon sample columns "
                             "(twin validate silicon --help lists them)")
        rows = []
        width = len(reader.fieldnames or [])
        for row in reader:
            row["_line"] = str(reader.line_num)  # the row's last physical line (blank lines and quoted newlines count)
            extra = row.pop(None, None)  # type: ignore[call-overload]
            short = [k for k, v in row.items() if v is None]
            if extra is not None or short:
                cells = width + len(extra) if extra is not None else width - len(short)
                row["_bad"] = f"line {reader.line_num} has {cells} cells where the header has {width}"
                for k in short:
                    row[k] = ""
            rows.append(row)
    return rows


def _int(row: dict[str, str], key: str, default: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        if default is None:
            raise Skip(f"column {key} is empty")
        return default
    try:
        value = float(text)
    except ValueError:
        raise Skip(f"column {key}={text!r} is not a number") from None
    if not value.is_integer() or value < 0:
        raise Skip(f"column {key}={text!r} is not a non-negative integer")
    return int(value)


def silicon_concurrency(row: dict[str, str]) -> int | None:
    """The client concurrency noted in ``silicon_data_source`` (``silicon_concurrency=N``), if any."""
    found = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source", ""))
    return int(found.group(1)) if found else None


def concurrency(row: dict[str, str]) -> int:
    """The client's total concurrency: ``silicon_concurrency`` in the source note, else ``batch_size``."""
    total = silicon_concurrency(row)
    if total is not None:
        return total
    if (row.get("batch_size") or "").strip():
        return _int(row, "batch_size")
    raise Skip("no batch_size and no silicon_concurrency in silicon_data_source")


@attrs.frozen
class Parallel:
    """One worker's parallelism after normalising the CSV's columns."""

    tp: int
    dp: int
    ep: int
    redundant_experts: int = 0          # EPLB slots of a disaggregated pool's recipe (_eplb_slots)

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


@attrs.frozen
class RowSpec:
    """What one CSV row says was run, after the data corrections listed in ``notes``."""

    mode: str
    gpu: str
    model: str
    backend: str
    weight_dtype: str
    isl: int
    osl: int
    concurrency: int                    # the client's total concurrency
    agg: Parallel | None = None         # aggregated: one engine
    prefill: Parallel | None = None     # disaggregated pools
    decode: Parallel | None = None
    prefill_workers: int = 1
    decode_workers: int = 1
    prefill_batch: int = 0              # per-rank max batch the row reports (0: engine default)
    decode_batch: int = 0
    spec_tokens: int = 0                # MTP draft tokens of a disaggregated row's matched config (0: none)
    max_batch: int = 0                  # aggregated: the engine's batch cap the row gives (0: the harness rule)
    max_tokens: int = 0                 # aggregated: the engine's step token budget the row gives (0: as above)
    notes: tuple[str, ...] = ()

    @property
    def per_rank_concurrency(self) -> int:
        """Requests one attention-DP rank serves (the whole concurrency when dp = 1)."""
        assert self.agg is not None
        return max(1, cdiv(self.concurrency, self.agg.dp))

    @property
    def harness_batch(self) -> int:
        """The batch a config generator sized an aggregated engine for: the row's ``max_batch_size`` where it
        gives one, else the concurrency per rank, which stands for it (:func:`deployment_limits`)."""
        return self.max_batch or self.per_rank_concurrency


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
    value = _int(row, key)
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
    tp = _int(row, f"{prefix}tp_size", 1) or 1
    dp = _int(row, f"{prefix}attention_dp_size", 0) or 1
    ep = _int(row, f"{prefix}moe_ep_size", 0) or 1
    moe_tp = _int(row, f"{prefix}moe_tp_size", 0)
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
    model, backend, day = row["model_path"].lower(), row["backend"].strip(), _measured(row)
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


def _b300_settings(row: dict[str, str], spec: "RowSpec") -> dict[str, Any]:
    """The launch settings of an aggregated row's InferenceMAX Blackwell (B300, B200) script for its launched
    layout and per-rank concurrency (empty: no script; validation/inferencemax_blackwell.py)."""
    launch = inferencemax_blackwell.find(row)
    if launch is None or spec.agg is None:
        return {}
    return inferencemax_blackwell.settings(launch, spec.agg.tp, spec.per_rank_concurrency, spec.isl,
                                           osl=spec.osl, client_conc=spec.concurrency, dp=spec.agg.dp,
                                           ep=spec.agg.ep)


DISAGG_CONFIGS = Path(__file__).resolve().parent / "harness" / "inferencemax_disagg.json"


@functools.cache
def _disagg_configs() -> dict[str, Any]:
    """InferenceMAX's disaggregated config versions (validation/harness/make_inferencemax_disagg.py)."""
    return json.loads(DISAGG_CONFIGS.read_text())["configs"]


def _inferencemax_disagg_row(row: dict[str, str]) -> bool:
    """An InferenceMAX multinode (Dynamo) row: its source names the measured time and the image."""
    source = row.get("silicon_data_source", "")
    return row["mode"].strip() == "disagg" and "measured=" in source and "image=" in source


_MEASURED = re.compile(r"measured=(\d{4}-\d\d-\d\d)(T[0-9:.]+Z)?")
"""The measurement stamp in ``silicon_data_source``: a date, and the time of day where the export has it."""


def _measured_at(row: dict[str, str]) -> datetime:
    """The row's measurement time; a date-only stamp (the 2026_04_06 export's T00:00:00.000Z, which repeats
    runs the 2026_03_25 export stamps with their start time) stands for the end of that day."""
    m = _MEASURED.search(row["silicon_data_source"])
    if m is None or m.group(2) is None:
        raise Skip("silicon_data_source has no measured=<ISO time>")
    at = datetime.fromisoformat(m.group(1) + m.group(2).replace("Z", "+00:00"))
    if at.time() == time(0):
        at += timedelta(days=1, seconds=-1)
    return at


def _disagg_key(row: dict[str, str]) -> str:
    model = "dsr1" if "deepseek-r1" in row["model_path"].lower() else row["model_path"]
    engine = {"trtllm": "trt", "sglang": "sglang"}.get(row["backend"].strip(), row["backend"].strip())
    return f"{model}-{row.get('precision', '').strip()}-{row['system'].strip().split('_')[0]}-dynamo-{engine}"


def _side_layout(par: Parallel, side: dict[str, Any], prefix: str, notes: list[str]) -> Parallel:
    """The pool's layout by the config: dp-attn turns the worker's tp GPUs into attention-DP ranks."""
    gpus = side["tp"]
    fixed = Parallel(tp=1, dp=gpus, ep=side["ep"]) if side["dp_attn"] else Parallel(tp=gpus, dp=1, ep=side["ep"])
    if fixed != par:
        notes.append(f"{prefix}layout tp {fixed.tp} / dp {fixed.dp} / ep {fixed.ep} by the config's dp-attn "
                     f"{str(side['dp_attn']).lower()} (row: tp {par.tp} / dp {par.dp} / ep {par.ep})")
    return fixed


_MTP_RECIPE = re.compile(r"_mtp(\d+)(?:_\d+)?\.yaml$")
"""Draft tokens in an srt-slurm TRT-LLM recipe name: ``..._mtp3.yaml`` (Hopper, GB300), or ``..._mtp3_40.yaml``
with the benchmark concurrency after it (B300: recipes/trtllm/b300-fp8/8k1k/mtp/ctx1_gen2_tp8_batch16_eplb0_mtp3_40.yaml,
InferenceX 04b564b39:.github/configs/nvidia-master.yaml:1009)."""
SGLANG_H100_MTP_STEPS = 2
"""Draft tokens of InferenceMAX's SGLang DeepSeek-R1 H100 MTP recipes (srt-slurm branch sa-submission-q1-2026,
recipes/h100/*/mtp/h100-fp8-1p*-mtp.yaml). Those files are not in reach here; every H100 MTP recipe of the
same repository that is (6a30b5d: recipes/h100/1k1k/mtp/h100-fp8-2p4d-max-dep-mtp.yaml,
recipes/h100/8k1k/mtp/h100-fp8-2p2d-max-dep-mtp.yaml) runs speculative-algorithm EAGLE with the NextN module,
speculative-num-steps 2, eagle-topk 1, num-draft-tokens 3 on prefill and decode workers: a chain of 2."""


def _entry_spec_tokens(entry: dict[str, Any], key: str) -> int:
    """Draft tokens of an MTP config entry: TRT-LLM recipes name them (``..._mtp3.yaml``), SGLang's H100
    recipes run :data:`SGLANG_H100_MTP_STEPS`; raises :class:`Skip` where the recipe does not say."""
    recipes = [a.split("=", 1)[1] for a in entry["prefill"]["additional_settings"] if a.startswith("CONFIG_FILE=")]
    for recipe in recipes:
        found = _MTP_RECIPE.search(recipe)
        if found:
            return int(found.group(1))
    if key.endswith("-h100-dynamo-sglang") and any("/mtp/" in r for r in recipes):
        return SGLANG_H100_MTP_STEPS
    raise Skip(f"harness: MTP speculative decoding ({entry['source']}, recipe {', '.join(recipes) or 'none'}): "
               "the number of draft tokens is not known")


def _matching_entries(entries: list[dict[str, Any]], sides: dict[str, Parallel], isl: int, osl: int, conc: int,
                      *, exact: bool) -> list[dict[str, Any]]:
    """Config entries a disaggregated row matches: ISL / OSL, client concurrency, each pool's GPUs and EP.

    ``exact=False`` leaves out the decode pool's EP: the Blackwell exports (2026_03_25 / 2026_04_06 GB300 and
    B300 rows) repeat the prefill pool's EP (the id's ``epX``) as ``decode_moe_ep_size``, e.g. GB300 SGLang
    NVFP4 1k/1k c4096 lists decode tp 48 / ep 4 for dsr1-fp4-gb300-dynamo-sglang's max_tpt entry (decode tp
    48, ep 48, dp-attn; InferenceX 3282fdeba:.github/configs/nvidia-master.yaml). Only tried where the exact
    match finds nothing and the two columns agree, and not on Hopper rows (5 H200 SGLang 8k/1k rows would match
    it too; their mapping is kept as it was until it is reviewed)."""
    return [e for e in entries if (e["isl"], e["osl"]) == (isl, osl) and conc in (e["row_concurrency"] or [])
            and e["prefill"]["tp"] == sides["prefill"].gpus and e["prefill"]["ep"] == sides["prefill"].ep
            and e["decode"]["tp"] == sides["decode"].gpus and (not exact or e["decode"]["ep"] == sides["decode"].ep)]


_EPLB_RECIPE = re.compile(r"_eplb(\d+)_")
"""Expert slots in an srt-slurm TRT-LLM recipe name: the generation workers' load_balancer.num_slots
(recipes/trtllm/gb300-fp4/1k1k/mtp/ctx3_gen1_dep32_batch32_eplb288_mtp3.yaml: decode num_slots 288,
layer_updates_per_iter 1; the context workers have no load balancer). ``eplb0``: none."""
SGLANG_REDUNDANT_EXPERTS: dict[str, dict[str, int]] = {
    "recipes/gb300-fp4/1k1k/max_tpt.yaml": {"decode": 32},
    "recipes/gb300-fp4/8k1k/mid_curve.yaml": {"decode": 32},
    "recipes/gb300-fp8/8k1k/stp/max.yaml": {"prefill": 32, "decode": 32},
}
"""``ep-num-redundant-experts`` of InferenceMAX's SGLang recipes whose decode EP (48, 24) does not divide
DeepSeek-R1's 256 experts, per pool: srt-slurm (InferenceX runners/launch_gb300-nv.sh at 3282fdeba checks out
ishandhanani/srt-slurm branch sa-submission-q1-2026; read at ab58651 for gb300-fp4, f64d2b9 for gb300-fp8).
Each runs ``ep-dispatch-algorithm: static`` without ``--init-expert-location``; the fp8 recipe's dep8 prefill
pool launches 32 redundant experts too."""


def _eplb_slots(row: dict[str, str], entry: dict[str, Any], sides: dict[str, Parallel],
                notes: list[str]) -> dict[str, Parallel]:
    """The pools' redundant expert slots by the matched entry's recipe (Deployment.redundant_experts):
    TRT-LLM's ``eplbN`` with N > E slots gives the decode pool N - E (N = E balances without extra slots,
    which the twin does not model), SGLang's recipes :data:`SGLANG_REDUNDANT_EXPERTS`; a pool whose EP still
    does not divide the E experts gets the smallest count that makes it, noted as inferred."""
    import hardware

    model = hardware.load_model(row["model_path"])
    routed = {f.num_experts for _, f in model.layers if f is not None and f.kind == "moe"}
    if len(routed) != 1:
        return sides
    experts = routed.pop()
    recipes = [a.split("=", 1)[1] for a in entry["prefill"]["additional_settings"]
               if a.startswith("CONFIG_FILE=")]
    slots: dict[str, int] = {}
    for recipe in recipes:
        found = _EPLB_RECIPE.search(recipe)
        if found and int(found.group(1)) > experts:
            slots["decode"] = int(found.group(1)) - experts
            notes.append(f"decode redundant_experts {slots['decode']} ({recipe}: {found.group(1)} expert "
                         f"slots for {experts} experts)")
        for side, count in SGLANG_REDUNDANT_EXPERTS.get(recipe, {}).items():
            slots[side] = count
            notes.append(f"{side} redundant_experts {count} ({recipe}: ep-num-redundant-experts {count})")
    for side, par in sides.items():
        if side not in slots and experts % par.ep:
            slots[side] = -experts % par.ep
            notes.append(f"{side} redundant_experts {slots[side]} inferred: ep {par.ep} does not divide "
                         f"{experts} experts and the recipe's count is not known (the smallest that divides)")
    return {s: attrs.evolve(par, redundant_experts=slots.get(s, 0)) for s, par in sides.items()}


def _inferencemax_disagg(row: dict[str, str], sides: dict[str, Parallel], isl: int, osl: int, conc: int,
                         notes: list[str]) -> tuple[dict[str, Parallel], int, int, int]:
    """Worker counts and layout of an InferenceMAX disaggregated row, from the nvidia-master.yaml version in
    effect when it was measured (validation/harness/inferencemax_disagg.json, one entry per search-space
    item). A row matches an entry by ISL / OSL, its client concurrency (the entry's ``row_concurrency``)
    and each pool's GPUs (tp) and EP; the export carries no dp-attn, so the config's layout is used.

    Returns the pools' layouts, worker counts and the MTP draft tokens of the matched entries (0: none).
    Raises :class:`Skip` where the matched entries mix MTP and plain decoding, disagree on the deployment or
    on the draft count; with no match, 1 prefill + 1 decode worker are assumed as before, and noted.
    """
    key, at = _disagg_key(row), _measured_at(row)
    versions = [v for v in _disagg_configs().get(key, [])
                if datetime.fromisoformat(v["committed"]) <= at]
    found: list[dict[str, Any]] = []
    where = f"{key} has no version before {at:%Y-%m-%d %H:%M}Z"
    if versions:
        version = versions[-1]
        found = _matching_entries(version["entries"], sides, isl, osl, conc, exact=True)
        if not found and sides["decode"].ep == sides["prefill"].ep and row["system"].strip() not in HOPPER:
            found = _matching_entries(version["entries"], sides, isl, osl, conc, exact=False)
            if found:
                notes.append(f"decode_moe_ep_size {sides['decode'].ep} repeats the prefill's: decode matched by "
                             "its GPUs alone")
        where = f"{key} @ {version['commit'][:9]}"
    if not found:
        notes.append(f"no InferenceMAX config matched ({where}, {isl}/{osl}, concurrency {conc}): "
                     "1 prefill + 1 decode worker assumed")
        return sides, 1, 1, 0
    mtp = [e for e in found if e["spec_decoding"] != "none"]
    if mtp and len(mtp) < len(found):
        raise Skip(f"harness: matches an MTP and an STP entry of {where} ({', '.join(e['source'] for e in found)}); "
                   "the row does not say which ran")
    drafts = {_entry_spec_tokens(e, key) for e in mtp}
    if len(drafts) > 1:
        raise Skip(f"harness: matches MTP entries of {where} with {sorted(drafts)} draft tokens "
                   f"({', '.join(e['source'] for e in found)}); the row does not say which ran")
    shapes = {json.dumps([e["prefill"], e["decode"]], sort_keys=True) for e in found}
    if len(shapes) > 1:
        raise Skip(f"harness: matches {len(found)} deployments of {where} "
                   f"({', '.join(e['source'] for e in found)}); the row does not say which ran")
    entry = found[0]
    out = {s: _side_layout(sides[s], entry[s], f"{s} ", notes) for s in ("prefill", "decode")}
    out = _eplb_slots(row, entry, out, notes)
    pw, dw = entry["prefill"]["num_worker"], entry["decode"]["num_worker"]
    notes.append(f"workers {pw} prefill + {dw} decode from {entry['source']}")
    k = drafts.pop() if drafts else 0
    if k:
        notes.append(f"MTP speculative decoding, {k} draft tokens ({entry['source']})")
    return out, pw, dw, k


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
    isl, osl, conc = _int(row, "isl"), _int(row, "osl"), concurrency(row)
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
        if _int(row, "pp_size", 1) > 1:
            raise Skip("pipeline parallelism (pp_size > 1) is not modelled")
        per_rank = _int(row, "batch_size", 0) or None
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
            if _int(row, f"{side}_pp_size", 1) > 1:
                raise Skip(f"pipeline parallelism ({side}_pp_size > 1) is not modelled")
            sides[side] = _parallel(row, f"{side}_", notes, per_rank=None, total=None)
        pw, dw = _int(row, "prefill_num_workers", 0), _int(row, "decode_num_workers", 0)
        spec_tokens = 0
        if not pw or not dw:
            if _inferencemax_disagg_row(row):
                sides, pw, dw, spec_tokens = _inferencemax_disagg(row, sides, isl, osl, conc, notes)
            else:
                missing = [f"{side}_num_workers" for side, n in (("prefill", pw), ("decode", dw)) if not n]
                notes.append(f"{' and '.join(missing)} empty or 0 in the row: 1 assumed "
                             f"({pw or 1} prefill + {dw or 1} decode workers)")
        return RowSpec(mode=mode, concurrency=conc, prefill=sides["prefill"], decode=sides["decode"],
                       prefill_workers=pw or 1, decode_workers=dw or 1,
                       prefill_batch=_int(row, "prefill_batch_size", 0), decode_batch=_int(row, "decode_batch_size", 0),
                       spec_tokens=spec_tokens, notes=tuple(notes), **common)  # type: ignore[arg-type]
    raise Skip(f"mode {mode!r} is neither agg nor disagg")


@attrs.frozen
class Protocol:
    """How the benchmark client drove one row (closed loop at the row's concurrency c).

    ``low_frac``: ISL and OSL drawn uniformly from [low_frac x L, L] (1.0: fixed); ``waves``: measured
    requests per client slot. Every client here starts its measured requests on an idle server (a warm-up
    runs to completion first), so none is simulated and every request counts.
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
    attention-DP balance and batch-wait settings (:func:`_b300_settings`), or the engine's defaults where no
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
        b300 = _b300_settings(row, spec)
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
        out.update(_inferencemax_trtllm(spec, conc, harness_speculative(row, spec, proto), _measured(row)))
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


def _measured(row: dict[str, str]) -> str:
    """The measurement date (YYYY-MM-DD) named in ``silicon_data_source``, or ''."""
    m = _MEASURED.search(row.get("silicon_data_source", ""))
    return m.group(1) if m else ""


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
    model, day = spec.model.lower(), _measured(row)
    if "gpt-oss" in model and spec.backend == "vllm" and spec.gpu == "h100_sxm" and day in ("2025-12-05", "2025-12-08"):
        return ("harness: the client ran 512 requests at once against a server capped at --max-num-seqs CONC "
                "(gptoss_fp4_h100_docker.sh, 25506e8), and that cap is not in the row")
    return None


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
    sets without a prefix). InferenceMAX B300 rows: every B300 script turns the cache off (:func:`_b300_settings`;
    none where no script matches the row)."""
    if proto is GENAI_PERF and spec.mode == "agg" and spec.backend == "trtllm":
        return False
    if proto is not INFERENCEMAX or spec.mode != "agg":
        return None
    if spec.gpu not in HOPPER:
        return _b300_settings(row, spec).get("prefix_caching")
    model, day = spec.model.lower(), _measured(row)
    if "glm-5" in model:
        return None
    if "kimi-k2" in model and (not day or day < "2026-03-27"):
        return None
    if "minimax-m2" in model and day < "2026-03-28":
        return None
    return False


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


def harness_speculative(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> int:
    """MTP draft tokens the row's harness ran (0: none).

    InferenceMAX DeepSeek-R1 TRT-LLM aggregated rows measured 2026-01-14: the run that merge bf34567
    triggered queued only the dsr1-*-trt-mtp configurations; dsr1_fp8_h200_trt_mtp_slurm.sh (bf34567) sets
    speculative_config decoding_type MTP with num_nextn_predict_layers 3, or 1 when DP_ATTENTION is true
    (nvidia-master.yaml dsr1-fp8-h200-trt-mtp: dp-attn from CONC 128 at 1k/1k, 256 at 1k/8k, 64 at 8k/1k,
    which the rows' attention-DP columns carry). Disaggregated rows: the matched config entry's recipe
    (:func:`_inferencemax_disagg`).
    """
    if spec.mode == "disagg":
        return spec.spec_tokens
    if proto is INFERENCEMAX and "deepseek" in spec.model.lower() and spec.backend == "trtllm" \
            and _measured(row) == "2026-01-14":
        assert spec.agg is not None
        return 1 if spec.agg.dp > 1 else 3
    return 0


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
    InferenceMAX B300 rows: their script's KV dtype, memory fraction and vLLM --block-size (:func:`_b300_settings`).
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
        b300 = _b300_settings(row, spec)
        out.update({k: b300[k] for k in ("kv_dtype", "gpu_memory_utilization", "block_size") if k in b300})
    return out


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


def harness_moe_kernel(row: dict[str, str], spec: "RowSpec", proto: Protocol) -> str:
    """The routed-expert kernel family the row's harness selected (``default``: the engine's own).

    InferenceMAX gpt-oss-120b on vLLM from cec542a9a (merged 2026-03-27T08:01:48Z, vLLM 0.18.0; the rows
    measured 2026-03-27): gptoss_fp4_h100.sh:28 and gptoss_fp4_h200.sh:47 export VLLM_MXFP4_USE_MARLIN=1,
    so the MXFP4 experts run vLLM's Marlin w4a16 kernel instead of OpenAI's triton_kernels (the opdb times
    both: validation/harness/inferencemax_flags.md). The 2025-11 scripts do not set it.
    """
    if proto is INFERENCEMAX and spec.backend == "vllm" and "gpt-oss" in spec.model.lower() \
            and _measured(row) >= "2026-03-27":
        return "marlin"
    return "default"


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
    script's --cuda-graph-max-bs / --max-cudagraph-capture-size (:func:`_b300_settings`).
    """
    if spec.backend == "trtllm" and spec.mode == "disagg":
        return {"cuda_graph_max_size": spec.decode_batch} if spec.decode_batch else {}
    if proto is GENAI_PERF and spec.mode == "agg" and spec.backend == "trtllm":
        return {"cuda_graph_sizes": list(range(1, spec.harness_batch + 1))}
    if proto is not INFERENCEMAX or spec.mode != "agg":
        return {}
    if spec.gpu not in HOPPER:   # (and the MoE kernel the script names: --moe-runner-backend flashinfer_trtllm)
        b300 = _b300_settings(row, spec)
        return {k: b300[k] for k in ("cuda_graph_max_size", "moe_kernel") if k in b300}
    model, day = spec.model.lower(), _measured(row)
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


HOPPER = ("h100_sxm", "h100_pcie", "h200_sxm")


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


# Disaggregated rows of no known harness: Dynamo's own benchmark driver (benchmarks/utils/aiperf.py) sends
# max(3 x concurrency, 10) requests of fixed length.
DYNAMO = Protocol("dynamo-aiperf", 1.0, 3)


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
    if row.get("mode", "").strip() != "disagg" or _inferencemax_disagg_row(row):
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
    day = _measured(row)
    if proto is INFERENCEMAX and row.get("mode", "").strip() == "agg" and day:
        return "warm-up" if day >= INFERENCEMAX_WARMUP_SINCE else "no warm-up"
    return "unknown"


def _lengths(value: int, low_frac: float) -> dict[str, int]:
    low = max(1, int(value * low_frac))
    return {"fixed": value} if low >= value else {"low": low, "high": value}


def parse_prompt_pool(text: str) -> tuple[str, int]:
    """``SAMPLING:K`` (``random:12``) -> (sampling, dataset entries per client slot); see :func:`row_config`."""
    from workloads.generators import POOL_SAMPLINGS

    how, sep, per_slot = text.partition(":")
    if how not in POOL_SAMPLINGS or not sep or not per_slot.isdigit() or int(per_slot) < 1:
        raise ValueError(f"prompt pool {text!r}: expected SAMPLING:K with SAMPLING one of "
                         f"{', '.join(POOL_SAMPLINGS)} and K >= 1 dataset entries per client slot (random:12)")
    return how, int(per_slot)


def row_config(row: dict[str, str], *, waves: int | None = None, prompt_pool: str | None = None) -> dict[str, Any]:
    """The twin config for one row (raises :class:`Skip` with the reason when it cannot be represented).

    The workload follows the row's benchmark client (:func:`protocol`); ``waves`` overrides its measured
    requests per client slot. ``prompt_pool`` (``SAMPLING:K``, a what-if for genai-perf rows only) has their
    requests draw prompts from K x c dataset entries by that rule (``workload.prompt_pool``): aiperf's
    ``--num-dataset-entries`` and ``--dataset-sampling-strategy``; the warm-up's draws are not simulated, so
    entries it alone sent are not in the cache when the measured requests start.
    Aggregated rows with attention DP (dp ranks) simulate the engine's dp ranks in lockstep (twin.dpgroup),
    serving all the clients; each rank's limits are its own. So do the engines of a disaggregated pool, whose
    ranks the routers see one by one.
    """
    spec = row_spec(row)
    proto = protocol(row)
    reason = harness_skip(row, spec, proto)
    if reason:
        raise Skip(reason)
    conc = spec.concurrency
    per_slot = waves if waves is not None else proto.waves
    cfg: dict[str, Any] = {
        "name": row["id"], "hardware": {"gpu": spec.gpu}, "engine": {"name": spec.backend},
        "model": {"name": spec.model, "weight_dtype": spec.weight_dtype},
        "workload": {"kind": "synthetic", "num_requests": max(per_slot * conc, 10),
                     "arrival": {"kind": "concurrency", "concurrency": conc},
                     "input_tokens": _lengths(spec.isl, proto.low_frac),
                     "output_tokens": _lengths(spec.osl, proto.low_frac)},
        "metrics": {"sample_interval_s": 5.0}, "run": {"seed": 0},
    }
    limits = deployment_limits(row, spec, proto)
    if limits:
        cfg["scheduler"] = limits
    kernel = harness_moe_kernel(row, spec, proto)
    if kernel == "default":
        kernel = engine_moe_kernel(row, spec)
    if kernel != "default":
        cfg["engine"]["moe_kernel"] = kernel
    cfg["engine"].update(harness_graphs(row, spec, proto))
    sampling = harness_sampling(row, spec, proto)
    if sampling != "greedy":
        cfg["engine"]["sampling"] = sampling
    drafts = harness_speculative(row, spec, proto)
    if drafts:
        cfg["engine"]["speculative"] = {"method": "mtp", "num_speculative_tokens": drafts,
                                        "acceptance": mtp_acceptance(drafts)}
    caching = harness_prefix_caching(row, spec, proto)
    if caching is not None:
        cfg["kv_cache"] = {"prefix_caching": caching}
    kv = harness_kv(row, spec, proto)
    if "kv_dtype" in kv:
        cfg["model"]["kv_dtype"] = kv["kv_dtype"]
    for key in ("gpu_memory_utilization", "block_size"):
        if key in kv:
            cfg["kv_cache"] = {**cfg.get("kv_cache", {}), key: kv[key]}
    if prompt_pool is not None and proto is GENAI_PERF:
        how, per_slot_entries = parse_prompt_pool(prompt_pool)
        cfg["workload"].update(prompt_pool=per_slot_entries * conc, pool_sampling=how)
    if spec.mode == "agg":
        assert spec.agg is not None
        cfg["system"] = {"kind": "colocated", "tp": spec.agg.tp, "ep": spec.agg.ep, "attention_dp": spec.agg.dp}
        return cfg
    assert spec.prefill is not None and spec.decode is not None
    pools: dict[str, Any] = {}
    for side, par, workers, batch in (("prefill", spec.prefill, spec.prefill_workers, spec.prefill_batch),
                                      ("decode", spec.decode, spec.decode_workers, spec.decode_batch)):
        pools[side] = {"workers": workers, "tp": par.tp, "ep": par.ep, "attention_dp": par.dp}
        if par.redundant_experts:
            pools[side]["redundant_experts"] = par.redundant_experts
        if batch:
            pools[side]["max_num_seqs"] = batch
    # An engine takes tp x attention_dp GPUs on one node, so a wide one (TP16, or DP16 attention) gets nodes
    # as large as itself: its transfers cross the NIC anyway.
    widest = max(spec.prefill.tp * spec.prefill.dp, spec.decode.tp * spec.decode.dp)
    cfg["system"] = {"kind": "disaggregated", **pools, "decode_router": {"kind": "least_loaded"}}
    if widest > 8:
        cfg["system"]["gpus_per_node"] = widest
    cfg["router"] = {"kind": "least_loaded"}
    return cfg


def row_sha(row: dict[str, str]) -> str:
    """A fingerprint of the row's cells: a resumed run reuses a journalled result only for the same row."""
    cells = {k: v for k, v in row.items() if not k.startswith("_")}
    return hashlib.sha256(json.dumps(cells, sort_keys=True).encode()).hexdigest()[:16]


def _measured_ms(row: dict[str, str], key: str) -> float:
    """A measured latency of the row: a finite number > 0 (else the row is skipped, before simulating)."""
    text = (row.get(key) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise Skip(f"column {key}={text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise Skip(f"column {key}={text!r}: expected a measured latency > 0")
    return value


def measured_means(table: np.ndarray) -> tuple[float, float, int]:
    """Mean TTFT and mean per-request TPOT (seconds) over the finished requests (the benchmark client's
    own definitions), and how many requests that is."""
    done = table[table["status"] == "finished"]
    tpot = done["tpot_s"][np.isfinite(done["tpot_s"])]
    return float(np.mean(done["ttft_s"])), float(np.mean(tpot)) if len(tpot) else float("nan"), len(done)


UNREPRESENTABLE = (TwinError, ValueError, NotImplementedError)
"""What building or running a row's simulation raises where the twin cannot represent the row."""


def simulate_row(row: dict[str, str], overrides: Mapping[str, Any] = MappingProxyType({})) -> dict[str, Any]:
    """Predicted vs measured TTFT / TPOT for one row, or its skip reason; ``overrides`` are
    :func:`row_config`'s keywords (``waves``, ``prompt_pool``)."""
    from twin.config import load_config
    from twin.runner import Simulation

    out = _row_head(row)
    try:  # (row_spec skips a ragged row)
        cfg = load_config(row_config(row, **_row_kwargs(overrides)), list(overrides.get("settings", ())))
        _measured_ms(row, "silicon_ttft_ms"), _measured_ms(row, "silicon_tpot_ms")  # (before simulating)
        res = Simulation(cfg).run()
    except Skip as exc:
        return {**out, "skipped": str(exc)}
    except UNREPRESENTABLE as exc:
        return {**out, "skipped": f"not representable: {exc}"}
    s = res.summary
    if s["requests"]["failed"]:
        kinds = "; ".join(f"{e['count']} x {e['example']}" for e in s["fail_reasons"].values())
        return {**out, "skipped": f"{s['requests']['failed']} requests failed: {kinds}"}
    ttft_s, tpot_s, _ = measured_means(res.requests)
    return _row_result(row, out, ttft_s * 1e3, tpot_s * 1e3, s["sim"]["wall_s"])


def _row_head(row: dict[str, str]) -> dict[str, Any]:
    return {"id": row["id"], "line": int(row["_line"]), "row_sha": row_sha(row), "system": row["system"],
            "backend": row["backend"], "model": row["model_path"], "mode": row["mode"]}


def _row_result(row: dict[str, str], out: dict[str, Any], pred_ttft: float, pred_tpot: float,
                wall_s: float) -> dict[str, Any]:
    """A represented row's result: its predictions against its own measured latencies."""
    spec = row_spec(row)
    meas_ttft, meas_tpot = _measured_ms(row, "silicon_ttft_ms"), _measured_ms(row, "silicon_tpot_ms")
    return {**out, "notes": "; ".join(spec.notes), "isl": row["isl"], "osl": row["osl"],
            "concurrency": spec.concurrency, "protocol": protocol(row).name,
            "pred_ttft_ms": pred_ttft, "meas_ttft_ms": meas_ttft, "ttft_err_pct": 100 * (pred_ttft - meas_ttft) / meas_ttft,
            "pred_tpot_ms": pred_tpot, "meas_tpot_ms": meas_tpot, "tpot_err_pct": 100 * (pred_tpot - meas_tpot) / meas_tpot,
            "wall_s": wall_s}


def _row_kwargs(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`row_config`'s keywords among a run's overrides (``settings``, the config overrides every row
    takes, are applied to the loaded config instead)."""
    return {k: v for k, v in overrides.items() if k != "settings"}


def simulation_key(row: dict[str, str], overrides: Mapping[str, Any] = MappingProxyType({})) -> str | None:
    """Fingerprint of the simulation a row asks for: its twin config without the config's name (the row id,
    which no part of a run reads), or None where the row is skipped before it is simulated (its config or its
    measured latencies are not usable; such a row is handled on its own).

    The twin gives the same results for the same config, bit for bit, so rows with one key share one
    simulation (:func:`shared_result`). Such rows are one benchmark listed under several ids (InferenceMAX's
    day files, a DeepSeek run listed as tp 64 and as tp 8) or one configuration measured again: 258 of the
    1,584 represented aggregated rows of silicon_h100_h200.csv."""
    try:
        cfg = row_config(row, **_row_kwargs(overrides))
        _measured_ms(row, "silicon_ttft_ms"), _measured_ms(row, "silicon_tpot_ms")
    except (Skip, *UNREPRESENTABLE):  # (simulate_row gives the reason)
        return None
    cfg = {k: v for k, v in cfg.items() if k != "name"}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def shared_result(row: dict[str, str], done: dict[str, Any]) -> dict[str, Any]:
    """The result of ``row`` from ``done``, the result of a row with the same :func:`simulation_key`: the same
    predictions (or the same simulation's skip reason) against this row's own measured latencies.
    ``simulated_with`` names the line that was simulated, and ``wall_s`` is 0 (no simulation of its own)."""
    out = {**_row_head(row), "simulated_with": done.get("simulated_with", done["line"])}
    if "skipped" in done:
        return {**out, "skipped": done["skipped"]}
    return _row_result(row, out, done["pred_ttft_ms"], done["pred_tpot_ms"], 0.0)


def _mape(values: Iterable[float]) -> float:
    v = [abs(x) for x in values if x == x and math.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")


def error_spread(errors: list[float]) -> dict[str, float | None]:
    """Beside the MAPE, what it hides: the median absolute and the median signed error (%), and the share of
    rows within 10 % of the measurement (None without rows)."""
    if not errors:
        return {"median_abs": None, "median_signed": None, "within_10": None}
    e = np.asarray(errors, dtype=float)
    return {"median_abs": float(np.median(np.abs(e))), "median_signed": float(np.median(e)),
            "within_10": float(np.mean(np.abs(e) <= 10.0))}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in results if "skipped" not in r]
    out: dict[str, Any] = {
        "rows": len(results), "rows_represented": len(done),
        "rows_skipped": [{"id": r["id"], "line": r["line"], "reason": r["skipped"]} for r in results if "skipped" in r],
    }
    reasons: dict[str, int] = {}
    for r in results:
        if "skipped" in r:
            reasons[r["skipped"]] = reasons.get(r["skipped"], 0) + 1
    out["skip_reasons"] = dict(sorted(reasons.items(), key=lambda kv: -kv[1]))
    for mode in ("agg", "disagg"):
        sub = [r for r in done if r["mode"] == mode]
        out[mode] = {"rows": len(sub), "tpot_mape": _mape(r["tpot_err_pct"] for r in sub),
                     "ttft_mape": _mape(r["ttft_err_pct"] for r in sub),
                     **{f"{m}_{k}": v for m in ("tpot", "ttft")
                        for k, v in error_spread([r[f"{m}_err_pct"] for r in sub]).items()}}
        for key in ("system", "backend", "model"):
            groups: dict[str, list[dict[str, Any]]] = {}
            for r in sub:
                groups.setdefault(r[key], []).append(r)
            out[mode][f"by_{key}"] = {g: {"rows": len(rs), "tpot_mape": _mape(r["tpot_err_pct"] for r in rs),
                                          "ttft_mape": _mape(r["ttft_err_pct"] for r in rs)}
                                      for g, rs in sorted(groups.items())}
    agg = out["agg"]
    out["tpot_mape"], out["ttft_mape"] = agg["tpot_mape"], agg["ttft_mape"]
    return out


def _row_cost(row: dict[str, str]) -> int:
    """Rough simulation cost of a row (concurrency x output tokens), to start the longest rows first;
    read through :func:`row_spec`, so disaggregated rows count their client concurrency too."""
    try:
        spec = row_spec(row)
    except Skip:
        return 0
    return spec.concurrency * (spec.osl + spec.isl // 64)


def validate_silicon(path: str | Path, out_dir: str | Path, *, jobs: int = 1, limit: int | None = None,
                     match: str | None = None, waves: int | None = None, executor: Executor | None = None,
                     progress: bool = True, resume: bool = False, prompt_pool: str | None = None,
                     settings: Sequence[str] = ()) -> dict[str, Any]:
    """Simulate every row, write ``rows.csv`` and ``summary.json`` into ``out_dir``; returns the summary.
    ``settings``: config overrides (``path=value``) every row's config takes on top of its harness's, for a
    what-if over the measured rows (``hardware.constants=hopper``: Blackwell rows priced with the Hopper
    kernel constants).

    Each finished row is appended to ``out_dir/rows.jsonl`` as it completes (longest rows are started first
    when running in parallel), so an interrupted run keeps its work: ``resume=True`` reuses the rows that file
    holds and simulates the rest. The journal's first line records the CSV and ``waves`` (and ``prompt_pool``
    where given, :func:`row_config`); resuming a journal written for other settings is an error. Rows asking
    for the same simulation (:func:`simulation_key`) share one: the first such row of the file is simulated,
    and the others' results name it in ``simulated_with``."""
    for name, value in (("jobs", jobs), ("limit", limit), ("waves", waves)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if prompt_pool is not None:
        parse_prompt_pool(prompt_pool)
    pattern = re.compile(match) if match else None  # a bad pattern fails before anything is read
    rows = read_rows(path)
    if pattern is not None:
        rows = [r for r in rows if pattern.search(r["id"])]
    if limit is not None:
        rows = rows[:limit]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    journal = out / "rows.jsonl"
    overrides = {"waves": waves, **({"prompt_pool": prompt_pool} if prompt_pool is not None else {}),
                 **({"settings": list(settings)} if settings else {})}
    if settings:   # a bad setting fails before anything runs, naming itself
        from twin.config import load_config

        load_config(None, list(settings))
    header = {"csv": str(Path(path).resolve()), **overrides}
    done: dict[int, dict[str, Any]] = {}
    if resume and journal.is_file():
        lines = journal.read_text().splitlines()
        try:
            first = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            first = lines[0]
        if first != header:
            raise ValueError(f"{journal}: written for {first if lines else 'nothing'}, not for {header}; "
                             f"remove it or run without --resume")
        for n, line in enumerate(lines[1:], 2):
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                if n == len(lines):
                    break       # a row cut off by the interruption: simulated again
                raise ValueError(f"{journal}, line {n}: not a JSON row") from None
            if not isinstance(r, dict) or not isinstance(r.get("line"), int) or "id" not in r:
                raise ValueError(f"{journal}, line {n}: not a row of this journal (no id or line)")
            done[r["line"]] = r
    # (re)start the journal: the header and the rows kept, without a line cut off by an interruption
    journal.write_text("".join(json.dumps(x) + "\n" for x in [header, *done.values()]))
    # A journalled result stands for the CSV row now at its line only if that row is unchanged (its id, and
    # its cells where the journal has their fingerprint); an edited row is simulated again.
    current = {int(r["_line"]): r for r in rows}
    done = {k: v for k, v in done.items() if k in current and v["id"] == current[k]["id"]
            and v.get("row_sha", row_sha(current[k])) == row_sha(current[k])}
    todo = [r for r in rows if int(r["_line"]) not in done]
    # Rows asking for the same simulation share one (simulation_key): the first row of each key in the file is
    # simulated (or its journalled result kept), the others take its result.
    keys = {int(r["_line"]): simulation_key(r, overrides) for r in rows}
    leader: dict[str, int] = {}  # simulation key -> line of the first row asking for it
    for r in rows:
        key = keys[int(r["_line"])]
        if key is not None:
            leader.setdefault(key, int(r["_line"]))
    waiting: dict[int, list[dict[str, str]]] = {}  # leader's line -> the todo rows that take its result
    own_sims = []
    for r in todo:
        key, at = keys[int(r["_line"])], int(r["_line"])
        if key is not None and leader[key] != at:
            waiting.setdefault(leader[key], []).append(r)
        else:
            own_sims.append(r)
    own = executor is None and jobs > 1
    pool = ProcessPoolExecutor(max_workers=jobs) if own else executor
    with open(journal, "a") as jf:
        def record(result: dict[str, Any]) -> None:
            jf.write(json.dumps(result) + "\n")
            jf.flush()
            done[int(result["line"])] = result
            if progress:
                print(f"\r{len(done)}/{len(rows)} rows", end="", flush=True)
            for other in waiting.pop(int(result["line"]), []):
                record(shared_result(other, result))

        for at in [at for at in waiting if at in done]:  # leaders simulated before an interruption
            for other in waiting.pop(at):
                record(shared_result(other, done[at]))
        try:
            if pool is None:
                for row in own_sims:
                    record(simulate_row(row, overrides))
            else:
                futures = [pool.submit(simulate_row, row, overrides)
                           for row in sorted(own_sims, key=_row_cost, reverse=True)]
                for fut in as_completed(futures):
                    record(fut.result())
        finally:
            if own and pool is not None:
                pool.shutdown(cancel_futures=True)
    if progress:
        print()
    results = [done[int(r["_line"])] for r in rows]
    cols = ["id", "line", "system", "backend", "model", "mode", "isl", "osl", "concurrency", "protocol", "pred_ttft_ms",
            "meas_ttft_ms", "ttft_err_pct", "pred_tpot_ms", "meas_tpot_ms", "tpot_err_pct", "wall_s", "simulated_with", "skipped",
            "notes"]
    with open(out / "rows.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols)
        writer.writeheader()
        for r in results:
            writer.writerow({c: r.get(c, "") for c in cols})
    summary = summarize(results)
    (out / "summary.json").write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n")
    return summary



def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"rows: {summary['rows']}, represented: {summary['rows_represented']}, "
             f"skipped: {len(summary['rows_skipped'])}"]
    for mode in ("agg", "disagg"):
        m = summary[mode]
        lines.append(f"{mode}: {m['rows']} rows, TPOT MAPE {m['tpot_mape']:.1f} %, TTFT MAPE {m['ttft_mape']:.1f} %")
        if m["rows"]:
            for metric in ("tpot", "ttft"):
                lines.append(f"  {metric.upper()}: median |error| {m[f'{metric}_median_abs']:.1f} %, median signed "
                             f"{m[f'{metric}_median_signed']:+.1f} %, within 10 %: "
                             f"{100 * m[f'{metric}_within_10']:.0f} % of rows")
        for key in ("backend", "model", "system"):
            for g, v in m[f"by_{key}"].items():
                lines.append(f"  {key} {g:40} {v['rows']:5} rows  TPOT {v['tpot_mape']:6.1f} %  "
                             f"TTFT {v['ttft_mape']:6.1f} %")
    return "\n".join(lines)
