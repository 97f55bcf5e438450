"""Write inferencemax_disagg.json: the disaggregated DeepSeek-R1 FP8 deployments InferenceMAX ran on H100 / H200.

Reads ``.github/configs/nvidia-master.yaml`` from a git mirror of SemiAnalysisAI/InferenceX (Apache-2.0) and
keeps, for each config key below, every version of its block committed in [SINCE, UNTIL] (a new version
whenever the key's parsed entries change), each search-space entry with its ``commit:path:line``. The
validator reads only the JSON; run this again to refresh it:

    python validation/harness/make_inferencemax_disagg.py /path/to/InferenceX/repo
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

PATH = ".github/configs/nvidia-master.yaml"
KEYS = ("dsr1-fp8-h200-dynamo-trt", "dsr1-fp8-h100-dynamo-trt",
        "dsr1-fp8-h100-dynamo-sglang", "dsr1-fp8-h200-dynamo-sglang",
        # Blackwell Ultra (silicon_blackwell_dev.csv): B300 / GB300 TRT-LLM and GB300 SGLang, FP8 and NVFP4
        "dsr1-fp4-b300-dynamo-trt", "dsr1-fp8-b300-dynamo-trt", "dsr1-fp4-gb300-dynamo-trt",
        "dsr1-fp8-gb300-dynamo-trt", "dsr1-fp4-gb300-dynamo-sglang", "dsr1-fp8-gb300-dynamo-sglang")
SINCE, UNTIL = "2026-02-01T00:00:00Z", "2026-03-24T00:00:00Z"   # the rows were measured 2026-02-07 .. 03-23
# Keys whose rows were measured before SINCE: B300 TRT-LLM NVFP4 rows from 2026-01-28 (the key first appears
# in dea7f48f7, 2026-01-27).
KEY_SINCE = {"dsr1-fp4-b300-dynamo-trt": "2026-01-27T00:00:00Z"}
OUT = Path(__file__).with_name("inferencemax_disagg.json")
# srt-slurm TRT-LLM recipe names c{C}_ctx{P}_gen{D}_...: the recipe's benchmark.concurrencies is C x D, the
# client's total concurrency (recipes/trtllm/h200/1k1k/stp/c16_ctx1_gen9_tep8_batch256_eplb0_mtp0.yaml at
# ishandhanani/srt-slurm 4893f83: concurrencies "144"); C = 1 recipes use other totals (c1_ctx1_gen9: "11").
RECIPE = re.compile(r"/c(\d+)_ctx(\d+)_gen(\d+)_")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def _node(mapping: yaml.MappingNode, key: str) -> Any:
    for k, v in mapping.value:
        if k.value == key:
            return v
    return None


def _side(node: yaml.MappingNode) -> dict[str, Any]:
    data = yaml.safe_load(yaml.serialize(node))
    return {"num_worker": data["num-worker"], "tp": data["tp"], "ep": data["ep"],
            "dp_attn": bool(data.get("dp-attn", False)),
            "additional_settings": list(data.get("additional-settings") or [])}


def _row_concurrency(conc_list: list[int], decode_workers: int, settings: list[str]) -> list[int] | None:
    """Client concurrencies the entry ran (None: not derivable from the yaml)."""
    for text in settings:
        found = RECIPE.search(text)
        if found:
            conc, gen = int(found.group(1)), int(found.group(3))
            if conc_list != [conc] or gen != decode_workers:
                return None
            return None if conc == 1 else [conc * gen]
    return list(conc_list)


def entries(text: str, commit: str, key: str) -> list[dict[str, Any]] | None:
    """The key's search-space entries in one version of the file (None: key absent)."""
    root = yaml.compose(text)
    assert isinstance(root, yaml.MappingNode)
    block = _node(root, key)
    if block is None:
        return None
    out = []
    for seq in _node(block, "seq-len-configs").value:
        isl, osl = int(_node(seq, "isl").value), int(_node(seq, "osl").value)
        for entry in _node(seq, "search-space").value:
            spec = _node(entry, "spec-decoding")
            spec_value = spec.value if spec is not None else "none"
            conc_list = [int(c.value) for c in _node(entry, "conc-list").value]
            prefill, decode = _side(_node(entry, "prefill")), _side(_node(entry, "decode"))
            settings = prefill["additional_settings"] + decode["additional_settings"]
            out.append({"isl": isl, "osl": osl, "spec_decoding": spec_value, "conc_list": conc_list,
                        "row_concurrency": _row_concurrency(conc_list, decode["num_worker"], settings),
                        "prefill": prefill, "decode": decode,
                        "source": f"{commit[:9]}:{PATH}:{entry.start_mark.line + 1}"})
    return out


def versions(repo: str, key: str) -> list[dict[str, Any]]:
    since = KEY_SINCE.get(key, SINCE)
    log = git(repo, "log", "--reverse", "--format=%H %cI", f"--since={since}", f"--until={UNTIL}", "--", PATH)
    first = git(repo, "log", "-1", "--format=%H %cI", f"--before={since}", "--", PATH).split()
    out: list[dict[str, Any]] = []
    # the latest kept version's entries without their line numbers (a move alone is no new version)
    last: list[dict[str, Any]] | None = None
    for line in [" ".join(first)] + log.splitlines():
        commit, date = line.split()
        text = git(repo, "show", f"{commit}:{PATH}")
        found = entries(text, commit, key)
        if found is None:
            continue
        strip = [{k: v for k, v in e.items() if k != "source"} for e in found]
        if strip == last:
            continue
        last = strip
        block = yaml.safe_load(text)[key]
        out.append({"commit": commit, "committed": date, "image": block.get("image"), "entries": found})
    return out


def _dump(data: dict[str, Any]) -> str:
    """JSON with one search-space entry per line."""
    text = json.dumps(data, indent=1)
    return re.sub(r'\{\n\s+"isl".*?"source": "[^"]*"\n\s+\}',
                  lambda m: json.dumps(json.loads(m.group(0))), text, flags=re.S)


def main(repo: str) -> None:
    head = git(repo, "rev-parse", "HEAD").strip()
    data: dict[str, Any] = {"source": {"repository": "SemiAnalysisAI/InferenceX", "license": "Apache-2.0", "path": PATH,
                       "mirror_head": head, "window": [SINCE, UNTIL], "key_since": KEY_SINCE,
                       "generator": "validation/harness/make_inferencemax_disagg.py"},
            "configs": {key: versions(repo, key) for key in KEYS}}
    OUT.write_text(_dump(data) + "\n")
    print(f"wrote {OUT}: " + ", ".join(f"{k} {len(v)} versions" for k, v in data["configs"].items()))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python validation/harness/make_inferencemax_disagg.py /path/to/InferenceX/repo")
    main(sys.argv[1])
