"""Simulation-speed benchmarks (see README.md); not part of the installed package."""
