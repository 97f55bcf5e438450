"""cProfile one benchmark scenario: top functions by cumulative and by own (tottime) time.

    python benchmarks/profile.py SCENARIO [--top 25] [--out FILE] [--trace PATH] [--vidur-data DIR]

Profiles config + build + run of the scenario (one run, no event counting) and prints, or writes to
``FILE``, the wall time and the two top lists. Scenario names as in ``benchmarks/speed.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: this folder must not shadow the stdlib ``profile``
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(_here)]
    sys.path.insert(0, str(Path(_here).parent))

import argparse
import cProfile
import io
import pstats
import time
from datetime import datetime, timezone
from typing import Sequence

from benchmarks.scenarios import DEFAULT_AZURE_CONV, DEFAULT_VIDUR_DATA, DataPaths, scenarios  # noqa: E402
from benchmarks.speed import git_rev, run_twin_once  # noqa: E402


def profile(name: str, paths: DataPaths, top: int) -> str:
    every = {s.name: s for s in scenarios(paths)}
    if name not in every:
        raise SystemExit(f"unknown scenario {name!r}; known: {sorted(every)}")
    scn = every[name]
    reason = scn.skip_reason()
    if reason is not None:
        raise SystemExit(f"{name}: cannot run: {reason}")
    import twin.runner  # noqa: F401  (imports outside the profile)

    first = run_twin_once(scn, count_events=False)  # warms caches: the profile shows the steady state
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    r = run_twin_once(scn, count_events=False)
    prof.disable()
    wall = time.perf_counter() - t0
    buf = io.StringIO()
    stamp = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, git {git_rev()}"
    buf.write(f"# {name}: {scn.description}\n# {stamp}, "
              f"{r['requests']} requests, {r['simulated_s']:.0f} simulated s, {r['steps']} steps; "
              f"wall under cProfile {wall:.2f} s (unprofiled first run {first['wall_s']:.2f} s)\n")
    for key in ("cumulative", "tottime"):
        buf.write(f"\n## top {top} by {key}\n")
        stats = pstats.Stats(prof, stream=buf)
        stats.strip_dirs().sort_stats(key).print_stats(top)
    return buf.getvalue()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path)
    p.add_argument("--trace", type=Path, default=DEFAULT_AZURE_CONV)
    p.add_argument("--vidur-data", type=Path, default=DEFAULT_VIDUR_DATA)
    args = p.parse_args(argv)
    text = profile(args.scenario, DataPaths(vidur_data=args.vidur_data, azure_conv=args.trace), args.top)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
