"""Step prices and the ledger: what a worker pays for a step, and where the seconds went.

:class:`StepPrices` memoises a cost model's prices by batch shape (every worker built on that model shares
one table); :class:`Ledger` adds up each step's cost-term vector per worker. Both are pure: no clock, no
process, only numbers from :mod:`hardware`.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

import numpy as np

from hardware import BatchShape, CostModel
from twin.core.fastforward import PlannedRun


class Ledger:
    """Seconds spent per cost term on one worker (a vector in the cost model's term order), and steps.

    Step vectors wait in a list and are added in batches, in step order, by one cumulative sum, which adds
    row after row exactly as the additions one by one (a plain sum over the rows would add in pairs and
    round differently); a numpy addition per step costs more than the step's share of a long batch.
    """

    batch = 4096
    """Step vectors kept waiting before they are added."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._acc = np.zeros(len(names))
        self._waiting: list[np.ndarray] = []
        """Step vectors not added to ``_acc`` yet, in step order."""
        self._extra: dict[str, float] = {}
        """Terms the twin adds beyond the cost model (``kv_host_load``: host-tier loads before a step)."""
        self.steps = 0
        self.busy_ns = 0

    def add(self, vector: np.ndarray, step_ns: int, extra: Mapping[str, float] | None = None) -> None:
        waiting = self._waiting
        waiting.append(vector)
        if len(waiting) >= self.batch:
            self._flush()
        if extra:
            for name, value in extra.items():
                self._extra[name] = self._extra.get(name, 0.0) + value
        self.steps += 1
        self.busy_ns += step_ns

    def add_steps(self, vectors: Sequence[np.ndarray], steps_ns: Sequence[int]) -> None:
        """:meth:`add` for consecutive steps without extras: the same additions, in step order."""
        waiting = self._waiting
        waiting += vectors
        if len(waiting) >= self.batch:
            self._flush()
        self.steps += len(vectors)
        self.busy_ns += sum(steps_ns)

    def _flush(self) -> None:
        """Add the waiting step vectors to the totals, row after row."""
        if self._waiting:
            rows = np.concatenate([self._acc, *self._waiting]).reshape(-1, len(self.names))
            self._acc = np.add.accumulate(rows, axis=0)[-1].copy()
            self._waiting.clear()

    @property
    def terms_s(self) -> dict[str, float]:
        self._flush()
        return {**{name: float(v) for name, v in zip(self.names, self._acc)}, **self._extra}


StepPrice = tuple[np.ndarray, int]
"""A step's cost-term vector (seconds, in the ledger's order) and its duration in integer nanoseconds."""

_MEMO_LIMIT = 1 << 14
"""Prices a memo holds before it is emptied (a shape and its term vector: about half a kilobyte). Prices are
exact, so the limit changes speed alone; it bounds the memory of long runs, whose mixed steps are mostly new
shapes (on the scale points 1 step price in 42,717 was asked for twice; on a sample of validation rows the
repeats came mostly within 512 steps, decode prices within 2^16)."""


def _remember(memo: dict[Any, StepPrice], key: Any, values: Collection[float], ns: int) -> StepPrice:
    """Store a priced step, its term values and ns, in ``memo`` as a vector and the ns (the memo is emptied
    when it reaches _MEMO_LIMIT)."""
    price = np.fromiter(values, dtype=np.float64, count=len(values)), ns
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = price
    return price


class StepPrices:
    """Step prices of one cost model, memoised: the workers built on the same cost model share them.

    A price depends on the batch's shape alone, so every worker of a pool asks for many of the same ones
    (decode stretches of the same size and context); one table for the pool computes each price once.
    """

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self._prices: dict[BatchShape, StepPrice] = {}
        self._group_prices: dict[tuple[BatchShape, int], StepPrice] = {}
        self._group_decode_prices: dict[tuple[int, int, int, int], StepPrice] = {}
        """Pure-decode steps in an attention-DP group by (requests, context, longest, group tokens)."""
        self._decode_prices: dict[int, dict[tuple[int, int], StepPrice]] = {}
        """Decode step prices by batch size, then by (context tokens, longest context) (:meth:`decode_costs`)."""
        self._decode_free: dict[int, dict[int, tuple[int, StepPrice]]] = {}
        """Decode step prices by batch size, then by context tokens alone: (the largest longest context they
        hold for, the price) (:meth:`decode_costs`)."""
        self._num_decode_prices = 0

    def step_cost(self, shape: BatchShape) -> StepPrice:
        """The step's term vector and duration (a vector, since the ledger adds vectors)."""
        hit = self._prices.get(shape)
        if hit is None:  # this table is the memo: the model's own would miss too
            terms, ns = self.cost_model.price(shape)
            hit = _remember(self._prices, shape, terms.values(), ns)
        return hit

    def run_costs(self, run: PlannedRun, steps: range) -> list[StepPrice]:
        """Steps ``steps`` (0-based) of a fast-forwarded run, each priced by its shape (fastforward.Pricer)."""
        return [self.step_cost(run.shape(i)) for i in steps]

    def group_cost(self, shape: BatchShape, group_tokens: int) -> StepPrice:
        """:meth:`step_cost` for one rank of a lockstep attention-DP group whose ranks compute
        ``group_tokens`` new tokens together (CostModel.price_in_group)."""
        key = (shape, group_tokens)
        hit = self._group_prices.get(key)
        if hit is None:
            terms, ns = self.cost_model.price_in_group(shape, group_tokens)
            hit = _remember(self._group_prices, key, terms.values(), ns)
        return hit

    def group_decode_cost(self, n: int, sum_kv: int, max_kv: int, group_tokens: int) -> StepPrice:
        """:meth:`group_cost` of a pure-decode step of ``n`` requests attending ``sum_kv`` tokens, the longest
        ``max_kv`` (CostModel.decode_step in its group: the same floats, no shape built)."""
        key = (n, sum_kv, max_kv, group_tokens)
        hit = self._group_decode_prices.get(key)
        if hit is None:
            hit = _remember(self._group_decode_prices, key, *self.cost_model.decode_step(n, sum_kv, max_kv,
                                                                                       group_tokens))
        return hit

    def decode_costs(self, n: int, sum_kv: int, max_kv: int, steps: range) -> list[StepPrice]:
        """Pure-decode steps of ``n`` requests: step i of ``steps`` attends ``sum_kv + i * n`` tokens, the
        longest request ``max_kv + i`` (every request adds a token a step). By ``n``, then by context: a
        decode stretch asks for context sizes ``n`` apart, and workers revisit the same ones. The longest
        context matters only where the decode attention is compute-bound at the rate it sets, so a price is
        kept by context alone for every longest context up to the bound the cost model gives
        (CostModel.decode_max_kv_bound; the same floats), by (context, longest) otherwise."""
        memo = self._decode_prices.get(n)
        if memo is None:
            memo = self._decode_prices[n] = {}
            self._decode_free[n] = {}
        free = self._decode_free[n]
        out = []
        for i in steps:
            context, longest = sum_kv + i * n, max_kv + i
            bounded = free.get(context)
            if bounded is not None and 0 <= longest <= bounded[0]:
                out.append(bounded[1])
                continue
            key = (context, longest)
            hit = memo.get(key)
            if hit is None:
                terms, ns = self.cost_model.decode_step(n, context, longest)
                hit = (np.array(terms, dtype=np.float64), ns)
                if self._num_decode_prices >= _MEMO_LIMIT:
                    self._decode_prices = {n: memo}
                    self._decode_free = {n: free}
                    memo.clear()
                    free.clear()
                    self._num_decode_prices = 0
                bound = self.cost_model.decode_max_kv_bound(n, context) if longest >= 0 else -1
                if 0 <= longest <= bound:
                    free[context] = (bound, hit)
                else:
                    memo[key] = hit
                self._num_decode_prices += 1
            out.append(hit)
        return out
