"""Prefill/decode disaggregation with staged KV, consumer-driven delta pulls and leases (DESIGN section 5).

A client request first runs on a prefill worker as a one-output-token stage. When that stage finishes,
its blocks are not freed: the KV is STAGED on the prefill worker and keeps occupying its memory. The
decode router picks a decode worker, which pulls from its wait queue in its own order (FCFS) only when it
can reserve the request's blocks (minus those it already caches: a delta pull) plus a headroom; the
transfer then crosses the links (max-min fair sharing), and on arrival the prefill side releases its
blocks (they stay cached there) and the request joins the decode worker's running batch. So decode memory
pressure keeps KV staged, staged KV fills prefill memory, and the prefill worker stops admitting: the
backpressure reaches the prefill queue and the clients. A lease bounds the staging: expired KV is dropped
and the decode worker recomputes the prompt itself. ``transfer.kind: push`` is the pipeline-cut ablation.
"""

from __future__ import annotations

import functools
from collections import deque
from typing import Any, Callable

import attrs
import numpy as np
import simpy

from hardware import Deployment
from hardware.engine import TRANSFER_BUFFER_BYTES
from twin.config import (RouterSpec, SystemSpec, TransferConfig, TwinConfig, non_negative, pool_blocks,
                         positive)
from twin.shell.attention_dp import Rank, group_ranks
from twin.core.errors import ConfigError
from twin.core.kv_cache import cdiv
from twin.core.lifecycle import KVRecord, KVState
from twin.core.flows import FlowNetwork
from twin.shell.links import LinkSet
from twin.registry import register
from twin.core.request import NO_TIME, Request, Status
from twin.results import stats
from twin.core.scheduler import Scheduler
from twin.router import LeastLoadedSpec, Router
from twin.shell.sim import ProcessGen, now_ns, to_ns
from twin.system import (build_scheduler, check_run_blocks, cost_model, fast_forward_steps, kv_blocks,
                         make_deployment, worker_max_num_seqs)
from twin.core.prices import StepPrices
from twin.shell.worker import Worker


@attrs.frozen(kw_only=True)
class PoolConfig:
    """One pool of identical engines (prefill or decode). An engine with ``attention_dp`` > 1 is that many
    ranks of ``tp`` GPUs each, stepping in lockstep (twin.shell.attention_dp); the routers send requests to its ranks."""

    workers: int = attrs.field(default=1, validator=positive)
    """Engines in this pool, each on tp x attention_dp GPUs."""
    tp: int = attrs.field(default=1, validator=positive)
    """Tensor-parallel GPUs per engine of this pool (Colocated.tp)."""
    ep: int = attrs.field(default=1, validator=positive)
    """Expert parallelism of MoE layers on this pool's engines (Colocated.ep)."""
    attention_dp: int = attrs.field(default=1, validator=positive)
    """Data-parallel attention ranks per engine of this pool (Colocated.attention_dp)."""
    redundant_experts: int = attrs.field(default=0, validator=non_negative)
    """Redundant expert slots of every MoE layer on this pool's engines (Colocated.redundant_experts)."""
    gpu: str | None = None
    """GPU of this pool; default ``hardware.gpu``."""
    num_blocks: int | None = attrs.field(default=None, validator=pool_blocks)
    """KV blocks per worker of this pool (default: derived from memory, or ``kv_cache.num_blocks``)."""
    max_num_seqs: int | None = attrs.field(default=None, validator=positive)
    """Running requests per worker of this pool (null: scheduler.max_num_seqs, or where that is null what the
    engine derives from this pool's KV pool); it also sizes the pool's KV memory and CUDA graphs."""
    max_num_batched_tokens: int | None = attrs.field(default=None, validator=positive)
    """Tokens per step of this pool's workers (null: scheduler.max_num_batched_tokens); it also sizes the
    pool's KV memory and CUDA graphs."""


class _Pending:
    """A request whose KV is staged on a prefill worker, waiting in a decode worker's pull queue."""

    __slots__ = ("req", "stage", "prefill")

    def __init__(self, req: Request, stage: Request, prefill: Worker) -> None:
        self.req = req
        self.stage = stage
        self.prefill = prefill


class DecodeWorker(Worker):
    """A decode worker: its pull queue is served at every step boundary, before scheduling."""

    def __init__(self, system: DisaggSystem, env: simpy.Environment, wid: int, scheduler: Scheduler,
                 prices: StepPrices, on_done: Callable[[Request], None]) -> None:
        self.system = system
        self.pull_queue: deque[_Pending] = deque()
        super().__init__(env, wid, scheduler, prices, on_done, before_schedule=self.start_pulls,
                         fast_forward_steps=fast_forward_steps(system.config))

    @property
    def pulls_in_flight(self) -> int:
        """Pulls started and not yet arrived: each holds a seat in the scheduler, which its admission of
        queued requests (a lease ran out: recomputed here) leaves free."""
        return self.sched.held_seats

    @pulls_in_flight.setter
    def pulls_in_flight(self, n: int) -> None:
        self.sched.held_seats = n

    def quiet(self) -> bool:
        return not self.pull_queue and super().quiet()

    def load(self) -> int:
        return super().load() + len(self.pull_queue) + self.pulls_in_flight

    def start_pulls(self) -> None:
        self.system.start_pulls(self)


class PrefillRank(Rank, Worker):
    """A prefill worker that is one rank of an attention-DP engine (twin.shell.attention_dp)."""


class DecodeRank(Rank, DecodeWorker):
    """A decode worker that is one rank of an attention-DP engine: its group starts its pulls at every step
    boundary (``before_schedule``) and steps it with the other ranks."""


class DisaggSystem:
    """Prefill and decode pools, their routers, the links between them and every request's KV record."""

    def __init__(self, env: simpy.Environment, config: TwinConfig, spec: Disaggregated,
                 on_done: Callable[[Request], None]) -> None:
        self.env = env
        self.config = config
        self.tcfg: TransferConfig = config.transfer
        if self.tcfg.kind == "push" and self.tcfg.max_handoffs_per_s is not None:  # (it was ignored without a word)
            raise ConfigError("transfer.max_handoffs_per_s", "paces the pulls of decode workers; transfer.kind "
                              "push sends each request's KV as its prefill ends, unpaced: set it only with "
                              "kind pull")
        if config.scheduler.attention_dp_balance:
            raise ConfigError("scheduler.attention_dp_balance", "the attention-DP balance is modelled for "
                              "colocated engines only (a disaggregated pool's ranks are routed to one by one)")
        if config.scheduler.recv_interval > 1:
            raise ConfigError("scheduler.recv_interval", "the input queue's receive interval is modelled for "
                              "colocated engines only")
        self.on_done = on_done
        assert config.kv_cache.block_size is not None
        self.block_size = config.kv_cache.block_size
        self.p_dep = make_deployment(config, spec.prefill.tp, spec.prefill.gpu, ep=spec.prefill.ep,
                                     attention_dp=spec.prefill.attention_dp,
                                     redundant_experts=spec.prefill.redundant_experts, where="system.prefill")
        self.d_dep = make_deployment(config, spec.decode.tp, spec.decode.gpu, ep=spec.decode.ep,
                                     attention_dp=spec.decode.attention_dp,
                                     redundant_experts=spec.decode.redundant_experts, where="system.decode")
        self._gpu_block_bytes = self.p_dep.bytes_per_block(self.block_size)
        """Bytes of one KV block on one of a prefill worker's GPUs (its share of a hand-off)."""
        self._block_bytes = self._gpu_block_bytes * self.p_dep.tp
        """Bytes of one KV block over all of a prefill worker's GPUs (what a transfer moves per block)."""
        self._state_bytes = self.p_dep.state_bytes_per_request * self.p_dep.tp
        """A request's constant state (recurrent / conv state, sliding windows: KVCacheManager.state_blocks),
        sent with its KV however many blocks the decode worker already holds: the state after the prompt is
        the prefill worker's alone."""
        self._layers = self.p_dep.layers_per_gpu
        self._pieces = self.tcfg.pieces or self.p_dep.engine.kv_transfer_pieces
        p_blocks, p_seqs, p_prices = self._pool_sizes(self.p_dep, spec.prefill, "system.prefill")
        d_blocks, d_seqs, d_prices = self._pool_sizes(self.d_dep, spec.decode, "system.decode")
        p_dp, d_dp = spec.prefill.attention_dp, spec.decode.attention_dp
        check_run_blocks([("system.prefill.workers", spec.prefill.workers * p_dp, p_blocks),
                          ("system.decode.workers", spec.decode.workers * d_dp, d_blocks)])
        # An engine with attention DP is dp ranks in lockstep (twin.shell.attention_dp), each a worker the routers see.
        p_kind: type[Worker] = Worker if p_dp == 1 else PrefillRank
        self.prefill = [
            p_kind(env, i, build_scheduler(config, p_blocks, self.p_dep, max_num_seqs=p_seqs,
                                           max_num_batched_tokens=spec.prefill.max_num_batched_tokens,
                                           retain_finished_kv=True), p_prices, self._prefill_done,
                   fast_forward_steps=fast_forward_steps(config))
            for i in range(spec.prefill.workers * p_dp)]
        base = len(self.prefill)
        d_kind = DecodeWorker if d_dp == 1 else DecodeRank
        self.decode = [
            d_kind(self, env, base + i,
                   build_scheduler(config, d_blocks, self.d_dep, max_num_seqs=d_seqs,
                                   max_num_batched_tokens=spec.decode.max_num_batched_tokens),
                   d_prices, self._decode_done)
            for i in range(spec.decode.workers * d_dp)]
        self.workers: list[Worker] = [*self.prefill, *self.decode]
        self.groups = [g for pool, dp, dep in ((self.prefill, p_dp, self.p_dep), (self.decode, d_dp, self.d_dep))
                       if dp > 1 for g in group_ranks(env, pool, dp, dep.engine.dp_balancer,
                                                      fast_forward_steps(config))]
        self.prefill_router: Router = config.router.build()  # type: ignore[attr-defined]
        self.decode_router: Router = spec.decode_router.build()  # type: ignore[attr-defined]
        self._place(spec)
        self.links = LinkSet(env, FlowNetwork(self._capacities()))
        self._next_handoff_ns: dict[int, int] = {}
        self._pacing_wake: set[int] = set()
        self.records: list[KVRecord] = []
        self.pulls = self.pushes = self.lease_expiries = self.dropped = 0
        self._stages: dict[int, Request] = {}
        """Prefill stages in progress, by request id (for :meth:`abort`)."""
        self._aborting: dict[int, str] = {}
        """Aborted requests not yet dropped (by id, with the reason): in their prefill step, whose stage may
        end in that step and stage the KV after all, or with their KV crossing a link, until it lands."""
        self.bytes_moved = 0

    def _pool_sizes(self, dep: Deployment, pool: PoolConfig, where: str) -> tuple[int, int, StepPrices]:
        """A pool's KV blocks per worker, running-request cap and step prices, from its own step limits
        where it sets them (else the config's)."""
        config = self.config
        blocks = kv_blocks(config, dep, pool.num_blocks, max_num_seqs=pool.max_num_seqs,
                           max_num_batched_tokens=pool.max_num_batched_tokens, where=where)
        seqs = worker_max_num_seqs(config, dep, blocks, pool.max_num_seqs, where)
        prices = StepPrices(cost_model(config, dep, max_num_seqs=seqs,
                                       max_num_batched_tokens=pool.max_num_batched_tokens))
        return blocks, seqs, prices

    # ------------------------------------------------------------------------------------ topology
    def _place(self, spec: Disaggregated) -> None:
        """Pack workers onto nodes in order (prefill first), each node holding ``gpus_per_node`` GPUs (default:
        the pool's GPU's scale-up domain).

        An engine takes all its GPUs, tp x attention_dp, on one node (counting tp alone put two such engines on
        a node that holds one, joined by NVLink), its ranks tp each; and pools of two GPU kinds never share a
        node (no NVLink joins an H100 to an H200)."""
        self.node: dict[int, int] = {}
        node = gpu = 0  # the node being filled, and the GPUs taken on it
        kind = None
        for workers, dep, pool in ((self.prefill, self.p_dep, spec.prefill), (self.decode, self.d_dep, spec.decode)):
            per_node = spec.gpus_per_node or dep.gpu.scaleup_domain_gpus
            if kind is not None and dep.gpu.name != kind and gpu:  # another GPU kind starts a node of its own
                node, gpu = node + 1, 0
            kind = dep.gpu.name
            size = dep.gpus
            if size > per_node:
                shape = f"tp={pool.tp}" + (f" x attention_dp={pool.attention_dp} = {size} GPUs"
                                           if pool.attention_dp != 1 else "")
                raise ConfigError("system.gpus_per_node", f"an engine with {shape} does not fit a node of "
                                                          f"{per_node} GPUs")
            dp = pool.attention_dp
            for i in range(0, len(workers), dp):
                if gpu + size > per_node:  # an engine never straddles two nodes
                    node, gpu = node + 1, 0
                for w in workers[i:i + dp]:
                    self.node[w.wid] = node
                gpu += size

    def _capacities(self) -> dict[str, float]:
        eff = self.tcfg.efficiency
        caps: dict[str, float] = {}
        for w, dep in [(w, self.p_dep) for w in self.prefill] + [(w, self.d_dep) for w in self.decode]:
            for kind, per_gpu in (("nvlink", dep.gpu.scaleup_bw_Bps), ("nic", dep.gpu.nic_bw_Bps)):
                caps[f"w{w.wid}.out.{kind}"] = caps[f"w{w.wid}.in.{kind}"] = per_gpu * dep.tp * eff
        return caps

    def _path(self, src: Worker, dst: Worker) -> tuple[str, str]:
        kind = "nvlink" if self.node[src.wid] == self.node[dst.wid] else "nic"
        return (f"w{src.wid}.out.{kind}", f"w{dst.wid}.in.{kind}")

    # ------------------------------------------------------------------------------------- intake
    def submit(self, req: Request) -> None:
        now = now_ns(self.env)
        rec = req.kv = KVRecord(req.id, now)
        self.records.append(rec)
        # Refused on arrival, as a colocated engine refuses it (the prefill stage asks for one output token
        # only, and the KV reaches the decode worker without an admission that would check).
        refusal = self.decode[0].sched.too_long(req)
        if refusal is not None:
            self._fail(req, refusal, now)
            return
        stage = Request(id=req.id, prompt_tokens=req.prompt_tokens, max_output_tokens=1, block_keys=req.block_keys,
                        arrival_ns=now, session=req.session, turn=req.turn, priority=req.priority)
        stage.on_finish = lambda s, req=req: self._staged(req, s)  # type: ignore[misc]
        self._stages[req.id] = stage
        worker = self.prefill_router.choose(stage, self.prefill)  # type: ignore[arg-type]
        rec.prefill_worker = worker.wid  # type: ignore[attr-defined]
        worker.submit(stage)  # type: ignore[attr-defined]

    def _prefill_done(self, stage: Request) -> None:
        assert stage.on_finish is not None
        stage.on_finish(stage)

    def _staged(self, req: Request, stage: Request) -> None:
        """The prefill stage ended: stage its KV (or fail the request), pick the decode worker."""
        now = now_ns(self.env)
        rec = req.kv
        assert rec is not None
        del self._stages[req.id]
        req.queued_ns, req.first_scheduled_ns = stage.queued_ns, stage.first_scheduled_ns
        req.cached_tokens = max(stage.cached_tokens, 0)
        req.host_hit_tokens = stage.host_hit_tokens
        req.preemptions += stage.preemptions
        req.recomputed_tokens += stage.recomputed_tokens
        prefill = self.prefill[rec.prefill_worker]
        aborted = self._aborting.pop(req.id, None) if self._aborting else None
        if stage.status is Status.FAILED:
            self._fail(req, f"prefill: {stage.fail_reason}", now)
            return
        rec.to(KVState.STAGED, now)
        if self.tcfg.first_token == "prefill":
            req.first_token_ns = req.last_token_ns = now
            req.num_output_tokens = 1
            if self.config.metrics.record_token_times:
                req.token_times_ns = [now]
            if req.max_output_tokens == 1:  # that token was the whole answer: nothing to decode
                req.worker = prefill.wid
                self._end_staged(req, prefill, stage, now)
                return
        else:  # the decode worker samples the first token again
            prefill.sched.drop_sampled()
        if aborted is not None:  # aborted during the step that ended its prefill (which gave it any first
            self._end_staged(req, prefill, stage, now, aborted)  # token it samples)
            return
        decode: DecodeWorker = self.decode_router.choose(req, self.decode)  # type: ignore[arg-type,assignment]
        rec.decode_worker = decode.wid
        req.worker = decode.wid
        refusal = decode.sched.unservable(req)
        if refusal is not None:
            self._release(prefill, stage)
            self._fail(req, f"decode: {refusal}", now)
            return
        pending = _Pending(req, stage, prefill)
        if self.tcfg.kind == "push":
            self._push(pending, decode)
            return
        decode.pull_queue.append(pending)
        if self.tcfg.lease_s is not None:
            lease = self.env.timeout(to_ns(self.tcfg.lease_s))
            lease.callbacks.append(functools.partial(self._lease_end, pending, decode))  # type: ignore[union-attr]
        decode.wake()

    def abort(self, req: Request, reason: str) -> None:
        """Drop a submitted request wherever it is (a client went away): its prefill stage or its decode at
        the worker's next step boundary, staged KV at once (freed on the prefill worker), KV in flight once
        it lands. Nothing if it has ended."""
        rec = req.kv
        if req.is_done or rec is None:
            return
        state = rec.state
        if state is KVState.ALLOCATED:  # the prompt is on a prefill worker: the stage fails, and so the request
            self._aborting[req.id] = reason
            self.prefill[rec.prefill_worker].abort(self._stages[req.id], reason)
        elif state is KVState.STAGED:  # in a decode worker's pull queue
            decode = self.decode[rec.decode_worker - len(self.prefill)]
            pending = next(p for p in decode.pull_queue if p.req is req)
            decode.pull_queue.remove(pending)
            self._end_staged(req, pending.prefill, pending.stage, now_ns(self.env), reason)
        elif state is KVState.PULLING or state is KVState.PUSHING:
            self._aborting[req.id] = reason
        else:  # resident on its decode worker, or queued there for recompute after its lease ran out
            self.decode[rec.decode_worker - len(self.prefill)].abort(req, reason)

    def _fail(self, req: Request, reason: str, now: int) -> None:
        assert req.kv is not None
        req.kv.to(KVState.FAILED, now)
        req.status = Status.FAILED
        req.fail_reason = reason
        req.finish_ns = now
        self.on_done(req)

    # -------------------------------------------------------------------------------------- pulls
    def start_pulls(self, decode: DecodeWorker) -> None:
        """Start pulls from the head of ``decode``'s queue while it can reserve their blocks (FCFS)."""
        now = now_ns(self.env)
        sched = decode.sched
        while decode.pull_queue:
            pending = decode.pull_queue[0]
            req = pending.req
            if len(sched.running) + len(sched.waiting) + decode.pulls_in_flight >= sched.limits.max_num_seqs:
                return
            if not self._handoff_allowed(pending.prefill, decode, now):
                return
            known = self._known_tokens(req)
            hits = self._hits(decode, req, known)
            # Headroom for growth, never beyond the request's final size (so an empty worker can always pull).
            grow = min(self.tcfg.decode_headroom_blocks * self.block_size, req.total_tokens - known)
            reserve = known + grow - len(hits) * self.block_size
            if not sched.kv.allocate_slots(req, reserve, hits, cache=False):
                return
            self._handed_off(pending.prefill, now)
            decode.pull_queue.popleft()
            assert req.kv is not None
            req.kv.to(KVState.PULLING, now)
            self.pulls += 1
            decode.pulls_in_flight += 1
            self._pull(pending, decode, len(hits))

    def _known_tokens(self, req: Request) -> int:
        """Tokens whose KV the decode side receives: all but the last prompt token (recomputed there to
        sample the first output), or the whole prompt when the prefill worker returned the first token."""
        return req.prompt_tokens if self.tcfg.first_token == "prefill" else req.prompt_tokens - 1

    def _hits(self, decode: Worker, req: Request, known: int) -> list[int]:
        decode.sync()
        hits = decode.sched.kv.get_computed_blocks(req)
        return hits[: known // self.block_size]

    def _handoff_allowed(self, prefill: Worker, decode: DecodeWorker, now: int) -> bool:
        """Whether the pacing limit lets a transfer leave ``prefill`` now (else ``decode`` is woken when it
        does). Only a pull that starts takes the slot (:meth:`_handed_off`): one that then finds no room
        on the decode worker moved nothing, and charging it would hold the next pull back a whole interval
        after the room appears."""
        rate = self.tcfg.max_handoffs_per_s
        if rate is None:
            return True
        nxt = self._next_handoff_ns.get(prefill.wid, 0)
        if now >= nxt:
            return True
        if decode.wid not in self._pacing_wake:
            self._pacing_wake.add(decode.wid)
            self.env.process(self._wake_at(decode, nxt))
        return False

    def _handed_off(self, prefill: Worker, now: int) -> None:
        """A transfer left ``prefill`` now: the next may leave one pacing interval later."""
        rate = self.tcfg.max_handoffs_per_s
        if rate is not None:
            self._next_handoff_ns[prefill.wid] = now + to_ns(1.0 / rate)

    def _wake_at(self, worker: DecodeWorker, t_ns: int) -> ProcessGen:
        yield self.env.timeout(t_ns - now_ns(self.env))
        self._pacing_wake.discard(worker.wid)
        worker.wake()

    def _descriptors(self, blocks: int) -> int:
        """Transfer descriptors a hand-off of ``blocks`` KV blocks posts on each GPU, as the connector cuts it
        (transfer.pieces, by default the engine's kv_transfer_pieces): one per block per layer, one per
        layer, or one per send buffer-full of the GPU's share."""
        if blocks <= 0:
            return 0
        if self._pieces == "block":
            return blocks * self._layers
        if self._pieces == "layer":
            return self._layers
        return cdiv(blocks * self._gpu_block_bytes, TRANSFER_BUFFER_BYTES)

    def _transfer(self, pending: _Pending, decode: Worker, blocks: int, exposed_fraction: float,
                  then: Callable[[], None]) -> None:
        """Move ``blocks`` KV blocks from the prefill worker to ``decode``: setup and per-descriptor costs,
        then the bytes through the shared links; ``then`` runs when the last byte is in.

        Driven by callbacks on the two waits rather than by a process: a process per transfer costs two
        events more (its start and its end) for nothing a callback cannot do."""
        rec = pending.req.kv
        assert rec is not None
        start = now_ns(self.env)
        nbytes = blocks * self._block_bytes + self._state_bytes
        descriptors = self._descriptors(blocks)
        fixed = self.tcfg.setup_latency_s + descriptors * self.tcfg.per_descriptor_s * exposed_fraction

        def arrived(_: simpy.Event | None = None) -> None:
            rec.transfer_bytes = nbytes
            rec.transfer_blocks = blocks
            rec.transfer_ns = now_ns(self.env) - start
            self.bytes_moved += nbytes
            then()

        def set_up(_: simpy.Event) -> None:
            if nbytes:
                moved = self.links.transfer(("kv", rec.request_id), nbytes * exposed_fraction,
                                            self._path(pending.prefill, decode))
                moved.callbacks.append(arrived)  # type: ignore[union-attr]
            else:
                arrived()

        self.env.timeout(to_ns(fixed)).callbacks.append(set_up)  # type: ignore[union-attr]

    def _pull(self, pending: _Pending, decode: DecodeWorker, num_hits: int) -> None:
        """Transfer the blocks ``decode`` does not hold; on arrival the request joins its running batch."""
        req = pending.req
        rec = req.kv
        assert rec is not None
        blocks = cdiv(self._known_tokens(req), self.block_size) - num_hits
        rec.reused_blocks = num_hits
        exposed = 1.0
        if self.tcfg.layerwise and rec.times_ns[KVState.PULLING] == rec.times_ns[KVState.STAGED]:
            exposed = 1.0 / self._layers

        def arrived() -> None:
            decode.pulls_in_flight -= 1
            self._release_staged(pending)
            self._make_resident(req, decode)

        self._transfer(pending, decode, blocks, exposed, arrived)

    def _make_resident(self, req: Request, decode: Worker) -> None:
        decode.sync()
        now = now_ns(self.env)
        assert req.kv is not None
        req.kv.to(KVState.RESIDENT, now)
        known = self._known_tokens(req)
        req.prefill_tokens = req.num_tokens  # what arrives stands for the prefill on this worker
        decode.sched.kv.cache_computed(req, known)
        req.num_computed_tokens = known
        req.status = Status.RUNNING
        req.queued_ns = req.queued_ns if req.queued_ns != NO_TIME else now
        decode.sched.join_running(req)
        decode.wake()
        if self._aborting:
            reason = self._aborting.pop(req.id, None)
            if reason is not None:
                decode.abort(req, reason)

    def _release_staged(self, pending: _Pending) -> None:
        self._release(pending.prefill, pending.stage)

    @staticmethod
    def _release(prefill: Worker, stage: Request) -> None:
        """The prefill worker lets a stage's KV go (it may admit more prompts now)."""
        prefill.sync()
        prefill.sched.kv.free(stage)
        prefill.wake()

    def _end_staged(self, req: Request, prefill: Worker, stage: Request, now: int,
                    reason: str | None = None) -> None:
        """``req`` ends with its KV staged, which is freed (STAGED -> FREED): finished (the prefill worker
        sampled its only token) or, with a reason, failed (aborted)."""
        self._release(prefill, stage)
        assert req.kv is not None
        req.kv.to(KVState.FREED, now)
        if reason is None:
            req.status = Status.FINISHED
            req.finish_ns = now
        else:
            Scheduler.fail(req, now, reason)
        self.on_done(req)

    # -------------------------------------------------------------------------------- push, lease
    def _push(self, pending: _Pending, decode: DecodeWorker) -> None:
        """Send the whole prompt's KV unasked; on arrival it needs room, or the request fails (dropped)."""
        req = pending.req
        assert req.kv is not None
        req.kv.to(KVState.PUSHING, now_ns(self.env))
        self.pushes += 1
        known = self._known_tokens(req)
        self._transfer(pending, decode, cdiv(known, self.block_size), 1.0, lambda: self._pushed(pending, decode))

    def _pushed(self, pending: _Pending, decode: DecodeWorker) -> None:
        """The pushed KV arrived: the prefill side lets it go, the decode side takes it if it has room."""
        req = pending.req
        assert req.kv is not None
        known = self._known_tokens(req)
        self._release_staged(pending)
        hits = self._hits(decode, req, known)
        sched = decode.sched
        seats = len(sched.running) + len(sched.waiting) < sched.limits.max_num_seqs
        if not seats or not sched.kv.allocate_slots(req, known - len(hits) * self.block_size, hits, cache=False):
            now = now_ns(self.env)
            req.kv.to(KVState.DROPPED, now)
            aborted = self._aborting.pop(req.id, None)  # (the client's abort came first: its reason stands)
            self.dropped += 1
            req.status = Status.FAILED
            req.fail_reason = aborted or (f"pushed KV arrived at decode worker {decode.wid} with no room "
                                          + (f"({sched.kv.pool.num_free} free blocks)" if seats else
                                             f"(all {sched.limits.max_num_seqs} sequence slots taken)"))
            req.finish_ns = now
            self.on_done(req)
            return
        self._make_resident(req, decode)  # (every block was sent: none counts as reused)

    def _lease_end(self, pending: _Pending, decode: DecodeWorker, _: simpy.Event) -> None:
        """A staged request's lease ran out (a timer's callback: a process per lease costs two events more)."""
        req = pending.req
        assert req.kv is not None
        if req.kv.state is not KVState.STAGED:
            return
        req.kv.to(KVState.EXPIRED, now_ns(self.env))
        self.lease_expiries += 1
        decode.pull_queue.remove(pending)
        self._release_staged(pending)
        # Recompute fallback: the decode worker serves the request from scratch (its prefix cache still hits).
        if self.tcfg.first_token == "prefill":  # its first token is sampled again, and timed again
            pending.prefill.sched.drop_sampled()
            req.num_output_tokens = 0
            req.first_token_ns = req.last_token_ns = NO_TIME
            req.token_times_ns = None
        req.cached_tokens = -1  # (the decode worker's admission records its own hit, host part included)
        req.host_hit_tokens = 0
        if not decode.sched.add_request(req, now_ns(self.env)):  # failed with its reason: tell the client
            self._decode_done(req)
            return
        decode.wake()

    def _decode_done(self, req: Request) -> None:
        assert req.kv is not None
        if req.status is Status.FINISHED or req.kv.state is KVState.RESIDENT:  # (RESIDENT: aborted there)
            req.kv.to(KVState.FREED, now_ns(self.env))
        elif req.kv.state not in (KVState.FAILED, KVState.DROPPED):
            req.kv.to(KVState.FAILED, now_ns(self.env))
        self.on_done(req)

    # --------------------------------------------------------------------------------- reporting
    def gauges(self) -> dict[str, float]:
        out: dict[str, float] = {}
        staged_reqs = staged_blocks = 0
        for i, w in enumerate(self.prefill):
            reqs = len(w.sched.kv.req_blocks) - len(w.sched.running)
            blocks = sum(len(b) for rid, b in w.sched.kv.req_blocks.items()) - sum(
                len(w.sched.kv.blocks_of(r)) for r in w.sched.running)
            out[f"staged_requests_prefill{i}"] = reqs    # (named as twin.runner.worker_names names it)
            out[f"staged_blocks_prefill{i}"] = blocks
            staged_reqs += reqs
            staged_blocks += blocks
        out["staged_requests"] = staged_reqs
        out["staged_blocks"] = staged_blocks
        out["decode_wait"] = sum(len(w.pull_queue) for w in self.decode)
        out["pulls_in_flight"] = sum(w.pulls_in_flight for w in self.decode)
        net = self.links.net
        out["link_util_max"] = max((net.utilisation(n) for n in net.capacities_Bps), default=0.0)
        out["lease_expiries"] = self.lease_expiries
        return out

    def summary(self) -> dict[str, Any]:
        waits = [r.staged_wait_ns for r in self.records]
        staged = np.array([w / 1e9 for w in waits if w is not None])
        moved = np.array([r.transfer_ns / 1e9 for r in self.records if r.transferred])
        return {"kv_transfer": {
            "kind": self.tcfg.kind, "pulls": self.pulls, "pushes": self.pushes, "bytes": self.bytes_moved,
            "blocks": sum(r.transfer_blocks for r in self.records),
            "reused_blocks": sum(r.reused_blocks for r in self.records),
            "lease_expiries": self.lease_expiries, "dropped": self.dropped,
            "staged_s": stats(staged), "transfer_s": stats(moved)}}


def _least_loaded() -> RouterSpec:
    return LeastLoadedSpec()


@register("system", "disaggregated")
@attrs.frozen(kw_only=True)
class Disaggregated(SystemSpec):
    """xP yD: prefill workers behind ``router``, decode workers behind ``decode_router``."""

    prefill: PoolConfig = attrs.Factory(PoolConfig)
    """The prefill pool: engines that compute each request's prompt and stage its KV for the decode pool."""
    decode: PoolConfig = attrs.Factory(PoolConfig)
    """The decode pool: engines that take each request's KV from the prefill pool and generate its output."""
    decode_router: RouterSpec = attrs.Factory(_least_loaded)
    """How a request's decode worker is chosen when its prefill is done (a router kind, as in ``router``,
    which chooses the prefill worker)."""
    gpus_per_node: int | None = attrs.field(default=None, validator=positive)
    """GPUs per node for placement (default: the GPU's scale-up domain); same node = NVLink, else the NIC."""

    def build(self, env: simpy.Environment, config: TwinConfig, on_done: Callable[[Request], None]) -> DisaggSystem:
        return DisaggSystem(env, config, self, on_done)

