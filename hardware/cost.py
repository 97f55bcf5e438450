"""Step-cost ledger: per-op roofline (throughput), host and padding (scheduler), launches (runtime).

CostModel prices one deployment's steps as named terms (hardware.terms). Its layer kinds are planned once
(hardware.layer_plan: layer folding, each distinct (mixer, ffn) kind costed once and multiplied by its
count) and attention is priced by hardware.attention_cost; this module holds the terms' assembly: the
token-dependent terms, CUDA-graph replay and padding, host overlap, speculative drafts, and the memos and
fast decode path that keep a simulation's pricing cheap. All sizes are per GPU. DESIGN section 6 gives the
families and owners.
"""

from __future__ import annotations

import bisect
import functools
import math
from types import MappingProxyType
from typing import Callable, Iterable, Mapping

import attrs

from hardware import kernels
from hardware.attention_cost import CACHE_LIMIT, AttentionCost, AttentionGroups
from hardware.calibration import (BORROWED_MOE_KERNELS, CURVE_MOE_KERNELS, Calibration, borrowed_moe_calibration,
                                  calibration_for)
from hardware.deployment import ACT_BYTES, Deployment, Linear
from hardware.dtypes import COMPUTE_DTYPE
from hardware.engine import FULL_GRAPH_MODES, GRAPH_MODES
from hardware.kernels import BUSIEST_RANK
from hardware.layer_plan import Gemm, LayerGroup, plan_gemm, plan_layer_group
from hardware.layers import FfnSpec, MixerSpec
from hardware.shape import BatchShape
from hardware.terms import (DEVICE_TERMS, HOST_TERMS, MOE_BLOCK_TERMS, OWNER_ENGINE, OWNER_GPU_MODEL, ROUTED_TERMS,
                            TERMS, TOKEN_TERMS, StepCost, check_terms)

__all__ = ["CostModel", "DEVICE_TERMS", "HOST_TERMS", "OWNER_ENGINE", "OWNER_GPU_MODEL", "StepCost", "TERMS",
           "TOKEN_TERMS"]


class CostModel:
    """Maps a BatchShape to a StepCost for one Deployment.

    Caching: the token-dependent terms depend only on (new_tokens, num_reqs, num_decode) and are memoised
    on that key (exact); attention and the host terms are recomputed; step_time_ns is memoised on the exact
    shape. No bucketing approximates anything unless `kv_bucket_tokens` > 0, which rounds the context sums
    up to that many tokens for the attention and traversal terms (opt-in, documented as approximate).
    """

    def __init__(self, dep: Deployment, *, disabled_terms: frozenset[str] = frozenset(),
                 cuda_graph: bool = True, calibration: Calibration | None = None,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 kv_bucket_tokens: int = 0, graph_mode: str | None = None,
                 max_capture_size: int | None = None, capture_sizes: tuple[int, ...] | None = None,
                 moe_calibration: Calibration | None = None) -> None:
        """``moe_calibration``: the constants of the engine that owns a borrowed MoE kernel family
        (BORROWED_MOE_KERNELS), where a caller chose other constants than the architecture's own."""
        self.dep = dep
        self.disabled_terms = check_terms(frozenset(disabled_terms))
        if graph_mode is not None and graph_mode not in GRAPH_MODES:
            raise ValueError(f"unknown CUDA-graph mode {graph_mode!r}; expected one of {', '.join(GRAPH_MODES)}")
        self.graph_mode = "none" if not cuda_graph else (graph_mode or dep.engine.default_graph_mode)
        """What replays a CUDA graph (GRAPH_MODES): ``full_and_piecewise`` (vLLM's default: pure-decode batches
        as one full graph, other steps up to the largest capture size as piecewise graphs with attention
        launched eagerly), ``piecewise`` (vLLM ``cudagraph_mode: PIECEWISE``: attention eager in every step),
        ``full_decode_only`` (SGLang's and TRT-LLM's rule: pure-decode batches only) or ``none`` (eager)."""
        self.cuda_graph = self.graph_mode != "none"
        self.cal = calibration if calibration is not None else calibration_for(dep.engine.name, dep.gpu.arch)
        """The engine's constants for the GPU's architecture (its own set where one is shipped, else Hopper's)."""
        self.gcal = self.cal.graph_mode(dep.engine.graph_kernel_floor_s)
        """The constants as a replayed CUDA graph sees them (per-kernel GPU floors, no eager launch cost)."""
        self.ecal = self.cal.eager_mode(dep.engine.graph_kernel_floor_s)
        """The constants as an eagerly launched step sees them: no op cheaper than replayed in a graph."""
        if dep.model.is_moe and dep.moe_kernel in CURVE_MOE_KERNELS:
            self.cal.moe_for(dep.weight_dtype, dep.moe_kernel)   # a MoE kernel without a fitted curve: fail here
        self._moe_cals: dict[int, Calibration] = {}
        """The constants the routed experts are priced with, by id of the step's constants (graph or eager):
        the deployment's own, or for a kernel family another engine owns (BORROWED_MOE_KERNELS) that engine's
        set for the GPU's architecture, seen the same way."""
        if dep.model.is_moe and dep.moe_kernel in BORROWED_MOE_KERNELS:
            lent = moe_calibration or borrowed_moe_calibration(dep.moe_kernel, dep.gpu.arch)
            floor = dep.engine.graph_kernel_floor_s
            self._moe_cals = {id(self.gcal): lent.graph_mode(floor), id(self.ecal): lent.eager_mode(floor)}
        self.max_num_seqs = max_num_seqs or dep.engine.default_max_num_seqs(dep.gpu)
        self.max_num_batched_tokens = (max_num_batched_tokens
                                       or dep.engine.default_max_num_batched_tokens(dep.gpu))
        self.capture_sizes = dep.engine.cuda_graph_sizes(self.max_num_seqs, self.max_num_batched_tokens,
                                                         gpu=dep.gpu, tp=dep.tp * dep.attn_dp,
                                                         max_size=max_capture_size,
                                                         sizes=capture_sizes)
        self.max_capture = self.capture_sizes[-1]
        self.capture_counts_tokens = dep.engine.capture_rule == "vllm"
        """vLLM's capture sizes count tokens (a speculative decode batch of R requests, q tokens each, replays
        the graph of the next size >= R q); SGLang's and TensorRT-LLM's count requests."""
        self.kv_bucket_tokens = kv_bucket_tokens
        self.spec_tokens = dep.spec_tokens
        self.samples_top_p = dep.sampling != "greedy"
        absent = {name for name, present in (("spec_draft", self.spec_tokens), ("sampler", self.samples_top_p))
                  if not present}
        self._terms_all = tuple(t for t in TERMS if t not in absent)
        """The terms this deployment has (the draft passes only with speculative decoding, the sampler only
        when requests sample with top-k / top-p), in TERMS order."""
        self._device_terms = tuple(t for t in DEVICE_TERMS if t in self._terms_all)
        self._gpu_terms = tuple(t for t in self._device_terms if t != "eager_host")
        """The GPU-side terms an eager step's host work races against (eager_host is what is left of it)."""
        self._enabled = tuple(t for t in self._terms_all if t not in self.disabled_terms)
        self._cache: dict[BatchShape, tuple[Mapping[str, float], int]] = {}
        self._token_cache: dict[tuple[int, int, int, int, int], dict[str, float]] = {}
        self._draft_cache: dict[tuple[int, int, int, bool], float] = {}
        self._draft_fixed: dict[tuple[int, int, int], float] = {}
        """The draft passes' token-dependent part by (tokens, requests, decodes): their layers and LM head
        (_draft_s), the context-free part of every speculative step."""
        self._decode_bases: dict[tuple[int, int], tuple[bool, float, dict[str, float]]] = {}
        self._batch_bases: dict[tuple[int, int, int, int, int], dict[str, float]] = {}
        self._build()

    # --- set-up ---------------------------------------------------------------------------------
    def _link_Bps(self, group_gpus: int) -> float:
        """One GPU's link to the rest of an expert-parallel group (its all-to-all; all-reduces across nodes
        run on every rank's NIC instead, :meth:`_allreduce_s`)."""
        gpu = self.dep.gpu
        return gpu.scaleup_bw_Bps if group_gpus <= gpu.scaleup_domain_gpus else gpu.nic_bw_Bps

    def _gemm(self, lin: Linear, term: str) -> Gemm:
        return plan_gemm(self.dep, lin, term, self.ecal, self.gcal)

    def _build(self) -> None:
        """Plan the model's layer kinds on this deployment (the MTP layer apart), and the per-step counts and
        attention pricing the terms read."""
        d, m = self.dep, self.dep.model
        layer_groups = list(m.layer_groups)
        if d.spec_tokens:  # the MTP module's layer, built like the others (priced apart: spec_draft)
            layer_groups.append((d.draft_layer, 1))
        groups = [plan_layer_group(d, self.cal, self._gemm, mixer, ffn, count) for (mixer, ffn), count in layer_groups]
        self.draft: LayerGroup | None = None
        self._draft_attention: AttentionGroups | None = None
        """The MTP layer's attention as an attention group (AttentionCost.time_s), if it has attention."""
        if d.spec_tokens:
            self._plan_draft(groups.pop())
        self.groups = tuple(groups)
        self.lm_head = self._gemm(Linear("lm_head", -(-m.vocab_size // d.tp), m.hidden_size, False), "lm_head")
        self.kernels_per_step = sum(g.count * g.kernels for g in self.groups) + 2
        self.eager_host_s = self._eager_host_total_s()
        """CPU time of one step run without CUDA graphs: the engine's per-layer host work (Python modules,
        kernel launches), per decoder layer plus extra per MoE layer. With MTP the draft passes run in the
        same forward (TensorRT-LLM's MTPEagleWorker.forward calls ``mtp_layers[0]``, a full decoder layer, once
        per draft inside the model's forward: tensorrt_llm/_torch/speculative/mtp.py), so an eager step also
        launches spec_tokens passes of the MTP layer."""
        self.attn_layers = sum(g.count for g in self.groups if g.mixer is not None and g.mixer.is_attention)
        self.prefill_syncs = any(g.mixer is not None and g.mixer.kind in d.engine.prefill_sync_mixers
                                 for g in self.groups)
        """Whether an eager prompt step's host waits for the GPU in its layers (EngineProfile.
        prefill_sync_mixers): then its MoE layers' host work and expert GPU time follow one another."""
        self.eager_moe_host_s = d.engine.eager_moe_host_s * sum(g.count for g in self.groups if g.is_moe)
        """The MoE layers' share of eager_host_s (the MTP layer's apart)."""
        self._chained_scans = tuple((g.count, self._ssm_kernel(g.mixer)) for g in self.groups
                                    if g.mixer is not None and g.mixer.kind == "gdn") \
            if self.cal.ssm.chunk_s > 0.0 else ()
        """(layers, bound scan kernel) of the gated-DeltaNet groups, whose prompt scans walk each sequence's
        chunks in turn (Roofline.chunk_s; the curve's gdn tables time those kernels, not Mamba2's), where the
        constants price that chain."""
        self.pp_hops = kernels.pipeline_hops(d.pp, d.tp * d.attn_dp, d.gpu.scaleup_domain_gpus)
        """Per stage boundary of a pipeline-parallel worker, whether it crosses a node (the NIC) or not (NVLink)."""
        self.collectives_per_step = (sum(g.count * (g.allreduce_per_layer + g.moe_allreduce + g.norm_allreduce)
                                         for g in self.groups)
                                     + len(self.pp_hops))
        self.a2a_link_Bps = self._link_Bps(d.tp * d.attn_dp) * self.cal.alltoall.bw_eff
        self._attention = AttentionCost(d, self.gcal, self.ecal, tuple(
            (g.count, g.mixer, d.mixer_heads(g.mixer), d.mixer_kv_heads(g.mixer))
            for g in self.groups if g.mixer is not None and g.mixer.is_attention))
        self._routing_mean, self._routing_busiest = d.moe_routing, BUSIEST_RANK[d.moe_routing]

    def _plan_draft(self, g: LayerGroup) -> None:
        """The MTP layer's plan with its [embedding; hidden] projection (both priced under spec_draft), and its
        attention."""
        d = self.dep
        self.draft = attrs.evolve(g, gemms=(*g.gemms, self._gemm(d.draft_proj, "spec_draft")))
        mx = self.draft.mixer
        if mx is not None and mx.is_attention:
            self._draft_attention = ((1, mx, d.mixer_heads(mx), d.mixer_kv_heads(mx)),)

    def _eager_host_total_s(self) -> float:
        """CostModel.eager_host_s: the layers' eager host work, and the MTP layer's for each draft pass."""
        e = self.dep.engine

        def layer_host_s(g: LayerGroup) -> float:
            return e.eager_layer_host_s + (e.eager_moe_host_s if g.is_moe else 0.0)

        return (sum(g.count * layer_host_s(g) for g in self.groups)
                + (self.spec_tokens * layer_host_s(self.draft) if self.draft is not None else 0.0))

    # --- collectives ---------------------------------------------------------------------------
    def _allreduce_s(self, nbytes: float, group: int) -> float:
        """One all-reduce over ``group`` GPUs (tp, or the routed experts' moe_tp, which attention DP can make
        wider): inside the GPU's NVLink domain its count's fitted lines, across nodes NCCL's latency model
        and the ring's rails (every rank's NIC, :func:`~hardware.kernels.internode_ring_Bps`)."""
        gpu = self.dep.gpu
        domain = gpu.scaleup_domain_gpus
        if group <= domain:
            return kernels.allreduce_s(self.cal.allreduce, nbytes=nbytes, gpus=group, link_Bps=gpu.scaleup_bw_Bps)
        return kernels.allreduce_s(self.cal.allreduce, nbytes=nbytes, gpus=group, scale_up=False, per_node=domain,
                                   link_Bps=kernels.internode_ring_Bps(group, domain, gpu.scaleup_bw_Bps,
                                                                       gpu.nic_bw_Bps))

    # --- token-dependent terms --------------------------------------------------------------------
    def _token_terms(self, M: int, R: int, D: int, q: int = 1, G: int = 0) -> dict[str, float]:
        """Terms that depend only on tokens M, requests R and decode requests D of q tokens each, and the
        tokens G of the whole attention-DP group (0: every rank as this one; memoised, exact)."""
        key = (M, R, D, q, G)
        hit = self._token_cache.get(key)
        if hit is not None:
            return hit
        t = dict.fromkeys(TOKEN_TERMS, 0.0)
        if M > 0:
            self._fill_token_terms(t, M, R, D, q, G)
        if len(self._token_cache) >= CACHE_LIMIT:
            self._token_cache.clear()
        self._token_cache[key] = t
        return t

    def _graphed(self, M: int, R: int, D: int) -> bool:
        """Whether a step's GEMM / MoE kernels replay a CUDA graph (attention: :meth:`_attention_graphed`).

        vLLM captures piecewise graphs by token count (mixed batches up to the largest capture size run
        graphed, attention excepted); SGLang and TRT-LLM capture pure-decode batches only.
        """
        mode = self.graph_mode
        if mode == "none":
            return False
        if mode == "full_decode_only":
            return D == R and (M if self.capture_counts_tokens else R) <= self.max_capture
        return M <= self.max_capture

    def _eager_s(self, M: int, R: int, D: int) -> float:
        """The step's eager host time: 0.0 when its GEMM / MoE kernels replay a graph (piecewise graphs
        included), else the layers' eager host cost (``eager_host``)."""
        return 0.0 if self._graphed(M, R, D) else self.eager_host_s

    def _fill_token_terms(self, t: dict[str, float], M: int, R: int, D: int, q: int = 1, G: int = 0) -> None:
        graph = self._graphed(M, R, D)
        cal = self.gcal if graph else self.ecal
        for g in self.groups:
            self._add_layer_terms(t, g, M, R, D, graph, cal, G, q)
        # Logits of every sampled position: one per request, and the k drafts of each speculative decode.
        t["lm_head"] = self.lm_head.time_s(R + D * (q - 1), graph)
        if self.pp_hops:
            gpu = self.dep.gpu
            t["pp_sendrecv"] = kernels.pipeline_sendrecv_s(
                self.cal.allreduce, tokens=M, hidden=self.dep.model.hidden_size, hops=self.pp_hops,
                scaleup_Bps=gpu.scaleup_bw_Bps, nic_Bps=gpu.nic_bw_Bps)

    def _add_layer_terms(self, t: dict[str, float], g: LayerGroup, M: int, R: int, D: int, graph: bool,
                         cal: Calibration, G: int = 0, q: int = 1) -> None:
        """Add the token-dependent terms of the layers of kind ``g`` over M tokens to ``t``. The routed
        experts see the G tokens of the whole attention-DP group (0: attn_dp ranks of M tokens each); each of
        the D decodes carries q tokens (1 + drafts when speculative)."""
        d, h = self.dep, self.dep.model.hidden_size
        group = G or M * d.attn_dp
        ew_Bps = d.gpu.hbm_bw_Bps * cal.elementwise.mem_eff
        msg = M * h * ACT_BYTES
        n = g.count
        for gm in g.gemms:
            t[gm.term] += n * gm.time_s(M, graph)
        t["elementwise"] += n * (M * g.ew_bytes_per_token / ew_Bps + g.ew_kernels * cal.elementwise.floor_s)
        t["tp_allreduce"] += n * g.allreduce_per_layer * self._allreduce_s(msg, d.tp)
        if g.norm_allreduce:    # one FP32 sum of squares for q and one for k per token
            t["tp_allreduce"] += n * self._allreduce_s(M * 2 * 4, d.tp)
        if g.mixer is not None and g.mixer.kind in ("mamba2", "gdn"):
            t["ssm_scan"] += n * self._ssm_s(g.mixer, M, R, D, cal, q)
        if g.ffn is not None and g.ffn.kind == "moe":    # (g.is_moe, spelled out for the type checker)
            mean_rank = self._moe_s(g.ffn, group, cal, self._routing_mean)
            t["moe_experts"] += n * mean_rank
            if d.ep > 1:  # (the rank the layer waits for is never faster than the mean one)
                busiest = self._moe_s(g.ffn, group, cal, self._routing_busiest)
                t["ep_imbalance"] += n * max(0.0, busiest - mean_rank)
            if g.moe_allreduce:
                t["tp_allreduce"] += n * self._allreduce_s(group * h * ACT_BYTES, d.moe_tp)
            if d.attn_dp > 1 and d.ep > 1:
                t["ep_alltoall"] += n * 2 * (cal.alltoall.alpha_s + M * g.ffn.experts_per_token * h
                                             * ACT_BYTES * (d.ep - 1) / d.ep / self.a2a_link_Bps)

    def _moe_s(self, f: FfnSpec, T: int, cal: Calibration, routing: str) -> float:
        """Routed experts: the distinct experts and pairs T tokens (every attention-DP rank's) give the mean
        expert-parallel rank under the deployment's routing (uniform: E(1-(1-k/E)^T) experts; power_law:
        kernels.power_law_load), or the rank the layer waits for (``ep_imbalance`` is the difference).
        With redundant expert slots (Deployment.redundant_experts) the pairs spread over E + R slots, each
        priced as an expert: the balancer's replicas split their experts' load (Deployment.redundant_experts
        says what that leaves out)."""
        d = self.dep
        # The engine's own kernel is its weight-only one where the GPU lacks the format (curve_dtype); a named
        # kernel family is priced on its own curve, fitted in the weight format.
        fmt = d.curve_dtype if d.moe_kernel == "default" else d.weight_dtype
        if d.moe_kernel == "deepgemm":  # DeepGEMM's padded grouped GEMM, on the block-FP8 GEMM curve
            price, roof = kernels.deepgemm_moe_s, cal.gemm_for(fmt)
        elif d.moe_kernel in BORROWED_MOE_KERNELS:  # the owning engine's default curve for the format
            price, roof = kernels.moe_s, self._moe_cals[id(cal)].moe_for(d.curve_dtype)
        else:
            price, roof = kernels.moe_s, cal.moe_for(fmt, d.moe_kernel)
        return price(roof, tokens=T, width=f.latent_size or d.model.hidden_size,
                     inter=-(-f.intermediate_size // d.moe_tp), topk=f.experts_per_token,
                     num_experts=d.expert_slots(f), ep=d.ep, mats=f.mats,
                     w_bytes_per_elem=d.weight_bytes_per_elem,
                     peak_flops=d.gpu.flops_for(COMPUTE_DTYPE[fmt]), bw_Bps=d.gpu.hbm_bw_Bps,
                     routing=routing)

    def _ssm_s(self, mx: MixerSpec, M: int, R: int, D: int, cal: Calibration, q: int = 1) -> float:
        """Mamba2 / GDN conv + scan (hardware.kernels.ssm_s); Mamba2 state is heads x head_dim x state. Where the
        constants hold a decode curve of their own (Calibration.ssm_decode), the decode requests' update kernels
        are priced on it and the prompts' chunked kernels on ``ssm``, as the engines launch them apart.

        A speculative decode (q = 1 + drafts tokens) runs its q tokens through the recurrent update and keeps
        the state after each position, to roll back to the last accepted one: q states written beside the one
        read (vLLM: a state slot per position, spec_state_indices_tensor of GDNAttentionMetadata; SGLang: the
        mamba pool's intermediate_ssm cache, one snapshot per draft token), and SGLang then copies the accepted
        snapshot into the request's state (EngineProfile.verify_states)."""
        price = self._ssm_kernel(mx)
        dq = D * q
        snapshots = D * (q - 1 + (2 if self.dep.engine.verify_states == "snapshots" else 0)) if q > 1 else 0
        if cal.ssm_decode is None or not D:
            return price(cal.ssm, tokens=M, reqs=R, decode_reqs=dq, extra_states=snapshots)
        decode = price(cal.ssm_decode, tokens=dq, reqs=D, decode_reqs=dq, extra_states=snapshots)
        return decode + (price(cal.ssm, tokens=M - dq, reqs=R - D, decode_reqs=0) if M > dq else 0.0)

    def _scan_chain_s(self, s: BatchShape) -> float:
        """What the chunk chain of the step's longest prompt adds to its gated-DeltaNet layers' scans
        (Roofline.chunk_s): the prompts' chunked kernels priced with it, less without it (as the batch terms
        price them, by token and request counts alone). The longest prompt is read off the shape as
        sum q^2 / sum q over the prompts: their token-weighted mean length, which is the length itself where
        the step's prompts (or chunks) are alike and never exceeds the longest."""
        dq = s.num_decode * s.decode_q
        tokens, reqs = s.new_tokens - dq, s.num_reqs - s.num_decode
        longest = (s.sum_q_sq - dq * s.decode_q) / tokens
        roof = (self.gcal if self._graphed(s.new_tokens, s.num_reqs, s.num_decode) else self.ecal).ssm
        extra = 0.0
        for count, kernel in self._chained_scans:
            price = functools.partial(kernel, roof, tokens=tokens, reqs=reqs, decode_reqs=0)
            extra += count * (price(longest=longest) - price())
        return extra

    def _ssm_kernel(self, mx: MixerSpec) -> Callable[..., float]:
        """hardware.kernels.ssm_s with the layer's shape and the GPU's rates bound: what is left to give is
        the curve, the tokens, the requests and the decodes among them."""
        d = self.dep
        return functools.partial(kernels.ssm_s, heads=d.mixer_heads(mx), dk=mx.state_size, dv=mx.head_dim,
                                 chunk=mx.chunk_size, state_bytes=mx.state_bytes,
                                 peak_flops=d.gpu.flops_for("bf16"), bw_Bps=d.gpu.hbm_bw_Bps)

    # --- attention -----------------------------------------------------------------------------
    def _attention_graphed(self, s: BatchShape) -> bool:
        """Whether the step's attention replays a graph: only in a full graph, i.e. a graphed pure-decode
        batch (piecewise graphs leave attention outside)."""
        return s.is_pure_decode and self._decode_attention_graphed(s.num_reqs, s.new_tokens)

    def _decode_attention_graphed(self, R: int, M: int) -> bool:
        """Whether a pure-decode batch of R requests (M tokens) runs its attention inside a full graph."""
        return self.graph_mode in FULL_GRAPH_MODES and self._graphed(M, R, R)

    def _attention_s(self, s: BatchShape, groups: AttentionGroups | None = None) -> float:
        graph = self._attention_graphed(s)
        D = s.num_decode
        d_kv = s.decode_kv
        d_max = s.decode_max_kv
        q = s.decode_q
        if q == 1:
            return self._attention.time_s(graph, D, d_kv, s.new_tokens - D, s.num_reqs - D, s.sum_kv - d_kv,
                                          s.attention_pairs - d_kv, 1, groups, d_max)
        # A speculative decode scores its q tokens against its context (the last q keys causally).
        pairs = q * d_kv - D * q * (q - 1) // 2
        return self._attention.time_s(graph, D, d_kv, s.new_tokens - D * q, s.num_reqs - D, s.sum_kv - d_kv,
                                      s.attention_pairs - pairs, q, groups, d_max)

    # --- speculative decoding -------------------------------------------------------------------
    def _draft_s(self, s: BatchShape) -> float:
        """The MTP draft passes of a step (``spec_draft``): k = spec_tokens passes of the MTP module in a
        chain. The first runs over every token the target model computed in the step (the prompt tokens of
        a prefill, the 1 + k verified positions of each speculative decode: the hidden states the next
        draft starts from), the other k - 1 over one token per request; each pass takes one logit row per
        request from the shared LM head. TensorRT-LLM's MTP Eagle path (blog "DeepSeek R1 MTP
        Implementation and Optimization") and SGLang's EAGLE worker with the NEXTN module run this way.
        Attention runs over the MTP layer's own KV cache, whose context is the request's. A decode batch
        padded for its CUDA graph drafts for the real requests only (the padding is priced on the target)."""
        M, R, D = s.new_tokens, s.num_reqs, s.num_decode
        k = self.spec_tokens
        fixed = self._draft_fixed.get((M, R, D))
        if fixed is None:
            graph = self._graphed(M, R, D)
            fixed = self._draft_tokens_s(M, R, D, graph) + (k - 1) * self._draft_tokens_s(R, R, R, graph)
            fixed += k * self.lm_head.time_s(R, graph)
            if len(self._draft_fixed) >= CACHE_LIMIT:
                self._draft_fixed.clear()
            self._draft_fixed[M, R, D] = fixed
        t = fixed
        one = self._draft_attention
        if one is not None:
            t += self._attention_s(s, one)
            if k > 1:  # the later passes: one query per request over its context
                t += (k - 1) * self._attention.time_s(self._attention_graphed(s), R, s.sum_kv, 0, 0, 0, 0, 1, one)
        return t

    def _draft_tokens_s(self, M: int, R: int, D: int, graph: bool) -> float:
        """One pass of the MTP layer and its projection over M tokens (memoised, exact)."""
        key = (M, R, D, graph)
        hit = self._draft_cache.get(key)
        if hit is None:
            assert self.draft is not None
            t = dict.fromkeys((*TOKEN_TERMS, "spec_draft"), 0.0)
            self._add_layer_terms(t, self.draft, M, R, D, graph, self.gcal if graph else self.ecal)
            if len(self._draft_cache) >= CACHE_LIMIT:
                self._draft_cache.clear()
            hit = self._draft_cache[key] = sum(t.values())
        return hit

    # --- the ledger ----------------------------------------------------------------------------
    def _padded(self, s: BatchShape) -> tuple[int, int] | None:
        """The (tokens, requests) a pure-decode batch replays its graph with, padded up to the next capture
        size (in the engine's unit: CostModel.capture_counts_tokens); None when it is not padded (not graphed,
        not a pure decode, or of a captured size)."""
        if not self.cuda_graph or not s.is_pure_decode or not self._graphed(s.new_tokens, s.num_reqs, s.num_decode):
            return None
        q = s.decode_q
        size = s.new_tokens if self.capture_counts_tokens else s.num_reqs
        padded = self.capture_sizes[bisect.bisect_left(self.capture_sizes, size)]
        if padded == size:
            return None
        if self.capture_counts_tokens:
            return padded, -(-padded // q)
        return padded * q, padded

    def _terms(self, s: BatchShape, G: int = 0) -> dict[str, float]:
        if self.kv_bucket_tokens > 0:
            s = self._bucketed(s)
        if s.new_tokens <= 0:
            return dict.fromkeys(self._enabled, 0.0)
        t = self._batch_base(s, G).copy()
        t["attention"] = attn = self._attention_s(s)
        if self._chained_scans and s.num_reqs > s.num_decode:
            t["ssm_scan"] += self._scan_chain_s(s)
        if self.draft is not None:
            t["spec_draft"] = self._draft_s(s)
        eager = self._eager_s(s.new_tokens, s.num_reqs, s.num_decode)
        self._fill_context_terms(t, s.sum_kv, s.num_reqs, attn, eager, lockstep=G > 0,
                                 syncs=self.prefill_syncs and s.num_reqs > s.num_decode)
        if len(t) == len(self._enabled):  # every term enabled: ``t`` holds them in TERMS order already
            return t
        return {name: t[name] for name in self._enabled}

    def _batch_base(self, s: BatchShape, G: int = 0) -> dict[str, float]:
        """Every term in TERMS order, zero but for those set by the batch's token and request counts and the
        attention-DP group's tokens G (memoised on those counts, which are all they depend on; the caller
        fills in the rest on a copy)."""
        key = (s.new_tokens, s.num_reqs, s.num_decode, s.decode_q, G)
        t = self._batch_bases.get(key)
        if t is None:
            t = dict.fromkeys(self._terms_all, 0.0)
            self._fill_batch_terms(t, s, G)
            if len(self._batch_bases) >= CACHE_LIMIT:
                self._batch_bases.clear()
            self._batch_bases[key] = t
        return t

    def _fill_batch_terms(self, t: dict[str, float], s: BatchShape, G: int = 0) -> None:
        """Terms set by the batch's token and request counts alone (for a pure-decode batch: by its size),
        and by the attention-DP group's tokens G (0: every rank as this one)."""
        M, R, D, q = s.new_tokens, s.num_reqs, s.num_decode, s.decode_q
        e = self.dep.engine
        t.update(self._token_terms(M, R, D, q, G))
        padded = self._padded(s)
        if padded is not None:
            tokens, reqs = padded
            padded_group = G and G - M + tokens
            pad = self._token_terms(tokens, reqs, reqs, q, padded_group)
            total = sum(pad.values())
            if e.graph_padding_one_request and self.dep.model.is_moe and tokens > M + q:
                # the dummies are one request repeated: the experts see one more distinct token's q tokens
                one = self._token_terms(M + q, R + 1, D + 1, q, G and G + q)
                total += sum(one[k] - pad[k] for k in ROUTED_TERMS)
            t["cuda_graph_padding"] = total - sum(self._token_terms(M, R, D, q, G).values())
        if self.samples_top_p:  # every row the lm_head scores is sampled over the whole vocabulary
            t["sampler"] = e.sampler_s_per_vocab * self.dep.model.vocab_size * (R + D * (q - 1))
        t["step_host"] = e.step_host_s
        t["request_host"] = e.per_request_host_s * R + (e.spec_request_host_s * D if q > 1 else 0.0)
        t["kernel_launch"] = self._launch_s(s)
        if not self.cuda_graph:
            t["collective_setup"] = self.collectives_per_step * self.cal.allreduce.eager_extra_s

    def _fill_context_terms(self, t: dict[str, float], sum_kv: int, R: int, attn: float,
                            eager_s: float = 0.0, lockstep: bool = False, syncs: bool = False) -> None:
        """Terms set by the context (KV traversal, attention-DP imbalance), then the eager step's host
        work and the host overlap. ``eager_s``: the step's eager host time (0.0 when graph-replayed).
        ``lockstep``: the step is one rank's in a simulated attention-DP group, whose step waits for its
        slowest rank by simulation (:meth:`price_in_group`), so the imbalance is not estimated here.
        ``syncs``: the step prefills through layers that make the host wait for the GPU
        (:attr:`prefill_syncs`; a pure-decode step takes no such path)."""
        e = self.dep.engine
        t["kv_traversal"] = (e.per_block_host_s * -(-sum_kv // max(1, e.block_size))
                             if self.attn_layers else 0.0)
        if self.dep.attn_dp > 1 and not lockstep:
            t["dp_imbalance"] = attn * min(1.0, math.sqrt(2.0 * math.log(self.dep.attn_dp) / max(R, 1)))
        if eager_s > 0.0:
            self._eager_host(t, eager_s, syncs)
        if e.host_overlap:
            self._overlap_host(t, eager_s)

    def _eager_host(self, t: dict[str, float], eager_s: float, syncs: bool = False) -> None:
        """An eager step: the CPU runs the model's Python and launches its kernels while the GPU works
        through those already queued (no host-device sync in the layers of either engine's MoE path,
        hardware/MODEL.md, "eager_host"), so the step lasts max(host, GPU); eager_host is the exposed part.
        Where its layers make the host wait for the GPU (``syncs``), each MoE layer's host work, done before
        its expert kernels are launched, and those kernels' GPU time follow one another, the next layer's
        wait holding the host until the experts finish: the step lasts max(host, GPU) + min(MoE host, MoE
        GPU) (EngineProfile.prefill_sync_mixers). The host is blocked in those waits, so the scheduling work
        of :meth:`_overlap_host` hides under no more GPU time than without them."""
        gpu = sum(map(t.__getitem__, self._gpu_terms))
        t["eager_host"] = max(0.0, eager_s - gpu)
        if syncs:
            t["eager_host"] += min(self.eager_moe_host_s, sum(t.get(n, 0.0) for n in MOE_BLOCK_TERMS))

    def _overlap_host(self, t: dict[str, float], eager_s: float = 0.0) -> None:
        """Async scheduling: the CPU prepares step n+1 while the GPU runs step n, so a step lasts
        max(GPU work, host work). The host terms keep only their exposed share, max(0, host - GPU), split
        in proportion to their sizes (computed from every term, so switching one off changes no other).
        The CPU of an eager step spends ``eager_s`` of it launching that step, which the scheduling work
        cannot hide under: a step lasts max(GPU, eager host + scheduling host)."""
        get = t.__getitem__
        host = sum(map(get, HOST_TERMS))
        if host <= 0.0:
            return
        device = sum(map(get, self._device_terms))  # in TERMS order, as ``t`` holds them
        if eager_s > 0.0:
            device = max(0.0, sum(map(get, self._gpu_terms)) - eager_s)   # GPU time the CPU is not launching
        keep = max(0.0, host - device) / host
        for name in HOST_TERMS:
            t[name] *= keep

    def _bucketed(self, s: BatchShape) -> BatchShape:
        b = self.kv_bucket_tokens

        def up(x: int) -> int:
            return -(-x // b) * b

        return attrs.evolve(s, sum_kv=up(s.sum_kv), sum_q_kv=max(up(s.sum_q_kv), s.sum_q_sq),
                            decode_sum_kv=up(s.decode_sum_kv) if s.decode_sum_kv >= 0 else -1,
                            decode_max_kv=up(s.decode_max_kv) if s.decode_max_kv >= 0 else -1)

    def _launch_s(self, s: BatchShape) -> float:
        """CPU launch time of kernels not covered by a CUDA graph.

        A step whose attention replays a full graph launches nothing; other graphed steps launch their
        attention eagerly (vLLM's piecewise graphs); without graphs every kernel is launched.
        """
        if self.cuda_graph:
            return 0.0 if self._attention_graphed(s) else self.attn_layers * self.dep.engine.launch_s
        return self.kernels_per_step * self.dep.engine.launch_s

    # --- public --------------------------------------------------------------------------------
    def step_cost(self, shape: BatchShape) -> StepCost:
        """The named-term breakdown of one step."""
        return StepCost(terms=MappingProxyType(self._terms(shape)))

    def price(self, shape: BatchShape) -> tuple[dict[str, float], int]:
        """:meth:`step` without the memo: a fresh term dict (``term_names`` order) and the total in integer
        nanoseconds (>= 1). For callers that memoise prices themselves (twin.core.prices.StepPrices)."""
        return self._priced(self._terms(shape))

    def _priced(self, terms: dict[str, float]) -> tuple[dict[str, float], int]:
        return terms, self._total_ns(terms.values(), terms)

    def price_in_group(self, shape: BatchShape, group_tokens: int) -> tuple[dict[str, float], int]:
        """:meth:`price` for one rank of an attention-DP group run in lockstep, whose ranks compute
        ``group_tokens`` new tokens in the step together (this rank's among them): the routed experts and
        their collectives see those tokens instead of attn_dp x this rank's, and ``dp_imbalance`` is 0
        (the group's step lasts as long as its slowest rank's, which the simulation takes)."""
        if group_tokens < shape.new_tokens:
            raise ValueError(f"price_in_group: the group's {group_tokens} tokens are fewer than the rank's "
                             f"{shape.new_tokens}")
        return self._priced(self._terms(shape, max(1, group_tokens)))

    def step(self, shape: BatchShape) -> tuple[Mapping[str, float], int]:
        """The term breakdown and the total in integer nanoseconds (>= 1), memoised on the exact shape."""
        hit = self._cache.get(shape)
        if hit is not None:
            return hit
        terms, ns = self.price(shape)
        out = (MappingProxyType(terms), ns)
        if len(self._cache) >= CACHE_LIMIT:      # bound memory on long runs with ever-new shapes
            self._cache.clear()
        self._cache[shape] = out
        return out

    def decode_step(self, n: int, sum_kv: int, max_kv: int = -1,
                    group_tokens: int = 0) -> tuple[list[float], int]:
        """A pure-decode step of ``n`` requests attending ``sum_kv`` tokens in all, the longest ``max_kv``
        (-1: unknown, taken as equal): the values of ``term_names`` and the total in ns, the very floats
        ``step`` gives for that batch's shape (with ``group_tokens`` > 0: those :meth:`price_in_group` gives
        for one rank of an attention-DP group computing that many tokens in the step).

        The fast path of decode stretches, whose context grows every step: what depends on ``n`` (and the
        group's tokens) alone is prepared once; only attention and the context terms are computed per call, by
        the same code as ``step``'s, with no shape built and nothing memoised.
        """
        if group_tokens and group_tokens < n:
            raise ValueError(f"decode_step: the group's {group_tokens} tokens are fewer than the rank's {n}")
        base = self._decode_bases.get((n, group_tokens))
        if base is None:
            if self.draft is not None:
                raise ValueError("decode_step prices plain one-token decodes; with speculative decoding a decode "
                                 "verifies 1 + spec_tokens tokens: price its shape with step()")
            base = self._decode_base(n, group_tokens)
        graph, eager, fixed = base
        if self.kv_bucket_tokens > 0:
            b = self.kv_bucket_tokens
            sum_kv = -(-sum_kv // b) * b
            if max_kv >= 0:
                max_kv = -(-max_kv // b) * b
        t = fixed.copy()
        # BatchShape(n, n, n, sum_kv, sum_kv, n, decode_sum_kv=sum_kv, decode_max_kv=max_kv): every request
        # decodes, so no prefill part.
        t["attention"] = attn = self._attention.time_s(graph, n, sum_kv, 0, 0, 0, 0, d_max=max_kv)
        self._fill_context_terms(t, sum_kv, n, attn, eager, lockstep=group_tokens > 0)
        out = [t[name] for name in self._enabled]
        return out, self._total_ns(out, t)

    def decode_max_kv_bound(self, n: int, sum_kv: int) -> int:
        """The longest context ``m`` up to which :meth:`decode_step` (n, sum_kv, m) gives the same floats for
        every m, or -1 when no such range is known.

        The longest context enters a pure-decode step only through the rate the decode attention kernel is
        read at (sum_kv / m requests, BatchShape.decode_rows); a layer whose compute time at that rate stays
        below its memory time costs its memory time whatever the rate. With eff(r) = eff_max r / (r + m_half),
        the compute time A (r + m_half) / r is below the memory time T for r >= A m_half / (T - A), so every m
        up to sum_kv / that rate prices alike (a margin of 1e-9 keeps the floating-point comparison on the same
        side). Only plain GQA layers are bounded this way; any other attention layer (a window, MLA) gives -1,
        and so do layers that are compute-bound at any rate. Lets a decode-price memo drop the longest
        context from its key where it does not matter (twin.core.prices.StepPrices)."""
        if n <= 0 or sum_kv <= 0 or self.kv_bucket_tokens > 0:
            return -1
        base = self._decode_bases.get((n, 0))
        graph = base[0] if base is not None else self._decode_attention_graphed(n, n)
        return self._attention.max_kv_bound(graph, n, sum_kv)

    def _decode_base(self, n: int, G: int = 0) -> tuple[bool, float, dict[str, float]]:
        """Whether a pure-decode batch of ``n`` replays a graph for attention, its eager host time (0.0 when
        its other kernels replay graphs) and its batch terms (in an attention-DP group computing G tokens in
        the step; 0: none), as :meth:`_terms` decides them."""
        s = BatchShape(num_reqs=n, num_decode=n, new_tokens=n, sum_kv=n, sum_q_kv=n, sum_q_sq=n)
        t = dict.fromkeys(self._terms_all, 0.0)
        self._fill_batch_terms(t, s, G)
        graph = self._decode_attention_graphed(n, n)  # as _attention_s decides it for a pure-decode batch
        eager = self._eager_s(n, n, n)
        if len(self._decode_bases) >= CACHE_LIMIT:
            self._decode_bases.clear()
        self._decode_bases[n, G] = (graph, eager, t)
        return graph, eager, t

    def _total_ns(self, values: Iterable[float], terms: Mapping[str, float]) -> int:
        """The step total in integer ns (>= 1). A total that is not finite (a user's spec with finite but
        absurd numbers, 1e-300 FLOP/s: the terms overflow to inf) is a ValueError naming the terms, where
        round() raised a bare OverflowError (inf) or ValueError (NaN) naming nothing."""
        total = sum(values)
        if not math.isfinite(total):
            bad = ", ".join(f"{k}={v!r}" for k, v in terms.items() if not math.isfinite(v))
            raise ValueError(f"step cost is not finite for {self.dep.model.name} on {self.dep.gpu.name} "
                             f"({bad}): check the GPU, model and engine specs for absurd values")
        return max(1, round(total * 1e9))

    def step_time_ns(self, shape: BatchShape) -> int:
        """Total step time in integer nanoseconds (>= 1), memoised on the exact shape."""
        return self.step(shape)[1]

    @staticmethod
    def term_owner(name: str) -> str:
        """'gpu+model' or 'engine' (DESIGN section 6)."""
        check_terms(frozenset([name]))
        return TERMS[name][1]

    @staticmethod
    def term_family(name: str) -> str:
        """'throughput', 'scheduler' or 'runtime' (DESIGN section 6)."""
        check_terms(frozenset([name]))
        return TERMS[name][0]

    @property
    def term_names(self) -> tuple[str, ...]:
        return self._enabled


