"""``summary.md`` of the decode-decomposition study: where each decode step's largest term moves, from the numbers."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from hardware.cost import TERMS

from experiments.decode_decomposition import Point, Worker, panels

WEIGHT_TERMS = ("qkv_proj", "o_proj", "ssm_proj", "mlp", "moe_experts", "moe_shared", "lm_head")
"""GEMMs over the model's weights: a weight read at small batches, compute at large ones."""
GROUPS: Mapping[str, tuple[str, ...]] = {
    "weight GEMMs": WEIGHT_TERMS,
    "attention": ("attention", "ssm_scan"),
    "collectives": ("tp_allreduce", "ep_alltoall", "ep_imbalance", "pp_sendrecv"),
    "elementwise": ("elementwise", "sampler", "spec_draft"),
    "host / engine": tuple(t for t, (family, _) in TERMS.items() if family != "throughput"),
}
GROWTH = 1.10
"""A term 'grows' once it exceeds its B = 1 time by this factor (it is no longer a fixed read per step)."""


def group_of(term: str) -> str:
    return next(g for g, terms in GROUPS.items() if term in terms)


def largest(p: Point) -> str:
    return max(p.step.terms, key=lambda t: p.step.terms[t])


def runs(points: Sequence[Point]) -> list[tuple[str, int, int]]:
    """The largest term as (term, first batch, last batch) stretches, in batch order."""
    out: list[tuple[str, int, int]] = []
    for p in points:
        top = largest(p)
        if out and out[-1][0] == top:
            out[-1] = (top, out[-1][1], p.batch)
        else:
            out.append((top, p.batch, p.batch))
    return out


def group_share(p: Point, group: str) -> float:
    return sum(p.step.terms.get(t, 0.0) for t in GROUPS[group]) / p.step.total_s


def grows_at(points: Sequence[Point], terms: Sequence[str]) -> int | None:
    """The first batch at which ``terms`` together take GROWTH x their B = 1 time, None if never."""
    base = sum(points[0].step.terms.get(t, 0.0) for t in terms)
    return next((p.batch for p in points if sum(p.step.terms.get(t, 0.0) for t in terms) > GROWTH * base), None)


def kv_rate(worker: Worker, p: Point, context_tokens: int) -> float:
    """The attention term's KV read (every request's context, one GPU's share) as a fraction of HBM bandwidth."""
    nbytes = p.batch * context_tokens * worker.dep.kv_bytes_per_token
    return nbytes / p.step.terms["attention"] / worker.dep.gpu.hbm_bw_Bps


def _stretch(term: str, first: int, last: int) -> str:
    where = f"B = {first}" if first == last else f"B = {first}-{last}"
    return f"{term} ({group_of(term)}, {where})"


def panel_lines(worker: Worker, mine: Sequence[Point], context_tokens: int) -> list[str]:
    first, last = mine[0], mine[-1]
    stretches = runs(mine)
    lines = [f"### {worker.model} on {worker.gpu}", ""]
    moves = ", then ".join(_stretch(*s) for s in stretches)
    if len(stretches) == 1:
        lines.append(f"- Largest term at every batch size: {moves}.")
    else:
        changes = "; ".join(f"{a[0]} -> {b[0]} at B = {b[1]}" for a, b in zip(stretches, stretches[1:]))
        lines.append(f"- Largest term: {moves}. **The bottleneck moves {changes}.**")
    lines.append(f"- Step time per token {first.seconds_per_token * 1e3:.2f} ms at B = {first.batch}, "
                 f"{last.seconds_per_token * 1e3:.3f} ms at B = {last.batch} (step {first.step.total_s * 1e3:.1f} "
                 f"-> {last.step.total_s * 1e3:.1f} ms: x{last.step.total_s / first.step.total_s:.1f} for "
                 f"x{last.batch // first.batch} the tokens).")
    shares = ", ".join(f"{g} {group_share(first, g):.0%} -> {group_share(last, g):.0%}" for g in GROUPS)
    lines.append(f"- Share of the step, B = {first.batch} -> {last.batch}: {shares}.")
    grow = grows_at(mine, WEIGHT_TERMS)
    base = sum(first.step.terms.get(t, 0.0) for t in WEIGHT_TERMS)
    end = sum(last.step.terms.get(t, 0.0) for t in WEIGHT_TERMS)
    lines.append(f"- The weight GEMMs take {base * 1e3:.2f} ms at B = 1 and {end * 1e3:.2f} ms at B = {last.batch}; "
                 + (f"they first exceed {GROWTH:.2f} x their B = 1 time at B = {grow} (from there the batch's "
                    f"{'expert coverage and ' if worker.dep.model.is_moe else ''}work per token, not one read of "
                    "the weights, sets them)." if grow is not None else "they stay a fixed read of the weights."))
    if worker.dep.model.is_moe:
        lines.append(f"- Reading all {expert_count(worker)} routed experts a GPU holds once, at the fitted GEMM rate: "
                     f"{all_experts_s(worker) * 1e3:.2f} ms; moe_experts is {first.step.terms['moe_experts'] * 1e3:.2f} "
                     f"ms at B = 1 and {last.step.terms['moe_experts'] * 1e3:.2f} ms at B = {last.batch}.")
    lines.append(f"- Attention grows from {first.step.terms['attention'] * 1e3:.2f} to "
                 f"{last.step.terms['attention'] * 1e3:.2f} ms: at B = {last.batch} it reads "
                 f"{last.batch * context_tokens * worker.dep.kv_bytes_per_token / 1e9:.1f} GB of KV per GPU at "
                 f"{kv_rate(worker, last, context_tokens):.0%} of HBM bandwidth.")
    return lines + [""]


def expert_count(worker: Worker) -> int:
    return next(worker.dep.experts_per_gpu(f) for _, f in worker.dep.model.layers if f is not None and f.kind == "moe")


def all_experts_s(worker: Worker) -> float:
    """Every routed expert on one GPU read once at the fitted FP8 GEMM rate (no floors)."""
    dep = worker.dep
    nbytes = sum(n * dep.experts_per_gpu(f) * dep.expert_elems(f) * dep.weight_bytes_per_elem
                 for (_, f), n in dep.model.layer_groups if f is not None and f.kind == "moe")
    return nbytes / (dep.gpu.hbm_bw_Bps * worker.cost.gcal.gemm[dep.linear_curve_dtype(True)].mem_eff)


def weight_read_check(worker: Worker) -> dict[str, float]:
    """B = 1 by hand for a dense model: its GEMM weights over the fitted HBM rate plus one floor per GEMM."""
    dep, cal = worker.dep, worker.cost.gcal
    layers = [(mixer, ffn, n) for (mixer, ffn), n in dep.model.layer_groups]
    linears = [(lin, n) for mixer, ffn, n in layers
               for lin in (dep.mixer_linears(mixer) if mixer else []) + (dep.ffn_linears(ffn) if ffn else [])]
    quant = cal.gemm[dep.linear_curve_dtype(True)]
    head = cal.gemm["bf16"]
    layer_bytes = sum(n * lin.n * lin.k * dep.linear_bytes_per_elem(lin.quantized) for lin, n in linears)
    head_bytes = dep.embedding_bytes_per_gpu
    gemms = sum(n for _, n in linears) + 1
    bw = dep.gpu.hbm_bw_Bps
    # The fitted rate at n bytes is bw x mem_eff x n / (n + bytes_half): each GEMM pays bytes_half once more.
    expected = ((layer_bytes + (gemms - 1) * quant.bytes_half) / (bw * quant.mem_eff)
                + (head_bytes + head.bytes_half) / (bw * head.mem_eff) + gemms * quant.floor_s)
    return {"layer_bytes": layer_bytes, "head_bytes": head_bytes, "bw_Bps": bw, "bare_s": (layer_bytes + head_bytes) / bw,
            "mem_eff": quant.mem_eff, "gemms": gemms, "floor_s": quant.floor_s, "expected_s": expected}


def check_lines(worker: Worker, p: Point) -> list[str]:
    c = weight_read_check(worker)
    ledger = sum(p.step.terms.get(t, 0.0) for t in WEIGHT_TERMS)
    throughput = sum(s for t, s in p.step.terms.items() if TERMS[t][0] == "throughput")
    return ["## By hand: B = 1, " + f"{worker.model} on {worker.gpu}", "",
            f"GEMM weights per GPU {c['layer_bytes'] / 1e9:.2f} GB (FP8) + LM head shard {c['head_bytes'] / 1e9:.2f} GB "
            f"(BF16) over {c['bw_Bps'] / 1e12:.2f} TB/s = {c['bare_s'] * 1e3:.2f} ms. At the fitted GEMM efficiency "
            f"({c['mem_eff']:.3f} of HBM bandwidth, less for small GEMMs) plus a {c['floor_s'] * 1e6:.1f} us floor for each of the "
            f"{c['gemms']:.0f} GEMMs: {c['expected_s'] * 1e3:.2f} ms; the ledger's weight GEMMs: {ledger * 1e3:.2f} ms "
            f"({ledger / c['expected_s'] - 1:+.1%}), {ledger / p.step.total_s:.0%} of the {p.step.total_s * 1e3:.2f} ms "
            f"step. The throughput terms together are {throughput * 1e3:.2f} ms, {throughput / c['bare_s']:.1f} x the bare "
            "weight read: the rest is elementwise, attention and all-reduce kernels, mostly their per-kernel floors.",
            ""]


def report(workers: Sequence[Worker], points: Sequence[Point], spec: Mapping[str, Any]) -> str:
    ctx = int(spec["context_tokens"])
    by = panels(points)
    lines = ["# Decode-step decomposition", "",
             f"Pure-decode steps of B requests with {ctx:,} tokens of context each, priced by the simulator's cost "
             "model (vLLM, CUDA graphs captured for its max_num_seqs). Groups: "
             + "; ".join(f"{g}: {', '.join(t for t in ts if any(t in p.step.terms for p in points))}"
                         for g, ts in GROUPS.items()) + ".", ""]
    for w in workers:
        left = [b for b in spec["batches"] if not w.fits(b, ctx)]
        if left:
            block = w.config.kv_cache.block_size or 1
            lines.append(f"- {w.model} on {w.gpu}: B = {', '.join(map(str, left))} left out: the KV pool holds "
                         f"{w.kv_blocks:,} blocks, {w.kv_blocks // math.ceil(ctx / block):,} such requests "
                         f"(max_num_seqs {w.cost.max_num_seqs:,}).")
    lines.append("")
    for w in workers:
        if (w.model, w.gpu) in by:
            lines += panel_lines(w, by[w.model, w.gpu], ctx)
    dense = next((w for w in workers if not w.dep.model.is_moe and w.gpu.startswith("h100")
                  and (w.model, w.gpu) in by), None)
    if dense is not None and by[dense.model, dense.gpu][0].batch == 1:
        lines += check_lines(dense, by[dense.model, dense.gpu][0])
    return "\n".join(lines).rstrip() + "\n"

