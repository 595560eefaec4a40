"""The CUDA backend's Batch (a CUDA graph) and single launch against a recording driver.

No GPU or libcuda is here, so `driver()` is replaced by `RecordingDriver`: it hands out
handles, keeps every call, and reads each kernel node's and launch's arguments out of memory
during the call, as the driver copies them. The node parameters are cuda-python's own
`CUDA_KERNEL_NODE_PARAMS`. What a GPU would show (the graph running, its timing) is not
checked here; docs/backends/cuda.md says so.
"""
from __future__ import annotations

import ctypes
import gc
import itertools
from typing import Any

import pytest

from portkit.abi.backend import Launch
from portkit.reference_backends.cuda import runtime as cuda_runtime

bindings = pytest.importorskip("cuda.bindings.driver")

# Each fake kernel's arguments: (device pointers, then int32 scalars).
ARGUMENTS = {b"k_scale": (2, 2), b"k_add": (3, 1)}


class RecordingDriver:
    """Stands in for cuda.bindings.driver: every call returns (CUDA_SUCCESS, a new handle) and
    is kept in `calls` as (name, details)."""

    CUDA_KERNEL_NODE_PARAMS = bindings.CUDA_KERNEL_NODE_PARAMS

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.handles = itertools.count(1)
        self.signatures: dict[int, tuple[int, int]] = {}      # function -> its ARGUMENTS

    def __getattr__(self, name: str):
        def call(*args):
            self.calls.append((name, args))
            return 0, next(self.handles)
        return call

    def named(self, name: str) -> list:
        return [details for called, details in self.calls if called == name]

    def arguments(self, function, address: int) -> list[int]:
        """The argument values behind a kernelParams array, as the driver reads them."""
        pointers, scalars = self.signatures[int(function)]
        array = (ctypes.c_void_p * (pointers + scalars)).from_address(address)
        return [(ctypes.c_uint64 if i < pointers else ctypes.c_int32).from_address(p).value
                for i, p in enumerate(array)]

    def cuModuleGetFunction(self, module, name: bytes):
        function = bindings.CUfunction(next(self.handles))
        self.signatures[int(function)] = ARGUMENTS[name]
        return 0, function

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        self.calls.append(("cuLaunchKernel", (int(function), (gx, gy, gz), (bx, by, bz), stream,
                                              self.arguments(function, params))))
        return (0,)

    def node(self, params) -> tuple:
        grid = (params.gridDimX, params.gridDimY, params.gridDimZ)
        block = (params.blockDimX, params.blockDimY, params.blockDimZ)
        return (int(params.func), grid, block, self.arguments(params.func, params.kernelParams))

    def cuGraphAddKernelNode(self, graph, before, count, params):
        handle = next(self.handles)
        self.calls.append(("cuGraphAddKernelNode", (handle, list(before)[:count],
                                                    self.node(params))))
        return 0, handle

    def cuGraphExecKernelNodeSetParams(self, executable, node, params):
        self.calls.append(("cuGraphExecKernelNodeSetParams", (node, self.node(params))))
        return (0,)

    def cuEventElapsedTime(self, start, end):
        self.calls.append(("cuEventElapsedTime", (start, end)))
        return 0, 2.5      # milliseconds


@pytest.fixture
def fake(monkeypatch) -> RecordingDriver:
    recording = RecordingDriver()
    monkeypatch.setattr(cuda_runtime, "driver", lambda: recording)
    return recording


def pointer(address: int):
    return bindings.CUdeviceptr(address)


def launches(context) -> list[Launch]:
    scale = cuda_runtime.CUDAProgram(context, "scale", b"")
    add = cuda_runtime.CUDAProgram(context, "add", b"")
    return [Launch(scale, [pointer(0x1000), pointer(0x2000)], [3, -1], (4, 1, 1), (64, 1, 1)),
            Launch(add, [pointer(0x2000), pointer(0x1000), pointer(0x3000)], [7], (2, 3, 1),
                   (32, 4, 1)),
            Launch(scale, [pointer(0x3000), pointer(0x4000)], [-2**31, 2**31 - 1], (1, 1, 1),
                   (1, 1, 1))]


def test_a_batch_is_one_graph_of_kernel_nodes_each_after_the_one_before(fake):
    context = cuda_runtime.CUDAContext(0)
    recorded = launches(context)
    cuda_runtime.CUDAGraph(context, recorded)
    nodes = fake.named("cuGraphAddKernelNode")
    assert [after for _, after, _ in nodes] == [[], [nodes[0][0]], [nodes[1][0]]]
    functions = [int(launch.program.function) for launch in recorded]
    assert [node for _, _, node in nodes] == [
        (functions[0], (4, 1, 1), (64, 1, 1), [0x1000, 0x2000, 3, -1]),
        (functions[1], (2, 3, 1), (32, 4, 1), [0x2000, 0x1000, 0x3000, 7]),
        (functions[2], (1, 1, 1), (1, 1, 1), [0x3000, 0x4000, -2**31, 2**31 - 1])]
    assert len(fake.named("cuGraphInstantiate")) == 1 and not fake.named("cuLaunchKernel")


def test_a_single_launch_packs_its_arguments_as_a_graph_node_does(fake):
    context = cuda_runtime.CUDAContext(0)
    first = launches(context)[0]
    assert first.program(first.buffers, first.scalars, first.grid, first.block) is None
    cuda_runtime.CUDAGraph(context, [first])
    (_, _, node), = fake.named("cuGraphAddKernelNode")
    (function, grid, block, stream, arguments), = fake.named("cuLaunchKernel")
    assert (function, grid, block, arguments) == node and stream == cuda_runtime.STREAM


def test_a_replay_is_one_graph_launch_and_rewrites_only_the_replaced_nodes(fake):
    context = cuda_runtime.CUDAContext(0)
    recorded = launches(context)
    batch = cuda_runtime.CUDAGraph(context, recorded)
    nodes = [handle for handle, _, _ in fake.named("cuGraphAddKernelNode")]
    fake.calls.clear()
    assert batch() is None
    assert fake.calls == [("cuGraphLaunch", (batch.executable, cuda_runtime.STREAM))]
    fake.calls.clear()
    same = recorded[0].buffers[1]    # the replay engine passes every buffer it fills
    seconds = batch([(0, 1, same), (1, 2, pointer(0x5000))], [(2, [5, 6])], wait=True)
    assert seconds == pytest.approx(2.5e-3)
    assert [name for name, _ in fake.calls] == [
        "cuGraphExecKernelNodeSetParams", "cuGraphExecKernelNodeSetParams", "cuEventRecord",
        "cuGraphLaunch", "cuEventRecord", "cuEventSynchronize", "cuEventElapsedTime"]
    rewritten = fake.named("cuGraphExecKernelNodeSetParams")
    assert [(node, arguments) for node, (_, _, _, arguments) in rewritten] == [
        (nodes[1], [0x2000, 0x1000, 0x5000, 7]), (nodes[2], [0x3000, 0x4000, 5, 6])]
    fake.calls.clear()
    batch()          # a replacement holds for the later replays too
    assert [name for name, _ in fake.calls] == ["cuGraphLaunch"]


def test_a_dropped_batch_destroys_its_graph(fake):
    gc.collect()     # no other test's batch is collected below
    context = cuda_runtime.CUDAContext(0)
    batch = cuda_runtime.CUDAGraph(context, launches(context))
    executable, graph = batch.executable, batch.graph
    del batch
    gc.collect()
    assert fake.named("cuGraphExecDestroy") == [(executable,)]
    assert fake.named("cuGraphDestroy") == [(graph,)]
