"""Results that would mislead: a block count no GPU holds, a run that completes nothing."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from twin.cli import main
from twin.config import load_config
from twin.core.errors import ConfigError
from twin.results import fail_kind
from twin.runner import Simulation

TINY = {"workload": {"kind": "synthetic", "num_requests": 6, "arrival": {"kind": "poisson", "rate_per_s": 20.0},
                     "input_tokens": {"fixed": 512}, "output_tokens": {"fixed": 16}}}


def test_a_block_count_must_fit_beside_the_weights() -> None:
    """Llama-3.1-8B on an H100: 80 GiB less 14.96 GiB of weights and the activation reserve holds 31,888
    blocks of 2 MiB; one more is refused with both figures, and so is any count for a model that does not
    fit at all (405B in BF16 on one GPU ran with plausible numbers)."""
    Simulation(load_config(TINY, ["kv_cache.num_blocks=31888"]))
    with pytest.raises(ConfigError, match=r"31,889 blocks of 2 MiB .* at most 31,888 blocks") as err:
        Simulation(load_config(TINY, ["kv_cache.num_blocks=31889"]))
    assert err.value.path == "kv_cache.num_blocks"
    with pytest.raises(ConfigError, match=r"5,000 blocks set, but meta-llama/Llama-3.1-405B does not fit"):
        Simulation(load_config(TINY, ["model.name=meta-llama/Llama-3.1-405B", "kv_cache.num_blocks=5000"]))


def test_a_pools_own_block_count_is_checked_under_its_field() -> None:
    cfg = {**TINY, "system": {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 1,
                                                                                        "num_blocks": 10 ** 6}}}
    with pytest.raises(ConfigError, match="at most") as err:
        Simulation(load_config(cfg))
    assert err.value.path == "system.decode.num_blocks"


def test_failures_group_by_kind_and_a_run_that_completes_nothing_exits_non_zero(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert fail_kind("needs 129 KV blocks (1762 prompt + 298 output tokens) but worker 0 holds only 10") == \
        "needs N KV blocks (N prompt + N output tokens) but worker N holds only N"
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    assert main(["run", str(config), "--out", str(tmp_path / "r"), "--no-plots", "--set", "kv_cache.num_blocks=10"]) == 1
    out, err = capsys.readouterr()
    reason = "needs 33 KV blocks (512 prompt + 16 output tokens) but worker 0 holds only 10"
    assert f"failed: 6 x {reason} (and similar)" in out
    assert err.strip() == f"twin: error: no request completed: 6 of 6 failed with {reason!r}"
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["fail_reasons"] == {fail_kind(reason): {"count": 6, "example": reason}}
    sweep_out = tmp_path / "s"
    assert main(["sweep", str(config), "--grid", "kv_cache.num_blocks=10,2000", "--out", str(sweep_out)]) == 1
    rows = list(csv.DictReader(open(sweep_out / "sweep.csv")))
    assert rows[0]["error"].startswith("no request completed: 6 of 6 failed") and rows[1]["error"] == ""


def test_each_workers_kv_capacity_is_reported_with_its_role(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """As vLLM prints '# GPU blocks' at start-up: Llama-3.1-8B on an H100 at utilisation 0.9 holds 27,792
    blocks of 16 tokens and 2 MiB (32 layers x 8 KV heads x 128 x K, V x 2 bytes x 16), 54.3 GiB."""
    cfg = {**TINY, "system": {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 2}}}
    summary = Simulation(load_config(cfg)).run().summary
    assert summary["kv_capacity"] == [
        {"worker": name, "role": name.rstrip("01"), "blocks": 27792, "tokens": 27792 * 16,
         "gib_per_gpu": 27792 * 2 / 1024} for name in ("prefill0", "decode0", "decode1")]
    config = tmp_path / "disagg.yaml"
    config.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(config), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "KV cache: 1 prefill worker x 27,792 blocks (444,672 tokens, 54.3 GiB per GPU)" in out
    assert "KV cache: 2 decode workers x 27,792 blocks (444,672 tokens, 54.3 GiB per GPU)" in out
