"""InferenceMAX's disaggregated (Dynamo) deployments: the nvidia-master.yaml config entry a measured row
matches (validation/harness/inferencemax_disagg.json), and from it the pools' worker counts and layouts,
their redundant expert slots and the MTP draft tokens of the recipe that ran.
"""

from __future__ import annotations

import functools
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import attrs

from validation.measured_rows import Parallel, Skip, measured_at
from validation.protocols import HOPPER


DISAGG_CONFIGS = Path(__file__).resolve().parent / "harness" / "inferencemax_disagg.json"


@functools.cache
def _disagg_configs() -> dict[str, Any]:
    """InferenceMAX's disaggregated config versions (validation/harness/make_inferencemax_disagg.py)."""
    return json.loads(DISAGG_CONFIGS.read_text())["configs"]


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


def deployment(row: dict[str, str], sides: dict[str, Parallel], isl: int, osl: int, conc: int,
                         notes: list[str]) -> tuple[dict[str, Parallel], int, int, int]:
    """Worker counts and layout of an InferenceMAX disaggregated row, from the nvidia-master.yaml version in
    effect when it was measured (validation/harness/inferencemax_disagg.json, one entry per search-space
    item). A row matches an entry by ISL / OSL, its client concurrency (the entry's ``row_concurrency``)
    and each pool's GPUs (tp) and EP; the export carries no dp-attn, so the config's layout is used.

    Returns the pools' layouts, worker counts and the MTP draft tokens of the matched entries (0: none).
    Raises :class:`Skip` where the matched entries mix MTP and plain decoding, disagree on the deployment or
    on the draft count; with no match, 1 prefill + 1 decode worker are assumed as before, and noted.
    """
    key, at = _disagg_key(row), measured_at(row)
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
