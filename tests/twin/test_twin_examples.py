"""Golden end-to-end runs of every built-in example: facts that hold by construction, checked per request."""

import numpy as np
import pytest

from twin.cli import example_path, list_examples
from twin.config import load_config
from twin.runner import Simulation
from twin.sources import resolve_data_path
from workloads.io import read_sessions
from workloads.sessions import prompt_tokens


def test_every_example_is_listed_and_loads():
    assert set(list_examples()) >= {"chat", "disagg", "agentic", "dp_attention"}
    for name in list_examples():
        load_config(example_path(name))


def test_chat_example_serves_what_its_generator_drew():
    cfg = load_config(example_path("chat"), ["workload.num_requests=120"])
    sim = Simulation(cfg)
    res = sim.run()
    t = res.requests
    assert res.summary["requests"]["completed"] == 120
    w = cfg.workload
    assert ((t["prompt_tokens"] >= w.input_tokens.low) & (t["prompt_tokens"] <= w.input_tokens.high)).all()
    assert ((t["output_tokens"] >= w.output_tokens.low) & (t["output_tokens"] <= w.output_tokens.high)).all()
    # Every prompt starts with the 64-token system prompt: 4 cached blocks once the first one ran.
    assert (t["cached_tokens"][1:] >= 64).mean() > 0.9 and t["cached_tokens"][0] == 0
    assert (t["first_token_s"] > t["arrival_s"]).all() and (t["finish_s"] >= t["first_token_s"]).all()
    # Busy time on the single worker never exceeds the simulated span.
    assert res.ledger["worker0"]["busy_s"] <= res.summary["sim"]["simulated_s"] + 1e-9


def test_disagg_example_kv_lifecycle_is_ordered_and_bytes_add_up():
    cfg = load_config(example_path("disagg"), ["workload.num_users=6", "workload.num_rounds=3"])
    sim = Simulation(cfg)
    res = sim.run()
    t = res.requests
    assert res.summary["requests"]["failed"] == 0
    assert (t["kv_state"] == "freed").all()
    assert (t["kv_pull_s"] >= t["kv_staged_s"]).all() and (t["kv_resident_s"] >= t["kv_pull_s"]).all()
    assert (t["first_token_s"] > t["kv_resident_s"]).all()  # the first token comes from the decode worker
    kv = res.summary["kv_transfer"]
    assert kv["pulls"] == len(t) and kv["bytes"] == t["transfer_bytes"].sum()
    per_block = sim.system.p_dep.bytes_per_block(16)
    assert kv["bytes"] == kv["blocks"] * per_block
    # Later rounds of a user go to the same decode worker and reuse its blocks (delta pulls).
    assert kv["reused_blocks"] > 0 and set(kv["staged_s"]) >= {"mean", "p99"}


@pytest.mark.parametrize("limit", [3])
def test_agentic_example_replays_the_shipped_calls_and_their_waits(limit):
    cfg = load_config(example_path("agentic"), [f"workload.limit={limit}"])
    res = Simulation(cfg).run()
    t = res.requests
    sessions = read_sessions(resolve_data_path(cfg.workload.path))[:limit]
    assert res.summary["sessions"]["finished"] == limit and res.summary["requests"]["failed"] == 0
    for s in sessions:
        rows = t[t["session"] == s.id]
        assert list(rows["prompt_tokens"]) == prompt_tokens(s)
        assert list(rows["output_tokens"]) == [c.output_tokens for c in s.calls]
        # Call k+1 is sent exactly one tool wait after call k's last token (times are integer ns).
        gaps = np.round((rows["arrival_s"][1:] - rows["finish_s"][:-1]) * 1e9)
        assert list(gaps) == [round(c.wait_after_s * 1e9) for c in s.calls[:-1]]


def test_dp_attention_example_runs_its_eight_ranks_in_lockstep():
    cfg = load_config(example_path("dp_attention"), ["workload.num_requests=160"])
    res = Simulation(cfg).run()
    assert res.summary["requests"]["completed"] == 160
    ledgers = [res.ledger[f"worker{i}"] for i in range(8)]
    # Every rank takes part in every step of the group, for the same time; each one's terms and its wait for
    # the slowest add up to that time (whole nanoseconds per step).
    assert len({(led["steps"], led["busy_s"]) for led in ledgers}) == 1
    for led in ledgers:
        assert sum(led["terms_s"].values()) == pytest.approx(led["busy_s"], abs=led["steps"] * 1e-9)
    # The first 128 requests arrive together and fill the ranks evenly, 16 each (TensorRT-LLM: the fewest
    # requests); the other 32 go where requests finished first.
    first = np.argsort(res.requests["arrival_s"], kind="stable")[:128]
    assert list(np.bincount(res.requests["worker"][first], minlength=8)) == [16] * 8

