"""Hardware what-ifs from specs: values and factors on the GPU, a user's GPU file, and what each one moves."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from hardware.gpu import GPU_DIR
from hardware.cost import TERMS
from twin.cli import main
from twin.config import load_config
from twin.core.errors import ConfigError
from twin.runner import Simulation, worker_names
from twin.whatif import hardware_whatif

TINY = {"workload": {"kind": "synthetic", "num_requests": 12, "arrival": {"kind": "poisson", "rate_per_s": 20.0},
                     "input_tokens": {"fixed": 512}, "output_tokens": {"fixed": 16}}}
NOT_THROUGHPUT = [t for t, (family, _) in TERMS.items() if family != "throughput"]


def whatif(*overrides: str) -> dict:
    sim = Simulation(load_config(None, list(overrides)))
    out = hardware_whatif(sim.config, sim.workers, worker_names(sim.system))
    assert out is not None
    (group,) = out["workers"]
    return group


def test_a_bandwidth_factor_moves_only_the_bandwidth_bound_terms() -> None:
    """Llama-3.1-8B on one H100 (vLLM): a decode step of 64 requests at 2,048 tokens of context reads weights
    and KV, so every op of it is bandwidth-bound; a prefill chunk of 8,192 tokens is compute-bound but for
    the elementwise kernels and the LM head (one row per prompt). HBM bandwidth x1.4 moves exactly the
    former, leaves the host, scheduler and runtime terms and the KV pool alone; FLOP/s x1.4 moves the
    complement."""
    bw = whatif("hardware.scale.hbm_bw=1.4")
    assert bw["kv_blocks"] == {"named": 27792, "whatif": 27792}
    assert sorted(bw["decode"]["moved"]) == ["attention", "elementwise", "lm_head", "mlp", "o_proj", "qkv_proj"]
    assert sorted(bw["prefill"]["moved"]) == ["elementwise", "lm_head"]
    for step in ("decode", "prefill"):
        assert not set(bw[step]["moved"]) & set(NOT_THROUGHPUT)
        # Faster, but never by more than the factor: the per-kernel floors do not scale.
        assert all(1 / 1.4 <= m["ratio"] < 1 for m in bw[step]["moved"].values())
    flops = whatif("hardware.scale.flops=1.4")
    assert flops["decode"]["moved"] == {}
    assert sorted(flops["prefill"]["moved"]) == ["attention", "mlp", "o_proj", "qkv_proj"]
    assert all(1 / 1.4 <= m["ratio"] < 1 for m in flops["prefill"]["moved"].values())


def test_a_capacity_factor_moves_only_the_kv_pool() -> None:
    """HBM capacity x0.7 at vLLM's gpu_memory_utilization 0.9 takes 0.3 x 0.9 x 80 GiB = 22,118 MiB from the
    pool, 11,059 blocks of 2 MiB (Llama-3.1-8B: 32 layers x 8 KV heads x 128 x K, V x 2 bytes x 16 tokens);
    no step price moves, and the launch defaults (token budget 8,192, 1,024 seats: vLLM's for a GPU of 70 GiB
    or more, which 56 GiB is not) stay those of the named GPU."""
    cap = whatif("hardware.scale.hbm_bytes=0.7")
    assert cap["kv_blocks"] == {"named": 27792, "whatif": 27792 - 11059}
    assert cap["decode"]["moved"] == cap["prefill"]["moved"] == {}
    sim = Simulation(load_config(None, ["hardware.scale.hbm_bytes=0.7"]))
    assert (sim.config.scheduler.max_num_batched_tokens, sim.config.scheduler.max_num_seqs) == (8192, 1024)


def test_a_link_factor_moves_the_collectives() -> None:
    tp2 = whatif("hardware.scale.scaleup_bw=2", "system.tp=2")
    assert list(tp2["decode"]["moved"]) == list(tp2["prefill"]["moved"]) == ["tp_allreduce"]


def test_values_replace_the_named_gpus_and_the_resolved_config_lists_them(tmp_path: Path) -> None:
    cfg = load_config(None, ["hardware.hbm_bw_Bps=4.8e12", "hardware.peak_flops.fp8=2.5e15",
                             "hardware.scale.hbm_bw=1.5"])
    spec = cfg.hardware.spec()
    assert spec.hbm_bw_Bps == pytest.approx(7.2e12) and spec.peak_flops == {"bf16": 989e12, "fp8": 2.5e15, "fp32": 67e12, "tf32": 494.5e12}
    assert spec.name == "h100_sxm" and spec.arch == "hopper"
    sim = Simulation(cfg)
    hw = sim.config.to_dict()["hardware"]
    # The named GPU's values with this config's own, before the factors (reloading it gives the same spec).
    assert hw["hbm_bw_Bps"] == 4.8e12 and hw["hbm_bytes"] == 85899345920 and hw["scale"]["hbm_bw"] == 1.5
    assert hw["peak_flops"] == {"bf16": 989e12, "fp8": 2.5e15, "fp32": 67e12, "tf32": 494.5e12}
    assert load_config(sim.config.to_dict()).hardware.spec() == spec
    ledger = hardware_whatif(sim.config, sim.workers, worker_names(sim.system))
    assert ledger is not None
    assert ledger["values"] == {"hbm_bw_Bps": 4.8e12, "peak_flops": {"fp8": 2.5e15}}
    assert ledger["factors"] == {"hbm_bw": 1.5} and ledger["spec"]["hbm_bw_Bps"] == pytest.approx(7.2e12)
    # As shipped: no what-if block.
    plain = Simulation(load_config(None, ["hardware.hbm_bw_Bps=3.35e12"]))
    assert hardware_whatif(plain.config, plain.workers, worker_names(plain.system)) is None


@pytest.mark.parametrize("override, path, message", [
    ("hardware.scale.hbm_bw=0", "hardware.scale.hbm_bw", "finite factor > 0"),
    ("hardware.scale.flops_fp4=2", "hardware.scale.flops_fp4", "h100_sxm has no fp4 rate of its own"),
    ("hardware.scale.bandwidth=2", "hardware.scale.bandwidth", "unknown key"),
    ("hardware.hbm_bytes=-5", "hardware.hbm_bytes", "finite number > 0"),
    ("hardware.peak_flops.fp8=.nan", "hardware.peak_flops.fp8", "finite number > 0"),
    ("hardware.gpu=mine.yaml", "hardware.gpu", "does not exist"),
])
def test_bad_hardware_values_name_the_field(override: str, path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        load_config(None, [override])
    assert err.value.path == path


def test_a_users_gpu_file_loads_by_path_with_the_shipped_checks(tmp_path: Path) -> None:
    shipped = yaml.safe_load((GPU_DIR / "h200_sxm.yaml").read_text())
    mine = dict(shipped, name="my_gpu", hbm_bw_Bps=6.0e12)
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "my_gpu.yaml").write_text(yaml.safe_dump(mine))
    (folder / "run.yaml").write_text(yaml.safe_dump({"hardware": {"gpu": "my_gpu.yaml"}, **TINY}))
    cfg = load_config(folder / "run.yaml")   # relative to the config's folder
    assert cfg.hardware.spec().hbm_bw_Bps == 6.0e12 and cfg.hardware.spec().name == "my_gpu"
    bad = dict(mine, hbm_bw_Bps=0)
    (folder / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"bad.yaml.*hbm_bw_Bps must be a finite number > 0"):
        load_config(None, [f"hardware.gpu={folder / 'bad.yaml'}"])


def test_a_sweep_over_bandwidth_and_capacity_runs_from_the_cli(tmp_path: Path) -> None:
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "sweep"
    assert main(["sweep", str(config), "--grid", "hardware.scale.hbm_bw=0.7,1.4",
                 "--grid", "hardware.scale.hbm_bytes=0.7,1.4", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert [(r["hardware.scale.hbm_bw"], r["hardware.scale.hbm_bytes"]) for r in rows] == \
        [("0.7", "0.7"), ("0.7", "1.4"), ("1.4", "0.7"), ("1.4", "1.4")]
    assert all(r["error"] == "" and r["completed"] == "12" for r in rows)
    tpot = [float(r["tpot_mean_s"]) for r in rows]
    assert tpot[0] == tpot[1] > tpot[2] == tpot[3]   # capacity leaves step times alone; bandwidth does not


def test_run_prints_and_writes_what_moved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "base.yaml"
    config.write_text(yaml.safe_dump(TINY))
    assert main(["run", str(config), "--out", str(tmp_path / "r"), "--no-plots",
                 "--set", "hardware.scale.hbm_bw=1.4"]) == 0
    printed = capsys.readouterr().out
    assert "hardware what-if: h100_sxm with hbm_bw x1.4" in printed
    assert "worker0: KV blocks 27,792 -> 27,792" in printed and "    decode step " in printed
    ledger = json.loads((tmp_path / "r" / "ledger.json").read_text())
    assert ledger["hardware_whatif"]["workers"][0]["workers"] == ["worker0"]
    assert yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())["hardware"]["scale"]["hbm_bw"] == 1.4


def test_constants_choose_an_architectures_set_or_a_folder_of_ones_own(tmp_path: Path) -> None:
    """hardware.constants: ``auto`` prices a GPU with its architecture's fitted set, an architecture's name
    with that one's (a B300 priced with Hopper's constants: the spec-only transfer), a folder with the sets
    found there; anything else is refused naming the field."""
    from hardware.calibration import calibration_for
    from hardware.gpu import load_gpu as gpu

    def cal(*overrides: str):
        sim = Simulation(load_config(TINY, list(overrides)))
        return sim.workers[0].prices.cost_model.cal

    assert cal("hardware.gpu=b300_sxm") is calibration_for("vllm", "blackwell")
    assert cal("hardware.gpu=b300_sxm", "hardware.constants=hopper") is calibration_for("vllm", "hopper")
    assert gpu("b300_sxm").arch == "blackwell" and cal("hardware.constants=auto") is calibration_for("vllm", "hopper")
    shipped = yaml.safe_load((GPU_DIR.parent / "calibration" / "vllm.yaml").read_text())
    shipped["gemm"]["bf16"]["compute_eff"] /= 2
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "vllm.yaml").write_text(yaml.safe_dump(shipped))
    mine = cal(f"hardware.constants={tmp_path / 'mine'}")
    assert mine.gemm_for("bf16").compute_eff == calibration_for("vllm", "hopper").gemm_for("bf16").compute_eff / 2
    with pytest.raises(ConfigError, match="must be one of") as err:
        load_config(None, ["hardware.constants=ampere_fit"])
    assert err.value.path == "hardware.constants"
    with pytest.raises(ConfigError, match="holds no sglang.yaml"):
        Simulation(load_config(TINY, [f"hardware.constants={tmp_path / 'mine'}", "engine.name=sglang"]))


def test_a_borrowed_moe_kernel_follows_the_chosen_constants() -> None:
    """SGLang with the flashinfer_trtllm MoE runner on a B300 takes vLLM's Blackwell curve; priced with the
    Hopper constants (the spec-only transfer) it takes vLLM's Hopper default curve instead."""
    from hardware.calibration import calibration_for

    base = ["engine.name=sglang", "engine.moe_kernel=flashinfer_trtllm", "model.name=Qwen/Qwen3-30B-A3B"]

    def lent(*more: str):
        cm = Simulation(load_config(TINY, [*base, "hardware.gpu=b300_sxm", *more])).workers[0].prices.cost_model
        return cm._moe_cals[id(cm.gcal)]

    floor = 4.0e-6   # SGLang's graph kernel floor (hardware/data/engines/sglang.yaml)
    assert lent().moe_for("bf16") == calibration_for("vllm", "blackwell").graph_mode(floor).moe_for("bf16")
    assert lent("hardware.constants=hopper").moe_for("bf16") == \
        calibration_for("vllm", "hopper").graph_mode(floor).moe_for("bf16")
    with pytest.raises(ConfigError, match="flashinfer_trtllm is priced with vllm's kernel tables") as err:
        Simulation(load_config(TINY, [*base, "hardware.gpu=h200_sxm"]))
    assert err.value.path == "engine.moe_kernel"
