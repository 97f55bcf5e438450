"""Frozen efficiency curves and floors of the throughput family, read from data/calibration/*.yaml.

One set per engine and GPU architecture (calibration_for): data/calibration/<engine>.yaml fitted on Hopper
tables, data/calibration/<arch>/<engine>.yaml on another architecture's (blackwell: B300). An architecture
without a folder of its own (ampere, ada, cdna3) takes the Hopper sets; the GPU spec moves them.

Curve shapes (all efficiencies are fractions of a spec peak, never a fitted peak):
  compute efficiency  eff(m) = eff_max * m / (m + m_half)          (m: GEMM rows, or tokens per expert)
  memory efficiency   eff(B) = eff_max * B / (B + bytes_half)      (B: bytes the kernel moves)
  time                t = max(FLOPs x tile_pad(m) / (peak x eff(r)), bytes / (BW x eff(B))) + floor_s + m x m_cost_s
                      r: the rows the rate is read at, m x tile_pad(m) (the padded rows), or what a kernel
                      says (prefill attention: kernels.prefill_rows)
                      tile_pad(m): m rounded up to whole row tiles, of m_tile rows, or of the tile the
                      kernel's dispatch picks for m and n (row_tiles: vLLM's Hopper FP8 GEMM, 16-256 rows)
  grouped experts     t + one expert's weight bytes x expert_s_per_byte        (kernels.moe_s; 0: off)
                        + tokens x token_s + token_passes x tokens x top-k x hidden x activation
                          bytes / HBM BW                                       (kernels.moe_s; 0: off)
m_half = bytes_half = 0 gives a constant efficiency.
"""

from __future__ import annotations

import functools
import math
from types import MappingProxyType
from typing import Any, Callable, Mapping

import attrs

from hardware._data import DATA_DIR, read_yaml, unknown_name
from hardware.dtypes import quantised_kv

CALIBRATION_DIR = DATA_DIR / "calibration"
CURVE_MOE_KERNELS = ("marlin", "flashinfer")
"""Named routed-expert kernel families priced with their own MoE curve, fitted on the opdb rows of that
kernel (``<format>_<family>``, moe_curve_key; hardware.table_features.moe_curve_subsets)."""
BORROWED_MOE_KERNELS: Mapping[str, str] = MappingProxyType({"flashinfer_trtllm": "vllm"})
"""Routed-expert kernel families priced with another engine's curve, the engine whose default kernel that
family is on the GPU's architecture: a kernel, not the engine launching it, owns its efficiency.
``flashinfer_trtllm``: FlashInfer's TRT-LLM-gen fused MoE (SM100 only), vLLM's default on Blackwell (its
B300 tables' ``*_flashinfer_trtllm_*`` rows, which the Blackwell vLLM set is fitted on), which SGLang runs
with ``--moe-runner-backend flashinfer_trtllm`` (InferenceMAX's B300 scripts) though SGLang's own B300
tables time its Triton and CuteDSL kernels."""
MOE_KERNELS = ("default", *CURVE_MOE_KERNELS, "deepgemm", *BORROWED_MOE_KERNELS)
"""Every routed-expert kernel family a deployment may name: the engine's default kernel, the families
with their own curve, ``deepgemm`` (priced from the block-FP8 GEMM curve, hardware.kernels.deepgemm_moe_s),
and the families priced with another engine's curve (BORROWED_MOE_KERNELS)."""

_FALLBACK = {"fp8_block": ("fp8_block", "fp8", "bf16"), "fp8": ("fp8", "fp8_block", "bf16"),
             "fp4": ("fp4", "fp8", "bf16"), "int4": ("int4", "bf16"), "fp16": ("bf16",), "bf16": ("bf16",)}


# Kernels one op launches (its floor under CUDA-graph replay is this many per-kernel floors): a GEMM is
# one kernel (the FP8 activation quantisation is fused into the preceding norm / activation by the
# engines' compile passes); a fused MoE layer runs top-k, token alignment / sorting, two grouped GEMMs,
# the activation and the weighted combine (plus the quantisation of the intermediate activation in FP8);
# decode attention writes the new token's K / V into the cache, then runs split-KV attention and its
# reduction.
OP_KERNELS: Mapping[str, int] = {
    "gemm_bf16": 1, "gemm_fp16": 1, "gemm_fp8": 1, "gemm_fp8_block": 1, "gemm_fp4": 1, "gemm_int4": 1,
    "moe": 6, "moe_fp8": 7, "moe_fp8_block": 7,
    "attention_prefill": 1, "attention_decode": 3,
}


@attrs.frozen(kw_only=True)
class Roofline:
    """One kernel family's efficiency curves and per-call floor."""

    compute_eff: float
    m_half: float = 0.0
    mem_eff: float
    bytes_half: float = 0.0
    floor_s: float = 0.0
    m_tile: int = 1          # compute runs on m rounded up to whole tiles (tile quantisation)
    row_tiles: tuple[tuple[int, int, int], ...] = ()
    """The kernel's row tile by batch size, where an engine's dispatch changes it with m (and n): entries
    (largest m, largest n, tile rows), the first that holds wins, a bound of 0 holding for every size; the
    last entry (0, 0, tile) holds for all. An entry with an n bound holds only for a GEMM of known n.
    Overrides ``m_tile``."""
    m_cost_s: float = 0.0    # serial cost per row (attention: per request work scheduling / page walks;
                             # FP8 GEMM: the per-token activation quantisation in front of the GEMM)
    k_half: float = 0.0      # GEMM only: inner width at which half the peak rate is lost to per-tile set-up
    n_half: float = 0.0      # GEMM only: output width at which half is lost to too few output tiles
    expert_s_per_byte: float = 0.0
    """Grouped experts only (kernels.moe_s): seconds per byte of one expert's weights on the GPU, added to the
    call whatever the number of experts it touches. A kernel that gives each expert's slice only part of
    the GPU streams one expert's weights no faster than that part allows, so a call over a few experts costs
    about the time of one expert's weights at that rate before the roofline's total counts: the OpenAI
    triton_kernels MXFP4 MoE on Hopper (both engines' w4a16_mxfp4 tables at gpt-oss's shape: 100 us at one
    token, 4 experts, where reading their 53 MB at HBM rate takes 11 us). Fitted only where it removes a tenth
    of the table's fit cost or more (hardware.curve_fit.fit_moe_curve); 0 elsewhere. Not a floor: it stays
    in graph steps."""
    token_s: float = 0.0
    token_passes: float = 0.0
    """Grouped experts only (kernels.moe_s): the work of a call that sharding the experts does not divide,
    as seconds per token entering the call (``token_s``: routing, sorting, per-token set-up) and as passes,
    at the GPU's HBM bandwidth, over every routed copy of each token's hidden vector (``token_passes``:
    tokens x top-k x hidden x activation bytes; the gather to the experts and the top-k combine). A fused MoE
    layer does both for every token of the batch over the full hidden width on every rank, so sharding the
    experts over moe_tp or ep ranks divides the GEMMs' work but not this part: on vLLM's Marlin MXFP4 table
    (one shape, 896 experts, top 16) the time at 8,192 tokens falls 44.4 -> 22.5 -> 12.3 -> 7.2 -> 4.6 -> 3.3
    -> 2.4 ms as the shard count goes 1 -> 128, the same for moe_tp as for ep at equal count: work / shards
    plus about 2 ms. hardware.curve_fit.fit_moe_curve adds each to a table's curve only where it removes a
    tenth of the fit cost or more, the one that removes more first; 0 elsewhere. Not floors: they stay in
    graph steps."""
    chunk_s: float = 0.0
    """Chunked linear-attention scans only (kernels.ssm_s, the ``ssm`` curve of a gated-DeltaNet table):
    seconds per chunk of the longest sequence. The chunked gated-delta-rule kernels carry each (sequence,
    head)'s state from one chunk to the next, so a sequence's chunks run one after another whatever the
    heads and sequences beside it: one 8k sequence costs 0.39 ms at 16 value heads on the B300 tables of
    both kernels, where the throughput roofline gives 0.13-0.20. How the chain meets the parallel work is
    the kernel's (``chunk_adds``). Fitted on the table's context rows after the roofline
    (hardware.curve_fit.fit_chunk_s); 0: no such term. Not a floor: it stays in graph steps."""
    chunk_adds: bool = False
    """True: the chain is a kernel of its own between parallel ones, and its time adds to theirs (FLA's
    Triton pipeline, whose chunk_gated_delta_rule_fwd_h alone walks the chunks: TRT-LLM's and SGLang's);
    False: one fused kernel whose chain and parallel work overlap, so the chain bounds the call from below
    (FlashInfer's GDN prefill, vLLM's). The fit takes the form that fits the table better."""

    def compute_Fps(self, peak_flops: float, m: float) -> float:
        """Achievable FLOP/s at m rows (before tile padding)."""
        return peak_flops * self.compute_eff * (m / (m + self.m_half) if self.m_half else 1.0)

    def tile_factor(self, m: float, n: float | None = None) -> float:
        """Padded rows / rows: the extra compute a partly filled last tile costs (``n``: a GEMM's output
        width, for row tiles that depend on it)."""
        if m <= 0:
            return 1.0
        tile = self.m_tile
        if self.row_tiles:
            tile = next((t for top_m, top_n, t in self.row_tiles
                         if (top_m == 0 or m <= top_m) and (top_n == 0 or (n is not None and n <= top_n))),
                        self.m_tile)
        if tile <= 1:
            return 1.0
        return math.ceil(m / tile) * tile / m

    def width_factor(self, n: float, k: float) -> float:
        """GEMM rate lost to narrow shapes: a tile's fixed prologue / epilogue (scale loads, output write)
        is amortised over k / tile_k main-loop steps, and a narrow n leaves too few output tiles per row
        block to fill the SMs. 1 for kernels fitted without these terms."""
        f = k / (k + self.k_half) if self.k_half else 1.0
        return f * (n / (n + self.n_half) if self.n_half else 1.0)

    def mem_Bps(self, bw_Bps: float, nbytes: float) -> float:
        """Achievable bytes/s when moving nbytes."""
        return bw_Bps * self.mem_eff * (nbytes / (nbytes + self.bytes_half) if self.bytes_half else 1.0)

    def time_s(self, flops: float, nbytes: float, m: float, peak_flops: float, bw_Bps: float,
               width_eff: float = 1.0, rate_rows: float | None = None, n: float | None = None) -> float:
        """max(compute, memory) + floor + per-row cost; ``width_eff`` scales the compute rate (GEMM shapes).
        With tiles, the kernel computes whole tiles of rows: the padded work runs at the rate of the padded
        row count (the rate at the rows asked for would charge the few-row loss twice: once as padding, once
        as a low rate, e.g. 2,100 x the ideal time for one row on 128-row tiles). ``rate_rows``: the rows to
        read the rate at instead (see kernels.prefill_rows); ``n``: a GEMM's output width (row_tiles)."""
        if flops <= 0 and nbytes <= 0:
            return 0.0
        tile = self.tile_factor(m, n)
        rows = m * tile if rate_rows is None else rate_rows
        tc = flops * tile / (self.compute_Fps(peak_flops, rows) * width_eff) if flops > 0 else 0.0
        tm = nbytes / self.mem_Bps(bw_Bps, nbytes) if nbytes > 0 else 0.0
        return max(tc, tm) + self.floor_s + self.m_cost_s * m


@attrs.frozen(kw_only=True)
class Collective:
    """Alpha-beta all-reduce / all-to-all: alpha_s + algorithm bytes / (link BW x bw_eff).

    ``by_gpus`` holds lines (alpha_s, bw_eff) fitted on one GPU count's rows alone, for collectives inside the
    scale-up (NVLink) domain; a message takes the fastest line of its count. The engines switch algorithm
    with the message size (vLLM's and TRT-LLM's one-shot and two-shot custom all-reduce, then NCCL), so the
    measured time is a lower envelope: on 8 GPUs small messages pay little latency and low bandwidth, large
    ones more latency and nearly the link's bandwidth (opdb custom_allreduce_perf, H200, vLLM: bus bandwidth
    about 200 GB/s at 1 M elements, 446 GB/s at 134 M, over a 450 GB/s link; about 300 GB/s on 2 GPUs), which
    one line for every count and size cannot follow. Other counts, and groups that span nodes, take the
    pooled line (alpha_s, bw_eff).
    """

    alpha_s: float
    bw_eff: float
    eager_extra_s: float = 0.0     # extra per call outside CUDA graphs (collective setup)
    by_gpus: tuple[tuple[int, tuple[tuple[float, float], ...]], ...] = ()
    """(GPU count, its lines (alpha_s, bw_eff)) per fitted count."""

    def lines(self, gpus: int, scale_up: bool = True) -> tuple[tuple[float, float], ...]:
        """The (alpha_s, bw_eff) lines of a collective over ``gpus`` GPUs (``scale_up``: inside one NVLink
        domain): its count's own where fitted, else the pooled one."""
        if scale_up:
            for g, lines in self.by_gpus:
                if g == gpus:
                    return lines
        return ((self.alpha_s, self.bw_eff),)


@attrs.frozen(kw_only=True)
class Calibration:
    """The frozen constant set: one Roofline per kernel family (GEMM per compute dtype)."""

    name: str
    provenance: str = ""
    gemm: Mapping[str, Roofline]           # by compute dtype: bf16, fp8, fp4
    attn_prefill: Roofline
    attn_decode: Roofline
    attn_decode_fp8kv: Roofline | None = None  # GQA decode over an FP8 KV cache, when fitted on its own rows
    attn_mla_prefill: Roofline | None = None   # MLA kernels when fitted on their own tables, else the GQA ones
    attn_mla_decode: Roofline | None = None
    moe: Mapping[str, Roofline]            # grouped expert GEMMs by compute dtype; m = tokens per expert
    ssm: Roofline
    ssm_decode: Roofline | None = None
    """The linear-attention decode kernels (conv update + recurrent state update of one token per request),
    fitted on a gdn table's generation rows alone where shipped; else ``ssm``, fitted on every row and so
    priced by the prefill kernels that outnumber them (4x slower than the B300 decode rows at 4-16 requests)."""
    elementwise: Roofline
    elementwise_kernels_per_block: int = 2
    allreduce: Collective
    alltoall: Collective
    graph_floors_at_most_fitted: bool = False
    """In a replayed graph, an op's floor is its kernel count times the engine's graph kernel floor, but never
    above the floor fitted on its table (which the collectors time in a replayed graph): where the op is one
    fused kernel the count (``OP_KERNELS``: Triton's fused MoE launches 6-7) overstates it. Set in the Blackwell
    sets, whose MoE and decode-attention rows time TRT-LLM-gen's fused kernels (vLLM's NVFP4 MoE: 18 us a call
    at one token, where 6 x 4.5 us = 27 us); off in the Hopper sets, which keep the replacement they were
    checked with."""

    def graph_mode(self, kernel_floor_s: float) -> "Calibration":
        """The same curves with the floors a replayed CUDA graph pays: ``kernel_floor_s`` per kernel.

        Inside a replayed graph every kernel costs an engine-level ``kernel_floor_s`` (its launch slot in
        the graph, the dependency wait and the tail of a nearly empty grid) times the kernels the op launches
        (``OP_KERNELS``); elementwise kernels pay it too. ``kernel_floor_s`` is fitted on serving rows
        (validation/report.py fit-host, H100 TRAIN rows), not on the tables.

        The opdb tables do not time each op eagerly: aiconfigurator's collectors replay each op in a
        captured CUDA graph (collector/helper.py ``benchmark_with_power``, #153 of 2025-12-12;
        collect_moe.py captured its own graph before #153).
        The exceptions are vLLM's block-FP8 GEMMs, timed eagerly (collect_gemm.py ``use_cuda_graph=gemm_type
        != "fp8_block"``), and TensorRT-LLM's MoE, which falls back to eager where capture fails
        (``allow_graph_fail=True``). So the MoE floors of 15-89 us are mostly graph-replay floors of
        multi-kernel ops. Still, the serving rows price graphed decode better with this replacement. A likely
        reason, not measured here: a graph holding one small op, replayed back to back, waits for each
        replay's launch, while a whole-model graph runs its kernels one after another with no launch between.
        Keeping the tables' floors in graph steps instead makes the whole file worse: TPOT MAPE 12.0 ->
        14.9 %, vLLM's gpt-oss TPOT 5.5 -> 33.0 % (H200), TensorRT-LLM's H100 TRAIN fit 8.5 -> 17.6 % median
        |error|; only the TensorRT-LLM H200 MoE rows gain (gpt-oss 21.6 -> 11.1 %). hardware/MODEL.md,
        "Open gaps", keeps this open.
        """
        if self.graph_floors_at_most_fitted:
            return self._floored(f"{self.name}[graph]", lambda r, kernels: min(kernels * kernel_floor_s, r.floor_s))
        return self._floored(f"{self.name}[graph]", lambda r, kernels: kernels * kernel_floor_s)

    def eager_mode(self, kernel_floor_s: float) -> "Calibration":
        """The curves an eagerly launched step pays: each op's floor at least what it costs inside a replayed
        graph (``kernel_floor_s`` per kernel, :meth:`graph_mode`).

        Replaying a graph removes the CPU's launches and never makes a kernel slower on the GPU, so an op run
        eagerly is never cheaper than the same op replayed. The graph floor is fitted on serving steps, where
        it also carries the small kernels the op list does not name (rotary embedding, residual adds,
        activation quantisation), which an eager step runs as well; where an eager floor is below it (the
        elementwise starting value of 2 us, TensorRT-LLM's and vLLM's BF16 GEMM floors of 3-4 us), a step
        just past the largest capture size was priced below one just inside it (vLLM, Qwen3-0.6B on H100:
        2.43 ms at 513 prompt tokens against 2.82 ms at 512). Ops whose eager floor is above it (MoE, vLLM's
        block-FP8 GEMM, attention) keep their own.
        """
        return self._floored(f"{self.name}[eager]", lambda r, kernels: max(r.floor_s, kernels * kernel_floor_s))

    def _floored(self, name: str, floor_of: Callable[[Roofline, int], float]) -> "Calibration":
        """The same curves with each op's floor replaced by ``floor_of(curve, kernels the op launches)``."""
        def floor(r: Roofline, kernels: int) -> Roofline:
            return attrs.evolve(r, floor_s=floor_of(r, kernels))

        def optional(r: Roofline | None, kernels: int) -> Roofline | None:
            return floor(r, kernels) if r is not None else None

        prefill, decode = OP_KERNELS["attention_prefill"], OP_KERNELS["attention_decode"]
        return attrs.evolve(
            self,
            name=name,
            gemm={k: floor(r, OP_KERNELS.get("gemm_" + k, 1)) for k, r in self.gemm.items()},
            attn_prefill=floor(self.attn_prefill, prefill),
            attn_decode=floor(self.attn_decode, decode),
            attn_decode_fp8kv=optional(self.attn_decode_fp8kv, decode),
            attn_mla_prefill=optional(self.attn_mla_prefill, prefill),
            attn_mla_decode=optional(self.attn_mla_decode, decode),
            moe={k: floor(r, OP_KERNELS.get("moe_" + k, OP_KERNELS["moe"])) for k, r in self.moe.items()},
            ssm=floor(self.ssm, 1),
            ssm_decode=optional(self.ssm_decode, 1),
            elementwise=floor(self.elementwise, 1),
        )

    @property
    def mla_prefill(self) -> Roofline:
        return self.attn_mla_prefill or self.attn_prefill

    @property
    def mla_decode(self) -> Roofline:
        return self.attn_mla_decode or self.attn_decode

    def gqa_decode(self, kv_bytes: float) -> Roofline:
        """The GQA decode curve for a KV cache of ``kv_bytes`` per element: the FP8-KV curve for quantised
        caches where it was fitted, else the (BF16-KV) curve. The decode kernels dequantise FP8 K and V in
        their inner loop, so an FP8 cache halves the bytes but not the work: on the opdb tables they are
        barely faster on an H200 than on an H100 (median latency ratio 0.96-0.99 at >= 0.3 ms, where BF16
        caches give 0.72-0.78, the bandwidth ratio being 0.70), which one curve over both caches cannot
        follow (it over-priced BF16 caches by 8-17 % and under-priced FP8 ones by 6-38 %). The FP8 curve's
        compute side is the dequantisation (hardware.kernels.decode_attention_work)."""
        if quantised_kv(kv_bytes) and self.attn_decode_fp8kv is not None:
            return self.attn_decode_fp8kv
        return self.attn_decode

    def gemm_for(self, weight_dtype: str) -> Roofline:
        """GEMM curve for a weight format, falling back along _FALLBACK (e.g. fp8_block -> fp8 -> bf16)."""
        for key in _FALLBACK.get(weight_dtype, (weight_dtype, "bf16")):
            if key in self.gemm:
                return self.gemm[key]
        return self.gemm["bf16"]

    def moe_for(self, weight_dtype: str, kernel: str = "default") -> Roofline:
        """Grouped-expert curve for a weight format: the engine's default MoE kernel, falling back along
        _FALLBACK, or a named kernel family (``marlin``, ``flashinfer``: the curve fitted as
        ``<dtype>_<family>``, which must exist; a run asking for a kernel the engine's tables never timed is an error, not a fallback)."""
        if kernel != "default":
            key = moe_curve_key(weight_dtype, kernel)
            if key not in self.moe:
                raise ValueError(f"calibration {self.name!r} has no {kernel} MoE curve for {weight_dtype} weights "
                                 f"(fitted MoE curves: {', '.join(sorted(self.moe))})")
            return self.moe[key]
        for key in _FALLBACK.get(weight_dtype, (weight_dtype, "bf16")):
            if key in self.moe:
                return self.moe[key]
        return self.moe.get("bf16") or self.gemm_for(weight_dtype)


def moe_curve_key(weight_dtype: str, kernel: str = "default") -> str:
    """The key a MoE curve is fitted and looked up under: the weight format for the engine's default
    kernel, ``<format>_<family>`` for a named kernel family (hardware.table_features.moe_curve_subsets)."""
    return weight_dtype if kernel == "default" else f"{weight_dtype}_{kernel}"


REFERENCE_ARCH = "hopper"
"""The architecture of the top-level sets (data/calibration/<engine>.yaml, fitted on H100 and H200 tables): every
architecture without a folder of its own is priced with them."""


def list_calibrations() -> list[str]:
    """Names of the shipped sets: ``<engine>`` (the Hopper sets, and ``default``) and ``<arch>/<engine>``."""
    return sorted([p.stem for p in CALIBRATION_DIR.glob("*.yaml")]
                  + [f"{p.parent.name}/{p.stem}" for p in CALIBRATION_DIR.glob("*/*.yaml")])


def calibration_archs() -> list[str]:
    """The GPU architectures with sets of their own (sub-folders of data/calibration), besides the reference."""
    return sorted(p.name for p in CALIBRATION_DIR.iterdir() if p.is_dir() and any(p.glob("*.yaml")))


def _roof(raw: Mapping[str, Any], where: str = "") -> Roofline:
    """One curve of a calibration YAML; ``where`` names it (file and key) in the error of a bad field."""
    try:
        tiles = row_tiles(raw.get("row_tiles", ()))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}" if where else str(exc)) from None
    return Roofline(compute_eff=float(raw.get("compute_eff", 1.0)), m_half=float(raw.get("m_half", 0.0)),
                    mem_eff=float(raw["mem_eff"]), bytes_half=float(raw.get("bytes_half", 0.0)),
                    floor_s=float(raw.get("floor_s", 0.0)), m_tile=int(raw.get("m_tile", 1)),
                    m_cost_s=float(raw.get("m_cost_s", 0.0)), k_half=float(raw.get("k_half", 0.0)),
                    n_half=float(raw.get("n_half", 0.0)), row_tiles=tiles,
                    expert_s_per_byte=float(raw.get("expert_s_per_byte", 0.0)),
                    token_s=float(raw.get("token_s", 0.0)), token_passes=float(raw.get("token_passes", 0.0)),
                    chunk_s=float(raw.get("chunk_s", 0.0)), chunk_adds=bool(raw.get("chunk_adds", False)))


def row_tiles(raw: Any) -> tuple[tuple[int, int, int], ...]:
    """A curve's ``row_tiles`` from YAML (a list of [largest m, largest n, tile rows], Roofline.row_tiles),
    checked: bounds >= 0, m bounds other than 0 non-decreasing, tiles >= 1, the last entry [0, 0, tile]."""
    entries = tuple((int(top_m), int(top_n), int(tile)) for top_m, top_n, tile in raw)
    if not entries:
        return ()
    tops = [top_m for top_m, _, _ in entries[:-1]]
    if entries[-1][:2] != (0, 0) or any(t <= 0 for t in tops) or tops != sorted(tops) \
            or any(top_n < 0 or tile < 1 for _, top_n, tile in entries):
        raise ValueError(f"row_tiles {list(map(list, entries))}: expected [largest m, largest n, tile rows] "
                         "entries with m bounds > 0 in order, n bounds >= 0 (0: any n), tiles >= 1, and a "
                         "last entry [0, 0, tile rows] for every other size")
    return entries


def _coll(raw: Mapping[str, Any]) -> Collective:
    by_gpus = tuple(sorted((int(g), tuple((float(a), float(e)) for a, e in lines))
                           for g, lines in (raw.get("by_gpus") or {}).items()))
    return Collective(alpha_s=float(raw["alpha_s"]), bw_eff=float(raw["bw_eff"]),
                      eager_extra_s=float(raw.get("eager_extra_s", 0.0)), by_gpus=by_gpus)


def calibration_from_dict(name: str, raw: Mapping[str, Any]) -> Calibration:
    """Build a Calibration from the YAML layout (also used by hardware.calibrate)."""
    return Calibration(
        name=name,
        provenance=str(raw.get("provenance", "")),
        gemm={str(k): _roof(v, f"calibration {name}.yaml gemm.{k}") for k, v in raw["gemm"].items()},
        attn_prefill=_roof(raw["attention_prefill"]),
        attn_decode=_roof(raw["attention_decode"]),
        attn_decode_fp8kv=_roof(raw["attention_decode_fp8kv"]) if "attention_decode_fp8kv" in raw else None,
        attn_mla_prefill=_roof(raw["mla_prefill"]) if "mla_prefill" in raw else None,
        attn_mla_decode=_roof(raw["mla_decode"]) if "mla_decode" in raw else None,
        moe={str(k): _roof(v) for k, v in raw["moe"].items()},
        ssm=_roof(raw["ssm"]),
        ssm_decode=_roof(raw["ssm_decode"]) if "ssm_decode" in raw else None,
        elementwise=_roof(raw["elementwise"]),
        elementwise_kernels_per_block=int(raw.get("elementwise_kernels_per_block", 2)),
        graph_floors_at_most_fitted=bool(raw.get("graph_floors_at_most_fitted", False)),
        allreduce=_coll(raw["allreduce"]),
        alltoall=_coll(raw["alltoall"]),
    )


@functools.cache
def load_calibration(name: str = "default") -> Calibration:
    """Load a frozen constant set by name ('default', an engine name when one was fitted, or
    ``<arch>/<engine>`` for an architecture's own set)."""
    path = CALIBRATION_DIR / f"{name}.yaml"
    if not path.is_file():
        raise unknown_name("calibration", name, list_calibrations())
    return calibration_from_dict(name, read_yaml(path))


def calibration_for_engine(engine: str) -> Calibration:
    """The engine's own fitted Hopper constants when shipped (kernels differ per engine), else the default."""
    return load_calibration(engine if engine in list_calibrations() else "default")


def borrowed_moe_calibration(kernel: str, arch: str) -> Calibration:
    """The set whose default MoE curve prices ``kernel`` (BORROWED_MOE_KERNELS) on ``arch``; ValueError where
    that architecture has no set of its own for the owning engine (the kernel does not run there)."""
    owner = BORROWED_MOE_KERNELS[kernel]
    own = _own_set(owner, arch)
    if own is None:
        raise ValueError(f"moe_kernel {kernel} is priced with {owner}'s kernel tables on the GPU's architecture, and "
                         f"{arch or 'this architecture'} has none (it runs on: {', '.join(calibration_archs())})")
    return load_calibration(own)


def _own_set(engine: str, arch: str) -> str | None:
    """The name of the set fitted for ``engine`` on ``arch``'s own tables, None where only Hopper's exists."""
    if arch != REFERENCE_ARCH and (CALIBRATION_DIR / arch / f"{engine}.yaml").is_file():
        return f"{arch}/{engine}"
    return None


def calibration_for(engine: str, arch: str) -> Calibration:
    """The constants an engine's kernels run with on a GPU of architecture ``arch`` (GPUSpec.arch): the set
    fitted on that architecture's tables (data/calibration/<arch>/<engine>.yaml) where shipped, else the
    Hopper set (:func:`calibration_for_engine`), moved to the GPU by its spec alone. Kernels change with the
    architecture (Blackwell's tcgen05 GEMMs, TRT-LLM-gen attention and MoE, native FP4), so curves fitted on
    Hopper misprice them; the spec's peaks and bandwidths stay the only GPU-specific numbers within one."""
    own = _own_set(engine, arch)
    return load_calibration(own) if own is not None else calibration_for_engine(engine)
