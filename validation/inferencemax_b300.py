"""InferenceMAX's single-node B300 launches, read from validation/harness/inferencemax_flags.json.

The aggregated B300 rows of silicon_blackwell_dev.csv were measured by the InferenceX scripts
``benchmarks/single_node/*_b300.sh`` (added 2026-04-17 .. 04-21). Each entry of the flags file with
``system: b300_sxm`` is one script version: the dates and images it measured, the search space of its
config in ``.github/configs/nvidia-master.yaml`` and, under ``launch``, what the script passes to the engine
in the twin's terms. This module finds a row's entry and turns it into a layout and engine settings; it
changes nothing for any other GPU.

``launch`` keys: ``layout`` (how the script turns the search-space entry's TP / EP / dp-attn into
engine flags: :data:`LAYOUTS`), ``max_num_seqs``, ``max_num_batched_tokens``, ``cuda_graph_max_size``,
``gpu_memory_utilization``, ``kv_dtype``, ``block_size``, ``prefix_caching``, ``recv_interval`` (SGLang's
--scheduler-recv-interval), and ``by_tp`` (the same keys for one launched TP, where the script branches on it).
A value is a number, ``CONC`` (one engine rank's share of the client's concurrency), ``2*ISL``, or
``{"conc_at_least": C, "then": A, "else": B}`` where the script picks a value by $CONC.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

FLAGS = Path(__file__).resolve().parent / "harness" / "inferencemax_flags.json"
GPU = "b300_sxm"

LAYOUTS = ("tp_ep", "tp", "vllm_ep_if_gt1", "vllm_dp_attn")
"""How a script launches a search-space entry {tp, ep, dp-attn} (the runner allocates TP GPUs):
``tp_ep``: SGLang --tensor-parallel-size $TP --data-parallel-size 1 --ep-size $EP_SIZE; ``tp``: vLLM
--tensor-parallel-size $TP only; ``vllm_ep_if_gt1``: vLLM TP $TP with --enable-expert-parallel (EP over the TP
group) when EP_SIZE > 1, DP_ATTENTION not read; ``vllm_dp_attn``: as the last, but DP_ATTENTION=true runs
--tensor-parallel-size 1 --data-parallel-size $TP --enable-expert-parallel."""

_MEASURED = re.compile(r"measured=(\d{4}-\d\d-\d\d)")


@functools.cache
def launches() -> tuple[dict[str, Any], ...]:
    """The B300 script versions of the flags file."""
    entries = json.loads(FLAGS.read_text())
    return tuple(e for e in entries if e.get("system") == GPU and "launch" in e)


def find(row: dict[str, str]) -> dict[str, Any] | None:
    """The script version a B300 row ran (None: no InferenceX B300 script matches its model, engine,
    precision, measurement date and image)."""
    if row.get("system", "").strip() != GPU:
        return None
    source = row.get("silicon_data_source", "")
    day = _MEASURED.search(source)
    for e in launches():
        if (e["model_path"], e["backend"], e["precision"]) != (row["model_path"].strip(), row["backend"].strip(),
                                                            row.get("precision", "").strip().lower()):
            continue
        if day and day.group(1) in e["measured"] and any(image in source for image in e["images"]):
            return e
    return None


def _launched(layout: str, tp: int, ep: int, dp_attn: bool) -> tuple[int, int, int]:
    """(tp, attention dp, ep) that ``layout`` launches for the search-space entry {tp, ep, dp-attn}."""
    if layout == "tp_ep":
        return tp, 1, ep
    if layout == "tp":
        return tp, 1, 1
    if layout == "vllm_dp_attn" and dp_attn:
        return 1, tp, tp
    if layout in ("vllm_ep_if_gt1", "vllm_dp_attn"):
        return tp, 1, tp if ep > 1 else 1
    raise ValueError(f"launch layout {layout!r}: expected one of {', '.join(LAYOUTS)}")


def _encodes(tp: int, dp: int, ep: int, entry: dict[str, Any]) -> bool:
    """Whether the export's (tp, attention dp, ep) can stand for the search-space entry. The exports write an
    entry {tp T, ep E} as tp T / ep E, as tp T x E / ep E (DeepSeek and Qwen NVFP4), or as tp T / dp E /
    ep T x E (MiniMax), dp-attn or not."""
    t, e = entry["tp"], entry["ep"]
    return (tp, dp, ep) == (t, 1, e) or (e > 1 and ((tp, dp, ep) == (t * e, 1, e) or (tp, dp, ep) == (t, e, t * e)))


def layout(launch: dict[str, Any], tp: int, dp: int, ep: int, isl: int, osl: int,
           conc: int) -> tuple[tuple[int, int, int] | None, str]:
    """The (tp, attention dp, ep) the script launched for a row whose export says (tp, dp, ep) at client
    concurrency ``conc``, with a note; None where no search-space entry, or several launching differently,
    fit the row (the export's layout stays)."""
    fits = [s for s in launch["search_space"] if (s["isl"], s["osl"]) == (isl, osl)
            and s["conc_start"] <= conc <= s["conc_end"] and _encodes(tp, dp, ep, s)]
    runs = {_launched(launch["launch"]["layout"], s["tp"], s["ep"], s["dp_attn"]) for s in fits}
    if len(runs) != 1:
        why = "no" if not runs else "more than one"
        return None, f"{why} {launch['commit'][:9]} search-space entry fits the row: export layout kept"
    (run,) = runs
    names = ", ".join(sorted({f"tp {s['tp']} / ep {s['ep']}" + (" / dp-attn" if s["dp_attn"] else "") for s in fits}))
    return run, f"entry {names} of {launch['commit'][:9]}:{launch['path']}"


def _value(value: Any, conc: int, isl: int) -> Any:
    if isinstance(value, dict):  # {"conc_at_least": C, "then": A, "else": B}: the script branches on $CONC
        return value["then"] if conc >= value["conc_at_least"] else value["else"]
    if value == "CONC":
        return conc
    if value == "2*ISL":
        return 2 * isl
    return value


def settings(launch: dict[str, Any], tp: int, conc: int, isl: int) -> dict[str, Any]:
    """The launch keys for an engine of ``tp`` launched TP whose rank serves ``conc`` clients."""
    flags = {k: v for k, v in launch["launch"].items() if k not in ("layout", "by_tp")}
    flags.update(launch["launch"].get("by_tp", {}).get(str(tp), {}))
    return {k: _value(v, conc, isl) for k, v in flags.items()}
