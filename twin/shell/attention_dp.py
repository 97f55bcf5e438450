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
not seen; ``round_robin`` (SGLang). Each rule is a :class:`Balancer`, chosen by its name.

TensorRT-LLM's ``attention_dp_config.enable_balance`` (:class:`AdpBalance`) is modelled as its executor runs
it (``PyExecutor._balance_adp_requests``, tensorrt_llm/_torch/pyexecutor/py_executor.py, 1.0-1.2): prompts
are admitted only in a step where every rank has one to admit and a free seat; otherwise they wait, for at
most ``timeout_iters`` steps, unless some rank has no decodes. The counter of waiting steps runs on through
steps that carry no prompt at all, so a prompt arriving into a steady decode waits for the counter's next
turn. With every rank ready and every rank decoding, prompts are held ``batching_wait_iters`` more steps.

Pure-decode stretches are fast-forwarded as a plain worker's are (:mod:`twin.core.fastforward`, by the same
driver: :class:`~twin.shell.fast_forward.FastForward`), every rank's run planned over the same steps: when
every rank with work decodes its whole batch with nothing queued, and the others have no work at all, the
group plans the steps no rank's batch can change in (the fewest any rank allows), each step lasting the
slowest rank's decode, sleeps to their end, and is cut after the step in progress by an outside event (an
arrival, an abort, a KV pull queued), applying exactly the steps that elapsed. Under vLLM's balancer the
counts the coordinator publishes at the step boundaries a fast-forward skips are taken when they are next
read: no request enters or leaves a rank inside a run, so every skipped boundary would have published the
counts the ranks hold then (:meth:`VllmStats.catch_up`). Under TensorRT-LLM's balance a run may also cross
the steps for which the balance holds the waiting prompts back for certain (:meth:`DPGroup._held_steps`:
until its timeout, unless every rank has a prompt and a free seat), ranks with waiting requests decoding as
the others do. Speculative ranks plan their runs as :class:`~twin.core.fastforward.SpecRun` objects, each
step as long as the slowest rank's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import attrs
import numpy as np

from hardware import BatchShape
from twin.core.fastforward import PlannedRun, plan_decode_run
from twin.core.request import Request
from twin.shell.fast_forward import FastForward, Runs
from twin.shell.sim import CLOCK_MAX_NS, ProcessGen, StepEnd, now_ns, to_ns
from twin.core.prices import StepPrice, StepPrices
from twin.shell.worker import Worker

if TYPE_CHECKING:
    import simpy

    from twin.core.scheduler import Scheduler, SchedulerOutput


_FIRST_SEGMENT = 4
"""Steps costed when a group's runs are planned (then 8, 16 ... while they go on)."""

_WORTH = 8.0
"""Mean run length (steps) below which a speculative group plans runs only every _PROBE_EVERY steps: planning
every rank's SpecRun costs about what 5 of its steps stepped one by one cost, and where outside
events cut runs every few steps (a decode pool's KV pulls) it costs more than it saves."""
_PROBE_EVERY = 8

STATS_INTERVAL_NS = 100_000_000
"""vLLM's DP coordinator publishes the engines' request counts every 100 ms (core_client.py)."""


@attrs.frozen
class AdpBalance:
    """TensorRT-LLM's ``attention_dp_config`` with ``enable_balance`` on."""

    timeout_iters: int
    batching_wait_iters: int


class _GroupPricer:
    """The prices of a group's fast-forwarded decode steps: each stepping rank's own (term vector, ns) and the
    group's step, as long as the slowest rank's, computed a step at a time for every rank together (every
    rank's run gives the shape of each of its steps: PlannedRun.shape). The runs' requests, and so the tokens
    the group computes a step, are the same at every step."""

    def __init__(self) -> None:
        self.parts: list[tuple[StepPrices, PlannedRun]] = []
        self.tokens = 0
        self.steps: list[tuple[list[StepPrice], int]] = []

    def add(self, prices: StepPrices, run: PlannedRun) -> None:
        self.parts.append((prices, run))
        self.tokens += run.first.new_tokens

    def step(self, i: int) -> tuple[list[StepPrice], int]:
        """Step i + 1 of the runs (0-based)."""
        steps = self.steps
        tokens = self.tokens
        while len(steps) <= i:
            j = len(steps)
            own = [run.group_price(prices, j, tokens) for prices, run in self.parts]
            steps.append((own, max(ns for _, ns in own)))
        return steps[i]


class _RankPricer:
    """A rank's run's view of its group's prices (fastforward.Pricer): its own terms, the group's step."""

    def __init__(self, group: _GroupPricer, index: int) -> None:
        self.group = group
        self.index = index

    def run_costs(self, run: PlannedRun, steps: range) -> list[tuple[np.ndarray, int]]:
        out = []
        for i in steps:
            own, ns = self.group.step(i)
            out.append((own[self.index][0], ns))
        return out

    def decode_costs(self, n: int, sum_kv: int, max_kv: int, steps: range) -> list[tuple[np.ndarray, int]]:
        return self.run_costs(self.group.parts[self.index][1], steps)


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


def _decodes(sched: Scheduler) -> int:
    """A rank's decoding requests, as the balance counts them (its running requests past their prompts)."""
    return sum(1 for r in sched.running if r.num_computed_tokens >= r.prompt_tokens)


class Balancer:
    """How a colocated engine's new requests go to its ranks (EngineProfile.dp_balancer): one subclass per rule,
    declared with its name and chosen by it once (:func:`make_balancer`). ``ranks``: the group's, in order."""

    kinds: ClassVar[dict[str, type[Balancer]]] = {}
    name: ClassVar[str]

    def __init_subclass__(cls, *, name: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = name
        Balancer.kinds[name] = cls

    def __init__(self, num_ranks: int) -> None:
        pass

    def choose(self, ranks: Sequence[Worker], send: bool) -> Worker:
        """The rank a new request goes to (``send``: it is sent there; else only asked, as a prefix probe)."""
        raise NotImplementedError

    def publish(self, ranks: Sequence[Worker], now: int) -> None:
        """A step boundary of the group at ``now``."""

    def catch_up(self, ranks: Sequence[Worker], ff: FastForward, passed: int | None = None) -> None:
        """While the group fast-forwards (``ff``): the inner step boundaries of its runs that have passed
        (``passed`` of them; None: those step-by-step simulation has passed by now)."""


class LeastLoaded(Balancer, name="least_loaded"):
    """The rank with the fewest requests (running and queued), the lowest-numbered of equals (TensorRT-LLM)."""

    def choose(self, ranks: Sequence[Worker], send: bool) -> Worker:
        return min(ranks, key=lambda w: w.load())


class RoundRobin(Balancer, name="round_robin"):
    """Each rank in turn (SGLang's ``--load-balance-method round_robin``)."""

    def __init__(self, num_ranks: int) -> None:
        self.next = 0
        """The rank the next request goes to."""

    def choose(self, ranks: Sequence[Worker], send: bool) -> Worker:
        rank = ranks[self.next]
        if send:
            self.next = (self.next + 1) % len(ranks)
        return rank


class VllmStats(Balancer, name="vllm_stats"):
    """vLLM's front end (DPLBAsyncMPClient): the lowest 4 x waiting + running as the DP coordinator last published
    them, plus 4 per request sent since; the first rank of equals."""

    def __init__(self, num_ranks: int) -> None:
        self.tick = -1
        """The 100 ms mark of the published counts; the counts, and the requests sent since."""
        self.stats = [0] * num_ranks
        self.sent = [0] * num_ranks

    def choose(self, ranks: Sequence[Worker], send: bool) -> Worker:
        scores = [stat + 4 * sent for stat, sent in zip(self.stats, self.sent)]
        i = scores.index(min(scores))
        if send:
            self.sent[i] += 1
        return ranks[i]

    def publish(self, ranks: Sequence[Worker], now: int) -> None:
        """At the first step boundary after a 100 ms mark, the coordinator's counts are the ranks' 4 x waiting +
        running then, and the requests sent before are in them."""
        tick = now // STATS_INTERVAL_NS
        if tick != self.tick:
            self.tick = tick
            self.stats = [4 * len(w.sched.waiting) + len(w.sched.running) for w in ranks]
            self.sent = [0] * len(ranks)

    def catch_up(self, ranks: Sequence[Worker], ff: FastForward, passed: int | None = None) -> None:
        """Publish what the passed step boundaries of the runs would have published step by step. Inside a run
        no request enters or leaves a rank (an arrival cuts it after the step in progress, and is placed before
        it is queued), so each such boundary saw the counts the ranks hold now, and only the last one's 100 ms
        mark matters. (The runs' last boundary is the group's own: DPGroup._run publishes it.)"""
        if not ff.runs:
            return
        if passed is None:
            passed = ff.boundaries_passed()
        if passed:
            self.publish(ranks, ff.runs[0][1].ends[passed - 1])


def make_balancer(name: str, num_ranks: int) -> Balancer:
    """The :class:`Balancer` called ``name``, for a group of ``num_ranks`` ranks."""
    cls = Balancer.kinds.get(name)
    if cls is None:
        raise ValueError(f"unknown attention-DP balancer {name!r} (known: {', '.join(Balancer.kinds)})")
    return cls(num_ranks)


class Rank:
    """Mixin of a worker that is one attention-DP rank: it has no process of its own (its group steps it with
    the others, and the group's FastForward drives its runs: the rank's own stays idle), and an arrival or abort
    wakes the group."""

    group: DPGroup | None = None

    def _run(self) -> ProcessGen:
        return
        yield  # (a generator)

    def wake(self) -> None:
        assert self.group is not None
        self.group.wake()

    def stop(self) -> None:
        """The run stops now: the group books its fast-forward's begun steps (once), then this rank syncs."""
        assert self.group is not None
        self.group.stop()
        super().stop()  # type: ignore[misc]


class RankWorker(Rank, Worker):
    """One attention-DP rank of a colocated engine: its own scheduler, KV pool and ledger."""


class DPGroup:
    """An engine of attention-DP ranks stepping together. A colocated system's router sees it as one worker
    (:meth:`submit` picks the rank); a disaggregated pool's routers send requests to its ranks directly (an
    abort goes to the request's rank either way)."""

    def __init__(self, env: simpy.Environment, ranks: Sequence[Worker], balance: AdpBalance | None = None,
                 balancer: str = "least_loaded", fast_forward_steps: int = 0) -> None:
        if len(ranks) < 2:
            raise ValueError(f"an attention-DP group needs at least 2 ranks, got {len(ranks)}")
        self.env = env
        if not all(isinstance(w, Rank) for w in ranks):
            raise TypeError("an attention-DP group steps workers that are Ranks (no process of their own)")
        self.ranks = list(ranks)
        self.wid = ranks[0].wid
        self.priority = ranks[0].priority
        self.balance = balance
        self.balancer = make_balancer(balancer, len(ranks))
        """Where a colocated engine's new requests go (``balancer``: the rule's name)."""
        self.fast_forward_steps = fast_forward_steps
        """Most decode steps planned in one jump (0 or 1: step by step)."""
        for rank in ranks:
            rank.priority = self.priority  # (the group's step ends are its ranks')
        self.ff = FastForward(env, self.priority, _FIRST_SEGMENT, self._book_runs)
        """What the group waits on between steps: an outside event, or its ranks' fast-forwarded runs (each
        stepping rank's, their steps ending together)."""
        self._run_steps = _WORTH
        """A moving mean of the steps the group's runs lasted (speculative groups: :data:`_WORTH`). A matter of
        speed alone: a step is the same stepped or fast-forwarded."""
        self._probe = 0
        """Steps since a run was last planned while runs were short."""
        self._waiting_iters = 0
        """TensorRT-LLM's adp_ctx_waiting_iters_count: steps prompts were held for want of one on every rank."""
        self._batching_iters = 0
        """Its adp_ctx_batching_wait_iters_count."""
        for rank in ranks:
            rank.group = self  # type: ignore[attr-defined]
        self._zeros = np.zeros(len(ranks[0].prices.cost_model.term_names))
        self.process = env.process(self._run())

    # ------------------------------------------------------------------------------- router interface
    def submit(self, req: Request) -> None:
        self._rank_for().submit(req)

    def _rank_for(self, send: bool = True) -> Worker:
        """The rank a new request goes to, by :attr:`balancer` (``send``: the request is sent there)."""
        self.balancer.catch_up(self.ranks, self.ff)
        return self.balancer.choose(self.ranks, send)

    def load(self) -> int:
        return sum(w.load() for w in self.ranks)

    def load_fraction(self) -> float:
        return self.load() / sum(w.sched.limits.max_num_seqs for w in self.ranks)

    def prefix_hit_tokens(self, req: Request) -> int:
        return self._rank_for(send=False).prefix_hit_tokens(req)

    def wake(self) -> None:
        """An outside event: a sleeping group wakes now, a fast-forwarding one after the step in progress."""
        self.ff.wake()

    # ---------------------------------------------------------------------------------------- process
    def _admits(self, now: int) -> bool:
        """TensorRT-LLM's attention-DP balance: whether this step's ranks may admit prompts (and count)."""
        return self._balance_step([w.sched.prompt_ready(now) for w in self.ranks])

    def _held_steps(self, now: int) -> int:
        """After a step whose prompts the balance held for want of one on every rank (or of a free seat):
        how many more steps it holds them for certain, as long as no request enters or leaves a rank (a
        fast-forward's steps). Unless every rank has a prompt with every request queued now in view (with
        lookahead the step formed now saw only those queued before the last one began; the next sees them
        all) and a seat free, none of those steps has either (a rank without one gets none; the free blocks
        only shrink; the seats stay taken), so each counts one more waiting step until the counter reaches
        the timeout. 0 when the step was held for the batching wait instead (its counter then resets the
        waiting one: PyExecutor._balance_adp_requests)."""
        assert self.balance is not None
        if not self._waiting_iters:
            return 0
        scheds = [w.sched for w in self.ranks]
        if all(s.prompt_ready(now, every_queued=True) and _decodes(s) < s.limits.max_num_seqs for s in scheds):
            return 0
        return max(0, self.balance.timeout_iters - 1 - self._waiting_iters)

    def _balance_step(self, ready: list[bool], steps: int = 1) -> bool:
        """``steps`` steps of the balance with each rank's ``ready`` given, its decodes and seats as they are now
        (the same at each: a fast-forward's steps); whether the last one admits."""
        assert self.balance is not None
        scheds = [w.sched for w in self.ranks]
        decodes = [_decodes(s) for s in scheds]
        seats = [s.limits.max_num_seqs for s in scheds]
        admit = False
        for _ in range(steps):
            admit, self._waiting_iters, self._batching_iters = balance_step(
                self.balance, self._waiting_iters, self._batching_iters, ready=ready, decodes=decodes, seats=seats)
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
                yield from self.ff.idle()
                continue
            now = now_ns(env)
            self.balancer.publish(ranks, now)
            admit = self._admits(now) if self.balance is not None else True
            outs: list[tuple[Worker, SchedulerOutput]] = []
            for w in ranks:
                if w.sched.has_work:
                    outs.append((w, w.sched.schedule(now, admit)))
            stepping = [(w, out) for w, out in outs if not out.empty]
            if not stepping:
                # As a worker does (Worker._run): a rank that preempted itself steps again at once, else the
                # group waits for an outside event.
                if any(out.preempted for _, out in outs) or not any(w.sched.has_work for w in ranks):
                    continue
                for w, _ in outs:
                    w.blocked = True
                yield from self.ff.idle()
                for w, _ in outs:
                    w.blocked = False
                continue
            if self.fast_forward_steps > 1 and self._worth_planning():
                held = 0 if admit or not any(len(w.sched.waiting) for w in ranks) else self._held_steps(now)
                runs = self._plan(now, stepping, held)
                if runs is not None:
                    yield from self._fast_forward(runs)
                    continue
            yield from self._step(now, stepping)

    # --------------------------------------------------------------------------------- fast-forward
    def _worth_planning(self) -> bool:
        """Whether to plan runs at this step: always, unless the group is speculative and its runs have lately
        been short (:data:`_WORTH`), then every :data:`_PROBE_EVERY` th step (which keeps the mean current)."""
        if self.ranks[0].sched.drafter is None or self._run_steps >= _WORTH:
            return True
        self._probe = (self._probe + 1) % _PROBE_EVERY
        return self._probe == 0

    def _plan(self, now: int, stepping: list[tuple[Worker, SchedulerOutput]], held: int) -> Runs | None:
        """Every stepping rank's run over the same steps, or None when a step-by-step step is due. ``held``:
        the steps after this one whose prompts the balance holds back for certain (:meth:`_held_steps`), for
        which ranks with waiting requests may run too."""
        busy = {w.wid for w, _ in stepping}
        if any(not w.quiet() or (w.wid not in busy and w.sched.has_work) for w in self.ranks):
            return None
        pricer = _GroupPricer()
        runs: Runs = []
        max_steps = min(self.fast_forward_steps, 1 + held) if held else self.fast_forward_steps
        for i, (w, out) in enumerate(stepping):
            run = plan_decode_run(w.sched, out, now, _RankPricer(pricer, i), max_steps, held=held > 0)
            if run is None:
                return None
            runs.append((w, run))
            pricer.add(w.prices, run)
            max_steps = run.k  # (the group's runs end together: no rank plans past the shortest so far)
        k = min(run.k for _, run in runs)
        for _, run in runs:
            run.truncate(k)
        if self.ff.cost_first(runs) < 2:
            return None
        return runs

    def _fast_forward(self, runs: Runs) -> ProcessGen:
        """Sleep through the runs' planned steps, or to the end of the step an outside event arrived in; apply
        the steps that elapsed to every rank, its ledger (own terms, the wait for the slowest) and the
        attention-DP balance's counters."""
        ff = self.ff
        ff.start(runs)
        m = yield from ff.wait()
        self._run_steps += (m - self._run_steps) / 4
        self.balancer.catch_up(self.ranks, ff, m - 1)   # (inner boundaries, before the runs' steps are applied)
        ff.end(m)
        if self.balance is not None:
            # Steps 2 .. m were formed without a prompt on every rank with a seat free (none at all, or those
            # held: _held_steps), which the balance counts as [False] * ranks does.
            self._balance_step([False] * len(self.ranks), m - 1)
        for w, run in runs:
            for req in run.update_upto(m):
                w.on_done(req)

    def _book_runs(self, runs: Runs, m: int) -> None:
        """The runs stop after step ``m``: each rank's ledger gets those steps as step-by-step simulation books
        them (its own terms and its wait for the slowest rank; an idle rank waits each step out)."""
        pricer = runs[0][1].pricer
        assert isinstance(pricer, _RankPricer)
        for own, step_ns in pricer.group.steps[:m]:
            self._book(step_ns, [(w, vector, ns, 0.0) for (w, _), (vector, ns) in zip(runs, own)])

    def _book(self, step_ns: int, parts: list[tuple[Worker, np.ndarray, int, float]]) -> None:
        """Book one group step of ``step_ns`` in every rank's ledger: a stepping rank's part (rank, its term
        vector, its own ns with host KV loads, those loads in s) with the rest of the step as ``dp_wait``; an
        idle rank, running a dummy batch to take part in the MoE layers, waits the whole step."""
        busy = set()
        for w, vector, ns, host_load_s in parts:
            busy.add(w.wid)
            extra = {"dp_wait": (step_ns - ns) / 1e9}
            if host_load_s:
                extra["kv_host_load"] = host_load_s
            w.ledger.add(vector, step_ns, extra)
        for w in self.ranks:
            if w.wid not in busy:
                w.ledger.add(self._zeros, step_ns, {"dp_wait": step_ns / 1e9})

    def stop(self) -> None:
        """The run stops now (``run.max_sim_s``): a fast-forward's steps that had begun enter the ledgers, as
        step-by-step simulation charges each step when it begins (FastForward.stop)."""
        self.ff.stop()

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
        self._book(step_ns, [(w, vector, ns, out.host_load_s) for (w, out), (vector, ns) in zip(stepping, priced)])
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


def group_ranks(env: simpy.Environment, ranks: Sequence[Worker], dp: int, balancer: str, fast_forward_steps: int,
                balance: AdpBalance | None = None) -> list[DPGroup]:
    """The engines of ``dp`` consecutive ranks each (engine i: ranks i x dp .. i x dp + dp - 1)."""
    return [DPGroup(env, ranks[i:i + dp], balance, balancer, fast_forward_steps) for i in range(0, len(ranks), dp)]


__all__ = ["AdpBalance", "Balancer", "DPGroup", "LeastLoaded", "Rank", "RankWorker", "RoundRobin", "VllmStats",
           "balance_step", "group_ranks", "make_balancer"]
