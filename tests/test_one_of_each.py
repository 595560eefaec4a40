"""One of each mechanism: one place a program runs, one replay engine, one kernel timer, one
way to compile many kernels at once. A second one appearing fails here."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "portkit"


@functools.cache
def _modules() -> dict[str, ast.Module]:
    """portkit's own modules above the devices: a reference backend's, or a conformance
    shim's, Program and Compiler are the device side."""
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")
            if "reference_backends" not in p.parts and "shims" not in p.parts}


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        or (isinstance(node.func, ast.Name) and node.func.id == name))]


def _places(name: str) -> set[str]:
    return {path for path, tree in _modules().items() if _calls(tree, name)}


def test_one_place_runs_a_program():
    # a program is called with the kernel's grid and block: only Runtime.run_program does
    launching = set()
    for path, tree in _modules().items():
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and not (
                    isinstance(call.func, ast.Attribute) and call.func.attr == "build") and {
                    "grid", "block"} <= {
                    a.attr for a in call.args if isinstance(a, ast.Attribute)}:
                launching.add(path)
    # and the ABI's default Batch (OneByOne), which Runtime.run_batch calls
    assert launching == {"portkit/runtime/device.py", "portkit/abi/backend.py"}
    # a batch runs for a replay, for tier 1's batch case, and in the one timer (Runtime.time
    # times a launch inside a batch)
    assert _places("run_batch") <= {"portkit/schedule/replay.py", "portkit/runtime/device.py",
                                     "portkit/conformance/tier1_runtime.py"}


def test_one_replay_engine():
    assert _places("launch_again") == {"portkit/schedule/replay.py"}
    defined = {path for path, tree in _modules().items() for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef) and node.name.lstrip("_") == "Step"}
    assert defined == {"portkit/schedule/replay.py"}


def test_one_kernel_timer():
    # a timer reads the clock around launches it waits for
    timers = set()
    for path, tree in _modules().items():
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef) or not _calls(function,
                                                                       "perf_counter"):
                continue
            waiting = [call for name in ("run_program", "launch", "program")
                       for call in _calls(function, name)
                       if any(k.arg == "wait" for k in call.keywords) or any(
                           isinstance(a, ast.Constant) and a.value is True for a in call.args)]
            if waiting:
                timers.add(f"{path}:{function.name}")
    # the launch site reads the clock only for an open profile (portkit/runtime/profile.py)
    assert timers == {"portkit/runtime/device.py:time", "portkit/runtime/device.py:run_program"}


def test_one_way_to_compile_many_kernels():
    pools = {path for path, tree in _modules().items()
             if any(isinstance(n, ast.Name) and n.id == "ThreadPoolExecutor"
                    for n in ast.walk(tree))}
    assert pools == {"portkit/runtime/device.py"}
