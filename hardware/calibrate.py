"""Fit the throughput family's efficiency curves and floors on measured kernel tables (aiconfigurator opdb).

    python -m hardware.calibrate [--data kernel-tables/opdb] --out hardware/data/calibration
    python -m hardware.calibrate --arch blackwell [--data kernel-tables/opdb-blackwell] \
        --out hardware/data/calibration/blackwell

The tables (aiconfigurator's, about 34 MB compressed) are not shipped: ``python -m hardware.opdb_import``
writes them once into kernel-tables/, where --data looks by default.

One constant set per engine and GPU architecture (TABLE_SETS). Hopper: each engine's kernels (vLLM 0.24.0,
SGLang 0.5.9, TRT-LLM 1.2.0rc5) fitted jointly on H100 SXM and H200 SXM; Blackwell: on B300 SXM (vLLM 0.24.0,
SGLang 0.5.9, TRT-LLM 1.3.0rc20). Every row's FLOPs and bytes are divided by that GPU's *spec* peak and
bandwidth, so within an architecture the constants carry over to GPUs that were not measured (only the GPU
spec changes). Least squares on log(predicted / measured). Nothing here looks at end-to-end serving rows.
The script writes <out>/<engine>.yaml with a provenance comment per block; blocks with no table to fit keep
the set's starting values: default.yaml's for Hopper, the engine's Hopper set's for another architecture.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import itertools
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np
import yaml
from scipy.optimize import least_squares

from hardware import kernels
from hardware._data import read_yaml
from hardware.calibration import CALIBRATION_DIR, CURVE_MOE_KERNELS, moe_curve_key
from hardware.dtypes import COMPUTE_DTYPE, DTYPE_BYTES
from hardware.gpu import load_gpu
from hardware.opdb_import import DEFAULT_DIR, MISSING_TABLES_HINT

GPUS = ("h100_sxm", "h200_sxm")
ENGINES = {"vllm": "vllm-0.24.0", "sglang": "sglang-0.5.9", "trtllm": "trtllm-1.2.0rc5"}
MAX_ROWS = 12000            # per fitted subset, sampled with a fixed seed (2-core budget)
ACT = 2.0
GEMM_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4"}
MOE_DTYPES = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "fp4", "w4a16_mxfp4": "fp4",
              "int4_wo": "int4"}
"""The tables' formats -> the twin's weight formats (hardware.dtypes). The twin's ``fp4`` is NVFP4 (W4A4 on
Blackwell's FP4 tensor cores, 4.5 bits per weight). Where a table has both, the first format of this order
with rows fits a curve key and a later one mapping to the same key is left out (fit_engine): on B300, NVFP4
fits ``fp4`` and the MXFP4 weight-only rows (gpt-oss's kernels) only the kernel families NVFP4 was not timed
with (``fp4_marlin``). Hopper's tables have no NVFP4, so there ``fp4`` is MXFP4 weight-only (W4A16).
w4a8_mxfp4_mxfp8 (B300) maps to no format the twin has."""
MOE_ROUTING = {"balanced": "balanced", "power_law_1.01": "power_law_busiest"}
"""The routing (kernels.routed_load) a MoE table's ``distribution`` is priced with. Curves are fitted on
balanced rows; a format a table times under power-law routing only (SGLang 0.5.9 on B300) is fitted on its
power_law_1.01 rows at the busiest expert-parallel rank (on SGLang's H100 fp8_block table the balanced-fitted
curve prices those rows at 10 % median |error| and -7 % bias at EP > 1 that way, 17 % and -15 % at the mean
rank; alike at EP 1)."""
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}
# Tables whose small shapes measure eager host overhead, not GPU time: vLLM 0.24's block-FP8 GEMM rows take
# 60-180 us at every shape with all three kernel sources (DeepGEMM, FlashInfer, CUTLASS), 5-20x what SGLang's
# and TRT-LLM's block-FP8 kernels take. Under CUDA graphs that overhead is gone, so these are fitted on
# m >= 512 rows only (GPU-bound, compute side) and take the memory side and floor from the same engine's
# per-tensor FP8 fit.
HOST_BOUND_GEMM = {"vllm": {"fp8_block": 512}}
# GEMM kernels whose row tile changes with the batch size, from the engine's dispatch, as (largest m,
# largest n, tile rows) entries, a bound of 0 holding for any size (calibration.Roofline.row_tiles). vLLM's
# per-tensor FP8 GEMM on Hopper (the opdb table's CutlassFP8ScaledMMLinearKernel; vllm-project/vllm
# csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm90_fp8_dispatch.cuh, cutlass_gemm_sm90_fp8_dispatch):
# m <= 16 swaps A and B and tiles the batch by 16 rows (TileShape 64 x 16 x 256); 16 < m <= 64 swaps them
# with 16-row tiles where n <= 1280 and 64-row tiles above; 64 < m <= 128 runs 64 x 128 tiles (64 rows);
# larger m 128 x 128 tiles in clusters of 2 x 1 along m (256 rows a cluster). A fixed input of the fit.
GEMM_ROW_TILES: dict[str, dict[str, tuple[tuple[int, int, int], ...]]] = {
    "vllm": {"fp8": ((16, 0, 16), (64, 1280, 16), (64, 0, 64), (128, 0, 64), (0, 0, 256))}}
# Linear-attention tables (gated DeltaNet) per engine: conv + scan kernels summed per configuration.
# SGLang has no gdn table; its GDN layers call the same vendored flash-linear-attention Triton kernels as
# vLLM's (sglang/srt/layers/attention/fla: chunk_gated_delta_rule, fused_recurrent_gated_delta_rule_update;
# vllm/model_executor/layers/fla/ops), so it is fitted on vLLM's table.
SSM_TABLES = {"vllm": "vllm-0.24.0", "trtllm": "trtllm-1.3.0rc20", "sglang": "vllm-0.24.0"}


GQA_RATIOS = (2, 16)
"""Query heads per KV head of the attention rows the GQA curves are fitted on. No grouped-query model in
hardware/data/models has fewer than 2 (MLA models take the MLA tables). The tables' multi-head rows (ratio 1)
run another kernel on TRT-LLM: with an FP8 cache a curve fitted over both put them at -21 % and the GQA rows
at +20-29 %, so one curve fits neither. Above 16 (DeepSeek-V4's MQA, Nemotron-3 Ultra's 32) the curve
extrapolates, as it did before the lower bound was added."""


def gqa_ratio_fitted(r: dict[str, str]) -> bool:
    """Whether an attention row's query heads per KV head lie in GQA_RATIOS."""
    heads, kv = int(r["num_heads"]), int(r["num_key_value_heads"])
    return GQA_RATIOS[0] * kv <= heads <= GQA_RATIOS[1] * kv


@attrs.frozen(kw_only=True)
class TableSet:
    """The kernel tables one GPU architecture's sets are fitted on, and the fit's inputs that depend on the
    architecture's kernels."""

    arch: str
    source: str                                  # what the provenance calls the tables
    gpus: tuple[str, ...]
    engines: Mapping[str, str]                   # engine -> the tables' engine version
    host_bound_gemm: Mapping[str, Mapping[str, int]]
    gemm_row_tiles: Mapping[str, Mapping[str, tuple[tuple[int, int, int], ...]]]
    out: Path                                    # where its sets ship
    graph_floors_at_most_fitted: bool = False    # written into its sets (Calibration.graph_floors_at_most_fitted)


TABLE_SETS = {
    "hopper": TableSet(arch="hopper", source="opdb", gpus=GPUS, engines=ENGINES, host_bound_gemm=HOST_BOUND_GEMM,
                       gemm_row_tiles=GEMM_ROW_TILES, out=CALIBRATION_DIR),
    # vLLM's block-FP8 GEMM rows measure host overhead at small m on B300 too (170-240 us at m <= 16 and
    # n, k <= 1024, where its per-tensor FP8 GEMM takes 5-6 us); GEMM_ROW_TILES is Hopper's SM90 dispatch, so
    # Blackwell's GEMMs fit a fixed row tile
    "blackwell": TableSet(arch="blackwell", source="opdb-blackwell", gpus=("b300_sxm",),
                          engines={"vllm": "vllm-0.24.0", "sglang": "sglang-0.5.9", "trtllm": "trtllm-1.3.0rc20"},
                          host_bound_gemm=HOST_BOUND_GEMM, gemm_row_tiles={}, out=CALIBRATION_DIR / "blackwell",
                          graph_floors_at_most_fitted=True),
}
"""The architectures with sets of their own (hardware.calibration.calibration_for); every other architecture is
priced with the Hopper sets."""
HOPPER = TABLE_SETS["hopper"]


def possible(r: dict[str, str], table: str, gpu: str) -> bool:
    """Whether a row's measured time is no faster than reading the bytes it must read once at its GPU's
    peak HBM bandwidth: a decode-attention row its KV cache, a GEMM row its weights. A faster row re-read
    cache-resident data, which a serving step, whose layers and requests each hold their own weights and KV,
    never does. TRT-LLM 1.2.0rc5's decode-attention table has 1,364 such rows at large batch x context (1,254
    at the GQA ratios fitted; up to 1.73 x the H100's bandwidth), vLLM's and SGLang's none; no GEMM row the
    fits use is one. Why TRT-LLM's: its collector allocated a K-only cache
    (CacheType.SELFKONLY, aiconfigurator collector/trtllm/collect_attn.py until dec5f4cd2), so V's reads hit
    blocks just read as K and a row crosses HBM with less than the K and V bytes counted here; the table's
    other large rows run fast for the same reason, which this check cannot see."""
    if table == "generation_attention_perf":
        kv = KV_BYTES.get(r["kv_cache_dtype"], 2.0)
        nbytes = int(r["batch_size"]) * (int(r["step"]) + 1) * int(r["num_key_value_heads"]) * 2 \
            * int(r["head_dim"]) * kv
    elif table == "gemm_perf":
        nbytes = int(r["n"]) * int(r["k"]) * DTYPE_BYTES[GEMM_DTYPES[r["gemm_dtype"]]]
    else:
        return True
    return nbytes <= float(r["latency"]) * 1e-3 * load_gpu(gpu).hbm_bw_Bps


def read_table(data: Path, gpu: str, table: str, version: str) -> list[dict[str, str]]:
    path = data / f"{gpu}__{table}__{version}.csv.gz"
    return read_table_file(path) if path.is_file() else []


def read_table_file(path: Path) -> list[dict[str, str]]:
    """The rows of one kernel table in the opdb layout: CSV (.csv, .csv.gz) or Parquet (needs pyarrow),
    every value as text, as the shipped tables are read."""
    name = path.name
    if name.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), "
                             "or convert the table to .csv / .csv.gz") from err
        return [{k: "" if v is None else str(v) for k, v in r.items()} for r in pq.read_table(path).to_pylist()]
    if name.endswith(".csv.gz"):
        with gzip.open(path, "rt", newline="") as fh:
            return list(csv.DictReader(fh))
    if name.endswith(".csv"):
        with path.open(newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    raise ValueError(f"{path}: expected a .csv, .csv.gz or .parquet kernel table")


def _sample(rows: list[dict[str, str]], n: int = MAX_ROWS) -> list[dict[str, str]]:
    if len(rows) <= n:
        return rows
    idx = np.random.default_rng(0).choice(len(rows), size=n, replace=False)
    return [rows[i] for i in sorted(idx)]


# --- vectorised predictors (same formulas as hardware.kernels) --------------------------------------

def tile_pad_np(m: np.ndarray, tile: int = 1, row_tiles: Sequence[tuple[int, int, int]] = (),
                n: np.ndarray | None = None) -> np.ndarray | float:
    """Padded rows / rows per row, as calibration.Roofline.tile_factor (``row_tiles`` over ``tile``; ``n``
    the GEMMs' output widths, None where unknown)."""
    if row_tiles:
        tiles = np.full(m.shape, float(row_tiles[-1][2]))
        for top_m, top_n, t in reversed(row_tiles[:-1]):   # the first entry that holds wins
            holds = (m <= top_m) if top_m else np.ones(m.shape, dtype=bool)
            if top_n:
                holds = holds & (n <= top_n) if n is not None else np.zeros(m.shape, dtype=bool)
            tiles = np.where(holds, float(t), tiles)
        return np.ceil(m / tiles) * tiles / m
    return np.ceil(m / tile) * tile / m if tile > 1 else 1.0


def roof_np(p: Sequence[float] | np.ndarray, flops: np.ndarray, nbytes: np.ndarray, m: np.ndarray, peak: np.ndarray,
            bw: np.ndarray, tile: int = 1, per_m: bool = False,
            nk: tuple[np.ndarray, np.ndarray | None] | None = None,
            row_tiles: Sequence[tuple[int, int, int]] = (),
            extras: Sequence[np.ndarray] = ()) -> np.ndarray:
    """p = (compute_eff, m_half, mem_eff, bytes_half, floor_s[, m_cost_s][, k_half], n_half, then one
    coefficient per array of ``extras``); see calibration.Roofline (m_cost_s present with per_m, k_half /
    n_half with the widths nk = (n, k); with k None, n_half alone: widths whose k never varies in the table;
    ``row_tiles`` as Roofline.row_tiles). ``extras``: the per-row features of the grouped-expert terms in
    use, in EXTRA_TERMS order, each added times its coefficient as kernels.moe_s adds it."""
    ce, mh, me, bh, fl = p[:5]
    i = 5
    per_row = 0.0
    if per_m:
        per_row, i = p[5], 6
    pad = tile_pad_np(m, tile, row_tiles, nk[0] if nk is not None else None)
    rate = peak * ce * (m * pad / (m * pad + mh))  # the rate of the padded rows (Roofline.time_s)
    if nk is not None:
        n, k = nk
        if k is not None:
            rate, i = rate * (k / (k + p[i])), i + 1
        rate, i = rate * (n / (n + p[i])), i + 1
    tc = flops * pad / rate
    tm = nbytes / (bw * me * (nbytes / (nbytes + bh)))
    t = np.maximum(tc, tm) + fl + per_row * m
    for j, feature in enumerate(extras):
        t = t + p[i + j] * feature
    return t


EXTRA_TERMS: dict[str, tuple[float, tuple[float, ...]]] = {
    "expert_s_per_byte": (1e-9, (1e-13, 1e-12, 5e-12)),
    "token_s": (1e-6, (1e-9, 1e-8, 1e-7)),
    "token_passes": (100.0, (0.5, 2.0, 8.0)),
}
"""The grouped-expert curve's extra terms (calibration.Roofline), in the order roof_np takes their features:
each name's upper bound in the fit and the starting values tried with each of fit_roofline's starting
points. Features per row: one expert's weight bytes (expert_s_per_byte: 1 GB/s at most), the tokens entering
the call (token_s: 1 us a token at most), one pass over the routed token copies at HBM bandwidth
(token_passes, kernels.token_pass_s)."""

EXPERT_TERM_MIN_GAIN = 0.10
"""The share of a fit's cost an extra grouped-expert term (the serial expert term, the per-token term, the
token traffic) must remove to be kept (:func:`fit_moe_curve`): one parameter more has to describe the table,
not just bend the fit. On the shipped opdb tables the serial term removes 40 % (vLLM w4a16_mxfp4, OpenAI
triton_kernels) and 13 % (TensorRT-LLM w4a16_mxfp4, the same kernels through its Triton MoE backend)
against 2-3 % on the Marlin tables (vLLM fp4_marlin, int4) and nothing on the others (the fit with the
term ends at a higher cost there); the first token term removes 13-65 % on every fitted table."""


def _soft_l1_cost(err: np.ndarray, f_scale: float = 0.1) -> float:
    """The cost fit_roofline minimises (least_squares, loss="soft_l1", on log(predicted / measured)) of a fit
    whose errors, predicted / measured - 1, are ``err``: to compare two fits of the same rows."""
    r = np.log1p(err)
    return float(0.5 * np.sum(2.0 * f_scale ** 2 * (np.sqrt(1.0 + (r / f_scale) ** 2) - 1.0)))


def fit_moe_curve(flops: np.ndarray, nbytes: np.ndarray, m: np.ndarray, peak: np.ndarray, bw: np.ndarray,
                  meas_s: np.ndarray, start: dict[str, float], expert_bytes: np.ndarray,
                  nk: tuple[np.ndarray, np.ndarray | None] | None = None,
                  tokens: np.ndarray | None = None, pass_s: np.ndarray | None = None
                  ) -> tuple[dict[str, Any], np.ndarray]:
    """A grouped-expert curve: :func:`fit_roofline` plain, then grown by the extra terms one at a time, the
    serial expert term (Roofline.expert_s_per_byte, ``expert_bytes`` per row) and, where given, the per-token
    term (Roofline.token_s, ``tokens`` entering each row's call) and the token-traffic term
    (Roofline.token_passes, ``pass_s``: one pass over each row's routed token copies at HBM bandwidth,
    :func:`moe_pass_s`). Each round fits every term not yet in, started also from the current fit, and keeps
    the one that lowers the cost most, if it lowers it by EXPERT_TERM_MIN_GAIN or more; otherwise the current
    curve is returned."""
    given = {"expert_s_per_byte": expert_bytes, "token_s": tokens, "token_passes": pass_s}
    features = {name: arr for name, arr in given.items() if arr is not None}
    best, best_err = fit_roofline(flops, nbytes, m, peak, bw, meas_s, start, nk=nk)
    chosen: list[str] = []
    while len(chosen) < len(features):
        trials = []
        for name in features:
            if name in chosen:
                continue
            terms = {n: a for n, a in features.items() if n in chosen or n == name}
            fit, err = fit_roofline(flops, nbytes, m, peak, bw, meas_s, start, nk=nk, extras=terms,
                                    more_starts=[best])   # the current fit, the new term at its starts
            trials.append((_soft_l1_cost(err), name, fit, err))
        cost, name, fit, err = min(trials, key=lambda t: t[0])
        if cost > (1.0 - EXPERT_TERM_MIN_GAIN) * _soft_l1_cost(best_err):
            break
        chosen.append(name)
        best, best_err = fit, err
    return best, best_err


def fit_roofline(flops: np.ndarray, nbytes: np.ndarray, m: np.ndarray, peak: np.ndarray, bw: np.ndarray,
                 meas_s: np.ndarray, start: dict[str, float],
                 tiles: Sequence[int] = (1,), per_m: bool = False,
                 nk: tuple[np.ndarray, np.ndarray | None] | None = None,
                 min_compute_eff: float = 0.02,
                 row_tiles: Sequence[tuple[int, int, int]] = (),
                 extras: Mapping[str, np.ndarray] | None = None,
                 more_starts: Sequence[Mapping[str, Any]] = ()) -> tuple[dict[str, Any], np.ndarray]:
    """Least-squares fit of the roofline constants on log error (tile size chosen from `tiles`, or the
    kernel's own ``row_tiles`` by batch size, given, not fitted; with per_m also a serial cost per row;
    with the widths nk = (n, k) also k_half and n_half, with nk = (n, None) n_half alone; ``extras`` maps
    grouped-expert terms of EXTRA_TERMS to their per-row features, each term fitted too, started at its few
    values).
    ``more_starts``: starting points besides the three fixed ones, each a mapping from parameter names to
    values, as this function returns (e.g. a plain fit's, to extend it by an extra term); a parameter it
    lacks takes the fixed starts' value, an extra term its few starting values.
    ``min_compute_eff``: the lowest compute efficiency allowed (a fraction of the tensor-core peak; work done
    on the CUDA cores, as a quantised KV cache's dequantisation, runs at a few percent of it)."""
    widths = 0 if nk is None else (1 if nk[1] is None else 2)
    extras = extras or {}
    terms = [name for name in EXTRA_TERMS if name in extras]
    names = ("compute_eff", "m_half", "mem_eff", "bytes_half", "floor_s") + (("m_cost_s",) if per_m else ()) \
        + ("k_half", "n_half")[2 - widths:] + tuple(terms)
    lo = [min_compute_eff, 0.0, 0.02, 0.0, 0.0] + ([0.0] if per_m else []) + [0.0] * widths + [0.0] * len(terms)
    hi = [1.0, 8192.0, 1.0, 2.0e9, 2.0e-4] + ([2.0e-6] if per_m else []) + [65536.0] * widths \
        + [EXTRA_TERMS[name][0] for name in terms]
    ok = np.isfinite(meas_s) & (meas_s > 0) & np.isfinite(flops) & np.isfinite(nbytes)
    flops, nbytes, m, peak, bw, meas_s = (a[ok] for a in (flops, nbytes, m, peak, bw, meas_s))
    features = [extras[name][ok] for name in terms]
    if nk is not None:
        nk = (nk[0][ok], None if nk[1] is None else nk[1][ok])
    m = np.maximum(m, 1e-9)
    nbytes = np.maximum(nbytes, 1.0)
    fixed = [dict(zip(names, x + ([1e-7] if per_m else []) + [256.0] * widths))
             for x in ([start["compute_eff"], 16.0, start["mem_eff"], 1e6, start["floor_s"]],
                       [0.7, 128.0, 0.8, 1e7, 8e-6], [0.5, 1.0, 0.6, 1e5, 4e-6])]
    starts: list[list[float]] = []
    for given in [*fixed, *more_starts]:
        base = [float(given.get(k, fixed[0].get(k, 0.0))) for k in names[:len(names) - len(terms)]]
        grids = [[float(given[name])] if name in given else list(EXTRA_TERMS[name][1]) for name in terms]
        starts += [base + list(x) for x in itertools.product(*grids)]
    best, best_tile = None, 1
    for tile in (1,) if row_tiles else tiles:
        def resid(p: np.ndarray, tile: int = tile) -> np.ndarray:
            return np.log(roof_np(p, flops, nbytes, m, peak, bw, tile, per_m, nk, row_tiles, features) / meas_s)

        for x in starts:
            x0 = np.clip(np.array(x, dtype=float), np.array(lo) + 1e-12, np.array(hi) - 1e-12)
            res = least_squares(resid, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, max_nfev=400,
                                x_scale="jac")
            if best is None or res.cost < best.cost:
                best, best_tile = res, tile
    assert best is not None
    p = best.x
    err = roof_np(p, flops, nbytes, m, peak, bw, best_tile, per_m, nk, row_tiles, features) / meas_s - 1.0
    out: dict[str, Any] = {k: float(v) for k, v in zip(names, p)}
    if best_tile > 1:
        out["m_tile"] = best_tile
    if row_tiles:
        out["row_tiles"] = [list(entry) for entry in row_tiles]
    return out, err


def _gpu_arrays(rows: list[dict[str, str]], dtype_of: Callable[[dict[str, str]], str]) -> tuple[np.ndarray, np.ndarray]:
    peak = np.array([load_gpu(r["_gpu"]).flops_for(COMPUTE_DTYPE[dtype_of(r)]) for r in rows])
    bw = np.array([load_gpu(r["_gpu"]).hbm_bw_Bps for r in rows])
    return peak, bw


def _f(rows: list[dict[str, str]], key: str) -> np.ndarray:
    return np.array([float(r[key]) for r in rows])


# --- per-table row -> (flops, bytes, m) ------------------------------------------------------------

def gemm_features(rows: list[dict[str, str]], dtype: str) -> tuple[np.ndarray, ...]:
    m, n, k = _f(rows, "m"), _f(rows, "n"), _f(rows, "k")
    return 2 * m * n * k, n * k * DTYPE_BYTES[dtype] + m * (n + k) * ACT, m


def context_attn_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    b, s = _f(rows, "batch_size"), _f(rows, "isl")
    h, kvh, hd = _f(rows, "num_heads"), _f(rows, "num_key_value_heads"), _f(rows, "head_dim")
    kvb = np.array([KV_BYTES.get(r["kv_cache_dtype"], 2.0) for r in rows])
    prefix = _f(rows, "step")
    pairs = b * (s * (s + 1) / 2 + s * prefix)
    tokens, sum_kv = b * s, b * (s + prefix)
    tok_kv, qo = kvh * 2 * hd * kvb, h * 2 * hd * ACT
    return 2 * h * 2 * hd * pairs, sum_kv * tok_kv + tokens * (qo + tok_kv), tokens


def gen_attn_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    b, step = _f(rows, "batch_size"), _f(rows, "step")
    h, kvh, hd = _f(rows, "num_heads"), _f(rows, "num_key_value_heads"), _f(rows, "head_dim")
    kvb = np.array([KV_BYTES.get(r["kv_cache_dtype"], 2.0) for r in rows])
    sum_kv = b * (step + 1)
    tok_kv, qo = kvh * 2 * hd * kvb, h * 2 * hd * ACT
    work = np.array([kernels.decode_attention_work(float(n), float(q), float(k), 2.0 * float(d), float(x))
                     for n, q, k, d, x in zip(sum_kv, h, kvh, hd, kvb)])
    return work, sum_kv * tok_kv + b * (qo + tok_kv), b


def mla_context_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    """DeepSeek MLA prefill in MHA form: per-GPU heads, q/k 192 (128 nope + 64 rope), v 128, BF16."""
    b, s, h, prefix = _f(rows, "batch_size"), _f(rows, "isl"), _f(rows, "num_heads"), _f(rows, "step")
    pairs = b * (s * (s + 1) / 2 + s * prefix)
    tokens, ctx = b * s, b * (s + prefix)
    width = 128 + 64 + 128
    return pairs * h * 2 * width, (ctx + tokens) * h * width * ACT, tokens


def mla_generation_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    """Absorbed MLA decode: MQA over the 512 + 64 latent, per-GPU heads."""
    b, step, h = _f(rows, "batch_size"), _f(rows, "step"), _f(rows, "num_heads")
    kvb = np.array([KV_BYTES.get(r["kv_cache_dtype"], 2.0) for r in rows])
    kv = b * (step + 1)
    return kv * h * 2 * (576 + 512), kv * 576 * kvb + b * h * (576 + 512) * ACT, b


def gdn_rows(data: Path, version: str, gpus: Sequence[str] = GPUS) -> list[dict[str, str]]:
    """Sum the conv and scan kernel rows of one GDN configuration into one op latency."""
    total: dict[tuple[str, ...], dict[str, str]] = {}
    keys = ("phase", "batch_size", "seq_len", "num_tokens", "d_model", "num_k_heads", "head_k_dim",
            "num_v_heads", "head_v_dim")
    for r in _load(data, "gdn_perf", version, gpus):
        k = (r["_gpu"],) + tuple(r[x] for x in keys)
        if k in total:
            total[k]["latency"] = str(float(total[k]["latency"]) + float(r["latency"]))
            total[k]["_kernels"] = str(int(total[k]["_kernels"]) + 1)
        else:
            total[k] = dict(r, _kernels="1")
    return [r for r in total.values() if r["_kernels"] == "2"]


def gdn_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, ...]:
    """Same formula as CostModel._ssm_s for a gdn mixer (FP32 state, chunk 64); the second kernel's floor
    is part of the fitted floor."""
    b, M = _f(rows, "batch_size"), _f(rows, "num_tokens")
    heads, dk, dv = _f(rows, "num_v_heads"), _f(rows, "head_k_dim"), _f(rows, "head_v_dim")
    prefill = np.array([float(r["num_tokens"]) if r["phase"] == "context" else 0.0 for r in rows])
    state = heads * dk * dv
    flops = 6.0 * M * state + 2.0 * prefill * 64 * heads * (dk + dv)
    nbytes = 2.0 * b * state * 4 + M * 3 * heads * (dk + dv) * ACT
    return flops, nbytes, M


def moe_format_rows(rows: list[dict[str, str]], moe_dtype: str) -> tuple[list[dict[str, str]], str]:
    """A MoE table's rows of one format that its curve is fitted on, and their ``distribution``: the balanced
    ones, or, where the table has none of the format, its power_law_1.01 ones (MOE_ROUTING)."""
    of_format = [r for r in rows if r["moe_dtype"] == moe_dtype]
    for distribution in MOE_ROUTING:
        kept = [r for r in of_format if r["distribution"] == distribution]
        if kept:
            return kept, distribution
    return [], "balanced"


def moe_kernel_family(kernel_source: str) -> str:
    """The kernel family of an opdb MoE ``kernel_source``: ``marlin`` for the Marlin weight-only MoE kernels
    (w4a16: FP4 / INT4 weights dequantised to BF16 in the GEMM), ``flashinfer`` for FlashInfer's CUTLASS
    fused MoE (vLLM's FlashInferExperts, e.g. ``vllm_fp8moe_flashinfer_cutlass_flashinferexperts``),
    ``default`` for every other kernel: among them FlashInfer's TensorRT-LLM-gen MoE kernels, vLLM's default
    on B300 (``..._flashinfer_trtllm_...``), and SGLang's FlashInfer CuTe-DSL NVFP4 MoE."""
    src = kernel_source.lower()
    for family in CURVE_MOE_KERNELS:
        if MOE_FAMILY_MARKS[family] in src:
            return family
    return "default"


MOE_FAMILY_MARKS = {"marlin": "marlin", "flashinfer": "flashinfer_cutlass"}
"""What an opdb ``kernel_source`` contains when it runs a named MoE kernel family (CURVE_MOE_KERNELS)."""


def moe_curve_subsets(rows: list[dict[str, str]], dtype: str) -> dict[str, list[dict[str, str]]]:
    """The MoE rows of one weight format, by the calibration key their curve is fitted under.

    A format timed with more than one kernel family gets one curve per family: ``dtype`` for the engine's
    default kernel (the rows of no named family) and ``dtype + '_' + family`` (moe_curve_key) for each named
    family; one curve over both fits neither. vLLM's w4a16_mxfp4 table: OpenAI's triton_kernels at gpt-oss's
    shape, Marlin at a 896-expert shape (one curve put Marlin at 0.44x and the Triton kernel at 1.07x its
    measured time at >= 4k tokens). vLLM's fp8_block table: Triton (TritonExperts) at every moe_ep_size 1
    point, FlashInfer CUTLASS (FlashInferExperts) at every moe_ep_size > 1 point; the default curve keeps
    Triton, the kernel vLLM 0.24 picks for block-FP8 on Hopper without EP. A format timed with one kernel
    family keeps the plain key, whichever it is (vLLM's and SGLang's int4_wo rows are all Marlin: Marlin is
    their INT4 MoE kernel; vLLM's per-tensor fp8 rows are all FlashInfer CUTLASS).
    """
    by_family: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        by_family.setdefault(moe_kernel_family(r.get("kernel_source", "")), []).append(r)
    if len(by_family) <= 1:
        return {moe_curve_key(dtype): rows} if rows else {}
    if "default" not in by_family:
        raise ValueError(f"moe {dtype}: kernel families {sorted(by_family)} and no default-kernel rows to fit "
                         f"the plain {dtype!r} curve on")
    return {moe_curve_key(dtype, family): subset for family, subset in by_family.items()}


def moe_features(rows: list[dict[str, str]], dtype: str) -> tuple[np.ndarray, ...]:
    T, hid = _f(rows, "num_tokens"), _f(rows, "hidden_size")
    k, E, ep = _f(rows, "topk"), _f(rows, "num_experts"), _f(rows, "moe_ep_size")
    mats, inter_gpu = _moe_widths(rows)
    # balanced rows (and rows that name no distribution): rank 0's experts and pairs as the collector routed
    # them; power-law rows: MOE_ROUTING
    loads = np.array([kernels.routed_load(int(t), int(kk), int(e), int(p),
                                          MOE_ROUTING[r.get("distribution", "balanced")])
                      for t, kk, e, p, r in zip(T, k, E, ep, rows)]).reshape(-1, 2)
    touched, pairs = loads[:, 0], loads[:, 1]
    flops = 2 * pairs * mats * hid * inter_gpu
    nbytes = touched * moe_expert_bytes(rows, dtype) + pairs * (2 * hid + mats * inter_gpu) * ACT
    return flops, nbytes, pairs / np.maximum(touched, 1e-9), inter_gpu, hid


def _moe_widths(rows: list[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """Per MoE row: the expert's weight matrices (2 without a gate) and its width on one GPU (inter /
    moe_tp)."""
    mats = np.array([2.0 if "nongated" in r.get("kernel_source", "") else 3.0 for r in rows])
    return mats, np.ceil(_f(rows, "inter_size") / _f(rows, "moe_tp_size"))


def moe_expert_bytes(rows: list[dict[str, str]], dtype: str) -> np.ndarray:
    """One expert's weight bytes on the GPU per MoE row (kernels.moe_s: mats x hidden x inter / moe_tp)."""
    mats, inter_gpu = _moe_widths(rows)
    return mats * _f(rows, "hidden_size") * inter_gpu * DTYPE_BYTES[dtype]


def moe_pass_s(rows: list[dict[str, str]], bw: np.ndarray) -> np.ndarray:
    """Per MoE row: one pass over its routed token copies at the GPU's spec HBM bandwidth ``bw``
    (kernels.token_pass_s, as kernels.moe_s prices Roofline.token_passes)."""
    return kernels.token_pass_s(_f(rows, "num_tokens"), _f(rows, "topk"), _f(rows, "hidden_size"), bw)


MOE_WIDTHS_MIN = 3
"""Distinct values a MoE table needs of the expert width per GPU (inter_size / moe_tp_size), or of the
hidden width, for the curve's width term on it (n_half, k_half: kernels.moe_s) to be fitted: with fewer, the
rate at one width cannot be told from the width's share of it, and the term would extrapolate at random."""


_FAMILY_NAMES = {"marlin": "Marlin", "flashinfer": "FlashInfer CUTLASS"}


_EXTRA_NOTES: dict[str, Callable[[float], str]] = {
    "expert_s_per_byte": lambda v: f"one expert's weights at {1e-9 / v:.0f} GB/s",
    "token_s": lambda v: f"{1e9 * v:.0f} ns per token entering the call",
    "token_passes": lambda v: f"{v:.2f} passes over the routed token copies at HBM bandwidth",
}
"""How a calibration note words each extra grouped-expert term of a fitted curve."""


def _family_label(key: str, dtype: str, keys: list[str]) -> str:
    """Provenance label of one kernel family's curve among a format's split curves (``keys``): the named
    family, or ``non-<the named families>`` for the default curve."""
    if key != dtype:
        return _FAMILY_NAMES.get(key[len(dtype) + 1:], key[len(dtype) + 1:])
    return "non-" + " / non-".join(_FAMILY_NAMES.get(k[len(dtype) + 1:], k) for k in keys if k != dtype)


# --- the fit ---------------------------------------------------------------------------------------

def _summary(err: np.ndarray) -> str:
    a = np.abs(err)
    return f"{len(a)} rows, |error| median {100 * np.median(a):.1f} %, p90 {100 * np.percentile(a, 90):.1f} %"


def _load(data: Path, table: str, version: str, gpus: Sequence[str] = GPUS) -> list[dict[str, str]]:
    rows = []
    for gpu in gpus:
        for r in read_table(data, gpu, table, version):
            r["_gpu"] = gpu
            rows.append(r)
    return rows


def fit_engine(data: Path, engine: str, start: dict[str, Any], log: Callable[[str], None],
               tables: TableSet = HOPPER) -> tuple[dict[str, Any], dict[str, str]]:
    """Fit one engine's constants on the tables of ``tables``; returns the YAML mapping and a provenance note
    per fitted block (the others keep ``start``'s values)."""
    version = tables.engines[engine]
    gpus = tables.gpus

    out: dict[str, Any] = {k: v for k, v in start.items() if k != "provenance"}
    notes: dict[str, str] = {}
    src = f"{tables.source} {'+'.join(gpus)} {version}"
    # GEMM per weight format
    gemm_rows = _load(data, "gemm_perf", version, gpus)
    gemm: dict[str, Any] = dict(start["gemm"])
    for raw, dtype in GEMM_DTYPES.items():
        # shapes a model layer shard can have (n, k >= 256); tiny toy shapes would only fit launch noise
        min_m = tables.host_bound_gemm.get(engine, {}).get(dtype, 1)
        rows = _sample([r for r in gemm_rows if r["gemm_dtype"] == raw and int(r["n"]) >= 256
                        and int(r["k"]) >= 256 and int(r["m"]) >= min_m
                        and possible(r, "gemm_perf", r["_gpu"])])
        if not rows:
            continue
        flops, nbytes, m = gemm_features(rows, dtype)
        peak, bw = _gpu_arrays(rows, lambda r: dtype)
        st = start["gemm"].get(dtype, start["gemm"]["bf16"])
        tiles = tables.gemm_row_tiles.get(engine, {}).get(dtype, ())
        p, err = fit_roofline(flops, nbytes, m, peak, bw, _f(rows, "latency") * 1e-3, st, tiles=(1, 64, 128),
                              per_m=True, nk=(_f(rows, "n"), _f(rows, "k")), row_tiles=tiles)
        how = ", row tiles by batch size from the engine's kernel dispatch (GEMM_ROW_TILES)" if tiles else ""
        note = f"fitted on {src} gemm_perf {raw}{how}: {_summary(err)}"
        if min_m > 1:
            ref = gemm.get("fp8", p)
            for key in ("floor_s", "mem_eff", "bytes_half"):
                p[key] = float(ref.get(key, 0.0))
            note = (f"fitted on {src} gemm_perf {raw}, m >= {min_m} only (smaller m measures eager host "
                    f"overhead, see HOST_BOUND_GEMM); memory side and floor from the fp8 fit: {_summary(err)}")
        gemm[dtype] = p
        notes[f"gemm.{dtype}"] = note
        log(f"{engine} gemm {dtype}: {_summary(err)}")
    out["gemm"] = gemm
    # attention
    # (GQA decode: one curve per KV-cache format, see Calibration.gqa_decode)
    attention_fits: tuple[tuple[str, str, Callable[..., tuple[np.ndarray, ...]], str | None], ...] = (
        ("context_attention_perf", "attention_prefill", context_attn_features, None),
        ("generation_attention_perf", "attention_decode", gen_attn_features, "bfloat16"),
        ("generation_attention_perf", "attention_decode_fp8kv", gen_attn_features, "fp8"),
        ("context_mla_perf", "mla_prefill", mla_context_features, None),
        ("generation_mla_perf", "mla_decode", mla_generation_features, None))
    for table, key, feats, kv in attention_fits:
        # full attention at the GQA ratios real models use (GQA_RATIOS query heads per KV head)
        shapes = [r for r in _load(data, table, version, gpus) if r.get("window_size", "0") == "0"
                  and ("num_key_value_heads" not in r or gqa_ratio_fitted(r))
                  and (kv is None or r["kv_cache_dtype"] == kv)]
        rows = _sample([r for r in shapes if possible(r, table, r["_gpu"])])
        if not rows:
            continue
        dropped = len(shapes) - sum(1 for r in shapes if possible(r, table, r["_gpu"]))
        flops, nbytes, m = feats(rows)
        peak, bw = _gpu_arrays(rows, lambda r: "bf16")
        st = start.get(key) or start["attention_decode"]
        p, err = fit_roofline(flops, nbytes, m, peak, bw, _f(rows, "latency") * 1e-3, st, per_m=True,
                              min_compute_eff=1e-3 if kv == "fp8" else 0.02)
        out[key] = p
        cache = f", {kv} KV cache" if kv else ""
        ratio = f", GQA ratio {GQA_RATIOS[0]}-{GQA_RATIOS[1]}" if key.startswith("attention") else ""
        faster = f", {dropped} rows faster than the HBM bound left out (calibrate.possible)" if dropped else ""
        notes[key] = f"fitted on {src} {table} (full attention{ratio}{cache}{faster}): {_summary(err)}"
        log(f"{engine} {key}: {_summary(err)}")
    # MoE per weight format, uniform ('balanced') routing rows only, or power-law ones where a format has
    # none (MOE_ROUTING); a curve key an earlier table format fitted is not fitted again (MOE_DTYPES)
    moe_rows = _load(data, "moe_perf", version, gpus)
    moe: dict[str, Any] = dict(start["moe"])
    fitted: set[str] = set()
    for raw, dtype in MOE_DTYPES.items():
        of_dtype, routing = moe_format_rows(moe_rows, raw)
        subsets = moe_curve_subsets(of_dtype, dtype)
        for key, subset in subsets.items():
            if key in fitted:
                log(f"{engine} moe {key}: fitted already, {raw} rows left out")
                continue
            fitted.add(key)
            rows = _sample(subset)
            flops, nbytes, m, inter_gpu, hid = moe_features(rows, dtype)
            peak, bw = _gpu_arrays(rows, lambda r: dtype)
            st = start["moe"].get(key, start["moe"].get(dtype, start["moe"]["bf16"]))
            # (n, k) = (expert width per GPU, hidden width), each fitted where the table varies it
            n_ok, k_ok = (len(np.unique(a)) >= MOE_WIDTHS_MIN for a in (inter_gpu, hid))
            nk = (inter_gpu, hid if k_ok else None) if n_ok else None
            p, err = fit_moe_curve(flops, nbytes, m, peak, bw, _f(rows, "latency") * 1e-3, st,
                                   moe_expert_bytes(rows, dtype), nk=nk,
                                   tokens=_f(rows, "num_tokens"), pass_s=moe_pass_s(rows, bw))
            moe[key] = p
            kernels = "" if len(subsets) == 1 else f" ({_family_label(key, dtype, list(subsets))} kernels)"
            shape = "" if n_ok and k_ok else (f", width terms on {'the expert width' if n_ok else 'neither'}"
                                               f" ({len(np.unique(inter_gpu))} expert widths per GPU, "
                                               f"{len(np.unique(hid))} hidden width(s))")
            added = "".join(f", {_EXTRA_NOTES[name](p[name])} added ({name})" for name in EXTRA_TERMS if p.get(name))
            how = routing if routing == "balanced" else \
                f"{routing} at the busiest EP rank (the table has no balanced {raw} rows)"
            notes[f"moe.{key}"] = (f"fitted on {src} moe_perf {raw}{kernels} {how}{shape}{added}: "
                                   f"{_summary(err)}")
            log(f"{engine} moe {key}: {_summary(err)}")
    out["moe"] = moe
    # linear-attention scan (SSM family): gated DeltaNet tables
    ssm_out, ssm_notes = fit_ssm(data, engine, start, log, tables)
    out.update(ssm_out)
    notes.update(ssm_notes)
    # all-reduce: graph-captured custom all-reduce, pooled and per GPU count; eager extra = median
    # (eager - graph) at equal size
    ar_rows = _load(data, "custom_allreduce_perf", version, gpus)
    if ar_rows:
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
            log(f"{engine} allreduce {g} GPUs: {_summary(err_g)}")
        out["allreduce"] = {"alpha_s": alpha, "bw_eff": eff,
                            "eager_extra_s": float(np.median(extra)) * 1e-3 if extra
                            else start["allreduce"].get("eager_extra_s", 0.0),
                            "by_gpus": by_gpus}
        notes["allreduce"] = (f"fitted on {src} custom_allreduce_perf (graph), two lines per GPU count "
                              f"({', '.join(map(str, by_gpus))}; by_gpus: [alpha_s, bw_eff], the faster one "
                              f"per message): {_summary(np.concatenate(errs))}; "
                              f"pooled over every count (other counts, groups across nodes): {_summary(err)}")
        log(f"{engine} allreduce pooled: {_summary(err)}")
    return out, notes


def _allreduce_features(rows: list[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """Per row: algorithm time at the full link bandwidth, 2 (g-1)/g x bytes / link, and the measured time."""
    g = _f(rows, "num_gpus")
    nbytes = _f(rows, "message_size") * ACT
    link = np.array([load_gpu(r["_gpu"]).scaleup_bw_Bps for r in rows])
    return 2 * (g - 1) / g * nbytes / link, _f(rows, "latency") * 1e-3


def _fit_envelope(rows: list[dict[str, str]], starts: Sequence[Sequence[float]], lo: Sequence[float],
                  hi: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Alpha-beta lines [alpha_s, bw_eff, alpha_s, bw_eff, ...] whose lower envelope fits graph-timed
    all-reduce rows (least squares on the log ratio, soft L1), the best of the given starts; returns the
    parameters and the rows' relative errors."""
    algo, meas = _allreduce_features(rows)

    def envelope(p: np.ndarray) -> np.ndarray:
        return np.min([p[i] + algo / p[i + 1] for i in range(0, len(p), 2)], axis=0)

    def resid(p: np.ndarray) -> np.ndarray:
        return np.log(envelope(p) / meas)

    best = None
    for start in starts:
        res = least_squares(resid, start, bounds=(lo, hi), loss="soft_l1", f_scale=0.1)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    return best.x, envelope(best.x) / meas - 1.0


def fit_allreduce(rows: list[dict[str, str]]) -> tuple[float, float, np.ndarray]:
    """alpha_s and bw_eff of one line ``alpha + 2 (g-1)/g x bytes / (link x bw_eff)`` over the rows (the
    pooled fit), with the rows' relative errors."""
    p, err = _fit_envelope(rows, [[5e-6, 0.8]], [0.0, 0.05], [1e-4, 1.0])
    return float(p[0]), float(p[1]), err


def fit_allreduce_lines(rows: list[dict[str, str]]) -> tuple[tuple[tuple[float, float], ...], np.ndarray]:
    """Two alpha-beta lines whose lower envelope fits one GPU count's all-reduce rows (the engines' small-
    and large-message algorithms), from a few fixed starts; returns the lines, small-message line first, and
    the rows' relative errors."""
    p, err = _fit_envelope(rows, ([5e-6, 0.5, 2e-5, 1.0], [5e-6, 0.3, 5e-5, 0.9], [3e-6, 0.6, 1e-5, 0.8]),
                           [0.0, 0.05, 0.0, 0.05], [1e-3, 1.5, 1e-3, 1.5])
    lines = sorted(((float(p[0]), float(p[1])), (float(p[2]), float(p[3]))))
    return tuple(lines), err


def _yaml_with_notes(engine: str, data: dict[str, Any], notes: dict[str, str], source: str,
                     tables: TableSet = HOPPER) -> str:
    head = [f"# Fitted constants for {engine}'s kernels, written by `python -m hardware.calibrate` from {source}.",
            "# Per block: where it came from and its fit error (|predicted / measured - 1| over the fitted rows).",
            "# Curves: see hardware/calibration.py. Blocks marked 'starting value' had no table to fit."]
    if tables.arch != HOPPER.arch:
        head.append(f"# {tables.arch.capitalize()} set (hardware.calibration.calibration_for): blocks marked 'no "
                    f"{tables.arch} table' are the engine's Hopper set's, moved to the GPU by its spec alone.")
    data = dict(data)
    data.pop("graph_floors_at_most_fitted", None)   # (the architecture's choice, written last)
    if tables.graph_floors_at_most_fitted:
        data["graph_floors_at_most_fitted"] = True
        notes = {**notes, "graph_floors_at_most_fitted": (
            f"graph floors never above the fitted ones: the {tables.arch} tables time fused kernels "
            "(Calibration.graph_floors_at_most_fitted)")}
    data["provenance"] = (f"fitted by hardware.calibrate on {tables.source} ({tables.engines[engine]}, "
                          f"{'+'.join(tables.gpus)})")
    lines = head + [yaml.safe_dump({"provenance": data.pop("provenance")}, sort_keys=False).strip()]
    for key, val in data.items():
        if isinstance(val, dict) and key in ("gemm", "moe"):
            lines.append(f"{key}:")
            for sub, v in val.items():
                note = notes.get(f"{key}.{sub}", "starting value (not fitted)")
                lines.append(f"  # {note}")
                lines.append(f"  {sub}: {yaml.safe_dump(_round(v), default_flow_style=True, width=1000).strip()}")
        elif isinstance(val, dict):
            note = notes.get(key, "starting value (not fitted)")
            lines.append(f"# {note}")
            lines.append(f"{key}: {yaml.safe_dump(_round(val), default_flow_style=True, width=1000).strip()}")
        else:
            if key in notes:
                lines.append(f"# {notes[key]}")
            lines.append(f"{key}: {str(val).lower() if isinstance(val, bool) else val}")
    return "\n".join(lines) + "\n"


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.4g}")
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_round(x) for x in v]
    return v


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
    rows = _sample(gdn_rows(data, SSM_TABLES[engine], tables.gpus))
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
        peak, bw = _gpu_arrays(subset, lambda r: "bf16")
        p, err = fit_roofline(flops, nbytes, m, peak, bw, _f(subset, "latency") * 1e-3, start["ssm"])
        p["floor_s"] /= 2.0          # the ledger adds the floor twice (conv + scan kernels)
        out[block] = p
        notes[block] = f"fitted on {src} {what}: {_summary(err)}"
        log(f"{engine} {block}: {_summary(err)}")
    return out, notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=None,
                    help=f"folder with the opdb *.csv.gz tables (default: {DEFAULT_DIR}/<the --arch's folder>: "
                         f"{', '.join(str(DEFAULT_DIR / t.source) for t in TABLE_SETS.values())}, written once by "
                         "python -m hardware.opdb_import)")
    ap.add_argument("--arch", default="hopper", choices=list(TABLE_SETS),
                    help="the GPU architecture the tables were measured on (TABLE_SETS: its GPUs, engine versions "
                         "and default --out; hopper: hardware/data/calibration, another: a sub-folder of it)")
    ap.add_argument("--out", type=Path, default=None, help="where to write <engine>.yaml (default: the --arch's)")
    ap.add_argument("--engines", nargs="*", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--gpus", nargs="*", default=None, metavar="GPU",
                    help="fit on these GPUs' tables only (default: every GPU of --arch): a set for a transfer "
                         "test, e.g. --gpus h100_sxm --out validation/constants/h100_only")
    ap.add_argument("--only", nargs="*", default=None, metavar="BLOCK",
                    help="write only these blocks (e.g. moe) or curves (e.g. moe.fp4), keeping every other "
                         "block and curve of the shipped <engine>.yaml of --arch as it is (a refit of one kernel "
                         "family)")
    args = ap.parse_args(argv)
    tables = TABLE_SETS[args.arch]
    if args.data is None:
        args.data = DEFAULT_DIR / tables.source
    if not args.data.is_dir():
        print(f"error: --data {args.data} is not a folder{MISSING_TABLES_HINT}", file=sys.stderr)
        return 2
    if args.gpus:
        unknown = sorted(set(args.gpus) - set(tables.gpus))
        if unknown:
            print(f"error: --gpus {' '.join(unknown)}: {args.arch} tables are of {', '.join(tables.gpus)}",
                  file=sys.stderr)
            return 2
        if args.out is None:
            print("error: --gpus needs --out (the shipped sets are fitted on every GPU)", file=sys.stderr)
            return 2
        tables = attrs.evolve(tables, gpus=tuple(args.gpus))
    out = args.out if args.out is not None else tables.out
    out.mkdir(parents=True, exist_ok=True)
    for engine in args.engines:
        start, start_notes = starting_set(engine, tables)
        log = lambda s: print(s, flush=True)  # noqa: E731
        if args.only is not None and set(args.only) <= SSM_BLOCKS:   # (no other table to read)
            data, notes = fit_ssm(args.data, engine, start, log, tables)
            data = {**{k: v for k, v in start.items() if k != "provenance"}, **data}
        else:
            data, notes = fit_engine(args.data, engine, start, log, tables)
        notes = {**start_notes, **notes}
        if args.only is not None:
            data, notes = keep_shipped(engine, data, notes, set(args.only), tables)
        path = out / f"{engine}.yaml"
        path.write_text(_yaml_with_notes(engine, data, notes, str(args.data), tables))
        print(f"wrote {path}")
    return 0


def starting_set(engine: str, tables: TableSet) -> tuple[dict[str, Any], dict[str, str]]:
    """The values an engine's fit starts from and keeps for the blocks its tables do not fit, with their notes:
    default.yaml's starting values for Hopper (no notes: 'starting value'); for another architecture the
    engine's Hopper set, each block noted as taken from it (its Hopper note in brackets), so a kernel the
    architecture's tables never timed is priced as on Hopper, moved to the GPU by its spec alone."""
    if tables.arch == HOPPER.arch:
        return read_yaml(CALIBRATION_DIR / "default.yaml"), {}
    path = CALIBRATION_DIR / f"{engine}.yaml"
    hopper_notes = _read_notes(path.read_text())
    notes = {block: f"no {tables.arch} table ({tables.source} {tables.engines[engine]}): the Hopper set's, "
                    f"moved by the spec ({note or 'starting value'})"
             for block, note in hopper_notes.items() if block != "provenance"}
    return read_yaml(path), notes


def keep_shipped(engine: str, data: dict[str, Any], notes: dict[str, str],
                 only: set[str], tables: TableSet = HOPPER) -> tuple[dict[str, Any], dict[str, str]]:
    """The fitted ``data`` / ``notes`` of the blocks in ``only``, every other block and its note as the shipped
    YAML of ``engine`` has them (its comment line above each block). A name ``group.key`` (e.g. ``moe.fp4``)
    is one curve of a group (gemm, moe): the group's other curves stay as shipped."""
    curves = {name for name in only if "." in name}
    known = set(data) | {f"{group}.{key}" for group in ("gemm", "moe") for key in data.get(group, {})}
    unknown = sorted(only - known)
    if unknown:
        raise SystemExit(f"--only: no block {', '.join(unknown)}; blocks: {', '.join(sorted(known))}")
    path = tables.out / f"{engine}.yaml"
    shipped = read_yaml(path)

    def refitted(name: str) -> bool:
        return name in only or name.split(".", 1)[0] in only

    kept: dict[str, Any] = {}
    for k, v in shipped.items():
        if k == "provenance":
            continue
        if k in only:
            kept[k] = data[k]
        elif isinstance(v, dict) and any(c.startswith(k + ".") for c in curves):
            kept[k] = {**v, **{c.split(".", 1)[1]: data[k][c.split(".", 1)[1]] for c in curves
                               if c.startswith(k + ".")}}
        else:
            kept[k] = v
    for k in data:
        kept.setdefault(k, data[k])
    shipped_notes = _read_notes(path.read_text())
    merged = {}
    for k in {**shipped_notes, **notes}:  # a refitted block's note first, any other block's shipped one
        first, second = (notes, shipped_notes) if refitted(k) else (shipped_notes, notes)
        merged[k] = first.get(k, second.get(k, ""))
    return kept, {k: v for k, v in merged.items() if v}


def _read_notes(text: str) -> dict[str, str]:
    """The notes :func:`_yaml_with_notes` wrote: block (``group.key`` inside gemm / moe) -> the comment above
    it ('' for a block with none)."""
    notes: dict[str, str] = {}
    note, group = "", ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            note = stripped[1:].strip()
            continue
        if not stripped or ":" not in stripped:
            continue
        key = stripped.split(":", 1)[0]
        if line.startswith("  "):
            notes[f"{group}.{key}"] = note
        else:
            group = key
            notes[key] = note
        note = ""
    return notes


if __name__ == "__main__":
    raise SystemExit(main())
