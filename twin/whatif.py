"""What a hardware what-if moved: the run's workers against the same workers on the named GPU as shipped.

A run whose ``hardware`` section gives values or factors (``hardware.scale.hbm_bw: 1.4``) is built a second
time on the named GPU alone, without running it; for each worker this compares the KV pool and the price of
two reference steps, term by term, so a study can see which ledger terms a knob moved and by how much
(``ledger.json`` ``hardware_whatif``). The reference steps are fixed shapes, not the run's own batches: a
decode step of ``min(64, max_num_seqs)`` requests at 2,048 tokens of context each, and a prefill step of one
prompt filling the token budget (at most 8,192 tokens).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import attrs

from hardware import BatchShape, load_gpu
from hardware.gpu import spec_fields
from twin.config import HardwareConfig, TwinConfig
from twin.core.errors import ConfigError

DECODE_REQUESTS = 64
DECODE_CONTEXT = 2048
PREFILL_TOKENS = 8192
MOVED = 1e-9
"""Relative change below which a term counts as unmoved (float noise of a re-derived spec)."""


def reference_shapes(max_num_seqs: int, max_num_batched_tokens: int) -> dict[str, BatchShape]:
    """The two steps a what-if is shown on, within the worker's own limits."""
    b = max(1, min(DECODE_REQUESTS, max_num_seqs, max_num_batched_tokens))
    n = max(1, min(PREFILL_TOKENS, max_num_batched_tokens))
    return {"decode": BatchShape.from_requests([1] * b, [DECODE_CONTEXT] * b),
            "prefill": BatchShape.from_requests([n], [n])}


def is_whatif(hw: HardwareConfig) -> bool:
    """Whether the section changes its GPU: a factor, or a value that differs from the named GPU's."""
    return bool(hw.scale.factors() or _changed_values(hw))


def _term_table(base: dict[str, float], new: dict[str, float]) -> dict[str, Any]:
    moved = {}
    for name in base:
        a, b = base[name], new.get(name, 0.0)
        if abs(b - a) > MOVED * max(abs(a), abs(b), 1e-12):
            moved[name] = {"named_s": a, "whatif_s": b, "ratio": (b / a) if a else None}
    return {"named_s": sum(base.values()), "whatif_s": sum(new.values()), "moved": moved}


def hardware_whatif(config: TwinConfig, workers: Sequence[Any], names: Mapping[int, str]) -> dict[str, Any] | None:
    """The comparison for a resolved ``config`` whose workers were built (None when the hardware is as
    shipped). Workers with the same deployment and pool are reported once, under their names (``names``: twin.runner.worker_names)."""
    hw = config.hardware
    if not is_whatif(hw):
        return None
    import simpy

    named_hw = HardwareConfig(gpu=hw.gpu, constants=hw.constants, disabled_terms=hw.disabled_terms)
    named_cfg = attrs.evolve(config, hardware=named_hw)
    out: dict[str, Any] = {"gpu": hw.gpu, "factors": hw.scale.factors(), "values": _changed_values(hw),
                           "spec": spec_fields(hw.spec()),
                           "reference_steps": {"decode": f"min({DECODE_REQUESTS}, max_num_seqs) requests at "
                                                         f"{DECODE_CONTEXT} tokens of context",
                                               "prefill": f"one prompt of min({PREFILL_TOKENS}, "
                                                          f"max_num_batched_tokens) tokens"}}
    try:
        named = named_cfg.system.build(simpy.Environment(), named_cfg, lambda req: None)  # type: ignore[attr-defined]
    except ConfigError as exc:
        out["named_gpu_error"] = f"{exc.path}: {exc.message}" if exc.path else exc.message
        return out
    groups: dict[str, dict[str, Any]] = {}
    for w, base in zip(workers, named.workers):
        cm, cm0 = w.prices.cost_model, base.prices.cost_model
        entry: dict[str, Any] = {"kv_blocks": {"named": base.sched.kv.num_blocks, "whatif": w.sched.kv.num_blocks}}
        for label, shape in reference_shapes(cm.max_num_seqs, cm.max_num_batched_tokens).items():
            entry[label] = _term_table(dict(cm0.step_cost(shape).terms), dict(cm.step_cost(shape).terms))
        key = repr(entry)
        if key in groups:
            groups[key]["workers"].append(names[w.wid])
        else:
            groups[key] = {"workers": [names[w.wid]], **entry}
    out["workers"] = list(groups.values())
    return out


def _changed_values(hw: HardwareConfig) -> dict[str, Any]:
    """The section's datasheet values that differ from the named GPU's as shipped (by format for FLOP/s)."""
    shipped = spec_fields(load_gpu(hw.gpu))
    out: dict[str, Any] = {}
    for k, v in hw.values().items():
        if k == "peak_flops":
            diff = {d: r for d, r in v.items() if shipped[k].get(d) != r}
            if diff:
                out[k] = diff
        elif shipped[k] != v:
            out[k] = v
    return out


def describe(whatif: dict[str, Any]) -> list[str]:
    """Console lines: per worker group, the KV pool and each reference step against the named GPU."""
    what = ", ".join([f"{k} x{v:g}" for k, v in whatif["factors"].items()]
                     + [f"{k} = {v}" for k, v in whatif["values"].items()])
    lines = [f"hardware what-if: {whatif['gpu']} with {what}"]
    if "named_gpu_error" in whatif:
        return lines + [f"  (the named GPU alone cannot run this deployment: {whatif['named_gpu_error']})"]
    for g in whatif["workers"]:
        kv = g["kv_blocks"]
        lines.append(f"  {', '.join(g['workers'])}: KV blocks {kv['named']:,} -> {kv['whatif']:,}")
        for label in ("decode", "prefill"):
            step = g[label]
            moved = ", ".join(f"{t} x{m['ratio']:.3g}" if m["ratio"] is not None else t
                              for t, m in step["moved"].items()) or "no term moved"
            lines.append(f"    {label} step {step['named_s'] * 1e3:.3f} -> {step['whatif_s'] * 1e3:.3f} ms ({moved})")
    return lines
