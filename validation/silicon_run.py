"""Running the measured rows (:func:`validate_silicon`): each row simulated with its twin config (rows asking
for the same simulation share one; a row whose prompts no request can find again runs without the prefix
cache where that gives the same result, :func:`_run_config`), in worker processes when asked, journalled to
``rows.jsonl`` as it finishes so an interrupted run resumes, and written out as ``rows.csv`` and
``summary.json``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import attrs
import numpy as np

from twin.config import TwinConfig
from twin.core.errors import TwinError
from twin.results import Results, jsonable
from validation.accuracy import summarize
from validation.measured_rows import Skip, measured_ms, read_rows
from validation.protocols import protocol
from validation.row_config import parse_prompt_pool, row_config
from validation.row_spec import row_spec

if TYPE_CHECKING:
    from twin.runner import Simulation
    from twin.sources import SyntheticWorkload


def row_sha(row: dict[str, str]) -> str:
    """A fingerprint of the row's cells: a resumed run reuses a journalled result only for the same row."""
    cells = {k: v for k, v in row.items() if not k.startswith("_")}
    return hashlib.sha256(json.dumps(cells, sort_keys=True).encode()).hexdigest()[:16]


def measured_means(table: np.ndarray) -> tuple[float, float, int]:
    """Mean TTFT and mean per-request TPOT (seconds) over the finished requests (the benchmark client's
    own definitions), and how many requests that is."""
    done = table[table["status"] == "finished"]
    tpot = done["tpot_s"][np.isfinite(done["tpot_s"])]
    return float(np.mean(done["ttft_s"])), float(np.mean(tpot)) if len(tpot) else float("nan"), len(done)


UNREPRESENTABLE = (TwinError, ValueError, NotImplementedError)
"""What building or running a row's simulation raises where the twin cannot represent the row."""


def simulate_row(row: dict[str, str], overrides: Mapping[str, Any] = MappingProxyType({})) -> dict[str, Any]:
    """Predicted vs measured TTFT / TPOT for one row, or its skip reason; ``overrides`` are
    :func:`row_config`'s keywords (``waves``, ``prompt_pool``)."""
    from twin.config import load_config

    out = _row_head(row)
    try:  # (row_spec skips a ragged row)
        cfg = load_config(row_config(row, **_row_kwargs(overrides)), list(overrides.get("settings", ())))
        measured_ms(row, "silicon_ttft_ms"), measured_ms(row, "silicon_tpot_ms")  # (before simulating)
        res = _run_config(cfg)
    except Skip as exc:
        return {**out, "skipped": str(exc)}
    except UNREPRESENTABLE as exc:
        return {**out, "skipped": f"not representable: {exc}"}
    s = res.summary
    if s["requests"]["failed"]:
        kinds = "; ".join(f"{e['count']} x {e['example']}" for e in s["fail_reasons"].values())
        return {**out, "skipped": f"{s['requests']['failed']} requests failed: {kinds}"}
    ttft_s, tpot_s, _ = measured_means(res.requests)
    return _row_result(row, out, ttft_s * 1e3, tpot_s * 1e3, s["sim"]["wall_s"])


def _run_config(cfg: TwinConfig) -> Results:
    """The row's simulation, run first without the prefix cache where no request can hit it.

    A benchmark's synthetic prompts (no prompt pool) are each a stream of their own, so no two requests share
    a first block key, and every later block's key chains on the first: no request finds another's blocks.
    The only hits left are a request's own blocks after it was preempted. So a run without a preemption gives
    the same steps, prices and latencies with the cache off, without registering a key per block; a run with
    one is simulated again as configured, and a row whose clients may fill its KV pools (:func:`_may_preempt`)
    is simulated as configured without the first try. Only KV pages of one token take this path (SGLang's
    radix cache: registration is most of such a row's time); rows with a host KV tier keep the cache
    (evictions move blocks there)."""
    from twin.runner import Simulation
    from twin.sources import SyntheticWorkload
    from twin.system import resolve

    kv, w = cfg.kv_cache, cfg.workload
    if not (isinstance(w, SyntheticWorkload) and w.prompt_pool is None and w.prefix_group is None
            and kv.prefix_caching and kv.host_memory_gib is None and resolve(cfg).kv_cache.block_size == 1):
        return Simulation(cfg).run()
    uncached = Simulation(attrs.evolve(cfg, kv_cache=attrs.evolve(kv, prefix_caching=False)))
    if _may_preempt(uncached, w):
        return Simulation(cfg).run()
    res = uncached.run()
    if res.requests["preemptions"].any():
        return Simulation(cfg).run()
    return res


PREEMPT_LOAD = 0.95
"""The share of a run's KV pools that the clients' longest requests may fill before :func:`_run_config`
expects a preemption and simulates the row as configured at once."""


def _may_preempt(sim: "Simulation", w: "SyntheticWorkload") -> bool:
    """Whether a closed loop of c clients may run its workers out of KV: c requests of the longest prompt and
    output fill PREEMPT_LOAD of the KV tokens of all its workers. Only a guess at which of two exact paths is
    cheaper (a run that preempts pays the uncached run and then the cached one); the results do not depend on
    it. On the SGLang rows of silicon_h100_h200.csv it names all 18 rows whose uncached run preempted (load
    0.96-3.3) and 2 that did not (0.99 and 1.75), of 238."""
    from twin.runner import kv_capacity
    from twin.sources import FixedConcurrency

    arrival = w.arrival
    if not isinstance(arrival, FixedConcurrency):
        return False
    block_size = sim.config.kv_cache.block_size
    assert block_size is not None   # (the simulation's config is resolved)
    tokens = sum(pool["tokens"] for pool in kv_capacity(sim.system, block_size))
    return arrival.concurrency * (w.input_tokens.longest + w.output_tokens.longest) >= PREEMPT_LOAD * tokens


def _row_head(row: dict[str, str]) -> dict[str, Any]:
    return {"id": row["id"], "line": int(row["_line"]), "row_sha": row_sha(row), "system": row["system"],
            "backend": row["backend"], "model": row["model_path"], "mode": row["mode"]}


def _row_result(row: dict[str, str], out: dict[str, Any], pred_ttft: float, pred_tpot: float,
                wall_s: float) -> dict[str, Any]:
    """A represented row's result: its predictions against its own measured latencies."""
    spec = row_spec(row)
    meas_ttft, meas_tpot = measured_ms(row, "silicon_ttft_ms"), measured_ms(row, "silicon_tpot_ms")
    return {**out, "notes": "; ".join(spec.notes), "isl": row["isl"], "osl": row["osl"],
            "concurrency": spec.concurrency, "protocol": protocol(row).name,
            "pred_ttft_ms": pred_ttft, "meas_ttft_ms": meas_ttft, "ttft_err_pct": 100 * (pred_ttft - meas_ttft) / meas_ttft,
            "pred_tpot_ms": pred_tpot, "meas_tpot_ms": meas_tpot, "tpot_err_pct": 100 * (pred_tpot - meas_tpot) / meas_tpot,
            "wall_s": wall_s}


def _row_kwargs(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`row_config`'s keywords among a run's overrides (``settings``, the config overrides every row
    takes, are applied to the loaded config instead)."""
    return {k: v for k, v in overrides.items() if k != "settings"}


def simulation_key(row: dict[str, str], overrides: Mapping[str, Any] = MappingProxyType({})) -> str | None:
    """Fingerprint of the simulation a row asks for: its twin config without the config's name (the row id,
    which no part of a run reads), or None where the row is skipped before it is simulated (its config or its
    measured latencies are not usable; such a row is handled on its own).

    The twin gives the same results for the same config, bit for bit, so rows with one key share one
    simulation (:func:`shared_result`). Such rows are one benchmark listed under several ids (InferenceMAX's
    day files, a DeepSeek run listed as tp 64 and as tp 8) or one configuration measured again: 258 of the
    1,584 represented aggregated rows of silicon_h100_h200.csv."""
    try:
        cfg = row_config(row, **_row_kwargs(overrides))
        measured_ms(row, "silicon_ttft_ms"), measured_ms(row, "silicon_tpot_ms")
    except (Skip, *UNREPRESENTABLE):  # (simulate_row gives the reason)
        return None
    cfg = {k: v for k, v in cfg.items() if k != "name"}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def shared_result(row: dict[str, str], done: dict[str, Any]) -> dict[str, Any]:
    """The result of ``row`` from ``done``, the result of a row with the same :func:`simulation_key`: the same
    predictions (or the same simulation's skip reason) against this row's own measured latencies.
    ``simulated_with`` names the line that was simulated, and ``wall_s`` is 0 (no simulation of its own)."""
    out = {**_row_head(row), "simulated_with": done.get("simulated_with", done["line"])}
    if "skipped" in done:
        return {**out, "skipped": done["skipped"]}
    return _row_result(row, out, done["pred_ttft_ms"], done["pred_tpot_ms"], 0.0)


def _row_cost(row: dict[str, str]) -> int:
    """Rough simulation cost of a row (concurrency x output tokens), to start the longest rows first;
    read through :func:`row_spec`, so disaggregated rows count their client concurrency too."""
    try:
        spec = row_spec(row)
    except Skip:
        return 0
    return spec.concurrency * (spec.osl + spec.isl // 64)


def validate_silicon(path: str | Path, out_dir: str | Path, *, jobs: int = 1, limit: int | None = None,
                     match: str | None = None, waves: int | None = None, executor: Executor | None = None,
                     progress: bool = True, resume: bool = False, prompt_pool: str | None = None,
                     settings: Sequence[str] = ()) -> dict[str, Any]:
    """Simulate every row, write ``rows.csv`` and ``summary.json`` into ``out_dir``; returns the summary.
    ``settings``: config overrides (``path=value``) every row's config takes on top of its harness's, for a
    what-if over the measured rows (``hardware.constants=hopper``: Blackwell rows priced with the Hopper
    kernel constants).

    Each finished row is appended to ``out_dir/rows.jsonl`` as it completes (longest rows are started first
    when running in parallel), so an interrupted run keeps its work: ``resume=True`` reuses the rows that file
    holds and simulates the rest. The journal's first line records the CSV and ``waves`` (and ``prompt_pool``
    where given, :func:`row_config`); resuming a journal written for other settings is an error. Rows asking
    for the same simulation (:func:`simulation_key`) share one: the first such row of the file is simulated,
    and the others' results name it in ``simulated_with``."""
    pattern = _checked_arguments(jobs, limit, waves, prompt_pool, match)
    rows = _selected_rows(path, pattern, limit)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    journal = out / "rows.jsonl"
    overrides = {"waves": waves, **({"prompt_pool": prompt_pool} if prompt_pool is not None else {}),
                 **({"settings": list(settings)} if settings else {})}
    if settings:   # a bad setting fails before anything runs, naming itself
        from twin.config import load_config

        load_config(None, list(settings))
    header = {"csv": str(Path(path).resolve()), **overrides}
    done = _journalled(journal, header) if resume and journal.is_file() else {}
    # (re)start the journal: the header and the rows kept, without a line cut off by an interruption
    journal.write_text("".join(json.dumps(x) + "\n" for x in [header, *done.values()]))
    done = _still_current(done, rows)
    todo = [r for r in rows if int(r["_line"]) not in done]
    waiting, own_sims = _share_simulations(rows, todo, overrides)
    own = executor is None and jobs > 1
    pool = ProcessPoolExecutor(max_workers=jobs) if own else executor
    try:
        _simulate(own_sims, waiting, done, journal, overrides, pool, total=len(rows), progress=progress)
    finally:
        if own and pool is not None:
            pool.shutdown(cancel_futures=True)
    if progress:
        print()
    results = [done[int(r["_line"])] for r in rows]
    _write_rows_csv(out / "rows.csv", results)
    summary = summarize(results)
    (out / "summary.json").write_text(json.dumps(jsonable(summary), indent=2, allow_nan=False) + "\n")
    return summary


def _checked_arguments(jobs: int, limit: int | None, waves: int | None, prompt_pool: str | None,
                       match: str | None) -> re.Pattern[str] | None:
    """The run's arguments checked before anything is read; returns the compiled ``match``."""
    for name, value in (("jobs", jobs), ("limit", limit), ("waves", waves)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if prompt_pool is not None:
        parse_prompt_pool(prompt_pool)
    return re.compile(match) if match else None  # a bad pattern fails before anything is read


def _selected_rows(path: str | Path, pattern: re.Pattern[str] | None, limit: int | None) -> list[dict[str, str]]:
    """The CSV's rows whose id matches ``pattern``, the first ``limit`` of them."""
    rows = read_rows(path)
    if pattern is not None:
        rows = [r for r in rows if pattern.search(r["id"])]
    if limit is not None:
        rows = rows[:limit]
    return rows


def _journalled(journal: Path, header: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The results an interrupted run journalled, by CSV line; a journal written for other settings is an
    error, and a last line cut off by the interruption is dropped (that row is simulated again)."""
    lines = journal.read_text().splitlines()
    try:
        first = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        first = lines[0]
    if first != header:
        raise ValueError(f"{journal}: written for {first if lines else 'nothing'}, not for {header}; "
                         f"remove it or run without --resume")
    done: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(lines[1:], 2):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):
                break
            raise ValueError(f"{journal}, line {n}: not a JSON row") from None
        if not isinstance(r, dict) or not isinstance(r.get("line"), int) or "id" not in r:
            raise ValueError(f"{journal}, line {n}: not a row of this journal (no id or line)")
        done[r["line"]] = r
    return done


def _still_current(done: dict[int, dict[str, Any]], rows: list[dict[str, str]]) -> dict[int, dict[str, Any]]:
    """The journalled results that stand for the CSV row now at their line: a result counts only if that row
    is unchanged (its id, and its cells where the journal has their fingerprint); an edited row runs again."""
    current = {int(r["_line"]): r for r in rows}
    return {k: v for k, v in done.items() if k in current and v["id"] == current[k]["id"]
            and v.get("row_sha", row_sha(current[k])) == row_sha(current[k])}


def _share_simulations(rows: list[dict[str, str]], todo: list[dict[str, str]], overrides: Mapping[str, Any],
                       ) -> tuple[dict[int, list[dict[str, str]]], list[dict[str, str]]]:
    """Rows asking for the same simulation share one (:func:`simulation_key`): the first row of each key in the
    file is simulated (or its journalled result kept), the others take its result. Returns the rows of
    ``todo`` waiting on each leader's line, and the rows that run a simulation of their own."""
    keys = {int(r["_line"]): simulation_key(r, overrides) for r in rows}
    leader: dict[str, int] = {}  # simulation key -> line of the first row asking for it
    for r in rows:
        key = keys[int(r["_line"])]
        if key is not None:
            leader.setdefault(key, int(r["_line"]))
    waiting: dict[int, list[dict[str, str]]] = {}  # leader's line -> the todo rows that take its result
    own_sims = []
    for r in todo:
        key, at = keys[int(r["_line"])], int(r["_line"])
        if key is not None and leader[key] != at:
            waiting.setdefault(leader[key], []).append(r)
        else:
            own_sims.append(r)
    return waiting, own_sims


def _simulate(own_sims: list[dict[str, str]], waiting: dict[int, list[dict[str, str]]],
              done: dict[int, dict[str, Any]], journal: Path, overrides: Mapping[str, Any], pool: Executor | None,
              *, total: int, progress: bool) -> None:
    """Simulate ``own_sims`` (in ``pool`` where given, longest first) and record each result in ``done`` and
    the journal as it finishes, with the results of the rows waiting on it."""
    with open(journal, "a") as jf:
        def record(result: dict[str, Any]) -> None:
            jf.write(json.dumps(result) + "\n")
            jf.flush()
            done[int(result["line"])] = result
            if progress:
                print(f"\r{len(done)}/{total} rows", end="", flush=True)
            for other in waiting.pop(int(result["line"]), []):
                record(shared_result(other, result))

        for at in [at for at in waiting if at in done]:  # leaders simulated before an interruption
            for other in waiting.pop(at):
                record(shared_result(other, done[at]))
        if pool is None:
            for row in own_sims:
                record(simulate_row(row, overrides))
        else:
            futures = [pool.submit(simulate_row, row, overrides)
                       for row in sorted(own_sims, key=_row_cost, reverse=True)]
            for fut in as_completed(futures):
                record(fut.result())


ROW_COLUMNS = ["id", "line", "system", "backend", "model", "mode", "isl", "osl", "concurrency", "protocol",
               "pred_ttft_ms", "meas_ttft_ms", "ttft_err_pct", "pred_tpot_ms", "meas_tpot_ms", "tpot_err_pct",
               "wall_s", "simulated_with", "skipped", "notes"]
"""The columns of ``rows.csv``, in order (a represented row fills the predictions, a skipped one ``skipped``)."""


def _write_rows_csv(path: Path, results: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=ROW_COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({c: r.get(c, "") for c in ROW_COLUMNS})
