"""Measured-benchmark harnesses: how each public benchmark ran its engines, and the twin against its rows.

The simulator (``twin``) knows nothing of any benchmark; this package maps a measured row (its engine,
version, client, launch flags) to a twin config, runs it and compares (``silicon``), keeps the harnesses'
launch facts as data (``harness/``) and holds the reports on a run's journal (``report``).
``twin validate silicon`` is the command.
"""
