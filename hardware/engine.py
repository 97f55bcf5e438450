"""Engine profiles (vLLM, SGLang, TensorRT-LLM): batch limits, CUDA-graph capture sizes, host overheads."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import attrs

from hardware._data import DATA_DIR, is_count, is_number, located, read_yaml, unknown_name
from hardware.gpu import GPUSpec

ENGINE_DIR = DATA_DIR / "engines"
_GIB = 2**30
CAPTURE_RULES = ("vllm", "sglang", "trtllm")
KV_MEMORY_RULES = ("total", "free", "static")
MEMORY_FRACTION_RULES = ("fixed", "sglang")
ADMISSION_RESERVES = ("none", "sglang")
PREEMPTION_RULES = ("vllm", "sglang")
KV_TRANSFER_PIECES = ("block", "layer", "buffer")
DP_BALANCERS = ("least_loaded", "vllm_stats", "round_robin")
VERIFY_STATES = ("slots", "snapshots")
DSA_PREFILL_RULES = ("dense", "sparse_padded")
TRANSFER_BUFFER_BYTES = 512 << 20
"""TensorRT-LLM's KV send buffer (TRTLLM_KVCACHE_TRANSFER_BUFFER_SIZE, 512 MB by default)."""
_MIB = 2**20
HOST_TIME_FIELDS = ("step_host_s", "per_request_host_s", "spec_request_host_s", "launch_s",
                    "per_block_host_s", "graph_kernel_floor_s", "eager_layer_host_s", "eager_moe_host_s",
                    "sampler_s_per_vocab")
"""The profile's seconds (per step, request, kernel, block, layer or vocabulary entry): each is added to step
costs, so each must be a finite number >= 0."""
SGLANG_MEMORY_TIERS = ((20, 2048, 8, 8), (35, 2048, 24, 80), (60, 4096, 32, 160), (160, 8192, 256, 512),
                       (float("inf"), 16384, 512, 512))
"""SGLang's defaults by the GPU's memory (server_args._handle_gpu_memory_settings, 0.5.6-0.5.9): (below this
many GiB, chunked_prefill_size, cuda_graph_max_bs at TP < 4, at TP >= 4)."""
GRAPH_MODES = ("full_and_piecewise", "piecewise", "full_decode_only", "none")
"""What replays a CUDA graph; vLLM's ``cudagraph_mode`` names (FULL_AND_PIECEWISE, PIECEWISE,
FULL_DECODE_ONLY, NONE), which also describe SGLang's and TRT-LLM's decode-only graphs."""
FULL_GRAPH_MODES = ("full_and_piecewise", "full_decode_only")
"""The modes in which a pure-decode batch replays one full graph, attention included."""
TRTLLM_DEFAULT_GRAPH_MAX = 128
"""TRT-LLM CudaGraphConfig: max_batch_size 0 means 128."""
SM100_DEEPSEEK_MOE_TYPES = frozenset(("deepseek_v3", "deepseek_v32", "glm_moe_dsa"))
"""Model types whose quantised checkpoints take the engine's ``sm100_deepseek_moe_kernel`` on Blackwell.
SGLang's MoE-runner adjustment is shared by every DeepseekV3ForCausalLM checkpoint, V3.2 with its sparse
attention included, since sglang PR #13687 (2025-11-21), and GLM-5 (GlmMoeDsaForCausalLM) joined that
handling when SGLang first served it (PR #18521, 2026-02-10; server_args' DeepSeek-family handler)."""


def _builds(value: object) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """EngineProfile.builds from its YAML mapping (version -> {field: seconds}), sorted by version."""
    if isinstance(value, tuple):
        return value
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError(f"builds must map a version to its host terms ({{field: seconds}}), got {value!r}")
    return tuple(sorted((str(k), tuple(sorted(v.items()))) for k, v in value.items()))


@attrs.frozen(kw_only=True)
class EngineProfile:
    """One serving engine's defaults and host-side costs (owner of the scheduler and runtime families)."""

    name: str
    version: str = ""
    block_size: int = 16
    sm100_deepseek_page_size: int = 0
    """The KV page size the engine's attention backend forces for DeepseekV3ForCausalLM checkpoints on
    Blackwell (SM100) when the launch sets none; 0: ``block_size``. SGLang 64: it picks trtllm_mla there
    (server_args._handle_model_specific_adjustments, 0.5.x), which takes pages of 32 or 64 tokens and sets 64
    (_handle_attention_backend_compatibility)."""
    sm100_deepseek_moe_kernel: str = "default"
    """The routed-expert kernel family the engine selects for quantised (FP8, block-FP8, NVFP4) checkpoints
    of the DeepSeek family (:data:`SM100_DEEPSEEK_MOE_TYPES`) on Blackwell when the launch names none and runs
    no all-to-all backend (Deployment.moe_kernel); ``default``: its own kernel. SGLang flashinfer_trtllm (the
    same server_args adjustment: fp8 / modelopt_fp8 / modelopt_fp4 without --moe-a2a-backend)."""
    gpu_memory_utilization: float = 0.9
    kv_memory_rule: str = "total"
    """What gpu_memory_utilization is a fraction of. total (vLLM gpu_memory_utilization): of the whole HBM,
    from which weights and the reserve (activation peak, runtime) are then taken; free (TensorRT-LLM
    kv_cache_config.free_gpu_memory_fraction): of what is left after weights and the reserve; static (SGLang
    mem_fraction_static): weights + KV pool = the fraction of the HBM, the activations and graph buffers
    living in the rest, so only the runtime reserve (CUDA context, communicators) is taken besides weights
    (model_runner.profile_max_num_token: free memory after loading minus HBM x (1 - fraction))."""
    memory_fraction_rule: str = "fixed"
    """Where the default fraction comes from when the user gives none: fixed (gpu_memory_utilization above)
    or sglang (SGLang's mem_fraction_static heuristic from the GPU's memory, the chunked-prefill size, the
    largest CUDA graph and the GPU count: :meth:`default_memory_fraction`)."""
    capture_rule: str = "vllm"
    batch_rule: str = "vllm"
    step_host_s: float = 0.0
    per_request_host_s: float = 0.0
    spec_request_host_s: float = 0.0
    """CPU per speculative decode request per step, on top of per_request_host_s (the ``request_host`` term):
    the engine's bookkeeping of a verify (its accepted tokens, the next draft's inputs). Exposed where the
    engine drafts without host overlap (:attr:`speculative_overlap`)."""
    launch_s: float = 5e-6
    per_block_host_s: float = 0.0      # host work per referenced KV block per step (block tables, page walks)
    graph_kernel_floor_s: float = 3e-6  # GPU floor of one kernel replayed in a CUDA graph
    eager_layer_host_s: float = 0.0     # CPU per decoder layer of a step run without CUDA graphs (eager_host)
    eager_moe_host_s: float = 0.0       # CPU per MoE layer of such a step, on top of eager_layer_host_s
    prefill_sync_mixers: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """Token-mixer kinds (hardware.layers.MIXER_KINDS) whose eager prefill makes the host wait for the GPU
    inside every such layer: SGLang ``gdn``. Its gated-DeltaNet prefill runs FLA's chunked kernels, which take
    their chunk indices from ``prepare_chunk_indices``: a ``.tolist()`` of the sequence lengths, a
    device-to-host copy that waits for the queued GPU work, behind an identity-keyed cache that does not carry
    across SGLang's DeltaNet layers (python/sglang/srt/layers/attention/fla/index.py; a fork's fix,
    MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks#26, "avoid per-layer GDN CUDA-to-CPU sync"; the same
    per-layer miss in TensorRT-LLM, NVIDIA/TensorRT-LLM#9691). vLLM builds the indices on the host
    (GDNAttentionMetadataBuilder, vllm-project/vllm#38361). A MoE layer's host work (``eager_moe_host_s``:
    routing, the experts' Python) comes before its expert kernels, and the next such layer's wait holds the
    host until they finish, so the two follow one another instead of overlapping: an eager prompt step of
    such a model lasts max(host, GPU) + min(MoE host, MoE GPU) (CostModel._eager_host)."""
    graph_padding_one_request: bool = False
    """Whether the engine pads a batch up to its CUDA graph's size with one dummy request repeated
    (TensorRT-LLM: CUDAGraphRunner._get_padded_batch extends the batch with ``[padding_dummy_request] *
    padding_size``): the padded tokens are identical, so the routed experts read the weights of one more
    token's experts, not of padding_size more (cuda_graph_padding). False: the padded slots are priced as
    distinct tokens."""
    sampler_s_per_vocab: float = 0.0
    """GPU seconds per sampled row per vocabulary entry when requests sample with top-k / top-p (the
    ``sampler`` cost term; Deployment.sampling): the filter, the softmax and the draw each touch every entry
    of the row (vLLM's PyTorch path sorts the row for top-p). Greedy requests (temperature 0) take an argmax,
    priced at 0."""
    host_overlap: bool = False          # async scheduling: host work of a step hides under its GPU work
    speculative_overlap: bool = True
    """Whether host_overlap holds while the engine drafts (speculative decoding). SGLang's EAGLE worker (the
    path of its MTP / NEXTN drafts) turns the overlap scheduler off unless SGLANG_ENABLE_SPEC_V2 is set
    (server_args.ServerArgs._handle_speculative_decoding, 0.5.x: disable_overlap_schedule = True). A config
    says otherwise with engine.speculative.overlap."""
    verify_states: str = "slots"
    """Where a speculative verify keeps the recurrent state (Mamba2, gated DeltaNet) after each of its 1 + k
    positions, to roll back to the last accepted one. slots (vLLM): every request holds 1 + k state slots
    (MambaSpec.num_speculative_blocks), the kernel writes each position's state into one and the next step
    reads the accepted one where it lies. snapshots (SGLang): a pool of (max running requests + 1) x (1 + k)
    SSM snapshots per layer (MambaPool's intermediate_ssm cache, memory_pool.py) beside each request's one
    state, and after the verify the accepted snapshot is copied into that state, a read and a write more
    per request and layer (HybridLinearAttnBackend.update_mamba_state_after_mtp_verify). TensorRT-LLM's
    path was not checked and takes slots."""
    dsa_prefill: str = "dense"
    """How a DSA model's (MLA with an FP8 indexer: GLM-5, DeepSeek-V3.2) prefill attends. dense: MHA form over
    each query's top-k keys (the engines whose path was not checked). sparse_padded (SGLang's NSA backend):
    a prefill step whose contexts are at most index_topk keys long runs dense MHA (NativeSparseAttnBackend.
    set_nsa_prefill_impl, use_mha); a longer one runs FlashMLA's sparse kernel in absorbed form, every query
    head over the 576-wide latent of its top-k keys, with the query heads zero-padded to a multiple of 64 on
    Hopper and 128 on Blackwell (_forward_flashmla_sparse: "FlashMLA sparse kernel requires num_heads to be
    a multiple of 64 (Hopper) or 128 (Blackwell)"), so GLM-5 at TP 8 (8 heads a GPU) computes 8x / 16x
    the heads it keeps."""
    chunked_prefill: bool = True        # the engine's default: a prompt may be split across steps
    mixed_prefill: bool = True          # a step with prefill work also carries the running decodes
    reserve_full_kv: bool = False       # admission sets aside KV for prompt + all output (TRT-LLM GUARANTEED_NO_EVICT)
    admission_reserve: str = "none"
    """Output room a request needs to be admitted: none (vLLM: blocks as tokens come) or sglang (SGLang's
    PrefillAdder: its prompt and whole output, beside the running requests' remaining outputs scaled by the
    decaying new_token_ratio; twin.core.scheduler.SchedulerLimits.admission_reserve)."""
    preemption: str = "vllm"
    """Which running request gives its KV back when a step runs out, and where it waits (twin.core.scheduler.
    SchedulerLimits.preemption): vllm (the newest, to the front of the queue) or sglang (the fewest outputs,
    then the longest prompt, to the back)."""
    runtime_reserve_bytes: int = 1 << 30
    cache_duplicate_blocks: bool = False
    """Whether the prefix cache keeps a block computed with the content of a block it already holds, as a
    further copy that takes over when the first is evicted (vLLM: BlockHashToBlockMap keeps every block
    under a hash, v1/core/block_pool.py), or leaves it uncached (SGLang's radix cache and TensorRT-LLM's
    block tree keep the block stored first; twin.core.kv_cache.PyBlockPool.keep_duplicates)."""
    async_output: bool = False
    """With host_overlap, a step's output is applied only after the next step is formed, as vLLM's async
    scheduling does (twin.core.scheduler.SchedulerLimits.async_output): finished requests hold their seats and
    blocks through that schedule, the blocks of the tokens just sampled are cached after it, and after an
    idle engine the second step sees the arrivals that did not fit in the first."""
    windowed_kv: bool = True
    """Whether a sliding-window layer keeps only its window of KV per request (vLLM's hybrid allocator,
    SGLang's SWA pool: Deployment.state_bytes_per_request) or full-length KV like a full-attention layer
    (false: TensorRT-LLM 1.0-1.2 builds one KV pool for all layers unless max_attention_window is set by
    hand; trtllm-serve 1.1.0rc3 logs "kv size is 73728" bytes a token for gpt-oss-120b, its 36 layers' K and
    V at full length). The attention kernels read only the window either way."""
    csa_archs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """GPU architectures whose kernels the engine runs DeepSeek-V4's compressed attention (csa mixers) on;
    empty: every one the twin prices. TensorRT-LLM's DeepseekV4TrtllmAttention is Blackwell-only
    (examples/models/core/deepseek_v4/README.md)."""
    weight_only_kernels: bool = True
    """Whether the engine runs FP8 / FP4 weights on a GPU without those tensor cores (Ampere) through
    weight-only kernels that dequantise into BF16 MMAs (vLLM's and SGLang's Marlin kernels; Deployment.
    weight_only), or refuses such weights there (TensorRT-LLM: its FP8 path needs Ada, Hopper or newer)."""
    kv_transfer_pieces: str = "block"
    """How the engine's connector cuts a disaggregated KV hand-off into transfer descriptors on each GPU, each
    paying transfer.per_descriptor_s (twin.shell.disagg): block, one per KV block per layer (vLLM's NIXL
    connector); layer, one per layer (SGLang: its connectors merge the pages contiguous on both sides,
    group_concurrent_contiguous, and in PD mode its allocator keeps the free pages sorted, need_sort, so a
    request's pages are taken as one run); buffer, one per send buffer-full (TensorRT-LLM's cache
    transceiver copies the blocks into a contiguous buffer of TRANSFER_BUFFER_BYTES before sending)."""

    builds: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = attrs.field(default=(), converter=_builds)
    """Host terms (HOST_TIME_FIELDS) of engine builds whose own fit differs from the profile's, by version
    (YAML: a mapping of version to fields). :meth:`for_version` gives the profile of a build: the longest
    listed version that the build's is, or starts with at a dot (0.5.10 covers 0.5.10.post1, not 0.5.1)."""

    dp_balancer: str = "least_loaded"
    """How the engine gives a new request to one of its attention-DP ranks (twin.shell.attention_dp): least_loaded, the
    rank with the fewest requests (TensorRT-LLM's request fetcher balances active requests over ranks);
    vllm_stats, vLLM's DPLBAsyncMPClient.get_core_engine_for_request: the lowest 4 x waiting + running in
    the counts the DP coordinator publishes every 100 ms, plus the requests this front end sent since
    (vllm/v1/engine/core_client.py); round_robin, SGLang's --load-balance-method default."""

    def __attrs_post_init__(self) -> None:
        for field, valid in (("capture_rule", CAPTURE_RULES), ("batch_rule", CAPTURE_RULES),
                             ("kv_memory_rule", KV_MEMORY_RULES), ("admission_reserve", ADMISSION_RESERVES),
                             ("preemption", PREEMPTION_RULES),
                             ("memory_fraction_rule", MEMORY_FRACTION_RULES),
                             ("kv_transfer_pieces", KV_TRANSFER_PIECES), ("dp_balancer", DP_BALANCERS),
                             ("verify_states", VERIFY_STATES), ("dsa_prefill", DSA_PREFILL_RULES)):
            value = getattr(self, field)
            if value not in valid:
                raise ValueError(f"engine {self.name!r}: unknown {field} {value!r}; valid: {', '.join(valid)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"engine {self.name!r}: gpu_memory_utilization must be in (0, 1], "
                             f"got {self.gpu_memory_utilization}")
        # Every host time, not only the eager ones: a negative step_host_s or per_block_host_s made step costs
        # negative, a NaN or infinite one NaN, without a word.
        for field in HOST_TIME_FIELDS:
            value = getattr(self, field)
            if not 0.0 <= value < math.inf:
                raise ValueError(f"engine {self.name!r}: {field} must be a finite number of seconds >= 0, got "
                                 f"{value!r}")
        from hardware.layers import MIXER_KINDS

        bad = [k for k in self.prefill_sync_mixers if k not in MIXER_KINDS]
        if bad:
            raise ValueError(f"engine {self.name!r}: prefill_sync_mixers names unknown mixer kind(s) {bad}; "
                             f"valid: {', '.join(MIXER_KINDS)}")
        if not is_count(self.block_size, 1):
            raise ValueError(f"engine {self.name!r}: block_size must be an integer >= 1, got {self.block_size!r}")
        if not is_count(self.sm100_deepseek_page_size):
            raise ValueError(f"engine {self.name!r}: sm100_deepseek_page_size must be an integer >= 0, got "
                             f"{self.sm100_deepseek_page_size!r}")
        for build, terms in self.builds:
            for field, value in terms:
                if field not in HOST_TIME_FIELDS:
                    raise ValueError(f"engine {self.name!r}: builds {build!r} sets {field!r}; a build sets host "
                                     f"terms only: {', '.join(HOST_TIME_FIELDS)}")
                if not (is_number(value) and 0.0 <= value < math.inf):
                    raise ValueError(f"engine {self.name!r}: builds {build!r} {field} must be a finite number "
                                     f"of seconds >= 0, got {value!r}")
        from hardware.calibration import MOE_KERNELS

        if self.sm100_deepseek_moe_kernel not in MOE_KERNELS:
            raise ValueError(f"engine {self.name!r}: sm100_deepseek_moe_kernel must be one of "
                             f"{', '.join(MOE_KERNELS)}, got {self.sm100_deepseek_moe_kernel!r}")
        if not is_count(self.runtime_reserve_bytes):
            raise ValueError(f"engine {self.name!r}: runtime_reserve_bytes must be an integer >= 0, got "
                             f"{self.runtime_reserve_bytes!r}")

    def _big_gpu(self, gpu: GPUSpec) -> bool:
        return gpu.tier_bytes >= 70 * _GIB and gpu.arch != "ampere"

    def default_block_size(self, gpu: GPUSpec, model_type: str = "") -> int:
        """Tokens per KV page when the user sets none: the profile's ``block_size``, except where the engine's
        attention backend forces its own (``sm100_deepseek_page_size``: DeepSeek-V3 / R1 on B200, GB200, B300,
        GB300)."""
        if self.sm100_deepseek_page_size and gpu.arch == "blackwell" and model_type == "deepseek_v3":
            return self.sm100_deepseek_page_size
        return self.block_size

    def default_moe_kernel(self, gpu: GPUSpec, model_type: str, weight_dtype: str, attn_dp: int = 1) -> str:
        """The routed-expert kernel family the engine picks when the launch names none (Deployment.moe_kernel):
        ``default``, its own kernel for the format, except where it selects another
        (``sm100_deepseek_moe_kernel``: the DeepSeek family in block-FP8, FP8 or NVFP4 on Blackwell; BF16
        checkpoints keep the engine's kernel). Attention-DP engines (``attn_dp`` > 1) are left to their own
        kernel: the recipes launch them with an all-to-all backend (DeepEP), which the selection excludes."""
        if (gpu.arch == "blackwell" and model_type in SM100_DEEPSEEK_MOE_TYPES
                and weight_dtype in ("fp8_block", "fp8", "fp4") and attn_dp == 1):
            return self.sm100_deepseek_moe_kernel
        return "default"

    def default_max_num_batched_tokens(self, gpu: GPUSpec) -> int:
        """Per-step token budget the engine picks for this GPU when the user sets none."""
        if self.batch_rule == "vllm":
            return 8192 if self._big_gpu(gpu) else 2048
        if self.batch_rule == "sglang":   # chunked_prefill_size by the GPU's memory
            return _sglang_tier(gpu)[1]
        return 8192

    def default_max_num_seqs(self, gpu: GPUSpec) -> int:
        """Maximum running requests the engine picks for this GPU when the user sets none."""
        if self.batch_rule == "vllm":
            return 1024 if self._big_gpu(gpu) else 256
        if self.batch_rule == "sglang":
            # SGLang sizes max_running_requests from its KV pool (pool_max_num_seqs, which the twin's
            # systems use once a worker's pool is known); this stands in where no pool is at hand.
            return 1024 if gpu.tier_bytes >= 35e9 else 256
        return 2048

    @property
    def derives_max_num_seqs(self) -> bool:
        """Whether the engine sizes its running-request cap from the KV pool (:meth:`pool_max_num_seqs`)."""
        return self.batch_rule == "sglang"

    def pool_max_num_seqs(self, kv_tokens: int, context_length: int) -> int | None:
        """The running-request cap the engine derives from a worker's KV pool of ``kv_tokens`` tokens (None:
        the engine's cap does not depend on it, :meth:`default_max_num_seqs`).

        SGLang (0.5.1.post1 - 0.5.9: model_runner.init_memory_pool sizes the request-to-token pool, then
        tp_worker / model_runner set max_running_requests) without --max-running-requests: min(kv_tokens // 2,
        min(max(int(kv_tokens / context_length x 512), 2048), 4096)). Not followed: a Mamba state pool's
        own cap, and DP attention's split of an explicit value."""
        if not self.derives_max_num_seqs:
            return None
        pool = min(max(int(kv_tokens / context_length * 512), 2048), 4096)
        return min(kv_tokens // 2, pool)

    def cuda_graph_max_bs(self, gpu: GPUSpec | None = None, tp: int = 1) -> int:
        """SGLang's cuda_graph_max_bs default by the GPU's memory (SGLANG_MEMORY_TIERS: H100 / H200 256 at
        TP < 4, else 512). ``tp``: SGLang's tp_size, every GPU of the engine (the twin's tp x attn_dp). No GPU
        given: the H100 tier."""
        tier = _sglang_tier(gpu) if gpu is not None else SGLANG_MEMORY_TIERS[3]
        return tier[2] if tp < 4 else tier[3]

    def default_memory_fraction(self, gpu: GPUSpec, *, gpus: int, chunked_prefill_size: int,
                                cuda_graph_max_bs: int, dp_attention: int = 1, speculative: bool = False) -> float:
        """The KV-memory fraction the engine picks when the user sets none.

        ``fixed``: gpu_memory_utilization. ``sglang``: SGLang's mem_fraction_static heuristic
        (server_args.ServerArgs._handle_gpu_memory_settings, the same in 0.5.6.post2, 0.5.8.post1 and 0.5.9):
        reserved MiB = 512 + 1.5 x max(chunked_prefill_size, 2048) (activations of the largest prefill chunk)
        + 2 x cuda_graph_max_bs (graph buffers) + 1024 x GPUs / 8, with DP attention 3 x cuda_graph_max_bs x
        dp more (and 1.5 x that when cuda_graph_max_bs > 300), at least 10 GiB on a GPU of more than 60 GiB,
        2 GiB more for an EAGLE / MTP draft; fraction = round((memory - reserved) / memory, 3), memory being
        the GPU's in MiB. ``gpus``: GPUs of one engine (SGLang's tp_size x pp_size); ``dp_attention``: its
        DP-attention groups (1: none)."""
        if self.memory_fraction_rule == "fixed":
            return self.gpu_memory_utilization
        mem = gpu.hbm_bytes / _MIB
        reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + gpus / 8 * 1024
        if dp_attention > 1:
            reserved += cuda_graph_max_bs * dp_attention * 3
            if cuda_graph_max_bs > 300:
                reserved += cuda_graph_max_bs * dp_attention * 1.5
        if mem > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        if speculative:
            reserved += 2 * 1024
        fraction = round((mem - reserved) / mem, 3)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"engine {self.name!r}: {gpu.name} ({mem:.0f} MiB) leaves no memory after SGLang's "
                             f"reserve of {reserved:.0f} MiB (chunked prefill {chunked_prefill_size}, CUDA graphs "
                             f"up to {cuda_graph_max_bs})")
        return fraction

    def for_version(self, version: str | None) -> "EngineProfile":
        """The profile of one build of the engine (``version``, e.g. SGLang's 0.5.10.post1): the host terms of
        the longest entry of :attr:`builds` that the version is or starts with at a dot; the profile itself
        for None or a version no entry covers."""
        if not version:
            return self
        match = max((b for b in self.builds if version == b[0] or version.startswith(b[0] + ".")),
                    key=lambda b: len(b[0]), default=None)
        terms: dict[str, Any] = dict(match[1]) if match is not None else {}
        return attrs.evolve(self, **terms) if terms else self

    @property
    def default_graph_mode(self) -> str:
        """The engine's CUDA-graph mode when the user sets none (GRAPH_MODES): vLLM v1 replays full graphs
        for pure-decode batches and piecewise graphs for the rest; SGLang and TRT-LLM graph pure decodes."""
        return "full_and_piecewise" if self.capture_rule == "vllm" else "full_decode_only"

    def cuda_graph_sizes(self, max_num_seqs: int, max_num_batched_tokens: int, *,
                         gpu: GPUSpec | None = None, tp: int = 1, max_size: int | None = None,
                         sizes: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """Batch sizes captured as CUDA graphs, ascending (a graphed batch pads up to the next one).

        ``max_size``: the largest size the user asked for (vLLM max_cudagraph_capture_size, SGLang
        cuda_graph_max_bs, TRT-LLM cuda_graph_config.max_batch_size); None: the engine's default.
        ``sizes``: the user's own list (vLLM cudagraph_capture_sizes, SGLang --cuda-graph-bs, TRT-LLM
        cuda_graph_config.batch_sizes) in place of the engine's, under the same caps.
        vLLM: [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), max = min(2 x max_num_seqs, 512) by
        default, capped by the token budget. SGLang: [1, 2, 4, 8, 12] + range(16, 257, 8) + range(272, 512,
        16) + range(512, max + 1, 32), capped by the running-request limit, which is itself captured when
        the list passes it (cuda_graph_runner.get_batch_sizes_to_capture adds req_to_token_pool.size).
        TRT-LLM with enable_padding: [1, 2, 4] + range(8, 129, 8) + the powers of two from 256 below max, +
        max (default 128), capped by max_batch_size, which is then captured itself.
        """
        if sizes is not None:
            listed = list(sizes)
            top = max(listed)
        elif self.capture_rule == "vllm":
            top = max_size if max_size is not None else min(2 * max_num_seqs, 512)
            listed = [1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)]
        elif self.capture_rule == "sglang":
            top = max_size if max_size is not None else self.cuda_graph_max_bs(gpu, tp)
            listed = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, top + 1, 32)]
        else:
            top = max_size if max_size is not None else TRTLLM_DEFAULT_GRAPH_MAX
            listed = [1, 2, 4, *range(8, 129, 8), *(2**i for i in range(8, 14) if 2**i < top)]
        if self.capture_rule == "vllm":
            limit = min(top, max_num_batched_tokens)
        else:
            limit = min(top, max_num_seqs, max_num_batched_tokens)
            listed.append(limit)     # the largest size, or the largest batch the engine can run below it
        out = tuple(sorted({s for s in listed if s <= limit}))
        return out if out else (1,)


def _sglang_tier(gpu: GPUSpec) -> tuple[float, int, int, int]:
    """The SGLANG_MEMORY_TIERS row of ``gpu``."""
    mem_gib = gpu.tier_bytes / _GIB
    return next(t for t in SGLANG_MEMORY_TIERS if mem_gib < t[0])


def list_engines() -> list[str]:
    """Names of the shipped engine profiles."""
    return sorted(p.stem for p in ENGINE_DIR.glob("*.yaml"))


@functools.cache
def load_engine(name: str) -> EngineProfile:
    """Load an engine profile by name; unknown names raise ValueError listing the valid ones."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    key = {"tensorrtllm": "trtllm", "trt": "trtllm"}.get(key, key)
    path = ENGINE_DIR / f"{key}.yaml"
    if not path.is_file():
        raise unknown_name("engine", name, list_engines())
    return engine_from_yaml(path)


def engine_from_yaml(path: Path) -> EngineProfile:
    """An engine profile from one YAML mapping, every field checked against EngineProfile's: an unknown
    field, or a number written so that YAML reads it as text (``1e-10``; YAML wants ``1.0e-10``), is an
    error naming the file and the field."""
    raw = read_yaml(path)
    raw["version"] = str(raw.get("version", ""))
    fields = attrs.fields_dict(EngineProfile)
    for key, value in raw.items():
        f = fields.get(key)
        if f is None:
            raise ValueError(f"{path}: unknown field {key!r}; valid: {', '.join(fields)}")
        default = f.default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"{path}: {key} must be true or false, got {value!r}")
        elif isinstance(default, (int, float)) and not is_number(value):
            raise ValueError(f"{path}: {key} must be a number, got {value!r} (YAML reads 1e-10 as text: "
                             f"write 1.0e-10)")
    try:
        return EngineProfile(**raw)
    except ValueError as exc:   # the profile's own checks: name the file and the field's line too
        raise located(path, exc, fields) from None
