"""Attention pricing of a step's layers for one deployment: GQA (windowed or not), MLA (with DSA's indexer)
and DeepSeek-V4's compressed sparse attention, over a step's decode and prefill contexts, on the calibrated
attention curves. Holds the memos attention is priced with (a layer kind's time for the last arguments, MLA's
context-free projections) and the bound decode prices use to leave the longest context out of their key
(max_kv_bound). CostModel owns one and asks it for the ``attention`` term."""

from __future__ import annotations

from hardware import kernels
from hardware.calibration import Calibration, Roofline
from hardware.deployment import ACT_BYTES, Deployment
from hardware.dtypes import COMPUTE_DTYPE
from hardware.layers import MixerSpec
from hardware.shape import decode_rate_rows

CACHE_LIMIT = 1 << 13
"""Entries a price memo holds before it is cleared. Memos are exact, so the limit changes speed alone; it
bounds memory on long runs whose mixed steps keep bringing new keys (an entry holding a term dict is about
a kilobyte: 8,192 of them, some 9 MB per memo). What hits is recent (a decode stretch's sizes, a token
count's terms): 2^13 entries ran the 100,000-request scale point 5 % faster than 2^16 in half the memory
(benchmarks/scenarios.py scale_scenario, peak RSS 157 against 336 MB)."""

FLASHMLA_SPARSE_PREFILL_EFF = 0.65
"""FlashMLA's sparse MLA prefill kernel (flash_mla_sparse_fwd) as a fraction of the GPU's BF16 peak: up to
640 TFLOPS on H800 SXM5 (990) and 1,450 on B200 (2,250) in its README, 0.65 and 0.64; no kernel table
measures it, so a DSA prefill under EngineProfile.dsa_prefill sparse_padded is priced at this rate."""

AttentionGroups = tuple[tuple[int, MixerSpec, int, int], ...]
"""(layers, mixer, heads per GPU, KV heads per GPU) of each attention layer kind."""

RateTerms = tuple[tuple[float, int, float, float, float, float, float], ...]
"""Per decode attention layer kind, the constants AttentionCost.max_kv_bound reads (_rate_terms)."""


class AttentionCost:
    """The ``attention`` term of one deployment's steps (CostModel._attention_s), summed over its attention
    layer kinds."""

    def __init__(self, dep: Deployment, gcal: Calibration, ecal: Calibration, groups: AttentionGroups) -> None:
        """``gcal`` / ``ecal``: the constants as a replayed CUDA graph / an eager step sees them; ``groups``: the
        model's attention layer kinds."""
        self.dep = dep
        self.gcal, self.ecal = gcal, ecal
        self.groups = groups
        self._kv_bytes = dep.kv_bytes_per_elem
        self._peak_bf16 = dep.gpu.flops_for("bf16")
        self._hbm_Bps = dep.gpu.hbm_bw_Bps
        self._layer_key: tuple[bool | int, ...] = ()
        self._layer_times: dict[tuple[int, int, int], float] = {}
        """One attention layer's time by (mixer id, heads, KV heads), for the arguments ``_layer_key`` of the
        last :meth:`time_s` call."""
        self._mla_proj_cache: dict[tuple[int, int, int, int], float] = {}
        """Absorbed MLA's W_UK / W_UV projections (decode, DSA sparse prefill) by (calibration, mixer, heads,
        query tokens): they do not depend on the context, which every decode step changes (_absorb_s)."""
        self._rate_bounds: dict[bool, RateTerms | None] = {}
        """max_kv_bound's per-layer constants, by whether the decode attention replays a graph."""

    def time_s(self, graph: bool, D: int, d_kv: int, p_tokens: int, p_reqs: int, p_kv: int,
               p_pairs: int, dq: int = 1, groups: AttentionGroups | None = None, d_max: int = -1) -> float:
        """Attention of D decode requests over d_kv keys (the longest d_max; -1: unknown, taken as equal
        contexts) plus p_tokens prefill tokens of p_reqs requests (p_kv keys, p_pairs causal pairs), summed
        over the attention layers (or ``groups``). A decode request carries dq queries (1 + drafts when
        speculative): the decode kernel reads its context once for all of them, as FlashMLA / FlashInfer
        fold the query length into the head dimension. The decode kernel's rate is read at
        d_kv / d_max requests (BatchShape.decode_rows); a layer that attends a window (or DSA's top-k keys)
        reads at most that many keys per request, so its longest request reads min(d_max, window)."""
        cal = self.gcal if graph else self.ecal
        peak, bw = self._peak_bf16, self._hbm_Bps
        # A layer kind's time depends on these arguments and on (mixer, heads, KV heads) alone: groups of the
        # same kind (dense-first and MoE layers, the MTP layer) share it, within a call and with the call
        # before when its arguments were the same (a speculative step's draft pass after the target's).
        key = (graph, D, d_kv, p_tokens, p_reqs, p_kv, p_pairs, dq, d_max)
        if key != self._layer_key:
            self._layer_key = key
            self._layer_times = {}
        layer_times = self._layer_times
        total = 0.0
        for count, mx, heads, kvh in self.groups if groups is None else groups:
            kind = (id(mx), heads, kvh)  # (the mixers are this model's: their ids stay theirs)
            t = layer_times.get(kind)
            if t is not None:
                total += count * t
                continue
            if mx.kind == "gqa":
                t = self._gqa_s(mx, heads, kvh, cal, D, d_kv, p_tokens, p_reqs, p_kv, p_pairs, dq, d_max)
            elif mx.kind == "csa":
                t = self._csa_s(mx, heads, D, d_kv, p_tokens, p_reqs, p_kv, p_pairs, cal, dq, d_max)
            else:
                t = self._mla_s(mx, heads, D, d_kv, p_tokens, p_kv, p_pairs, peak, bw, cal, dq, d_max, p_reqs)
            layer_times[kind] = t
            total += count * t
        return total

    def _gqa_s(self, mx: MixerSpec, heads: int, kvh: int, cal: Calibration, D: int, d_kv: int, p_tokens: int,
               p_reqs: int, p_kv: int, p_pairs: int, dq: int, d_max: int) -> float:
        """One GQA layer of ``heads`` query and ``kvh`` KV heads per GPU (time_s's arguments); a window caps
        the keys each request reads."""
        kvb, peak, bw = self._kv_bytes, self._peak_bf16, self._hbm_Bps
        dk, pk, pp, dm = d_kv, p_kv, p_pairs, d_max
        if mx.window:
            dk = min(dk, D * mx.window)
            pk = min(pk, p_reqs * mx.window + p_tokens)
            pp = min(pp, p_tokens * mx.window)
            dm = min(dm, mx.window)
        # Each kernel costs 0.0 without its requests: skipping the call adds nothing (exact).
        t = 0.0
        if D > 0:
            t = kernels.gqa_decode_s(cal.gqa_decode(kvb), reqs=D, sum_kv=dk, heads=heads * dq,
                                     kv_heads=kvh, head_dim=mx.head_dim, v_head_dim=mx.vdim,
                                     kv_bytes=kvb, peak_flops=peak, bw_Bps=bw,
                                     rate_rows=decode_rate_rows(D, dk, dm))
        if p_tokens > 0:
            t += kernels.gqa_prefill_s(cal.attn_prefill, tokens=p_tokens, sum_kv=pk, pairs=pp,
                                       heads=heads, kv_heads=kvh, head_dim=mx.head_dim,
                                       v_head_dim=mx.vdim, kv_bytes=kvb, peak_flops=peak, bw_Bps=bw)
        return t

    def _mla_s(self, mx: MixerSpec, heads: int, D: int, d_kv: int, p_tokens: int, p_kv: int, p_pairs: int,
               peak: float, bw: float, cal: Calibration, dq: int = 1, d_max: int = -1, p_reqs: int = 1) -> float:
        """MLA: absorbed latent attention for decode (W_UK / W_UV as batched GEMMs around an MQA kernel over
        the 576-wide latent); MHA form for prefill (kv_b up-projection of the context, then attention), except
        a DSA prefill under the engine's sparse_padded rule (EngineProfile.dsa_prefill), which runs absorbed
        over the top-k keys with padded query heads once its contexts pass index_topk (the step's longest
        context taken as its mean: a shape keeps no prefill maximum)."""
        d = self.dep
        lat, rope, nope, v = mx.kv_lora_rank, mx.qk_rope_head_dim, mx.qk_nope_head_dim, mx.vdim
        t = 0.0
        idx_flops, idx_bytes = 0.0, 0.0
        dk, pk, pp, dm = d_kv, p_kv, p_pairs, d_max
        if mx.index_topk:       # DSA: an FP8 indexer scores every pair, attention reads top-k keys only
            idx_flops = 2.0 * (d_kv * dq + p_pairs) * mx.index_n_heads * mx.index_head_dim
            idx_bytes = (d_kv + p_kv) * (mx.index_head_dim + 4)
            dk, pp = min(dk, D * mx.index_topk), min(pp, p_tokens * mx.index_topk)
            pk = min(pk, p_tokens * mx.index_topk)
            dm = min(dm, mx.index_topk)
        if D:
            t += self._absorb_s(mx, cal, heads, D * dq, bw)   # (D * dq: the decode query tokens)
            t += kernels.mla_decode_s(cal.mla_decode, reqs=D, sum_kv=dk, heads=heads * dq, kv_lora_rank=lat,
                                      rope_dim=rope, kv_bytes=d.kv_bytes_per_elem, peak_flops=peak, bw_Bps=bw,
                                      rate_rows=decode_rate_rows(D, dk, dm))
        if p_tokens and mx.index_topk and d.engine.dsa_prefill == "sparse_padded" \
                and p_kv > p_reqs * mx.index_topk:
            t += self._absorb_s(mx, cal, heads, p_tokens, bw)
            step = 128 if d.gpu.arch == "blackwell" else 64
            padded = -(-heads // step) * step
            t += pp * padded * 2.0 * (lat + rope + lat) / (FLASHMLA_SPARSE_PREFILL_EFF * peak)
        elif p_tokens:
            proj, proj_peak, kv_b_bytes = self._mla_proj(mx, cal)
            t += proj.time_s(2.0 * pk * lat * heads * (nope + v),
                             kv_b_bytes + pk * (lat + heads * (nope + v)) * ACT_BYTES, pk, proj_peak, bw)
            t += kernels.mla_prefill_s(cal.mla_prefill, tokens=p_tokens, sum_kv=pk, pairs=pp, heads=heads,
                                       qk_dim=nope + rope, v_dim=v, peak_flops=peak, bw_Bps=bw)
        if idx_flops:
            t += cal.attn_decode.time_s(idx_flops, idx_bytes, D * dq + p_tokens, d.gpu.flops_for("fp8"), bw)
        return t

    def _absorb_s(self, mx: MixerSpec, cal: Calibration, heads: int, tokens: int, bw: float) -> float:
        """Absorbed MLA's W_UK / W_UV for ``tokens`` query tokens: batched GEMMs of nope x latent and latent x
        v per head per token, the kv_b weights streamed (memoised: they do not depend on the context, which
        every decode step changes)."""
        key = (id(cal), id(mx), heads, tokens)  # (both held by this model: the ids stay theirs)
        hit = self._mla_proj_cache.get(key)
        if hit is not None:
            return hit
        lat, nope, v = mx.kv_lora_rank, mx.qk_nope_head_dim, mx.vdim
        proj, proj_peak, kv_b_bytes = self._mla_proj(mx, cal)
        t = proj.time_s(tokens * heads * 2.0 * (nope * lat + lat * v),
                        kv_b_bytes + tokens * heads * (nope + lat + lat + v) * ACT_BYTES, tokens, proj_peak, bw)
        if len(self._mla_proj_cache) >= CACHE_LIMIT:
            self._mla_proj_cache.clear()
        self._mla_proj_cache[key] = t
        return t

    def _mla_proj(self, mx: MixerSpec, cal: Calibration) -> tuple[Roofline, float, float]:
        """The GEMM curve, its peak rate and the kv_b weight bytes of MLA's projections."""
        d = self.dep
        quant = d.model.quantised("attention_in")
        fmt = d.linear_curve_dtype(quant)
        weights = d.mla_kv_b_elems(mx) * d.linear_bytes_per_elem(quant)
        return cal.gemm_for(fmt), d.gpu.flops_for(COMPUTE_DTYPE[fmt]), weights

    def _csa_s(self, mx: MixerSpec, heads: int, D: int, d_kv: int, p_tokens: int, p_reqs: int, p_kv: int,
               p_pairs: int, cal: Calibration, dq: int = 1, d_max: int = -1) -> float:
        """DeepSeek-V4 attention (vLLM deepseek_v4_attention.py on FlashMLA's sparse kernels): each query
        attends its window of raw keys and the compressed entries of its layer (ratio 4: the index_topk an
        FP8 indexer picks after scoring every visible entry; larger ratios: all of them), one shared
        head_dim-wide vector per key used as key and value. Decode reads the FP8 cache in place (entry bytes
        per key: Deployment.csa_entry_bytes); prefill gathers its keys into a BF16 workspace first. FlashMLA's
        sparse kernels run 64 or 128 query heads, so a rank's heads are padded up to that (vLLM
        ``padded_heads``): under TP the core does the work of 64 heads whatever the rank holds."""
        d = self.dep
        w, r = mx.window, mx.compress_ratio
        kernel_heads = 64 if heads <= 64 else 128
        dk: float = min(d_kv, D * w)
        pk: float = min(p_kv, p_reqs * w + p_tokens)
        pp: float = min(p_pairs, p_tokens * w)
        dm: float = min(d_max, w)      # the longest request's keys (used only where d_max is known)
        idx_flops, idx_bytes = 0.0, 0.0
        if r:
            ck, cpk, cp, cm = d_kv / r, p_kv / r, p_pairs / r, d_max / r     # compressed entries visible
            if mx.index_topk:
                idx_flops = 2.0 * (ck * dq + cp) * mx.index_n_heads * mx.index_head_dim
                idx_bytes = (ck + cpk) * (mx.index_head_dim + 4)
                top = mx.index_topk
                ck, cp, cpk, cm = min(ck, D * top), min(cp, p_tokens * top), min(cpk, p_tokens * top), min(cm, top)
            dk, pk, pp, dm = dk + ck, pk + cpk, pp + cp, dm + cm
        peak, bw = self._peak_bf16, self._hbm_Bps
        t = kernels.mqa_decode_s(cal.mla_decode, reqs=D, sum_kv=dk, heads=kernel_heads * dq, qk_dim=mx.head_dim,
                                 v_dim=mx.head_dim, key_bytes=d.csa_entry_bytes(mx), peak_flops=peak, bw_Bps=bw,
                                 rate_rows=decode_rate_rows(D, int(dk), int(dm) if d_max > 0 else d_max))
        t += kernels.mqa_prefill_s(cal.mla_prefill, tokens=p_tokens, sum_kv=pk, pairs=pp, heads=kernel_heads,
                                   qk_dim=mx.head_dim, v_dim=mx.head_dim, key_bytes=mx.head_dim * ACT_BYTES,
                                   peak_flops=peak, bw_Bps=bw)
        if idx_flops:
            t += cal.attn_decode.time_s(idx_flops, idx_bytes, D * dq + p_tokens, d.gpu.flops_for("fp8"), bw)
        return t

    def max_kv_bound(self, graph: bool, n: int, sum_kv: int) -> int:
        """CostModel.decode_max_kv_bound for a pure-decode batch of ``n`` requests over ``sum_kv`` keys whose
        decode attention replays a graph or not (``graph``)."""
        layers = self._rate_bounds.get(graph)
        if layers is None:
            layers = self._rate_bounds[graph] = self._rate_terms(graph)
        if not layers:
            return -1 if layers is None else sum_kv
        rate = 0.0  # the lowest rate (requests) at which every layer is memory-bound
        for per_token, m_tile, per_kv, per_req, bytes_half, mem_Bps, m_half in layers:
            # The layer's kernel, as kernels.gqa_decode_s prices it: compute per_token x sum_kv (x the row tiles'
            # padding) at an unbounded rate, memory (sum_kv x per_kv + n x per_req + bytes_half) / mem_Bps.
            compute = per_token * sum_kv * (-(-n // m_tile) * m_tile / n if m_tile > 1 else 1.0)
            memory = (sum_kv * per_kv + n * per_req + bytes_half) / mem_Bps
            if compute >= memory:
                return -1
            rate = max(rate, compute * m_half / (memory - compute) * (1.0 + 1e-9))
        if rate <= 0.0:
            return sum_kv
        return int(sum_kv / rate)

    def _rate_terms(self, graph: bool) -> RateTerms | None:
        """Per attention layer kind whose decode rate depends on the requests it is read at: the constants
        :meth:`max_kv_bound` needs (compute seconds per cached token at an unbounded rate, the curve's
        row tile, bytes per cached token and per request, the curve's bytes_half, achievable
        bytes/s at large sizes, m_half); () when no layer's rate depends on it, None when some layer is not
        plain GQA (no bound is known)."""
        cal = self.gcal if graph else self.ecal
        kvb, peak, bw = self._kv_bytes, self._peak_bf16, self._hbm_Bps
        out = []
        for _count, mx, heads, kvh in self.groups:
            if mx.kind != "gqa" or mx.window:
                return None
            roof = cal.gqa_decode(kvb)
            if not roof.m_half:
                continue  # its rate does not depend on the requests it is read at
            width = mx.head_dim + mx.vdim
            per_token = kernels.decode_attention_work(1.0, heads, kvh, width, kvb) / (peak * roof.compute_eff)
            if per_token <= 0.0:
                continue
            out.append((per_token, roof.m_tile, kvh * width * kvb,
                        heads * width * kernels.ACT_BYTES + kvh * width * kvb, roof.bytes_half,
                        bw * roof.mem_eff, roof.m_half))
        return tuple(out)
