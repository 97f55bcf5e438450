"""validation.inferencemax_blackwell: the B200 script versions of inferencemax_flags.json (windows, images,
layouts, launch flags and their expressions), on small hand-made rows (never the held-out measurements)."""

import itertools
import json
import re

import pytest

from validation import inferencemax_blackwell as blackwell
from validation.harness_launch import nightly_build
from validation.samples import OPTIONAL_COLUMNS, REQUIRED_COLUMNS
from validation.silicon import row_config, row_spec

SGLANG_059 = "lmsysorg/sglang:v0.5.9-cu130"
TRT_11 = "nvcr.io/nvidia/tensorrt-llm/release:1.1.0rc2.post2"
TRT_12 = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6.post2"
FI_TRTLLM = "flashinfer_trtllm"


def b200_row(model: str, backend: str, precision: str, day: str, image: str, conc: int, isl: int = 1024,
             osl: int = 1024, system: str = "b200_sxm", **kw: str) -> dict[str, str]:
    """An aggregated row as the db-dump writes them (``image``: '' for the 2025-10 / 11 rows, which name none)."""
    quant = {"fp8": ("fp8", "fp8_block"), "fp4": ("nvfp4", "nvfp4"), "bf16": ("", ""), "int4": ("", "")}[precision]
    src = f"db-dump/2026-04-27; config_id=1; silicon_concurrency={conc}; measured={day}; workflow_run_id=1; {image}"
    row = dict.fromkeys(REQUIRED_COLUMNS + OPTIONAL_COLUMNS, "")
    row.update(id="r", backend=backend, model_path=model, system=system, mode="agg", isl=str(isl), osl=str(osl),
               silicon_ttft_ms="50", silicon_tpot_ms="5", silicon_data_source=src, precision=precision,
               gemm_quant_mode=quant[0], moe_quant_mode=quant[1], batch_size=str(conc), tp_size="1", pp_size="1",
               attention_dp_size="1", _line="2")
    row.update(kw)
    return row


def parts(row: dict[str, str]) -> tuple[tuple[int, int, int], dict, dict, dict, str | None]:
    """(tp, dp, ep), scheduler, kv_cache, engine (less its name) and KV dtype of a row's config."""
    cfg = row_config(row)
    system = cfg["system"]
    return ((system["tp"], system["attention_dp"], system["ep"]), cfg.get("scheduler", {}), cfg.get("kv_cache", {}),
            {k: v for k, v in cfg["engine"].items() if k != "name"}, cfg["model"].get("kv_dtype"))


def dsr1(backend: str, precision: str, day: str, image: str, conc: int, **kw: str) -> dict[str, str]:
    return b200_row("deepseek-ai/DeepSeek-V3", backend, precision, day, image, conc, **kw)


def test_a_b200_sglang_deepseek_row_gets_the_flags_of_the_version_live_on_its_day() -> None:
    """dsr1_fp8_b200.sh from 1d29967c4 (2026-01-13): TP 8 caps 128 / chunk 32768 / mem 0.82, TP 4 (8k/1k) 32 /
    8192 / 0.95; the exports' DeepSeek-R1 spelling and timestamp find the same version."""
    tp8 = dsr1("sglang", "fp8", "2026-03-25T00:00:00.000Z", SGLANG_059, 16, tp_size="8")
    assert blackwell.find(tp8)["commit"].startswith("1d29967c4")
    assert parts(tp8) == ((8, 1, 1), {"max_num_seqs": 128, "max_num_batched_tokens": 32768, "recv_interval": 30},
                          {"prefix_caching": False, "gpu_memory_utilization": 0.82},
                          {"cuda_graph_max_size": 128, "moe_kernel": FI_TRTLLM}, "fp8")
    tp4 = dsr1("sglang", "fp8", "2026-03-25T00:00:00.000Z", SGLANG_059, 8, isl=8192, tp_size="4")
    assert parts(tp4) == ((4, 1, 1), {"max_num_seqs": 32, "max_num_batched_tokens": 8192, "recv_interval": 10},
                          {"prefix_caching": False, "gpu_memory_utilization": 0.95},
                          {"cuda_graph_max_size": 32, "moe_kernel": FI_TRTLLM}, "fp8")
    export = dict(tp8, model_path="deepseek-ai/DeepSeek-R1",
                  silicon_data_source=f"source_file=2026-03-25.csv; measured=2026-03-25T16:34:14Z; image={SGLANG_059}")
    assert blackwell.find(export) is blackwell.find(tp8)
    assert row_spec(tp8).notes == ("harness: entry tp 8 / ep 1 of 1d29967c4:benchmarks/dsr1_fp8_b200_docker.sh",)


def test_rows_of_2025_name_no_image_and_take_the_template_era_version() -> None:
    """The 2025-11-02 rows name no image: matched on the date. dsr1_fp8_b200_docker.sh 6be2c6997 (TP 8 only);
    dsr1_fp4_b200_docker.sh 979e65e0c ran --enable-ep-moe, EP over the TP group, though the export says ep 1."""
    fp8 = dsr1("sglang", "fp8", "2025-11-02T00:00:00.000Z", "", 32, tp_size="8")
    assert blackwell.find(fp8)["commit"].startswith("6be2c6997")
    assert parts(fp8)[1] == {"max_num_seqs": 128, "max_num_batched_tokens": 32768, "recv_interval": 30}
    fp4 = dsr1("sglang", "fp4", "2025-11-02T00:00:00.000Z", "", 8, tp_size="4")
    layout, sched, kv, eng, kv_dtype = parts(fp4)
    assert layout == (4, 1, 4) and kv_dtype == "fp8"
    assert sched == {"max_num_seqs": 256, "max_num_batched_tokens": 16384, "recv_interval": 10}  # CONC < 16
    assert kv == {"prefix_caching": False, "gpu_memory_utilization": 0.85}
    assert row_spec(fp4).notes[0].startswith("harness layout tp 4 / dp 1 / ep 4 (export: tp 4 / dp 1 / ep 1;")


def test_a_b200_row_outside_every_window_keeps_the_engines_defaults() -> None:
    """Before the first B200 script version, with an image no config of its window named, or on GB200 (no
    single-node GB200 script exists): no entry, the export's layout and the engine's defaults."""
    early = dsr1("sglang", "fp8", "2025-09-01T00:00:00.000Z", SGLANG_059, 16, tp_size="8")
    assert blackwell.find(early) is None
    assert parts(early) == ((8, 1, 1), {}, {}, {}, None)
    assert row_spec(early).notes == ("no InferenceX B200 script for the row's date and image: the engine's defaults",)
    wrong_image = dsr1("sglang", "fp8", "2026-03-25T00:00:00.000Z", "lmsysorg/sglang:v0.5.10.post1-cu130", 16,
                       tp_size="8")
    assert blackwell.find(wrong_image) is None and parts(wrong_image)[1:] == ({}, {}, {}, None)
    gb200 = dict(dsr1("sglang", "fp8", "2026-03-25T00:00:00.000Z", SGLANG_059, 16, tp_size="8"), system="gb200")
    assert blackwell.find(gb200) is None
    assert row_spec(gb200).notes == ("no InferenceX GB200 script for the row's date and image: the engine's "
                                     "defaults",)


def test_trtllm_deepseek_rows_take_their_versions_token_budget_layout_and_balance() -> None:
    """dsr1_fp8_b200_trt*.sh: --max_num_tokens = CONC + ISL + 64 rounded up to 64 (at least 8192 from
    64af5a771), cuda_graph 256, free fraction 0.8, FP8 KV, no block reuse; attention DP with balance (timeout 60,
    batching wait 0). The template-era script chose EP = TP and, at 1k/1k CONC > 32, attention DP itself."""
    base = ({"prefix_caching": False, "gpu_memory_utilization": 0.8}, {"cuda_graph_max_size": 256}, "fp8")
    ep8 = dict(tp_size="64", moe_tp_size="8", moe_ep_size="8")
    row = dsr1("trtllm", "fp8", "2025-12-15T00:00:00.000Z", TRT_11, 32, **ep8)
    assert parts(row) == ((8, 1, 8), {"chunked_prefill": False, "max_num_batched_tokens": 1152}, *base)
    balance = {"attention_dp_balance": True, "attention_dp_timeout_iters": 60, "attention_dp_batching_wait_iters": 0}
    dp = dsr1("trtllm", "fp8", "2025-12-15T00:00:00.000Z", TRT_11, 64, tp_size="1", attention_dp_size="64",
              moe_tp_size="8", moe_ep_size="8")
    assert parts(dp) == ((1, 8, 8), {"chunked_prefill": False, "max_num_batched_tokens": 1152, **balance}, *base)
    floor = dsr1("trtllm", "fp8", "2026-01-27T00:00:00.000Z", TRT_11, 32, **ep8)
    assert blackwell.find(floor)["commit"].startswith("64af5a771")
    assert parts(floor)[1] == {"chunked_prefill": False, "max_num_batched_tokens": 8192}
    template = dsr1("trtllm", "fp8", "2025-11-02T00:00:00.000Z", "", 64, tp_size="8")
    assert parts(template)[:2] == ((1, 8, 8), {"chunked_prefill": False, "max_num_batched_tokens": 1152, **balance})


def test_trtllm_deepseek_fp8_from_ec7bafaae_waits_for_batches_at_1k1k_and_high_concurrency() -> None:
    """ec7bafaae (2026-01-29): cuda_graph max_batch_size CONC, batch_wait_timeout_iters 40 /
    batch_wait_max_tokens_ratio 0.8 at 1k/1k CONC >= 64, free fraction 0.75 at 8k/1k TP 4."""
    row = dsr1("trtllm", "fp8", "2026-03-28T00:00:00.000Z", TRT_12, 64, tp_size="8")
    assert parts(row) == ((8, 1, 1), {"chunked_prefill": False, "max_num_batched_tokens": 8192, "batch_wait_iters": 40,
                                      "batch_wait_max_tokens_ratio": 0.8},
                          {"prefix_caching": False, "gpu_memory_utilization": 0.8}, {"cuda_graph_max_size": 64}, "fp8")
    low = dsr1("trtllm", "fp8", "2026-03-28T00:00:00.000Z", TRT_12, 8, isl=8192, tp_size="4")
    assert parts(low)[1:4] == ({"chunked_prefill": False, "max_num_batched_tokens": 8320},
                               {"prefix_caching": False, "gpu_memory_utilization": 0.75}, {"cuda_graph_max_size": 8})


def test_the_deepseek_trtllm_rows_of_2026_01_14_take_the_mtp_script() -> None:
    """bf3456727 queued only the MTP configs: dsr1_fp8_b200_trt_mtp_slurm.sh, MTP 3 (1 with attention DP),
    --max_batch_size CONC (CONC / TP with DP) and --max_num_tokens (MTP + 1) x that + ISL + 64, rounded to 64."""
    row = dsr1("trtllm", "fp8", "2026-01-14T00:00:00.000Z", TRT_11, 16, tp_size="64", moe_tp_size="8",
               moe_ep_size="8")
    assert blackwell.find(row)["path"] == "benchmarks/dsr1_fp8_b200_trt_mtp_slurm.sh"
    cfg = row_config(row)
    assert cfg["scheduler"] == {"chunked_prefill": False, "max_num_seqs": 16, "max_num_batched_tokens": 1152}
    assert cfg["engine"]["speculative"]["num_speculative_tokens"] == 3
    dp = dsr1("trtllm", "fp8", "2026-01-14T22:26:21Z", TRT_11, 128, tp_size="1", attention_dp_size="64",
              moe_tp_size="8", moe_ep_size="8")
    assert row_config(dp)["scheduler"]["max_num_seqs"] == 16                     # 128 / TP 8
    assert row_config(dp)["engine"]["speculative"]["num_speculative_tokens"] == 1
    # the non-MTP version of the same window does not claim that day, but does the day before
    assert blackwell.find(dsr1("trtllm", "fp8", "2026-01-13T00:00:00.000Z", TRT_11, 16, tp_size="8"))["path"] \
        == "benchmarks/dsr1_fp8_b200_trt_slurm.sh"


def test_trtllm_gpt_oss_rows_take_the_scripts_caps_and_attention_dp_balance() -> None:
    """gptoss_fp4_b200_trt*.sh: --max_batch_size 512, --max_num_tokens 20000, cuda_graph max_batch_size $CONC,
    free fraction 0.85, FP8 KV; a {tp 2, ep 2, dp-attn} entry (exported tp 4 / ep 2) runs attention DP 2 with
    TensorRT-LLM's balance."""
    row = b200_row("openai/gpt-oss-120b", "trtllm", "fp4", "2025-12-15T00:00:00.000Z",
                   "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc2", 64, tp_size="4", moe_tp_size="2", moe_ep_size="2")
    assert parts(row) == ((1, 2, 2), {"chunked_prefill": False, "max_num_seqs": 512, "max_num_batched_tokens": 20000,
                                      "attention_dp_balance": True},
                          {"prefix_caching": False, "gpu_memory_utilization": 0.85}, {"cuda_graph_max_size": 64}, "fp8")


def test_vllm_minimax_and_kimi_rows_follow_their_scripts_changes() -> None:
    """minimaxm2.5_fp8_b200.sh tested EP_SIZE -ge 1 (EP over the TP group always) with 0.95 and --block-size 32
    until bddbf4031 (2026-04-03): then the B300 recipe. kimik2.5_int4_b200.sh turned the prefix cache off from
    79ea3651a (2026-03-24T20:03Z)."""
    mm = "MiniMaxAI/MiniMax-M2.5"
    early = b200_row(mm, "vllm", "fp8", "2026-03-27T00:00:00.000Z", "vllm/vllm-openai:v0.17.0-cu130", 16,
                     tp_size="4", moe_tp_size="4", moe_ep_size="1")
    assert parts(early) == ((4, 1, 4), {}, {"gpu_memory_utilization": 0.95, "block_size": 32}, {}, None)
    late = b200_row(mm, "vllm", "fp8", "2026-04-10T00:00:00.000Z", "vllm/vllm-openai:v0.19.0-cu130", 16,
                    isl=8192, tp_size="4", moe_tp_size="4", moe_ep_size="1")
    assert parts(late) == ((4, 1, 1), {"max_num_batched_tokens": 16384},
                           {"prefix_caching": False, "gpu_memory_utilization": 0.9, "block_size": 32},
                           {"cuda_graph_max_size": 2048}, "fp8")
    kimi = "moonshotai/Kimi-K2.5"
    image = "image=vllm/vllm-openai:v0.15.1"
    before = b200_row(kimi, "vllm", "int4", "2026-03-24T12:00:00Z", image, 8, tp_size="8")
    after = b200_row(kimi, "vllm", "int4", "2026-03-24T20:03:10Z", image, 8, tp_size="8")
    same_day = b200_row(kimi, "vllm", "int4", "2026-03-24T00:00:00.000Z", image, 8, tp_size="8")   # a date only
    assert parts(before)[1:3] == ({"max_num_seqs": 8}, {"gpu_memory_utilization": 0.95})
    assert parts(after)[1:3] == ({"max_num_seqs": 8}, {"prefix_caching": False, "gpu_memory_utilization": 0.95})
    assert blackwell.find(same_day) is blackwell.find(after)      # the version in effect at the end of the day


def test_expressions_see_the_scripts_variables_and_nothing_else() -> None:
    launch = {"launch": {"layout": "trt",
                         "a": {"expr": "max(8192, round_up(CLIENT_CONC + ISL + 64, 64))"},
                         "b": {"expr": "DP_ATTENTION or None"},
                         "c": {"expr": "CLIENT_CONC // 8 if ISL == 1024 and OSL == 8192 and CLIENT_CONC >= 256 "
                                       "else CONC"},
                         "d": {"expr": "TP"}}}
    assert blackwell.settings(launch, 1, 32, 8192, osl=1024, client_conc=256, dp=8, ep=8) == \
        {"a": 8512, "b": True, "c": 32, "d": 8}
    assert blackwell.settings(launch, 8, 256, 1024, osl=8192, client_conc=256) == {"a": 8192, "c": 32, "d": 8}
    for bad in ("__import__('os')", "ISL.real", "open('x')", "UNKNOWN + 1", "[ISL]"):
        with pytest.raises(ValueError):
            blackwell.settings({"launch": {"layout": "tp", "x": {"expr": bad}}}, 1, 1, 1)


def _window_instants(day: str) -> list[str]:
    return [f"measured={day}T{t}Z" for t in ("00:00:01", "12:00:00", "23:59:58")] + [f"measured={day}T00:00:00.000Z"]


def test_every_b200_entry_is_well_formed_and_no_two_versions_claim_the_same_instant() -> None:
    entries = [e for e in blackwell.launches() if e["system"] == "b200_sxm"]
    assert len(entries) == 40
    for e in entries:
        assert e["launch"]["layout"] in blackwell.LAYOUTS and e["images"] and e["search_space"], e["valid_for"]
        assert any(cite[:10].rstrip(":").isalnum() and cite[9] == ":" for cite in e["citations"].values())
        for s in e["search_space"]:
            assert {"isl", "osl", "tp", "ep", "dp_attn", "conc_start", "conc_end"} <= set(s)
        for tp, dp, conc, isl in itertools.product((1, 4, 8), (1, 8), (4, 256), (1024, 8192)):
            blackwell.settings(e, tp, conc, isl, osl=1024, client_conc=conc * dp, dp=dp, ep=tp * dp)
    # Versions of one config follow each other; two configs live at once (a plain and an MTP one) differ in image.
    key = lambda e: (e["model_path"], e["backend"], e["precision"])  # noqa: E731
    for (_, group) in itertools.groupby(sorted(entries, key=key), key=key):
        versions = list(group)
        windowed = [e for e in versions if isinstance(e["measured"], dict)]
        for a, b in itertools.combinations(windowed, 2):
            if set(a["images"]) & set(b["images"]):
                (a_from, a_until), (b_from, b_until) = ((e["measured"]["from"], e["measured"]["until"] or "9")
                                                        for e in (a, b))
                assert a_until <= b_from or b_until <= a_from, (a["valid_for"], b["valid_for"])
        for day_entry in (e for e in versions if isinstance(e["measured"], list)):
            for day in day_entry["measured"]:
                claims = [e for e in versions if any(blackwell._live(e["measured"], s) for s in _window_instants(day))
                          and set(e["images"]) & set(day_entry["images"])]
                assert claims == [day_entry], (day, [c["valid_for"] for c in claims])


def test_the_b300_entries_keep_their_day_lists() -> None:
    """The generalisation to windows leaves the B300 entries as they were: lists of measured days."""
    b300 = [e for e in blackwell.launches() if e["system"] == "b300_sxm"]
    assert len(b300) == 12 and all(isinstance(e["measured"], list) for e in b300)
    assert json.loads(blackwell.FLAGS.read_text())[0]["system"] == "h200_sxm"


QWEN35 = "Qwen/Qwen3.5-397B-A17B"


def wip_row(image: str, conc: int, tp: str, ep: str) -> dict[str, str]:
    """A B300 Qwen3.5 FP8 row of the 2026-04-03 wip runs, as source_file 2026-03-25.csv writes them."""
    source = f"source_file=2026-03-25.csv; model=Qwen3.5-397B; silicon_concurrency={conc}; " \
             f"measured=2026-04-03T16:55:34Z; wip=True; image={image}"
    return b200_row(QWEN35, "sglang", "fp8", "", image, conc, system="b300_sxm", tp_size=tp, moe_ep_size=ep,
                    silicon_data_source=source)


def test_the_b300_wip_qwen3_5_rows_take_the_b200_configs_their_images_name() -> None:
    """No B300 single-node runner existed on 2026-04-03: image v0.5.9-cu130 (tp 4, ep 1) is the B200 MTP
    config, whose script drafts 3 tokens with EAGLE; v0.5.9-cu130-amd64 the plain B200 config. The image is
    compared whole: the first is a prefix of the second."""
    mtp = wip_row(SGLANG_059, 32, "4", "1")
    assert blackwell.find(mtp)["path"] == "benchmarks/single_node/qwen3.5_fp8_b200_mtp.sh"
    tp_dp_ep, scheduler, kv, engine, kv_dtype = parts(mtp)
    assert tp_dp_ep == (4, 1, 1) and kv_dtype == "fp8"
    assert scheduler == {"max_num_seqs": 32, "max_num_batched_tokens": 32768, "recv_interval": 30}
    assert kv == {"prefix_caching": False, "gpu_memory_utilization": 0.8}
    assert engine["speculative"]["num_speculative_tokens"] == 3 and "overlap" not in engine["speculative"]
    plain = wip_row(SGLANG_059 + "-amd64", 32, "4", "4")
    assert blackwell.find(plain)["path"] == "benchmarks/single_node/qwen3.5_fp8_b200.sh"
    tp_dp_ep, scheduler, kv, engine, _ = parts(plain)
    assert tp_dp_ep == (4, 1, 4) and "speculative" not in engine
    assert scheduler == {"max_num_seqs": 128, "max_num_batched_tokens": 32768, "recv_interval": 30}
    assert blackwell.find(wip_row("lmsysorg/sglang:v0.5.9", 32, "4", "1")) is None


def test_only_sglang_disaggregated_mtp_launches_keep_the_overlap_scheduler() -> None:
    """The srt-slurm SGLang MTP recipes set SGLANG_ENABLE_SPEC_V2=1; single-node scripts leave SGLang's rule."""
    from types import SimpleNamespace

    from validation.harness_decoding import harness_spec_overlap

    assert harness_spec_overlap(SimpleNamespace(mode="disagg", backend="sglang")) is True
    assert harness_spec_overlap(SimpleNamespace(mode="disagg", backend="trtllm")) is None
    assert harness_spec_overlap(SimpleNamespace(mode="agg", backend="sglang")) is None


def test_the_flags_notes_show_each_script_version_as_the_validator_reads_it() -> None:
    """inferencemax_flags.md quotes every launch "in the twin's terms"; each quote is, key for key, one
    launch of inferencemax_flags.json (the file the validator reads), so the notes cannot drift from it."""
    notes = (blackwell.FLAGS.parent / "inferencemax_flags.md").read_text()
    quoted = re.findall(r"Launch in the twin's terms \(`launch`\): `(\{.*?\})`", notes)
    every = {json.dumps(e["launch"], sort_keys=True) for e in json.loads(blackwell.FLAGS.read_text())
             if "launch" in e}
    assert len(quoted) >= 10
    assert [q for q in quoted if json.dumps(json.loads(q), sort_keys=True) not in every] == []


def test_a_row_names_its_engine_build() -> None:
    """The row's backend_version becomes engine.version where the profile has host terms of that build; a
    row of another build, or without one, leaves it out (its config stays that of the same benchmark
    measured under another label)."""
    row = dsr1("sglang", "fp4", "2026-04-18", "", 4, backend_version="0.5.10.post1")
    assert row_config(row)["engine"]["version"] == "0.5.10.post1"
    for other in ("", "0.5.9", "nightly-dev"):
        assert "version" not in row_config(dsr1("sglang", "fp4", "2026-04-18", "", 4, backend_version=other))["engine"]
    assert "version" not in row_config(dsr1("vllm", "fp4", "2026-04-18", "", 4, backend_version="0.5.10"))["engine"]


def test_a_dated_nightly_image_is_a_build_of_the_next_release() -> None:
    """An SGLang nightly dated on or after the day InferenceX first ran v0.5.9 (2026-02-26) and before it
    first ran v0.5.10 (2026-04-08) is a 0.5.10 development build, so it takes the 0.5.10 build's host terms;
    an earlier one, an undated tag and another engine's nightly keep the profile's."""
    assert nightly_build("sglang", "a=1; image=lmsysorg/sglang:nightly-dev-cu13-20260401-b6fe0cca") == \
        "0.5.10.dev20260401"
    assert nightly_build("sglang", "image=lmsysorg/sglang:nightly-dev-20260226-d3bae71e") == "0.5.10.dev20260226"
    assert nightly_build("sglang", "image=lmsysorg/sglang:nightly-dev-20260408-d3bae71e") == "0.5.11.dev20260408"
    assert nightly_build("sglang", "image=lmsysorg/sglang:nightly-dev-20260216-d3bae71e") is None
    assert nightly_build("sglang", "image=lmsysorg/sglang:v0.5.10.post1-cu130") is None
    assert nightly_build("vllm", "image=vllm/vllm-openai:nightly-5b8c30d62b754b57") is None
    glm = dsr1("sglang", "fp4", "2026-04-03", "image=lmsysorg/sglang:nightly-dev-cu13-20260401-b6fe0cca", 4,
               backend_version="nightly-dev")
    assert row_config(glm)["engine"]["version"] == "0.5.10.dev20260401"
    early = dsr1("sglang", "fp4", "2026-02-20", "image=lmsysorg/sglang:nightly-dev-20260216-d3bae71e", 4,
                 backend_version="nightly-dev")
    assert "version" not in row_config(early)["engine"]
