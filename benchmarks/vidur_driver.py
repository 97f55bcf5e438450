"""Run Vidur's simulator and time its phases; executed by Vidur's own interpreter, not ServeTwin's.

Usage (from speed.py): ``VIDUR_PYTHON benchmarks/vidur_driver.py VIDUR_REPO -- <vidur.main CLI args>``.
Calls Vidur's public entry points (``SimulationConfig.create_from_cli_args``, ``Simulator``) with the
process working directory set to the Vidur checkout, and prints one line ``VIDUR_TIMINGS {json}`` at exit:
``import_s`` (importing vidur), ``setup_s`` (config + Simulator construction: predictor training or cache
load, request generation), ``loop_s`` (``Simulator.run``, the event loop alone), ``output_s`` (Vidur's
metric writing at exit) and ``events`` (heap pops in the loop). No Vidur code is copied here.
"""

from __future__ import annotations

import atexit
import heapq
import json
import os
import sys
import time
from typing import Any, Dict


def main() -> None:
    repo = os.path.abspath(sys.argv[1])
    args = sys.argv[3:] if len(sys.argv) > 2 and sys.argv[2] == "--" else sys.argv[2:]
    os.chdir(repo)
    sys.path.insert(0, repo)
    timings: Dict[str, Any] = {}

    def report() -> None:
        if "output_start" in timings:
            timings["output_s"] = time.perf_counter() - timings.pop("output_start")
        print("VIDUR_TIMINGS " + json.dumps(timings), flush=True)

    # Registered first, so it runs after Vidur's own atexit writer (atexit is LIFO).
    atexit.register(report)
    t0 = time.perf_counter()
    import vidur.simulator as vsim
    from vidur.config import SimulationConfig
    from vidur.utils.random import set_seeds

    t1 = time.perf_counter()
    timings["import_s"] = t1 - t0

    class _CountingHeapq:
        """Stands in for ``heapq`` inside vidur.simulator to count event pops."""

        pops = 0
        heappush = staticmethod(heapq.heappush)

        @staticmethod
        def heappop(h: list) -> Any:  # type: ignore[type-arg]
            _CountingHeapq.pops += 1
            return heapq.heappop(h)

    vsim.heapq = _CountingHeapq  # type: ignore[assignment]
    sys.argv = ["vidur.main", *args]
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    simulator = vsim.Simulator(config)
    t2 = time.perf_counter()
    timings["setup_s"] = t2 - t1
    simulator.run()
    t3 = time.perf_counter()
    timings["loop_s"] = t3 - t2
    timings["events"] = _CountingHeapq.pops
    timings["simulated_s"] = float(simulator._time)
    timings["output_dir"] = config.metrics_config.output_dir
    timings["output_start"] = t3


if __name__ == "__main__":
    main()
