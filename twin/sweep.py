"""Parameter sweeps: a grid of config overrides run through a ``concurrent.futures`` executor.

Local processes by default; a Dask distributed cluster when a scheduler address is given (Dask's
``Client.get_executor()`` is a ``concurrent.futures`` executor, so both paths are the same code). The
results come back as one table: the grid values, then the headline metrics of each run.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import re
import shutil
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Callable

from twin.config import load_config
from twin.config_codec import parse_override, within
from twin.core.errors import TwinError
from twin.results import csv_cell

METRICS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("completed", lambda s: s["requests"]["completed"]),
    ("failed", lambda s: s["requests"]["failed"]),
    ("ttft_mean_s", lambda s: s["ttft_s"]["mean"]),
    ("ttft_p99_s", lambda s: s["ttft_s"]["p99"]),
    ("tpot_mean_s", lambda s: s["tpot_s"]["mean"]),
    ("tpot_p99_s", lambda s: s["tpot_s"]["p99"]),
    ("e2e_p99_s", lambda s: s["e2e_s"]["p99"]),
    ("output_tokens_per_s", lambda s: s["throughput"]["output_tokens_per_s"]),
    ("goodput_requests_per_s", lambda s: s["throughput"]["goodput_requests_per_s"]),
    ("prefix_hit_rate", lambda s: s["prefix_cache"]["hit_rate"]),
    ("preemptions", lambda s: s["preemptions"]),
    ("simulated_s", lambda s: s["sim"]["simulated_s"]),
    ("wall_s", lambda s: s["sim"]["wall_s"]),
]


def parse_grid(specs: list[str]) -> dict[str, list[Any]]:
    """``path=v1,v2,...`` items into ``{path: [v1, v2, ...]}`` (each value read as YAML)."""
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        path, _raw = spec.split("=", 1) if "=" in spec else (spec, "")
        values = [parse_override(f"{path}={item}")[1] for item in _top_level_items(_raw)] if _raw else []
        if not values:
            raise ValueError(f"grid item {spec!r}: expected path=value1,value2,...")
        if path.strip() in grid:
            raise ValueError(f"grid item {spec!r}: {path.strip()} is already in the grid (list every value once)")
        grid[path.strip()] = values
    return grid


def _top_level_items(raw: str) -> list[str]:
    """``raw`` cut at its top-level commas: a list, a mapping or a quoted value keeps its own
    (``[8, 16],[32]`` is two lists)."""
    items: list[str] = []
    depth, start, quote = 0, 0, ""
    for i, ch in enumerate(raw):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(raw[start:i])
            start = i + 1
    return [*items, raw[start:]]


def points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid, in a stable order (last key varies fastest)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def run_point(base: str | dict[str, Any] | None, overrides: list[str], point: dict[str, Any],
              out: str | None) -> dict[str, Any]:
    """One simulation of the sweep (module-level so any executor can ship it to a worker); a point that fails
    (the twin's own error or a bad value) gives a row with its reason under ``error`` and no metrics, and the
    sweep goes on."""
    from twin.runner import build

    settings = [*overrides, *(f"{k}={_yaml(v)}" for k, v in point.items())]
    try:
        res = build(load_config(base, settings), base if isinstance(base, (str, Path)) else None, settings).run()
    except (TwinError, ValueError) as exc:  # (a stall, a value only the deployment refuses): its row says so
        return {**point, **{name: None for name, _ in METRICS}, "error": str(exc)}
    if out is not None:
        res.write(out)
    from twin.results import nothing_completed

    return {**point, **{name: get(res.summary) for name, get in METRICS}, "error": nothing_completed(res.summary) or ""}


def _yaml(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def sweep(base: str | dict[str, Any] | None, grid: dict[str, list[Any]], *, overrides: list[str] | None = None,
          executor: Executor | None = None, out: str | Path | None = None, progress: bool = False,
          journal: str | Path | None = None, resume: bool = False) -> list[dict[str, Any]]:
    """Run every grid point; returns the rows in grid order (``executor=None`` runs them here, in turn).

    With ``out``, point i writes its results folder to ``out/run{i:04d}``; the ``runNNNN`` folders already
    there (an earlier sweep's) are removed first, so every folder is this sweep's and a failed point has none.
    With ``journal``, each row is appended to that JSON-lines file as its point ends, with the point's place
    and a fingerprint of its resolved config (and of its workload file's size and time); ``resume`` reuses
    the journalled rows whose place and fingerprint match (and, with ``out``, whose folder is there) and
    runs the rest. A code change is not noticed: resume only an interrupted sweep of the same code.
    ``progress`` shows a bar of the points done on stderr (:class:`~twin.progress.SweepProgress`).
    """
    for text in overrides or []:  # (applied before each point's grid values, it would be replaced in every one)
        path = text.partition("=")[0].strip()
        for key in grid:
            if within(path, key):
                raise ValueError(f"override {text!r} is replaced in every point by the grid's {key}; give "
                                 f"{path} in the grid or as an override, not both")
    pts = points(grid)
    # Fail on a bad grid value before anything runs.
    prints = [_fingerprint(load_config(base, [*(overrides or []), *(f"{k}={_yaml(v)}" for k, v in point.items())]))
              for point in pts]
    names = [f"run{i:04d}" for i in range(len(pts))]
    outs = [str(Path(out) / name) if out is not None else None for name in names]
    reused: dict[int, dict[str, Any]] = {}
    if resume:
        if journal is None:
            raise ValueError("resume needs the journal of the sweep it continues")
        done = _read_journal(Path(journal))
        for i, (fp, o) in enumerate(zip(prints, outs)):
            row = done.get((i, fp))
            # (a point that ran is reused with its folder only; a failed one has none)
            if row is not None and (row["error"] or o is None or (Path(o) / "summary.json").exists()):
                reused[i] = row
    if out is not None:  # an earlier sweep's run folders would pass for this one's (a failed point writes none)
        kept = {names[i] for i, row in reused.items() if not row["error"]}
        for old in Path(out).glob("run*"):
            if old.is_dir() and re.fullmatch(r"run\d{4,}", old.name) and old.name not in kept:
                shutil.rmtree(old)
    log = None
    if journal is not None:
        log = open(journal, "w", encoding="utf-8")
        for i in sorted(reused):
            _journal(log, i, prints[i], reused[i])
    todo = [i for i in range(len(pts)) if i not in reused]
    results: list[dict[str, Any] | None] = [reused.get(i) for i in range(len(pts))]
    bar = None
    if progress:
        from twin.progress import SweepProgress

        bar = SweepProgress(len(todo), len(reused))

    def finished(i: int, row: dict[str, Any]) -> None:
        results[i] = row
        if log is not None:
            _journal(log, i, prints[i], row)
        if bar is not None:
            bar.done()

    try:
        if executor is None:
            for i in todo:
                finished(i, run_point(base, overrides or [], pts[i], outs[i]))
        else:
            futures: dict[Future[dict[str, Any]], int] = {
                executor.submit(run_point, base, overrides or [], pts[i], outs[i]): i for i in todo}
            for fut in as_completed(futures):
                finished(futures[fut], fut.result())
    finally:
        if log is not None:
            log.close()
        if bar is not None:
            bar.close()
    return [r for r in results if r is not None]


def _fingerprint(config: Any) -> str:
    """What a point's row depends on: its resolved config, and its workload file's size and time."""
    data = config.to_dict()
    path = data.get("workload", {}).get("path")
    if isinstance(path, str) and path:
        from twin.sources import resolve_data_path

        try:
            st = resolve_data_path(path).stat()
            data["_workload_file"] = [st.st_size, st.st_mtime_ns]
        except (OSError, TwinError):
            pass
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _journal(log: Any, index: int, fingerprint: str, row: dict[str, Any]) -> None:
    log.write(json.dumps({"index": index, "fingerprint": fingerprint, "row": row}) + "\n")
    log.flush()


def _read_journal(path: Path) -> dict[tuple[int, str], dict[str, Any]]:
    """(place, fingerprint) -> row of a sweep journal; a line cut short by an interruption is skipped."""
    done: dict[tuple[int, str], dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return done
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the sweep journal {path}: {exc}") from None
    for line in lines:
        try:
            entry = json.loads(line)
            done[(int(entry["index"]), str(entry["fingerprint"]))] = dict(entry["row"])
        except (ValueError, KeyError, TypeError):
            continue
    return done


def make_executor(jobs: int, dask_address: str | None) -> tuple[Executor | None, Callable[[], None]]:
    """A local process pool, a Dask cluster's executor, or None for ``jobs == 1``; plus its shutdown."""
    if dask_address:
        try:
            from dask.distributed import Client
        except ImportError:
            raise ValueError("--dask needs the 'distributed' package: pip install 'servetwin[dask]'") from None
        client = Client(dask_address)
        return client.get_executor(), client.close
    if jobs > 1:
        pool = ProcessPoolExecutor(max_workers=jobs)
        return pool, pool.shutdown
    return None, lambda: None


def write_table(path: str | Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        raise ValueError("no sweep rows to write")
    # Cells as the run's own CSVs write them: an undefined metric (NaN: no request finished, no prompt
    # admitted) empty, where it was the text "nan"; UTF-8 whatever the locale.
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
