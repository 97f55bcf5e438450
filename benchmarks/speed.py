"""Simulation-speed benchmark (issue 6): the twin on reference scenarios, side by side with Vidur.

    python benchmarks/speed.py --out DIR [--quick] [--repeats N] [--only NAME,...] [--ff-check]
                               [--vidur-python PATH --vidur-repo PATH [--vidur-cache DIR]]

Per scenario: requests, simulated seconds, wall seconds (median of repeats: config + build + run, in
process), the event loop alone, SimPy events (``env.step`` calls, counted by wrapping the environment's
``step``), requests per wall second and simulated / wall time; then one more run as a whole process
(interpreter start, imports, run: ``--no-process`` skips it) with its wall time and peak resident memory.
The scale points (10,000 / 100,000 / 1,000,000 requests of the same load) run once, as a whole process
only. Where a scenario has a Vidur request list and ``--vidur-python`` is given, Vidur runs as a whole
process on the same requests, and both ratios are reported. Writes
``DIR/speed.json`` (scenario -> figures), ``DIR/meta.json`` (machine, versions, skipped scenarios) and
prints a table. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.scenarios import (  # noqa: E402
    DEFAULT_AZURE_CONV, DEFAULT_VIDUR_DATA, DataPaths, Scenario, scenarios,
)

HERE = Path(__file__).resolve().parent
DEFAULT_VIDUR_CACHE = HERE.parent.parent / "vidur-cache"   # beside this checkout: Vidur's trained predictors
DEFAULT_VIDUR_ATTENTION = DEFAULT_VIDUR_DATA / "SURROGATE_a100_Meta-Llama-3-8B_attention.csv"


# ------------------------------------------------------------------------------------------- twin
def run_twin_once(scn: Scenario, *, count_events: bool = True) -> dict[str, Any]:
    """One in-process run: wall split into config, build and run; events counted on ``env.step``."""
    from twin.config import load_config
    from twin.runner import Simulation

    # Start from a collected heap, as a fresh process would: the previous run's objects (cyclic garbage
    # the collector has not reached yet) are not charged to this one.
    gc.collect()
    c0 = time.process_time()
    t0 = time.perf_counter()
    cfg = load_config(scn.config)
    t1 = time.perf_counter()
    sim = Simulation(cfg)
    t2 = time.perf_counter()
    counter = [0]
    if count_events:
        step: Callable[[], None] = sim.env.step

        def counting_step() -> None:
            counter[0] += 1
            step()

        sim.env.step = counting_step  # type: ignore[method-assign]  # instance attribute shadows the method
    res = sim.run()
    t3 = time.perf_counter()
    c3 = time.process_time()
    status = res.request_column("status")   # (not res.requests: a scale point's table stays on disk)
    return {
        "requests": int(len(status)),
        "finished": int((status == "finished").sum()),
        "simulated_s": float(res.summary["sim"]["simulated_s"]),
        "steps": int(res.summary["sim"]["steps"]),
        "events": counter[0] if count_events else None,
        "config_s": t1 - t0, "build_s": t2 - t1, "run_s": t3 - t2,
        "loop_s": float(res.summary["sim"]["wall_s"]),
        "wall_s": t3 - t0,
        "cpu_s": c3 - c0,
    }


def whole_process(scn: Scenario, paths: DataPaths) -> dict[str, Any]:
    """A scenario too large to repeat in process (the scale points): one run as a whole process, its own
    figures and the process's wall time and peak memory."""
    r = twin_process(scn, paths)
    r["requests_per_wall_s"] = r["requests"] / r["process_wall_s"]
    r["sim_per_wall"] = r["simulated_s"] / r["process_wall_s"]
    r["description"] = scn.description
    return r


def measure_twin(scn: Scenario, repeats: int) -> dict[str, Any]:
    """``repeats`` runs; figures from the run with the median wall time, ``wall_runs_s`` lists them all."""
    runs = [run_twin_once(scn) for _ in range(max(1, repeats))]
    walls = [r["wall_s"] for r in runs]
    med = sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2]
    out = dict(med)
    out["wall_s"] = statistics.median(walls)
    out["loop_s"] = statistics.median(r["loop_s"] for r in runs)
    out["cpu_s"] = statistics.median(r["cpu_s"] for r in runs)
    out["wall_runs_s"] = [round(w, 4) for w in walls]
    out["requests_per_wall_s"] = out["requests"] / out["wall_s"]
    out["sim_per_wall"] = out["simulated_s"] / out["wall_s"]
    out["description"] = scn.description
    return out


def process_env(**extra: str) -> dict[str, str]:
    """The environment of a timed whole process: this one's with Python's bytecode cache on. A
    PYTHONDONTWRITEBYTECODE inherited from a sandbox makes every run compile its sources again, which no
    installed package does (pip compiles them at install); it cost each simulator a share of its time."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


def warm_bytecode(python: str, *trees: Path) -> None:
    """Compile the sources under ``trees`` to their bytecode cache once, as an install does, so that the
    timed processes load it."""
    subprocess.run([python, "-m", "compileall", "-q", *map(str, trees)], check=False, env=process_env(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def twin_process(scn: Scenario, paths: DataPaths, run: bool = True) -> dict[str, Any]:
    """One twin run of ``scn`` as a whole process (fresh interpreter: start-up, imports, run): its wall time,
    its peak resident memory (the kernel's ru_maxrss of that child alone, from ``os.wait4``) and the figures
    the run itself reports (:func:`run_twin_once`). With ``run=False`` the process stops once the simulation
    is built: its fixed cost."""
    cmd = [sys.executable, str(HERE / "speed.py"), "--child", scn.name,
           "--vidur-data", str(paths.vidur_data), "--trace", str(paths.azure_conv)] + ([] if run else ["--no-run"])
    root = HERE.parent
    warm_bytecode(sys.executable, root / "twin", root / "hardware", root / "workloads", HERE)
    with tempfile.TemporaryFile() as figures:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=figures, env=process_env())
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(f"the twin's run of {scn.name} failed (exit {proc.returncode})")
        figures.seek(0)
        text = figures.read().decode()
    match = re.search(r"^TWIN_FIGURES (\{.*\})$", text, re.M)
    out: dict[str, Any] = json.loads(match.group(1)) if match else {}
    out.update(process_wall_s=wall, process_cpu_s=usage.ru_utime + usage.ru_stime,
               peak_rss_mb=usage.ru_maxrss / 1024)   # (Linux: ru_maxrss in KiB)
    return out


FF_FILES = ("requests.csv", "timeseries.csv", "ledger.json", "summary.json")


def ff_check(scn: Scenario) -> dict[str, Any]:
    """The scenario run with fast-forward on and off (``run.fast_forward``): whether each results file is
    byte-identical, summary.json compared without its wall time (``sim.wall_s``, the one figure that is
    meant to differ). ``config.yaml`` differs by the setting itself and is not compared."""
    from twin.config import load_config
    from twin.runner import Simulation

    files: dict[str, dict[str, bytes]] = {}
    for mode, flag in (("on", "true"), ("off", "false")):
        res = Simulation(load_config(scn.config, [f"run.fast_forward={flag}"])).run()
        res.summary["sim"]["wall_s"] = 0.0
        with tempfile.TemporaryDirectory(prefix="ffcheck-") as tmp:
            res.write(Path(tmp))
            files[mode] = {name: (Path(tmp) / name).read_bytes() for name in FF_FILES}
    same = {name: files["on"][name] == files["off"][name] for name in FF_FILES}
    return {"ff_identical": all(same.values()), "ff_files": same}


# ------------------------------------------------------------------------------------------ vidur
def vidur_args(trace: Path, out_dir: Path, cache_dir: Path, attention: Path | None) -> list[str]:
    """Vidur CLI for a trace replay on A100 + Llama-3-8B, Sarathi chunk 512 / batch cap 512 (its README's)."""
    args = [
        "--replica_config_device", "a100", "--replica_config_model_name", "meta-llama/Meta-Llama-3-8B",
        "--cluster_config_num_replicas", "1", "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file", str(trace),
        "--trace_request_generator_config_max_tokens", "16384",
        "--replica_scheduler_config_type", "sarathi",
        "--sarathi_scheduler_config_batch_size_cap", "512", "--sarathi_scheduler_config_chunk_size", "512",
        "--random_forrest_execution_time_predictor_config_prediction_max_prefill_chunk_size", "16384",
        "--random_forrest_execution_time_predictor_config_prediction_max_batch_size", "512",
        "--random_forrest_execution_time_predictor_config_prediction_max_tokens_per_request", "16384",
        "--no-metrics_config_store_plots",
        "--metrics_config_output_dir", str(out_dir), "--metrics_config_cache_dir", str(cache_dir),
    ]
    if attention is not None:
        args += ["--random_forrest_execution_time_predictor_config_attention_input_file", str(attention)]
    return args


def vidur_cache_state(cache_dir: Path) -> str:
    """'warm' when the cache already holds trained predictors and prediction tables, else 'cold'."""
    if cache_dir.is_dir() and any(cache_dir.glob("*_predictions.pkl")):
        return "warm"
    return "cold"


def run_vidur(trace: Path, python: str, repo: Path, cache_dir: Path, attention: Path | None,
              log: Path | None = None) -> dict[str, Any]:
    """Vidur as a whole process on ``trace``; phases from the ``VIDUR_TIMINGS`` line of vidur_driver.py."""
    state = vidur_cache_state(cache_dir)
    warm_bytecode(python, repo)
    env = process_env(WANDB_MODE="disabled", PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory(prefix="vidur-out-") as out_dir:
        cmd = [python, str(HERE / "vidur_driver.py"), str(repo), "--",
               *vidur_args(trace, Path(out_dir), cache_dir, attention)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    if log is not None:
        log.write_text(text)
    if proc.returncode != 0:
        raise RuntimeError(f"Vidur failed (exit {proc.returncode}):\n{text[-3000:]}")
    match = re.search(r"^VIDUR_TIMINGS (\{.*\})$", proc.stdout, re.M)
    timings: dict[str, Any] = json.loads(match.group(1)) if match else {}
    return {"vidur_wall_s": wall, "vidur_cache": state, "vidur_import_s": timings.get("import_s"),
            "vidur_setup_s": timings.get("setup_s"), "vidur_loop_s": timings.get("loop_s"),
            "vidur_output_s": timings.get("output_s"), "vidur_events": timings.get("events"),
            "vidur_simulated_s": timings.get("simulated_s")}


# ----------------------------------------------------------------------------------------- report
COLUMNS: list[tuple[str, str, str]] = [
    ("scenario", "", "{}"), ("requests", "requests", "{:d}"), ("sim s", "simulated_s", "{:.0f}"),
    ("wall s", "wall_s", "{:.2f}"), ("cpu s", "cpu_s", "{:.2f}"), ("loop s", "loop_s", "{:.2f}"),
    ("events", "events", "{:d}"),
    ("steps", "steps", "{:d}"), ("req/wall s", "requests_per_wall_s", "{:.0f}"),
    ("sim/wall", "sim_per_wall", "{:.0f}"), ("twin proc s", "process_wall_s", "{:.2f}"),
    ("proc cpu s", "process_cpu_s", "{:.2f}"), ("peak RSS MB", "peak_rss_mb", "{:.0f}"),
    ("proc floor s", "process_floor_s", "{:.2f}"),
    ("vidur s", "vidur_wall_s", "{:.1f}"), ("vidur loop s", "vidur_loop_s", "{:.2f}"),
    ("x vidur", "speedup_vs_vidur", "{:.1f}"), ("x vidur loop", "speedup_loop_vs_vidur", "{:.1f}"),
]


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [[c[0] for c in COLUMNS]]
    for name, r in results.items():
        row = [name]
        for _, key, fmt in COLUMNS[1:]:
            v = r.get(key)
            row.append("-" if v is None else fmt.format(v))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def git_rev() -> str:
    """Short revision of this checkout, with ``-dirty`` when tracked files differ from it."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                             text=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=HERE).returncode != 0
    except OSError:
        return ""
    return rev + ("-dirty" if dirty else "")


def meta(args: argparse.Namespace, skipped: dict[str, str]) -> dict[str, Any]:
    import simpy

    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "git": git_rev(),
            "python": platform.python_version(), "simpy": simpy.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "repeats": args.repeats, "quick": args.quick, "skipped": skipped,
            "vidur": None if not args.vidur_python else {
                "python": args.vidur_python, "repo": str(args.vidur_repo), "cache": str(args.vidur_cache),
                "attention": args.vidur_attention,
                "pair": "A100 + meta-llama/Meta-Llama-3-8B (twin: a100_sxm + meta-llama/Llama-3.1-8B, same "
                        "architecture); Vidur has no H100 profile for Llama-3"}}


# ------------------------------------------------------------------------------------------- main
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="folder for speed.json and meta.json")
    p.add_argument("--quick", action="store_true", help="only the quick scenarios (under a minute)")
    p.add_argument("--repeats", type=int, default=3, help="twin runs per scenario (median reported)")
    p.add_argument("--only", default="", help="comma-separated scenario names")
    p.add_argument("--trace", type=Path, default=DEFAULT_AZURE_CONV, help="Azure conversation trace CSV")
    p.add_argument("--vidur-data", type=Path, default=DEFAULT_VIDUR_DATA, help="Vidur request lists")
    p.add_argument("--vidur-python", help="interpreter of Vidur's own virtual environment")
    p.add_argument("--vidur-repo", type=Path, help="checkout of microsoft/vidur")
    p.add_argument("--vidur-cache", type=Path, default=DEFAULT_VIDUR_CACHE,
                   help="Vidur's predictor cache (an empty one measures the cold, training run)")
    p.add_argument("--vidur-attention", default=str(DEFAULT_VIDUR_ATTENTION),
                   help="attention profile for Vidur ('' = the checkout's own attention.csv)")
    p.add_argument("--no-process", action="store_true", help="skip the twin's whole-process timing")
    p.add_argument("--ff-check", action="store_true",
                   help="also run each scenario with fast-forward off and compare its results files byte for byte")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--no-run", action="store_true", help=argparse.SUPPRESS)  # child: build, do not run
    args = p.parse_args(argv)
    if args.child is None and args.out is None:
        p.error("--out is required")
    if args.vidur_python and not args.vidur_repo:
        p.error("--vidur-python needs --vidur-repo")
    return args


def select(args: argparse.Namespace, paths: DataPaths) -> list[Scenario]:
    every = scenarios(paths)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {s.name for s in every})
        if unknown:
            raise SystemExit(f"unknown scenario(s) {unknown}; known: {[s.name for s in every]}")
        return [s for s in every if s.name in names]
    return [s for s in every if s.quick or not args.quick]


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    args = parse(argv)
    paths = DataPaths(vidur_data=args.vidur_data, azure_conv=args.trace)
    if args.child is not None:  # whole-process timing: one bare run (or only its build)
        scn = next(s for s in scenarios(paths) if s.name == args.child)
        if args.no_run:
            from twin.config import load_config
            from twin.runner import Simulation
            Simulation(load_config(scn.config))
        else:
            print("TWIN_FIGURES " + json.dumps(run_twin_once(scn, count_events=False)), flush=True)
        return {}
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    if not args.vidur_python:
        print("Vidur comparison skipped: pass --vidur-python and --vidur-repo (see benchmarks/README.md)")
    for scn in select(args, paths):
        reason = scn.skip_reason()
        if reason is not None:
            skipped[scn.name] = reason
            print(f"[skip] {scn.name}: {reason}", flush=True)
            continue
        print(f"[run ] {scn.name}: {scn.description}", flush=True)
        if scn.process_only:
            r = whole_process(scn, paths)
        else:
            r = measure_twin(scn, args.repeats)
            if not args.no_process:
                proc = twin_process(scn, paths)
                r.update({k: proc[k] for k in ("process_wall_s", "process_cpu_s", "peak_rss_mb")})
        if args.ff_check:
            r.update(ff_check(scn))
            print(f"[ff  ] {scn.name}: fast-forward on / off "
                  f"{'identical' if r['ff_identical'] else 'DIFFER: ' + str(r['ff_files'])}", flush=True)
        if scn.vidur_trace is not None and args.vidur_python:
            if not args.no_process:
                r["process_floor_s"] = twin_process(scn, paths, run=False)["process_wall_s"]
            attention = Path(args.vidur_attention) if args.vidur_attention else None
            print(f"[vidur] {scn.name}: cache {vidur_cache_state(args.vidur_cache)} ({args.vidur_cache})",
                  flush=True)
            r.update(run_vidur(scn.vidur_trace, args.vidur_python, args.vidur_repo, args.vidur_cache,
                               attention, log=out / f"vidur_{scn.name}.log"))
            twin_whole = r.get("process_wall_s", r["wall_s"])
            r["speedup_vs_vidur"] = r["vidur_wall_s"] / twin_whole
            if r.get("vidur_loop_s"):
                r["speedup_loop_vs_vidur"] = r["vidur_loop_s"] / r["loop_s"]
        results[scn.name] = r
        (out / "speed.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "meta.json").write_text(json.dumps(meta(args, skipped), indent=2) + "\n")
    (out / "speed.json").write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(table(results))
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    return results


if __name__ == "__main__":
    main()
