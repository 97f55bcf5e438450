"""Attention data parallelism: one engine of ``attention_dp`` ranks that step in lockstep.

Under attention DP (SGLang ``--enable-dp-attention``, TensorRT-LLM ``enable_attention_dp``, vLLM's data
parallelism of MoE models) every rank schedules its own requests from its own KV pool and runs attention on
them alone, but the MoE layers take the tokens of every rank (all-gather or all-to-all), so no rank can start
a step before the others: a step lasts as long as its slowest rank's, and a rank with nothing to do runs a
dummy batch to take part. A rank that prefills a long prompt stalls the decodes of every other rank.

:class:`DPGroup` drives the ranks, each a worker and a :class:`Rank` with its own scheduler, KV pool and
ledger (the run's gauges, ledger and stall report list ranks as workers). At each step boundary every rank
with work forms its batch; each is priced with the routed experts seeing the whole group's tokens
(``CostModel.price_in_group``); the group sleeps for the longest, and each rank's ledger books the rest of
the step as ``dp_wait``. A disaggregated pool's routers send requests to ranks one by one (Dynamo's
DP-aware routing); a colocated engine's new requests go to a rank by the engine's rule
(EngineProfile.dp_balancer): ``least_loaded``, the rank with the fewest requests (running and queued), the
lowest-numbered of equals (TensorRT-LLM); ``vllm_stats``, vLLM's front end, which scores each rank 4 x
waiting + running on the counts the DP coordinator published last (every 100 ms: here the counts at the
first step boundary after each 100 ms mark) plus the requests it sent since, so a seat freed since then is
not seen; ``round_robin`` (SGLang).

TensorRT-LLM's ``attention_dp_config.enable_balance`` (:class:`AdpBalance`) is modelled as its executor runs
it (``PyExecutor._balance_adp_requests``, tensorrt_llm/_torch/pyexecutor/py_executor.py, 1.0-1.2): prompts
are admitted only in a step where every rank has one to admit and a free seat; otherwise they wait, for at
most ``timeout_iters`` steps, unless some rank has no decodes. The counter of waiting steps runs on through
steps that carry no prompt at all, so a prompt arriving into a steady decode waits for the counter's next
turn. With every rank ready and every rank decoding, prompts are held ``batching_wait_iters`` more steps.

Steps are simulated one by one (no fast-forward), so a group costs about ``attention_dp`` times a plain
worker's events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import attrs
import numpy as np

from twin.request import Request
from twin.sim import CLOCK_MAX_NS, ProcessGen, StepEnd, now_ns, to_ns
from twin.worker import Worker

if TYPE_CHECKING:
    import simpy

    from twin.scheduler import SchedulerOutput


STATS_INTERVAL_NS = 100_000_000
"""vLLM's DP coordinator publishes the engines' request counts every 100 ms (core_client.py)."""


@attrs.frozen
class AdpBalance:
    """TensorRT-LLM's ``attention_dp_config`` with ``enable_balance`` on."""

    timeout_iters: int
    batching_wait_iters: int


def balance_step(b: AdpBalance, waiting_iters: int, batching_iters: int, *, ready: list[bool], decodes: list[int],
                 seats: list[int]) -> tuple[bool, int, int]:
    """One step of TensorRT-LLM's attention-DP balance (PyExecutor._balance_adp_requests): whether the ranks'
    prompts are scheduled, and the two counters after it. ``ready``: each rank has a prompt to schedule;
    ``decodes``: its decoding requests; ``seats``: its max_batch_size."""
    every_rank_decodes = all(decodes)
    if all(ready) and all(n < cap for n, cap in zip(decodes, seats)):
        if every_rank_decodes and batching_iters < b.batching_wait_iters:
            return False, 0, batching_iters + 1
        return True, 0, 0 if every_rank_decodes else batching_iters
    waiting_iters += 1
    if waiting_iters >= b.timeout_iters or not every_rank_decodes:
        return True, 0, batching_iters
    return False, waiting_iters, batching_iters


class Rank:
    """Mixin of a worker that is one attention-DP rank: it has no process of its own (its group steps it with
    the others), and an arrival or abort wakes the group."""

    group: DPGroup | None = None

    def _run(self) -> ProcessGen:
        return
        yield  # (a generator)

    def wake(self) -> None:
        assert self.group is not None
        self.group.wake()


class RankWorker(Rank, Worker):
    """One attention-DP rank of a colocated engine: its own scheduler, KV pool and ledger."""


class DPGroup:
    """An engine of attention-DP ranks stepping together. A colocated system's router sees it as one worker
    (:meth:`submit` picks the rank); a disaggregated pool's routers send requests to its ranks directly (an
    abort goes to the request's rank either way)."""

    def __init__(self, env: simpy.Environment, ranks: Sequence[Worker], balance: AdpBalance | None = None,
                 balancer: str = "least_loaded") -> None:
        if len(ranks) < 2:
            raise ValueError(f"an attention-DP group needs at least 2 ranks, got {len(ranks)}")
        self.env = env
        if not all(isinstance(w, Rank) for w in ranks):
            raise TypeError("an attention-DP group steps workers that are Ranks (no process of their own)")
        self.ranks = list(ranks)
        self.wid = ranks[0].wid
        self.priority = ranks[0].priority
        self.balance = balance
        self.balancer = balancer
        self._next = 0
        """round_robin: the rank the next request goes to."""
        self._stats_tick = -1
        """vllm_stats: the 100 ms mark of the published counts; the counts, and the requests sent since."""
        self._stats: list[int] = [0] * len(ranks)
        self._sent: list[int] = [0] * len(ranks)
        self._waiting_iters = 0
        """TensorRT-LLM's adp_ctx_waiting_iters_count: steps prompts were held for want of one on every rank."""
        self._batching_iters = 0
        """Its adp_ctx_batching_wait_iters_count."""
        self._wake: simpy.Event | None = None
        for rank in ranks:
            rank.group = self  # type: ignore[attr-defined]
        self._zeros = np.zeros(len(ranks[0].prices.cost_model.term_names))
        self.process = env.process(self._run())

    # ------------------------------------------------------------------------------- router interface
    def submit(self, req: Request) -> None:
        self._rank_for().submit(req)

    def _rank_for(self, send: bool = True) -> Worker:
        """The rank a new request goes to, by :attr:`balancer` (``send``: the request is sent there)."""
        ranks = self.ranks
        if self.balancer == "round_robin":
            rank = ranks[self._next]
            if send:
                self._next = (self._next + 1) % len(ranks)
            return rank
        if self.balancer == "vllm_stats":
            scores = [stat + 4 * sent for stat, sent in zip(self._stats, self._sent)]
            i = scores.index(min(scores))
            if send:
                self._sent[i] += 1
            return ranks[i]
        return min(ranks, key=lambda w: w.load())

    def _publish(self, now: int) -> None:
        """vllm_stats: at the first step boundary after a 100 ms mark, the coordinator's counts are the ranks'
        4 x waiting + running then, and the requests sent before are in them."""
        tick = now // STATS_INTERVAL_NS
        if tick != self._stats_tick:
            self._stats_tick = tick
            self._stats = [4 * len(w.sched.waiting) + len(w.sched.running) for w in self.ranks]
            self._sent = [0] * len(self.ranks)

    def load(self) -> int:
        return sum(w.load() for w in self.ranks)

    def load_fraction(self) -> float:
        return self.load() / sum(w.sched.limits.max_num_seqs for w in self.ranks)

    def prefix_hit_tokens(self, req: Request) -> int:
        return self._rank_for(send=False).prefix_hit_tokens(req)

    def wake(self) -> None:
        wake = self._wake
        if wake is not None and not wake.triggered:
            wake.succeed()

    # ---------------------------------------------------------------------------------------- process
    def _admits(self, now: int) -> bool:
        """TensorRT-LLM's attention-DP balance: whether this step's ranks may admit prompts (and count)."""
        assert self.balance is not None
        scheds = [w.sched for w in self.ranks]
        decodes = [sum(1 for r in s.running if r.num_computed_tokens >= r.prompt_tokens) for s in scheds]
        admit, self._waiting_iters, self._batching_iters = balance_step(
            self.balance, self._waiting_iters, self._batching_iters,
            ready=[s.prompt_ready(now) for s in scheds], decodes=decodes,
            seats=[s.limits.max_num_seqs for s in scheds])
        return admit

    def _run(self) -> ProcessGen:
        env = self.env
        ranks = self.ranks
        while True:
            for w in ranks:
                if w._aborts:
                    w._apply_aborts()
            for w in ranks:   # (a decode rank starts its KV pulls here, as a decode worker does)
                if w.before_schedule is not None:
                    w.before_schedule()
            if not any(w.sched.has_work for w in ranks):
                yield from self._sleep()
                continue
            now = now_ns(env)
            if self.balancer == "vllm_stats":
                self._publish(now)
            admit = self._admits(now) if self.balance is not None else True
            outs: list[tuple[Worker, SchedulerOutput]] = []
            for w in ranks:
                if w.sched.has_work:
                    w.sched.admit_prompts = admit
                    outs.append((w, w.sched.schedule(now)))
                    w.sched.admit_prompts = True
            stepping = [(w, out) for w, out in outs if not out.empty]
            if not stepping:
                # As a worker does (Worker._run): a rank that preempted itself steps again at once, else the
                # group waits for an outside event.
                if any(out.preempted for _, out in outs) or not any(w.sched.has_work for w in ranks):
                    continue
                for w, _ in outs:
                    w.blocked = True
                yield from self._sleep()
                for w, _ in outs:
                    w.blocked = False
                continue
            yield from self._step(now, stepping)

    def _step(self, now: int, stepping: list[tuple[Worker, SchedulerOutput]]) -> ProcessGen:
        """Run one lockstep step: it lasts as long as the slowest rank's part (host KV loads included)."""
        group_tokens = sum(out.stats.new_tokens for _, out in stepping)
        priced = []
        for w, out in stepping:
            vector, ns = w.prices.group_cost(out.stats, group_tokens)
            priced.append((vector, ns + (to_ns(out.host_load_s) if out.host_load_s else 0)))
        step_ns = max(ns for _, ns in priced)
        if now + step_ns > CLOCK_MAX_NS:
            slowest = max(range(len(priced)), key=lambda i: priced[i][1])
            stepping[slowest][0]._past_clock(now, step_ns, stepping[slowest][1].host_load_s)
        busy = {w.wid for w, _ in stepping}
        for (w, out), (vector, ns) in zip(stepping, priced):
            extra = {"dp_wait": (step_ns - ns) / 1e9}
            if out.host_load_s:
                extra["kv_host_load"] = out.host_load_s
            w.ledger.add(vector, step_ns, extra)
        for w in self.ranks:
            if w.wid not in busy:  # a dummy batch, to take part in the MoE layers
                w.ledger.add(self._zeros, step_ns, {"dp_wait": step_ns / 1e9})
        decoding = all(out.stats.is_pure_decode for _, out in stepping)
        for w in self.ranks:
            w.decoding = decoding
        yield StepEnd(self.env, step_ns, self.priority)
        for w in self.ranks:
            w.decoding = False
        end = now_ns(self.env)
        for w, out in stepping:
            for req in w.sched.update(out, end):
                w.on_done(req)

    def _sleep(self) -> ProcessGen:
        self._wake = self.env.event()
        yield self._wake
        self._wake = None


__all__ = ["AdpBalance", "DPGroup", "Rank", "RankWorker", "balance_step"]
