"""Record vLLM's v1 scheduler on the differential scenarios (run with an interpreter that has vLLM).

    python -m experiments.vllm_differential.record [OUT.json]          # from the repository root
    python -m experiments.vllm_differential.record --async [OUT.json]  # async scheduling (vLLM's default)

vLLM 0.12.0 installs from PyPI into its own virtual environment (``pip install vllm==0.12.0``, about
10 GB with torch; no GPU is needed). Nothing is downloaded at run time: the model config is the
Llama-3.1-8B config shipped in hardware/data/models, the tokenizer is skipped, token ids come from
``scenarios.stream_token``.

vLLM's ``Scheduler`` runs step by step as its engine core drives it (``schedule()``, then
``update_from_output()``) with a fake ``ModelRunnerOutput`` that samples one token for every request that
has computed all its tokens; async scheduling off, chunked prefill on, FCFS, ``ignore_eos``. Per step it
records what was scheduled (in schedule order), each scheduled request's computed tokens at the step's
start (prefix hits and resumes show there), the preempted and finished requests, the free-block count,
the blocks each request holds, the blocks a lookup of each cached hash finds, and the free queue.

The scenarios recorded: the hand-written ones, random ones that preempt or get prefix hits (a spread of
seeds, up to ``QUOTA``), and ``COPIES``: random ones in which a block is computed twice and the first copy
is evicted while the second is cached, which vLLM finds and a pool keeping one block per hash does not
(found by comparing the twin with vLLM on 2,400 random scenarios; they are kept in the set).

``--async`` records vLLM's AsyncScheduler driven as its engine core drives it by default (``run_async``:
two batches in flight, each step two time units on the GPU, arrivals at their times), on the hand-written
scenarios, async cases (``scenarios.async_hand_scenarios``) and ``ASYNC_PICKED`` random ones; ``--candidates``
records all ``ASYNC_RANDOM`` x 2 random ones (to choose from). The twin replays them with
SchedulerLimits.async_output (tests/twin/test_twin_vllm_differential.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from experiments.vllm_differential import scenarios as sc  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL_JSON = HERE.parents[1] / "hardware" / "data" / "models" / "meta-llama--Meta-Llama-3.1-8B.json"
MAX_MODEL_LEN = 4096
EOS = 128001
QUOTA = 36
COPIES = {"e_duplicate_evicted", "hard_73", "hard_193", "hard_239", "hard_362", "hard_373", "hard_398"}
STEP_FIELDS = ["scheduled", "computed", "preempted", "finished", "num_free", "held", "cached", "free_order"]
MAX_FREE_ORDER_BLOCKS = 48
"""The free queue is recorded only for pools of at most this many blocks (keeps the file small)."""


class VllmScheduler:
    """vLLM's v1 scheduler built without a GPU for one scenario's limits (``async_scheduling``: its
    AsyncScheduler, as vLLM 0.12 runs by default)."""

    def __init__(self, lim: dict, model_dir: str, async_scheduling: bool = False) -> None:
        import torch
        from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        bs = lim["block_size"]
        model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16", seed=0,
                            max_model_len=MAX_MODEL_LEN)
        scheduler_config = SchedulerConfig(max_num_seqs=lim["max_num_seqs"],
                                           max_num_batched_tokens=lim["max_num_batched_tokens"],
                                           max_model_len=MAX_MODEL_LEN, long_prefill_token_threshold=0,
                                           enable_chunked_prefill=True, async_scheduling=async_scheduling,
                                           is_encoder_decoder=False)
        cache_config = CacheConfig(block_size=bs, gpu_memory_utilization=0.9, swap_space=0, cache_dtype="auto",
                                   enable_prefix_caching=lim["prefix_caching"])
        config = VllmConfig(scheduler_config=scheduler_config, model_config=model, cache_config=cache_config,
                            device_config=DeviceConfig(device="cpu"))
        kv_cache_config = KVCacheConfig(
            num_blocks=lim["num_gpu_blocks"], kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=bs, num_kv_heads=1,
                                                                            head_size=1, dtype=torch.float32))])
        cache_config.num_gpu_blocks = lim["num_gpu_blocks"]
        cls = AsyncScheduler if async_scheduling else Scheduler
        self.sched = cls(vllm_config=config, kv_cache_config=kv_cache_config,
                         structured_output_manager=StructuredOutputManager(config), block_size=bs, log_stats=True)
        self.hasher = get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))

    def add(self, r: dict) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True)
        self.sched.add_request(Request(request_id=str(r["id"]), prompt_token_ids=sc.prompt_token_ids(r),
                                       sampling_params=params, pooling_params=None, eos_token_id=EOS,
                                       block_hasher=self.hasher))

    def pool_state(self) -> dict[str, Any]:
        manager = self.sched.kv_cache_manager
        pool = manager.block_pool
        cached = []
        for v in pool.cached_block_hash_to_block._cache.values():  # a block, or {block_id: block} of copies
            cached.append(v.block_id if not isinstance(v, dict) else next(iter(v.values())).block_id)
        held = manager.coordinator.single_type_managers[0].req_to_blocks
        return dict(num_free=pool.get_num_free_blocks(),
                    free_order=[b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
                    cached=sorted(cached),
                    held=sorted([int(rid), [b.block_id for b in blocks]] for rid, blocks in held.items() if blocks))


def run(scn: dict, model_dir: str, max_steps: int = 2000) -> list[dict]:
    """vLLM's decisions on ``scn``, one record per step, until every request has finished."""
    from vllm.v1.outputs import ModelRunnerOutput

    vs = VllmScheduler(scn["limits"], model_dir)
    sched = vs.sched
    reqs = {r["id"]: r for r in scn["requests"]}
    arrivals: dict[int, list[dict]] = {}
    for r in scn["requests"]:
        arrivals.setdefault(r["arrival"], []).append(r)
    outputs = dict.fromkeys(reqs, 0)
    steps = []
    done = 0
    for step in range(max_steps):
        for r in arrivals.get(step, []):
            vs.add(r)
        so = sched.schedule()
        scheduled = dict(so.num_scheduled_tokens)
        ids, sampled, computed = [], [], []
        for rid, n in scheduled.items():
            req = sched.requests[rid]
            computed.append([int(rid), req.num_computed_tokens - n])  # (schedule() advanced it by n)
            ids.append(rid)
            if req.num_computed_tokens >= req.num_tokens:  # its prompt is computed: it samples a token
                sampled.append([sc.output_token(reqs[int(rid)], outputs[int(rid)])])
            else:
                sampled.append([])
        before = set(sched.requests)
        sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                       sampled_token_ids=sampled, logprobs=None,
                                                       prompt_logprobs_dict={}, pooler_output=[]))
        for rid, s in zip(ids, sampled):
            outputs[int(rid)] += bool(s)
        finished = [int(rid) for rid in ids if rid in before and rid not in sched.requests]
        steps.append(dict(scheduled=[[int(k), v] for k, v in scheduled.items()], computed=computed,
                          preempted=sorted(int(r) for r in so.preempted_req_ids), finished=finished,
                          **vs.pool_state()))
        done += len(finished)
        if done == len(reqs) and step >= max(arrivals):
            return steps
    raise RuntimeError(f"{scn['name']}: not done after {max_steps} steps")


STEP_TIME = sc.STEP_TIME


def run_async(scn: dict, model_dir: str, max_iterations: int = 20000) -> list[dict]:
    """vLLM's decisions on ``scn`` with async scheduling, driven as vLLM 0.12's engine core drives it:
    EngineCore.run_busy_loop (take every request that has arrived, then step) around
    step_with_batch_queue with a queue of two batches (schedule a batch; return at once if the queue has
    room and its oldest batch is still running; else wait for the oldest and apply its output with
    update_from_output). The GPU runs one batch at a time, each STEP_TIME long; requests arrive at their
    ``t``. One record per executed batch: its start on the GPU, what schedule() gave it, the requests that
    finished in the outputs applied since the last record, and the pool after the loop turn that formed it
    (which applies the batch before it, once it has ended). A last record (scheduled null) has the
    finishes and the pool after every output is applied."""
    from collections import deque

    from vllm.v1.outputs import ModelRunnerOutput

    vs = VllmScheduler(scn["limits"], model_dir, async_scheduling=True)
    sched = vs.sched
    reqs = {r["id"]: r for r in scn["requests"]}
    pending = sorted(scn["requests"], key=lambda r: (r["t"], r["id"]))
    issued = dict.fromkeys(reqs, 0)  # tokens sampled so far per request, outputs in flight included
    queue: deque = deque()  # (end time, scheduler output, model output), newest first
    t = gpu_free = 0
    steps: list[dict] = []
    finished: list[int] = []
    for _ in range(max_iterations):
        # EngineCore._process_input_queue: block for a request when idle, then take all that have arrived.
        if not sched.has_requests() and not queue:
            if not pending:
                steps.append(dict(start=None, scheduled=None, computed=None, preempted=None, finished=finished,
                                  **vs.pool_state()))
                return steps
            t = max(t, pending[0]["t"])
        while pending and pending[0]["t"] <= t:
            vs.add(pending.pop(0))
        # EngineCore.step_with_batch_queue
        if sched.has_requests():
            placeholders = {rid: r.num_output_placeholders for rid, r in sched.requests.items()}
            so = sched.schedule()
            scheduled = dict(so.num_scheduled_tokens)
            executed = so.total_num_scheduled_tokens > 0
            ids, sampled = list(scheduled), []
            for rid in ids:
                req = sched.requests[rid]
                if req.num_output_placeholders > placeholders.get(rid, 0):  # it samples in this batch
                    sampled.append([sc.output_token(reqs[int(rid)], issued[int(rid)])])
                    issued[int(rid)] += 1
                else:
                    sampled.append([])
            output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                       sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                                       pooler_output=[])
            end = t
            record: dict[str, Any] = {}
            if executed:
                start = max(t, gpu_free)
                end = gpu_free = start + STEP_TIME
                record = dict(start=start, scheduled=[[int(k), v] for k, v in scheduled.items()],
                              computed=[[int(rid), sched.requests[rid].num_computed_tokens - n]
                                        for rid, n in scheduled.items()],
                              preempted=sorted(int(r) for r in so.preempted_req_ids))
                steps.append(record)
            queue.appendleft((end, so, output))
            if record and len(queue) < 2 and queue[-1][0] > t:
                record["finished"], finished = finished, []
                record.update(vs.pool_state())
                continue
        elif not queue:
            continue
        end, so, output = queue.pop()
        t = max(t, end)
        before = set(sched.requests)
        sched.update_from_output(so, output)
        finished += [int(rid) for rid in so.num_scheduled_tokens if rid in before and rid not in sched.requests]
        if steps and "finished" not in steps[-1]:
            steps[-1]["finished"], finished = finished, []
            steps[-1].update(vs.pool_state())
    raise RuntimeError(f"{scn['name']}: not done after {max_iterations} loop turns")


def preempts_or_hits(steps: list[dict]) -> bool:
    seen: set[int] = set()
    for s in steps:
        if s["preempted"]:
            return True
        for rid, c in s["computed"]:
            if rid not in seen and c > 0:
                return True
            seen.add(rid)
    return False


ASYNC_FIELDS = ["start", *STEP_FIELDS]
ASYNC_RANDOM = 300
"""Random scenarios tried for the async recording (each seed, easy and hard, arrival times jittered)."""
ASYNC_PICKED = {
    "async_hard_28", "async_hard_48", "async_hard_76", "async_hard_83", "async_hard_92", "async_hard_99",
    "async_hard_105", "async_hard_138", "async_hard_139", "async_hard_231", "async_hard_238", "async_hard_244",
    "async_hard_246", "async_hard_257", "async_hard_261", "async_hard_268", "async_hard_272", "async_hard_275",
    "async_hard_288", "async_hard_293", "async_rand_2", "async_rand_7", "async_rand_12", "async_rand_32",
    "async_rand_34", "async_rand_41", "async_rand_57", "async_rand_88", "async_rand_92", "async_rand_125",
    "async_rand_127", "async_rand_133", "async_rand_137", "async_rand_143", "async_rand_144", "async_rand_149",
    "async_rand_150", "async_rand_176", "async_rand_179", "async_rand_180", "async_rand_183", "async_rand_197",
    "async_rand_206", "async_rand_210", "async_rand_217", "async_rand_232", "async_rand_239", "async_rand_246",
    "async_rand_247", "async_rand_261", "async_rand_271", "async_rand_272", "async_rand_276"
}
"""The random async scenarios kept (``--candidates`` records all 600; on 557 of them the twin without
SchedulerLimits.async_output decided differently from vLLM, on none with it): 12 in which a request whose last
token was in flight was the preemption victim, 20 other preempting ones, 20 with prefix hits (the smallest
of each kind), and async_hard_288 (a pass that only preempted: vLLM forms the next step after the running
one ends)."""


def async_candidates() -> list[dict]:
    out = []
    for hard in (False, True):
        for seed in range(ASYNC_RANDOM):
            scn = sc.timed(sc.random_scenario(seed, hard=hard), jitter_seed=seed + (10**6 if hard else 0))
            scn["name"] = "async_" + scn["name"]
            out.append(scn)
    return out


def main(argv: list[str] | None = None) -> int:
    import vllm
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import init_none_hash

    args = list(sys.argv[1:] if argv is None else argv)
    mode = "sync"
    for flag in ("--async", "--candidates"):
        if flag in args:
            args.remove(flag)
            mode = flag[2:]
    suffix = "" if mode == "sync" else "_async" if mode == "async" else "_async_candidates"
    out = Path(args[0]) if args else HERE / f"vllm_{vllm.__version__.replace('.', '_')}{suffix}.json"
    init_none_hash(get_hash_fn_by_name("sha256"))
    model_dir = tempfile.mkdtemp(prefix="vllm-differential-")
    try:
        shutil.copy(MODEL_JSON, os.path.join(model_dir, "config.json"))
        if mode == "sync":
            chosen = [(scn, run(scn, model_dir)) for scn in sc.hand_scenarios()]
            picked = 0
            for hard in (False, True):
                for seed in range(400):
                    scn = sc.random_scenario(seed, hard=hard)
                    if scn["name"] in COPIES:
                        chosen.append((scn, run(scn, model_dir)))
                    elif picked < QUOTA and seed % 4 == 0:
                        steps = run(scn, model_dir)
                        if preempts_or_hits(steps):
                            chosen.append((scn, steps))
                            picked += 1
        else:
            scns = sc.async_hand_scenarios() + [scn for scn in async_candidates()
                                                 if mode == "candidates" or scn["name"] in ASYNC_PICKED]
            chosen = [(scn, run_async(scn, model_dir)) for scn in scns]
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    fields = STEP_FIELDS if mode == "sync" else ASYNC_FIELDS
    result: dict[str, Any] = dict(
        vllm_version=vllm.__version__,
        token_rule=("request tokens: the first n tokens of stream 'group:G' (shared [G, n]) then stream "
                    "'own:ID'; output tokens continue 'own:ID' (experiments/vllm_differential/scenarios.py); "
                    "hashes sha256 (vLLM's default); block ids as vLLM reports them (0 is vLLM's null block: "
                    "twin id = vLLM id - 1)"),
        limits_note=("vLLM Scheduler, chunked prefill on, async scheduling off, long_prefill_token_threshold 0, "
                     "max_model_len 4096, FCFS; num_gpu_blocks counts the null block (the twin gets "
                     "num_gpu_blocks - 1)") if mode == "sync" else
                    ("vLLM AsyncScheduler driven as EngineCore.step_with_batch_queue with two batches in flight "
                     f"(record.run_async), each step {STEP_TIME} time units, requests arriving at their t; "
                     "chunked prefill on, long_prefill_token_threshold 0, max_model_len 4096, FCFS; "
                     "num_gpu_blocks counts the null block (the twin gets num_gpu_blocks - 1)"),
        step_fields=fields,
        step_note=("each step is a list in step_fields order; held, cached and free_order are null when equal to "
                   "the previous step's (free_order always null for pools over "
                   f"{MAX_FREE_ORDER_BLOCKS} blocks); scheduled in schedule order, preempted sorted, finished "
                   "in update order" + ("" if mode == "sync" else
                                        "; start: the step's start on the GPU; the last record (start null) "
                                        "holds the finishes and the pool once every output is applied")),
        scenarios=[])
    for scn, steps in chosen:
        rows = []
        prev: dict[str, Any] = {}
        for s in steps:
            if scn["limits"]["num_gpu_blocks"] > MAX_FREE_ORDER_BLOCKS:
                s["free_order"] = None
            row = []
            for f in fields:
                v = s[f]
                if f in ("held", "cached", "free_order"):
                    v, prev[f] = (None if v == prev.get(f) else v), v
                row.append(v)
            rows.append(row)
        result["scenarios"].append(dict(scenario=scn, steps=rows))
    out.write_text(json.dumps(result, separators=(",", ":")))
    print(f"{len(chosen)} scenarios, {out.stat().st_size} bytes -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
