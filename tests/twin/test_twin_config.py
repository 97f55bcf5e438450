"""Config loading: dotted-path errors, overrides, resolution of engine defaults, the CLI's exit codes."""

import json
import re

import pytest
import yaml

from twin.cli import list_examples, main
from twin.config import TwinConfig, load_config
from twin.core.errors import ConfigError
from twin.core.scheduler import SglangFcfsQueue
from twin.runner import Simulation
from twin.system import resolve


@pytest.mark.parametrize("override, path, expected", [
    ("scheduler.max_num_seqs=0", "scheduler.max_num_seqs", "must be a finite number > 0, got 0"),
    ("scheduler.max_num_seqs=abc", "scheduler.max_num_seqs", "expected an integer"),
    ("scheduler.policy=lifo", "scheduler.policy", "must be one of ['fcfs', 'priority']"),
    ("hardware.gpu=h900", "hardware.gpu", "no known gpu: 'h900'"),
    ("model.name=nope/nothing", "model.name", "no known model"),
    ("kv_cache.gpu_memory_utilization=1.5", "kv_cache.gpu_memory_utilization", "must be in (0, 1]"),
    ("scheduler.chunked_prefil=true", "scheduler.chunked_prefil", "unknown key"),
    ("router.kind=magic", "router.kind", "unknown router kind 'magic'"),
    ("engine.cuda_graph_mode=full", "engine.cuda_graph_mode", "must be one of ['full_and_piecewise', 'piecewise'"),
    ("engine.cuda_graph_max_size=0", "engine.cuda_graph_max_size", "must be a finite number > 0, got 0"),
    ("engine.cuda_graph_sizes=[0, 4]", "engine.cuda_graph_sizes", "must list positive integers, got [0, 4]"),
    ("workload.arrival.rate_per_s=-1", "workload.arrival.rate_per_s", "must be a finite number > 0"),
    ("run.max_sim_s=.inf", "run.max_sim_s", "must be a finite number > 0, got inf"),  # crashed in to_ns
    ("kv_cache.host_memory_gib=.inf", "kv_cache.host_memory_gib", "must be a finite number > 0, got inf"),
    ("run.seed=-1", "run.seed", "must be a finite number >= 0, got -1"),
    ("kind=synthetic", "kind", "a kind belongs to a section"),  # was ignored
    ("workload.input_tokens.low=10", "workload.input_tokens", "give either fixed, or both low and high"),
    ("workload.num_rounds=1", "workload.num_rounds", "must be >= 2"),  # found by fuzzing: a bare ValueError
])
def test_bad_values_name_the_dotted_path(override, path, expected):
    base = None
    if "input" in override:
        base = {"workload": {"kind": "synthetic", "input_tokens": {"fixed": 10}}}
    elif "num_rounds" in override:
        base = {"workload": {"kind": "lmbenchmark_multiround"}}
    with pytest.raises(ConfigError) as info:
        load_config(base, [override])
    assert info.value.path == path
    assert expected in str(info.value)


def test_a_kind_override_is_applied_before_the_others_in_its_section():
    """Found by fuzzing: a later workload.kind= used to replace the section, dropping earlier overrides."""
    for order in (["workload.num_requests=5", "workload.kind=synthetic"],
                  ["workload.kind=synthetic", "workload.num_requests=5"]):
        assert load_config(None, order).workload.num_requests == 5


def test_kind_overrides_of_nested_sections_apply_in_any_order():
    """Found by fuzzing: workload.arrival.kind=gamma given before workload.kind=synthetic was dropped without a
    word (the workload kind, applied second, replaced the section with the file's own, Poisson arrival
    included); after it, it took. Outer sections' kinds now apply first, so both orders give gamma."""
    from twin.cli import example_path
    from twin.sources import GammaArrival

    kinds = ["workload.arrival.kind=gamma", "workload.kind=synthetic"]
    for order in (kinds, kinds[::-1]):
        arrival = load_config(example_path("chat"), [*order, "workload.arrival.rate_per_s=2"]).workload.arrival
        assert arrival == GammaArrival(rate_per_s=2.0, cv=1.0, start_s=0.0)


def test_a_field_applies_on_top_of_its_section_whatever_the_order():
    """Found by fuzzing: --set scheduler.max_num_seqs=8 then --set 'scheduler={max_num_seqs: 4, ...}' took 4,
    the section replacing the field given before it without a word; the other order took 8."""
    pair = ["scheduler.max_num_seqs=8", "scheduler={max_num_seqs: 4, max_num_batched_tokens: 1024}"]
    for order in (pair, pair[::-1]):
        s = load_config(None, order).scheduler
        assert (s.max_num_seqs, s.max_num_batched_tokens) == (8, 1024)


def test_yaml_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler:\n  max_num_seqs: [1,\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(bad) in str(info.value) and "line" in str(info.value)
    twice = tmp_path / "twice.yaml"
    twice.write_text("run:\n  seed: 1\n  seed: 2\n")
    with pytest.raises(ConfigError, match=r"line 3, column 3: invalid YAML: duplicate key 'seed' \(first on line 2\)"):
        load_config(twice)  # YAML would let the last one win silently
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("scheduler:\n  max_num_seqs: 0\n")
    with pytest.raises(ConfigError, match=rf"{wrong}, line 2: scheduler.max_num_seqs"):
        load_config(wrong)


def test_exponent_floats_are_numbers_in_files_and_overrides(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-3 and 2.5e2 as strings, which then failed the type check; they are numbers,
    as in YAML 1.2. In an integer field, an integral one is taken (as 1000.0 is) and another is refused."""
    f = tmp_path / "exp.yaml"
    f.write_text("run:\n  warmup_s: 1e-3\n  duration_s: 2.5e2\n")
    cfg = load_config(f, ["kv_cache.gpu_memory_utilization=85E-2"])
    assert (cfg.run.warmup_s, cfg.run.duration_s, cfg.kv_cache.gpu_memory_utilization) == (0.001, 250.0, 0.85)
    assert load_config(None, ["workload.prefix_group=1e3x"]).workload.prefix_group == "1e3x"
    assert load_config(None, ["scheduler.max_num_seqs=1e3"]).scheduler.max_num_seqs == 1000  # as 1000.0 is
    with pytest.raises(ConfigError) as info:
        load_config(None, ["scheduler.max_num_seqs=2.5e0"])
    assert info.value.path == "scheduler.max_num_seqs" and "an integer" in str(info.value)


def test_overrides_and_engine_defaults_resolution():
    cfg = load_config(None, ["scheduler.max_num_seqs=64", "workload.arrival.rate_per_s=3"])
    assert cfg.scheduler.max_num_seqs == 64 and cfg.workload.arrival.rate_per_s == 3.0
    r = resolve(cfg)
    # vLLM on an H100 (>= 70 GiB, not A100): 8192 batched tokens; block size 16; utilisation 0.9.
    assert r.scheduler.max_num_batched_tokens == 8192 and r.scheduler.max_num_seqs == 64
    assert r.kv_cache.block_size == 16 and r.kv_cache.gpu_memory_utilization == 0.9
    a100 = resolve(load_config(None, ["hardware.gpu=a100_sxm"]))
    assert a100.scheduler.max_num_batched_tokens == 2048 and a100.scheduler.max_num_seqs == 256
    # Prefill-first scheduling is SGLang's default; an explicit setting wins over the engine's.
    assert r.scheduler.mixed_prefill is True
    assert resolve(load_config(None, ["engine.name=sglang"])).scheduler.mixed_prefill is False
    assert resolve(load_config(None, ["engine.name=sglang", "scheduler.mixed_prefill=true"])).scheduler.mixed_prefill
    assert r.scheduler.reserve_full_kv is False
    # SGLang derives its fraction per deployment (mem_fraction_static heuristic) unless one is given
    sgl = resolve(load_config(None, ["engine.name=sglang"]))
    assert sgl.kv_cache.gpu_memory_utilization is None and sgl.scheduler.max_num_batched_tokens == 8192
    assert (r.scheduler.preemption, sgl.scheduler.preemption) == ("vllm", "sglang")
    assert resolve(load_config(None, ["engine.name=sglang", "scheduler.preemption=vllm"])
                   ).scheduler.preemption == "vllm"
    assert isinstance(Simulation(load_config(None, ["engine.name=sglang"])).workers[0].sched.waiting,
                      SglangFcfsQueue)
    assert resolve(load_config(None, ["engine.name=sglang", "kv_cache.gpu_memory_utilization=0.8"])
                   ).kv_cache.gpu_memory_utilization == 0.8
    assert resolve(load_config(None, ["engine.name=trtllm"])).scheduler.reserve_full_kv is True
    assert not resolve(load_config(None, ["engine.name=trtllm", "scheduler.reserve_full_kv=false"])).scheduler.reserve_full_kv


def test_sglang_kv_capacity_follows_its_mem_fraction_heuristic():
    """No fraction given: the worker's KV pool is what SGLang's mem_fraction_static heuristic leaves, fed
    the worker's own chunk size and largest CUDA graph."""
    from twin.system import kv_blocks, make_deployment
    base = ["engine.name=sglang", "model.name=meta-llama/Llama-3.1-8B"]
    cfg = resolve(load_config(None, base))
    dep = make_deployment(cfg, 1)
    # H100, TP1, chunk 8192, graphs to 256: (81,920 - 13,440) / 81,920 MiB = 0.836
    assert kv_blocks(cfg, dep) == dep.kv_capacity_blocks(1, 0.836)
    # graphs only to 64: 512 + 12288 + 128 + 128 = 13,056 MiB -> 0.841, a larger pool
    small = resolve(load_config(None, [*base, "engine.cuda_graph_max_size=64"]))
    assert kv_blocks(small, dep) == dep.kv_capacity_blocks(1, 0.841) > kv_blocks(cfg, dep)
    given = resolve(load_config(None, [*base, "kv_cache.gpu_memory_utilization=0.7"]))
    assert kv_blocks(given, dep) == dep.kv_capacity_blocks(1, 0.7)


def test_sglang_running_request_cap_follows_each_workers_kv_pool():
    """SGLang's max_running_requests, unset: derived from the worker's own pool (a page is one token), as the
    engine does; an explicit value (the config's or a disaggregated pool's) wins."""
    base = ["engine.name=sglang", "model.name=meta-llama/Llama-3.1-8B"]
    assert resolve(load_config(None, base)).scheduler.max_num_seqs is None
    small = Simulation(load_config(None, [*base, "kv_cache.num_blocks=3000"]))
    assert small.workers[0].sched.limits.max_num_seqs == 1500                     # half of 3,000 tokens
    big = Simulation(load_config(None, [*base, "kv_cache.num_blocks=300000"]))
    assert big.workers[0].sched.limits.max_num_seqs == 2048                       # 1,171 -> 2,048 (floor)
    derived = Simulation(load_config(None, base)).workers[0]
    tokens = derived.sched.kv.num_blocks
    rule = min(tokens // 2, min(max(int(tokens / 131072 * 512), 2048), 4096))
    assert derived.sched.limits.max_num_seqs == rule
    given = Simulation(load_config(None, [*base, "scheduler.max_num_seqs=64", "kv_cache.num_blocks=3000"]))
    assert given.workers[0].sched.limits.max_num_seqs == 64
    pools = {"kind": "disaggregated", "prefill": {"workers": 1, "num_blocks": 3000},
             "decode": {"workers": 1, "num_blocks": 5000, "max_num_seqs": 32}}
    disagg = Simulation(load_config({"system": pools}, base))
    assert [w.sched.limits.max_num_seqs for w in disagg.workers] == [1500, 32]
    vllm = resolve(load_config(None, ["model.name=meta-llama/Llama-3.1-8B"]))
    assert vllm.scheduler.max_num_seqs == 1024                                   # vLLM's fixed default


def test_config_round_trips_through_its_dict():
    cfg = load_config(None, ["router.kind=kv_aware", "router.load_weight=0.25"])
    again = load_config(yaml.safe_load(yaml.safe_dump(cfg.to_dict())))
    assert again == cfg
    assert isinstance(TwinConfig(), TwinConfig)


def test_cli_os_and_pattern_errors_exit_2_with_a_message(tmp_path, capsys):
    """Found by fuzzing the CLI: these were tracebacks with exit 1 (the --out one after the whole run)."""
    afile = tmp_path / "f"
    afile.write_text("x")
    csv_path = tmp_path / "s.csv"
    csv_path.write_text("id\n")
    cases = [(["run", "--set", "workload.num_requests=2", "--no-plots", "--out", str(afile / "sub")], "f/sub"),
             (["validate", "silicon", str(tmp_path), "--out", str(tmp_path / "o")], "Is a directory"),
             (["validate", "silicon", str(csv_path), "--out", str(tmp_path / "o"), "--match", "["],
              "bad regular expression")]
    for argv, expected in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("twin: error:") and expected in err and "Traceback" not in err
    with pytest.raises(SystemExit) as info:  # argparse: a usage error, exit 2
        main(["validate", "silicon", str(csv_path), "--out", str(tmp_path / "o"), "--jobs", "0"])
    assert info.value.code == 2 and "expected a whole number >= 1, got 0" in capsys.readouterr().err


def test_cli_bad_config_exits_non_zero_without_traceback(capsys):
    assert main(["run", "--set", "scheduler.max_num_seqs=0", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "scheduler.max_num_seqs" in err and "Traceback" not in err



@pytest.mark.parametrize("text", ["", "  \n\n", "# scheduler:\n#   max_num_seqs: 8\n", "~\n", "null\n"])
def test_cli_refuses_a_config_file_that_holds_no_settings(tmp_path, capsys, text):
    """Issue 52 item 9: an empty config file (or one of comments only) ran every default without a word."""
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    out = tmp_path / "res"
    assert main(["run", str(path), "--no-plots", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"twin: error: {path}: the file holds no settings (it is empty, or only comments or "
                   "null): expected a mapping with at least one section (model:, hardware:, workload: ...); "
                   "start from `twin run --example chat` (`twin run --list-examples` lists them), see "
                   "`twin config reference` for every field, or write {} to run every default on purpose\n")
    assert not out.exists()


def test_an_explicit_empty_mapping_runs_every_default(tmp_path, capsys):
    """``{}`` is the way to ask for the defaults on purpose (the empty file's error says so)."""
    path = tmp_path / "defaults.yaml"
    path.write_text("{}  # every default\n")
    assert load_config(path) == load_config(None)
    out = tmp_path / "res"
    assert main(["run", str(path), "--no-plots", "--out", str(out), "--set", "workload.num_requests=5"]) == 0
    assert json.loads((out / "summary.json").read_text())["requests"]["completed"] == 5

def test_cli_runs_a_small_example_and_writes_results(tmp_path, capsys):
    out = tmp_path / "res"
    code = main(["run", "--example", "chat", "--out", str(out), "--set", "workload.num_requests=20", "--seed", "3"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["completed"] == 20
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"):
        assert set(summary[key]) >= {"mean", "p50", "p90", "p99"}
    assert set(summary["throughput"]) >= {"output_tokens_per_s", "input_tokens_per_s", "requests_per_s"}
    assert "hit_rate" in summary["prefix_cache"] and set(summary["sim"]) >= {"simulated_s", "wall_s"}
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["run"]["seed"] == 3 and resolved["scheduler"]["max_num_batched_tokens"] == 8192
    assert (out / "timeseries.png").exists() and (out / "latency_cdf.png").exists()
    assert "chat" in list_examples()
    assert "results written to" in capsys.readouterr().out


def test_yaml_errors_are_worded_as_the_pure_python_parser_words_them(tmp_path):
    """Configs are parsed with libyaml when available; a syntax error still reads as PyYAML's own."""
    bad = tmp_path / "bad.yaml"
    text = "scheduler:\n  max_num_seqs: [1,\n"
    bad.write_text(text)
    with pytest.raises(yaml.YAMLError) as ref:
        yaml.safe_load(text)
    mark = ref.value.problem_mark  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {ref.value.problem}" in str(info.value)


def test_deferred_kind_is_listed_and_loads_on_first_use():
    """The live-serving workload's module is imported only when a config names its kind."""
    from twin.registry import kinds

    assert "external" in kinds("workload")
    with pytest.raises(ConfigError, match="'external'"):
        load_config(None, ["workload.kind=nothing"])
    assert type(load_config({"workload": {"kind": "external"}}).workload).__name__ == "ExternalWorkload"


def test_moe_kernel_without_a_fitted_curve_is_a_config_error() -> None:
    cfg = load_config({"model": {"name": "openai/gpt-oss-20b"}, "engine": {"name": "sglang", "moe_kernel": "marlin"},
                       "workload": {"kind": "synthetic", "num_requests": 2}})
    with pytest.raises(ConfigError, match=r"engine\.moe_kernel.*no marlin MoE curve"):
        Simulation(cfg)
    fi = load_config({"model": {"name": "MiniMaxAI/MiniMax-M2.5"}, "engine": {"name": "sglang", "moe_kernel": "flashinfer"},
                      "system": {"tp": 4}, "workload": {"kind": "synthetic", "num_requests": 2}})
    with pytest.raises(ConfigError, match=r"engine\.moe_kernel.*no flashinfer MoE curve for fp8_block"):
        Simulation(fi)


def test_step_prices_follow_the_scheduler_limits_and_graph_settings() -> None:
    """A worker's CUDA graphs are captured for its own scheduler limits, as the engine captures them:
    vLLM at max_num_seqs 8 captures up to 16, unless engine.cuda_graph_max_size says otherwise."""
    from twin.system import cost_model, make_deployment
    default = resolve(load_config(None))
    cm = cost_model(default, make_deployment(default, 1))
    assert cm.max_capture == 512 and cm.graph_mode == "full_and_piecewise"
    small = resolve(load_config(None, ["scheduler.max_num_seqs=8"]))
    assert cost_model(small, make_deployment(small, 1)).max_capture == 16
    wide = resolve(load_config(None, ["scheduler.max_num_seqs=8", "engine.cuda_graph_max_size=2048",
                                      "engine.cuda_graph_mode=piecewise"]))
    cm = cost_model(wide, make_deployment(wide, 1))
    assert cm.max_capture == 2048 and cm.graph_mode == "piecewise"
    listed = resolve(load_config(None, ["engine.cuda_graph_sizes=[1, 2, 3, 24]"]))
    assert cost_model(listed, make_deployment(listed, 1)).capture_sizes == (1, 2, 3, 24)
    with pytest.raises(ConfigError, match="cuda_graph_sizes ends at 4 but cuda_graph_max_size is 8"):
        load_config(None, ["engine.cuda_graph_sizes=[1, 2, 4]", "engine.cuda_graph_max_size=8"])


def test_a_shared_prefix_longer_than_a_drawn_prompt_names_the_field():
    cfg = load_config({"workload": {"kind": "synthetic", "num_requests": 5, "prefix_group": "g",
                                    "prefix_tokens": 500, "input_tokens": {"low": 20, "high": 600}}})
    with pytest.raises(ConfigError) as info:
        Simulation(cfg)
    assert info.value.path == "workload.prefix_tokens"
    assert re.search(r"500 shared tokens, but request \d+ drew \d+ input tokens from workload.input_tokens",
                     str(info.value))


def test_plot_writes_both_figures_and_refuses_a_missing_or_cut_off_folder(tmp_path, capsys):
    """Found by fuzzing: a missing folder was created before the error; a cut-off requests.csv raised an
    IndexError traceback."""
    out = tmp_path / "r"
    assert main(["run", "--set", "workload.num_requests=5", "--no-plots", "--out", str(out)]) == 0
    assert main(["plot", str(out)]) == 0
    assert (out / "timeseries.png").stat().st_size > 0 and (out / "latency_cdf.png").stat().st_size > 0
    capsys.readouterr()
    assert main(["plot", str(tmp_path / "missing")]) == 2 and not (tmp_path / "missing").exists()
    lines = (out / "requests.csv").read_text().splitlines()
    (out / "requests.csv").write_text("\n".join(lines[:-1] + [lines[-1][:20]]) + "\n")
    assert main(["plot", str(out)]) == 2
    err = capsys.readouterr().err
    assert "requests.csv, line 6:" in err and "(a cut-off file?)" in err and "Traceback" not in err


@pytest.mark.parametrize("data, path", [
    ({"workload": {"kind": "synthetic", "arrival": {"kind": "poisson"}}}, "workload.arrival.rate_per_s"),
    ({"workload": {"kind": "sessions"}}, "workload.path"),
    ({"workload": {"kind": "trace_csv"}}, "workload.path"),
])
def test_a_missing_required_field_names_it(data, path):
    """Found by fuzzing: a required field left out gave Python's own message at the section
    ("PoissonArrival.__init__() missing 1 required keyword-only argument: 'rate_per_s'")."""
    with pytest.raises(ConfigError) as info:
        load_config(data)
    assert info.value.path == path
    assert "missing" in info.value.message and "__init__" not in info.value.message


def test_a_sample_interval_below_the_clocks_nanosecond_is_refused():
    """Found by fuzzing: metrics.sample_interval_s=1e-12 passed as positive, rounded to a 0 ns interval,
    and the monitor sampled at the same instant for ever (a hang on a 4-request run)."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["metrics.sample_interval_s=1e-12"])
    assert info.value.path == "metrics.sample_interval_s" and "1 ns" in info.value.message
    assert load_config(None, ["metrics.sample_interval_s=1e-9"]).metrics.sample_interval_s == 1e-9


@pytest.mark.parametrize("value", ["-1", ".nan", ".inf"])
def test_a_kv_aware_load_weight_must_be_a_finite_non_negative_number(value):
    """Found by fuzzing: any float was taken; a negative weight sent requests to the busiest worker, NaN
    made every score NaN (the router then kept the first worker)."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["router.kind=kv_aware", f"router.load_weight={value}"])
    assert info.value.path == "router.load_weight"


@pytest.mark.parametrize("overrides, path", [
    (["kv_cache.prefix_caching=false", "kv_cache.host_memory_gib=1"], "kv_cache.host_memory_gib"),
    (["kv_cache.host_bandwidth_GBps=5"], "kv_cache.host_bandwidth_GBps"),
])
def test_host_tier_settings_that_would_be_dropped_are_refused(overrides, path):
    """Found by fuzzing: a host tier without prefix caching, or a host bandwidth without a host tier, ran
    without a word and without any host tier."""
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert info.value.path == path


def test_errors_name_the_override_that_set_the_value_and_the_file_at_build_time(tmp_path, capsys):
    """Found by fuzzing: a bad --set value was reported as the file's ("c.yaml: scheduler.max_num_seqs:
    expected an integer"), and a value refused only when the deployment is built named no file at all."""
    config = tmp_path / "c.yaml"
    config.write_text("model: {name: Qwen/Qwen3-0.6B}\nscheduler: {max_num_seqs: 8}\n")
    assert main(["run", str(config), "--set", "scheduler.max_num_seqs=abc"]) == 2
    assert f"{config}, override scheduler.max_num_seqs=abc: scheduler.max_num_seqs: expected an integer" \
        in capsys.readouterr().err
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--set", "system.tp=3"]) == 2
    assert f"{config}, override system.tp=3: system.tp: tp=3 does not divide" in capsys.readouterr().err
    config.write_text("model: {name: Qwen/Qwen3-0.6B}\nsystem: {tp: 3}\n")
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    assert f"{config}, line 2: system.tp: tp=3 does not divide" in capsys.readouterr().err


@pytest.mark.parametrize("overrides, path, message", [
    (["system.ep=2"], "system.ep", "ep=2 splits MoE experts over GPUs, and meta-llama/Llama-3.1-8B is a dense model"),
    (["system.kind=disaggregated", "system.decode.ep=2"], "system.decode.ep", "is a dense model"),
    (["system.kind=disaggregated", "system.prefill.tp=3"], "system.prefill.tp", "tp=3 does not divide"),
    (["model.name=Qwen/Qwen3-30B-A3B", "system.tp=2", "system.ep=4"], "system.ep",
     "moe_tp x ep = 1 x 4 must equal tp x attn_dp = 2 x 1"),
    (["model.name=Qwen/Qwen3-30B-A3B", "engine.moe_kernel=deepgemm"], "engine.moe_kernel", "block-FP8 weights only"),
    (["model.name=openai/gpt-oss-20b", "system.attention_dp=3", "system.ep=3"], "system.ep",
     "ep=3 does not divide openai/gpt-oss-20b's 32 routed experts"),   # (found by fuzzing: failed mid-run)
    (["scheduler.attention_dp_balance=true"], "scheduler.attention_dp_balance", "needs system.attention_dp > 1"),
    (["system.kind=disaggregated", "scheduler.attention_dp_balance=true"], "scheduler.attention_dp_balance",
     "modelled for colocated engines"),
    (["transfer.kind=push"], "transfer.kind", "set only for system.kind disaggregated"),
    (["transfer.lease_s=5"], "transfer.lease_s", "(this system is colocated)"),
])
def test_a_setting_the_deployment_cannot_take_or_would_ignore_names_its_field(overrides, path, message):
    """Found reading the build: a deployment refused by the hardware model named only the section
    ("system: ..."), and ep on a dense model or transfer settings on a colocated system were ignored."""
    with pytest.raises(ConfigError) as info:
        Simulation(load_config(None, overrides))
    assert info.value.path == path and message in str(info.value)


@pytest.mark.parametrize("kind, name", [("sessions", "missing.jsonl"), ("trace_csv", "missing.csv"),
                                        ("trace_csv", "")])
def test_a_workload_file_that_cannot_be_read_names_the_field(tmp_path, kind, name):
    """Found by fuzzing: a missing file was a bare OSError ("[Errno 2] No such file or directory: ...") and
    a folder given as a CSV trace too, naming neither workload.path nor the config."""
    path = tmp_path / name
    with pytest.raises(ConfigError) as info:
        Simulation(load_config({"workload": {"kind": kind, "path": str(path)}}))
    assert info.value.path == "workload.path" and str(path) in info.value.message


@pytest.mark.parametrize("kind, name, text", [
    ("trace_csv", "t.csv", "arrival_s,input_tokens,output_tokens\n"),
    ("trace_csv", "blank.csv", "arrival_s,input_tokens,output_tokens\n\n\n"),
    ("sessions", "s.jsonl", '{"format": "servetwin-sessions", "version": 1, "source": "x"}\n'),
])
def test_a_workload_file_with_a_header_and_no_requests_names_the_file(tmp_path, kind, name, text):
    """Found by fuzzing: a trace CSV or a session script holding only its header ran 0 requests and wrote
    null metrics without a word; the readers take it as an empty workload, and the run refuses it."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        Simulation(load_config({"workload": {"kind": kind, "path": str(path)}}))
    assert str(info.value) == f"workload.path: no requests in {str(path)!r}: the file has a header and nothing after it"


def test_an_integer_field_takes_a_float_only_when_it_is_an_exact_integer():
    """Found by fuzzing: run.seed=1e30 ran with seed 1000000000000000019884624838656, the float's value
    (and system.prefill.workers=1e30 tried to build that many workers)."""
    assert load_config(None, ["run.seed=1e3"]).run.seed == 1000
    with pytest.raises(ConfigError) as info:
        load_config(None, ["run.seed=1e30"])
    assert info.value.path == "run.seed" and "expected an integer" in info.value.message


@pytest.mark.parametrize("override, path", [
    ("workload.input_tokens.fixed=100000000000000000000", "workload.input_tokens.fixed"),
    ("workload.input_tokens={low: 1, high: 100000000000000000000}", "workload.input_tokens.high"),
    ("run.seed=-100000000000000000000", "run.seed"),
])
def test_an_integer_past_64_bits_names_its_field(override, path):
    """Found by fuzzing: such a value passed the config and failed in numpy with a bare message ('Python int
    too large to convert to C long', 'high is out of bounds for int64')."""
    with pytest.raises(ConfigError) as info:
        load_config({"workload": {"kind": "synthetic"}}, [override])
    assert info.value.path == path
    assert "between -9223372036854775807 and 9223372036854775807" in info.value.message


def test_a_key_given_twice_on_one_line_is_an_error(tmp_path):
    """Found by fuzzing: the duplicate check compared the keys' lines, so a flow mapping (the examples'
    style) took "scheduler: {max_num_seqs: 4, max_num_seqs: 8}" silently, the last one winning."""
    twice = tmp_path / "twice.yaml"
    twice.write_text("scheduler: {max_num_seqs: 4, max_num_seqs: 8}\n")
    with pytest.raises(ConfigError, match=r"line 1, column 30: invalid YAML: duplicate key 'max_num_seqs' "
                                          r"\(first on line 1, column 13\)"):
        load_config(twice)
    with pytest.raises(ConfigError, match="duplicate key 'max_num_seqs'"):
        load_config(None, ["scheduler={max_num_seqs: 4, max_num_seqs: 8}"])


@pytest.mark.parametrize("cv", ["1e300", "1e-300"])
def test_a_gamma_cv_past_float_range_names_the_field(cv):
    """Found by fuzzing: cv=1e300 (shape 1 / cv**2 = 0) or 1e-300 (cv**2 = 0) passed as positive and the
    run ended in a ZeroDivisionError traceback."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["workload.arrival.kind=gamma", "workload.arrival.rate_per_s=10",
                           f"workload.arrival.cv={cv}"])
    assert info.value.path == "workload.arrival.cv"


@pytest.mark.parametrize("setting, path", [
    ("run.duration_s=1e300", "run.duration_s"),
    ("run.max_sim_s=1e19", "run.max_sim_s"),
    ("transfer.setup_latency_s=1e300", "transfer.setup_latency_s"),
    ("transfer.max_handoffs_per_s=1e-300", "transfer.max_handoffs_per_s"),
    ("workload.arrival.rate_per_s=1e-300", "workload.arrival.rate_per_s"),
    ("kv_cache.host_memory_gib=1e300", "kv_cache.host_memory_gib"),
])
def test_times_rates_and_sizes_past_the_clocks_64_bits_name_their_field(setting, path):
    """Found by fuzzing: each passed the config and the run ended in 'cannot convert float infinity to
    integer' (or NaN), naming no field: the clock counts nanoseconds and the pools bytes in 64 bits."""
    base = ["workload.kind=synthetic", "workload.arrival.kind=poisson", "workload.arrival.rate_per_s=1"]
    base = [text for text in base if text.partition("=")[0] != path]  # (a field is set once)
    with pytest.raises(ConfigError) as info:
        load_config(None, [*base, setting])
    message = info.value.message
    assert info.value.path == path and ("64 bits" in message or "the simulated clock's range" in message), message


def test_the_clocks_range_is_the_bound():
    """Just inside the range the values load (146 years of simulated time, its inverse as a rate)."""
    from twin.config import CLOCK_MAX_S

    cfg = load_config(None, [f"run.duration_s={CLOCK_MAX_S!r}", f"transfer.max_handoffs_per_s={1 / CLOCK_MAX_S!r}"])
    assert cfg.run.duration_s == CLOCK_MAX_S
    with pytest.raises(ConfigError):
        load_config(None, [f"run.duration_s={CLOCK_MAX_S * 1.000001!r}"])


def test_a_value_error_names_the_line_of_its_field_or_of_its_section(tmp_path, capsys):
    """Found reading the errors: a value refused after parsing (a rule between fields, a field left out, a
    deployment the hardware model refuses) named the file but no line; only syntax errors had one. Now the
    field's own line, else the line of its nearest section in the file."""
    config = tmp_path / "c.yaml"
    config.write_text("model: {name: Qwen/Qwen3-0.6B}\nkv_cache:\n  prefix_caching: false\n  host_memory_gib: 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert str(info.value).startswith(f"{config}, line 4: kv_cache.host_memory_gib: host_memory_gib needs")
    config.write_text("run: {seed: 1}\nworkload:\n  kind: sessions\n")
    with pytest.raises(ConfigError) as info:
        load_config(config)
    assert str(info.value).startswith(f"{config}, line 2: workload.path: ")
    config.write_text("model:\n  name: Qwen/Qwen3-0.6B\n\nsystem:\n  kind: colocated\n  tp: 3\n")
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == 2
    assert f"{config}, line 6: system.tp: tp=3 does not divide" in capsys.readouterr().err


def test_a_field_set_twice_by_overrides_or_by_seed_is_refused_naming_both(tmp_path, capsys):
    """Found by fuzzing: --set scheduler.max_num_seqs=1 --set scheduler.max_num_seqs=2, and --set run.seed=1
    --seed 3, ran with the last value without a word. Other fields beside them, and a kind with fields of its
    section, still load."""
    with pytest.raises(ConfigError) as info:
        load_config(None, ["scheduler.max_num_seqs=1", "run.seed=4", " scheduler.max_num_seqs = 2"])
    assert str(info.value) == ("scheduler.max_num_seqs: set twice: overrides 'scheduler.max_num_seqs=1' and "
                               "' scheduler.max_num_seqs = 2'; give it once")
    source = tmp_path / "c.yaml"
    source.write_text("run:\n  seed: 2\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(source))}: workload.kind: set twice: overrides "
                                          r"'workload.kind=synthetic' and 'workload.kind=sessions'; give it once$"):
        load_config(source, ["workload.kind=synthetic", "workload.kind=sessions"])
    cfg = load_config(source, ["workload.arrival.kind=gamma", "workload.arrival.rate_per_s=3", "run.seed=5"])
    assert (cfg.workload.arrival.kind, cfg.workload.arrival.rate_per_s, cfg.run.seed) == ("gamma", 3, 5)
    assert main(["run", "--seed", "3", "--set", "run.seed=1", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "twin: error: --seed 3 and --set run.seed=1 both set run.seed; give one\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("engine, hit", [("vllm", 64), ("sglang", 69), ("trtllm", 64)])
def test_a_prompt_pool_repeats_whole_prompts_and_the_prefix_cache_finds_them(engine, hit):
    """Five requests one at a time over a shuffled pool of two 70-token prompts: the first pass computes
    both, every later request sends one of them again. vLLM (16-token blocks) keeps the 4 full blocks, 64
    tokens; SGLang (one-token pages) all but the last token, which it recomputes; TRT-LLM (32-token blocks)
    2 blocks."""
    cfg = load_config({"engine": {"name": engine}, "run": {"seed": 3},
                       "workload": {"kind": "synthetic", "num_requests": 5, "prompt_pool": 2,
                                    "pool_sampling": "shuffle", "input_tokens": 70, "output_tokens": 4,
                                    "arrival": {"kind": "concurrency", "concurrency": 1}}})
    requests = Simulation(cfg).run().requests
    assert list(requests["cached_tokens"]) == [0, 0, hit, hit, hit]
    assert list(requests["prompt_tokens"]) == [70] * 5


@pytest.mark.parametrize("workload, path, message", [
    ({"prompt_pool": 0}, "workload.prompt_pool", "must be a finite number > 0"),
    ({"pool_sampling": "random"}, "workload.pool_sampling", "needs prompt_pool"),
    ({"prompt_pool": 3, "prefix_group": "g", "prefix_tokens": 8}, "workload.prompt_pool", "not modelled"),
    ({"prompt_pool": 3, "pool_sampling": "lru"}, "workload.pool_sampling", "must be one of"),
])
def test_prompt_pool_settings_are_checked(workload, path, message):
    with pytest.raises(ConfigError) as info:
        load_config({"workload": {"kind": "synthetic", **workload}})
    assert info.value.path == path and message in str(info.value)


def test_redundant_experts_round_trip_and_reach_the_deployment():
    """system.redundant_experts (colocated) and system.<pool>.redundant_experts (disaggregated) default to 0,
    are written with the resolved config and read back, and reach the hardware model's deployment."""
    from twin.system import make_deployment

    moe = ["model.name=Qwen/Qwen3-30B-A3B", "system.tp=1", "system.attention_dp=8", "system.ep=8"]
    cfg = load_config(None, [*moe, "system.redundant_experts=8"])
    assert load_config(None).system.redundant_experts == 0
    assert cfg.to_dict()["system"]["redundant_experts"] == 8
    assert load_config(yaml.safe_load(yaml.safe_dump(cfg.to_dict()))) == cfg
    dep = make_deployment(cfg, 1, ep=8, attention_dp=8, redundant_experts=cfg.system.redundant_experts)
    f = next(g for _, g in dep.model.layers if g is not None and g.kind == "moe")
    assert (dep.expert_slots(f), dep.experts_per_gpu(f)) == (136, 17)   # 128 experts + 8 slots over 8 GPUs
    pools = load_config(None, ["system.kind=disaggregated", "system.decode.redundant_experts=4"])
    assert pools.to_dict()["system"]["decode"]["redundant_experts"] == 4
    assert pools.to_dict()["system"]["prefill"]["redundant_experts"] == 0
    with pytest.raises(ConfigError) as info:
        load_config(None, ["system.redundant_experts=-1"])
    assert info.value.path == "system.redundant_experts"


@pytest.mark.parametrize("overrides, path, message", [
    (["model.name=Qwen/Qwen3-30B-A3B", "system.tp=1", "system.attention_dp=8", "system.ep=8",
      "system.redundant_experts=4"], "system.redundant_experts", "redundant_experts=0 would make it divide"),
    (["model.name=Qwen/Qwen3-30B-A3B", "system.redundant_experts=8"], "system.redundant_experts",
     "it needs ep > 1"),
    (["system.kind=disaggregated", "system.decode.redundant_experts=8"], "system.decode.redundant_experts",
     "is a dense model"),
])
def test_redundant_experts_that_do_not_fit_name_their_field(overrides, path, message):
    with pytest.raises(ConfigError) as info:
        Simulation(load_config(None, [*overrides, "workload.num_requests=2"]))
    assert info.value.path == path and message in str(info.value)
