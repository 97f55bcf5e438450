"""The configuration of one run: frozen attrs classes, one per YAML section (DESIGN section 8).

Fields left ``None`` take the engine's default for the chosen GPU when the run is built
(:func:`twin.runner.resolve`); the resolved config, with every value filled in, is written with the results.
Pluggable parts (system, router, workload, arrival) are chosen by ``kind`` through :mod:`twin.registry`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar, Sequence

import attrs

from hardware.calibration import MOE_KERNELS
from hardware.deployment import FP32_MATMUL, SAMPLINGS
from hardware.engine import ADMISSION_RESERVES, GRAPH_MODES, KV_TRANSFER_PIECES, PREEMPTION_RULES
from hardware.kernels import SERVING_ROUTINGS
from hardware.model import UNQUANTISED_CLASSES
from twin.config_codec import from_dict, key_lines, parse_override, read_yaml, set_path, to_dict, within
# (the parts' modules import the shared validators and the clock's range from here, beside the sections)
from twin.config_validators import (CLOCK_MAX_S, MAX_POOL_BLOCKS, bytes_gib, fraction, known_name,  # noqa: F401
                                    non_negative, on_clock, one_of, one_tick, pool_blocks, positive, rate_on_clock)
from twin.core.errors import ConfigError
from twin.registry import Pluggable


# ------------------------------------------------------------------------------------ plain sections
def _gpu_name_or_file(inst: Any, attr: attrs.Attribute, value: str) -> None:  # type: ignore[type-arg]
    """A shipped GPU's name, or the path of a GPU YAML file that loads with a shipped spec's checks."""
    from hardware.gpu import is_gpu_file

    if not is_gpu_file(value):
        known_name("gpu", "list_gpus")(inst, attr, value)
        return
    import hardware

    try:
        hardware.load_gpu(value)
    except ValueError as exc:
        raise ValueError(f"{attr.name} {value!r} cannot be loaded: {exc}") from None


def _factor(inst: Any, attr: attrs.Attribute, value: float) -> None:  # type: ignore[type-arg]
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{attr.name} must be a finite factor > 0 (1 keeps the GPU's own value), got {value!r}")


@attrs.frozen(kw_only=True)
class GpuScale:
    """Factors on the GPU's datasheet values, for what-if studies at otherwise equal hardware (1: as shipped).
    They multiply every GPU of the run, a disaggregated pool's own ``gpu`` too, after any value given under
    ``hardware``. Calibrated efficiencies stay as fitted for the GPU's architecture, so a factor moves exactly
    the ledger terms its resource bounds (hardware.gpu.SCALE_KNOBS)."""

    flops: float = attrs.field(default=1.0, validator=_factor)
    """Peak FLOP/s of every compute format (the CUDA cores' fp32 too)."""
    flops_bf16: float = attrs.field(default=1.0, validator=_factor)
    """Peak BF16 FLOP/s (on top of ``flops``)."""
    flops_fp8: float = attrs.field(default=1.0, validator=_factor)
    """Peak FP8 FLOP/s (on top of ``flops``); the GPU must have an FP8 rate of its own."""
    flops_fp4: float = attrs.field(default=1.0, validator=_factor)
    """Peak FP4 FLOP/s (on top of ``flops``); the GPU must have an FP4 rate of its own (Blackwell)."""
    flops_tf32: float = attrs.field(default=1.0, validator=_factor)
    """Peak TF32 tensor-core FLOP/s (on top of ``flops``): a float32 GEMM under engine.float32_matmul high."""
    flops_fp32: float = attrs.field(default=1.0, validator=_factor)
    """Peak FP32 FLOP/s of the CUDA cores (on top of ``flops``): a float32 GEMM under engine.float32_matmul
    highest (MiniMax-M2's router)."""
    hbm_bytes: float = attrs.field(default=1.0, validator=_factor)
    """HBM capacity: with weights and activations unchanged, it moves the KV pool (and the engine rules that
    read the GPU's memory: SGLang's memory fraction, its chunk and batch defaults)."""
    hbm_bw: float = attrs.field(default=1.0, validator=_factor)
    """HBM bandwidth: the memory-bound side of every kernel (weights, KV reads, activations)."""
    scaleup_bw: float = attrs.field(default=1.0, validator=_factor)
    """NVLink (scale-up) bandwidth per GPU per direction: collectives inside the domain, KV transfer over it."""
    host_bw: float = attrs.field(default=1.0, validator=_factor)
    """Host link (PCIe / C2C) per direction: loads of KV demoted to host memory."""
    nic_bw: float = attrs.field(default=1.0, validator=_factor)
    """NIC bandwidth per GPU: KV transfer and collectives between nodes."""

    def factors(self) -> dict[str, float]:
        """The knobs that are not 1."""
        return {f.name: getattr(self, f.name) for f in attrs.fields(GpuScale) if getattr(self, f.name) != 1.0}


def _flops_map(inst: Any, attr: attrs.Attribute, value: dict[str, float] | None) -> None:  # type: ignore[type-arg]
    for dtype, rate in (value or {}).items():
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"{attr.name}.{dtype} must be a finite number > 0 (dense FLOP/s), got {rate!r}")


def _constants(inst: Any, attr: attrs.Attribute, value: str) -> None:  # type: ignore[type-arg]
    from hardware.calibration import calibration_archs

    names = ["auto", "hopper", *calibration_archs()]
    if value in names:
        return
    if not Path(value).is_dir():
        raise ValueError(f"{attr.name} must be one of {names} or a folder of fitted sets (<engine>.yaml), "
                         f"got {value!r}")


@attrs.frozen(kw_only=True)
class HardwareConfig:
    """The GPU: a shipped spec by name (``h100_sxm``) or a GPU YAML file by path, any of its datasheet values
    replaced, and factors on them (``scale``). The resolved config lists every value of the named GPU."""

    gpu: str = attrs.field(default="h100_sxm", validator=_gpu_name_or_file)
    """A shipped GPU (``python -c "import hardware; print(hardware.list_gpus())"``) or the path of a GPU
    YAML file with the fields of hardware/data/gpus/*.yaml (relative: to the working directory, else to the
    config file's folder)."""
    peak_flops: dict[str, float] | None = attrs.field(default=None, validator=_flops_map)
    """Dense FLOP/s by compute format, merged into the named GPU's: the tensor cores' bf16, fp8, fp4 and tf32,
    and the CUDA cores' fp32 (what a float32 matmul runs at under engine.float32_matmul ``highest``)."""
    hbm_bytes: int | None = attrs.field(default=None, validator=positive)
    """HBM capacity in bytes."""
    hbm_bw_Bps: float | None = attrs.field(default=None, validator=positive)
    """HBM bandwidth, bytes/s."""
    scaleup_bw_Bps: float | None = attrs.field(default=None, validator=positive)
    """Scale-up (NVLink) bandwidth per GPU per direction, bytes/s."""
    scaleup_domain_gpus: int | None = attrs.field(default=None, validator=positive)
    """GPUs in one scale-up domain (8 in an HGX node, 72 in an NVL72 rack)."""
    host_bw_Bps: float | None = attrs.field(default=None, validator=positive)
    """Host link per direction, bytes/s."""
    nic_bw_Bps: float | None = attrs.field(default=None, validator=positive)
    """NIC bandwidth per GPU, bytes/s."""
    scale: GpuScale = attrs.Factory(GpuScale)
    """Factors on the GPU's datasheet values for what-if studies (GpuScale; 1: as shipped)."""
    constants: str = attrs.field(default="auto", validator=_constants)
    """The calibrated kernel constants (efficiency curves, floors, collective lines): ``auto``, those fitted
    for the GPU's architecture (``arch``; Hopper's where it has none); an architecture's name (``hopper``,
    ``blackwell``), to price a GPU with another's, as a transfer test does; or a folder of
    ``<engine>.yaml`` sets written by ``python -m hardware.calibrate`` (relative: to the working directory,
    else the config's folder)."""
    disabled_terms: tuple[str, ...] = ()
    """Cost-ledger terms switched off (ablation); names as in ``StepCost.terms``."""

    def values(self) -> dict[str, Any]:
        """The datasheet values this config gives itself (replacing the named GPU's)."""
        from hardware.gpu import SPEC_VALUES

        return {k: getattr(self, k) for k in SPEC_VALUES if getattr(self, k) is not None}

    def spec(self, gpu: str | None = None, *, scaled: bool = True) -> Any:
        """The GPUSpec a worker runs on: ``gpu`` (a pool's own) or ``hardware.gpu``, with this section's values
        (for ``hardware.gpu`` only) and, unless ``scaled`` is False, its factors (for every GPU) applied."""
        import hardware
        from hardware.gpu import derive_gpu

        own = gpu is None or gpu == self.gpu
        base = hardware.load_gpu(self.gpu if gpu is None else gpu)
        return derive_gpu(base, self.values() if own else None, self.scale.factors() if scaled else None)

    def __attrs_post_init__(self) -> None:
        self.spec()   # a factor the GPU cannot take (flops_fp4 on a GPU with no FP4 rate) fails here, naming it


def _unquantised_classes(inst: Any, attr: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    if value is None:
        return
    unknown = [v for v in value if v not in UNQUANTISED_CLASSES]
    if unknown or isinstance(value, str):
        raise ValueError(f"{attr.name} must list classes of {list(UNQUANTISED_CLASSES)}, got {value!r}")


@attrs.frozen(kw_only=True)
class ModelConfig:
    name: str = attrs.field(default="meta-llama/Llama-3.1-8B", validator=known_name("model", "list_models"))
    """The model: a Hugging Face id or alias of a shipped model (``python -c "import hardware;
    print(hardware.list_models())"``)."""
    weight_dtype: str = attrs.field(default="auto", validator=one_of(
        "auto", "bf16", "fp16", "fp8", "fp8_block", "fp4", "int4"))
    """``auto``: the checkpoint's own format (FP8 for an FP8 checkpoint, else BF16)."""
    kv_dtype: str = attrs.field(default="auto", validator=one_of("auto", "bf16", "fp16", "fp8"))
    """Format of the KV cache (vLLM and SGLang ``--kv-cache-dtype``): ``auto`` is the checkpoint's own (FP8
    where its quantization config says so, else BF16)."""
    moe_routing: str = attrs.field(default="power_law", validator=one_of(*SERVING_ROUTINGS))
    """How a MoE model's router spreads tokens over experts: ``power_law`` (aiconfigurator's skewed loads,
    hardware.kernels.power_law_load) or ``uniform`` (independent top-k draws). Ignored for dense models."""
    unquantised: tuple[str, ...] | None = attrs.field(default=None, validator=_unquantised_classes)
    """The classes of linear layers kept in BF16 while the others take ``weight_dtype``: any of
    ``attention_in`` (q / k / v and MLA's q_a / q_b / kv_a / kv_b projections), ``attention_out``, ``indexer``
    (DSA's), ``linear_attention`` (gated DeltaNet / Mamba2 projections), ``shared_experts``, ``dense_mlp``;
    ``[]``: every linear layer quantised. Null: the checkpoint's own (NVIDIA's NVFP4 checkpoints keep those
    their ModelOpt ``exclude_modules`` name; a checkpoint quantising its routed experts alone keeps every
    other)."""


SPEC_METHODS = ("none", "mtp")


@attrs.frozen(kw_only=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM ``--speculative-config``, SGLang ``--speculative-algorithm NEXTN``,
    TensorRT-LLM ``speculative_config``); off by default.

    ``mtp``: the draft is the model's own next-token-prediction module (DeepSeek-V3/R1 ship one,
    num_nextn_predict_layers = 1), run ``num_speculative_tokens`` = k times in a chain. Each decode step of
    a request verifies 1 + k tokens (its last sampled token and k drafts) and emits 1 + a, a being the
    number of leading drafts accepted. ``acceptance``: the conditional probability that draft i is accepted
    given drafts 1 .. i-1 were, one number for every position or a list of k.
    """

    method: str = attrs.field(default="none", validator=one_of(*SPEC_METHODS))
    """``none`` (off) or ``mtp`` (the model's own next-token-prediction module drafts; a model without one is
    an error)."""
    num_speculative_tokens: int = attrs.field(default=0, validator=non_negative)
    """k, the drafts proposed and verified in each decode step of a request (vLLM num_speculative_tokens): 0
    with method ``none``, at least 1 otherwise."""
    acceptance: float | tuple[float, ...] | None = None
    """Probability that a draft is accepted given the drafts before it were: one number for every position, or
    a list of k. Required with a method, left unset with ``none``."""
    overlap: bool | None = None
    """Whether the engine's overlap scheduler (host work of a step hidden under the GPU work of the one
    before) keeps running while it drafts: unset, the engine's rule (``speculative_overlap`` of its profile:
    SGLang's EAGLE worker turns it off unless SGLANG_ENABLE_SPEC_V2 is set); true or false as launched."""

    def __attrs_post_init__(self) -> None:
        k = self.num_speculative_tokens
        if self.method == "none":
            if k or self.acceptance is not None or self.overlap is not None:
                raise ValueError(f"method is 'none': num_speculative_tokens ({k}), acceptance "
                                 f"({self.acceptance!r}) and overlap ({self.overlap!r}) must be left unset")
            return
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1 with method {self.method!r}, got {k}")
        if self.acceptance is None:
            raise ValueError(f"acceptance must be given with method {self.method!r}: one probability in "
                             f"[0, 1] or a list of {k}")
        rates = self.acceptance_rates
        if len(rates) != k:
            raise ValueError(f"acceptance lists {len(rates)} probabilities, expected num_speculative_tokens = {k}")
        bad = [p for p in rates if not 0.0 <= p <= 1.0]
        if bad:
            raise ValueError(f"acceptance probabilities must be in [0, 1], got {bad}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def acceptance_rates(self) -> tuple[float, ...]:
        """Conditional acceptance probability of each draft position (k of them; empty when off)."""
        a = self.acceptance
        if a is None:
            return ()
        return tuple(float(p) for p in a) if isinstance(a, tuple) else (float(a),) * self.num_speculative_tokens


@attrs.frozen(kw_only=True)
class EngineConfig:
    name: str = attrs.field(default="vllm", validator=known_name("engine", "list_engines"))
    """The serving engine whose defaults, scheduling rules and host costs are modelled: ``vllm``, ``sglang``
    or ``trtllm`` (profiles in hardware/data/engines/*.yaml)."""
    version: str | None = None
    """The engine build modelled (SGLang's ``0.5.10.post1``, vLLM's ``0.19.0``): where the profile lists host
    terms fitted on that build (its ``builds``: 0.5.10 covers 0.5.10.post1), they replace the profile's. Null:
    the profile's own (fitted on the build its ``version`` names)."""
    moe_kernel: str = attrs.field(default="default",
                                  validator=one_of(*MOE_KERNELS))
    """Routed-expert kernel family: ``default`` (the engine's own kernel for the weight format), ``marlin``
    (weight-only Marlin: vLLM with VLLM_MXFP4_USE_MARLIN=1, or on GPUs without native FP8 / FP4),
    ``flashinfer`` (FlashInfer's CUTLASS fused MoE, vLLM's FlashInferExperts: the curve fitted on the
    engine's FlashInfer rows of the weight format, e.g. vLLM block-FP8 on Hopper with expert parallelism) or
    ``deepgemm`` (block-FP8 weights: vLLM's DeepGemmExperts, DeepGEMM's contiguous grouped GEMM over the
    worst-case padded rows; hardware.kernels.deepgemm_moe_s)."""
    cuda_graph_mode: str | None = attrs.field(default=None,
                                              validator=attrs.validators.optional(one_of(*GRAPH_MODES)))
    """What replays a CUDA graph, in vLLM's cudagraph_mode terms: ``full_and_piecewise`` (pure-decode
    batches as one full graph, other steps up to the largest capture size as piecewise graphs with attention
    launched eagerly), ``piecewise`` (attention eager in every step), ``full_decode_only`` (pure-decode
    batches only: SGLang's and TRT-LLM's graphs) or ``none`` (eager: vLLM --enforce-eager, SGLang
    --disable-cuda-graph). Null: the engine's default."""
    cuda_graph_max_size: int | None = attrs.field(default=None, validator=positive)
    """Largest captured batch (vLLM max_cudagraph_capture_size, in tokens; SGLang cuda_graph_max_bs;
    TRT-LLM cuda_graph_config.max_batch_size). Null: the engine's default for the scheduler limits."""
    cuda_graph_sizes: tuple[int, ...] | None = None
    """The captured batch sizes themselves (vLLM cudagraph_capture_sizes, SGLang --cuda-graph-bs, TRT-LLM
    cuda_graph_config.batch_sizes), under the engine's caps. Null: the engine's list."""
    sampling: str = attrs.field(default="greedy", validator=one_of(*SAMPLINGS))
    """What every request asks the sampler for: ``greedy`` (temperature 0, an argmax) or ``top_k_top_p``
    (random sampling with a top-k / top-p filter, as vLLM serves requests that set no sampling parameters:
    it applies the model's generation_config defaults). The latter costs the engine's sampler_s_per_vocab
    per sampled row and vocabulary entry (cost term ``sampler``)."""
    float32_matmul: str = attrs.field(default="highest", validator=one_of(*FP32_MATMUL))
    """PyTorch's float32 matmul precision in the engine (vLLM's VLLM_FLOAT32_MATMUL_PRECISION): ``highest``
    (the default) runs a float32 GEMM, such as MiniMax-M2's router, on the CUDA cores (the GPU's
    ``peak_flops.fp32``), ``high`` on the TF32 tensor cores (``peak_flops.tf32``)."""
    speculative: SpeculativeConfig = attrs.Factory(SpeculativeConfig)
    """Speculative decoding (SpeculativeConfig); off by default."""
    max_model_len: int | None = attrs.field(default=None, validator=positive)
    """Most tokens a request may ask for, prompt plus output (vLLM --max-model-len, SGLang --context-length,
    TensorRT-LLM max_seq_len). Null: the model's context length; more than it is an error, as in the
    engines. A request asking for more fails when it arrives, with its reason, as the engines refuse it."""

    def __attrs_post_init__(self) -> None:
        sizes = self.cuda_graph_sizes
        if sizes is None:
            return
        if not sizes or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes):
            raise ValueError(f"cuda_graph_sizes must list positive integers, got {list(sizes)!r}")
        if self.cuda_graph_max_size is not None and self.cuda_graph_max_size != max(sizes):
            raise ValueError(f"cuda_graph_sizes ends at {max(sizes)} but cuda_graph_max_size is "
                             f"{self.cuda_graph_max_size}: give one of them, or make them agree")


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    max_num_batched_tokens: int | None = attrs.field(default=None, validator=positive)
    """Most tokens one step of a worker computes: prompt chunks, decodes and speculative tokens (vLLM
    --max-num-batched-tokens, SGLang --chunked-prefill-size, TensorRT-LLM max_num_tokens). Null: the engine's
    default for the GPU (vLLM 8192, or 2048 on Ampere or below 70 GiB; SGLang 2048 to 16384 by the GPU's
    memory; TensorRT-LLM 8192), filled in when the run is built."""
    max_num_seqs: int | None = attrs.field(default=None, validator=positive)
    """Running requests per worker (null: the engine's default; SGLang derives it from each worker's KV pool
    of T tokens: min(T // 2, min(max(T / context length x 512, 2048), 4096)))."""
    long_prefill_token_threshold: int = attrs.field(default=0, validator=non_negative)
    """Most tokens one request computes in a step, so a long prompt is split over several steps (vLLM
    --long-prefill-token-threshold); 0: no limit but the step's budget."""
    policy: str = attrs.field(default="fcfs", validator=one_of("fcfs", "priority"))
    """Order of the waiting queue (vLLM --scheduling-policy): ``fcfs`` (arrival order) or ``priority`` (lowest
    session priority first, then arrival; the preemption victim is the lowest-priority, latest arrival)."""
    chunked_prefill: bool = True
    """Split a prompt over several steps when it does not fit the step's remaining token budget (vLLM
    --enable-chunked-prefill). False: a prompt waits for a step with room for all of it, and one longer than
    max_num_batched_tokens fails on arrival."""
    mixed_prefill: bool | None = None
    """Whether a step with prefill work also carries the running decodes (null: the engine's default; vLLM
    and TRT-LLM mix them, SGLang runs prefill batches alone unless --enable-mixed-chunk). vLLM itself always
    mixes them: with false its async scheduling (engine async_output) is not modelled, only the overlap of
    scheduling with the step in progress (an arrival waits one step more), as with speculative decoding."""
    batch_wait_iters: int = attrs.field(default=0, validator=non_negative)
    """TensorRT-LLM batch_wait_timeout_iters: while decodes run, hold new prompts back for up to this many
    steps until they and the decodes fill batch_wait_max_tokens_ratio of the token budget (0: off)."""
    batch_wait_max_tokens_ratio: float = attrs.field(default=0.0, validator=non_negative)
    """TensorRT-LLM batch_wait_max_tokens_ratio: held prompts are admitted once they and the step's other
    tokens reach this fraction of max_num_batched_tokens (used only with batch_wait_iters > 0)."""
    attention_dp_balance: bool = False
    """TensorRT-LLM ``attention_dp_config.enable_balance`` (system.attention_dp > 1 only): prompts are admitted
    only in a step where every attention-DP rank has one and a free seat, or after they have waited
    attention_dp_timeout_iters steps, or when some rank has no decodes (twin.shell.attention_dp)."""
    attention_dp_timeout_iters: int = attrs.field(default=50, validator=non_negative)
    """``attention_dp_config.timeout_iters`` (TensorRT-LLM's default 50)."""
    recv_interval: int = attrs.field(default=1, validator=positive)
    """SGLang --scheduler-recv-interval: the scheduler takes new requests from its input queue only when a
    counter reaches this value; each decode step adds 1, any step with prompt tokens enough to take them at
    the next turn, and an idle scheduler takes them at once (SchedulerRecvSkipper and the
    SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_* defaults). A request that arrives during decode waits for up to
    this many decode steps before it can be admitted. 1: every step (every engine's default)."""
    attention_dp_batching_wait_iters: int = attrs.field(default=10, validator=non_negative)
    """``attention_dp_config.batching_wait_iters`` (default 10): with every rank ready and decoding, prompts
    are held this many steps more."""
    admission_reserve: str | None = attrs.field(default=None,
                                                validator=attrs.validators.optional(one_of(*ADMISSION_RESERVES)))
    """Output room a waiting request needs to be admitted (null: the engine's default): ``none`` (vLLM:
    blocks are taken as tokens come) or ``sglang`` (SGLang's PrefillAdder: room for its uncached prompt and
    its whole output, at most 4,096 tokens of it, beside the running requests' remaining outputs, each at
    most 4,096, scaled by new_token_ratio; the ratio starts at 0.7, falls by 0.602 / 600 per pure-decode
    step to 0.098, is set after a preemption to (decoded tokens + 20 per request) / (output tokens + 1) of
    the requests left running, and is reset to 0.7 when the worker goes idle)."""
    preemption: str | None = attrs.field(default=None,
                                         validator=attrs.validators.optional(one_of(*PREEMPTION_RULES)))
    """Which running request gives up its KV when a step runs out of it (null: the engine's default):
    ``vllm`` (the newest; it goes back to the front of the queue) or ``sglang`` (the fewest output tokens,
    then the longest prompt, then the latest admitted; it joins the back of the queue, and its decoded
    tokens leave the prefix cache; decoded tokens enter the cache when their request finishes, as SGLang
    inserts them into its radix tree, not as they are computed). Under the priority
    policy the victim is the lowest-priority, latest arrival either way."""
    reserve_full_kv: bool | None = None
    """Admit a request only when the KV blocks of its prompt plus all its output tokens can be set aside
    beside those of every running request, so nothing is ever preempted (TensorRT-LLM's default capacity
    policy GUARANTEED_NO_EVICT); false: allocate as tokens arrive and preempt when full (vLLM, SGLang;
    TRT-LLM MAX_UTILIZATION). Null: the engine's default. Applies where the scheduler admits requests;
    a disaggregated decode worker's KV pulls reserve what transfer.decode_headroom_blocks says."""


@attrs.frozen(kw_only=True)
class KVCacheConfig:
    block_size: int | None = attrs.field(default=None, validator=positive)
    """Tokens per KV block (vLLM --block-size, SGLang --page-size, TensorRT-LLM tokens_per_block). Null: the
    engine's (vLLM 16, SGLang 1, or 64 for DeepSeek-V3 / R1 on Blackwell, TensorRT-LLM 32), filled in when the
    run is built."""
    gpu_memory_utilization: float | None = attrs.field(default=None, validator=fraction)
    """Fraction of GPU memory the engine takes, read as its kv_memory_rule says: of the whole HBM, the KV
    cache getting what weights and reserve leave of it (vLLM --gpu-memory-utilization); of the HBM, for
    weights + KV pool (SGLang --mem-fraction-static); or of the memory left after weights and reserve, all for
    KV (TensorRT-LLM free_gpu_memory_fraction). Null: 0.9 for vLLM and TensorRT-LLM, filled in when the run is
    built; for SGLang its mem_fraction_static heuristic, per deployment."""
    num_blocks: int | None = attrs.field(default=None, validator=pool_blocks)
    """Override of the derived capacity (blocks per worker); normally left empty."""
    prefix_caching: bool = True
    """Keep computed KV blocks cached so later requests with the same prefix reuse them (vLLM
    --enable-prefix-caching, SGLang's radix cache); false: every prompt is computed in full."""
    host_memory_gib: float | None = attrs.field(default=None, validator=[positive, bytes_gib])
    """Host memory per worker for a KV tier below the GPU (null: none). Evicted cached blocks are demoted
    there; a prefix hit loads them back before the step, timed by the host link."""
    host_bandwidth_GBps: float | None = attrs.field(default=None, validator=positive)
    """Host-to-GPU bandwidth per GPU (default: the GPU spec's host link, e.g. PCIe Gen5 x16: 64 GB/s)."""

    def __attrs_post_init__(self) -> None:
        # (each was dropped without a word: the run had no host tier)
        if self.host_memory_gib is not None and not self.prefix_caching:
            raise ValueError("host_memory_gib needs prefix_caching: true (a host tier holds the prefix "
                             "cache's evicted blocks)")
        if self.host_bandwidth_GBps is not None and self.host_memory_gib is None:
            raise ValueError("host_bandwidth_GBps is the host tier's link: it needs host_memory_gib")


@attrs.frozen(kw_only=True)
class TransferConfig:
    """KV hand-off between prefill and decode workers (disaggregated systems only)."""

    kind: str = attrs.field(default="pull", validator=one_of("pull", "push"))
    """pull: KV stays staged until a decode worker reserves room and pulls it; push: sent right after
    prefill, the decode worker allocates on arrival and the request fails when it cannot (ablation)."""
    layerwise: bool = False
    """Layer-wise transfer overlapped with prefill compute: a pull that starts as soon as the KV is staged
    exposes only the last layer's share; a pull that had to wait exposes all of it."""
    first_token: str = attrs.field(default="decode", validator=one_of("decode", "prefill"))
    """Where the client's first token comes from (vLLM disaggregated serving: the decode worker)."""
    setup_latency_s: float = attrs.field(default=20e-6, validator=[non_negative, on_clock])
    """Fixed time each KV hand-off takes before its descriptors and bytes, in seconds (not shortened by
    layer-wise overlap)."""
    per_descriptor_s: float = attrs.field(default=1.5e-6, validator=[non_negative, on_clock])
    """Serial cost of one transfer descriptor on each GPU (how many a hand-off posts: ``pieces`` below).
    Default from the NIXL measurements in REFERENCES: 1 KiB pieces reach 0.7 GB/s on a 400 Gb/s NIC, i.e.
    about 1.4 us per piece beyond its bytes (16 KiB pieces at 4.7 GB/s imply 3.1 us)."""
    pieces: str | None = attrs.field(default=None,
                                     validator=attrs.validators.optional(one_of(*KV_TRANSFER_PIECES)))
    """How many descriptors a hand-off posts on each GPU: ``block`` (one per KV block per layer), ``layer`` or
    ``buffer``, as hardware.engine.EngineProfile.kv_transfer_pieces describes them (null: the engine's)."""
    efficiency: float = attrs.field(default=0.85, validator=fraction)
    """Fraction of the link's line rate a large transfer reaches (RDMA through NIXL: about 85 %)."""
    lease_s: float | None = attrs.field(default=30.0, validator=[positive, on_clock])
    """Staged KV not pulled within this time is dropped; the decode worker recomputes (null: no lease)."""
    decode_headroom_blocks: int = attrs.field(default=0, validator=non_negative)
    """Blocks reserved beyond the prompt before a pull starts, for the request's growth."""
    max_handoffs_per_s: float | None = attrs.field(default=None, validator=[positive, rate_on_clock])
    """P->D pacing limit: pulls from one prefill worker start at most this often (``kind: pull`` only; a
    pull that finds no room on its decode worker takes no slot)."""


@attrs.frozen(kw_only=True)
class MetricsConfig:
    sample_interval_s: float = attrs.field(default=1.0, validator=[positive, one_tick, on_clock])
    """Simulated time between two rows of timeseries.csv (the gauges), in seconds."""
    record_token_times: bool = False
    """Record the simulated time of every output token of every request, written to token_times.json."""
    slo_ttft_s: float | None = attrs.field(default=None, validator=[positive, on_clock])
    """Goodput target: a finished request counts in goodput_requests_per_s only if its time to first token is
    at most this, in seconds (null: no TTFT target)."""
    slo_tpot_s: float | None = attrs.field(default=None, validator=[positive, on_clock])
    """Goodput target on time per output token, in seconds (null: none; a request with no TPOT meets it)."""


@attrs.frozen(kw_only=True)
class RunConfig:
    seed: int = attrs.field(default=0, validator=non_negative)
    """Seed of the run's random draws: the workload's lengths, arrival gaps and dataset entries, and the
    speculative acceptances (same seed, same results)."""
    duration_s: float | None = attrs.field(default=None, validator=[positive, on_clock])
    """No session starts after this simulated time; the run then drains what was sent."""
    max_sim_s: float | None = attrs.field(default=None, validator=[positive, on_clock])
    """Hard stop: requests still pending then fail with reason 'time limit'."""
    warmup_s: float = attrs.field(default=0.0, validator=[non_negative, on_clock])
    """Requests arriving before this time are kept in the table but left out of the summary."""
    check_invariants: bool = True
    """After the run, check that every request ended (a failed one with a reason) and, when all sessions are
    done, that no worker still has running requests, reserved or referenced blocks; a violation raises
    InvariantError."""
    fast_forward: bool = True
    """Jump through pure-decode stretches in one event and advance the decodes of mixed steps as one
    cohort (identical results; off = every request step by step)."""
    fast_forward_max_steps: int = attrs.field(default=128, validator=positive)
    """Most decode steps one fast-forward jump covers (with fast_forward on; 1: none jumped)."""


# ------------------------------------------------------------------------------------ pluggable bases
class SystemSpec(Pluggable):
    category: ClassVar[str] = "system"
    default_kind: ClassVar[str] = "colocated"


class RouterSpec(Pluggable):
    category: ClassVar[str] = "router"
    default_kind: ClassVar[str] = "round_robin"


class WorkloadSpec(Pluggable):
    category: ClassVar[str] = "workload"
    default_kind: ClassVar[str] = "synthetic"


class ArrivalSpec(Pluggable):
    category: ClassVar[str] = "arrival"


def _default(category: str) -> Any:
    """Factory building a pluggable section's default kind with default parameters."""
    from twin.registry import lookup

    def make() -> Any:
        import twin.builtin_kinds  # noqa: F401  (registers the built-in kinds)

        defaults = {"system": SystemSpec.default_kind, "router": RouterSpec.default_kind,
                    "workload": WorkloadSpec.default_kind}
        return lookup(category, defaults[category], category)()

    return attrs.Factory(make)


@attrs.frozen(kw_only=True)
class TwinConfig:
    name: str = ""
    hardware: HardwareConfig = attrs.Factory(HardwareConfig)
    model: ModelConfig = attrs.Factory(ModelConfig)
    engine: EngineConfig = attrs.Factory(EngineConfig)
    system: SystemSpec = _default("system")
    scheduler: SchedulerConfig = attrs.Factory(SchedulerConfig)
    kv_cache: KVCacheConfig = attrs.Factory(KVCacheConfig)
    transfer: TransferConfig = attrs.Factory(TransferConfig)
    router: RouterSpec = _default("router")
    workload: WorkloadSpec = _default("workload")
    metrics: MetricsConfig = attrs.Factory(MetricsConfig)
    run: RunConfig = attrs.Factory(RunConfig)

    def to_dict(self) -> dict[str, Any]:
        return dict(to_dict(self))


def load_config(source: str | Path | dict[str, Any] | None = None, overrides: list[str] | tuple[str, ...] = (),
                *, base_dir: Path | None = None) -> TwinConfig:
    """A config from a YAML file, a mapping or nothing (all defaults), with ``path=value`` overrides.

    Relative file paths inside the config (a trace, a session file) are resolved against the config
    file's folder.
    """
    import twin.builtin_kinds  # noqa: F401  (registers the built-in kinds)

    label: str | None = None
    if source is None:
        data: dict[str, Any] = {}
    elif isinstance(source, dict):
        data = source
    else:
        label = str(source)
        data = read_yaml(source)
        base_dir = base_dir or Path(source).resolve().parent
    data = _deepcopy(data)
    if base_dir is not None:
        _resolve_paths(data, base_dir)
    try:
        parsed = [parse_override(text) for text in overrides]
    except ConfigError as exc:
        raise blame(exc, label, overrides) from None
    _refuse_repeats(overrides, parsed, label)
    try:
        if parsed:
            data = _apply_overrides(data, parsed)
        return from_dict(TwinConfig, data)
    except ConfigError as exc:
        raise blame(exc, label, overrides) from None


def _refuse_repeats(overrides: Sequence[str], parsed: list[tuple[str, Any]], label: str | None) -> None:
    """A field given by two overrides is an error naming both (the last one was taken without a word)."""
    first: dict[str, str] = {}
    for text, (path, _) in zip(overrides, parsed):
        if path in first:
            raise ConfigError(path, f"set twice: overrides {first[path]!r} and {text!r}; give it once", source=label)
        first[path] = text


def blame(exc: ConfigError, label: str | None, overrides: Sequence[str] = ()) -> ConfigError:
    """``exc`` naming where the bad value came from: the override that set its field (or a field inside it,
    or the section it is in), else the config file ``label`` and the line of the field there (or of its
    nearest section in the file, for a field the file leaves out)."""
    if exc.source is not None:
        return exc
    for text in overrides:
        path = text.partition("=")[0].strip()
        if within(exc.path, path) or within(path, exc.path):
            return ConfigError(exc.path, exc.message, source=f"{label}, override {text}" if label
                               else f"override {text}")
    if not label:
        return exc
    lines = key_lines(label) if Path(label).is_file() else {}
    parts = exc.path.split(".") if exc.path else []
    for end in range(len(parts), 0, -1):  # the field's own line, else its nearest section's in the file
        line = lines.get(".".join(parts[:end]))
        if line is not None:
            return ConfigError(exc.path, exc.message, source=f"{label}, line {line}")
    return ConfigError(exc.path, exc.message, source=label)


def _apply_overrides(data: dict[str, Any], overrides: list[tuple[str, Any]]) -> dict[str, Any]:
    """Apply ``path=value`` overrides on top of the config with every default filled in.

    So ``workload.arrival.rate_per_s=3`` works when the file never mentions the arrival. Setting a
    ``kind`` replaces its section (with the file's own section when that already has the kind); kinds are
    set first, outer sections before inner ones, so the overrides apply on top of them whatever their order;
    then the other overrides, a section before the fields inside it.
    """
    try:
        full = from_dict(TwinConfig, data).to_dict()
    except ConfigError:
        full = data  # the overrides may be what repairs the file: apply them to it as written
    # In the order given, a later section dropped what an earlier override had set inside it without a word
    # (workload.kind=synthetic after workload.arrival.kind=gamma brought the file's own arrival back; a
    # scheduler={...} after scheduler.max_num_seqs=8 its own value).
    def is_kind(path: str) -> bool:
        return path == "kind" or path.endswith(".kind")

    for path, value in sorted(overrides, key=lambda item: (not is_kind(item[0]), item[0].count("."))):
        if not is_kind(path):
            set_path(full, path, value)
            continue
        if path == "kind":
            raise ConfigError("kind", "unknown key: a kind belongs to a section (workload.kind, router.kind, ...)")
        section = path[: -len(".kind")]
        own = _get_path(data, section)
        replacement = own if isinstance(own, dict) and own.get("kind") == value else {"kind": value}
        set_path(full, section, _deepcopy(replacement))
    return full


def _get_path(data: Any, dotted: str) -> Any:
    for part in dotted.split(".") if dotted else []:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _deepcopy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deepcopy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deepcopy(v) for v in data]
    return data


def _resolve_paths(data: dict[str, Any], base_dir: Path) -> None:
    hw = data.get("hardware")
    if isinstance(hw, dict) and isinstance(hw.get("constants"), str):
        path = Path(hw["constants"])
        if not path.is_absolute() and not path.exists() and (base_dir / path).is_dir():
            hw["constants"] = str(base_dir / path)
    if isinstance(hw, dict) and isinstance(hw.get("gpu"), str):
        from hardware.gpu import is_gpu_file

        path = Path(hw["gpu"])
        if is_gpu_file(hw["gpu"]) and not path.is_absolute() and not path.exists() and (base_dir / path).exists():
            hw["gpu"] = str(base_dir / path)
    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("path"), str):
        path = Path(workload["path"])
        if not path.is_absolute() and not path.exists() and (base_dir / path).exists():
            workload["path"] = str(base_dir / path)
