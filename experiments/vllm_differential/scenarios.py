"""The differential scenarios, shared by the vLLM recorder and the twin's replay (standard library only).

A scenario is a dict:
  name, limits: {max_num_batched_tokens, max_num_seqs, block_size, num_gpu_blocks (vLLM's, incl. the
  null block), prefix_caching}, steps (how many steps to run at most),
  requests: [{id, arrival (step index), prompt, max_tokens, shared: [group, n] or null}]
A request's tokens are the first n tokens of stream ("group", group) then its own stream ("own", id) --
the same layout as the twin testkit's make_request(shared=(group, n)): its prompt is ``prompt`` tokens,
and the fake model samples the own stream's continuation as output tokens, so that the vLLM token ids
and the twin's block keys describe the same token sequence.
"""

from __future__ import annotations

import hashlib
import random

VOCAB = 32000


def stream_token(name: str, i: int) -> int:
    h = hashlib.blake2b(f"{name}:{i}".encode(), digest_size=8).digest()
    return 1 + int.from_bytes(h, "little") % (VOCAB - 1)


def own_stream(req: dict) -> str:
    return f"own:{req['id']}"


def group_stream(group: str) -> str:
    return f"group:{group}"


def own_prompt_len(req: dict) -> int:
    return req["prompt"] - (req["shared"][1] if req.get("shared") else 0)


def prompt_token_ids(req: dict) -> list[int]:
    ids: list[int] = []
    if req.get("shared"):
        g, n = req["shared"]
        ids += [stream_token(group_stream(g), i) for i in range(n)]
    ids += [stream_token(own_stream(req), i) for i in range(own_prompt_len(req))]
    assert len(ids) == req["prompt"]
    return ids


def output_token(req: dict, k: int) -> int:
    """The k-th sampled token (0-based) of ``req``: its own stream after the prompt."""
    return stream_token(own_stream(req), own_prompt_len(req) + k)


def limits(mnbt: int = 64, seqs: int = 16, bs: int = 4, blocks: int = 64, caching: bool = True) -> dict:
    return dict(max_num_batched_tokens=mnbt, max_num_seqs=seqs, block_size=bs, num_gpu_blocks=blocks,
                prefix_caching=caching)


def req(rid: int, prompt: int, out: int, arrival: int = 0, shared: tuple[str, int] | None = None) -> dict:
    return dict(id=rid, arrival=arrival, prompt=prompt, max_tokens=out,
                shared=list(shared) if shared else None)


def hand_scenarios() -> list[dict]:
    S: list[dict] = []
    # (a) plain chunked prefill: long prompts, small budget
    S.append(dict(name="a_chunked_prefill", limits=limits(mnbt=16, seqs=8, bs=4, blocks=128, caching=False),
                  requests=[req(0, 50, 5), req(1, 37, 3), req(2, 9, 4, arrival=2), req(3, 70, 2, arrival=3)]))
    S.append(dict(name="a_chunked_prefill_cached", limits=limits(mnbt=13, seqs=8, bs=4, blocks=128),
                  requests=[req(0, 50, 5), req(1, 37, 3), req(2, 9, 4, arrival=2), req(3, 70, 2, arrival=3)]))
    # (b) max_num_seqs binding
    S.append(dict(name="b_max_num_seqs", limits=limits(mnbt=64, seqs=2, bs=4, blocks=128),
                  requests=[req(i, 6 + i, 4 + (i % 3), arrival=i // 2) for i in range(6)]))
    # (c) prefix caching: hits while the first runs, and after it finished
    S.append(dict(name="c_prefix_running", limits=limits(mnbt=32, seqs=8, bs=4, blocks=128),
                  requests=[req(0, 30, 6, shared=("A", 24)), req(1, 28, 3, arrival=2, shared=("A", 24)),
                            req(2, 20, 3, arrival=3, shared=("A", 13)), req(3, 26, 2, arrival=12, shared=("A", 24)),
                            req(4, 24, 2, arrival=14, shared=("A", 24))]))
    S.append(dict(name="c_prefix_same_step", limits=limits(mnbt=64, seqs=8, bs=4, blocks=128),
                  requests=[req(0, 16, 4, shared=("A", 16)), req(1, 16, 4, shared=("A", 16)),
                            req(2, 17, 4, shared=("A", 16)), req(3, 16, 3, arrival=6, shared=("A", 16))]))
    S.append(dict(name="c_prefix_chunked_dup", limits=limits(mnbt=12, seqs=8, bs=4, blocks=128),
                  requests=[req(0, 30, 3, shared=("A", 28)), req(1, 30, 3, arrival=1, shared=("A", 28)),
                            req(2, 30, 2, arrival=12, shared=("A", 28))]))
    # (d) KV pressure: preemption, recompute, re-admission with hits on the victim's own blocks
    S.append(dict(name="d_preempt", limits=limits(mnbt=32, seqs=8, bs=4, blocks=17),
                  requests=[req(0, 20, 20), req(1, 20, 20), req(2, 12, 10, arrival=1)]))
    S.append(dict(name="d_preempt_nocache", limits=limits(mnbt=32, seqs=8, bs=4, blocks=17, caching=False),
                  requests=[req(0, 20, 20), req(1, 20, 20), req(2, 12, 10, arrival=1)]))
    S.append(dict(name="d_preempt_shared", limits=limits(mnbt=24, seqs=8, bs=4, blocks=15),
                  requests=[req(0, 18, 14, shared=("A", 16)), req(1, 18, 14, shared=("A", 16)),
                            req(2, 18, 12, arrival=2, shared=("A", 16)), req(3, 10, 8, arrival=4)]))
    # (e) eviction order of cached free blocks: LRU, tail-first release
    S.append(dict(name="e_eviction", limits=limits(mnbt=64, seqs=8, bs=4, blocks=13),
                  requests=[req(0, 16, 2, shared=("A", 16)), req(1, 16, 2, arrival=3, shared=("B", 16)),
                            req(2, 17, 2, arrival=6, shared=("A", 16)), req(3, 24, 2, arrival=9),
                            req(4, 17, 2, arrival=12, shared=("A", 16)), req(5, 17, 2, arrival=14, shared=("B", 16))]))
    # (e) a block computed twice (same prefix, the second admitted when the first's last prompt block was
    # not hit: vLLM hits at most num_tokens - 1 tokens) is cached twice in vLLM; the first copy is evicted
    S.append(dict(name="e_duplicate_evicted", limits=limits(mnbt=64, seqs=8, bs=4, blocks=8),
                  requests=[req(0, 16, 1, shared=("A", 16)), req(1, 16, 1, shared=("A", 16)),
                            req(2, 12, 1, arrival=1), req(3, 17, 2, arrival=2, shared=("A", 16))]))
    return S


def random_scenario(seed: int, hard: bool = False) -> dict:
    """A small random scenario; ``hard``: more requests on fewer prefixes and tighter pools (more hits,
    duplicate blocks, evictions and preemptions)."""
    rng = random.Random(seed if not hard else 10**6 + seed)
    bs = rng.choice([2, 4, 8])
    n = rng.randint(1, 7) if not hard else rng.randint(4, 10)
    groups = ["A", "B", "C"][: rng.randint(1, 3 if not hard else 2)]
    reqs: list[dict] = []
    for i in range(n):
        prompt = rng.randint(1, 6 * bs)
        shared = None
        if rng.random() < (0.6 if not hard else 0.9):
            g = rng.choice(groups)
            k = rng.randint(1, prompt)
            shared = (g, k)
        reqs.append(req(i, prompt, rng.randint(1, 4 * bs), arrival=rng.randint(0, 12), shared=shared))
    reqs.sort(key=lambda r: r["arrival"])
    for i, r in enumerate(reqs):  # ids in arrival order (the queue order of both schedulers)
        r["id"] = i
    max_need = max(-(-(r["prompt"] + r["max_tokens"]) // bs) for r in reqs)
    blocks = max_need + 1 + rng.randint(0, 2 * max_need if not hard else max_need // 2)
    mnbt = rng.choice([bs, 2 * bs, 3 * bs + 1, 5 * bs, 64])
    lim = limits(mnbt=mnbt, seqs=min(rng.randint(1, 5), mnbt), bs=bs,
                 blocks=blocks, caching=rng.random() < (0.8 if not hard else 1.0))
    return dict(name=f"{'hard' if hard else 'rand'}_{seed}", limits=lim, requests=reqs)


STEP_TIME = 2
"""Async scenarios (vLLM's async scheduling): every step takes 2 time units, so an arrival at an odd time
comes while a step runs, one at an even time at a step boundary."""


def timed(scn: dict, jitter_seed: int | None = None) -> dict:
    """``scn`` with arrival times for the async recording: a request's ``t`` is STEP_TIME x its arrival
    index, plus 0 or 1 drawn from ``jitter_seed`` (None: on the step boundaries)."""
    rng = random.Random(jitter_seed)
    out = dict(scn, requests=[dict(r) for r in scn["requests"]])
    for r in out["requests"]:
        r["t"] = STEP_TIME * r["arrival"] + (rng.randint(0, 1) if jitter_seed is not None else 0)
    return out


def async_hand_scenarios() -> list[dict]:
    """Cases of async scheduling: a burst at an idle engine that the first step cannot hold (the second
    step, formed at the same instant, sees the rest), a request whose last token is in flight holding its
    seat or its blocks, and arrivals at and between step boundaries."""
    S = [timed(scn) for scn in hand_scenarios()]
    S.append(dict(name="x_burst", limits=limits(mnbt=16, seqs=8, bs=4, blocks=128),
                  requests=[dict(req(i, 10, 3), t=0) for i in range(6)]))
    S.append(dict(name="x_seat_in_flight", limits=limits(mnbt=64, seqs=2, bs=4, blocks=128),
                  requests=[dict(req(0, 8, 2), t=0), dict(req(1, 8, 6), t=0), dict(req(2, 8, 3), t=1),
                            dict(req(3, 8, 3), t=4)]))
    S.append(dict(name="x_victim_in_flight", limits=limits(mnbt=32, seqs=8, bs=4, blocks=6),
                  requests=[dict(req(0, 7, 10), t=0), dict(req(1, 8, 2), t=0)]))
    S.append(dict(name="x_between_steps", limits=limits(mnbt=24, seqs=8, bs=4, blocks=128),
                  requests=[dict(req(i, 6 + 3 * i, 3 + i % 3, shared=("A", 4)), t=i) for i in range(8)]))
    return S
