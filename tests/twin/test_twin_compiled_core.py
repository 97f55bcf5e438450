"""The mypyc-compiled core (setup.py) against its Python sources: the same bytes out, and the loader's choice
(twin/core/__init__.py) of which runs."""

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import twin.core
from twin.core import compiled_modules, use_compiled

SPEC = {"speculative": {"method": "mtp", "num_speculative_tokens": 3, "acceptance": [0.8, 0.6, 0.4]}}

CASES = {
    # vLLM's defaults: chunked prefill, the lazy cohort, fast-forward, prefix caching on shared prefixes
    "vllm": {"workload": {"kind": "synthetic", "num_requests": 300, "arrival": {"kind": "poisson", "rate_per_s": 30.0},
                          "input_tokens": {"low": 300, "high": 1500}, "output_tokens": {"low": 5, "high": 300},
                          "prefix_group": "sys", "prefix_tokens": 256}},
    # tight KV under the priority policy: preemptions, the cohort broken up
    "preempting": {"kv_cache": {"num_blocks": 400, "block_size": 16},
                   "scheduler": {"max_num_batched_tokens": 512, "policy": "priority"},
                   "workload": {"kind": "synthetic", "num_requests": 150,
                                "arrival": {"kind": "poisson", "rate_per_s": 40.0},
                                "input_tokens": {"low": 100, "high": 1200}, "output_tokens": {"low": 20, "high": 400}}},
    # SGLang: one-token pages, prefill first, its admission reserve and retraction
    "sglang": {"engine": {"name": "sglang"}, "kv_cache": {"num_blocks": 60000},
               "workload": {"kind": "synthetic", "num_requests": 120,
                            "arrival": {"kind": "concurrency", "concurrency": 16},
                            "input_tokens": {"low": 100, "high": 800}, "output_tokens": {"low": 20, "high": 200}}},
    # speculative decodes (drawn acceptances, fast-forwarded spec runs) on TensorRT-LLM's rules
    "speculative": {"engine": {"name": "trtllm", **SPEC}, "model": {"name": "XiaomiMiMo/MiMo-7B-Base"},
                    "workload": {"kind": "synthetic", "num_requests": 60,
                                 "arrival": {"kind": "concurrency", "concurrency": 8},
                                 "input_tokens": {"low": 50, "high": 400}, "output_tokens": {"low": 40, "high": 300}}},
    # disaggregated: staged KV pulls over the flow network, decode workers' batches joined by pulls
    "disaggregated": {"system": {"kind": "disaggregated", "prefill": {"workers": 1}, "decode": {"workers": 2}},
                      "workload": {"kind": "lmbenchmark_multiround", "num_users": 12, "num_rounds": 3, "qps": 6.0,
                                   "shared_system_prompt": 200, "user_history_prompt": 400, "answer_len": 80}},
}

OUTPUTS = ("config.yaml", "requests.csv", "timeseries.csv", "ledger.json")


def _run(config: Path, out: Path, pure: bool) -> None:
    env = {**os.environ, "SERVETWIN_PURE_PYTHON": "1" if pure else "0"}
    subprocess.run([sys.executable, "-m", "twin.cli", "run", str(config), "--out", str(out), "--no-plots",
                    "--quiet"], check=True, env=env, capture_output=True)


def _summary(path: Path) -> dict:
    summary = json.loads(path.read_text())
    summary["sim"].pop("wall_s")  # the only figure that depends on the machine
    return summary


@pytest.mark.skipif(not twin.core.COMPILED, reason="the core is not compiled in this process "
                                                   "(SERVETWIN_PURE_PYTHON=1, or no build): nothing to compare")
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_compiled_core_gives_the_bytes_of_the_python_sources(tmp_path, case):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({**CASES[case], "metrics": {"record_token_times": True}}))
    _run(config, tmp_path / "compiled", pure=False)
    _run(config, tmp_path / "python", pure=True)
    for name in OUTPUTS + ("token_times.json",):
        assert (tmp_path / "compiled" / name).read_bytes() == (tmp_path / "python" / name).read_bytes(), name
    assert _summary(tmp_path / "compiled" / "summary.json") == _summary(tmp_path / "python" / "summary.json")


def test_the_loader_runs_the_compiled_modules_where_they_are_built():
    """The process the suite runs in loads what the install built: with ``SERVETWIN_PURE_PYTHON=1`` or with
    no compiled module, the sources; otherwise the compiled modules (the suite's first pass)."""
    import twin.core.scheduler

    built = compiled_modules(Path(twin.core.__file__).parent)
    source = twin.core.scheduler.__file__.endswith(".py")
    if os.environ.get("SERVETWIN_PURE_PYTHON") == "1" or not built:
        assert not twin.core.COMPILED and source
    else:
        assert twin.core.COMPILED and not source and set(built) >= {"scheduler", "kv_cache", "fastforward"}


SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]   # this interpreter's compiled-module file ending


def _fake_build(folder: Path, names: list[str]) -> dict[str, Path]:
    """Sources written at t = 1 s, each module's compiled file at 2 s (a rebuild may leave these as they
    were), their shared library at 4 s."""
    for name in names:
        (folder / f"{name}.py").write_text("")
        os.utime(folder / f"{name}.py", ns=(1_000_000_000, 1_000_000_000))
        (folder / f"{name}{SUFFIX}").write_bytes(b"")
        os.utime(folder / f"{name}{SUFFIX}", ns=(2_000_000_000, 2_000_000_000))
    (folder / "clock.py").write_text("")  # a source with no compiled file: not a compiled module
    library = folder / f"servetwin_core__mypyc{SUFFIX}"
    library.write_bytes(b"")
    os.utime(library, ns=(4_000_000_000, 4_000_000_000))
    return compiled_modules(folder)


def test_the_loader_runs_the_sources_when_asked_or_when_a_source_is_newer_than_its_build(tmp_path):
    built = _fake_build(tmp_path, ["scheduler", "kv_cache"])
    library = tmp_path / f"servetwin_core__mypyc{SUFFIX}"
    assert sorted(built) == ["kv_cache", "scheduler"]
    assert use_compiled(tmp_path, built, pure=False, library=library) == (True, "")
    assert use_compiled(tmp_path, built, pure=True, library=library) == (False, "")
    assert use_compiled(tmp_path, {}, pure=False, library=None) == (False, "")
    assert use_compiled(tmp_path, built, pure=False, library=None) == (
        False, "compiled modules found but not their library servetwin_core__mypyc")
    os.utime(tmp_path / "kv_cache.py", ns=(3_000_000_000, 3_000_000_000))  # newer than its own file, not the library
    assert use_compiled(tmp_path, built, pure=False, library=library) == (True, "")
    os.utime(tmp_path / "kv_cache.py", ns=(5_000_000_000, 5_000_000_000))  # edited after the build
    assert use_compiled(tmp_path, built, pure=False, library=library) == (
        False, "kv_cache.py changed since the core was compiled")
