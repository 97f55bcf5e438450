"""One engine's constant set fitted on one architecture's kernel tables (fit_engine): the GEMM curve of each
weight format, the attention curves, the grouped-expert curve of each format and kernel family, the
linear-attention scan (fit_ssm) and the all-reduce lines, each block with a provenance note saying what it
was fitted on and how well. The curves' numerics are hardware.curve_fit's, the rows' features
hardware.table_features'."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import attrs
import numpy as np

from hardware.curve_fit import (EXTRA_TERMS, fit_allreduce, fit_allreduce_lines, fit_chunk_s, fit_moe_curve,
                                fit_roofline)
from hardware.kernel_tables import (GEMM_DTYPES, GQA_RATIOS, HOPPER, MOE_DTYPES, SSM_TABLES, TableSet, gdn_rows,
                                    gqa_ratio_fitted, load_rows, possible, sample_rows)
from hardware.table_features import (MOE_WIDTHS_MIN, context_attn_features, floats, gdn_chunks, gdn_features,
                                     gemm_features, gen_attn_features, gpu_rates, mla_context_features,
                                     mla_generation_features, moe_curve_subsets, moe_expert_bytes, moe_features,
                                     moe_format_rows, moe_pass_s)

Blocks = tuple[dict[str, Any], dict[str, str]]
"""Fitted blocks (the set's YAML layout) and a provenance note per fitted block or curve."""

_FAMILY_NAMES = {"marlin": "Marlin", "flashinfer": "FlashInfer CUTLASS"}


_EXTRA_NOTES: dict[str, Callable[[float], str]] = {
    "expert_s_per_byte": lambda v: f"one expert's weights at {1e-9 / v:.0f} GB/s",
    "token_s": lambda v: f"{1e9 * v:.0f} ns per token entering the call",
    "token_passes": lambda v: f"{v:.2f} passes over the routed token copies at HBM bandwidth",
}
"""How a calibration note words each extra grouped-expert term of a fitted curve."""

_ATTENTION_FITS: tuple[tuple[str, str, Callable[..., tuple[np.ndarray, ...]], str | None], ...] = (
    ("context_attention_perf", "attention_prefill", context_attn_features, None),
    ("generation_attention_perf", "attention_decode", gen_attn_features, "bfloat16"),
    ("generation_attention_perf", "attention_decode_fp8kv", gen_attn_features, "fp8"),
    ("context_mla_perf", "mla_prefill", mla_context_features, None),
    ("generation_mla_perf", "mla_decode", mla_generation_features, None))
"""(table, block, features, KV-cache format or None for any) of each attention curve; GQA decode has one curve
per KV-cache format (Calibration.gqa_decode)."""


def _family_label(key: str, dtype: str, keys: list[str]) -> str:
    """Provenance label of one kernel family's curve among a format's split curves (``keys``): the named
    family, or ``non-<the named families>`` for the default curve."""
    if key != dtype:
        return _FAMILY_NAMES.get(key[len(dtype) + 1:], key[len(dtype) + 1:])
    return "non-" + " / non-".join(_FAMILY_NAMES.get(k[len(dtype) + 1:], k) for k in keys if k != dtype)


def error_summary(err: np.ndarray) -> str:
    """A fit's relative errors as a note reports them: rows, median and p90 of |error|."""
    a = np.abs(err)
    return f"{len(a)} rows, |error| median {100 * np.median(a):.1f} %, p90 {100 * np.percentile(a, 90):.1f} %"


@attrs.frozen(kw_only=True)
class _EngineFit:
    """What every block's fit of one engine reads: the tables' folder and set, the starting values, the log."""

    data: Path
    engine: str
    start: dict[str, Any]
    log: Callable[[str], None]
    tables: TableSet

    @property
    def version(self) -> str:
        return self.tables.engines[self.engine]

    @property
    def src(self) -> str:
        """What a note calls the tables: source, GPUs and engine version."""
        return f"{self.tables.source} {'+'.join(self.tables.gpus)} {self.version}"

    def rows(self, table: str) -> list[dict[str, str]]:
        return load_rows(self.data, table, self.version, self.tables.gpus)


def fit_engine(data: Path, engine: str, start: dict[str, Any], log: Callable[[str], None],
               tables: TableSet = HOPPER) -> Blocks:
    """Fit one engine's constants on the tables of ``tables``; returns the YAML mapping and a provenance note
    per fitted block (the others keep ``start``'s values)."""
    fit = _EngineFit(data=data, engine=engine, start=start, log=log, tables=tables)
    out: dict[str, Any] = {k: v for k, v in start.items() if k != "provenance"}
    notes: dict[str, str] = {}
    for blocks, block_notes in (_gemm_block(fit), _attention_blocks(fit), _moe_block(fit),
                                fit_ssm(data, engine, start, log, tables), _allreduce_block(fit)):
        out.update(blocks)
        notes.update(block_notes)
    return out, notes


def _gemm_block(fit: _EngineFit) -> Blocks:
    """The ``gemm`` block: one curve per weight format the GEMM table times."""
    gemm_rows = fit.rows("gemm_perf")
    gemm: dict[str, Any] = dict(fit.start["gemm"])
    notes: dict[str, str] = {}
    for raw, dtype in GEMM_DTYPES.items():
        curve = _gemm_curve(fit, gemm_rows, raw, dtype, fp8=gemm.get("fp8"))
        if curve is not None:
            gemm[dtype], notes[f"gemm.{dtype}"] = curve
    return {"gemm": gemm}, notes


def _gemm_curve(fit: _EngineFit, gemm_rows: list[dict[str, str]], raw: str, dtype: str,
                fp8: dict[str, Any] | None) -> tuple[dict[str, Any], str] | None:
    """One format's GEMM curve and note, None where the table has no row of it to fit. ``fp8``: the per-tensor
    FP8 curve so far, whose memory side and floor a host-bound format (HOST_BOUND_GEMM) takes."""
    engine, tables = fit.engine, fit.tables
    # shapes a model layer shard can have (n, k >= 256); tiny toy shapes would only fit launch noise
    min_m = tables.host_bound_gemm.get(engine, {}).get(dtype, 1)
    rows = sample_rows([r for r in gemm_rows if r["gemm_dtype"] == raw and int(r["n"]) >= 256
                        and int(r["k"]) >= 256 and int(r["m"]) >= min_m
                        and possible(r, "gemm_perf", r["_gpu"])])
    if not rows:
        return None
    flops, nbytes, m = gemm_features(rows, dtype)
    peak, bw = gpu_rates(rows, lambda r: dtype)
    st = fit.start["gemm"].get(dtype, fit.start["gemm"]["bf16"])
    tiles = tables.gemm_row_tiles.get(engine, {}).get(dtype, ())
    p, err = fit_roofline(flops, nbytes, m, peak, bw, floats(rows, "latency") * 1e-3, st, tiles=(1, 64, 128),
                          per_m=True, nk=(floats(rows, "n"), floats(rows, "k")), row_tiles=tiles)
    how = ", row tiles by batch size from the engine's kernel dispatch (GEMM_ROW_TILES)" if tiles else ""
    note = f"fitted on {fit.src} gemm_perf {raw}{how}: {error_summary(err)}"
    if min_m > 1:
        ref = p if fp8 is None else fp8
        for key in ("floor_s", "mem_eff", "bytes_half"):
            p[key] = float(ref.get(key, 0.0))
        note = (f"fitted on {fit.src} gemm_perf {raw}, m >= {min_m} only (smaller m measures eager host "
                f"overhead, see HOST_BOUND_GEMM); memory side and floor from the fp8 fit: {error_summary(err)}")
    fit.log(f"{engine} gemm {dtype}: {error_summary(err)}")
    return p, note


def _attention_blocks(fit: _EngineFit) -> Blocks:
    """The attention blocks (_ATTENTION_FITS) whose tables have rows to fit."""
    out: dict[str, Any] = {}
    notes: dict[str, str] = {}
    for table, key, feats, kv in _ATTENTION_FITS:
        curve = _attention_curve(fit, table, key, feats, kv)
        if curve is not None:
            out[key], notes[key] = curve
    return out, notes


def _attention_curve(fit: _EngineFit, table: str, key: str, feats: Callable[..., tuple[np.ndarray, ...]],
                     kv: str | None) -> tuple[dict[str, Any], str] | None:
    """One attention curve and note, fitted on full attention at the GQA ratios real models use
    (GQA_RATIOS query heads per KV head) with a ``kv`` cache (None: any); None where no row is left."""
    shapes = [r for r in fit.rows(table) if r.get("window_size", "0") == "0"
              and ("num_key_value_heads" not in r or gqa_ratio_fitted(r))
              and (kv is None or r["kv_cache_dtype"] == kv)]
    rows = sample_rows([r for r in shapes if possible(r, table, r["_gpu"])])
    if not rows:
        return None
    dropped = len(shapes) - sum(1 for r in shapes if possible(r, table, r["_gpu"]))
    flops, nbytes, m = feats(rows)
    peak, bw = gpu_rates(rows, lambda r: "bf16")
    st = fit.start.get(key) or fit.start["attention_decode"]
    p, err = fit_roofline(flops, nbytes, m, peak, bw, floats(rows, "latency") * 1e-3, st, per_m=True,
                          min_compute_eff=1e-3 if kv == "fp8" else 0.02)
    cache = f", {kv} KV cache" if kv else ""
    ratio = f", GQA ratio {GQA_RATIOS[0]}-{GQA_RATIOS[1]}" if key.startswith("attention") else ""
    faster = f", {dropped} rows faster than the HBM bound left out (calibrate.possible)" if dropped else ""
    fit.log(f"{fit.engine} {key}: {error_summary(err)}")
    return p, f"fitted on {fit.src} {table} (full attention{ratio}{cache}{faster}): {error_summary(err)}"


def _moe_block(fit: _EngineFit) -> Blocks:
    """The ``moe`` block: per weight format, uniform ('balanced') routing rows only, or power-law ones where a
    format has none (MOE_ROUTING), one curve per kernel family (moe_curve_subsets); a curve key an earlier
    table format fitted is not fitted again (MOE_DTYPES)."""
    moe_rows = fit.rows("moe_perf")
    moe: dict[str, Any] = dict(fit.start["moe"])
    notes: dict[str, str] = {}
    fitted: set[str] = set()
    for raw, dtype in MOE_DTYPES.items():
        of_dtype, routing = moe_format_rows(moe_rows, raw)
        subsets = moe_curve_subsets(of_dtype, dtype)
        for key, subset in subsets.items():
            if key in fitted:
                fit.log(f"{fit.engine} moe {key}: fitted already, {raw} rows left out")
                continue
            fitted.add(key)
            moe[key], notes[f"moe.{key}"] = _moe_curve(fit, subset, raw, dtype, key, routing, list(subsets))
    return {"moe": moe}, notes


def _moe_curve(fit: _EngineFit, subset: list[dict[str, str]], raw: str, dtype: str, key: str, routing: str,
               keys: list[str]) -> tuple[dict[str, Any], str]:
    """The grouped-expert curve ``key`` of table format ``raw`` and its note, fitted on ``subset`` (rows of
    ``routing``); ``keys``: every curve the format's rows are split into."""
    rows = sample_rows(subset)
    flops, nbytes, m, inter_gpu, hid = moe_features(rows, dtype)
    peak, bw = gpu_rates(rows, lambda r: dtype)
    moe_start = fit.start["moe"]
    st = moe_start.get(key, moe_start.get(dtype, moe_start["bf16"]))
    # (n, k) = (expert width per GPU, hidden width), each fitted where the table varies it
    n_ok, k_ok = (len(np.unique(a)) >= MOE_WIDTHS_MIN for a in (inter_gpu, hid))
    nk = (inter_gpu, hid if k_ok else None) if n_ok else None
    p, err = fit_moe_curve(flops, nbytes, m, peak, bw, floats(rows, "latency") * 1e-3, st,
                           moe_expert_bytes(rows, dtype), nk=nk,
                           tokens=floats(rows, "num_tokens"), pass_s=moe_pass_s(rows, bw))
    family = "" if len(keys) == 1 else f" ({_family_label(key, dtype, keys)} kernels)"
    shape = "" if n_ok and k_ok else (f", width terms on {'the expert width' if n_ok else 'neither'}"
                                       f" ({len(np.unique(inter_gpu))} expert widths per GPU, "
                                       f"{len(np.unique(hid))} hidden width(s))")
    added = "".join(f", {_EXTRA_NOTES[name](p[name])} added ({name})" for name in EXTRA_TERMS if p.get(name))
    how = routing if routing == "balanced" else \
        f"{routing} at the busiest EP rank (the table has no balanced {raw} rows)"
    fit.log(f"{fit.engine} moe {key}: {error_summary(err)}")
    return p, f"fitted on {fit.src} moe_perf {raw}{family} {how}{shape}{added}: {error_summary(err)}"


def _allreduce_block(fit: _EngineFit) -> Blocks:
    """The ``allreduce`` block: graph-captured custom all-reduce, pooled and per GPU count; eager extra =
    median (eager - graph) at equal size. Empty where the engine has no all-reduce table."""
    ar_rows = fit.rows("custom_allreduce_perf")
    if not ar_rows:
        return {}, {}
    engine, start = fit.engine, fit.start
    tag = "backend" if "backend" in ar_rows[0] else "implementation"
    graph = [r for r in ar_rows if "eager" not in r.get(tag, "")]
    eager = {(r["_gpu"], r["num_gpus"], r["message_size"]): float(r["latency"]) for r in ar_rows
             if "eager" in r.get(tag, "")}
    alpha, eff, err = fit_allreduce(graph)
    extra = [eager[(r["_gpu"], r["num_gpus"], r["message_size"])] - float(r["latency"]) for r in graph
             if (r["_gpu"], r["num_gpus"], r["message_size"]) in eager]
    by_gpus: dict[int, list[list[float]]] = {}
    errs = []
    for g in sorted({int(r["num_gpus"]) for r in graph}):
        lines, err_g = fit_allreduce_lines([r for r in graph if int(r["num_gpus"]) == g])
        by_gpus[g] = [list(line) for line in lines]
        errs.append(err_g)
        fit.log(f"{engine} allreduce {g} GPUs: {error_summary(err_g)}")
    block = {"alpha_s": alpha, "bw_eff": eff,
             "eager_extra_s": float(np.median(extra)) * 1e-3 if extra
             else start["allreduce"].get("eager_extra_s", 0.0),
             "by_gpus": by_gpus}
    note = (f"fitted on {fit.src} custom_allreduce_perf (graph), two lines per GPU count "
            f"({', '.join(map(str, by_gpus))}; by_gpus: [alpha_s, bw_eff], the faster one "
            f"per message): {error_summary(np.concatenate(errs))}; "
            f"pooled over every count (other counts, groups across nodes): {error_summary(err)}")
    fit.log(f"{engine} allreduce pooled: {error_summary(err)}")
    return {"allreduce": block}, {"allreduce": note}


SSM_BLOCKS = frozenset({"ssm", "ssm_decode"})
"""The blocks :func:`fit_ssm` fits (``--only`` with these alone reads the gdn tables only)."""


def fit_ssm(data: Path, engine: str, start: dict[str, Any], log: Callable[[str], None],
            tables: TableSet = HOPPER) -> tuple[dict[str, Any], dict[str, str]]:
    """The linear-attention blocks (``ssm``, and ``ssm_decode`` on the generation rows) of an engine's set,
    fitted on its gated-DeltaNet table; empty where it has none."""
    out: dict[str, Any] = {}
    notes: dict[str, str] = {}
    if engine not in SSM_TABLES:
        return out, notes
    rows = sample_rows(gdn_rows(data, SSM_TABLES[engine], tables.gpus))
    borrowed = "" if SSM_TABLES[engine].startswith(engine) else \
        f"; {engine} has no gdn table and runs the same vendored FLA Triton kernels"
    src = f"{tables.source} gdn_perf {SSM_TABLES[engine]}"
    # ssm on every row; ssm_decode on the decode kernels alone (conv update + recurrent update, one token a
    # request), which the context rows outnumber ten to one in the pooled fit.
    fits = (("ssm", rows, f"(conv + gated-delta-rule kernels summed; Mamba2 uses the same curve{borrowed})"),
            ("ssm_decode", [r for r in rows if r["phase"] == "generation"],
             f"generation rows (conv update + recurrent update summed{borrowed})"))
    for block, subset, what in fits:
        if not subset:
            continue
        flops, nbytes, m = gdn_features(subset)
        peak, bw = gpu_rates(subset, lambda r: "bf16")
        meas = floats(subset, "latency") * 1e-3
        p, err = fit_roofline(flops, nbytes, m, peak, bw, meas, start["ssm"])
        if block == "ssm":  # the prompt kernels take a sequence's chunks one after another
            plain = error_summary(err)
            p["chunk_s"], adds, err = fit_chunk_s(p, flops, nbytes, m, peak, bw, meas, gdn_chunks(subset))
            if adds:
                p["chunk_adds"] = True
            what += (f"; then chunk_s, {'added' if adds else 'a lower bound'}, on the chunks of each row's "
                     f"longest sequence (the roofline alone: {plain})")
        p["floor_s"] /= 2.0          # the ledger adds the floor twice (conv + scan kernels)
        out[block] = p
        notes[block] = f"fitted on {src} {what}: {error_summary(err)}"
        log(f"{engine} {block}: {error_summary(err)}")
    return out, notes
