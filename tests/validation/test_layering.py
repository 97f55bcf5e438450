"""The simulator knows no benchmark harness: nothing under twin/ imports validation/ or experiments/."""

import ast
from pathlib import Path

import twin


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_twin_imports_no_harness_or_study() -> None:
    root = Path(twin.__file__).parent
    bad = {f"{p.relative_to(root.parent)}: {name}" for p in root.rglob("*.py") for name in _imports(p)
           if name.split(".")[0] in ("validation", "experiments")}
    assert not bad, sorted(bad)


def test_validate_command_comes_from_the_entry_point() -> None:
    from twin.cli import build_parser

    args = build_parser().parse_args(["validate", "silicon", "rows.csv", "--out", "val"])
    assert args.func.__module__ == "validation.cli"
