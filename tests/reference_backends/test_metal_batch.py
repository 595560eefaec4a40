"""The Metal backend's launches and Batch against a recording stand-in for pyobjc's Metal.

No Mac is here, so `Metal` is a fake module and the device, queue, command buffer and encoder
are `Recorder`s that keep every call in order. What only a Mac shows (Metal accepting these
calls, the dispatches' results and timing) is not checked; docs/backends/metal.md says so.
"""
from __future__ import annotations

import ctypes
import sys
import types
from typing import Any

import pytest

from portkit.abi.backend import Launch
from portkit.reference_backends.metal.runtime import MetalBatch, MetalCompiler, MetalProgram

SERIAL = "MTLDispatchTypeSerial"


class Recorder:
    """Any method call is appended to `log` as (method, arguments) and returns
    `returns[method]`, called with the arguments if it is callable."""

    def __init__(self, log: list, returns: dict[str, Any] | None = None):
        self.log, self.returns = log, returns or {}

    def __getattr__(self, method: str):
        def call(*args):
            self.log.append((method, tuple(list(a) if isinstance(a, ctypes.Array) else a
                                           for a in args)))
            value = self.returns.get(method)
            return value(*args) if callable(value) else value
        return call


@pytest.fixture
def log(monkeypatch) -> list:
    metal = types.SimpleNamespace(MTLSizeMake=lambda *size: size, MTLDispatchTypeSerial=SERIAL,
                                  MTLCompileOptions=types.SimpleNamespace(new=lambda: Recorder([])))
    monkeypatch.setitem(sys.modules, "Metal", metal)
    return []


def programs(log: list) -> tuple[Any, MetalProgram, MetalProgram]:
    """A queue whose command buffers record into `log`, and two programs on it."""
    encoder = Recorder(log)
    commands = Recorder(log, {"computeCommandEncoder": encoder,
                              "computeCommandEncoderWithDispatchType_": encoder,
                              "GPUStartTime": 1.0, "GPUEndTime": 1.25})
    queue = Recorder(log, {"commandBuffer": commands})
    library = Recorder([], {"newFunctionWithName_": lambda name: name})
    device = Recorder([], {"name": "fake GPU",
                           "newLibraryWithSource_options_error_": lambda *_: (library, None),
                           "newComputePipelineStateWithFunction_error_":
                               lambda function, _: (f"pipeline {function}", None)})
    compiler = MetalCompiler(device)
    scale, add = (MetalProgram(device, queue, compiler, name, b"msl") for name in ("scale", "add"))
    return queue, scale, add


def dispatch(pipeline: str, buffers: list, scalars: list[int], grid, block) -> list:
    """The encoder calls of one dispatch."""
    calls = [("setComputePipelineState_", (pipeline,))]
    calls += [("setBuffer_offset_atIndex_", (b, 0, i)) for i, b in enumerate(buffers)]
    if scalars:
        calls.append(("setBytes_length_atIndex_", (scalars, 4 * len(scalars), len(buffers))))
    return calls + [("dispatchThreadgroups_threadsPerThreadgroup_", (grid, block))]


def test_a_launch_is_one_command_buffer_with_one_dispatch(log):
    _, scale, _ = programs(log)
    assert scale(["x", "y"], [3, -1], (4, 1, 1), (64, 1, 1)) is None
    assert log == [("commandBuffer", ()), ("computeCommandEncoder", ()),
                   *dispatch("pipeline k_scale", ["x", "y"], [3, -1], (4, 1, 1), (64, 1, 1)),
                   ("endEncoding", ()), ("commit", ())]


def test_a_batch_is_one_serial_encoder_in_one_command_buffer_committed_once(log):
    queue, scale, add = programs(log)
    batch = MetalBatch(queue, [Launch(scale, ["x", "y"], [3, -1], (4, 1, 1), (64, 1, 1)),
                               Launch(add, ["y", "x", "z"], [], (2, 3, 1), (32, 4, 1)),
                               Launch(scale, ["z", "w"], [7, 8], (1, 1, 1), (1, 1, 1))])
    assert not log     # nothing is encoded until a replay
    assert batch() is None
    encoded = [*dispatch("pipeline k_scale", ["x", "y"], [3, -1], (4, 1, 1), (64, 1, 1)),
               *dispatch("pipeline k_add", ["y", "x", "z"], [], (2, 3, 1), (32, 4, 1)),
               *dispatch("pipeline k_scale", ["z", "w"], [7, 8], (1, 1, 1), (1, 1, 1))]
    assert log == [("commandBuffer", ()), ("computeCommandEncoderWithDispatchType_", (SERIAL,)),
                   *encoded, ("endEncoding", ()), ("commit", ())]
    log.clear()
    assert batch([(1, 2, "v")], [(0, [5, 6])], wait=True) == pytest.approx(0.25)
    replaced = [*dispatch("pipeline k_scale", ["x", "y"], [5, 6], (4, 1, 1), (64, 1, 1)),
                *dispatch("pipeline k_add", ["y", "x", "v"], [], (2, 3, 1), (32, 4, 1)),
                *dispatch("pipeline k_scale", ["z", "w"], [7, 8], (1, 1, 1), (1, 1, 1))]
    assert log == [("commandBuffer", ()), ("computeCommandEncoderWithDispatchType_", (SERIAL,)),
                   *replaced, ("endEncoding", ()), ("commit", ()), ("waitUntilCompleted", ()),
                   ("GPUEndTime", ()), ("GPUStartTime", ())]
    log.clear()
    batch()       # a replacement holds for the later replays too
    assert log[2:-2] == replaced


def test_the_device_makes_its_batches_on_its_queue(log, monkeypatch):
    from portkit.reference_backends.metal import device as metal_device

    queue, scale, _ = programs(log)
    gpu = Recorder([], {"name": "fake GPU", "newCommandQueue": queue,
                        "maxThreadsPerThreadgroup": types.SimpleNamespace(width=1024, height=1024,
                                                                          depth=1024),
                        "maxThreadgroupMemoryLength": 32768})
    sys.modules["Metal"].MTLCreateSystemDefaultDevice = lambda: gpu
    monkeypatch.setattr(sys, "platform", "darwin")
    batch = metal_device.load().batch([Launch(scale, ["x"], [], (1, 1, 1), (1, 1, 1))])
    assert isinstance(batch, MetalBatch) and batch.queue is queue
