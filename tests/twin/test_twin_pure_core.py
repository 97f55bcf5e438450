"""The twin's state machines import without SimPy: the scheduler, KV cache, fast-forward, request lifecycle and
config checks count time in twin.clock's units and never run an environment; only the processes (workers,
clients, links, monitor, runner) need SimPy."""

import subprocess
import sys

import pytest

STATE_MACHINES = ("clock", "config", "configio", "request", "tokens", "kv_cache", "scheduler", "cohort",
                  "fastforward", "lifecycle", "router", "sources", "registry", "errors")


@pytest.mark.parametrize("module", STATE_MACHINES)
def test_state_machine_imports_with_simpy_unimportable(module: str) -> None:
    code = f"import sys; sys.modules['simpy'] = None; import twin.{module}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_guard_catches_a_module_that_needs_simpy() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['simpy'] = None; import twin.worker"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "simpy" in done.stderr
