"""Reference scenarios of the speed benchmark (issue 6): twin configs plus what Vidur replays alongside.

Default data paths point at the shared reference data; each is overridable (``DataPaths``), so the
benchmark machinery also runs on small files (the tests use a generated 20-request list).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
"""The project's shared reference data, ``../shared/data`` beside this checkout."""
DEFAULT_VIDUR_DATA = SHARED / "vidur"
DEFAULT_AZURE_CONV = SHARED / "traces" / "AzureLLMInferenceTrace_conv.csv"
VIDUR_LIST = "splitwise_conv_poisson6.45_seed42_n{n}.csv"
LLAMA_8B = "meta-llama/Llama-3.1-8B"
"""Vidur's ``meta-llama/Meta-Llama-3-8B`` has the same architecture (32 layers, d 4096, GQA 32/8 heads, FFN
14336, vocab 128256); only the RoPE scaling for long context differs, which neither simulator models."""


@dataclass(frozen=True)
class DataPaths:
    vidur_data: Path = DEFAULT_VIDUR_DATA
    azure_conv: Path = DEFAULT_AZURE_CONV


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    config: dict[str, Any]
    quick: bool = False
    vidur_trace: Path | None = None
    """Request list Vidur replays (``arrived_at,num_prefill_tokens,num_decode_tokens``); None: no Vidur."""
    needs_system: str | None = None
    needs_files: tuple[Path, ...] = field(default=())
    process_only: bool = False
    """Measured as one whole process only (its wall time, peak memory and own figures), not repeated in
    process: the scale points, whose runs take minutes."""

    def skip_reason(self) -> str | None:
        """Why this scenario cannot run here (a missing system kind or input file), or None."""
        if self.needs_system is not None:
            import twin.builtin_kinds  # noqa: F401  (registers the built-in kinds)
            from twin.registry import kinds

            known = kinds("system")
            if self.needs_system not in known:
                return f"system kind {self.needs_system!r} is not registered (known: {', '.join(known)})"
        for path in self.needs_files:
            if not path.exists():
                return f"input file {path} is missing"
        return None


def _base(gpu: str, workload: dict[str, Any], **sections: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"hardware": {"gpu": gpu}, "model": {"name": LLAMA_8B}, "workload": workload,
                           "metrics": {"sample_interval_s": 1.0}}
    cfg.update(sections)
    return cfg


SARATHI_LIKE = {"max_num_batched_tokens": 512, "max_num_seqs": 512}
"""Vidur's README limits (Sarathi scheduler: chunk 512, batch cap 512) so both simulators batch alike."""


def vidur_list_scenario(name: str, path: Path, *, limit: int | None = None, quick: bool = False) -> Scenario:
    """A Vidur request list on A100 + Llama-3(.1)-8B, Sarathi-like limits, replayed by both simulators."""
    workload: dict[str, Any] = {"kind": "trace_csv", "path": str(path)}
    if limit is not None:
        workload["limit"] = limit
    return Scenario(
        name=name, quick=quick, vidur_trace=path, needs_files=(path,),
        description=f"{path.name}{'' if limit is None else f' (first {limit})'}: A100, Llama-3.1-8B, "
                    "chunk 512, batch cap 512",
        config=_base("a100_sxm", workload, scheduler=dict(SARATHI_LIKE)),
    )


def session_scenario(name: str, data: str, arrival: dict[str, Any], what: str, *,
                     quick: bool = False) -> Scenario:
    from twin.sources import resolve_data_path

    return Scenario(
        name=name, quick=quick, description=f"{what}: H100, Llama-3.1-8B, vLLM defaults",
        needs_files=(resolve_data_path(data),),
        config=_base("h100_sxm", {"kind": "sessions", "path": data, "arrival": arrival}),
    )


SCALE_POINTS = {"scale_10k": 10_000, "scale_100k": 100_000, "scale_1m": 1_000_000}


def scale_scenario(name: str, n: int) -> Scenario:
    """``n`` synthetic chat requests (the chat example's lengths) arriving as a Poisson process at 60 per
    second on four H100s: the same load at every size, so the points differ only in how many requests a run
    has finished, which is what memory must not grow with."""
    return Scenario(
        name=name, process_only=True,
        description=f"{n:,} synthetic chat requests (prompts 128-2048, outputs 32-512 tokens), Poisson 60/s: "
                    "4 x H100, Llama-3.1-8B, vLLM defaults",
        config=_base("h100_sxm", {"kind": "synthetic", "num_requests": n,
                                  "arrival": {"kind": "poisson", "rate_per_s": 60.0},
                                  "input_tokens": {"low": 128, "high": 2048},
                                  "output_tokens": {"low": 32, "high": 512}},
                     system={"kind": "colocated", "replicas": 4}),
    )


def scenarios(paths: DataPaths = DataPaths()) -> list[Scenario]:
    """Every reference scenario, in report order."""
    vd = paths.vidur_data
    return [
        vidur_list_scenario("vidur_conv_400", vd / VIDUR_LIST.format(n=400), quick=True),
        vidur_list_scenario("vidur_conv_2000", vd / VIDUR_LIST.format(n=2000)),
        Scenario(
            name="azure_conv_full", needs_files=(paths.azure_conv,),
            description="Azure LLM inference conversation trace 2023 (one hour): H100, Llama-3.1-8B, "
                        "colocated, vLLM defaults",
            config=_base("h100_sxm", {"kind": "trace_csv", "path": str(paths.azure_conv)}),
        ),
        Scenario(
            name="disagg_10k", needs_system="disaggregated",
            description="LMBenchmark multi-round QA, 667 users x 10 rounds (10,000 requests) at 20 QPS, "
                        "system prompt 1000 + history 2000 + answer 100 tokens: 4 prefill + 4 decode H100s",
            config=_base(
                "h100_sxm",
                {"kind": "lmbenchmark_multiround", "num_users": 667, "num_rounds": 10, "qps": 20.0,
                 "shared_system_prompt": 1000, "user_history_prompt": 2000, "answer_len": 100},
                system={"kind": "disaggregated", "prefill": {"workers": 4}, "decode": {"workers": 4}},
            ),
        ),
        session_scenario("swe_bench", "pkg:workloads/data/swe_bench_dev.jsonl", {"kind": "all_at_once"},
                         "shipped mini-swe-agent SWE-bench Lite dev sessions, all 23 at once"),
        session_scenario("tau_bench", "pkg:workloads/data/tau_bench_airline.jsonl",
                         {"kind": "concurrency", "concurrency": 32},
                         "shipped tau-bench airline sessions, 32 concurrent (closed loop)"),
        *(scale_scenario(name, n) for name, n in SCALE_POINTS.items()),
    ]
