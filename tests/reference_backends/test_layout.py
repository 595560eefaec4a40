"""Every reference backend has the scaffold's shape: the same five files, the same names."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from portkit.abi import (
    Allocator,
    Backend,
    BackendUnavailable,
    Capabilities,
    Compiler,
    Program,
    Renderer,
)

ROOT = Path(__file__).resolve().parents[2] / "portkit" / "reference_backends"
FILES = {"__init__.py", "device.py", "capabilities.py", "renderer.py", "runtime.py"}
# backend -> the prefix of its class names
BACKENDS = {"cpu": "CPU", "opencl": "OpenCL", "cuda": "CUDA", "metal": "Metal",
            "webgpu": "WebGPU", "interpreter": "Interpreter"}


def part(backend: str, name: str):
    return importlib.import_module(f"portkit.reference_backends.{backend}.{name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_five_files(backend):
    assert {p.name for p in (ROOT / backend).glob("*.py")} == FILES
    assert {p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(
        BACKENDS)


@pytest.mark.parametrize(("backend", "prefix"), BACKENDS.items())
def test_the_same_names_in_every_backend(backend, prefix):
    package = importlib.import_module(f"portkit.reference_backends.{backend}")
    assert isinstance(package.backend, Backend) and package.backend.name == backend
    device = part(backend, "device")
    assert package.backend.load is device.load and callable(device.find_device)
    assert callable(part(backend, "capabilities").capabilities)
    assert issubclass(getattr(part(backend, "renderer"), f"{prefix}Renderer"), Renderer)
    runtime = part(backend, "runtime")
    for base in (Allocator, Compiler, Program):
        assert issubclass(getattr(runtime, f"{prefix}{base.__name__}"), base)


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_program_is_a_class_or_a_partial(backend):
    """Never a lambda or a closure (with a cache of its own): a reader sees what it makes."""
    tree = ast.parse((ROOT / backend / "device.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "Device"]
    assert len(calls) == 1
    program = calls[0].args[5]
    assert isinstance(program, ast.Name) or (
        isinstance(program, ast.Call) and ast.unparse(program.func) == "functools.partial"), (
        f"{backend}: Device.program is {ast.unparse(program)}")
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                and node.name not in ("find_device", "load", "devices", "init_driver")], (
        f"{backend}/device.py defines a function beyond find_device, devices and load")


@pytest.mark.parametrize("backend", BACKENDS)
def test_capabilities_are_built_in_capabilities_py_only(backend):
    for path in (ROOT / backend).glob("*.py"):
        text = path.read_text()
        if path.name != "capabilities.py":
            assert "Capabilities(" not in text and "replace(" not in text, path


def test_capabilities_of_a_device_without_one_here():
    """Metal's capabilities need no Mac: the conformance shims declare a typical Metal GPU."""
    caps = part("metal", "capabilities").capabilities(device_name="test")
    assert isinstance(caps, Capabilities) and caps.validate("metal").device_name == "test"


@pytest.mark.parametrize(("backend", "driver"), [("opencl", "cl"), ("webgpu", "wgpu")])
def test_a_missing_python_package_names_the_extra(backend, driver, monkeypatch):
    """device.py imports the driver's Python package; without it, load names the pip extra."""
    monkeypatch.setattr(part(backend, "device"), driver, None)
    with pytest.raises(BackendUnavailable) as error:
        importlib.import_module(f"portkit.reference_backends.{backend}").backend.load()
    assert error.value.fix == f"pip install portkit[{backend}]"
