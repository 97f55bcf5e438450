"""The twin's pure core: state machines and engine rules, no SimPy.

Requests and their token streams, the KV cache and block pool, the scheduler with its engine policies, the
decode cohort, fast-forward planning, the flow network of KV links, step prices and the ledger. Everything
here counts time in integer nanoseconds (:mod:`twin.core.clock`) handed in by the caller and never runs an
environment: the SimPy processes in :mod:`twin.shell` drive it. A test imports every module here with
SimPy made unimportable.
"""
