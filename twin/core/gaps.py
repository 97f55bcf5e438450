"""A worker's histogram of inter-token gaps (the ITL), counted one by one or handed in bulk."""

from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

_RUN_BATCH = 4096
"""Gaps handed in bulk (:meth:`GapHistogram.add_run`) that are packed into arrays at once."""
_BLOCK_ITEMS = 1 << 22
"""Packed gaps that are merged into the sorted arrays when there are more."""
_DICT_ITEMS = 1 << 16
"""Distinct gaps the dictionary holds before they are merged into the sorted arrays: a long run's gaps are
mostly distinct (step durations in nanoseconds), about a hundred bytes each in a dictionary, sixteen there."""
_SPILL_ITEMS = 1 << 16
"""Distinct gaps the sorted arrays hold before they are handed to :attr:`GapHistogram.spill`, where one is
set (1 MB: a long run's distinct gaps grow with its steps, about one a step)."""


class GapHistogram:
    """Inter-token gaps (ns -> count). A step's gaps are counted in :attr:`counts` at once; a fast-forwarded
    run hands each step's duration with the number of requests it is the gap of (:meth:`add_run`), counted in
    numpy when the histogram is read (a dictionary update per gap and step costs more than the step's other
    bookkeeping). Past :data:`_DICT_ITEMS` distinct gaps the dictionary is merged into sorted arrays of gaps
    and counts (:meth:`compact`), so the histogram stays exact in a sixth of the memory."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        """Gaps counted one by one (the scheduler's update adds to it directly)."""
        self._runs: list[tuple[list[int], int]] = []
        """Gaps not in ``counts`` yet: step durations, each the gap of ``count`` requests."""
        self._run_items = 0
        self._blocks: list[tuple[np.ndarray, np.ndarray]] = []
        """Those gaps packed into arrays (gaps, counts), a batch at a time."""
        self._block_items = 0
        self._merged = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        """Gaps merged out of the dictionary and the blocks: distinct gaps, sorted, and their counts."""
        self.spill: Callable[[np.ndarray, np.ndarray], None] | None = None
        """Takes the sorted arrays (distinct gaps, counts) past :data:`_SPILL_ITEMS` and keeps them (the
        runner writes them to disk); they are then no longer this histogram's. None keeps them here."""
        self.spill_items = _SPILL_ITEMS

    def whole(self) -> dict[int, int]:
        """The whole histogram (less what went to :attr:`spill`) as a dictionary (everything counted into
        :attr:`counts`)."""
        if self._runs or self._blocks or len(self._merged[0]):
            self.compact()
            counts = self.counts
            for gap, n in zip(*(a.tolist() for a in self._merged)):
                counts[gap] = n
            self._merged = (self._merged[0][:0], self._merged[1][:0])
        return self.counts

    def check(self) -> None:
        """Merge the dictionary into the arrays once it holds more than :data:`_DICT_ITEMS` distinct gaps."""
        if len(self.counts) > _DICT_ITEMS:
            self.compact()

    def add_run(self, gaps: list[int], count: int) -> None:
        """Count each of ``gaps`` ``count`` times: in bulk, later."""
        self._runs.append((gaps, count))
        self._run_items += len(gaps)
        if self._run_items >= _RUN_BATCH:
            self._pack_runs()

    def _pack_runs(self) -> None:
        """Turn the lists handed to :meth:`add_run` into arrays (which the garbage collector ignores)."""
        runs = self._runs
        if not runs:
            return
        gaps = np.fromiter(itertools.chain.from_iterable(g for g, _ in runs), dtype=np.int64,
                           count=self._run_items)
        weights = np.repeat(np.array([c for _, c in runs], dtype=np.int64), [len(g) for g, _ in runs])
        self._blocks.append((gaps, weights))
        self._block_items += len(gaps)
        runs.clear()
        self._run_items = 0
        if self._block_items > _BLOCK_ITEMS or len(self.counts) > _DICT_ITEMS:  # (bound long runs' memory)
            self.compact()

    def compact(self) -> None:
        """Merge the dictionary's gaps and those handed in bulk into the sorted arrays (integer sums: any
        order gives them) and empty the dictionary in place (the scheduler counts into it directly)."""
        self._pack_runs()
        counts = self.counts
        gaps = [self._merged[0], np.fromiter(counts, dtype=np.int64, count=len(counts)),
                *(g for g, _ in self._blocks)]
        weights = [self._merged[1], np.fromiter(counts.values(), dtype=np.int64, count=len(counts)),
                   *(w for _, w in self._blocks)]
        values, where = np.unique(np.concatenate(gaps), return_inverse=True)
        totals = np.zeros(len(values), dtype=np.int64)
        np.add.at(totals, where, np.concatenate(weights))
        if self.spill is not None and len(values) > self.spill_items:
            self.spill(values, totals)
            values, totals = values[:0], totals[:0]
        self._merged = (values, totals)
        counts.clear()
        self._blocks.clear()
        self._block_items = 0

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole histogram (less what went to :attr:`spill`) as arrays of gaps and their counts, without
        building the dictionary (a gap may appear more than once)."""
        self._pack_runs()
        counts = self.counts
        return (np.concatenate([self._merged[0], np.fromiter(counts, dtype=np.int64, count=len(counts)),
                                *(g for g, _ in self._blocks)]),
                np.concatenate([self._merged[1],
                                np.fromiter(counts.values(), dtype=np.int64, count=len(counts)),
                                *(w for _, w in self._blocks)]))
