"""The twin's vLLM-mode scheduler against decisions recorded from vLLM 0.12.0's own v1 scheduler.

experiments/vllm_differential/vllm_0_12_0.json holds what vLLM's ``Scheduler`` and ``KVCacheManager`` did,
step by step, on 53 scenarios (chunked prefill with small budgets, max_num_seqs binding, prefix hits while
the first request runs and after it finished, preemption and recompute with hits on the victim's own
blocks, LRU eviction, blocks computed twice; recorded by experiments/vllm_differential/record.py with vLLM
installed, no GPU). Each scenario is replayed on ``twin.core.scheduler.Scheduler``; every step must schedule the
same requests with the same tokens in the same order, start them at the same computed tokens (prefix hits
and resumes), preempt and finish the same requests, and leave the same free-block count, block ids per
request, cached blocks (the block a lookup of each hash finds) and free queue, with both block pools.

Block ids: vLLM's pool of num_gpu_blocks keeps block 0 as its null block; the twin gets num_gpu_blocks - 1
blocks and twin id = vLLM id - 1. Token identity: vLLM hashes token ids; the twin's block keys come from
TokenSequence segments laid out as the token ids were (a shared group prefix, then the request's own
stream, which its outputs continue), so equal vLLM hashes are equal twin keys.

vllm_0_12_0_async.json holds vLLM's AsyncScheduler (async scheduling, vLLM 0.12's default) driven as its
engine core drives it, with timed arrivals (68 scenarios); the twin replays them as a worker runs it with
lookahead and async_output, and every step must also start when vLLM's did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from hardware import load_engine
from twin.core import kv_cache
from twin.core.kv_cache import KVCacheManager
from twin.core.request import Request
from twin.core.scheduler import Scheduler, SchedulerLimits
from twin.core.tokens import SourceTable, TokenSequence

from experiments.vllm_differential.scenarios import STEP_TIME

HERE = Path(__file__).resolve().parents[2] / "experiments" / "vllm_differential"
DATA = json.loads((HERE / "vllm_0_12_0.json").read_text())
FIELDS = DATA["step_fields"]
ASYNC = json.loads((HERE / "vllm_0_12_0_async.json").read_text())
"""The same with vLLM's async scheduling (its default), driven as its engine core drives it."""
ASYNC_FIELDS = ASYNC["step_fields"]
OFFSET = 1  # vLLM block id = twin block id + OFFSET
POOLS = {"default": kv_cache.BlockPool, "python": kv_cache.PyBlockPool}


def _request(r: dict, bs: int, sources: SourceTable) -> Request:
    seq = TokenSequence()
    own = r["prompt"]
    if r["shared"]:
        group, n = r["shared"]
        seq.extend(sources.get(("group", group)), 0, n)
        own -= n
    seq.extend(sources.get(("own", r["id"])), 0, own + r["max_tokens"])
    return Request(id=r["id"], prompt_tokens=r["prompt"], max_output_tokens=r["max_tokens"],
                   block_keys=list(seq.block_keys(bs)), arrival_ns=r["arrival"], session=f"s{r['id']}")


def _replay(scn: dict, n_steps: int, with_free_order: bool) -> Iterator[dict]:
    lim = scn["limits"]
    bs = lim["block_size"]
    kv = KVCacheManager(lim["num_gpu_blocks"] - 1, bs, lim["prefix_caching"],
                        keep_duplicates=load_engine("vllm").cache_duplicate_blocks)
    sched = Scheduler(SchedulerLimits(max_num_batched_tokens=lim["max_num_batched_tokens"],
                                      max_num_seqs=lim["max_num_seqs"], long_prefill_token_threshold=0,
                                      chunked_prefill=True, lookahead=False), kv, "fcfs")
    sources = SourceTable()
    arrivals: dict[int, list[dict]] = {}
    for r in scn["requests"]:
        arrivals.setdefault(r["arrival"], []).append(r)
    pool = kv.pool
    for step in range(n_steps):
        for r in arrivals.get(step, []):
            assert sched.add_request(_request(r, bs, sources), step)
        out = sched.schedule(step)
        computed = [[r.id, r.num_computed_tokens] for r, _ in out.scheduled]
        finished = sched.update(out, step + 1)
        held = [[rid, [b + OFFSET for b in blocks]] for rid, blocks in kv.req_blocks.items() if blocks]
        yield dict(scheduled=[[r.id, n] for r, n in out.scheduled], computed=computed,
                   preempted=sorted(r.id for r in out.preempted), finished=[r.id for r in finished],
                   num_free=pool.num_free, held=sorted(held), cached=sorted(b + OFFSET for b in pool.cached.values()),
                   free_order=[b + OFFSET for b in pool.free_order()] if with_free_order else None)
        pool.check()
    assert not sched.has_work, "vLLM finished every request; the twin has work left"


def _replay_async(scn: dict, with_free_order: bool, async_output: bool = True) -> Iterator[dict]:
    """The twin as a worker runs it with vLLM's async scheduling (lookahead, async_output): a step of
    STEP_TIME from its schedule; at a step's end the requests that arrived until then are queued (ordinary
    events come before a step end, twin.shell.sim.StepEnd), the step is applied and the next formed; an idle
    worker wakes at the next arrival. One record per step, and a last one after everything ended."""
    lim = scn["limits"]
    bs = lim["block_size"]
    kv = KVCacheManager(lim["num_gpu_blocks"] - 1, bs, lim["prefix_caching"],
                        keep_duplicates=load_engine("vllm").cache_duplicate_blocks)
    sched = Scheduler(SchedulerLimits(max_num_batched_tokens=lim["max_num_batched_tokens"],
                                      max_num_seqs=lim["max_num_seqs"], long_prefill_token_threshold=0,
                                      chunked_prefill=True, lookahead=True, async_output=async_output), kv, "fcfs")
    sources = SourceTable()
    pending = sorted(scn["requests"], key=lambda r: (r["t"], r["id"]))
    pool = kv.pool
    t = 0
    running = None
    finished: list[int] = []

    def state() -> dict:
        held = [[rid, [b + OFFSET for b in blocks]] for rid, blocks in kv.req_blocks.items() if blocks]
        return dict(num_free=pool.num_free, held=sorted(held), cached=sorted(b + OFFSET for b in pool.cached.values()),
                    free_order=[b + OFFSET for b in pool.free_order()] if with_free_order else None)

    while True:
        if running is not None:
            t += STEP_TIME
        while pending and pending[0]["t"] <= t:
            r = pending.pop(0)
            assert sched.add_request(_request(r, bs, sources), t)
        if running is not None:
            finished += [r.id for r in sched.update(running, t)]
            running = None
        if not sched.has_work:
            if not pending:
                break
            t = pending[0]["t"]
            continue
        out = sched.schedule(t)
        pool.check()
        if out.empty:
            if out.preempted or not sched.has_work:
                continue
            assert pending, "the twin stalled where vLLM did not"
            t = pending[0]["t"]
            continue
        yield dict(start=t, scheduled=[[r.id, n] for r, n in out.scheduled],
                   computed=[[r.id, r.num_computed_tokens] for r, _ in out.scheduled],
                   preempted=sorted(r.id for r in out.preempted), finished=finished, **state())
        finished = []
        running = out
    yield dict(start=None, scheduled=None, computed=None, preempted=None, finished=finished, **state())


@pytest.mark.parametrize("pool", sorted(POOLS))
@pytest.mark.parametrize("entry", DATA["scenarios"], ids=[e["scenario"]["name"] for e in DATA["scenarios"]])
def test_twin_schedules_as_vllm_did(entry: dict, pool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_cache, "BlockPool", POOLS[pool])
    scn = entry["scenario"]
    steps = entry["steps"]
    with_free_order = any(row[FIELDS.index("free_order")] is not None for row in steps)
    expected: dict = {"free_order": None}  # (not recorded for large pools)
    for i, (row, got) in enumerate(zip(steps, _replay(scn, len(steps), with_free_order))):
        for f, v in zip(FIELDS, row):
            if f in ("held", "cached", "free_order") and v is None:
                continue  # unchanged since the previous step
            expected[f] = sorted(v) if f == "held" else v
        for f in FIELDS:
            assert got[f] == expected[f], f"{scn['name']} step {i}: {f}\n  vLLM {expected[f]}\n  twin {got[f]}"


def test_the_recording_is_vllm_0_12_and_covers_what_it_claims() -> None:
    """vLLM 0.12.0 (the version hardware/data/engines/vllm.yaml profiles); scenarios that preempt, get prefix
    hits, and cache a block twice (the case a pool keeping one block per hash got wrong)."""
    assert DATA["vllm_version"] == load_engine("vllm").version == "0.12.0"
    names = [e["scenario"]["name"] for e in DATA["scenarios"]]
    assert len(names) == 53 and "e_duplicate_evicted" in names
    preempted = sum(any(row[FIELDS.index("preempted")] for row in e["steps"]) for e in DATA["scenarios"])
    hits = sum(any(c > 0 for row in e["steps"] for _, c in row[FIELDS.index("computed")]) for e in DATA["scenarios"])
    assert preempted >= 10 and hits >= 30


def _async_mismatch(entry: dict, async_output: bool = True) -> str | None:
    """The first difference between the twin and vLLM's recorded async run of ``entry`` (None: none)."""
    scn = entry["scenario"]
    steps = entry["steps"]
    with_free_order = any(row[ASYNC_FIELDS.index("free_order")] is not None for row in steps)
    got_all = list(_replay_async(scn, with_free_order, async_output))
    expected: dict = {"free_order": None}
    for i, (row, got) in enumerate(zip(steps, got_all)):
        for f, v in zip(ASYNC_FIELDS, row):
            if f in ("held", "cached", "free_order") and v is None:
                continue
            expected[f] = sorted(v) if f == "held" else v
        for f in ASYNC_FIELDS:
            if got[f] != expected[f]:
                return f"{scn['name']} step {i}: {f}\n  vLLM {expected[f]}\n  twin {got[f]}"
    if len(got_all) != len(steps):
        return f"{scn['name']}: vLLM ran {len(steps) - 1} steps, the twin {len(got_all) - 1}"
    return None


@pytest.mark.parametrize("pool", sorted(POOLS))
@pytest.mark.parametrize("entry", ASYNC["scenarios"], ids=[e["scenario"]["name"] for e in ASYNC["scenarios"]])
def test_twin_schedules_as_vllm_did_with_async_scheduling(entry: dict, pool: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step starts when vLLM's did on the GPU, with the same requests, tokens, computed tokens and
    preemptions; the same requests finish in the outputs applied before it; the pool (free count, block ids,
    cached blocks, free queue) is the same after it was formed; and the same after the last output."""
    monkeypatch.setattr(kv_cache, "BlockPool", POOLS[pool])
    mismatch = _async_mismatch(entry)
    assert mismatch is None, mismatch


def test_async_recording_covers_what_it_claims_and_needs_async_output() -> None:
    """vLLM 0.12.0 run with async scheduling; scenarios where a request whose last token was in flight was
    the preemption victim (reported preempted and finished by the same step), bursts at an idle engine, prefix
    hits. The twin's plain lookahead (async_output off) gets most of them wrong: the difference is real."""
    assert ASYNC["vllm_version"] == "0.12.0" and load_engine("vllm").async_output
    entries = {e["scenario"]["name"]: e for e in ASYNC["scenarios"]}
    assert len(entries) == 68 and {"x_burst", "x_seat_in_flight", "x_victim_in_flight"} <= set(entries)
    pre, fin = ASYNC_FIELDS.index("preempted"), ASYNC_FIELDS.index("finished")
    victims = [name for name, e in entries.items()
               if any(set(row[pre] or ()) & set(row[fin]) for row in e["steps"])]
    assert len(victims) >= 10 and "x_victim_in_flight" in victims
    wrong = [name for name, e in entries.items() if _async_mismatch(e, async_output=False) is not None]
    assert len(wrong) >= 60 and {"x_burst", "x_seat_in_flight", "x_victim_in_flight"} <= set(wrong)
