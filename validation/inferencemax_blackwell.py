"""InferenceMAX's single-node Blackwell launches (B300, B200), read from
validation/harness/inferencemax_flags.json.

An aggregated InferenceMAX (SemiAnalysis InferenceX) row measured on a Blackwell GPU ran one version of the
script ``benchmarks/[single_node/]<model>_<precision>_<gpu>[_trt].sh`` with the image of its config (the
workflow templates before 2025-11-03, ``.github/configs/nvidia-master.yaml`` after). Each entry of the flags
file whose ``system`` is a Blackwell GPU and that has a ``launch`` is one script version: ``measured`` (the
days it measured, a list, or the window it was live, ``{"from", "until", "except"}``), the ``images`` its
config named, its config's ``search_space`` and, under ``launch``, what the script passes to the engine in the
twin's terms. This module finds a row's entry (:func:`find`: the row's GPU, model, engine, precision,
measurement date and image) and turns it into a layout (:func:`layout`) and engine settings
(:func:`settings`). InferenceX has no single-node GB200 script (its GB200 configs are multi-node Dynamo ones),
so GB200 rows find none.

``launch`` keys: ``layout`` (how the script turns the search-space entry's TP / EP / dp-attn into engine
flags: :data:`LAYOUTS`), ``max_num_seqs``, ``max_num_batched_tokens``, ``cuda_graph_max_size``,
``gpu_memory_utilization``, ``kv_dtype``, ``block_size``, ``prefix_caching``, ``moe_kernel``, ``float32_matmul``
(vLLM's VLLM_FLOAT32_MATMUL_PRECISION, engine.float32_matmul),
``recv_interval`` (SGLang's --scheduler-recv-interval), TensorRT-LLM's ``attention_dp_balance``,
``attention_dp_timeout_iters``, ``attention_dp_batching_wait_iters``, ``batch_wait_iters`` and
``batch_wait_max_tokens_ratio``, ``speculative_tokens`` (MTP / EAGLE drafts per step, a chain;
validation.harness_decoding.harness_speculative), and ``by_tp`` (the same keys for one launched TP, where the
script branches on it). A value is a number, a string, ``CONC`` (one engine rank's share of the client's concurrency),
``2*ISL``, ``{"conc_at_least": C, "then": A, "else": B}`` where the script picks a value by $CONC, or
``{"expr": E}``, an expression of the script's own variables (:func:`settings`) where its rule needs more. A
value that comes out null leaves the engine's default.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path
from typing import Any, Callable

FLAGS = Path(__file__).resolve().parent / "harness" / "inferencemax_flags.json"
GPUS = {"b300_sxm": "B300", "b200_sxm": "B200", "gb200": "GB200"}
"""The Blackwell systems an aggregated row may name, with the GPU's name in InferenceX's script names."""

LAYOUTS = ("tp_ep", "tp", "tp_ep_all", "vllm_ep_if_gt1", "vllm_dp_attn", "trt")
"""How a script launches a search-space entry {tp, ep, dp-attn} (the runner allocates TP GPUs): ``tp_ep``:
SGLang --tensor-parallel-size $TP --data-parallel-size 1 --ep-size $EP_SIZE; ``tp``: --tensor-parallel-size
$TP only; ``tp_ep_all``: EP over the whole TP group whatever EP_SIZE says (SGLang --enable-ep-moe; vLLM
--enable-expert-parallel behind a test every EP_SIZE passes); ``vllm_ep_if_gt1``: vLLM TP $TP with
--enable-expert-parallel (EP over the TP group) when EP_SIZE > 1, DP_ATTENTION not read; ``vllm_dp_attn``: as
the last, but DP_ATTENTION=true runs --tensor-parallel-size 1 --data-parallel-size $TP
--enable-expert-parallel; ``trt``: trtllm-serve --tp_size $TP --ep_size $EP_SIZE with enable_attention_dp
$DP_ATTENTION (attention data-parallel over the TP ranks). A search-space entry's ``script`` ({"ep",
"dp_attn"}) is what a script that chose EP and attention DP itself (the TensorRT-LLM scripts before the search
spaces named them) ran instead."""

_MEASURED = re.compile(r"measured=(\d{4}-\d\d-\d\d)(?:T(\d\d:\d\d:\d\d))?")
_MIDNIGHT = "00:00:00"


@functools.cache
def launches() -> tuple[dict[str, Any], ...]:
    """The Blackwell script versions of the flags file."""
    entries = json.loads(FLAGS.read_text())
    return tuple(e for e in entries if e.get("system") in GPUS and "launch" in e)


def label(row: dict[str, str]) -> str:
    """The row's GPU as InferenceX names its scripts (B300, B200, GB200)."""
    system = row.get("system", "").strip()
    return GPUS.get(system, system)


def _instant(source: str) -> str | None:
    """When the row was measured, as ``YYYY-MM-DDTHH:MM:SSZ``: the source's time, or the end of its day
    where it gives a date only (the db-dump and 2026_04_06 exports write ``T00:00:00.000Z``), so that a
    date-only row takes the script version in effect at the end of its day."""
    m = _MEASURED.search(source)
    if m is None:
        return None
    day, time = m.group(1), m.group(2)
    return f"{day}T{time if time and time != _MIDNIGHT else '23:59:59'}Z"


def _live(measured: list[str] | dict[str, Any], source: str) -> bool:
    """Whether a row measured as ``source`` says falls on one of an entry's days or inside its window."""
    instant = _instant(source)
    if instant is None:
        return False
    if isinstance(measured, list):
        return instant[:10] in measured
    until = measured.get("until")
    return (measured["from"] <= instant and (until is None or instant < until)
            and instant[:10] not in measured.get("except", ()))


def _image(text: str) -> str:
    return text.replace("nvcr.io#", "nvcr.io/")   # the template and enroot spelling of NGC images


def _source_images(source: str) -> set[str]:
    """The images a row's source names (none in the exports and db-dumps of 2025-10-29 / 11-02). Compared
    whole: ``lmsysorg/sglang:v0.5.9-cu130`` and ``...-cu130-amd64`` were two configs' images on the same days."""
    fields = (f.strip().removeprefix("image=") for f in source.split(";"))
    return {f for f in fields if "/" in f and ":" in f and "=" not in f}


def find(row: dict[str, str]) -> dict[str, Any] | None:
    """The script version a Blackwell row ran (None: no InferenceX script matches its GPU, model, engine,
    precision, measurement date and image; a row whose source names no image is matched on the date)."""
    system = row.get("system", "").strip()
    if system not in GPUS:
        return None
    source = _image(row.get("silicon_data_source", ""))
    model, backend = row["model_path"].strip(), row["backend"].strip()
    precision = row.get("precision", "").strip().lower()
    images = _source_images(source)
    for e in launches():
        if e["system"] != system or (e["backend"], e["precision"]) != (backend, precision) \
                or model not in (e["model_path"], *e.get("model_aliases", ())):
            continue
        if _live(e["measured"], source) and (not images or any(_image(image) in images for image in e["images"])):
            return e
    return None


def _launched(layout: str, entry: dict[str, Any]) -> tuple[int, int, int]:
    """(tp, attention dp, ep) that ``layout`` launches for the search-space entry {tp, ep, dp-attn}."""
    tp = entry["tp"]
    ep = entry.get("script", {}).get("ep", entry["ep"])
    dp_attn = entry.get("script", {}).get("dp_attn", entry["dp_attn"])
    if layout == "tp_ep":
        return tp, 1, ep
    if layout == "tp":
        return tp, 1, 1
    if layout == "tp_ep_all":
        return tp, 1, tp
    if layout == "trt":
        return (1, tp, ep) if dp_attn else (tp, 1, ep)
    if layout == "vllm_dp_attn" and dp_attn:
        return 1, tp, tp
    if layout in ("vllm_ep_if_gt1", "vllm_dp_attn"):
        return tp, 1, tp if ep > 1 else 1
    raise ValueError(f"launch layout {layout!r}: expected one of {', '.join(LAYOUTS)}")


def _encodes(tp: int, dp: int, ep: int, entry: dict[str, Any]) -> bool:
    """Whether the export's (tp, attention dp, ep) can stand for the search-space entry. The exports write an
    entry {tp T, ep E} as tp T / ep E, as tp T x E / ep E (DeepSeek and Qwen NVFP4), or as tp T / dp E /
    ep T x E (MiniMax), dp-attn or not; a dp-attn entry also as tp 1 / dp T / ep E (TensorRT-LLM DeepSeek)."""
    t, e = entry["tp"], entry["ep"]
    return ((tp, dp, ep) == (t, 1, e)
            or (e > 1 and ((tp, dp, ep) == (t * e, 1, e) or (tp, dp, ep) == (t, e, t * e)))
            or (entry["dp_attn"] and (tp, dp, ep) == (1, t, e)))


def layout(launch: dict[str, Any], tp: int, dp: int, ep: int, isl: int, osl: int,
           conc: int) -> tuple[tuple[int, int, int] | None, str]:
    """The (tp, attention dp, ep) the script launched for a row whose export says (tp, dp, ep) at client
    concurrency ``conc``, with a note; None where no search-space entry, or several launching differently,
    fit the row (the export's layout stays)."""
    fits = [s for s in launch["search_space"] if (s["isl"], s["osl"]) == (isl, osl)
            and s["conc_start"] <= conc <= s["conc_end"] and _encodes(tp, dp, ep, s)]
    runs = {_launched(launch["launch"]["layout"], s) for s in fits}
    if len(runs) != 1:
        why = "no" if not runs else "more than one"
        return None, f"{why} {launch['commit'][:9]} search-space entry fits the row: export layout kept"
    (run,) = runs
    names = ", ".join(sorted({f"tp {s['tp']} / ep {s['ep']}" + (" / dp-attn" if s["dp_attn"] else "")
                              for s in fits}))
    return run, f"entry {names} of {launch['commit'][:9]}:{launch['path']}"


_OPERATORS: dict[type, Any] = {
    ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"max": max, "min": min, "round_up": lambda x, m: -(-x // m) * m}


def _evaluate(node: ast.AST, names: dict[str, Any]) -> Any:
    """An ``{"expr": ...}`` value: integers, decimals, ``None``, the script's variables (``names``),
    ``+ - * //``, comparisons, ``and`` / ``or`` / ``not``, ``a if c else b`` and ``max``, ``min``,
    ``round_up(x, m)`` (x rounded up to a multiple of m, bash's ``(x + m - 1) / m * m``); anything else is
    refused."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, names)
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (int, float))):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left, names), _evaluate(node.right, names))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _OPERATORS:
        left, right = _evaluate(node.left, names), _evaluate(node.comparators[0], names)
        return _OPERATORS[type(node.ops[0])](left, right)
    if isinstance(node, ast.BoolOp):    # Python's: the first value that decides, not a bool
        value = None
        for operand in node.values:
            value = _evaluate(operand, names)
            if bool(value) != isinstance(node.op, ast.And):
                break
        return value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _evaluate(node.operand, names)
    if isinstance(node, ast.IfExp):
        return _evaluate(node.body if _evaluate(node.test, names) else node.orelse, names)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS \
            and not node.keywords:
        return _FUNCTIONS[node.func.id](*(_evaluate(a, names) for a in node.args))
    raise ValueError(f"launch expression: {ast.dump(node)} is not allowed")


def _value(value: Any, conc: int, isl: int, names: dict[str, Any]) -> Any:
    if isinstance(value, dict) and "expr" in value:
        return _evaluate(ast.parse(value["expr"], mode="eval"), names)
    if isinstance(value, dict):  # {"conc_at_least": C, "then": A, "else": B}: the script branches on $CONC
        return value["then"] if conc >= value["conc_at_least"] else value["else"]
    if value == "CONC":
        return conc
    if value == "2*ISL":
        return 2 * isl
    return value


def settings(launch: dict[str, Any], tp: int, conc: int, isl: int, *, osl: int = 0, client_conc: int = 0,
             dp: int = 1, ep: int = 1) -> dict[str, Any]:
    """The launch keys for an engine of ``tp`` launched TP (x ``dp`` attention-DP ranks, ``ep``-way EP) whose
    rank serves ``conc`` of the client's ``client_conc`` clients (0: ``conc``). The expressions see the
    script's variables: CONC (the rank's share), CLIENT_CONC (the script's $CONC), ISL, OSL, TP (the engine's
    GPUs, the script's $TP), EP_SIZE and DP_ATTENTION."""
    names = {"CONC": conc, "CLIENT_CONC": client_conc or conc, "ISL": isl, "OSL": osl, "TP": tp * dp,
             "EP_SIZE": ep, "DP_ATTENTION": dp > 1}
    flags = {k: v for k, v in launch["launch"].items() if k not in ("layout", "by_tp")}
    flags.update(launch["launch"].get("by_tp", {}).get(str(tp), {}))
    values = {k: _value(v, conc, isl, names) for k, v in flags.items()}
    return {k: v for k, v in values.items() if v is not None}
