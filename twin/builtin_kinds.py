"""Importing this module registers every built-in pluggable kind (systems, routers, workloads, arrivals)."""

import twin.router  # noqa: F401
import twin.sources  # noqa: F401
import twin.system  # noqa: F401
from twin.registry import register_deferred

# Imported on first use: a run pays only for the kinds it names.
register_deferred("system", "disaggregated", "twin.shell.disagg")
register_deferred("workload", "external", "twin.serve")  # live serving: imports an HTTP server
