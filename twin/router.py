"""Routers: pick the worker for each request. A policy is one method, ``choose(req, workers)``."""

from __future__ import annotations

from typing import Protocol, Sequence

import attrs

from twin.config import RouterSpec, non_negative
from twin.registry import register
from twin.core.request import Request


class RoutedWorker(Protocol):
    """What a router may ask of a worker."""

    wid: int

    def load(self) -> int: ...
    def prefix_hit_tokens(self, req: Request) -> int: ...
    def load_fraction(self) -> float: ...


class Router(Protocol):
    def choose(self, req: Request, workers: Sequence[RoutedWorker]) -> RoutedWorker: ...


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: Request, workers: Sequence[RoutedWorker]) -> RoutedWorker:
        worker = workers[self._next % len(workers)]
        self._next += 1
        return worker


class LeastLoaded:
    """Fewest requests waiting or running; ties go to the lowest worker id."""

    def choose(self, req: Request, workers: Sequence[RoutedWorker]) -> RoutedWorker:
        # min(workers, key=(load, wid)) without a key tuple per worker: a disaggregated pool of attention-DP
        # ranks routes every request over all its ranks
        it = iter(workers)
        best = next(it)
        least = best.load()
        for w in it:
            load = w.load()
            if load < least or (load == least and w.wid < best.wid):
                best, least = w, load
        return best


class SessionAffinity:
    """A session's calls stay on the worker its first call went to (least loaded at that time)."""

    def __init__(self) -> None:
        self._home: dict[str, RoutedWorker] = {}
        self._fallback = LeastLoaded()

    def choose(self, req: Request, workers: Sequence[RoutedWorker]) -> RoutedWorker:
        home = self._home.get(req.session)
        if home is None:
            home = self._home[req.session] = self._fallback.choose(req, workers)
        return home


class KvAware:
    """Best prefix overlap minus load: hit fraction of the prompt - load_weight x (queued + running) / max_num_seqs."""

    def __init__(self, load_weight: float) -> None:
        self.load_weight = load_weight

    def choose(self, req: Request, workers: Sequence[RoutedWorker]) -> RoutedWorker:
        def score(w: RoutedWorker) -> tuple[float, int]:
            hit = w.prefix_hit_tokens(req) / req.prompt_tokens
            return (-(hit - self.load_weight * w.load_fraction()), w.wid)

        return min(workers, key=score)


@register("router", "round_robin")
@attrs.frozen(kw_only=True)
class RoundRobinSpec(RouterSpec):
    def build(self) -> Router:
        return RoundRobin()


@register("router", "least_loaded")
@attrs.frozen(kw_only=True)
class LeastLoadedSpec(RouterSpec):
    def build(self) -> Router:
        return LeastLoaded()


@register("router", "session_affinity")
@attrs.frozen(kw_only=True)
class SessionAffinitySpec(RouterSpec):
    def build(self) -> Router:
        return SessionAffinity()


@register("router", "kv_aware")
@attrs.frozen(kw_only=True)
class KvAwareSpec(RouterSpec):
    load_weight: float = attrs.field(default=1.0, validator=non_negative)
    """How much a worker's load counts against its prefix hit (0: hits alone)."""

    def build(self) -> Router:
        return KvAware(self.load_weight)
