"""The SimPy shell around the core: processes that own time.

Workers (a colocated engine, a prefill or decode worker, an attention-DP group of lockstep ranks), the
disaggregated system with its KV pulls and pushes, the clients and session agents, the timers of the KV
links and the monitor that samples the time series. Each process asks the core what to do next
(:mod:`twin.core.scheduler`), waits for the step's price, and applies the result.
"""
