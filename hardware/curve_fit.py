"""Least-squares fits of the calibration's curves on per-row features: the roofline curve (calibration.Roofline)
as numpy predictors with hardware.kernels' formulas (roof_np, tile_pad_np), its fit on log error
(fit_roofline), the grouped-expert curve grown by extra terms where they pay (fit_moe_curve), and the
all-reduce's alpha-beta lines (fit_allreduce, fit_allreduce_lines). Which rows and tables feed them is
hardware.engine_fit's business."""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

from hardware.table_features import allreduce_features

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


def fit_chunk_s(p: Mapping[str, float], flops: np.ndarray, nbytes: np.ndarray, m: np.ndarray, peak: np.ndarray,
                bw: np.ndarray, meas_s: np.ndarray, chunks: np.ndarray) -> tuple[float, bool, np.ndarray]:
    """Roofline.chunk_s and chunk_adds of a chunked scan on top of the roofline ``p`` fitted before
    (fit_roofline's plain five parameters), ``chunks`` per row the chunks of its longest sequence: the
    seconds per chunk and the form, added (roofline + chunks x chunk_s) or bounding (max(roofline without
    its floor, chunks x chunk_s) + floor), that fit the rows best on fit_roofline's loss (soft L1 on the
    log ratio, scale 0.1). A one-parameter search per form: 0 or a value on a log grid from 10 ns to 20 us
    in steps of 1 %. Returns the value, the form and the rows' relative errors with them."""
    keys = ("compute_eff", "m_half", "mem_eff", "bytes_half", "floor_s")
    whole = roof_np([p[k] for k in keys], flops, nbytes, m, peak, bw)
    body, floor = whole - p["floor_s"], p["floor_s"]

    def pred(c: float, adds: bool) -> np.ndarray:
        return whole + chunks * c if adds else np.maximum(body, chunks * c) + floor

    def cost(c: float, adds: bool) -> float:
        z = (np.log(pred(c, adds) / meas_s) / 0.1) ** 2
        return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))

    grid = [0.0, *np.geomspace(1e-8, 2e-5, int(np.log(2000.0) / np.log(1.01)) + 1)]
    best = min(((c, adds) for adds in (False, True) for c in grid), key=lambda x: cost(*x))
    c, adds = float(best[0]), bool(best[1] and best[0] > 0.0)
    return c, adds, pred(c, adds) / meas_s - 1.0


# --- all-reduce lines ------------------------------------------------------------------------------

def _fit_envelope(rows: list[dict[str, str]], starts: Sequence[Sequence[float]], lo: Sequence[float],
                  hi: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Alpha-beta lines [alpha_s, bw_eff, alpha_s, bw_eff, ...] whose lower envelope fits graph-timed
    all-reduce rows (least squares on the log ratio, soft L1), the best of the given starts; returns the
    parameters and the rows' relative errors."""
    algo, meas = allreduce_features(rows)

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
