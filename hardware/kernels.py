"""Single-kernel time predictors shared by the step-cost ledger, the calibration fit and the kernel report.

Each takes a Roofline / Collective (the frozen constants) and spec numbers, never a measured latency.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence, TypeVar

import numpy as np

from hardware.calibration import Collective, Roofline
from hardware.dtypes import quantised_kv

ACT_BYTES = 2
_Num = TypeVar("_Num", float, np.ndarray)


def gemm_s(roof: Roofline, m: float, n: int, k: int, w_bytes_per_elem: float, peak_flops: float,
           bw_Bps: float) -> float:
    """(m x k) @ (k x n): 2mnk FLOPs; weights n*k plus BF16 activations in and out."""
    if m <= 0:
        return 0.0
    return roof.time_s(2.0 * m * n * k, n * k * w_bytes_per_elem + m * (n + k) * ACT_BYTES, m, peak_flops,
                       bw_Bps, roof.width_factor(n, k), n=n)


def decode_attention_work(sum_kv: float, heads: float, kv_heads: float, width: float,
                          kv_bytes: float) -> float:
    """The compute side of GQA decode attention (``width`` = K + V head dims): 2 x heads x width FLOPs per
    cached token over a BF16 cache; over a quantised one, 2 operations per cached K / V element. The opdb
    decode tables show why: with an FP8 cache the latency follows the KV heads, not the query heads (vLLM
    0.24, 32 requests x 8k tokens, 4 KV heads: 0.112 ms at 8 and at 64 query heads), and an H200 is barely
    faster than an H100 (0.100 ms: 56 % of its HBM bandwidth against the H100's 72 %, where a BF16 cache
    reaches 83 / 87 %), so the dequantising loop, not the memory, sets the time."""
    if quantised_kv(kv_bytes):
        return 2.0 * sum_kv * kv_heads * width
    return 2.0 * heads * width * sum_kv


def gqa_decode_s(roof: Roofline, *, reqs: int, sum_kv: float, heads: int, kv_heads: int, head_dim: int,
                 v_head_dim: int, kv_bytes: float, peak_flops: float, bw_Bps: float,
                 rate_rows: float | None = None) -> float:
    """One query per request over sum_kv cached keys: read K and V once, write the new token's K and V.

    The compute side is the attention FLOPs over a BF16 cache; over a quantised cache (``kv_bytes`` < 2) it
    is the dequantisation, two operations (convert, scale) per cached K / V element, which the kernels do on
    the CUDA cores in their inner loop (decode_attention_work). ``rate_rows``: the requests the rate is read
    at when their contexts differ (BatchShape.decode_rows; default ``reqs``, as the curves were fitted on
    batches of equal contexts)."""
    if reqs <= 0:
        return 0.0
    tok_kv = kv_heads * (head_dim + v_head_dim) * kv_bytes
    qo = heads * (head_dim + v_head_dim) * ACT_BYTES
    flops = decode_attention_work(sum_kv, heads, kv_heads, head_dim + v_head_dim, kv_bytes)
    return roof.time_s(flops, sum_kv * tok_kv + reqs * (qo + tok_kv), reqs, peak_flops, bw_Bps,
                       rate_rows=rate_rows)


def prefill_rows(tokens: int, pairs: float) -> float:
    """The row count a prefill attention kernel's rate is read at: its query tokens, or the length of a
    fresh prompt scoring as many (query, key) pairs, sqrt(2 pairs), when that is more. The curves are fitted
    on fresh prompts (tokens = batch x length, pairs = batch x length x (length + 1) / 2), where the first
    is never below the second by more than half a token; a short chunk on a long context (an agent's turn
    appended to its history) has few queries but the work of a long prompt, and read at its query count it
    was priced many times its compute and memory bound, and cheaper once a request was added (a 64-token
    chunk on 50,000 tokens of context, Llama-3.1-8B on H100: 53 ms of attention)."""
    return max(float(tokens), math.sqrt(2.0 * pairs))


def gqa_prefill_s(roof: Roofline, *, tokens: int, sum_kv: float, pairs: float, heads: int, kv_heads: int,
                  head_dim: int, v_head_dim: int, kv_bytes: float, peak_flops: float, bw_Bps: float) -> float:
    """Causal prefill of `tokens` queries scoring `pairs` (query, key) pairs over sum_kv context keys."""
    if tokens <= 0:
        return 0.0
    tok_kv = kv_heads * (head_dim + v_head_dim) * kv_bytes
    qo = heads * (head_dim + v_head_dim) * ACT_BYTES
    flops = 2.0 * heads * (head_dim + v_head_dim) * pairs
    return roof.time_s(flops, sum_kv * tok_kv + tokens * (qo + tok_kv), tokens, peak_flops, bw_Bps,
                       rate_rows=prefill_rows(tokens, pairs))


def experts_touched(tokens: float, topk: int, num_experts: int, local_experts: float) -> float:
    """Expected distinct local experts hit by `tokens` tokens under uniform top-k routing."""
    return local_experts * (1.0 - (1.0 - topk / num_experts) ** tokens)


_EXACT_TRIALS = 2048
"""Largest binomial whose expected maximum is summed exactly; above it the normal approximation is used."""


@functools.lru_cache(maxsize=4096)
def expected_max_binomial(trials: int, p: float, ranks: int) -> float:
    """E[max of ``ranks`` independent Binomial(trials, p)]: the busiest of ``ranks`` GPUs that each draw
    the same binomial load. Summed exactly as sum over x of 1 - F(x)^ranks up to ``_EXACT_TRIALS`` trials,
    above that mean + sd x E[max of ``ranks`` standard normals] (the binomial is then near normal)."""
    if ranks <= 1 or trials <= 0 or p <= 0.0:
        return trials * max(p, 0.0)
    if p >= 1.0:
        return float(trials)
    if trials > _EXACT_TRIALS:
        return trials * p + math.sqrt(trials * p * (1.0 - p)) * _expected_max_std_normal(ranks)
    log_p, log_q = math.log(p), math.log1p(-p)
    base = math.lgamma(trials + 1)
    cdf, total = 0.0, 0.0
    for x in range(trials):
        cdf += math.exp(base - math.lgamma(x + 1) - math.lgamma(trials - x + 1) + x * log_p + (trials - x) * log_q)
        total += 1.0 - min(cdf, 1.0) ** ranks
    return total


@functools.lru_cache(maxsize=64)
def _expected_max_std_normal(n: int) -> float:
    """E[max of n independent standard normals] (trapezoid rule on x n phi(x) Phi(x)^(n-1) over [-8, 8])."""
    steps = 4000
    h = 16.0 / steps
    total = 0.0
    for i in range(steps + 1):
        x = -8.0 + i * h
        w = 0.5 if i in (0, steps) else 1.0
        phi = math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        cdf = 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
        total += w * x * n * phi * cdf ** (n - 1)
    return total * h


def experts_touched_busiest(tokens: float, topk: int, num_experts: int, ep: int) -> float:
    """Distinct local experts on the busiest of ``ep`` expert-parallel ranks under uniform top-k routing:
    each rank's count is Binomial(local experts, P(an expert is hit)), and the layer waits for the maximum."""
    local = -(-num_experts // ep)
    return expected_max_binomial(local, 1.0 - (1.0 - topk / num_experts) ** tokens, ep)


@functools.lru_cache(maxsize=65536)
def balanced_local_load(tokens: int, topk: int, num_experts: int, ep: int) -> tuple[float, float]:
    """Distinct experts and (token, expert) pairs on rank 0 of ``ep`` when the tokens are routed as the
    opdb MoE tables' 'balanced' rows were (aiconfigurator collector/helper.py balanced_logits): with stride
    s = ceil(E / k), token t picks experts t + j s (mod E) once T >= s, which touches every expert, and
    floor(t s / T + j s) (mod E) below that, T x k distinct experts spread evenly. Rank 0 holds experts
    [0, ceil(E / ep)). So the tables touch min(T k, E) experts in all where uniform routing touches
    E (1 - (1 - k / E)^T): at T = s 1.55 times as many (16 tokens, top-8 of 128)."""
    local = -(-num_experts // ep)
    stride = -(-num_experts // topk)
    if tokens <= 0:
        return 0.0, 0.0
    if tokens >= stride:
        return float(local), tokens * topk * local / num_experts
    ids = [int((t * stride / tokens + j * stride) % num_experts) for t in range(tokens) for j in range(topk)]
    mine = [e for e in ids if e < local]
    return float(len(set(mine))), float(len(mine))


def pairs_busiest(tokens: float, topk: int, ep: int) -> float:
    """(token, expert) pairs on the busiest of ``ep`` expert-parallel ranks: each of the tokens x topk
    pairs lands on a given rank with probability 1 / ep."""
    return expected_max_binomial(round(tokens * topk), 1.0 / ep, ep)


ROUTINGS = ("uniform", "busiest", "balanced", "power_law", "power_law_busiest")
"""How a MoE layer's tokens reach its experts (``routed_load``): uniform random top-k on the mean rank; the
same on the busiest expert-parallel rank; the kernel tables' even spread (``balanced_local_load``); or
aiconfigurator's power-law loads on the mean rank or the busiest one (``power_law_load``)."""
BUSIEST_RANK: dict[str, str] = {"uniform": "busiest", "power_law": "power_law_busiest"}
"""A serving routing's busiest-rank counterpart (its own name prices the mean rank)."""
SERVING_ROUTINGS = tuple(BUSIEST_RANK)
"""How a serving deployment's router spreads tokens over experts (Deployment.moe_routing): ``uniform``,
independent top-k draws; ``power_law``, aiconfigurator's model of a skewed router (power_law_load)."""
POWER_LAW_ALPHA = 1.01
POWER_LAW_SAMPLES = 64


@functools.lru_cache(maxsize=1 << 16)
def power_law_load(tokens: int, topk: int, num_experts: int, ep: int) -> tuple[float, float, float, float]:
    """Distinct experts and (token, expert) pairs of the mean expert-parallel rank and of the busiest one
    when T tokens are routed as aiconfigurator models a real router: the per-expert token counts its
    collector draws for its power-law tables (collector/helper.py _generate_power_law_distribution), alpha
    1.01, the distribution its SDK prices MoE layers with by default (aic-core sdk/config.py
    workload_distribution "power_law", sdk/models/deepseek.py alpha 1.01).

    One draw: E values from a power law on [1, 0.8 T] (on [0.01, 2] when T k <= E) by inverse CDF, scaled to
    T k and rounded, each clamped to T; the clamped excess and then the rounding remainder are handed out one
    at a time, rank after rank, each rank to its emptiest valid expert (a deficit is taken from its fullest).
    Handing out d units that way fills d of a rank's empty experts first, and taking d units away empties an
    expert only once every count is down to 1, so the counts of touched experts follow without the loop.
    Returns (mean-rank experts, mean-rank pairs, busiest-rank experts, busiest-rank pairs), averaged over
    POWER_LAW_SAMPLES draws; the busiest rank of a draw is the one with the most pairs (it can touch fewer
    experts than the mean rank: the ledger's ep_imbalance is clamped at zero). The draws' uniform variates
    are seeded by (top-k, experts, EP) alone, the same for every token count (common random numbers), so
    the load moves smoothly with the tokens instead of jumping between independent samples (5 % between
    2,948 and 2,949 tokens); deterministic."""
    if tokens <= 0:
        return 0.0, 0.0, 0.0, 0.0
    if num_experts % ep:
        raise ValueError(f"expert parallelism {ep} does not divide {num_experts} experts")
    local = num_experts // ep
    a = POWER_LAW_ALPHA
    lo, hi = (1.0, tokens * 0.8) if tokens * topk > num_experts else (0.01, 2.0)
    rng = np.random.default_rng((topk, num_experts, ep))
    u = rng.random((POWER_LAW_SAMPLES, num_experts))
    x = ((hi ** (1 - a) - lo ** (1 - a)) * u + lo ** (1 - a)) ** (1 / (1 - a))
    target = tokens * topk
    counts = np.round(x / x.sum(axis=1, keepdims=True) * target).astype(np.int64)
    overflow = np.clip(counts - tokens, 0, None).sum(axis=1)
    counts = np.minimum(counts, tokens).reshape(POWER_LAW_SAMPLES, ep, local)
    touched = (counts > 0).sum(axis=2)
    pairs = counts.sum(axis=2)
    ranks = np.arange(ep)

    def share(units: np.ndarray) -> np.ndarray:   # round robin from rank 0: units per rank, per draw
        return units[:, None] // ep + (ranks[None, :] < (units[:, None] % ep))

    give = share(overflow)
    delta = target - (pairs.sum(axis=1) + overflow)
    give = give + share(np.clip(delta, 0, None))
    take = share(np.clip(-delta, 0, None))
    touched = touched + np.minimum(give, local - touched)
    touched = touched - np.clip(take - (pairs + give - touched), 0, None)
    pairs = pairs + give - take
    busiest = np.argmax(pairs, axis=1)
    rows = np.arange(POWER_LAW_SAMPLES)
    return (float(touched.mean()), float(pairs.mean()), float(touched[rows, busiest].mean()),
            float(pairs[rows, busiest].mean()))


def routed_load(tokens: float, topk: int, num_experts: int, ep: int, routing: str) -> tuple[float, float]:
    """Distinct experts and (token, expert) pairs one GPU's routed experts handle, by ``routing``
    (ROUTINGS): "uniform", the mean rank under random top-k routing, E / ep (1 - (1 - k/E)^T) experts and
    T k / ep pairs; "busiest", the expert-parallel rank with the most of both under it (what a serving step
    waits for); "balanced", rank 0 of a kernel table's evenly routed tokens; "power_law" and
    "power_law_busiest", the mean and the busiest rank under aiconfigurator's power-law loads."""
    if routing == "balanced":
        return balanced_local_load(round(tokens), topk, num_experts, ep)
    if routing in ("power_law", "power_law_busiest"):
        mean_e, mean_p, top_e, top_p = power_law_load(int(round(tokens)), topk, num_experts, ep)
        return (top_e, top_p) if routing == "power_law_busiest" else (mean_e, mean_p)
    if routing == "busiest" and ep > 1:
        return experts_touched_busiest(tokens, topk, num_experts, ep), pairs_busiest(tokens, topk, ep)
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, not {routing!r}")
    return experts_touched(tokens, topk, num_experts, -(-num_experts // ep)), tokens * topk / ep


def token_pass_s(tokens: _Num, topk: _Num, width: _Num, bw_Bps: _Num) -> _Num:
    """One pass over the routed copies of a MoE call's tokens (tokens x top-k x hidden x activation bytes) at
    HBM bandwidth ``bw_Bps``: what Roofline.token_passes counts (scalars here, per-row arrays in
    hardware.table_features)."""
    return tokens * topk * width * ACT_BYTES / bw_Bps


def moe_s(roof: Roofline, *, tokens: float, width: int, inter: int, topk: int, num_experts: int, ep: int,
          mats: int, w_bytes_per_elem: float, peak_flops: float, bw_Bps: float, routing: str = "uniform") -> float:
    """Routed-expert grouped GEMMs on one GPU: its (token, expert) pairs, its distinct experts' weights
    streamed once (``routed_load`` by ``routing``); `inter` is one expert's width on this GPU (after moe_tp).

    The compute rate falls with narrow experts as a GEMM's does with narrow shapes (Roofline.width_factor,
    n = inter, k = width): an expert sharded over moe_tp GPUs gives each few output tiles per row block
    (up-projection) and a short inner loop (down-projection); on the opdb tables the curve without these
    terms priced experts of <= 384 columns per GPU at >= 2k tokens 20-65 % too fast, and wide ones too slow.
    A curve with ``expert_s_per_byte`` adds one expert's weight bytes at that rate to the call, one with
    ``token_s`` that time per token entering it, one with ``token_passes`` that many passes over the routed
    copies of the call's tokens at HBM bandwidth (Roofline)."""
    if tokens <= 0:
        return 0.0
    touched, pairs = routed_load(tokens, topk, num_experts, ep, routing)
    flops = 2.0 * pairs * mats * width * inter
    nbytes = touched * mats * width * inter * w_bytes_per_elem + pairs * (2 * width + mats * inter) * ACT_BYTES
    t = roof.time_s(flops, nbytes, pairs / touched if touched > 0 else 0.0, peak_flops, bw_Bps,
                    roof.width_factor(inter, width))
    if roof.expert_s_per_byte:
        t += roof.expert_s_per_byte * (mats * width * inter * w_bytes_per_elem)
    return t + roof.token_s * tokens + roof.token_passes * token_pass_s(tokens, topk, width, bw_Bps)


DEEPGEMM_M_ALIGN = 128
"""Rows per expert segment in DeepGEMM's contiguous grouped layout on SM90 (deep_gemm
get_m_alignment_for_contiguous_layout(), which vLLM's DeepGemmExperts aligns each expert's rows to)."""


def deepgemm_moe_s(roof: Roofline, *, tokens: float, width: int, inter: int, topk: int, num_experts: int,
                   ep: int, mats: int, w_bytes_per_elem: float, peak_flops: float, bw_Bps: float,
                   routing: str = "uniform") -> float:
    """Routed experts as vLLM's DeepGemmExperts runs them: two m-grouped contiguous FP8 GEMMs over
    M_sum = round_up(tokens x topk + local_experts x (align - 1), align) rows, the worst case vLLM sizes the
    layout to when the per-expert counts are not on the CPU (deep_gemm_utils.compute_aligned_M). The
    kernel walks every 128-row block of M_sum (padding blocks skip the MMAs but still run the K loop), so
    its time does not follow the batch: priced as a dense GEMM of M_sum rows with the block-FP8 GEMM curve
    `roof` (fitted on DeepGEMM / CUTLASS rows at m >= 512), weights of the touched experts read once. An
    approximation both ways: a compute-bound step whose M_sum is mostly padding (prefill under EP, where the
    other ranks' pairs are padding too) is over-priced, and the walk over padding blocks is priced by FLOPs,
    not by its own (unmeasured) rate. ``routing`` "busiest": the weights of the busiest expert-parallel rank's
    touched experts (the layout is sized the same on every rank); "balanced": a kernel table's even spread."""
    if tokens <= 0:
        return 0.0
    local = -(-num_experts // ep)
    align = DEEPGEMM_M_ALIGN
    m_sum = -(-(tokens * topk + local * (align - 1)) // align) * align
    touched = routed_load(tokens, topk, num_experts, ep, routing)[0]
    total = 0.0
    for n, k in (((mats - 1) * inter, width), (width, inter)):
        flops = 2.0 * m_sum * n * k
        nbytes = touched * n * k * w_bytes_per_elem + m_sum * (n + k) * ACT_BYTES
        total += roof.time_s(flops, nbytes, m_sum, peak_flops, bw_Bps, roof.width_factor(n, k))
    return total


# NCCL's own latency model for an all-reduce whose ranks span nodes (NVIDIA/nccl src/graph/tuning.cc,
# ncclTopoTuneModel, as of NCCL 2.18-2.21): a base latency per algorithm and protocol, plus a latency per hop
# inside a node (NVLink) and across nodes (network). The tables time no collective across nodes, so these are
# NCCL's numbers, not fitted ones. A decode step's all-reduces (tens to hundreds of kB) go by the LL protocol,
# and NCCL runs the algorithm its model prices faster: tree (2 x (hops in a node + log2(nodes) network hops))
# or ring (2 (g - 1) steps, 2 x nodes of them across the network, the others at least the NIC's post overhead).
NCCL_LL_BASE_S = {"tree": 6.8e-6, "ring": 6.6e-6}      # baseLat, Tree / Ring, LL
NCCL_LL_NVLINK_HOP_S = 0.6e-6                           # hwLat[NVLINK], Tree and Ring, LL
NCCL_LL_NET_HOP_S = {"tree": 5.0e-6, "ring": 2.7e-6}    # hwLat[NET], Tree / Ring, LL
NCCL_NET_OVERHEAD_S = 1.0e-6                            # getNetOverhead, x86 Intel host (AMD: 2 us)


def internode_allreduce_alpha_s(gpus: int, per_node: int) -> float:
    """Latency of a small all-reduce over ``gpus`` ranks placed ``per_node`` to a node, by NCCL's model (the
    faster of tree and ring, LL protocol); ``gpus`` must span more than one node."""
    nodes = -(-gpus // per_node)
    if nodes < 2:
        raise ValueError(f"{gpus} GPUs fit one node of {per_node}: no inter-node latency")
    ppn = gpus // nodes
    tree = NCCL_LL_BASE_S["tree"] + 2 * ((ppn - 1) * NCCL_LL_NVLINK_HOP_S
                                         + int(math.log2(nodes)) * NCCL_LL_NET_HOP_S["tree"])
    steps, net_steps = 2 * (gpus - 1), 2 * nodes
    ring = (NCCL_LL_BASE_S["ring"] + (steps - net_steps) * max(NCCL_LL_NVLINK_HOP_S, NCCL_NET_OVERHEAD_S)
            + net_steps * NCCL_LL_NET_HOP_S["ring"])
    return min(tree, ring)


def internode_ring_Bps(gpus: int, per_node: int, scaleup_Bps: float, nic_Bps: float) -> float:
    """The link an all-reduce over ``gpus`` ranks placed ``per_node`` to a node runs at, ``nic_Bps`` being
    one GPU's own NIC (a rail-optimised node: one NIC per GPU). NCCL opens one ring channel per NIC, each
    carrying its share of the message and crossing nodes on its own rail, so the network moves the ranks
    of a node in parallel: ranks-per-node x NIC, unless the NVLink hops inside the node, which every channel
    shares, are slower. 2 x 8 H100 (8 x 400 Gb/s): min(450, 8 x 50) = 400 GB/s of bus bandwidth, the
    400-450 GB/s nccl-tests reach on such pairs (one NIC's 50 GB/s was priced before)."""
    nodes = -(-gpus // per_node)
    if nodes < 2:
        raise ValueError(f"{gpus} GPUs fit one node of {per_node}: no network in the ring")
    return min(scaleup_Bps, gpus // nodes * nic_Bps)


def allreduce_s(coll: Collective, *, nbytes: float, gpus: int, link_Bps: float, eager: bool = False,
                scale_up: bool = True, per_node: int | None = None) -> float:
    """All-reduce, alpha-beta: alpha + 2 (g-1)/g x bytes / (link x efficiency), the fastest of the GPU
    count's own lines where fitted (``scale_up``: the group lies inside one NVLink domain). A group that spans
    nodes of ``per_node`` GPUs takes NCCL's latency for its shape (:func:`internode_allreduce_alpha_s`) as its
    alpha, on the pooled efficiency; without ``per_node`` it keeps the pooled alpha."""
    if gpus <= 1:
        return 0.0
    x = 2.0 * (gpus - 1) / gpus * nbytes / link_Bps
    lines = coll.lines(gpus, scale_up)
    if not scale_up and per_node is not None:
        alpha = internode_allreduce_alpha_s(gpus, per_node)
        lines = tuple((alpha, eff) for _, eff in lines)
    t = min(alpha + x / eff for alpha, eff in lines)
    return t + (coll.eager_extra_s if eager else 0.0)


PP_TENSORS = 2
"""Tensors a pipeline stage hands to the next per token: the hidden states and the residual stream (vLLM's
and SGLang's decoder models return both as their intermediate tensors between stages)."""


def pipeline_hops(pp: int, stage_gpus: int, per_node: int) -> tuple[bool, ...]:
    """The pp - 1 stage boundaries of a worker whose stages of ``stage_gpus`` GPUs are placed in order on
    nodes of ``per_node``: for each, whether some rank's peer in the next stage (the rank ``stage_gpus``
    GPUs on) sits on another node, which makes the whole hand-off wait for the network."""
    def crosses(first: int) -> bool:
        return any((first + i) // per_node != (first + i + stage_gpus) // per_node for i in range(stage_gpus))

    return tuple(crosses((s - 1) * stage_gpus) for s in range(1, pp))


def pipeline_sendrecv_s(coll: Collective, *, tokens: int, hidden: int, hops: Sequence[bool],
                        scaleup_Bps: float, nic_Bps: float) -> float:
    """Activations handed down a pipeline in one forward pass: at each stage boundary every rank sends its
    peer in the next stage ``PP_TENSORS`` x tokens x hidden activations, one after another on the critical
    path. Each hop is priced as one step of NCCL's ring in its LL latency model (base + the hop's latency:
    NVLink, or the network across nodes; :data:`NCCL_LL_BASE_S`) plus the bytes on the link at the
    all-reduce's pooled efficiency. Nothing here is fitted: the tables time no send/recv."""
    if tokens <= 0:
        return 0.0
    nbytes = PP_TENSORS * tokens * hidden * ACT_BYTES
    t = 0.0
    for net in hops:
        alpha = NCCL_LL_BASE_S["ring"] + (NCCL_LL_NET_HOP_S["ring"] if net else NCCL_LL_NVLINK_HOP_S)
        t += alpha + nbytes / ((nic_Bps if net else scaleup_Bps) * coll.bw_eff)
    return t


def mqa_decode_s(roof: Roofline, *, reqs: int, sum_kv: float, heads: int, qk_dim: int, v_dim: int,
                 key_bytes: float, peak_flops: float, bw_Bps: float, rate_rows: float | None = None) -> float:
    """Decode attention of `heads` queries per request over one shared KV vector per key (MQA): scores over
    qk_dim, values over v_dim, ``key_bytes`` read per key (``rate_rows`` as for gqa_decode_s)."""
    if reqs <= 0:
        return 0.0
    width = qk_dim + v_dim
    return roof.time_s(sum_kv * heads * 2.0 * width, sum_kv * key_bytes + reqs * heads * width * ACT_BYTES,
                       reqs, peak_flops, bw_Bps, rate_rows=rate_rows)


def mla_decode_s(roof: Roofline, *, reqs: int, sum_kv: float, heads: int, kv_lora_rank: int, rope_dim: int,
                 kv_bytes: float, peak_flops: float, bw_Bps: float, rate_rows: float | None = None) -> float:
    """Absorbed MLA decode kernel: MQA of `heads` queries over the (kv_lora_rank + rope) latent cache, scores
    over latent + rope, values over the latent."""
    return mqa_decode_s(roof, reqs=reqs, sum_kv=sum_kv, heads=heads, qk_dim=kv_lora_rank + rope_dim,
                        v_dim=kv_lora_rank, key_bytes=(kv_lora_rank + rope_dim) * kv_bytes,
                        peak_flops=peak_flops, bw_Bps=bw_Bps, rate_rows=rate_rows)


def mqa_prefill_s(roof: Roofline, *, tokens: int, sum_kv: float, pairs: float, heads: int, qk_dim: int,
                  v_dim: int, key_bytes: float, peak_flops: float, bw_Bps: float) -> float:
    """Prefill attention of `heads` queries per token over one shared KV vector per key (MQA; DeepSeek-V4's
    sparse kernel after the keys are gathered): ``pairs`` (query, key) pairs, each key read once at
    ``key_bytes``, the queries read and the outputs written in BF16."""
    if tokens <= 0:
        return 0.0
    width = qk_dim + v_dim
    return roof.time_s(pairs * heads * 2.0 * width, sum_kv * key_bytes + tokens * heads * width * ACT_BYTES,
                       tokens, peak_flops, bw_Bps, rate_rows=prefill_rows(tokens, pairs))


def mla_prefill_s(roof: Roofline, *, tokens: int, sum_kv: float, pairs: float, heads: int, qk_dim: int,
                  v_dim: int, peak_flops: float, bw_Bps: float) -> float:
    """MLA prefill in MHA form after the kv_b up-projection: per-head K (qk_dim) and V (v_dim) in BF16."""
    if tokens <= 0:
        return 0.0
    width = qk_dim + v_dim
    return roof.time_s(pairs * heads * 2.0 * width, (sum_kv + tokens) * heads * width * ACT_BYTES, tokens,
                       peak_flops, bw_Bps, rate_rows=prefill_rows(tokens, pairs))


def ssm_s(roof: Roofline, *, tokens: int, reqs: int, decode_reqs: int, heads: int, dk: int, dv: int,
          chunk: int, state_bytes: int, peak_flops: float, bw_Bps: float, extra_states: int = 0,
          longest: float = 0.0) -> float:
    """Mamba2 / gated-DeltaNet conv + scan on one GPU: each request's (heads x dk x dv) state read and written
    once, plus ``extra_states`` more whole states moved (a speculative verify's per-position snapshots), 6
    FLOPs per state element per token, a chunked scan for the tokens beyond ``decode_reqs`` (the recurrent
    update's tokens); two kernels (two floors). ``longest``: the prompt tokens of the longest sequence, whose
    chunks the scan takes one after another (Roofline.chunk_s): that many chunks are added to the call
    (Roofline.chunk_adds) or bound it from below."""
    if tokens <= 0:
        return 0.0
    state = heads * dk * dv
    prefill = tokens - decode_reqs
    flops = 6.0 * tokens * state + 2.0 * prefill * chunk * heads * (dk + dv)
    nbytes = (2.0 * reqs + extra_states) * state * state_bytes + tokens * 3 * heads * (dk + dv) * ACT_BYTES
    t = roof.time_s(flops, nbytes, tokens, peak_flops, bw_Bps)
    if longest > 0 and roof.chunk_s > 0.0:
        chain = math.ceil(longest / chunk) * roof.chunk_s
        t = t + chain if roof.chunk_adds else max(t, roof.floor_s + chain)
    return t + roof.floor_s
