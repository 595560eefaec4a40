"""Codegen lays out work from Capabilities alone: no backend name decides a kernel's shape."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import portkit.codegen
from portkit import backends, runtime, schedule
from portkit.codegen.lower import lower
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.schedule import stages
from portkit.tensor import Tensor

CAPABILITIES = capabilities()

VENDOR = "vendor-host-cpu"


@pytest.fixture(scope="module")
def vendor_cpu() -> str:
    """The CPU backend's device under a vendor's name: same capabilities, another name."""
    device = backends.load("cpu")
    try:
        runtime.register(runtime.Runtime(VENDOR, dataclasses.replace(device, name=VENDOR)))
    except ValueError:      # registered by an earlier run in this process
        pass
    return VENDOR


def _matmul_kernels(device: str):
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((64, 96), np.float32), device=device)
    w = Tensor(rng.standard_normal((96, 128), np.float32), device=device)
    return schedule.kernels([(x @ w).lazy])


def test_a_host_cpu_backend_under_another_name_gets_the_cpu_lowering(vendor_cpu):
    ours, theirs = _matmul_kernels("cpu"), _matmul_kernels(vendor_cpu)
    assert [k.block for k in theirs] == [(1, 1, 1)] * len(theirs), "threads must run as loops"
    assert [k.to_json() for k in theirs] == [k.to_json() for k in ours]


def test_the_vendor_cpu_computes_the_same_values(vendor_cpu):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((33, 70), np.float32), rng.standard_normal((48, 70), np.float32)
    got = (Tensor(x, device=vendor_cpu) @ Tensor(w, device=vendor_cpu).T).numpy()
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("loops", [False, True])
def test_threads_are_loops_alone_picks_the_launch_shape(loops):
    caps = dataclasses.replace(CAPABILITIES, threads_are_loops=loops)
    x = Tensor(np.ones((64, 256), np.float32), device="interpreter")
    item, = schedule.create_schedule([x.sum(axis=1).lazy])
    kernel = lower(item.root, item.inputs, caps)
    caps.check_launch(kernel)
    assert (kernel.block == (1, 1, 1)) is loops, kernel.block


def test_no_backend_name_appears_in_codegen_or_the_scheduler():
    codegen = [importlib.import_module(f"portkit.codegen.{m.name}")
               for m in pkgutil.iter_modules(portkit.codegen.__path__)]
    for module in (schedule, stages, *codegen):
        source = inspect.getsource(module)
        for name in ("\"cpu\"", "'cpu'", "\"opencl\"", "\"webgpu\"", "\"cuda\"", "\"metal\""):
            assert name not in source, f"{module.__name__} names a backend: {name}"
