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
