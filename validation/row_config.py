"""A measured row as a twin config (:func:`row_config`): the row's spec, its client's workload and the
harness's launch rules put together into the config sections the twin loads.
"""

from __future__ import annotations

from typing import Any

from validation.harness_decoding import engine_moe_kernel, harness_moe_kernel, harness_sampling, \
    harness_spec_overlap, harness_speculative, mtp_acceptance
from validation.harness_launch import (deployment_limits, harness_engine_version, harness_graphs, harness_kv,
                                       harness_prefix_caching, harness_skip, harness_unquantised)
from validation.measured_rows import Skip
from validation.protocols import GENAI_PERF, protocol
from validation.row_spec import row_spec


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
    Aggregated rows with attention DP (dp ranks) simulate the engine's dp ranks in lockstep (twin.shell.attention_dp),
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
        "model": {"name": spec.model, "weight_dtype": spec.weight_dtype, **harness_unquantised(row, spec)},
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
    cfg["engine"].update(harness_graphs(row, spec, proto), **harness_engine_version(row, spec))
    sampling = harness_sampling(row, spec, proto)
    if sampling != "greedy":
        cfg["engine"]["sampling"] = sampling
    drafts = harness_speculative(row, spec, proto)
    if drafts:
        cfg["engine"]["speculative"] = {"method": "mtp", "num_speculative_tokens": drafts,
                                        "acceptance": mtp_acceptance(drafts)}
        overlap = harness_spec_overlap(spec)
        if overlap is not None:
            cfg["engine"]["speculative"]["overlap"] = overlap
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
