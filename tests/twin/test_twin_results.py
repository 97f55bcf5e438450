"""Summary statistics: the inter-token gap histogram gives the statistics of the gaps it counts."""

import numpy as np

from twin.results import NS, histogram_stats, stats


def test_histogram_stats_equal_the_stats_of_the_expanded_gaps():
    rng = np.random.default_rng(7)
    counts = {int(g): int(c) for g, c in zip(rng.integers(1, 10**9, 500), rng.integers(1, 50, 500))}
    gaps = sorted(counts)
    expanded = np.repeat(np.array(gaps, dtype=np.float64), [counts[g] for g in gaps]) / NS
    assert histogram_stats(counts) == stats(expanded)
    assert histogram_stats({7: 3}) == stats(np.array([7.0, 7.0, 7.0]) / NS)


def test_a_run_without_token_times_leaves_none_from_an_earlier_run_in_its_folder(tmp_path):
    """Found by fuzzing: results written into a folder an earlier run with metrics.record_token_times had
    used kept that run's token_times.json beside the new run's tables."""
    from twin.config import load_config
    from twin.runner import Simulation

    base = {"model": {"name": "Qwen/Qwen3-0.6B"},
            "workload": {"kind": "synthetic", "num_requests": 3, "arrival": {"kind": "all_at_once"},
                         "input_tokens": {"fixed": 20}, "output_tokens": {"fixed": 4}}}
    Simulation(load_config(base, ["metrics.record_token_times=true"])).run().write(tmp_path)
    assert (tmp_path / "token_times.json").exists()
    Simulation(load_config(base)).run().write(tmp_path)
    assert not (tmp_path / "token_times.json").exists()
