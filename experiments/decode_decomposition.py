"""Decode-step decomposition: which ledger term a pure-decode step spends its time on, by batch size (issue 51).

The deployments (``decode_decomposition.yaml`` beside this file): Llama-3.1-70B FP8 on TP 4 (dense) and
Qwen3-235B-A22B FP8 on TP 8 / EP 8 (MoE; DeepSeek-R1 FP8 does not fit eight 80 GB H100s), vLLM, each on an
H100 SXM and a B300 SXM. Each worker is built as ``twin.system``'s colocated system builds it (resolved
config, ``make_deployment``, the KV pool, the running-request cap, ``cost_model`` with the CUDA graphs
captured for that cap), and prices a pure-decode step ``BatchShape.from_requests([1] * B, [2048] * B)`` for
B = 1, 2, 4, ..., 512: those within the engine's limits (max_num_seqs, the token budget) and whose KV fits
the worker's pool (B x 128 blocks of 16 tokens; Qwen3-235B on H100 holds 452 such requests, so its B = 512
is left out and ``summary.md`` says so).

Checked by hand (``summary.md`` repeats it from the numbers): Llama-3.1-70B FP8 at B = 1 on an H100 is the
weight read. Its 80 layers hold 17.1 GB of FP8 GEMM weights per GPU (qkv 2,560 x 8,192, o 8,192 x 2,048,
gate/up 14,336 x 8,192, down 8,192 x 7,168) and its LM head shard 0.53 GB of BF16: 5.27 ms at the H100's
3.35 TB/s. At the fitted GEMM efficiencies (0.794 of HBM bandwidth for FP8, less for small GEMMs) plus the
4.5 us kernel floor of each of the 321 GEMMs that is 8.18 ms, against the ledger's qkv_proj + o_proj + mlp +
lm_head of 8.25 ms (+0.8 %), 71 % of the 11.6 ms step. The rest is not the weights: elementwise, attention
and all-reduce kernels, mostly their floors (the throughput terms together are 2.2 x the bare weight read).

Writes ``decode_decomposition.csv`` (model, gpu, batch, term, seconds, share: one row per non-zero term),
``decode_decomposition.png`` (stacked shares per batch, one panel per model x GPU, step time per token on a
second axis) and ``summary.md`` (where the largest term changes, from the numbers;
``experiments/decode_decomposition_report.py``).

    python experiments/decode_decomposition.py --out out/decode_decomposition
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import attrs

from experiments.tables import finish, write_rows
from hardware.cost import CostModel, StepCost
from hardware.deployment import Deployment
from hardware.shape import BatchShape
from twin.config import TwinConfig, load_config
from twin.config_codec import read_yaml
from twin.system import cost_model, kv_blocks, make_deployment, resolve, worker_max_num_seqs

STUDY = Path(__file__).with_suffix(".yaml")
COLUMNS = ("model", "gpu", "batch", "term", "seconds", "share")
OTHER_BELOW = 0.02
"""Terms under this share of every step of a panel are drawn together as "other"."""


@attrs.frozen(kw_only=True)
class Worker:
    """One model on one GPU, built as the simulator builds a colocated worker."""

    model: str
    gpu: str
    config: TwinConfig
    dep: Deployment
    cost: CostModel
    kv_blocks: int

    def fits(self, batch: int, context_tokens: int) -> bool:
        """Whether ``batch`` decoding requests of ``context_tokens`` fit the engine's limits and KV pool."""
        block = self.config.kv_cache.block_size
        assert block is not None
        return (batch <= self.cost.max_num_seqs and batch <= self.cost.max_num_batched_tokens
                and batch * -(-context_tokens // block) <= self.kv_blocks)


@attrs.frozen(kw_only=True)
class Point:
    """One priced pure-decode step."""

    model: str
    gpu: str
    batch: int
    step: StepCost

    @property
    def seconds_per_token(self) -> float:
        return self.step.total_s / self.batch

    def rows(self) -> list[dict[str, Any]]:
        total = self.step.total_s
        return [{"model": self.model, "gpu": self.gpu, "batch": self.batch, "term": term, "seconds": s,
                 "share": s / total} for term, s in self.step.terms.items() if s > 0.0]


def study() -> dict[str, Any]:
    """``decode_decomposition.yaml`` as a mapping."""
    return read_yaml(STUDY)


def build(model: str, data: Mapping[str, Any], gpu: str) -> Worker:
    """The worker of deployment ``data`` on ``gpu``, as ``twin.system.Colocated.build`` makes it."""
    config = resolve(load_config({**data, "hardware": {**data.get("hardware", {}), "gpu": gpu}}))
    s = config.system
    dep = make_deployment(config, s.tp, ep=s.ep, attention_dp=s.attention_dp,  # type: ignore[attr-defined]
                          redundant_experts=s.redundant_experts)  # type: ignore[attr-defined]
    blocks = kv_blocks(config, dep)
    seqs = worker_max_num_seqs(config, dep, blocks)
    return Worker(model=model, gpu=gpu, config=config, dep=dep, cost=cost_model(config, dep, max_num_seqs=seqs),
                  kv_blocks=blocks)


def decode_shape(batch: int, context_tokens: int) -> BatchShape:
    """``batch`` requests decoding one token each, every one with ``context_tokens`` after the step."""
    return BatchShape.from_requests([1] * batch, [context_tokens] * batch)


def price(worker: Worker, batches: Iterable[int], context_tokens: int) -> list[Point]:
    """The worker's pure-decode steps for the batch sizes that fit it."""
    return [Point(model=worker.model, gpu=worker.gpu, batch=b,
                  step=worker.cost.step_cost(decode_shape(b, context_tokens)))
            for b in batches if worker.fits(b, context_tokens)]


def workers(spec: Mapping[str, Any]) -> list[Worker]:
    """Every (deployment, GPU) worker of the study, deployments first."""
    return [build(model, data, gpu) for model, data in spec["deployments"].items() for gpu in spec["gpus"]]


def run(spec: Mapping[str, Any]) -> tuple[list[Worker], list[Point]]:
    built = workers(spec)
    return built, [p for w in built for p in price(w, spec["batches"], spec["context_tokens"])]


def write_csv(points: Iterable[Point], path: Path) -> Path:
    return write_rows((row for p in points for row in p.rows()), COLUMNS, path)


def panels(points: Sequence[Point]) -> dict[tuple[str, str], list[Point]]:
    """The points by (model, gpu), in study order."""
    out: dict[tuple[str, str], list[Point]] = {}
    for p in points:
        out.setdefault((p.model, p.gpu), []).append(p)
    return out


def drawn_terms(points: Sequence[Point]) -> list[str]:
    """The terms drawn on their own (>= OTHER_BELOW of some step anywhere), in ledger order."""
    order = list(dict.fromkeys(t for p in points for t in p.step.terms))
    return [t for t in order if any(p.step.terms.get(t, 0.0) >= OTHER_BELOW * p.step.total_s for p in points)]


def plot(points: Sequence[Point], path: Path, dpi: int = 90) -> Path:
    """One panel per model x GPU: stacked term shares per batch size, step time per token on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = panels(points)
    models = list(dict.fromkeys(m for m, _ in by))
    gpus = list(dict.fromkeys(g for _, g in by))
    terms = drawn_terms(points)
    cmap = plt.get_cmap("tab10" if len(terms) < 10 else "tab20")
    colors = {term: cmap(i) for i, term in enumerate(terms + ["other"])}
    fig, axes = plt.subplots(len(models), len(gpus), figsize=(5.2 * len(gpus), 3.3 * len(models)),
                             squeeze=False, sharey=True)
    for (model, gpu), mine in by.items():
        ax = axes[models.index(model)][gpus.index(gpu)]
        x = list(range(len(mine)))
        bottom = [0.0] * len(mine)
        for term in terms + ["other"]:
            share = [(p.step.total_s - sum(p.step.terms.get(t, 0.0) for t in terms) if term == "other"
                      else p.step.terms.get(term, 0.0)) / p.step.total_s for p in mine]
            ax.bar(x, share, bottom=bottom, color=colors[term], width=0.8, label=term)
            bottom = [b + s for b, s in zip(bottom, share)]
        ax.set_xticks(x, [str(p.batch) for p in mine], fontsize=7)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("decode batch (requests, 2,048-token context)", fontsize=7)
        ax.set_title(f"{model} on {gpu}", fontsize=8, loc="left")
        right = ax.twinx()
        right.plot(x, [p.seconds_per_token * 1e3 for p in mine], color="black", marker="o", ms=3, lw=1.2)
        right.set_yscale("log")
        right.tick_params(labelsize=7)
        right.set_ylabel("step time per token (ms, log; line)", fontsize=7)
    for row in axes:
        row[0].set_ylabel("share of the step", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], fontsize=7, loc="center right", title="ledger term",
               title_fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    from experiments.decode_decomposition_report import report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/decode_decomposition")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    spec = study()
    built, points = run(spec)
    csv_path = write_csv(points, out / "decode_decomposition.csv")
    png_path = plot(points, out / "decode_decomposition.png")
    finish(out, report(built, points, spec), [csv_path, png_path], start)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
