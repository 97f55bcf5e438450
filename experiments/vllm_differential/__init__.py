"""The twin's vLLM-mode scheduler against vLLM's own v1 scheduler, decision by decision.

``record.py`` runs vLLM's real ``Scheduler`` and ``KVCacheManager`` (no GPU, no model: a fake model
output samples each token) on the scenarios of ``scenarios.py`` and records, step by step, what it
scheduled, the blocks each request holds, the cached blocks and the free queue. The recording ships here
(``vllm_0_12_0.json``); ``tests/twin/test_twin_vllm_differential.py`` replays every scenario on
``twin.core.scheduler.Scheduler`` and requires the same decisions and the same block ids.
"""
