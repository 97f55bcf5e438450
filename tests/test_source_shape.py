"""Every source module of the project stays readable in one sitting: at most 700 lines, and no function
longer than 80 (tests aside), and every module says its role in a docstring."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("twin", "hardware", "workloads", "validation", "experiments", "benchmarks")
MAX_LINES = 700
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _long_functions(tree: ast.AST) -> list[str]:
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_is_short_documented_and_made_of_short_functions(path: Path) -> None:
    text = path.read_text()
    tree = ast.parse(text, str(path))
    assert text.count("\n") <= MAX_LINES
    assert _long_functions(tree) == []
    assert ast.get_docstring(tree), "a module says its role in a docstring"


def test_the_rule_sees_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert _long_functions(ast.parse(f"def f():\n{body}\n")) == [f"f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert _long_functions(ast.parse(f"def f():\n{body[:-len('    x79 = 79')].rstrip()}\n")) == []
