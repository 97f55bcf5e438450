"""validation.silicon: row mapping (parallelism corrections, weight formats, benchmark protocol) and the summary,
on small hand-made CSV rows (never the shared measurements)."""

import csv
import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest

import validation.silicon as validate_module
from validation import inferencemax_disagg, silicon_run
from validation.silicon import (GENAI_PERF, INFERENCEMAX, Skip, client_warmup, mtp_acceptance, protocol, read_rows,
                           row_config, row_spec, summarize, validate_silicon)

COLUMNS = ["id", "silicon_data_source", "backend", "backend_version", "model_path", "system", "precision", "mode",
           "isl", "osl", "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size",
           "attention_dp_size", "moe_tp_size", "moe_ep_size", "prefill_batch_size", "prefill_num_workers",
           "prefill_tp_size", "prefill_pp_size", "prefill_attention_dp_size", "prefill_moe_tp_size",
           "prefill_moe_ep_size", "decode_batch_size", "decode_num_workers", "decode_tp_size", "decode_pp_size",
           "decode_attention_dp_size", "decode_moe_tp_size", "decode_moe_ep_size", "silicon_ttft_ms",
           "silicon_tpot_ms"]


def row(**kw: str) -> dict[str, str]:
    base = dict.fromkeys(COLUMNS, "")
    base.update(id="r", silicon_data_source="source_file=x.csv; silicon_concurrency=4", backend="vllm",
                model_path="meta-llama/Llama-3.1-8B", system="h100_sxm", mode="agg", isl="128", osl="16",
                batch_size="4", tp_size="1", pp_size="1", silicon_ttft_ms="50", silicon_tpot_ms="5", _line="2")
    base.update(kw)
    return base


def write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: v for k, v in r.items() if k in COLUMNS})


def test_inflated_tp_is_scaled_back_to_the_gpus_in_the_id() -> None:
    """One export lists tp x ep as tp_size (tp 64, moe 8 x 8 for an 8-GPU tp 8 / ep 8 run)."""
    r = row(id="2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x1024_c8_tp8_ep8_957", backend="trtllm",
            model_path="deepseek-ai/DeepSeek-R1", system="h200_sxm", gemm_quant_mode="fp8", moe_quant_mode="fp8",
            tp_size="64", attention_dp_size="1", moe_tp_size="8", moe_ep_size="8", batch_size="8",
            silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=8")
    s = row_spec(r)
    assert s.agg is not None and (s.agg.tp, s.agg.dp, s.agg.ep) == (8, 1, 8)
    assert s.weight_dtype == "fp8_block" and any("tp x ep" in n for n in s.notes)


def test_attention_dp_rows_simulate_every_rank() -> None:
    """dp 64 x ep inflation scaled back to 8 ranks; batch_size is per rank, concurrency the client's total,
    all of whose clients the engine's 8 lockstep ranks serve; the DeepSeek script's attention-DP balance
    (dsr1_fp8_h200_trt_slurm.sh: batching_wait_iters 0, enable_balance true, timeout_iters 60) is set."""
    r = row(id="2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_agg_1024x1024_c64_tp8_ep8_941", backend="trtllm",
            model_path="deepseek-ai/DeepSeek-R1", system="h200_sxm", gemm_quant_mode="fp8", tp_size="1",
            attention_dp_size="64", moe_tp_size="8", moe_ep_size="8", batch_size="1",
            silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=64")
    s = row_spec(r)
    assert s.agg is not None and (s.agg.tp, s.agg.dp, s.agg.ep) == (1, 8, 8)
    assert s.concurrency == 64 and s.per_rank_concurrency == 8
    cfg = row_config(r)
    assert cfg["system"] == {"kind": "colocated", "tp": 1, "ep": 8, "attention_dp": 8}
    assert cfg["workload"]["arrival"]["concurrency"] == 64 and cfg["workload"]["num_requests"] == 640
    assert cfg["scheduler"] == {"chunked_prefill": False, "max_num_batched_tokens": 8192,
                                "attention_dp_balance": True, "attention_dp_timeout_iters": 60,
                                "attention_dp_batching_wait_iters": 0}


def test_blank_dp_with_wider_moe_is_attention_dp() -> None:
    """vLLM tp 1 with moe_tp 2: the MoE spans two GPUs, attention runs data-parallel on them."""
    r = row(model_path="Qwen/Qwen3-235B-A22B-FP8", system="h200_sxm", gemm_quant_mode="fp8", moe_quant_mode="fp8",
            tp_size="1", moe_tp_size="2", moe_ep_size="1")
    s = row_spec(r)
    assert s.agg is not None and (s.agg.tp, s.agg.dp) == (1, 2) and s.weight_dtype == "fp8_block"


def test_weight_format_follows_the_checkpoint() -> None:
    assert row_spec(row(gemm_quant_mode="fp8")).weight_dtype == "fp8"
    assert row_spec(row(model_path="openai/gpt-oss-120b", gemm_quant_mode="nvfp4",
                        moe_quant_mode="nvfp4")).weight_dtype == "fp4"
    with pytest.raises(Skip, match="weight format"):
        row_spec(row(gemm_quant_mode="int3"))


def test_protocols_set_lengths_requests_and_warmup() -> None:
    imax = row_config(row())
    assert protocol(row()) is INFERENCEMAX
    assert imax["workload"]["input_tokens"] == {"low": 102, "high": 128}
    assert imax["workload"]["output_tokens"] == {"low": 12, "high": 16}
    assert imax["workload"]["num_requests"] == 10 * 4
    assert imax["scheduler"] == {"max_num_seqs": 4, "max_num_batched_tokens": 8192}
    src = "source_file=/x/aic-auto-gap-analysis/data.csv; silicon_concurrency=4"
    gp = row(silicon_data_source=src, backend="trtllm")
    assert protocol(gp) is GENAI_PERF
    cfg = row_config(gp)
    assert cfg["workload"]["input_tokens"] == {"fixed": 128} and cfg["workload"]["num_requests"] == 10 * 4
    # aiconfigurator's benchmark rules: batch cap = concurrency, token budget c + ISL + 1500 (TRT-LLM: x32)
    assert cfg["scheduler"] == {"max_num_seqs": 4, "max_num_batched_tokens": 1632, "chunked_prefill": False}
    assert row_config(row(silicon_data_source=src, backend="vllm"))["scheduler"] == \
        {"max_num_seqs": 4, "max_num_batched_tokens": 4 + 128 + 1500}
    assert row_config(row(silicon_data_source=src, backend="sglang"))["scheduler"] == \
        {"max_num_seqs": 4, "max_num_batched_tokens": 128 + 1500}
    assert row_config(row(), waves=2)["workload"]["num_requests"] == 10      # never fewer than 10


def test_client_warmup_follows_the_client_and_the_measurement_date() -> None:
    """genai-perf always warms up; InferenceMAX single-node runs do from 2026-01-21 on; the rest is unknown."""
    imax = "source_file=2026-04-06.csv; silicon_concurrency=4; measured="
    assert client_warmup(row(silicon_data_source=imax + "2026-01-20T23:59:59Z")) == "no warm-up"
    assert client_warmup(row(silicon_data_source=imax + "2026-01-21")) == "warm-up"
    assert client_warmup(row()) == "unknown"                                   # no measurement date
    assert client_warmup(row(silicon_data_source=imax + "2026-03-01", mode="disagg")) == "unknown"
    gap = "source_file=/x/aic-auto-gap-analysis/data.csv; silicon_concurrency=4"
    assert client_warmup(row(silicon_data_source=gap)) == "warm-up"


def test_skips_carry_reasons() -> None:
    with pytest.raises(Skip, match="pipeline"):
        row_config(row(pp_size="2"))
    with pytest.raises(Skip, match="GPU"):
        row_config(row(system="tpu_v5"))
    with pytest.raises(Skip, match="silicon_concurrency"):
        row_config(row(batch_size="", silicon_data_source="nothing"))


def test_disaggregated_pools_become_engines_of_lockstep_ranks() -> None:
    r = row(mode="disagg", batch_size="", model_path="deepseek-ai/DeepSeek-V3", system="h200_sxm",
            gemm_quant_mode="fp8", tp_size="", pp_size="", prefill_num_workers="2", prefill_tp_size="8",
            prefill_attention_dp_size="1", prefill_moe_ep_size="8", prefill_batch_size="1",
            decode_num_workers="1", decode_tp_size="1", decode_attention_dp_size="8", decode_moe_ep_size="8",
            decode_batch_size="32", silicon_data_source="db-dump; silicon_concurrency=256")
    cfg = row_config(r)
    assert protocol(r).name == "dynamo-aiperf" and cfg["workload"]["num_requests"] == 3 * 256
    assert cfg["system"]["prefill"] == {"workers": 2, "tp": 8, "ep": 8, "attention_dp": 1, "max_num_seqs": 1}
    assert cfg["system"]["decode"] == {"workers": 1, "tp": 1, "ep": 8, "attention_dp": 8, "max_num_seqs": 32}
    assert cfg["workload"]["arrival"]["concurrency"] == 256
    assert cfg["engine"] == {"name": "vllm"}
    assert "gpus_per_node" not in cfg["system"]   # every engine fits an 8-GPU node
    # a DP16 decode pool: its engine takes 1 x 16 GPUs, so nodes are made that wide (they used to be 8, and
    # the row was refused as "a worker ... does not fit a node of 8 GPUs")
    wide = row_config({**r, "decode_attention_dp_size": "16", "decode_moe_ep_size": "16"})
    assert wide["system"]["decode"]["workers"] == 1 and wide["system"]["gpus_per_node"] == 16
    trt = row_config({**r, "backend": "trtllm"})
    assert trt["engine"]["cuda_graph_max_size"] == 32          # decode workers capture up to their batch
    # A blank count is taken as 1 and the note says which (it used to say 1 + 1 whatever the other was).
    blank = row_spec({**r, "prefill_num_workers": ""})
    assert (blank.prefill_workers, blank.decode_workers) == (1, 1)
    blank = row_spec({**r, "prefill_num_workers": "", "decode_num_workers": "4"})
    assert (blank.prefill_workers, blank.decode_workers) == (1, 4)
    assert "prefill_num_workers empty or 0 in the row: 1 assumed (1 prefill + 4 decode workers)" in blank.notes


def test_summary_mape_groups_and_skip_reasons() -> None:
    rows = [{"id": "a", "line": 2, "system": "h100_sxm", "backend": "vllm", "model": "m", "mode": "agg",
             "ttft_err_pct": 10.0, "tpot_err_pct": -4.0},
            {"id": "b", "line": 3, "system": "h200_sxm", "backend": "vllm", "model": "m", "mode": "agg",
             "ttft_err_pct": -30.0, "tpot_err_pct": 8.0},
            {"id": "c", "line": 4, "system": "h200_sxm", "backend": "sglang", "model": "m", "mode": "agg",
             "skipped": "pipeline parallelism (pp_size > 1) is not modelled"}]
    s = summarize(rows)
    assert s["rows"] == 3 and s["rows_represented"] == 2
    assert s["tpot_mape"] == pytest.approx(6.0) and s["ttft_mape"] == pytest.approx(20.0)
    assert s["agg"]["by_system"]["h100_sxm"]["tpot_mape"] == pytest.approx(4.0)
    assert s["rows_skipped"] == [{"id": "c", "line": 4, "reason": rows[2]["skipped"]}]
    assert s["skip_reasons"] == {"pipeline parallelism (pp_size > 1) is not modelled": 1}


def test_validate_writes_rows_and_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.csv"
    write_rows(path, [row(id="ok"), row(id="pp", pp_size="2")])
    assert [r["id"] for r in read_rows(path)] == ["ok", "pp"]
    s = validate_silicon(path, tmp_path / "out", progress=False, waves=1)
    assert s["rows_represented"] == 1 and len(s["rows_skipped"]) == 1
    out = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
    assert out[0]["protocol"] == "inferencemax" and float(out[0]["pred_tpot_ms"]) > 0
    assert (tmp_path / "out" / "summary.json").is_file()
    # the journal holds a header and both rows; resuming reuses them without simulating anything
    journal = (tmp_path / "out" / "rows.jsonl").read_text().splitlines()
    assert len(journal) == 3 and json.loads(journal[0])["waves"] == 1
    first = [(tmp_path / "out" / f).read_text() for f in ("rows.csv", "summary.json")]

    def no_sim(row: object, overrides: object) -> None:
        raise AssertionError("resume simulated a row it already had")

    monkeypatch.setattr(silicon_run, "simulate_row", no_sim)
    validate_silicon(path, tmp_path / "out", progress=False, waves=1, resume=True)
    assert [(tmp_path / "out" / f).read_text() for f in ("rows.csv", "summary.json")] == first
    # a run cut off mid-row: the broken last line is dropped and only that row is simulated again
    (tmp_path / "out" / "rows.jsonl").write_text("\n".join(journal[:2]) + "\n" + journal[2][:10])
    monkeypatch.undo()
    validate_silicon(path, tmp_path / "out", progress=False, waves=1, resume=True)
    assert [(tmp_path / "out" / f).read_text() for f in ("rows.csv", "summary.json")] == first
    assert (tmp_path / "out" / "rows.jsonl").read_text().splitlines() == journal
    with pytest.raises(ValueError, match="rows.jsonl: written for"):
        validate_silicon(path, tmp_path / "out", progress=False, waves=2, resume=True)


def test_inferencemax_trtllm_rows_get_the_launch_flags_of_their_script() -> None:
    base = dict(backend="trtllm", system="h200_sxm", isl="8192", osl="1024", batch_size="16",
                silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=16")
    oss = row_config(row(model_path="openai/gpt-oss-120b", gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", **base))
    assert oss["scheduler"] == {"chunked_prefill": False, "max_num_seqs": 16, "max_num_batched_tokens": 20000}
    r1 = row_config(row(model_path="deepseek-ai/DeepSeek-R1", gemm_quant_mode="fp8", **base))
    assert r1["scheduler"]["max_num_batched_tokens"] == (16 + 8192 + 64 + 63) // 64 * 64 == 8320
    # DeepSeek 1k prompts: CONC + ISL + 64 rounded up to 64, raised to 8192 only from 2026-01-22 (64af5a771); CONC
    # is the client concurrency, every attention-DP rank's limit (here 256 clients over 8 ranks)
    def r1k(day: str, **kw: str) -> int:
        src = f"source_file=2026-04-06.csv; silicon_concurrency={kw.get('batch_size', '16')}; measured={day}"
        cfg = row_config(row(model_path="deepseek-ai/DeepSeek-R1", gemm_quant_mode="fp8",
                             **{**base, "isl": "1024", "tp_size": "8", "silicon_data_source": src, **kw}))
        budget: int = cfg["scheduler"]["max_num_batched_tokens"]
        return budget
    assert r1k("2025-11-02T00:00:00.000Z") == (16 + 1024 + 64 + 63) // 64 * 64 == 1152
    assert r1k("2026-01-28T00:00:00.000Z") == 8192
    assert r1k("2025-11-02T00:00:00.000Z", batch_size="256", tp_size="1", attention_dp_size="8",
               moe_ep_size="8") == (256 + 1024 + 64 + 63) // 64 * 64 == 1344
    l70 = row_config(row(model_path="meta-llama/Llama-3.1-70B", gemm_quant_mode="fp8", **{**base, "isl": "1024"}))
    assert l70["scheduler"]["max_num_batched_tokens"] == 16384
    assert l70["scheduler"]["batch_wait_iters"] == 20 and l70["scheduler"]["batch_wait_max_tokens_ratio"] == 0.9
    l70_tp8 = row_config(row(model_path="meta-llama/Llama-3.1-70B", gemm_quant_mode="fp8", tp_size="8",
                             **{**base, "isl": "1024"}))
    assert "batch_wait_iters" not in l70_tp8["scheduler"]   # the script's branch: 1k/1k at TP < 8 only
    assert l70["model"]["kv_dtype"] == "fp8"
    assert "kv_dtype" not in oss["model"]


def test_harness_kv_settings_and_skips_follow_the_rows_scripts() -> None:
    im = dict(system="h200_sxm", isl="1024", osl="1024", batch_size="16",
              silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=16; measured=2026-03-25T16:34:14Z")
    r1 = row_config(row(model_path="deepseek-ai/DeepSeek-R1", backend="sglang", gemm_quant_mode="fp8", tp_size="8", **im))
    assert r1["kv_cache"] == {"prefix_caching": False, "gpu_memory_utilization": 0.82}
    assert "kv_dtype" not in r1["model"]
    assert r1["scheduler"] == {"max_num_batched_tokens": 32768, "max_num_seqs": 512}
    trt = row_config(row(model_path="deepseek-ai/DeepSeek-R1", backend="trtllm", gemm_quant_mode="fp8", tp_size="8", **im))
    assert trt["kv_cache"] == {"prefix_caching": False, "gpu_memory_utilization": 0.75}
    assert trt["model"]["kv_dtype"] == "fp8"
    # the 2026-01-14 DeepSeek TRT-LLM runs were the MTP configurations (dsr1_fp8_h200_trt_mtp_slurm.sh): 3 drafts,
    # --max_batch_size CONC, --max_num_tokens 4 x 16 + 1024 + 64 = 1152; 1 draft with attention DP, where one
    # rank's batch is 64 / 8 and its tokens 2 x 8 + 1024 + 64 = 1104 -> 1152. The Dec-2025 gpt-oss H100 ones ran 512 clients
    mtp = dict(im, silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=16; measured=2026-01-14")
    m3 = row_config(row(model_path="deepseek-ai/DeepSeek-R1", backend="trtllm", gemm_quant_mode="fp8", tp_size="8",
                        moe_ep_size="8", **mtp))
    assert m3["engine"]["speculative"] == {"method": "mtp", "num_speculative_tokens": 3, "acceptance": [0.85, 0.63, 0.63]}
    assert m3["scheduler"] == {"chunked_prefill": False, "max_num_seqs": 16, "max_num_batched_tokens": 1152}
    dp = dict(mtp, batch_size="8", silicon_data_source=mtp["silicon_data_source"].replace("=16;", "=64;"))
    m1 = row_config(row(model_path="deepseek-ai/DeepSeek-R1", backend="trtllm", gemm_quant_mode="fp8", tp_size="1",
                        attention_dp_size="8", moe_ep_size="8", **dp))
    assert m1["system"]["attention_dp"] == 8 and m1["engine"]["speculative"]["num_speculative_tokens"] == 1
    assert m1["scheduler"] == {"chunked_prefill": False, "max_num_seqs": 8, "max_num_batched_tokens": 1152,
                               "attention_dp_balance": True, "attention_dp_timeout_iters": 60,
                               "attention_dp_batching_wait_iters": 0}  # (the MTP script's attention_dp_config)
    assert "speculative" not in trt["engine"]
    oss = dict(im, system="h100_sxm", batch_size="512",
               silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=512; measured=2025-12-08T00:00:00.000Z")
    with pytest.raises(Skip, match="512 requests at once"):
        row_config(row(model_path="openai/gpt-oss-120b", gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", tp_size="8", **oss))
    # aiconfigurator's gap analysis: TRT-LLM at free fraction 0.8, and precision fp8 means an FP8 KV cache too
    gap = dict(silicon_data_source="source_file=/x/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/q.csv; "
                                   "silicon_concurrency=4")
    q = row_config(row(model_path="Qwen/Qwen3-32B", backend="trtllm", precision="fp8", gemm_quant_mode="fp8", **gap))
    assert q["kv_cache"] == {"prefix_caching": False, "gpu_memory_utilization": 0.8}
    assert q["model"]["kv_dtype"] == "fp8"
    bf = row_config(row(model_path="meta-llama/Llama-3.1-8B", backend="trtllm", **gap))
    assert "kv_dtype" not in bf["model"]
    # SGLang gap rows: 0.5.6 runs with mixed chunks (the generator's benchmark rule), 0.5.1 prefill first
    s056 = row_config(row(model_path="meta-llama/Llama-3.1-8B", backend="sglang", backend_version="0.5.6.post2", **gap))
    s051 = row_config(row(model_path="meta-llama/Llama-3.1-8B", backend="sglang", backend_version="0.5.1.post1", **gap))
    assert s056["scheduler"]["mixed_prefill"] is True and "mixed_prefill" not in s051["scheduler"]
    # ... and the mem_fraction_static each version derived (no launch sets one): 0.5.6 from the default
    # chunk 8192 (the harness's ISL + 1500 is --max-prefill-tokens) and graphs to 256 at TP1:
    # (81,920 - 13,440) / 81,920; 0.5.1 reserved (9.5 + 1 / 2) GiB under 90 GiB: (81,920 - 10,240) / 81,920
    assert s056["kv_cache"] == {"gpu_memory_utilization": 0.836}
    assert s051["kv_cache"] == {"gpu_memory_utilization": 0.875}
    s051_h200 = row_config(row(model_path="meta-llama/Llama-3.1-8B", backend="sglang", system="h200_sxm",
                               backend_version="0.5.1.post1", tp_size="4", **gap))
    assert s051_h200["kv_cache"] == {"gpu_memory_utilization": round((144384 - 14 * 1024) / 144384, 3)}
    s051_b200 = row_config(row(model_path="meta-llama/Llama-3.1-8B", backend="sglang", system="b200_sxm",
                               backend_version="0.5.1.post1", **gap))
    assert s051_b200["kv_cache"] == {"gpu_memory_utilization": round((184320 - 32 * 1024) / 184320, 3)} == \
        {"gpu_memory_utilization": 0.822}


def test_inferencemax_rows_run_the_prefix_cache_as_their_scripts_set_it() -> None:
    """Off wherever the script disables it (--no-enable-prefix-caching, --disable-radix-cache, enable_block_reuse
    false); the engine's default (on) for GLM-5, Kimi-K2.5 before 79a42e20a (2026-03-27T22:21Z) and MiniMax-M2.5
    before 0f78cf4eb (2026-03-28T02:17Z), and for undated Kimi rows, which either script may have run. Rows of
    other harnesses keep the engine's default."""
    def caching(model: str, backend: str, day: str, **kw: str) -> object:
        when = f"; measured={day}" if day else ""
        cfg = row_config(row(model_path=model, backend=backend, system="h200_sxm", isl="1024", osl="1024",
                             batch_size="16", silicon_data_source=f"source_file=2026_04_06.csv; "
                                                                  f"silicon_concurrency=16{when}", **kw))
        return cfg.get("kv_cache", {}).get("prefix_caching")

    assert caching("meta-llama/Llama-3.1-70B", "vllm", "2025-10-29", tp_size="8") is False
    assert caching("meta-llama/Llama-3.1-70B", "trtllm", "2025-10-29", tp_size="8") is False
    assert caching("zai-org/GLM-5-FP8", "sglang", "2026-03-19", tp_size="8", gemm_quant_mode="fp8") is None
    assert caching("moonshotai/Kimi-K2.5", "vllm", "2026-03-02", tp_size="8") is None
    assert caching("moonshotai/Kimi-K2.5", "vllm", "2026-03-27", tp_size="8") is False
    assert caching("moonshotai/Kimi-K2.5", "vllm", "", tp_size="8") is None
    assert caching("MiniMaxAI/MiniMax-M2.5", "vllm", "2026-03-27", tp_size="8") is None
    assert caching("MiniMaxAI/MiniMax-M2.5", "vllm", "2026-03-28", tp_size="8") is False
    # aiconfigurator's gap analysis: its TRT-LLM template turns block reuse off, its vLLM / SGLang ones leave it on
    source = "source_file=/x/aic-auto-gap-analysis/data/h100_sxm/{}/q.csv; silicon_concurrency=4"
    gap = row(model_path="Qwen/Qwen3-32B", silicon_data_source=source.format("vllm/0.12.0"))
    assert "prefix_caching" not in row_config(gap).get("kv_cache", {})
    gap_trt = row(model_path="Qwen/Qwen3-32B", backend="trtllm", silicon_data_source=source.format("trtllm/1.0.0rc3"))
    assert row_config(gap_trt)["kv_cache"]["prefix_caching"] is False


def test_genai_perf_rows_on_vllm_sample_with_the_models_generation_config() -> None:
    gap = dict(silicon_data_source="source_file=/x/aic-auto-gap-analysis/data/h100_sxm/vllm/0.12.0/q.csv; "
                                   "silicon_concurrency=4")
    q = row_config(row(model_path="Qwen/Qwen3-32B", backend="vllm", tp_size="2", **gap))
    assert q["engine"]["sampling"] == "top_k_top_p"
    # TRT-LLM behind Dynamo and SGLang: not known to apply the defaults; InferenceMAX asks for temperature 0
    for backend in ("trtllm", "sglang"):
        assert "sampling" not in row_config(row(model_path="Qwen/Qwen3-32B", backend=backend, **gap))["engine"]
    im = row_config(row(model_path="Qwen/Qwen3-32B", backend="vllm", system="h200_sxm", tp_size="2",
                        silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=4"))
    assert "sampling" not in im["engine"]
    # a model whose generation_config is not recorded keeps greedy sampling
    assert "sampling" not in row_config(row(model_path="meta-llama/Llama-3.1-8B", backend="vllm", **gap))["engine"]


def test_inferencemax_layouts_follow_the_scripts_where_the_export_differs() -> None:
    def spec(model: str, backend: str, day: str, **kw: str) -> tuple[int, int, int]:
        src = f"source_file=2026-04-06.csv; silicon_concurrency={kw.get('batch_size', '16')}; measured={day}"
        s = row_spec(row(model_path=model, backend=backend, system="h200_sxm", silicon_data_source=src,
                         **{"isl": "1024", "osl": "1024", "batch_size": "16", "gemm_quant_mode": "fp8", **kw}))
        assert s.agg is not None
        return s.agg.tp, s.agg.dp, s.agg.ep
    # 2025-11-02 TRT-LLM scripts passed --ep_size $TP; DeepSeek 8k/1k above CONC 32 ran attention DP
    assert spec("deepseek-ai/DeepSeek-R1", "trtllm", "2025-11-02T00:00:00.000Z", tp_size="8") == (8, 1, 8)
    assert spec("deepseek-ai/DeepSeek-R1", "trtllm", "2025-11-02T00:00:00.000Z", tp_size="8", isl="8192",
                batch_size="64") == (1, 8, 8)
    assert spec("openai/gpt-oss-120b", "trtllm", "2025-11-02T00:00:00.000Z", tp_size="4",
                gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4") == (4, 1, 4)
    # MiniMax vLLM from 2026-03-13 always passed --enable-expert-parallel; before, the export is right
    assert spec("MiniMaxAI/MiniMax-M2.5", "vllm", "2026-03-27T07:59:49Z", tp_size="8") == (8, 1, 8)
    assert spec("MiniMaxAI/MiniMax-M2.5", "vllm", "2026-03-28", tp_size="4", attention_dp_size="4",
                moe_tp_size="1", moe_ep_size="16") == (4, 1, 4)
    assert spec("MiniMaxAI/MiniMax-M2.5", "vllm", "2026-03-01T00:00:00.000Z", tp_size="4") == (4, 1, 1)



def test_vllm_gpt_oss_runs_of_the_marlin_script_price_marlin_experts() -> None:
    """cec542a9a (2026-03-27) exports VLLM_MXFP4_USE_MARLIN=1 for InferenceMAX's vLLM gpt-oss runs; the
    2025-11 scripts did not, and other engines / models keep their default MoE kernel."""
    def cfg(day: str, **kw: str) -> dict:
        src = f"source_file=2026-03-25.csv; silicon_concurrency=4; measured={day}"
        return row_config(row(model_path="openai/gpt-oss-120b", system="h200_sxm", isl="1024", osl="1024",
                              gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", tp_size="4", silicon_data_source=src,
                              **kw))
    assert cfg("2026-03-27T08:01:51Z")["engine"]["moe_kernel"] == "marlin"
    assert "moe_kernel" not in cfg("2025-11-02")["engine"]
    assert "moe_kernel" not in cfg("2026-03-27T08:01:51Z", backend="trtllm")["engine"]


def test_inferencemax_cuda_graph_settings_follow_the_rows_scripts() -> None:
    """vLLM v0.10.2 images (rows before 2025-11-04) replayed piecewise graphs only; the gpt-oss scripts
    capture up to 2,048 tokens; MiniMax-M2.5 on H100 runs PIECEWISE with --max-num-seqs 256, on H200 neither;
    TRT-LLM gpt-oss captures up to its batch limit CONC; genai-perf rows keep the engine's defaults."""
    def cfg(day: str, **kw: str) -> dict:
        src = f"source_file=2026-03-25.csv; silicon_concurrency=4; measured={day}"
        base = dict(model_path="openai/gpt-oss-120b", system="h200_sxm", isl="1024", osl="1024",
                    gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", tp_size="4", silicon_data_source=src)
        base.update(kw)
        return row_config(row(**base))
    assert cfg("2025-11-02")["engine"] == {"name": "vllm", "cuda_graph_mode": "piecewise",
                                           "cuda_graph_max_size": 2048}
    assert cfg("2026-03-27T08:01:51Z")["engine"] == {"name": "vllm", "moe_kernel": "marlin",
                                                     "cuda_graph_max_size": 2048}
    assert cfg("2025-11-02", backend="trtllm")["engine"] == {"name": "trtllm", "cuda_graph_max_size": 4}
    llama = cfg("2025-10-29", model_path="nvidia/Llama-3.1-70B-Instruct-FP8", gemm_quant_mode="fp8",
                moe_quant_mode="")
    assert llama["engine"] == {"name": "vllm", "cuda_graph_mode": "piecewise"}
    assert llama["scheduler"] == {"max_num_seqs": 4, "max_num_batched_tokens": 8192}
    minimax = functools.partial(cfg, "2026-03-27", model_path="MiniMaxAI/MiniMax-M2.5", precision="fp8",
                                gemm_quant_mode="fp8", moe_quant_mode="fp8", backend_version="0.18.0")
    h100 = minimax(system="h100_sxm")
    assert h100["engine"]["cuda_graph_mode"] == "piecewise" and h100["scheduler"] == {"max_num_seqs": 256}
    h200 = minimax()
    assert "cuda_graph_mode" not in h200["engine"] and "scheduler" not in h200
    genai = row_config(row(model_path="openai/gpt-oss-120b", system="h200_sxm", isl="1024", osl="1024",
                           gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4",
                           silicon_data_source="source_file=aic-auto-gap-analysis.csv; silicon_concurrency=4"))
    assert not any(k.startswith("cuda_graph") for k in genai["engine"])
    qwen = cfg("2026-04-06", model_path="Qwen/Qwen3.5-397B-A17B", backend="sglang", precision="fp8",
               gemm_quant_mode="fp8", moe_quant_mode="fp8", tp_size="8", moe_ep_size="8")
    assert qwen["engine"]["cuda_graph_max_size"] == 4          # --cuda-graph-max-bs CONC
    trt = row_config(row(backend="trtllm", batch_size="12",
                         silicon_data_source="source_file=aic-auto-gap-analysis.csv; silicon_concurrency=12"))
    assert trt["engine"]["cuda_graph_sizes"] == list(range(1, 13))   # cuda_graph_batch_sizes 1 .. bs


def fp8_moe_row_config(**kw: str) -> dict:
    """row_config of an FP8 (block-FP8 checkpoint) MoE row on H200 at concurrency 16, EP 1 unless given."""
    base = dict(system="h200_sxm", precision="fp8", gemm_quant_mode="fp8", moe_quant_mode="fp8", moe_ep_size="1",
                batch_size="16", silicon_data_source="source_file=x.csv; silicon_concurrency=16")
    base.update(kw)
    return row_config(row(**base))


def test_vllm_012_block_fp8_moe_on_hopper_runs_deepgemm_experts() -> None:
    """vLLM 0.12 picks the DeepGEMM FP8 MoE backend on Hopper below TP 8 and, with E8M0 scales on by
    default, runs DeepGemmExperts at every batch size (engine_moe_kernel's sources); other versions,
    engines, GPUs, dense models and 8-GPU engines keep the default MoE kernel."""
    cfg = functools.partial(fp8_moe_row_config, model_path="Qwen/Qwen3-235B-A22B-FP8", backend_version="0.12.0",
                            tp_size="2", moe_tp_size="2", isl="1000", osl="100")
    assert cfg()["engine"] == {"name": "vllm", "moe_kernel": "deepgemm"}
    assert cfg(tp_size="1", moe_tp_size="2")["engine"]["moe_kernel"] == "deepgemm"       # DP 2 x TP 1
    assert cfg(moe_tp_size="1", moe_ep_size="2")["engine"]["moe_kernel"] == "deepgemm"    # EP over the TP group
    assert cfg(backend_version="0.18.0")["engine"] == {"name": "vllm"}
    assert cfg(backend="sglang", backend_version="0.5.6.post2")["engine"] == {"name": "sglang"}
    assert cfg(tp_size="8", moe_tp_size="8")["engine"] == {"name": "vllm"}
    assert cfg(system="b200_sxm")["engine"] == {"name": "vllm"}
    assert cfg(model_path="Qwen/Qwen3-32B", moe_tp_size="", moe_ep_size="")["engine"] == {"name": "vllm"}



def test_vllm_016_018_minimax_block_fp8_moe_runs_flashinfer_cutlass() -> None:
    """The InferenceMAX vLLM MiniMax-M2.5 runs price FlashInfer's CUTLASS fused MoE (engine_moe_kernel's
    sources): 0.16.0 tries FLASHINFER_CUTLASS before DeepGEMM / Triton on Hopper block-FP8 (oracle/fp8.py:154-166),
    0.18.0 puts it first with EP and Triton first without (oracle/fp8.py:85-95). H200 TP4 (0.16.0, no EP),
    H100 TP4 / EP4 and H200 TP8 / EP8 (0.18.0) get ``flashinfer``; 0.18.0 without EP, other GPUs and the
    0.12 DeepGEMM rule are unchanged."""
    cfg = functools.partial(fp8_moe_row_config, model_path="MiniMaxAI/MiniMax-M2.5", backend_version="0.16.0",
                            tp_size="4", moe_tp_size="4", isl="1024", osl="1024")
    fi = {"name": "vllm", "moe_kernel": "flashinfer"}
    assert cfg()["model"]["weight_dtype"] == "fp8_block"
    assert cfg()["engine"] == fi and cfg()["system"]["ep"] == 1
    assert cfg(system="h100_sxm", backend_version="0.18.0", moe_tp_size="1", moe_ep_size="4")["engine"] == {
        **fi, "cuda_graph_mode": "piecewise"}                                  # minimaxm2.5_fp8_h100.sh
    assert cfg(backend_version="0.18.0", tp_size="8", moe_tp_size="1", moe_ep_size="8")["engine"] == fi
    # the export's ep 1 on a 0.18 H200 run: the script's --enable-expert-parallel makes it EP over TP
    src = "source_file=x.csv; silicon_concurrency=16; measured=2026-03-27T07:59:49Z"
    run = cfg(backend_version="0.18.0", tp_size="8", moe_tp_size="8", moe_ep_size="1", silicon_data_source=src)
    assert run["engine"] == fi and run["system"]["ep"] == 8
    assert cfg(backend_version="0.18.0")["engine"] == {"name": "vllm"}          # 0.18 without EP: Triton
    assert cfg(system="b200_sxm")["engine"] == {"name": "vllm"}
    assert cfg(backend_version="0.12.0")["engine"] == {"name": "vllm", "moe_kernel": "deepgemm"}

def _side(workers: int, tp: int, ep: int, dp_attn: bool) -> dict[str, object]:
    return {"num_worker": workers, "tp": tp, "ep": ep, "dp_attn": dp_attn, "additional_settings": []}


DISAGG = {"dsr1-fp8-h200-dynamo-trt": [
    {"commit": "a" * 40, "committed": "2026-02-01T00:00:00+00:00", "image": "x", "entries": [
        {"isl": 1024, "osl": 1024, "spec_decoding": "none", "conc_list": [16], "row_concurrency": [144],
         "prefill": _side(1, 8, 8, True), "decode": _side(9, 8, 8, False), "source": "aaaaaaaaa:f.yaml:10"},
        {"isl": 1024, "osl": 1024, "spec_decoding": "mtp", "conc_list": [64], "row_concurrency": [512],
         "prefill": dict(_side(1, 8, 8, True), additional_settings=["CONFIG_FILE=recipes/trtllm/h200/1k1k/mtp/"
                                                                    "c512_ctx1_gen8_dep8_batch64_eplb0_mtp2.yaml"]),
         "decode": _side(8, 8, 8, True), "source": "aaaaaaaaa:f.yaml:20"},
        {"isl": 1024, "osl": 1024, "spec_decoding": "mtp", "conc_list": [4], "row_concurrency": [32],
         "prefill": _side(1, 8, 8, True), "decode": _side(8, 8, 8, True), "source": "aaaaaaaaa:f.yaml:30"},
        {"isl": 1024, "osl": 1024, "spec_decoding": "none", "conc_list": [4], "row_concurrency": [36],
         "prefill": _side(1, 8, 8, True), "decode": _side(9, 8, 8, False), "source": "aaaaaaaaa:f.yaml:40"},
        {"isl": 1024, "osl": 1024, "spec_decoding": "mtp", "conc_list": [4], "row_concurrency": [36],
         "prefill": _side(1, 8, 8, True), "decode": _side(9, 8, 8, False), "source": "aaaaaaaaa:f.yaml:50"}]},
    {"commit": "b" * 40, "committed": "2026-03-01T00:00:00+00:00", "image": "x", "entries": [
        {"isl": 1024, "osl": 1024, "spec_decoding": "none", "conc_list": [16], "row_concurrency": [144],
         "prefill": _side(2, 8, 8, False), "decode": _side(7, 8, 8, False), "source": "bbbbbbbbb:f.yaml:10"}]}]}


def disagg_row(conc: int, measured: str) -> dict[str, str]:
    """An InferenceMAX multinode row as the exports spell it: tp 8 / ep 8 per pool, no worker counts, no dp."""
    side = {f"{s}_{k}": v for s in ("prefill", "decode")
            for k, v in (("tp_size", "8"), ("pp_size", "1"), ("attention_dp_size", "1"), ("moe_tp_size", "1"),
                         ("moe_ep_size", "8"))}
    return row(id=f"x_deepseek_r1_h200_sxm_trtllm_fp8_disagg_1024x1024_c{conc}_tp8_0_ep8_0_1", mode="disagg",
               backend="trtllm", model_path="deepseek-ai/DeepSeek-R1", system="h200_sxm", precision="fp8",
               gemm_quant_mode="fp8", moe_quant_mode="fp8", isl="1024", osl="1024", batch_size="", tp_size="",
               pp_size="", silicon_data_source=f"source_file=x.csv; silicon_concurrency={conc}; "
                                               f"measured={measured}; image=tensorrtllm-runtime:0.8.1", **side)


def test_inferencemax_disagg_rows_take_worker_counts_from_the_config_of_their_date(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The entry in effect at the measured time gives the worker counts; dp-attn true makes the pool's 8
    GPUs attention-DP ranks (the export says dp 1); a date-only stamp stands for the end of its day."""
    monkeypatch.setattr(inferencemax_disagg, "_disagg_configs", lambda: DISAGG)
    s = row_spec(disagg_row(144, "2026-02-14T06:57:35Z"))
    assert (s.prefill_workers, s.decode_workers) == (1, 9)
    assert s.prefill is not None and (s.prefill.tp, s.prefill.dp, s.prefill.ep) == (1, 8, 8)
    assert s.decode is not None and (s.decode.tp, s.decode.dp, s.decode.ep) == (8, 1, 8)
    assert s.notes[-1] == "workers 1 prefill + 9 decode from aaaaaaaaa:f.yaml:10"
    assert any("dp-attn true (row: tp 8 / dp 1 / ep 8)" in n for n in s.notes)
    cfg = row_config(disagg_row(144, "2026-02-14T06:57:35Z"))
    assert cfg["system"]["prefill"] == {"workers": 1, "tp": 1, "ep": 8, "attention_dp": 8}
    assert cfg["system"]["decode"] == {"workers": 9, "tp": 8, "ep": 8, "attention_dp": 1}
    later = row_spec(disagg_row(144, "2026-03-01T00:00:00.000Z"))
    assert (later.prefill_workers, later.decode_workers) == (2, 7) and "bbbbbbbbb" in later.notes[-1]


def test_inferencemax_disagg_mtp_rows_take_the_recipes_drafts_and_unmatched_rows_keep_one_plus_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inferencemax_disagg, "_disagg_configs", lambda: DISAGG)
    cfg = row_config(disagg_row(512, "2026-02-14T06:57:35Z"))  # the recipe ..._mtp2.yaml: 2 drafts
    assert cfg["engine"]["speculative"] == {"method": "mtp", "num_speculative_tokens": 2, "acceptance": [0.85, 0.63]}
    assert cfg["system"]["decode"] == {"workers": 8, "tp": 1, "ep": 8, "attention_dp": 8}
    assert row_spec(disagg_row(512, "2026-02-14T06:57:35Z")).notes[-1] == \
        "MTP speculative decoding, 2 draft tokens (aaaaaaaaa:f.yaml:20)"
    with pytest.raises(Skip, match=r"recipe none\): the number of draft tokens is not known"):
        row_config(disagg_row(32, "2026-02-14T06:57:35Z"))
    with pytest.raises(Skip, match=r"matches an MTP and an STP entry .*f.yaml:40, aaaaaaaaa:f.yaml:50\); "
                                   r"the row does not say which ran$"):
        row_config(disagg_row(36, "2026-02-14T06:57:35Z"))
    assert "speculative" not in row_config(disagg_row(144, "2026-02-14T06:57:35Z"))["engine"]
    s = row_spec(disagg_row(13, "2026-02-14T06:57:35Z"))
    assert (s.prefill_workers, s.decode_workers) == (1, 1)
    assert s.notes == ("no InferenceMAX config matched (dsr1-fp8-h200-dynamo-trt @ aaaaaaaaa, 1024/1024, "
                       "concurrency 13): 1 prefill + 1 decode worker assumed",)


def test_shipped_disagg_configs_cover_the_h200_trtllm_run_of_2026_03_23() -> None:
    """validation/harness/inferencemax_disagg.json: c16 x 9 decode workers, STP, 1 prefill (dp-attn)."""
    s = row_spec(disagg_row(144 * 2, "2026-03-23T13:00:07Z"))
    assert (s.prefill_workers, s.decode_workers) == (1, 9)
    assert s.notes[-1].startswith("workers 1 prefill + 9 decode from f316a0ef6:.github/configs/nvidia-master.yaml:")


def test_inferencemax_multinode_rows_use_the_sa_bench_client() -> None:
    """InferenceMAX's Dynamo runs are benchmarked by sa-bench (benchmark_serving, lengths in [0.8 L, L]);
    a disaggregated row of no known harness keeps Dynamo's aiperf driver."""
    im = row(mode="disagg", silicon_data_source="source_file=2026-03-25.csv; silicon_concurrency=64; "
                                                "measured=2026-03-23T13:00:07Z; image=nvcr.io/x:1")
    assert protocol(im) is INFERENCEMAX
    assert protocol(row(mode="disagg", silicon_data_source="db-dump; silicon_concurrency=64")).name == "dynamo-aiperf"


def test_sglang_059_qwen35_ep8_block_fp8_moe_keeps_triton_curve() -> None:
    """SGLang 0.5.9 with --expert-parallel-size 8 and no a2a backend runs block-FP8 experts through FusedMoE's
    Triton runner (engine_moe_kernel's SGLang sources): no padded DeepGEMM layout, so the InferenceMAX
    Qwen3.5 H200 TP8 / EP8 rows keep the default sglang fp8_block curve, with EP 8."""
    src = "source_file=2026-03-25.csv; model=Qwen3.5-397B; silicon_concurrency=4; measured=2026-03-04"
    cfg = row_config(row(model_path="Qwen/Qwen3.5-397B-A17B", system="h200_sxm", backend="sglang",
                         backend_version="0.5.9", precision="fp8", gemm_quant_mode="fp8_block",
                         moe_quant_mode="fp8_block", tp_size="8", moe_tp_size="1", moe_ep_size="8", isl="1024",
                         osl="1024", batch_size="4", silicon_data_source=src))
    assert cfg["engine"] == {"name": "sglang", "cuda_graph_max_size": 4}   # no moe_kernel: the default curve
    assert cfg["model"]["weight_dtype"] == "fp8_block"
    assert cfg["system"]["tp"] == 8 and cfg["system"]["ep"] == 8


def test_implied_linear_rate_is_the_closed_loops_linear_flops_per_gpu() -> None:
    """Hand-computed: 2 x (active - embedding params) x (ISL + OSL) x c / e2e / GPUs, with the client's mean
    lengths (genai-perf: fixed; InferenceMAX: uniform in [0.8 L, L], mean 0.9 L)."""
    from validation.report import implied_linear_rate
    from hardware import load_model

    m = load_model("meta-llama/Llama-3.1-8B")
    linear = m.active_param_count - m.embedding_params
    gap = row(silicon_data_source="source_file=/x/aic-auto-gap-analysis/data/a.csv; silicon_concurrency=4",
              isl="1000", osl="101", tp_size="2", silicon_ttft_ms="100", silicon_tpot_ms="10")
    e2e = 0.100 + 100 * 0.010                     # TTFT + (OSL - 1) x TPOT, seconds
    assert implied_linear_rate(gap) == pytest.approx(2 * linear * 1101 * 4 / e2e / 2, rel=1e-12)
    imax = row(isl="1000", osl="101", silicon_ttft_ms="100", silicon_tpot_ms="10")
    e2e = 0.100 + (90.9 - 1) * 0.010
    assert implied_linear_rate(imax) == pytest.approx(2 * linear * (900 + 90.9) * 4 / e2e, rel=1e-12)
    assert implied_linear_rate(row(mode="disagg")) is None


def test_fastest_gemm_reads_every_engine_table_of_a_gpu(tmp_path) -> None:
    import gzip

    from validation.report import fastest_gemm

    head = "framework,m,n,k,latency\n"
    with gzip.open(tmp_path / "h200_sxm__gemm_perf__a-1.csv.gz", "wt") as fh:
        fh.write(head + "a,1024,1024,1024,0.002\na,2048,2048,2048,0.01\n")
    (tmp_path / "h200_sxm__gemm_perf__b-2.csv").write_text(head + "b,4096,4096,4096,0.1\n")
    (tmp_path / "h100_sxm__moe_perf__a-1.csv").write_text("not,a,gemm\n")
    best = fastest_gemm(tmp_path)
    assert set(best) == {"h200_sxm"}
    # 1.07e15, 1.72e15 and 1.37e15 FLOP/s: the 2048 row of the first table is the fastest
    assert best["h200_sxm"] == pytest.approx(2 * 2048**3 / 1e-5)


def test_ttft_step_table_medians_per_model_concurrency_and_isl() -> None:
    """Hand-computed: TTFT in lone prompt steps P, and q = (measured - twin) x c / (OSL x measured TPOT)."""
    from validation.report import ttft_step_table

    base = dict(model="m", c=8, isl=2048, osl=100, pred_ttft_ms=100.0, p_ms=50.0)
    recs = [dict(base, meas_ttft_ms=300.0, meas_tpot_ms=10.0),   # 6 P, twin 2 P, q = 200 x 8 / 1000 = 1.6
            dict(base, meas_ttft_ms=200.0, meas_tpot_ms=20.0),   # 4 P, twin 2 P, q = 100 x 8 / 2000 = 0.4
            dict(base, c=16, meas_ttft_ms=150.0, meas_tpot_ms=5.0)]  # 3 P, q = 50 x 16 / 500 = 1.6
    out = ttft_step_table(recs)
    assert [(t["c"], t["rows"]) for t in out] == [(8, 2), (16, 1)]
    assert out[0]["meas_per_p"] == pytest.approx(5.0) and out[0]["twin_per_p"] == pytest.approx(2.0)
    assert out[0]["q"] == pytest.approx(1.0)
    assert out[1]["meas_per_p"] == pytest.approx(3.0) and out[1]["q"] == pytest.approx(1.6)


def test_lone_prompt_step_is_the_ttft_of_one_request_on_an_idle_engine() -> None:
    """P is the step of one whole prompt and nothing else: what a lone request waits for on an idle engine
    (which admits an arrival at once), so the twin's own TTFT of that request equals it."""
    from validation.report import lone_prompt_step_ms
    from twin.config import load_config
    from twin.runner import Simulation

    gap = row(model_path="meta-llama/Llama-3.1-8B", backend="trtllm", backend_version="1.0.0rc3", isl="1024",
              osl="4", batch_size="1", silicon_data_source="source_file=/x/aic-auto-gap-analysis/a.csv; "
                                                           "silicon_concurrency=1")
    cfg = row_config(gap, waves=1)
    cfg["workload"]["num_requests"] = 1
    res = Simulation(load_config(cfg)).run()
    # the simulated clock counts whole nanoseconds: equal to within 1 ns
    assert res.requests["ttft_s"][0] * 1e3 == pytest.approx(lone_prompt_step_ms(gap), abs=1e-6)


def test_a_rows_engine_limits_replace_the_harness_rule() -> None:
    """A CSV may give the engine limits its harness launched with (max_batch_size, max_num_tokens): the batch a
    config generator chose replaces c in aiconfigurator's rule (token budget bs + ISL + 1500, CUDA graphs
    1..bs), and overrides any other rule's cap; a blank cell keeps the rule, a bad one skips the row naming
    the column, and a disaggregated row is told where its pools' caps go."""
    src = "source_file=/x/aic-auto-gap-analysis/data.csv; silicon_concurrency=8"
    gp = row(silicon_data_source=src, backend="trtllm", batch_size="8")
    assert row_config(gp)["scheduler"] == {"max_num_seqs": 8, "max_num_batched_tokens": 1664,
                                           "chunked_prefill": False}
    capped = row_config({**gp, "max_batch_size": "7"})
    assert capped["scheduler"] == {"max_num_seqs": 7, "max_num_batched_tokens": (7 + 128 + 1500 + 31) // 32 * 32,
                                   "chunked_prefill": False}
    assert capped["engine"]["cuda_graph_sizes"] == [1, 2, 3, 4, 5, 6, 7]
    assert capped["workload"]["arrival"] == {"kind": "concurrency", "concurrency": 8}   # the client is unchanged
    assert row_spec({**gp, "max_batch_size": "7"}).notes == ("max_batch_size 7 from the row",)
    assert row_config({**gp, "max_batch_size": "7", "max_num_tokens": "4096"})["scheduler"] == \
        {"max_num_seqs": 7, "max_num_batched_tokens": 4096, "chunked_prefill": False}
    vllm = row_config(row(silicon_data_source=src, backend="vllm", batch_size="8", max_batch_size="6"))
    assert vllm["scheduler"] == {"max_num_seqs": 6, "max_num_batched_tokens": 6 + 128 + 1500}
    # InferenceMAX: the script's token rule stays, the cap is the row's
    assert row_config(row(max_batch_size="3"))["scheduler"] == {"max_num_seqs": 3, "max_num_batched_tokens": 8192}
    assert row_config({**gp, "max_batch_size": " ", "max_num_tokens": ""}) == row_config(gp)
    for bad, why in (("0", "expected an integer >= 1"), ("2.5", "is not a non-negative integer"),
                     ("many", "is not a number")):
        with pytest.raises(Skip, match=f"column max_batch_size={bad!r}.*{why}"):
            row_config({**gp, "max_batch_size": bad})
    with pytest.raises(Skip, match="column max_num_tokens='8192': an aggregated engine's limit; .*decode_batch_size"):
        row_spec(row(mode="disagg", batch_size="", max_num_tokens="8192"))


def test_bad_cells_and_ragged_rows_are_skipped_with_their_line_and_column(tmp_path: Path) -> None:
    """Found by fuzzing the command: a measured value that is not a positive number crashed the run after
    simulating (or divided by zero, or counted a NaN row as represented); a short row crashed, a long one
    lost its extra cells silently; line numbers ignored blank lines; an empty group wrote NaN, which is
    not JSON. Now each such row is skipped with its reason, before any simulation."""
    path = tmp_path / "s.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        fh.write("\n")  # a blank line: the next row is on line 3
        for kw in ({"id": "abc", "silicon_ttft_ms": "abc"}, {"id": "zero", "silicon_tpot_ms": "0"},
                   {"id": "nan", "silicon_tpot_ms": "nan"}, {"id": "neg", "silicon_ttft_ms": "-4"}):
            r = row(**kw)
            w.writerow([r[c] for c in COLUMNS])
        w.writerow([row(id="short")[c] for c in COLUMNS][:-3])
        w.writerow([row(id="long")[c] for c in COLUMNS] + ["x"])
    rows = read_rows(path)
    assert [(r["id"], r["_line"]) for r in rows] == [("abc", "3"), ("zero", "4"), ("nan", "5"), ("neg", "6"),
                                                      ("short", "7"), ("long", "8")]
    s = validate_silicon(path, tmp_path / "out", progress=False)
    assert s["rows_represented"] == 0
    reasons = {r["id"]: r["reason"] for r in s["rows_skipped"]}
    assert reasons == {
        "abc": "column silicon_ttft_ms='abc' is not a number",
        "zero": "column silicon_tpot_ms='0': expected a measured latency > 0",
        "nan": "column silicon_tpot_ms='nan': expected a measured latency > 0",
        "neg": "column silicon_ttft_ms='-4': expected a measured latency > 0",
        "short": f"line 7 has {len(COLUMNS) - 3} cells where the header has {len(COLUMNS)}",
        "long": f"line 8 has {len(COLUMNS) + 1} cells where the header has {len(COLUMNS)}"}
    written = json.loads((tmp_path / "out" / "summary.json").read_text())  # strict JSON: null, not NaN
    assert written["agg"]["tpot_mape"] is None and written["disagg"]["ttft_mape"] is None


def test_rows_asking_for_one_simulation_share_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ids of one benchmark (the DeepSeek export's tp 64 listing of a tp 8 run, here its Llama form: the
    same cells but id and measured latencies) are simulated once; each row keeps its own measured figures."""
    path = tmp_path / "s.csv"
    rows = [row(id="a", silicon_ttft_ms="50", silicon_tpot_ms="5"),
            row(id="other", osl="8"),
            row(id="b", silicon_ttft_ms="40", silicon_tpot_ms="4"),
            row(id="bad", silicon_ttft_ms="x")]  # same config, unusable measurement: skipped on its own
    write_rows(path, rows)
    sims: list[str] = []
    real = silicon_run.simulate_row

    def counted(r: dict[str, str], overrides: dict[str, object]) -> dict[str, object]:
        sims.append(r["id"])
        return real(r, overrides)

    monkeypatch.setattr(silicon_run, "simulate_row", counted)
    validate_silicon(path, tmp_path / "out", progress=False, waves=1)
    assert sims == ["a", "other", "bad"]
    out = {r["id"]: r for r in csv.DictReader(open(tmp_path / "out" / "rows.csv"))}
    a, b = out["a"], out["b"]
    assert (b["pred_ttft_ms"], b["pred_tpot_ms"]) == (a["pred_ttft_ms"], a["pred_tpot_ms"])
    assert (b["meas_ttft_ms"], b["meas_tpot_ms"]) == ("40.0", "4.0")
    assert float(b["tpot_err_pct"]) == pytest.approx(100 * (float(a["pred_tpot_ms"]) - 4) / 4)
    assert (b["simulated_with"], b["wall_s"], a["simulated_with"]) == ("2", "0.0", "")
    assert out["bad"]["skipped"] == "column silicon_ttft_ms='x' is not a number"
    # the shared result is what simulating the row itself gives (the twin is deterministic), but its wall time
    mine = real({**rows[2], "_line": "4"}, {"waves": 1})
    shared = next(json.loads(x) for x in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()
                  if '"id": "b"' in x)
    assert {**mine, "wall_s": 0.0, "simulated_with": 2} == shared
    # resumed with only b left to do, it takes a's journalled result without simulating
    journal = [x for x in (tmp_path / "out" / "rows.jsonl").read_text().splitlines() if '"id": "b"' not in x]
    (tmp_path / "out" / "rows.jsonl").write_text("\n".join(journal) + "\n")
    sims.clear()
    validate_silicon(path, tmp_path / "out", progress=False, waves=1, resume=True)
    assert sims == [] and list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))[2] == b


def test_a_shared_simulations_skip_reason_is_every_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.csv"
    write_rows(path, [row(id="a"), row(id="b", silicon_tpot_ms="9")])

    def fails(r: dict[str, str], overrides: dict[str, object]) -> dict[str, object]:
        return {"id": r["id"], "line": int(r["_line"]), "skipped": "3 requests failed: {'x': 3}"}

    monkeypatch.setattr(silicon_run, "simulate_row", fails)
    s = validate_silicon(path, tmp_path / "out", progress=False, waves=1)
    assert [(x["id"], x["reason"]) for x in s["rows_skipped"]] == [("a", "3 requests failed: {'x': 3}"),
                                                                  ("b", "3 requests failed: {'x': 3}")]


def test_resume_simulates_a_row_edited_since_it_was_journalled(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"

    def write(osl: str) -> None:
        write_rows(path, [row(id="a", osl=osl)])

    write("16")
    validate_silicon(path, tmp_path / "out", progress=False, waves=1)
    write("8")
    validate_silicon(path, tmp_path / "out", progress=False, waves=1, resume=True)
    out = list(csv.DictReader(open(tmp_path / "out" / "rows.csv")))
    assert out[0]["osl"] == "8"  # it used to report the journalled osl 16 and its prediction
    with pytest.raises(ValueError, match="limit must be >= 1, got -1"):
        validate_silicon(path, tmp_path / "out", progress=False, limit=-1)


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    """Found by fuzzing: a CSV saved with a UTF-8 byte-order mark (Excel's "CSV UTF-8") was refused for a
    missing column 'id', its first column read as '\\ufeffid'; it reads as the file without the mark."""
    plain = tmp_path / "plain.csv"
    with open(plain, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        w.writerow([row(id="ok")[c] for c in COLUMNS])
    marked = tmp_path / "marked.csv"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert read_rows(marked) == read_rows(plain) and read_rows(marked)[0]["id"] == "ok"


def test_bytes_that_are_not_utf8_name_the_file(tmp_path: Path) -> None:
    """Found by fuzzing: a byte that is not UTF-8 was a bare UnicodeDecodeError naming no file (`twin
    validate silicon` printed only "'utf-8' codec can't decode byte 0xff ...")."""
    path = tmp_path / "s.csv"
    path.write_bytes(b"id,backend\n\xff,1\n")
    with pytest.raises(ValueError) as info:
        read_rows(path)
    assert str(info.value) == (f"{path}: expected UTF-8 text ('utf-8' codec can't decode byte 0xff in position 11: "
                               "invalid start byte)")


SILICON_HEADER = ",".join(COLUMNS)
LLAMA_8B_TRTLLM_ROW = (  # a row of the H100 / H200 silicon CSV, as measured
    "meta_llama_llama_3_1_8b_instruct_meta_llama_llama_3_1_8b_instruct_h100_sxm_trtllm_agg_1024x128_c8_tp1_"
    "epnone_1,source_file=/Users/harrli/projects/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/"
    "meta-llama_Llama-3.1-8B-Instruct.csv; silicon_concurrency=8,trtllm,1.0.0rc3,"
    "meta-llama/Llama-3.1-8B-Instruct,h100_sxm,,agg,1024,128,,,8,1,1,,1,1,,,,,,,,,,,,,,,190.9545068625,7.94357745")


def test_a_row_longer_than_the_models_context_is_skipped_for_it(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    """Found by fuzzing: isl=1000000000000 was skipped for memory ("does not fit on h100_sxm ... reserve
    95367432.79 GiB", the harness's token budget following isl), and isl=131000 with osl=128 simulated ten
    requests the engine refused; both are skipped for the context length, before any deployment is built.
    A row at the context length exactly, and the row as measured, still run; the last row is past --limit."""
    from twin.cli import main

    def variant(name: str, isl: int) -> str:
        return LLAMA_8B_TRTLLM_ROW.replace("_epnone_1,", f"_epnone_1_{name},").replace(",agg,1024,128,",
                                                                                      f",agg,{isl},128,")

    path = tmp_path / "s.csv"
    rows = [variant("huge", 10**12), variant("long", 131000), variant("edge", 131072 - 128), LLAMA_8B_TRTLLM_ROW,
            variant("past", 10**12)]
    path.write_text("\n".join([SILICON_HEADER, *rows]) + "\n")
    assert main(["validate", "silicon", str(path), "--out", str(tmp_path / "out"), "--limit", "4",
                 "--waves", "1"]) == 0
    capsys.readouterr()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows_represented"] == 2
    context = ("meta-llama/Llama-3.1-8B's context length, 131072 (the engine's max_model_len): the engine refuses "
               "every request")
    assert [(r["id"].rsplit("_", 1)[1], r["line"], r["reason"]) for r in summary["rows_skipped"]] == [
        ("huge", 2, f"isl=1000000000000 + osl=128 = 1000000000128 tokens is more than {context}"),
        ("long", 3, f"isl=131000 + osl=128 = 131128 tokens is more than {context}")]
    with pytest.raises(Skip, match="^isl=131000 \\+ osl=128 = 131128 tokens is more than"):
        row_spec(read_rows(path)[1])


def test_point_table_splits_the_mape_into_group_shares() -> None:
    """Hand-computed: 4 rows, |TTFT errors| 10, 30, 20, 40 (MAPE 25); a group's points are its summed
    |error| / 4, so group x carries (10 + 30) / 4 = 10 and group y (20 + 40) / 4 = 15."""
    from validation.report import point_table

    rows = [dict(g="x", ttft_err_pct=10.0), dict(g="x", ttft_err_pct=-30.0),
            dict(g="y", ttft_err_pct=20.0), dict(g="y", ttft_err_pct=-40.0)]
    out = point_table(rows, "ttft", ["g"])
    assert [(t["group"], t["rows"]) for t in out] == [(("y",), 2), (("x",), 2)]   # largest share first
    assert [t["points"] for t in out] == [15.0, 10.0] and sum(t["points"] for t in out) == 25.0
    assert [t["mape"] for t in out] == [30.0, 20.0]
    assert [t["signed_median"] for t in out] == [-10.0, -10.0]
    with pytest.raises(ValueError, match="metric must be 'ttft' or 'tpot'"):
        point_table(rows, "e2e", ["g"])
    # a row without a finite error counts in neither the points nor the rows they are shares of
    assert [t["points"] for t in point_table([*rows, dict(g="z", ttft_err_pct=float("nan"))], "ttft", ["g"])] \
        == [15.0, 10.0]


def test_gpu_pair_table_sets_measured_against_predicted_ratio_of_the_same_benchmark() -> None:
    """Hand-computed: benchmark A ran on both GPUs (its H100 row twice, averaged: measured TPOT 10 ms,
    predicted 11 ms; H200 measured 8, predicted 9.9): measured ratio 0.8, predicted 0.9, transfer error
    0.9 / 0.8 - 1 = +12.5 %. Benchmark B differs from A only in concurrency, and B' in its measurement date,
    so each has one GPU and pairs with nothing."""
    from validation.report import PAIR_KEY, gpu_pair_table

    base = {k: "x" for k in PAIR_KEY} | {"meas_ttft_ms": 100.0, "pred_ttft_ms": 100.0, "model": "m"}

    def rec(system: str, meas: float, pred: float, **kw: str) -> dict:
        return base | {"system": system, "meas_tpot_ms": meas, "pred_tpot_ms": pred} | kw

    rows = [rec("h100_sxm", 9.0, 10.0), rec("h100_sxm", 11.0, 12.0), rec("h200_sxm", 8.0, 9.9),
            rec("h100_sxm", 5.0, 5.0, concurrency="y"), rec("h200_sxm", 4.0, 4.0, measured="2026-01-01"),
            rec("b200", 4.0, 4.0)]
    out = gpu_pair_table(rows, ["model"])
    assert [(t["group"], t["pairs"]) for t in out] == [(("all",), 1), (("m",), 1)]
    assert out[0]["tpot_meas"] == pytest.approx(0.8) and out[0]["tpot_pred"] == pytest.approx(0.9)
    assert out[0]["tpot_err"] == pytest.approx(0.125) and out[0]["tpot_abs_err"] == pytest.approx(0.125)
    assert out[0]["ttft_err"] == pytest.approx(0.0)


def test_points_groups_on_the_measured_csvs_columns_too(tmp_path: Path) -> None:
    """A key that rows.csv lacks (backend_version) is read from the measured CSV the journal names, joined
    on the row id; the disaggregated rows and the skipped ones stay out of the aggregated figure."""
    from validation.report import points

    measured = tmp_path / "m.csv"
    with open(measured, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for rid, version in (("a", "0.12.0"), ("b", "0.12.0"), ("c", "0.18.0"), ("d", "0.18.0"), ("e", "")):
            w.writerow({k: v for k, v in row(id=rid, backend_version=version).items() if k in COLUMNS})
    out = tmp_path / "out"
    out.mkdir()
    (out / "rows.jsonl").write_text(json.dumps({"csv": str(measured), "waves": None}) + "\n")
    cols = ["id", "mode", "backend", "ttft_err_pct", "tpot_err_pct", "skipped"]
    with open(out / "rows.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerows([["a", "agg", "vllm", "-10", "1", ""], ["b", "agg", "vllm", "20", "2", ""],
                     ["c", "agg", "vllm", "60", "-3", ""], ["d", "disagg", "vllm", "99", "9", ""],
                     ["e", "agg", "vllm", "", "", "pipeline parallelism (pp_size > 1) is not modelled"]])
    text = points(out, "ttft", ["backend", "backend_version"])
    lines = text.splitlines()
    assert lines[0].startswith("3 represented agg rows, TTFT MAPE 30.00 %")
    # 0.18.0: 60 / 3 = 20 points; 0.12.0: (10 + 20) / 3 = 10 points, MAPE 15, signed median +5
    assert lines[2].split() == ["20.00", "1", "60.0", "+60.0", "vllm", "/", "0.18.0"]
    assert lines[3].split() == ["10.00", "2", "15.0", "+5.0", "vllm", "/", "0.12.0"]
    assert "1 represented disagg rows, TTFT MAPE 99.00 %" in points(out, "ttft", ["backend"], mode="disagg")
    with pytest.raises(ValueError, match=r"unknown column\(s\) \['gpu'\]"):
        points(out, "ttft", ["gpu"])
    with open(out / "rows.csv", "a", newline="") as fh:
        csv.writer(fh).writerow(["f", "agg", "vllm", "5", "5", ""])
    with pytest.raises(ValueError, match="1 row.s. of .* are not in .*m.csv .first: 'f'.: the file changed"):
        points(out, "ttft", ["backend_version"])
    assert points(out, "ttft", ["backend"]).splitlines()[0].startswith("4 represented agg rows, TTFT MAPE 23.75 %")
    measured.unlink()
    with pytest.raises(ValueError, match="is not at hand"):
        points(out, "ttft", ["backend_version"])
    assert points(out, "tpot", ["backend"], top=0).splitlines()[-1].split()[:2] == ["2.75", "4"]


def test_seat_wait_fit_by_hand() -> None:
    """excess = interval - 5 ms on three rows: slope 1, intercept -5, correlation 1; one interval fits nothing."""
    from validation.report import seat_wait_fit

    f = seat_wait_fit([{"interval_ms": x, "excess_ms": x - 5.0} for x in (10.0, 20.0, 30.0)])
    assert (f["rows"], f["slope"], f["intercept_ms"], f["corr"]) == (3, pytest.approx(1.0), pytest.approx(-5.0),
                                                                      pytest.approx(1.0))
    lone = seat_wait_fit([{"interval_ms": 10.0, "excess_ms": 3.0}] * 2)
    assert lone["rows"] == 2 and all(math.isnan(lone[k]) for k in ("slope", "intercept_ms", "corr"))


def test_seat_waits_reads_a_run_and_keeps_to_its_closed_loop_rows(tmp_path: Path) -> None:
    """Group x waits exactly one interval (OSL 100 x TPOT 10 ms / c) at c 2, 4, 8; group y a fixed 30 ms. A
    row above --max-conc and a row of another protocol stay out."""
    from validation.report import seat_waits

    cases = [("a", "x", 2, 500.0), ("b", "x", 4, 250.0), ("c", "x", 8, 125.0), ("d", "y", 2, 30.0),
             ("e", "y", 8, 30.0), ("f", "x", 64, 0.0), ("g", "x", 4, 999.0)]
    write_rows(tmp_path / "m.csv", [row(id=rid, backend_version=v, batch_size=str(c),
                                        silicon_data_source=f"source_file=x.csv; silicon_concurrency={c}")
                                    for rid, v, c, _ in cases])
    out = tmp_path / "out"
    out.mkdir()
    (out / "rows.jsonl").write_text(json.dumps({"csv": str(tmp_path / "m.csv"), "waves": None}) + "\n")
    cols = ["id", "mode", "backend", "model", "protocol", "osl", "concurrency", "pred_ttft_ms", "meas_ttft_ms",
            "meas_tpot_ms", "ttft_err_pct", "tpot_err_pct", "skipped"]
    with open(out / "rows.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for rid, _, c, excess in cases:
            proto = "inferencemax" if rid == "g" else "genai-perf"
            w.writerow([rid, "agg", "vllm", "m", proto, "100", c, "100", 100 + excess, "10", "1", "1", ""])
    lines = seat_waits(out, ["backend_version"], max_conc=32, detail=True).splitlines()
    assert lines[2].split() == ["3", "1.00", "0", "1.00", "x"]
    assert lines[3].strip() == "tp 1: c2 1.00, c4 1.00, c8 1.00"
    assert lines[4].split()[:3] == ["2", "0.00", "30"] and lines[4].split()[-1] == "y"
    assert seat_waits(out, ["backend"], 32, "inferencemax").splitlines()[2].split() == ["1", "nan", "nan", "nan",
                                                                                       "vllm"]
    assert seat_waits(out, ["backend"], 32, "other") == f"{out}: no represented aggregated other rows"


def test_a_row_whose_config_fails_has_no_simulation_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Such a row is simulated on its own (simulate_row reports why it cannot be represented)."""
    from validation.silicon import simulation_key

    assert simulation_key(row()) is not None and simulation_key(row(silicon_tpot_ms="0")) is None

    def fails(r: dict[str, str], waves: int | None = None) -> dict[str, object]:
        raise ValueError("a cell the config cannot take")

    monkeypatch.setattr(silicon_run, "row_config", fails)
    assert simulation_key(row()) is None


def test_prompt_pool_what_if_draws_genai_perf_prompts_from_k_entries_per_slot() -> None:
    gap = dict(silicon_data_source="source_file=/x/aic-auto-gap-analysis/data/h100_sxm/vllm/0.12.0/q.csv; "
                                   "silicon_concurrency=4")
    base = row_config(row(**gap))
    pooled = row_config(row(**gap), prompt_pool="random:12")
    assert pooled["workload"] == {**base["workload"], "prompt_pool": 48, "pool_sampling": "random"}
    assert "kv_cache" not in pooled  # vLLM keeps its prefix cache on
    # aiconfigurator's TRT-LLM template leaves block reuse off, so its repeats recompute
    trt = row_config(row(backend="trtllm", **gap), prompt_pool="shuffle:2")
    assert trt["workload"]["prompt_pool"] == 8 and trt["kv_cache"]["prefix_caching"] is False
    # InferenceMAX's client sends a fresh random prompt each time: untouched
    im = row(silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=4")
    assert row_config(im, prompt_pool="random:12") == row_config(im)
    for bad in ("random", "lru:12", "random:0", "random:x"):
        with pytest.raises(ValueError, match="expected SAMPLING:K"):
            row_config(row(**gap), prompt_pool=bad)


def test_fp8_rows_on_a_gpu_without_fp8_tensor_cores(tmp_path: Path) -> None:
    """A100 rows (not in the shared file) with FP8 weights: vLLM and SGLang run them weight-only and are
    simulated; TensorRT-LLM has no FP8 kernels there, so its row is skipped, the reason naming the field."""
    rows = [row(id=f"a100_{b}", backend=b, system="a100_sxm", precision="fp8", gemm_quant_mode="fp8")
            for b in ("vllm", "sglang", "trtllm")]
    path = tmp_path / "a100.csv"
    write_rows(path, rows)
    s = validate_silicon(path, tmp_path / "out", progress=False, waves=1)
    assert s["rows_represented"] == 2
    assert [(r["id"], r["reason"]) for r in s["rows_skipped"]] == [
        ("a100_trtllm", "not representable: model.weight_dtype: engine 'trtllm' runs fp8 weights on FP8 / FP4 "
                        "tensor cores (Ada, Hopper or newer), which a100_sxm does not have: use bf16 weights, or "
                        "an engine with weight-only kernels (vllm, sglang)")]


def test_repeat_table_counts_configurations_measured_twice_and_the_mape_no_prediction_beats() -> None:
    """Hand-computed. a1 / a2: one configuration measured on two dates (TPOT 10 and 25 ms: the prediction
    that minimises the pair's MAPE is 10, errors 0 and 0.6; TTFT 100 and 110: 10 % apart, under the 20 %
    spread). b differs from a in its concurrency alone, c in its TP: neither repeats. Over the three rows
    represented (a1, a2, b) the floor is (0 + 60) / 3 = 20 % TPOT and (0 + 100 / 110 - 1 -> 9.09) / 3 TTFT."""
    from validation.report import best_single_errors, repeat_table

    assert best_single_errors([10.0, 25.0]) == [0.0, pytest.approx(0.6)]
    # 1, 2, 3 weighted 1, 1/2, 1/3: half the weight is reached at 1 (MAPE 0.39 there, 0.44 at 2)
    assert best_single_errors([3.0, 1.0, 2.0]) == [pytest.approx(2 / 3), 0.0, 0.5]
    rows = [row(id="a1", silicon_data_source="source_file=2026-03-25.csv; silicon_concurrency=4", _line="2",
                silicon_tpot_ms="10", silicon_ttft_ms="100"),
            row(id="a2", silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=4", _line="3",
                silicon_tpot_ms="25", silicon_ttft_ms="110"),
            row(id="b", silicon_data_source="source_file=2026-04-06.csv; silicon_concurrency=8", _line="4"),
            row(id="c", tp_size="2", _line="5")]
    (t,) = repeat_table(rows, represented={"a1", "a2", "b"})
    assert (t["mode"], t["backend"], t["configs"], t["repeated"]) == ("agg", "vllm", 3, 1)
    assert (t["spread_tpot"], t["spread_ttft"]) == (1, 0)
    assert t["max_ratio_tpot"] == 2.5 and t["max_ratio_ttft"] == pytest.approx(1.1)
    assert t["floor_tpot"] == pytest.approx(20.0)
    assert t["floor_ttft"] == pytest.approx(100.0 * (1 - 100 / 110) / 3)
    # without a run, no floor; a repeat one of whose rows was skipped floors nothing
    assert "floor_tpot" not in repeat_table(rows)[0]
    assert repeat_table(rows, represented={"a1", "b"})[0]["floor_tpot"] == 0.0
    with pytest.raises(ValueError, match=r"row 'z' \(line 9\): silicon_ttft_ms must be a positive number of "
                                         r"milliseconds, got ''"):
        repeat_table([*rows, row(id="z", _line="9", silicon_ttft_ms="")])


def test_mtp_acceptance_reproduces_its_published_sources() -> None:
    """The first draft at the DeepSeek-V3 report's 85 %; a chain of 7 drafts verifying 3.20 tokens a step, as
    nebius/MTP-DeepSeek-V3-0324's card measures the original module (to the rounding of the later rate)."""
    assert mtp_acceptance(1) == [0.85] and mtp_acceptance(3) == [0.85, 0.63, 0.63]
    chain = mtp_acceptance(7)
    reach = [math.prod(chain[:i + 1]) for i in range(7)]   # the chance each draft is reached and accepted
    assert abs(1 + sum(reach) - 3.20) < 0.01



def gb300_sglang_row(conc: int, decode_tp: str, ep: str, precision: str = "fp4") -> dict[str, str]:
    """An InferenceMAX GB300 SGLang multinode row as the 2026_03_25 export spells it: the decode pool's EP
    column repeats the prefill's (the id's ``epX``), no dp, no worker counts."""
    side = {"prefill_tp_size": "4", "prefill_pp_size": "1", "prefill_attention_dp_size": "1",
            "prefill_moe_tp_size": "1", "prefill_moe_ep_size": ep, "decode_tp_size": decode_tp,
            "decode_pp_size": "1", "decode_attention_dp_size": "1", "decode_moe_tp_size": "1",
            "decode_moe_ep_size": ep}
    return row(id=f"x_deepseek_r1_gb300_sglang_{precision}_disagg_1024x1024_c{conc}_tp4_0_ep{ep}_0_1", mode="disagg",
               backend="sglang", model_path="deepseek-ai/DeepSeek-R1", system="gb300", precision=precision,
               gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", isl="1024", osl="1024", batch_size="", tp_size="",
               pp_size="", silicon_data_source=f"source_file=2026-03-25.csv; silicon_concurrency={conc}; "
                                               "measured=2026-02-12T00:44:37Z; image=lmsysorg/sglang:v0.5.8.post1",
               **side)


GB300_SGLANG = {"dsr1-fp4-gb300-dynamo-sglang": [
    {"commit": "c" * 40, "committed": "2026-02-11T16:44:34-08:00", "image": "x", "entries": [
        {"isl": 1024, "osl": 1024, "spec_decoding": "none", "conc_list": [4, 8, 32], "row_concurrency": [4, 8, 32],
         "prefill": _side(1, 4, 1, False), "decode": _side(2, 4, 1, False), "source": "ccccccccc:f.yaml:10"},
        {"isl": 1024, "osl": 1024, "spec_decoding": "none", "conc_list": [512, 4096],
         "row_concurrency": [512, 4096], "prefill": _side(4, 4, 4, True), "decode": _side(1, 32, 32, True),
         "source": "ccccccccc:f.yaml:20"},
        {"isl": 1024, "osl": 1024, "spec_decoding": "none", "conc_list": [512, 4096],
         "row_concurrency": [512, 4096], "prefill": _side(4, 4, 4, True), "decode": _side(1, 48, 48, True),
         "source": "ccccccccc:f.yaml:30"}]}]}


def test_gb300_sglang_dp_attention_decode_of_48_gpus_is_48_attention_dp_ranks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode tp 48 (not a divisor of DeepSeek's 128 heads) ran with --enable-dp-attention --dp 48: SGLang's
    attention TP is tp / dp = 1 (dp_attention.compute_dp_attention_world_info), so 48 attention-DP ranks of
    one GPU each under EP 48. The row's decode EP 4 is the prefill's, repeated by the export."""
    monkeypatch.setattr(inferencemax_disagg, "_disagg_configs", lambda: GB300_SGLANG)
    cfg = row_config(gb300_sglang_row(4096, "48", "4"))
    assert cfg["system"]["prefill"] == {"workers": 4, "tp": 1, "ep": 4, "attention_dp": 4}
    assert cfg["system"]["decode"] == {"workers": 1, "tp": 1, "ep": 48, "attention_dp": 48,
                                       "redundant_experts": 32}   # (no recipe here: the smallest that divides)
    assert cfg["system"]["gpus_per_node"] == 48
    notes = row_spec(gb300_sglang_row(4096, "48", "4")).notes
    assert notes[0] == "decode_moe_ep_size 4 repeats the prefill's: decode matched by its GPUs alone"
    assert notes[-1] == "workers 4 prefill + 1 decode from ccccccccc:f.yaml:30"
    # tp 32 picks the other entry; an exact match needs no fallback (low latency: decode ep 1 = the row's)
    assert row_config(gb300_sglang_row(512, "32", "4"))["system"]["decode"]["attention_dp"] == 32
    low = row_spec(gb300_sglang_row(8, "4", "1"))
    assert (low.prefill_workers, low.decode_workers) == (1, 2) and not any("repeats" in n for n in low.notes)
    # a decode EP that is neither the config's nor the prefill's matches nothing
    odd = gb300_sglang_row(4096, "48", "4")
    odd["decode_moe_ep_size"] = "8"
    assert row_spec(odd).notes[-1].startswith("no InferenceMAX config matched")


def test_shipped_disagg_configs_cover_the_blackwell_keys() -> None:
    """inferencemax_disagg.json has the B300 / GB300 keys: GB300 SGLang NVFP4 1k/1k c4096 on decode tp 48 is
    3282fdeba's max_tpt entry (4 prefill workers of 4 GPUs with dp-attn, 1 decode worker of 48)."""
    cfg = row_config(gb300_sglang_row(4096, "48", "4"))
    assert cfg["system"]["decode"] == {"workers": 1, "tp": 1, "ep": 48, "attention_dp": 48, "redundant_experts": 32}
    assert row_spec(gb300_sglang_row(4096, "48", "4")).notes[-1].startswith(
        "workers 4 prefill + 1 decode from 3282fdeba:.github/configs/nvidia-master.yaml:")
    configs = inferencemax_disagg._disagg_configs()
    for key in ("dsr1-fp4-b300-dynamo-trt", "dsr1-fp8-b300-dynamo-trt", "dsr1-fp4-gb300-dynamo-trt",
                "dsr1-fp8-gb300-dynamo-trt", "dsr1-fp4-gb300-dynamo-sglang", "dsr1-fp8-gb300-dynamo-sglang"):
        assert configs[key], key


def test_b300_trtllm_recipe_names_with_the_concurrency_after_the_drafts_give_the_drafts() -> None:
    """B300 recipes name the concurrency after the draft count (..._mtp3_40.yaml): 3 drafts."""
    entry: dict = {"source": "x", "prefill": {"additional_settings": [
        "CONFIG_FILE=recipes/trtllm/b300-fp8/8k1k/mtp/ctx1_gen2_tp8_batch16_eplb0_mtp3_40.yaml"]}}
    assert inferencemax_disagg._entry_spec_tokens(entry, "dsr1-fp8-b300-dynamo-trt") == 3
    entry["prefill"]["additional_settings"] = ["CONFIG_FILE=recipes/trtllm/h200/1k1k/mtp/c512_ctx1_gen8_dep8_mtp2.yaml"]
    assert inferencemax_disagg._entry_spec_tokens(entry, "dsr1-fp8-h200-dynamo-trt") == 2
    entry["prefill"]["additional_settings"] = ["CONFIG_FILE=recipes/trtllm/gb300-fp4/1k1k/mtp/ctx1_gen1_mtp.yaml"]
    with pytest.raises(Skip, match="the number of draft tokens is not known"):
        inferencemax_disagg._entry_spec_tokens(entry, "dsr1-fp4-gb300-dynamo-trt")


def test_transfer_table_compares_the_rows_both_runs_represent() -> None:
    from validation.report import transfer_table

    def r(i: str, mode: str, tpot: float, ttft: float) -> dict:
        return {"id": i, "mode": mode, "tpot_err_pct": tpot, "ttft_err_pct": ttft}

    fitted = [r("a", "agg", 10, -20), r("b", "agg", -6, 30), r("c", "disagg", 4, 8), r("d", "agg", 50, 50)]
    moved = [r("a", "agg", 14, -10), r("b", "agg", -10, 40), r("c", "disagg", 4, -8)]   # d not represented
    agg, disagg = transfer_table(fitted, moved)
    assert agg == {"mode": "agg", "rows": 2, "tpot_fitted": 8.0, "tpot_transfer": 12.0, "tpot_gap": 4.0,
                   "ttft_fitted": 25.0, "ttft_transfer": 25.0, "ttft_gap": 0.0}
    assert disagg["rows"] == 1 and disagg["ttft_fitted"] == disagg["ttft_transfer"] == 8.0


def b300_row(model: str, backend: str, precision: str, day: str, image: str, conc: int, isl: int = 1024,
             **kw: str) -> dict[str, str]:
    """An aggregated B300 row as silicon_blackwell_dev.csv's db-dump exports write them."""
    quant = {"fp8": ("fp8", "fp8_block"), "fp4": ("nvfp4", "nvfp4"), "bf16": ("", "")}[precision]
    src = f"db-dump/2026-04-27; config_id=1; silicon_concurrency={conc}; measured={day}; workflow_run_id=1; {image}"
    base = dict(model_path=model, backend=backend, precision=precision, system="b300_sxm", isl=str(isl),
                osl="1024", batch_size=str(conc), gemm_quant_mode=quant[0], moe_quant_mode=quant[1],
                silicon_data_source=src, attention_dp_size="1")
    base.update(kw)
    return row(**base)


VLLM_019 = "vllm/vllm-openai:v0.19.0-cu130"
SGLANG_0510 = "lmsysorg/sglang:v0.5.10.post1-cu130"


def test_b300_layouts_follow_the_scripts_and_their_search_space() -> None:
    """The B300 scripts launch TP GPUs (runners/launch_b300-nv.sh --gres=gpu:$TP): MiniMax FP4 dp-attn
    entries run TP 1 / DP TP / EP TP, EP entries TP / EP TP (the export writes both tp T / dp E / ep T x E),
    EP_SIZE 1 runs no EP; Qwen NVFP4's TP 2 / EP 2 entry is exported tp 4 / moe_tp 2 / ep 2."""
    def layout(r: dict[str, str]) -> tuple[int, int, int]:
        s = row_spec(r)
        assert s.agg is not None
        return s.agg.tp, s.agg.dp, s.agg.ep
    ep_export = dict(tp_size="2", attention_dp_size="2", moe_tp_size="1", moe_ep_size="4")
    m4 = functools.partial(b300_row, "MiniMaxAI/MiniMax-M2.5", "vllm", "fp4", "2026-04-21T00:00:00.000Z", VLLM_019)
    assert layout(m4(128, **ep_export)) == (2, 1, 2)              # {tp 2, ep 2, conc 128}
    assert layout(m4(512, **ep_export)) == (1, 2, 2)              # {tp 2, ep 2, dp-attn, conc 256-2048}
    assert layout(m4(512, isl=8192, **ep_export)) == (1, 2, 2)
    assert "harness layout tp 1 / dp 2 / ep 2" in row_spec(m4(512, **ep_export)).notes[0]
    m4_0417 = functools.partial(b300_row, "MiniMaxAI/MiniMax-M2.5", "vllm", "fp4", "2026-04-17T00:00:00.000Z",
                                VLLM_019)
    assert layout(m4_0417(256, **ep_export)) == (2, 1, 2)        # 04-17 grid: dp-attn only at 1k c512
    assert layout(m4_0417(32, tp_size="4", attention_dp_size="4", moe_tp_size="1", moe_ep_size="16")) == (4, 1, 4)
    m8 = functools.partial(b300_row, "MiniMaxAI/MiniMax-M2.5", "vllm", "fp8", "2026-04-21T00:00:00.000Z", VLLM_019)
    assert layout(m8(1024, **ep_export)) == (2, 1, 2)             # the FP8 script ignores DP_ATTENTION
    assert layout(m8(64, tp_size="4", moe_tp_size="4", moe_ep_size="1")) == (4, 1, 1)   # EP_SIZE 1: no EP
    qwen = b300_row("Qwen/Qwen3.5-397B-A17B", "sglang", "fp4", "2026-04-18T00:00:00.000Z", SGLANG_0510, 32,
                    tp_size="4", moe_tp_size="2", moe_ep_size="2")
    assert layout(qwen) == (2, 1, 2)
    dsr1 = b300_row("deepseek-ai/DeepSeek-V3", "sglang", "fp4", "2026-04-17T00:00:00.000Z", SGLANG_0510, 64,
                    tp_size="16", moe_tp_size="4", moe_ep_size="4")
    assert layout(dsr1) == (4, 1, 4)
    # a wip row of an image no InferenceX commit names keeps the export and the engine's defaults
    wip = b300_row("MiniMaxAI/MiniMax-M2.5", "vllm", "fp8", "2026-04-03T17:02:12Z",
                   "image=vllm/vllm-openai:nightly-5b8c30d62b754b575e043ce2fc0dcbf8a64f6306", 16,
                   tp_size="4", moe_tp_size="4", moe_ep_size="1")
    assert layout(wip) == (4, 1, 1)
    assert row_spec(wip).notes == ("no InferenceX B300 script for the row's date and image: the engine's defaults",)
    assert {k: v for k, v in row_config(wip).items() if k in ("scheduler", "kv_cache")} == {}


def test_b300_rows_get_the_launch_flags_of_their_script() -> None:
    """Batch caps, token budgets, CUDA-graph caps, memory fractions, KV dtype / block size, prefix caching and
    the float32 matmul precision of the InferenceX B300 scripts (validation/harness/inferencemax_flags.md, B300
    section)."""
    def parts(r: dict[str, str]) -> tuple[dict, dict, dict, dict]:
        cfg = row_config(r)
        return (cfg.get("scheduler", {}), cfg.get("kv_cache", {}),
                {k: v for k, v in cfg["engine"].items() if k != "name"}, cfg["model"])
    FI_TRTLLM = "flashinfer_trtllm"   # the SGLang scripts' --moe-runner-backend
    sched, kv, eng, model = parts(b300_row("MiniMaxAI/MiniMax-M2.5", "vllm", "fp8", "2026-04-21T00:00:00.000Z",
                                           VLLM_019, 16, isl=8192, tp_size="1"))
    assert sched == {"max_num_batched_tokens": 16384}             # 2 x ISL, engine-default max-num-seqs
    assert kv == {"prefix_caching": False, "gpu_memory_utilization": 0.9, "block_size": 32}
    assert eng == {"cuda_graph_max_size": 2048, "float32_matmul": "high"} and model["kv_dtype"] == "fp8"
    _, _, eng, _ = parts(b300_row("MiniMaxAI/MiniMax-M2.5", "vllm", "fp8", "2026-04-17T00:00:00.000Z",
                                  VLLM_019, 16, isl=8192, tp_size="1"))
    assert eng == {"cuda_graph_max_size": 2048}    # the script of 04-17 exported no VLLM_FLOAT32_MATMUL_PRECISION
    sched, kv, eng, model = parts(b300_row("MiniMaxAI/MiniMax-M2.5", "vllm", "fp4", "2026-04-21T00:00:00.000Z",
                                           VLLM_019, 2048, tp_size="2", attention_dp_size="2", moe_tp_size="1",
                                           moe_ep_size="4"))
    assert sched == {"max_num_batched_tokens": 2048} and "block_size" not in kv and model["kv_dtype"] == "fp8"
    sched, kv, eng, model = parts(b300_row("Qwen/Qwen3.5-397B-A17B", "sglang", "fp8", "2026-04-17T00:00:00.000Z",
                                           SGLANG_0510, 64, tp_size="4"))
    assert sched == {"max_num_seqs": 64, "max_num_batched_tokens": 16384, "recv_interval": 10}
    assert eng == {"cuda_graph_max_size": 64, "moe_kernel": FI_TRTLLM}
    assert kv == {"prefix_caching": False, "gpu_memory_utilization": 0.8} and model["kv_dtype"] == "fp8"
    sched, kv, eng, model = parts(b300_row("Qwen/Qwen3.5-397B-A17B", "sglang", "bf16", "2026-04-18T00:00:00.000Z",
                                           SGLANG_0510, 16, tp_size="8"))
    assert sched == {"max_num_seqs": 128, "max_num_batched_tokens": 32768, "recv_interval": 30}  # CONC >= 16
    assert eng == {"cuda_graph_max_size": 16, "moe_kernel": FI_TRTLLM}
    assert kv == {"prefix_caching": False, "gpu_memory_utilization": 0.82} and "kv_dtype" not in model
    sched, kv, eng, model = parts(b300_row("Qwen/Qwen3.5-397B-A17B", "sglang", "fp4", "2026-04-18T00:00:00.000Z",
                                           SGLANG_0510, 8, tp_size="4"))
    assert sched == {"max_num_seqs": 128, "max_num_batched_tokens": 32768, "recv_interval": 10}  # CONC < 16
    assert eng == {"cuda_graph_max_size": 8, "moe_kernel": FI_TRTLLM}
    assert kv["gpu_memory_utilization"] == 0.8 and model["kv_dtype"] == "fp8"
    dsr1_fp8 = functools.partial(b300_row, "deepseek-ai/DeepSeek-V3", "sglang", "fp8", "2026-04-17T00:00:00.000Z",
                                 SGLANG_0510)
    sched, kv, eng, model = parts(dsr1_fp8(16, tp_size="8"))
    assert sched == {"max_num_seqs": 128, "max_num_batched_tokens": 32768, "recv_interval": 30}
    assert eng == {"cuda_graph_max_size": 128, "moe_kernel": FI_TRTLLM}
    assert kv == {"prefix_caching": False, "gpu_memory_utilization": 0.82} and model["kv_dtype"] == "fp8"
    sched, kv, eng, _ = parts(dsr1_fp8(8, isl=8192, tp_size="4"))
    assert sched == {"max_num_seqs": 32, "max_num_batched_tokens": 8192, "recv_interval": 10}  # TP 4: always 10
    assert eng == {"cuda_graph_max_size": 32, "moe_kernel": FI_TRTLLM}
    assert kv["gpu_memory_utilization"] == 0.95
    sched, kv, eng, model = parts(b300_row("deepseek-ai/DeepSeek-V3", "sglang", "fp4", "2026-04-17T00:00:00.000Z",
                                           SGLANG_0510, 8, tp_size="64", moe_tp_size="8", moe_ep_size="8"))
    assert sched == {"max_num_seqs": 256, "max_num_batched_tokens": 16384, "recv_interval": 10}
    assert eng == {"cuda_graph_max_size": 256, "moe_kernel": FI_TRTLLM}
    assert kv == {"prefix_caching": False, "gpu_memory_utilization": 0.85} and model["kv_dtype"] == "fp8"
    sched, kv, eng, model = parts(b300_row("moonshotai/Kimi-K2.5", "vllm", "fp4", "2026-04-20T00:00:00.000Z",
                                           VLLM_019, 16, tp_size="4"))
    assert sched == {"max_num_seqs": 16} and eng == {} and "kv_dtype" not in model
    assert kv == {"prefix_caching": False, "gpu_memory_utilization": 0.9}
    # GLM-5 measured 2026-04-03 on a nightly image, before glm5_fp8_b300.sh existed (6c66a00d9, 04-17)
    glm = b300_row("zhipuai/GLM-5", "sglang", "fp8", "2026-04-03T16:51:02Z",
                   "image=lmsysorg/sglang:nightly-dev-cu13-20260401-b6fe0cca", 128, tp_size="8")
    assert parts(glm)[:3] == ({}, {}, {})
    # the same row on another date, or with another image, has no script either
    assert "scheduler" not in row_config(b300_row("moonshotai/Kimi-K2.5", "vllm", "fp4", "2026-04-19T00:00:00.000Z",
                                                  VLLM_019, 16, tp_size="4"))
    assert "scheduler" not in row_config(b300_row("moonshotai/Kimi-K2.5", "vllm", "fp4", "2026-04-20T00:00:00.000Z",
                                                  "vllm/vllm-openai:v0.17.0-cu130", 16, tp_size="4"))


def test_gb300_sglang_ep48_decode_takes_the_recipes_32_redundant_experts() -> None:
    """InferenceX 3282fdeba's max_tpt entry launches recipes/gb300-fp4/1k1k/max_tpt.yaml, whose decode
    workers run ep-num-redundant-experts 32 (srt-slurm): 288 slots, 6 on each of the 48 EP ranks."""
    spec = row_spec(gb300_sglang_row(4096, "48", "4"))
    assert spec.decode is not None and spec.prefill is not None
    assert (spec.decode.ep, spec.decode.redundant_experts, spec.prefill.redundant_experts) == (48, 32, 0)
    assert ("decode redundant_experts 32 (recipes/gb300-fp4/1k1k/max_tpt.yaml: ep-num-redundant-experts 32)"
            in spec.notes)
    pools = row_config(gb300_sglang_row(4096, "48", "4"))["system"]
    assert pools["decode"]["redundant_experts"] == 32 and "redundant_experts" not in pools["prefill"]


def gb300_trt_row(conc: int, decode_tp: str) -> dict[str, str]:
    """An InferenceMAX GB300 TRT-LLM NVFP4 1k/8k multinode row as the 2026_03_25 export spells it (prefill tp 2
    / ep 2, the decode pool's EP repeating the prefill's)."""
    side = {"prefill_tp_size": "2", "prefill_pp_size": "1", "prefill_attention_dp_size": "1",
            "prefill_moe_tp_size": "1", "prefill_moe_ep_size": "2", "decode_tp_size": decode_tp,
            "decode_pp_size": "1", "decode_attention_dp_size": "1", "decode_moe_tp_size": "16",
            "decode_moe_ep_size": "2"}
    return row(id=f"x_deepseek_r1_gb300_trtllm_fp4_disagg_1024x8192_c{conc}_tp2_0_ep2_0_1", mode="disagg",
               backend="trtllm", model_path="deepseek-ai/DeepSeek-R1", system="gb300", precision="fp4",
               gemm_quant_mode="nvfp4", moe_quant_mode="nvfp4", isl="1024", osl="8192", batch_size="",
               tp_size="", pp_size="",
               silicon_data_source=f"source_file=2026-03-25.csv; silicon_concurrency={conc}; "
                                   "measured=2026-02-03T17:15:06Z; image=tensorrtllm-runtime:0.8.1.post2", **side)


def test_gb300_trtllm_eplb288_recipe_gives_the_decode_pool_32_redundant_slots() -> None:
    """3eb1b779c's 1k/8k c2088 entry runs ctx1_gen1_dep32_batch64_eplb288_mtp3.yaml: the generation workers'
    load_balancer.num_slots 288 = DeepSeek-R1's 256 experts + 32; the context workers have no balancer."""
    spec = row_spec(gb300_trt_row(2088, "32"))
    assert spec.decode is not None and spec.prefill is not None
    assert (spec.decode.ep, spec.decode.redundant_experts, spec.prefill.redundant_experts) == (32, 32, 0)
    assert ("decode redundant_experts 32 (recipes/trtllm/gb300-fp4/1k8k/mtp/ctx1_gen1_dep32_batch64_eplb288_mtp3"
            ".yaml: 288 expert slots for 256 experts)" in spec.notes)
    assert row_config(gb300_trt_row(2088, "32"))["system"]["decode"]["redundant_experts"] == 32


def test_eplb_slots_of_an_entry_without_a_known_count_are_the_smallest_that_divide() -> None:
    """A pool whose EP does not divide the experts and whose recipe gives no count: the smallest R, noted as
    inferred; eplbN with N = E (TRT-LLM balancing without extra slots) adds none."""
    entry = {"prefill": {"additional_settings": ["CONFIG_FILE=recipes/trtllm/x/ctx1_gen1_dep16_eplb256_mtp0.yaml"]}}
    sides = {"prefill": validate_module.Parallel(tp=1, dp=8, ep=8),
             "decode": validate_module.Parallel(tp=1, dp=24, ep=24)}
    notes: list[str] = []
    out = inferencemax_disagg._eplb_slots({"model_path": "deepseek-ai/DeepSeek-R1"}, entry, sides, notes)
    assert (out["prefill"].redundant_experts, out["decode"].redundant_experts) == (0, 8)   # 264 = 11 x 24
    assert notes == ["decode redundant_experts 8 inferred: ep 24 does not divide 256 experts and the recipe's "
                     "count is not known (the smallest that divides)"]


def test_error_spread_beside_the_mape() -> None:
    from validation.silicon import error_spread

    assert error_spread([5.0, -20.0, 8.0, -1.0]) == {"median_abs": 6.5, "median_signed": 2.0, "within_10": 0.75}
    assert error_spread([]) == {"median_abs": None, "median_signed": None, "within_10": None}


def _chat(engine: str, num_blocks: int | None = None, block_size: int | None = None, **workload: object) -> dict:
    cfg = {"model": {"name": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "h100_sxm"}, "engine": {"name": engine},
           "workload": {"kind": "synthetic", "num_requests": 24, "input_tokens": {"low": 200, "high": 600},
                        "output_tokens": {"low": 20, "high": 60},
                        "arrival": {"kind": "concurrency", "concurrency": 8}, **workload},
           "metrics": {"sample_interval_s": 5.0}}
    if num_blocks is not None:
        cfg["kv_cache"] = {"num_blocks": num_blocks, "block_size": block_size}
    return cfg


def test_unique_prompt_rows_run_without_the_prefix_cache_unless_a_request_was_preempted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A synthetic benchmark's prompts share no block key, so its run with the prefix cache off is the run
    with it on, request for request, unless a preempted request could have found its own blocks again: then
    the row is simulated again as configured, or at once where its clients' longest requests fill the KV
    pools (PREEMPT_LOAD; here 8 x up to 660 tokens against 1,600). Only one-token pages take this path; a
    prompt pool (repeats the cache finds) keeps the cache."""
    from twin.config import load_config
    from twin.runner import Simulation

    ran: list[bool] = []
    real = Simulation.run

    def spy(self, *a, **kw):  # type: ignore[no-untyped-def]
        ran.append(self.config.kv_cache.prefix_caching)
        return real(self, *a, **kw)

    small = _chat("vllm", num_blocks=1600, block_size=1)
    for raw, load, runs in ((_chat("sglang"), None, [False]), (_chat("vllm"), None, [True]),  # (16-token pages)
                            (small, None, [True]),                 # the load says a preemption may come
                            (small, 100.0, [False, True]),         # one the guess missed: simulated again
                            (_chat("sglang", prompt_pool=4), None, [True])):
        cfg = load_config(raw)
        want = Simulation(cfg).run().requests
        ran.clear()
        monkeypatch.setattr(Simulation, "run", spy)
        if load is not None:
            monkeypatch.setattr(silicon_run, "PREEMPT_LOAD", load)
        got = silicon_run._run_config(cfg).requests
        monkeypatch.undo()
        assert ran == runs
        for name in want.dtype.names:
            same = (np.array_equal(got[name], want[name], equal_nan=True) if want[name].dtype.kind == "f"
                    else (got[name] == want[name]).all())
            assert same, name
        if raw is small:
            assert want["preemptions"].any()
