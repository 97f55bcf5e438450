"""The layering of the twin: ``twin.core`` imports without SimPy and knows neither the shell nor the config;
the simulator knows no benchmark harness and no study; the hardware model and the workloads know no
serving system."""

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import twin.core

ROOT = Path(__file__).resolve().parents[2]
CORE_MODULES = sorted(f"twin.core.{m.name}" for m in pkgutil.iter_modules(twin.core.__path__)
                      if not m.name.startswith("_"))


def _imports_without_simpy(modules: list[str]) -> subprocess.CompletedProcess[str]:
    code = "import sys; sys.modules['simpy'] = None\n" + "".join(f"import {m}\n" for m in modules)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_the_core_has_the_modules_it_is_made_of() -> None:
    names = {m.rsplit(".", 1)[1] for m in CORE_MODULES}
    assert {"clock", "request", "tokens", "kv_cache", "scheduler", "decode_cohort", "fastforward", "lifecycle",
            "flows", "prices", "policies", "errors"} <= names


def test_all_of_the_core_imports_with_simpy_unimportable() -> None:
    done = _imports_without_simpy(CORE_MODULES)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", ["twin.config", "twin.router", "twin.sources", "twin.registry"])
def test_config_checks_import_with_simpy_unimportable(module: str) -> None:
    done = _imports_without_simpy([module])
    assert done.returncode == 0, done.stderr


def test_the_guard_catches_a_module_that_needs_simpy() -> None:
    done = _imports_without_simpy(["twin.shell.worker"])
    assert done.returncode != 0 and "simpy" in done.stderr


def _imported(path: Path) -> set[str]:
    """Every module a source file imports (absolute imports; the project has no relative ones)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _offenders(folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for name in sorted(_imported(path)):
            if name.startswith(forbidden) and not name.startswith(allowed):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    return found


@pytest.mark.parametrize("folder, forbidden, allowed", [
    ("twin/core", ("simpy", "twin."), ("twin.core.",)),       # no processes, no config files, no CLI
    ("twin", ("validation", "experiments", "benchmarks"), ()),  # the simulator knows no harness or study
    ("hardware", ("twin", "workloads", "simpy"), ()),           # the hardware model knows no serving system
    ("workloads", ("twin", "hardware", "simpy"), ()),           # workloads are data, not simulation
])
def test_layers_import_only_what_they_may(folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    assert _offenders(folder, forbidden, allowed) == []


def test_the_layer_check_sees_an_import() -> None:
    assert "twin.core.request" in _imported(ROOT / "twin/core/scheduler.py")
    assert _offenders("twin/shell", ("simpy",)) != []
