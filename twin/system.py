"""System kinds: how many workers of which shape. ``colocated``: N replicas, prefill and decode together."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import attrs

from hardware import CostModel, Deployment, DeploymentError, load_engine, load_model
from hardware.engine import EngineProfile
from hardware.gpu import spec_fields
from hardware._data import read_yaml
from hardware.calibration import (BORROWED_MOE_KERNELS, CURVE_MOE_KERNELS, Calibration,
                                  borrowed_moe_calibration, calibration_archs, calibration_for,
                                  calibration_from_dict)
from twin.config import SpeculativeConfig, SystemSpec, TwinConfig, non_negative, positive
from twin.core.errors import ConfigError
from twin.core.kv_cache import HostTier, KVCacheManager
from twin.registry import register
from twin.core.request import Request
from twin.core.scheduler import Drafter, Scheduler, SchedulerLimits

if TYPE_CHECKING:
    import simpy

    from twin.router import RoutedWorker, Router
    from twin.shell.worker import Worker


def make_deployment(config: TwinConfig, tp: int, gpu: str | None = None, *, ep: int = 1,
                    attention_dp: int = 1, redundant_experts: int = 0, where: str = "system") -> Deployment:
    """The hardware model's view of one worker; hardware errors become config errors naming the field
    (the worker's own under ``where``, the system section it is built from, or the model's or engine's)."""
    dtypes = {k: v for k, v in (("weight_dtype", config.model.weight_dtype), ("kv_dtype", config.model.kv_dtype))
              if v != "auto"}
    parallel: dict[str, int] = {"ep": ep}
    if attention_dp != 1:
        parallel["attn_dp"] = attention_dp
    if redundant_experts:
        parallel["redundant_experts"] = redundant_experts
    model = load_model(config.model.name)
    if config.model.unquantised is not None:
        model = attrs.evolve(model, unquantised=frozenset(config.model.unquantised))
    if config.engine.max_model_len is not None and config.engine.max_model_len > model.context_length:
        raise ConfigError("engine.max_model_len", f"{config.engine.max_model_len} is more than {model.name}'s "
                                                  f"context length, {model.context_length}")
    spec = config.engine.speculative
    if spec.enabled:
        if not model.mtp_layers:
            raise ConfigError("engine.speculative.method", f"{spec.method!r} drafts with the model's next-token-"
                              f"prediction module, and {model.name} has none "
                              f"(no num_nextn_predict_layers / mtp_num_hidden_layers)")
        parallel["spec_tokens"] = spec.num_speculative_tokens
    engine = load_engine(config.engine.name).for_version(config.engine.version)
    if spec.enabled and engine.host_overlap and not drafting_overlap(engine, spec):
        engine = attrs.evolve(engine, host_overlap=False)   # the engine as launched: no overlap while drafting
    try:
        dep = Deployment(gpu=config.hardware.spec(gpu), model=model,
                         engine=engine, tp=tp, moe_kernel=config.engine.moe_kernel,
                         moe_routing=config.model.moe_routing, sampling=config.engine.sampling,
                         fp32_matmul=config.engine.float32_matmul,
                         **parallel, **dtypes)  # type: ignore[arg-type]
        if dep.moe_kernel == "default" and dep.model.is_moe:   # the kernel the engine selects by itself
            chosen = dep.engine.default_moe_kernel(dep.gpu, model.model_type, dep.weight_dtype, dep.attn_dp)
            if chosen != "default":
                dep = attrs.evolve(dep, moe_kernel=chosen)
    except DeploymentError as exc:
        raise ConfigError(_deployment_field(exc.field, where), str(exc)) from None
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise ConfigError(where, str(exc)) from None
    try:
        if dep.model.is_moe and dep.moe_kernel in CURVE_MOE_KERNELS:
            constants(config, dep).moe_for(dep.weight_dtype, dep.moe_kernel)
        if dep.model.is_moe and dep.moe_kernel in BORROWED_MOE_KERNELS and moe_constants(config, dep) is None:
            borrowed_moe_calibration(dep.moe_kernel, dep.gpu.arch)
    except ValueError as exc:
        raise ConfigError("engine.moe_kernel", str(exc)) from None
    return dep


def constants(config: TwinConfig, dep: Deployment, engine: str | None = None) -> Calibration:
    """The kernel constants a worker is priced with (``hardware.constants``): its GPU architecture's fitted
    set, another architecture's, or the engine's set in a folder of the user's own fits. ``engine``: another
    engine's set under the same choice (the owner of a borrowed MoE kernel)."""
    choice, name = config.hardware.constants, engine or dep.engine.name
    if choice in ("auto", dep.gpu.arch):
        return calibration_for(name, dep.gpu.arch)
    if choice in ("hopper", *calibration_archs()):
        return calibration_for(name, choice)
    path = Path(choice) / f"{name}.yaml"
    if not path.is_file():
        path = Path(choice) / "default.yaml"
    if not path.is_file():
        raise ConfigError("hardware.constants", f"{choice} holds no {name}.yaml (nor default.yaml)")
    try:
        return calibration_from_dict(str(path), read_yaml(path))
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError("hardware.constants", f"{path}: {exc}") from None


def moe_constants(config: TwinConfig, dep: Deployment) -> Calibration | None:
    """The set a borrowed MoE kernel family is priced with (hardware.calibration.BORROWED_MOE_KERNELS): its
    owner's for the GPU's architecture, or under another choice of ``hardware.constants`` the owner's set of
    that choice (a Blackwell kernel priced with Hopper constants takes the owner's Hopper default curve, as
    a transfer test asks); None for every other kernel."""
    if not (dep.model.is_moe and dep.moe_kernel in BORROWED_MOE_KERNELS):
        return None
    if config.hardware.constants in ("auto", dep.gpu.arch):
        return None   # (CostModel takes the owner's set for the architecture)
    return constants(config, dep, BORROWED_MOE_KERNELS[dep.moe_kernel])


def drafting_overlap(engine: EngineProfile, spec: SpeculativeConfig) -> bool:
    """Whether ``engine`` hides its host work under the GPU's while it drafts: its overlap scheduler, kept
    under speculative decoding by its rule (EngineProfile.speculative_overlap) unless the config says."""
    return engine.host_overlap and (engine.speculative_overlap if spec.overlap is None else spec.overlap)


def _deployment_field(field: str, where: str) -> str:
    """The config field that set a :class:`Deployment` field."""
    own = {"tp": "tp", "pp": "pp", "ep": "ep", "attn_dp": "attention_dp",
           "redundant_experts": "redundant_experts"}
    if field in own:
        return f"{where}.{own[field]}"
    return {"weight_dtype": "model.weight_dtype", "kv_dtype": "model.kv_dtype", "moe_routing": "model.moe_routing",
            "moe_kernel": "engine.moe_kernel", "sampling": "engine.sampling",
            "fp32_matmul": "engine.float32_matmul", "gpu": "hardware.gpu",
            "spec_tokens": "engine.speculative.num_speculative_tokens"}.get(field, where)


def kv_blocks(config: TwinConfig, dep: Deployment, override: int | None = None, *,
              max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
              where: str = "system") -> int:
    """Blocks per worker: an override (a pool's own, ``where``.num_blocks, else ``kv_cache.num_blocks``),
    which must fit beside the weights, or derived from memory.

    The memory left for KV depends on the worker's own step limits (its activation peak, SGLang's chunk
    size): a pool's ``max_num_batched_tokens`` / ``max_num_seqs`` where given, else the config's (a prefill
    pool with a larger token budget used to be sized as if it had the config's)."""
    assert config.kv_cache.block_size is not None
    tokens = max_num_batched_tokens or config.scheduler.max_num_batched_tokens
    seqs = max_num_seqs or config.scheduler.max_num_seqs
    given, field = (override, f"{where}.num_blocks") if override is not None else \
        (config.kv_cache.num_blocks, "kv_cache.num_blocks")
    if given is not None:
        # The engines take a block count override as given (vLLM's num_gpu_blocks_override) and fail when
        # allocating it; a count past what the GPU holds beside the weights is a result of a deployment that
        # cannot exist.
        try:
            room = dep.kv_capacity_blocks(config.kv_cache.block_size, 1.0, max_num_batched_tokens=tokens,
                                          max_num_seqs=seqs)
        except ValueError as exc:
            raise ConfigError(field, f"{given:,} blocks set, but {exc}") from None
        if given > room:
            per = dep.bytes_per_block(config.kv_cache.block_size)
            raise ConfigError(field, f"{given:,} blocks of {per / 2**20:.3g} MiB ({given * per / 2**30:,.1f} GiB) do "
                                     f"not fit on {dep.gpu.name} beside {dep.model.name}'s weights "
                                     f"({dep.weight_bytes_per_gpu / 2**30:,.1f} GiB per GPU): at most {room:,} "
                                     f"blocks with all of its {dep.gpu.hbm_bytes / 2**30:,.1f} GiB")
        return given
    fraction = config.kv_cache.gpu_memory_utilization
    try:
        if fraction is None:   # the engine derives it per deployment (SGLang's mem_fraction_static heuristic)
            e = config.engine
            graphs = e.cuda_graph_max_size or (max(e.cuda_graph_sizes) if e.cuda_graph_sizes else None)
            fraction = dep.default_memory_fraction(max_num_batched_tokens=tokens, cuda_graph_max_bs=graphs)
        return dep.kv_capacity_blocks(config.kv_cache.block_size, fraction, max_num_batched_tokens=tokens,
                                      max_num_seqs=seqs)
    except ValueError as exc:
        raise ConfigError("kv_cache", str(exc)) from None


BLOCK_STATE_BYTES = 20
"""Simulator memory per KV block, used or not (measured: 0.56 MB per vLLM H100 worker of 27,792 blocks)."""
MAX_RUN_BLOCKS = 500_000_000
"""The most KV blocks all of a run's workers hold together, about 10 GiB at :data:`BLOCK_STATE_BYTES` (a
million colocated H100 replicas, 2.8e10 blocks, ran out of memory without a word)."""


def check_run_blocks(pools: list[tuple[str, int, int]]) -> None:
    """Refuse a run whose pools (field naming the worker count, workers, blocks per worker) hold more than
    :data:`MAX_RUN_BLOCKS` blocks together, naming the largest pool's field."""
    total = sum(workers * blocks for _, workers, blocks in pools)
    if total > MAX_RUN_BLOCKS:
        where, workers, blocks = max(pools, key=lambda p: p[1] * p[2])
        raise ConfigError(where, f"{total:,} KV blocks over the run's workers ({workers:,} workers of {blocks:,} "
                                 f"in the largest pool), about {total * BLOCK_STATE_BYTES / 2**30:.0f} GiB of "
                                 f"simulator memory; at most {MAX_RUN_BLOCKS:,}: fewer workers, or a larger "
                                 f"kv_cache.block_size")


def worker_max_num_seqs(config: TwinConfig, dep: Deployment, num_blocks: int,
                        override: int | None = None, where: str | None = None) -> int:
    """A worker's running-request cap: its pool's setting, else the config's, else what the engine derives
    from the worker's KV pool (SGLang's max_running_requests rule, EngineProfile.pool_max_num_seqs).

    ``where`` is the worker's pool section (``system.decode``) where it has one: when nothing can be derived
    the error names that pool's field, as the pool's own blocks were too few (naming only
    ``scheduler.max_num_seqs`` sent a user with a tiny decode pool to the setting of every pool)."""
    if override is not None:
        return override
    if config.scheduler.max_num_seqs is not None:
        return config.scheduler.max_num_seqs
    assert config.kv_cache.block_size is not None
    seqs = dep.engine.pool_max_num_seqs(num_blocks * config.kv_cache.block_size, dep.model.context_length)
    if seqs is None or seqs < 1:
        field, whose, also = "scheduler.max_num_seqs", "a", ""
        if where is not None:
            field, whose = f"{where}.max_num_seqs", f"a {where.rsplit('.', 1)[-1]} worker's"
            also = " (or scheduler.max_num_seqs, for every pool)"
        raise ConfigError(field, f"{dep.engine.name} derives no running-request cap from {whose} pool of "
                                 f"{num_blocks} KV block{'s' if num_blocks != 1 else ''}; set it{also}")
    return seqs


def build_scheduler(config: TwinConfig, num_blocks: int, dep: Deployment, *, max_num_seqs: int | None = None,
                    max_num_batched_tokens: int | None = None, retain_finished_kv: bool = False) -> Scheduler:
    """A worker's (or an attention-DP rank's) scheduler; with fast-forward on and no speculative decoding its
    decodes may form a lazy cohort (twin.core.decode_cohort)."""
    s = config.scheduler
    assert s.max_num_batched_tokens is not None and s.mixed_prefill is not None
    assert s.reserve_full_kv is not None
    assert config.kv_cache.block_size is not None
    limits = SchedulerLimits(max_num_batched_tokens=max_num_batched_tokens or s.max_num_batched_tokens,
                             max_num_seqs=worker_max_num_seqs(config, dep, num_blocks, max_num_seqs),
                             long_prefill_token_threshold=s.long_prefill_token_threshold,
                             chunked_prefill=s.chunked_prefill,
                             mixed_prefill=s.mixed_prefill,
                             reserve_full_kv=s.reserve_full_kv,
                             admission_reserve=s.admission_reserve or "none",
                             preemption=s.preemption or "vllm",
                             max_model_len=config.engine.max_model_len or dep.model.context_length,
                             batch_wait_iters=s.batch_wait_iters,
                             batch_wait_max_tokens_ratio=s.batch_wait_max_tokens_ratio,
                             recv_interval=s.recv_interval,
                             lookahead=dep.engine.host_overlap,
                             # vLLM's async scheduling is modelled for mixed steps without speculative
                             # decoding (SchedulerLimits.async_output); otherwise the plain lookahead
                             async_output=dep.engine.host_overlap and dep.engine.async_output
                             and s.mixed_prefill and not config.engine.speculative.enabled)
    kv = KVCacheManager(num_blocks, config.kv_cache.block_size, config.kv_cache.prefix_caching,
                        host_tier(config, dep), keep_duplicates=dep.engine.cache_duplicate_blocks,
                        state_blocks=dep.state_blocks_per_request(config.kv_cache.block_size))
    spec = config.engine.speculative
    if spec.enabled and limits.max_num_batched_tokens < 1 + spec.num_speculative_tokens:
        raise ConfigError("scheduler.max_num_batched_tokens",
                          f"{limits.max_num_batched_tokens} tokens per step cannot hold one speculative decode "
                          f"(1 + num_speculative_tokens = {1 + spec.num_speculative_tokens} tokens)")
    drafter = Drafter(spec.acceptance_rates, config.run.seed) if spec.enabled else None
    return Scheduler(limits, kv, s.policy, record_token_times=config.metrics.record_token_times,
                     retain_finished_kv=retain_finished_kv, lazy_decodes=config.run.fast_forward and drafter is None,
                     drafter=drafter)


def host_tier(config: TwinConfig, dep: Deployment) -> HostTier | None:
    """The worker's host KV tier: capacity from host memory, load time per block from the host link."""
    kvc = config.kv_cache
    if kvc.host_memory_gib is None:
        return None
    assert kvc.block_size is not None
    per_gpu = dep.bytes_per_block(kvc.block_size)
    capacity = int(kvc.host_memory_gib * 2**30 // (per_gpu * dep.tp))
    if capacity < 1:
        raise ConfigError("kv_cache.host_memory_gib", f"{kvc.host_memory_gib} GiB holds no KV block "
                                                     f"({per_gpu * dep.tp} bytes each)")
    bw = kvc.host_bandwidth_GBps * 1e9 if kvc.host_bandwidth_GBps is not None else dep.gpu.host_bw_Bps
    return HostTier(capacity, per_gpu / bw)


def fast_forward_steps(config: TwinConfig) -> int:
    """Most decode steps a worker jumps at once (0: step by step)."""
    if not config.run.fast_forward:
        return 0
    return config.run.fast_forward_max_steps


def cost_model(config: TwinConfig, dep: Deployment, *, max_num_seqs: int | None = None,
               max_num_batched_tokens: int | None = None) -> CostModel:
    """The step prices of one worker: its CUDA graphs are captured for its scheduler limits (a pool's own
    ``max_num_seqs`` / ``max_num_batched_tokens`` where given, else the config's), as the engine does."""
    s, e = config.scheduler, config.engine
    try:
        return CostModel(dep, disabled_terms=frozenset(config.hardware.disabled_terms),
                         calibration=constants(config, dep), moe_calibration=moe_constants(config, dep),
                         max_num_seqs=max_num_seqs or s.max_num_seqs,
                         max_num_batched_tokens=max_num_batched_tokens or s.max_num_batched_tokens,
                         graph_mode=e.cuda_graph_mode, max_capture_size=e.cuda_graph_max_size,
                         capture_sizes=e.cuda_graph_sizes)
    except ValueError as exc:
        raise ConfigError("hardware.disabled_terms", str(exc)) from None


class ColocatedSystem:
    """Identical engines behind one router; each serves prefill and decode in the same batches.

    ``workers`` are what the run reports on (gauges, ledgers, stalls), in id order; ``engines`` what the
    router chooses among: the workers themselves, or attention-DP groups of them (twin.shell.attention_dp)."""

    def __init__(self, workers: Sequence[Worker], router: Router,
                 engines: Sequence[RoutedWorker] | None = None) -> None:
        self.workers = workers
        self.router = router
        self.engines = engines if engines is not None else workers

    def submit(self, req: Request) -> None:
        self.router.choose(req, self.engines).submit(req)  # type: ignore[attr-defined]

    def abort(self, req: Request, reason: str) -> None:
        """Drop a submitted request at its worker's next step boundary (nothing if it has ended)."""
        if not req.is_done and req.worker is not None:
            self.workers[req.worker].abort(req, reason)

    def gauges(self) -> dict[str, float]:
        return {}

    def summary(self) -> dict[str, Any]:
        return {}


@register("system", "colocated")
@attrs.frozen(kw_only=True)
class Colocated(SystemSpec):
    """``replicas`` identical engines, each on ``tp`` GPUs, behind the router."""

    replicas: int = attrs.field(default=1, validator=positive)
    """Identical engines behind the router (data-parallel replicas), each on tp x attention_dp GPUs."""
    tp: int = attrs.field(default=1, validator=positive)
    """Tensor-parallel GPUs per engine (vLLM --tensor-parallel-size, SGLang --tp-size, TensorRT-LLM
    tensor_parallel_size)."""
    ep: int = attrs.field(default=1, validator=positive)
    """Expert parallelism of MoE layers."""
    attention_dp: int = attrs.field(default=1, validator=positive)
    """Data-parallel attention ranks (SGLang / TRT-LLM DP attention, vLLM DP of MoE models): tp x attention_dp
    GPUs per engine; each rank holds its own requests and KV pool, and the ranks step in lockstep
    (twin.shell.attention_dp)."""
    redundant_experts: int = attrs.field(default=0, validator=non_negative)
    """Redundant expert slots of every MoE layer (expert-parallel load balancing: SGLang
    ``--ep-num-redundant-experts``, TensorRT-LLM ``load_balancer.num_slots`` - experts): routed experts + this
    must split evenly over ep; hardware.Deployment.redundant_experts says how they are priced."""

    def build(self, env: simpy.Environment, config: TwinConfig,
              on_done: Callable[[Request], None]) -> ColocatedSystem:
        from twin.config import TransferConfig
        from twin.core.prices import StepPrices
        from twin.shell.worker import Worker

        for field in attrs.fields(TransferConfig):  # (each was ignored without a word)
            if getattr(config.transfer, field.name) != field.default:
                raise ConfigError(f"transfer.{field.name}", "the KV hand-off between prefill and decode workers: "
                                  "set only for system.kind disaggregated (this system is colocated)")
        dep = make_deployment(config, self.tp, ep=self.ep, attention_dp=self.attention_dp,
                              redundant_experts=self.redundant_experts)
        blocks = kv_blocks(config, dep)
        dp = self.attention_dp
        check_run_blocks([("system.replicas", self.replicas * dp, blocks)])
        seqs = worker_max_num_seqs(config, dep, blocks)
        prices = StepPrices(cost_model(config, dep, max_num_seqs=seqs))
        router = config.router.build()  # type: ignore[attr-defined]
        if config.scheduler.attention_dp_balance and dp == 1:
            raise ConfigError("scheduler.attention_dp_balance", "balances prompts over attention-DP ranks: it needs "
                                                                "system.attention_dp > 1 (this engine has 1 rank)")
        if config.scheduler.recv_interval > 1 and dp > 1:
            raise ConfigError("scheduler.recv_interval", "the input queue's receive interval is modelled for one "
                                                         "scheduler per engine: it needs system.attention_dp 1")
        if dp == 1:
            workers = [Worker(env, wid, build_scheduler(config, blocks, dep, max_num_seqs=seqs), prices, on_done,
                              fast_forward_steps=fast_forward_steps(config))
                       for wid in range(self.replicas)]
            return ColocatedSystem(workers, router)
        from twin.shell.attention_dp import AdpBalance, RankWorker, group_ranks

        s = config.scheduler
        balance = (AdpBalance(s.attention_dp_timeout_iters, s.attention_dp_batching_wait_iters)
                   if s.attention_dp_balance else None)
        ranks = [RankWorker(env, wid, build_scheduler(config, blocks, dep, max_num_seqs=seqs), prices,
                            on_done)
                 for wid in range(self.replicas * dp)]
        groups = group_ranks(env, ranks, dp, dep.engine.dp_balancer, fast_forward_steps(config), balance)
        return ColocatedSystem(list(ranks), router, engines=groups)


def resolve(config: TwinConfig) -> TwinConfig:
    """The config with every engine default filled in for the chosen GPU (a new object; nothing mutated)."""
    engine = load_engine(config.engine.name)
    gpu = config.hardware.spec()
    s = config.scheduler
    scheduler = attrs.evolve(
        s,
        max_num_batched_tokens=s.max_num_batched_tokens or engine.default_max_num_batched_tokens(gpu),
        # SGLang derives it from each worker's KV pool (worker_max_num_seqs): left unset here.
        max_num_seqs=s.max_num_seqs or (None if engine.derives_max_num_seqs
                                        else engine.default_max_num_seqs(gpu)),
        mixed_prefill=engine.mixed_prefill if s.mixed_prefill is None else s.mixed_prefill,
        reserve_full_kv=engine.reserve_full_kv if s.reserve_full_kv is None else s.reserve_full_kv,
        admission_reserve=s.admission_reserve or engine.admission_reserve,
        preemption=s.preemption or engine.preemption,
    )
    kv = config.kv_cache
    kv_cache = attrs.evolve(
        kv,
        block_size=kv.block_size or engine.default_block_size(gpu, load_model(config.model.name).model_type),
        gpu_memory_utilization=kv.gpu_memory_utilization or (
            engine.gpu_memory_utilization if engine.memory_fraction_rule == "fixed" else None),
    )
    # Every datasheet value of the named GPU is written out, so the config shows the spec the factors apply to.
    hardware = attrs.evolve(config.hardware, **spec_fields(config.hardware.spec(scaled=False)))
    speculative = config.engine.speculative
    if speculative.enabled and speculative.overlap is None:   # the engine's rule, written out
        speculative = attrs.evolve(speculative, overlap=drafting_overlap(engine, speculative))
    return attrs.evolve(config, hardware=hardware, scheduler=scheduler, kv_cache=kv_cache,
                        engine=attrs.evolve(config.engine, speculative=speculative))
