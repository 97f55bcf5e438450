"""Multi-turn pressure transients: LMBenchmark's multi-round QA after its warm-up, four ways (issue 51).

The deployment (``multiturn_transients.yaml`` beside this file): Qwen3-32B FP8, one prefill and one decode
H100, vLLM's defaults (prefix caching on), staged KV pulled by the decode worker, a user's requests kept on
one decode worker. The workload is LMBenchmark's synthetic multi-round QA client
(``workloads.generators.lmbenchmark_multiround``, its pacing included): the baseline is 1 user, 20 rounds at
qps 2, a 1,000-token shared system prompt, a 10,000-token history and 100-token answers; the variants double
the history, make the answers ten times longer, or have 20 users.

Every variant runs, as LMBenchmark's run scripts do (``synthetic-multi-round-qa/*_run.sh``), its
``warmup()`` first: ``multi-round-qa.py --num-users 1 --num-rounds 2 --qps 2 --time 10``
(``NUM_USERS_WARMUP / 2`` with the scripts' NUM_USERS_WARMUP=20) with the run's prompt and answer lengths and
the run's ``--init-user-id``. Its users join every 0.5 s, each sending its first prompt and, once answered,
a second; the client sends nothing after 10 s. Since both clients number their users from the same id, the
warm-up's user N sends the benchmark's user N's first prompt (the system prompt, "For user N, here are some
other context: ...", question #1): the block ids of :func:`name_first_prompt` say so. Modelling choices:
the real client stops its event loop at ``--time`` and exits, abandoning the requests still in flight
(the server aborts them); a session file cannot abort a request, so here they finish and the benchmark
starts when the warm-up's last answer is done, on a drained server. The client's ``warmup_engine`` (ten
100-token prompts before each run) is left out. The twin has one workload per run, so the warm-up is
simulated alone first (which calls its client sends before 10 s; when the last of them is answered), then
in front of the benchmark's sessions, which are moved to that time (``run.warmup_s`` there, so the summary
counts the benchmark's requests only).

Series over time, per variant (t = 0 where the benchmark starts; the warm-up is the shaded stretch before):
the prefill worker's waiting requests (the monitor's ``w<prefill>_waiting``), the requests whose KV is staged
and waiting for the decode worker to pull it (``decode_wait``: the decode admission queue), the prefill
worker's prefix-hit rate over its latest HIT_WINDOW_TOKENS admitted prompt tokens, the warm-up's and the
benchmark's apart (from the request table: each request's cached and prompt tokens at its prefill
admission; the timeseries column ``prefix_hit_rate`` is a rate per sample interval over every worker's
admissions, the decode worker's included), and each request's TTFT at its arrival.

Writes ``multiturn_transients.csv`` (one row per variant), ``multiturn_transients_timeseries.csv`` (the
series), ``multiturn_transients_requests.csv`` (every request), ``multiturn_transients.png`` (columns =
variants, rows = the four series) and ``summary.md``; the session files each run replayed are kept under
``workloads/`` (``twin run`` can replay them with the YAML).

    python experiments/multiturn_transients.py --out out/multiturn_transients
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import attrs
import numpy as np

from experiments.tables import cell, write_rows
from twin.config import load_config
from twin.config_codec import read_yaml
from twin.results import Results
from twin.runner import Simulation
from workloads.generators import lmbenchmark_multiround
from workloads.io import write_sessions
from workloads.sessions import Session

DEPLOYMENT = Path(__file__).with_suffix(".yaml")
BASELINE: dict[str, Any] = {"num_users": 1, "num_rounds": 20, "qps": 2.0, "shared_system_prompt": 1000,
                            "user_history_prompt": 10000, "answer_len": 100}
"""LMBenchmark multi-round QA parameters of the baseline (its client's flags without the dashes)."""
VARIANTS: dict[str, dict[str, Any]] = {"baseline": {}, "history x2": {"user_history_prompt": 20000},
                                       "answers x10": {"answer_len": 1000}, "20 users": {"num_users": 20}}
"""Each variant's changes to BASELINE, in figure order."""
WARMUP: dict[str, Any] = {"num_users": 1, "num_rounds": 2, "qps": 2.0}
WARMUP_TIME_S = 10.0
"""LMBenchmark's warmup(): 1 user, 2 rounds, qps 2, ``--time $((NUM_USERS_WARMUP / 2))`` = 10 s."""
QUESTION_IDS = 1_000_000
"""Block ids of question #q are QUESTION_IDS + q (those of user N's context are N)."""
HIT_WINDOW_TOKENS = 50_000
"""Prompt tokens of the latest prefill admissions over which the hit rate is drawn: 2 to 4 of the studied
prompts (11k-30k tokens), so a round's hit or miss shows while one request does not decide the rate."""
SUMMARY_COLUMNS = ("variant", "num_users", "num_rounds", "user_history_prompt", "answer_len",
                   "warmup_requests", "warmup_s", "requests", "run_s", "ttft_p50_s", "ttft_p90_s",
                   "ttft_max_s",
                   "hit_rate", "prefill_queue_peak", "decode_queue_peak", "warmup_prefill_queue_peak",
                   "warmup_decode_queue_peak", "decode_kv_usage_peak")
SERIES_COLUMNS = ("variant", "time_s", "prefill_queue", "decode_admission_queue", "hit_rate_trailing")
REQUEST_COLUMNS = ("variant", "phase", "session", "turn", "arrival_s", "ttft_s", "prompt_tokens",
                   "cached_tokens")


@attrs.frozen(kw_only=True)
class Run:
    """One variant: its warm-up and benchmark in one simulation."""

    variant: str
    params: Mapping[str, Any]
    start_s: float
    """When the benchmark started: the warm-up's last answer (simulated seconds)."""
    results: Results

    @property
    def requests(self) -> np.ndarray:
        return self.results.requests

    @property
    def benchmark(self) -> np.ndarray:
        """The benchmark's requests (those of the warm-up left out)."""
        req = self.requests
        return req[req["arrival_s"] >= self.start_s]

    def worker(self, role: str) -> str:
        """Name of the run's first worker of ``role`` (prefill / decode), its gauges' prefix."""
        return str(next(k["worker"] for k in self.results.summary["kv_capacity"] if k["role"] == role))

    def pool_tokens(self, role: str) -> int:
        return next(int(k["tokens"]) for k in self.results.summary["kv_capacity"] if k["role"] == role)

    def series(self) -> dict[str, np.ndarray]:
        """The figure's gauges at each sample, time from the benchmark's start."""
        ts = self.results.timeseries
        req = self.requests
        return {"time_s": ts["time_s"] - self.start_s,
                "prefill_queue": ts[f"{self.worker('prefill')}_waiting"],
                "decode_admission_queue": ts["decode_wait"],
                "hit_rate_trailing": trailing_hit_rate(req["first_scheduled_s"], req["prompt_tokens"],
                                                       req["cached_tokens"], ts["time_s"], HIT_WINDOW_TOKENS,
                                                       since_s=self.start_s),
                "decode_kv_usage": ts[f"{self.worker('decode')}_kv_usage"]}

    def row(self) -> dict[str, Any]:
        s = self.results.summary
        series = self.series()
        run = series["time_s"] >= 0
        bench = self.benchmark
        p = self.params
        return {"variant": self.variant, "num_users": p["num_users"], "num_rounds": p["num_rounds"],
                "user_history_prompt": p["user_history_prompt"], "answer_len": p["answer_len"],
                "warmup_requests": len(self.requests) - len(bench), "warmup_s": self.start_s,
                "requests": len(bench), "run_s": float(bench["finish_s"].max()) - self.start_s,
                "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p90_s": s["ttft_s"]["p90"],
                "ttft_max_s": float(bench["ttft_s"].max()), "hit_rate": s["prefix_cache"]["hit_rate"],
                "prefill_queue_peak": int(series["prefill_queue"][run].max()),
                "decode_queue_peak": int(series["decode_admission_queue"][run].max()),
                "warmup_prefill_queue_peak": int(series["prefill_queue"][~run].max(initial=0)),
                "warmup_decode_queue_peak": int(series["decode_admission_queue"][~run].max(initial=0)),
                "decode_kv_usage_peak": float(series["decode_kv_usage"].max())}


def trailing_hit_rate(admitted_s: np.ndarray, prompt: np.ndarray, cached: np.ndarray, times_s: np.ndarray,
                      window_tokens: int, since_s: float = -np.inf) -> np.ndarray:
    """At each of ``times_s``: cached / prompt tokens of the latest requests admitted by then, as few as hold
    ``window_tokens`` prompt tokens (all of them while fewer have been), counting only admissions from
    ``since_s`` on for times from ``since_s`` on (so the benchmark's rate never mixes in the warm-up's). NaN
    before the first admission; requests never admitted (NaN admission time) are left out."""
    ok = np.isfinite(admitted_s)
    order = np.argsort(admitted_s[ok], kind="stable")
    when = admitted_s[ok][order]
    prompt_cum = np.concatenate([[0.0], np.cumsum(prompt[ok][order], dtype=np.float64)])
    cached_cum = np.concatenate([[0.0], np.cumsum(cached[ok][order], dtype=np.float64)])
    times = np.asarray(times_s, dtype=np.float64)
    hi = np.searchsorted(when, times, side="right")
    # the last lo with prompt_cum[hi] - prompt_cum[lo] >= window_tokens (0 while fewer tokens were admitted)
    lo = np.maximum(np.searchsorted(prompt_cum, prompt_cum[hi] - window_tokens, side="right") - 1, 0)
    phase = np.where(times >= since_s, np.searchsorted(when, since_s, side="left"), 0)
    lo = np.minimum(np.maximum(lo, phase), hi)
    tokens = prompt_cum[hi] - prompt_cum[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens > 0, (cached_cum[hi] - cached_cum[lo]) / tokens, np.nan)


def deployment() -> dict[str, Any]:
    """``multiturn_transients.yaml`` as a mapping (no workload)."""
    return read_yaml(DEPLOYMENT)


def variant_params(changes: Mapping[str, Any], baseline: Mapping[str, Any] = BASELINE) -> dict[str, Any]:
    return {**baseline, **changes}


def lmbenchmark_sessions(params: Mapping[str, Any], *, duration_s: float | None = None,
                         prefix: str = "") -> list[Session]:
    """The client's sessions for ``params`` (LMBenchmark flags), ids prefixed with ``prefix``, each user's
    first prompt named as the client writes it (:func:`name_first_prompt`)."""
    sessions = lmbenchmark_multiround(params["num_users"], params["num_rounds"], params["qps"],
                                      params["shared_system_prompt"], params["user_history_prompt"],
                                      params["answer_len"], duration_s=duration_s)
    return [name_first_prompt(s, params["num_rounds"], params["user_history_prompt"], prefix)
            for s in sessions]


def name_first_prompt(session: Session, num_rounds: int, history_tokens: int, prefix: str = "") -> Session:
    """``session`` renamed ``prefix + id``, its first call's own tokens named by content: user N's context
    (block id N), then question #q (block id QUESTION_IDS + q).

    The client writes user N's first prompt as the system prompt, "For user N, here are some other
    context: hi hi ...", then "Here's question #q ..."; the warm-up and the benchmark start from the same
    ``--init-user-id``, so the warm-up's user N sends the benchmark's user N's context, which the prefix
    caches then hold. Session ids cannot say so (each names one stream of the file); block ids can."""
    first = session.calls[0]
    if not history_tokens or first.block_hashes is not None:
        return attrs.evolve(session, id=prefix + session.id)
    user = int(session.id.removeprefix("user-"))
    question = num_rounds - len(session.calls) + 1
    named = attrs.evolve(first, block_hashes=(user, QUESTION_IDS + question),
                         hash_block_tokens=history_tokens)
    return attrs.evolve(session, id=prefix + session.id, calls=(named, *session.calls[1:]))


def simulate(sessions: Sequence[Session], path: Path, base: Mapping[str, Any], **run: Any) -> Results:
    """Write ``sessions`` to the session file ``path`` and run the deployment on it (``run`` overrides)."""
    write_sessions(path, sessions, source="experiments/multiturn_transients.py")
    data = {**base, "workload": {"kind": "sessions", "path": str(path)},
            "run": {**base.get("run", {}), **run}}
    return Simulation(load_config(data)).run()


def warmup(params: Mapping[str, Any], base: Mapping[str, Any], stem: Path) -> tuple[list[Session], float]:
    """The warm-up's sessions cut to the calls its client sends before ``--time``, and when the last of them
    is answered (simulated alone; the session files are ``stem`` + ``_warmup*.jsonl``)."""
    sessions = lmbenchmark_sessions({**params, **WARMUP}, duration_s=WARMUP_TIME_S, prefix="warmup-")
    alone = simulate(sessions, stem.with_name(stem.name + "_warmup_uncut.jsonl"), base).requests
    sent = alone[alone["arrival_s"] <= WARMUP_TIME_S]
    calls = dict(zip(*np.unique(sent["session"], return_counts=True)))
    cut = [attrs.evolve(s, calls=s.calls[: int(calls[s.id])]) for s in sessions if s.id in calls]
    done = simulate(cut, stem.with_name(stem.name + "_warmup.jsonl"), base).requests
    return cut, float(done["finish_s"].max())


def run_variant(name: str, params: Mapping[str, Any], folder: Path,
                base: Mapping[str, Any] | None = None) -> Run:
    """The warm-up, then the benchmark from the warm-up's end, in one simulation."""
    base = base if base is not None else deployment()
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / name.replace(" ", "_")
    warm, start_s = warmup(params, base, stem)
    bench = [attrs.evolve(s, arrival_s=start_s + (s.arrival_s or 0.0)) for s in lmbenchmark_sessions(params)]
    res = simulate(warm + bench, stem.with_suffix(".jsonl"), base, warmup_s=start_s)
    return Run(variant=name, params=dict(params), start_s=start_s, results=res)


def run_all(variants: Mapping[str, Mapping[str, Any]], folder: Path,
            baseline: Mapping[str, Any] = BASELINE) -> list[Run]:
    return [run_variant(name, variant_params(changes, baseline), folder)
            for name, changes in variants.items()]


def write_csvs(runs: Iterable[Run], out: Path, stem: str = "multiturn_transients") -> list[Path]:
    """The per-variant, per-sample and per-request tables."""
    runs = list(runs)
    paths = [out / f"{stem}.csv", out / f"{stem}_timeseries.csv", out / f"{stem}_requests.csv"]
    write_rows((r.row() for r in runs), SUMMARY_COLUMNS, paths[0])
    with open(paths[1], "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(SERIES_COLUMNS)
        for r in runs:
            s = r.series()
            for i in range(len(s["time_s"])):
                w.writerow([r.variant, *(cell(float(s[c][i])) for c in SERIES_COLUMNS[1:])])
    with open(paths[2], "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(REQUEST_COLUMNS)
        for r in runs:
            for q in r.requests:
                w.writerow([r.variant, "run" if q["arrival_s"] >= r.start_s else "warm-up", q["session"],
                            int(q["turn"]), cell(float(q["arrival_s"]) - r.start_s), cell(float(q["ttft_s"])),
                            int(q["prompt_tokens"]), int(q["cached_tokens"])])
    return paths


def title(run: Run) -> str:
    p = run.params
    return (f"{run.variant}: {p['num_users']} user{'s' if p['num_users'] > 1 else ''}, "
            f"{p['user_history_prompt'] / 1000:g}k history,\n{p['answer_len']:,}-token answers")


def plot(runs: Sequence[Run], path: Path, dpi: int = 80) -> Path:
    """Columns = variants, rows = prefill queue, decode admission queue, hit rate, TTFT; each row on one y
    scale, each column on its own time axis (the warm-up shaded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [("prefill_queue", "prefill queue\n(requests waiting)"),
            ("decode_admission_queue", "decode admission queue\n(staged KV awaiting pull)"),
            ("hit_rate_trailing", f"prefill prefix-hit rate, last\n{HIT_WINDOW_TOKENS // 1000}k prompt "
                                  "tokens admitted\n(warm-up and run apart)"),
            ("ttft", "TTFT (s, log)\nat each request's arrival")]
    fig, axes = plt.subplots(len(rows), len(runs), figsize=(3.0 * len(runs) + 1.0, 8.0), sharex="col",
                             sharey="row", squeeze=False)
    for col, run in enumerate(runs):
        s = run.series()
        req = run.requests
        warm = req["arrival_s"] < run.start_s
        for row, (key, label) in enumerate(rows):
            ax = axes[row][col]
            ax.axvspan(-run.start_s, 0, color="0.88", lw=0)
            if key == "ttft":
                t = req["arrival_s"] - run.start_s
                ax.scatter(t[warm], req["ttft_s"][warm], s=6, color="0.45", label="warm-up request")
                ax.scatter(t[~warm], req["ttft_s"][~warm], s=6, color="tab:red", label="benchmark request")
                ax.set_yscale("log")
            else:
                ax.plot(s["time_s"], s[key], color="tab:blue", lw=1.0, drawstyle="steps-post")
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if col == 0:
                ax.set_ylabel(label, fontsize=8)
        axes[0][col].set_title(title(run), fontsize=8, loc="left")
        axes[-1][col].set_xlabel("time since the benchmark started (s)", fontsize=8)
        axes[0][col].text(0.01, 0.95, "warm-up", transform=axes[0][col].transAxes, fontsize=7, va="top",
                          color="0.35")
    axes[2][0].set_ylim(-0.03, 1.03)
    axes[-1][0].legend(fontsize=6, loc="lower left", markerscale=1.5)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def report(runs: Sequence[Run]) -> str:
    """``summary.md``: every number from the runs."""
    first = runs[0]
    pool = first.pool_tokens("prefill")
    lines = ["# Multi-turn pressure transients", "",
             "Qwen3-32B FP8 on 1 prefill + 1 decode H100, vLLM, prefix caching, staged KV pulled by the "
             f"decode worker (KV pools of {pool:,} tokens on the prefill worker and "
             f"{first.pool_tokens('decode'):,} on the decode worker). LMBenchmark multi-round QA at qps "
             f"{first.params['qps']:g}, {first.params['num_rounds']} rounds, a "
             f"{first.params['shared_system_prompt']:,}-token shared system prompt, after the benchmark's "
             f"warm-up (1 user, 2 rounds, qps 2, sends stopped at {WARMUP_TIME_S:g} s, the run's lengths). "
             "Hit rates are the prefill worker's, over the prompt tokens it admitted; TTFT and hit rate "
             "count the benchmark's requests only (from `multiturn_transients.csv`).", ""]
    lines += ["| variant | warm-up | requests | TTFT p50 / p90 / max (s) | hit rate | prefill queue peak "
              "(warm-up / run) | decode admission queue peak (warm-up / run) |",
              "|---|---|---|---|---|---|---|"]
    for r in runs:
        w = r.row()
        lines.append(f"| {r.variant} | {w['warmup_requests']} requests, {w['warmup_s']:.1f} s | "
                     f"{w['requests']} in {w['run_s']:.0f} s | {w['ttft_p50_s']:.3g} / "
                     f"{w['ttft_p90_s']:.3g} / {w['ttft_max_s']:.3g} | {w['hit_rate']:.2f} | "
                     f"{w['warmup_prefill_queue_peak']} / {w['prefill_queue_peak']} | "
                     f"{w['warmup_decode_queue_peak']} / {w['decode_queue_peak']} |")
    lines += ["", "## What the figure shows", ""]
    lines += [f"* {_story(r, first)}" for r in runs]
    return "\n".join(lines) + "\n"


def _uncached(run: Run) -> np.ndarray:
    b = run.benchmark
    return (b["prompt_tokens"] - b["cached_tokens"]).astype(np.int64)


def _story(run: Run, base: Run) -> str:
    """One variant's paragraph: its warm-up transient, then what bounds its benchmark."""
    w, b = run.row(), base.row()
    s = run.series()
    req = run.requests
    warm = req[req["arrival_s"] < run.start_s]
    bench = run.benchmark
    uncached = _uncached(run)
    pool = run.pool_tokens("prefill")
    warm_uncached = int((warm["prompt_tokens"] - warm["cached_tokens"]).sum())
    text = (f"**{run.variant}**: the warm-up's {w['warmup_requests']} prompts "
            f"({int(warm['prompt_tokens'].sum()) / 1000:,.0f}k tokens, {warm_uncached / 1000:,.0f}k of them "
            f"uncached) arrive within {float(warm['arrival_s'].max()):.1f} s; the prefill queue reaches "
            f"{w['warmup_prefill_queue_peak']} and the last answer ends at {w['warmup_s']:.0f} s")
    if w["warmup_decode_queue_peak"]:
        text += (f"; with {run.params['answer_len']:,}-token answers its users' KV fills the decode pool "
                 f"({w['decode_kv_usage_peak']:.0%} at the peak) and up to {w['warmup_decode_queue_peak']} "
                 f"requests wait for a pull")
    text += ". "
    history = run.params["user_history_prompt"]
    first = bench[bench["turn"] == 0]
    warmed = first["cached_tokens"] >= history
    sent = set(warm["session"].tolist())
    shared = sum(f"warmup-{sid}" in sent for sid in first["session"].tolist())
    if run.params["num_users"] == 1:
        later = bench[bench["turn"] > 0]
        if warmed.all():
            text += "The warm-up's copy of the user's first prompt is still cached: round 1 hits it"
        else:
            missed = int(first["prompt_tokens"][0] - first["cached_tokens"][0])
            text += (f"The warm-up sent the user's first prompt too, but its prompts add up to "
                     f"{int(warm['prompt_tokens'].sum()) / pool:.1f}x the prefill pool and the later ones "
                     f"evicted it: round 1 recomputes {missed:,} of its "
                     f"{int(first['prompt_tokens'][0]):,} tokens")
        text += (f" (TTFT {float(first['ttft_s'].max()):.2f} s); later rounds hit the earlier prompt and "
                 f"prefill the previous answer and the new question, median "
                 f"{int(np.median(uncached[bench['turn'] > 0])):,} tokens (TTFT p50 "
                 f"{float(np.median(later['ttft_s'])):.3f} s")
        if run is not base:
            base_later = base.benchmark[base.benchmark["turn"] > 0]
            text += f" against {float(np.median(base_later['ttft_s'])):.3f} s for the baseline"
        text += f"), hit rate {w['hit_rate']:.2f}; the queues stay at {w['prefill_queue_peak']} and " \
                f"{w['decode_queue_peak']}."
        return text
    users = len(np.unique(bench["session"]))
    working = run.params["num_users"] * float(np.mean(bench["prompt_tokens"]))
    over = s["time_s"] >= 0
    queue = s["prefill_queue"][over]
    t_peak = float(s["time_s"][over][int(np.argmax(queue))])
    text += (f"Of the benchmark's {len(first)} users, {shared} had their first prompt sent by the warm-up "
             f"and {int(warmed.sum())} find it still cached")
    if warmed.any() and not warmed.all():
        text += (f" (TTFT p50 {float(np.median(first['ttft_s'][warmed])):.2f} s against "
                 f"{float(np.median(first['ttft_s'][~warmed])):.1f} s for the others)")
    text += (f". After that, {run.params['num_users']} users at a time ({users} in all) keep "
             f"{working / 1000:,.0f}k tokens of context, {working / pool:.1f}x the prefill pool")
    if working > pool:
        text += ", so a user's context is evicted before its next round"
    text += (f": the hit rate is {w['hit_rate']:.2f}, the median prompt recomputes "
             f"{int(np.median(uncached)):,} tokens, the prefill queue builds to {w['prefill_queue_peak']} "
             f"({t_peak:.0f} s in; time-average {float(np.mean(queue)):.1f}) and TTFT p50 is "
             f"{w['ttft_p50_s']:.2g} s (x{w['ttft_p50_s'] / b['ttft_p50_s']:,.0f} the baseline's); the "
             f"decode admission queue peaks at {w['decode_queue_peak']}")
    if w["prefill_queue_peak"] > max(1, 2 * w["decode_queue_peak"]):
        text += ": the prefill worker is the bottleneck"
    text += "."
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="out/multiturn_transients")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs = run_all(VARIANTS, out / "workloads")
    paths = write_csvs(runs, out)
    png = plot(runs, out / "multiturn_transients.png")
    text = report(runs)
    (out / "summary.md").write_text(text, encoding="utf-8")
    print(text, end="")
    print(f"wrote {', '.join(map(str, paths))}, {png} and {out / 'summary.md'} in "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
