"""Writing a fitted constant set: the <engine>.yaml with a provenance note above each block, the set a fit
starts from (starting_set), and --only's merge of refitted blocks into the shipped set (keep_shipped), which
reads the notes back from the YAML's comments."""

from __future__ import annotations

from typing import Any

import yaml

from hardware._data import read_yaml
from hardware.calibration import CALIBRATION_DIR
from hardware.kernel_tables import HOPPER, TableSet


def yaml_with_notes(engine: str, data: dict[str, Any], notes: dict[str, str], source: str,
                    tables: TableSet = HOPPER) -> str:
    """The YAML text of one engine's set, each block under its note (``notes``; 'starting value' where none)."""
    head = [f"# Fitted constants for {engine}'s kernels, written by `python -m hardware.calibrate` from {source}.",
            "# Per block: where it came from and its fit error (|predicted / measured - 1| over the fitted rows).",
            "# Curves: see hardware/calibration.py. Blocks marked 'starting value' had no table to fit."]
    if tables.arch != HOPPER.arch:
        head.append(f"# {tables.arch.capitalize()} set (hardware.calibration.calibration_for): blocks marked 'no "
                    f"{tables.arch} table' are the engine's Hopper set's, moved to the GPU by its spec alone.")
    data = dict(data)
    data.pop("graph_floors_at_most_fitted", None)   # (the architecture's choice, written last)
    if tables.graph_floors_at_most_fitted:
        data["graph_floors_at_most_fitted"] = True
        notes = {**notes, "graph_floors_at_most_fitted": (
            f"graph floors never above the fitted ones: the {tables.arch} tables time fused kernels "
            "(Calibration.graph_floors_at_most_fitted)")}
    data["provenance"] = (f"fitted by hardware.calibrate on {tables.source} ({tables.engines[engine]}, "
                          f"{'+'.join(tables.gpus)})")
    lines = head + [yaml.safe_dump({"provenance": data.pop("provenance")}, sort_keys=False).strip()]
    for key, val in data.items():
        if isinstance(val, dict) and key in ("gemm", "moe"):
            lines.append(f"{key}:")
            for sub, v in val.items():
                note = notes.get(f"{key}.{sub}", "starting value (not fitted)")
                lines.append(f"  # {note}")
                lines.append(f"  {sub}: {yaml.safe_dump(_round(v), default_flow_style=True, width=1000).strip()}")
        elif isinstance(val, dict):
            note = notes.get(key, "starting value (not fitted)")
            lines.append(f"# {note}")
            lines.append(f"{key}: {yaml.safe_dump(_round(val), default_flow_style=True, width=1000).strip()}")
        else:
            if key in notes:
                lines.append(f"# {notes[key]}")
            lines.append(f"{key}: {str(val).lower() if isinstance(val, bool) else val}")
    return "\n".join(lines) + "\n"


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return float(f"{v:.4g}")
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_round(x) for x in v]
    return v


def starting_set(engine: str, tables: TableSet) -> tuple[dict[str, Any], dict[str, str]]:
    """The values an engine's fit starts from and keeps for the blocks its tables do not fit, with their notes:
    default.yaml's starting values for Hopper (no notes: 'starting value'); for another architecture the
    engine's Hopper set, each block noted as taken from it (its Hopper note in brackets), so a kernel the
    architecture's tables never timed is priced as on Hopper, moved to the GPU by its spec alone."""
    if tables.arch == HOPPER.arch:
        return read_yaml(CALIBRATION_DIR / "default.yaml"), {}
    path = CALIBRATION_DIR / f"{engine}.yaml"
    hopper_notes = _read_notes(path.read_text())
    notes = {block: f"no {tables.arch} table ({tables.source} {tables.engines[engine]}): the Hopper set's, "
                    f"moved by the spec ({note or 'starting value'})"
             for block, note in hopper_notes.items() if block != "provenance"}
    return read_yaml(path), notes


def keep_shipped(engine: str, data: dict[str, Any], notes: dict[str, str],
                 only: set[str], tables: TableSet = HOPPER) -> tuple[dict[str, Any], dict[str, str]]:
    """The fitted ``data`` / ``notes`` of the blocks in ``only``, every other block and its note as the shipped
    YAML of ``engine`` has them (its comment line above each block). A name ``group.key`` (e.g. ``moe.fp4``)
    is one curve of a group (gemm, moe): the group's other curves stay as shipped."""
    curves = {name for name in only if "." in name}
    known = set(data) | {f"{group}.{key}" for group in ("gemm", "moe") for key in data.get(group, {})}
    unknown = sorted(only - known)
    if unknown:
        raise SystemExit(f"--only: no block {', '.join(unknown)}; blocks: {', '.join(sorted(known))}")
    path = tables.out / f"{engine}.yaml"
    shipped = read_yaml(path)

    def refitted(name: str) -> bool:
        return name in only or name.split(".", 1)[0] in only

    kept: dict[str, Any] = {}
    for k, v in shipped.items():
        if k == "provenance":
            continue
        if k in only:
            kept[k] = data[k]
        elif isinstance(v, dict) and any(c.startswith(k + ".") for c in curves):
            kept[k] = {**v, **{c.split(".", 1)[1]: data[k][c.split(".", 1)[1]] for c in curves
                               if c.startswith(k + ".")}}
        else:
            kept[k] = v
    for k in data:  # a named block the shipped set lacks joins it; a block nobody named does not
        if k in only:
            kept.setdefault(k, data[k])
    shipped_notes = _read_notes(path.read_text())
    merged = {}
    for k in {**shipped_notes, **notes}:  # a refitted block's note first, any other block's shipped one
        first, second = (notes, shipped_notes) if refitted(k) else (shipped_notes, notes)
        merged[k] = first.get(k, second.get(k, ""))
    return kept, {k: v for k, v in merged.items() if v and k.split(".", 1)[0] in kept}


def _read_notes(text: str) -> dict[str, str]:
    """The notes :func:`yaml_with_notes` wrote: block (``group.key`` inside gemm / moe) -> the comment above
    it ('' for a block with none)."""
    notes: dict[str, str] = {}
    note, group = "", ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            note = stripped[1:].strip()
            continue
        if not stripped or ":" not in stripped:
            continue
        key = stripped.split(":", 1)[0]
        if line.startswith("  "):
            notes[f"{group}.{key}"] = note
        else:
            group = key
            notes[key] = note
        note = ""
    return notes
