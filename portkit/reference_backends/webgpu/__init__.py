"""The WebGPU reference backend: WGSL compute shaders through wgpu-py (Mesa lavapipe on a CPU).

WGSL has no binary form a program could be rebuilt from, so the Compiler only validates (the
driver parses the shader) and hands the source on; the Program builds the compute pipeline once
per kernel. The workgroup size is baked into the shader, so Capabilities.fixed_block is True.
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np

# Mesa warns on every start without it; set before wgpu loads the driver.
os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="portkit-xdg-"))
try:
    import wgpu
except ImportError:   # the backend then reports itself unavailable, with the fix
    wgpu = None

from portkit.abi import dtypes
from portkit.abi.backend import Allocator, Backend, Capabilities, Compiler, Device, Program
from portkit.abi.errors import BackendUnavailable, CompileError
from portkit.abi.ops import COMPUTE, Op
from portkit.codegen.cstyle import function_name
from portkit.reference_backends.webgpu.renderer import WGSLRenderer

# WGSL has no 64-bit types; the rest is native, packed (8/16-bit, bool) or emulated (bfloat16).
DTYPES = frozenset(d for d in dtypes.ALL if d.bits < 64)


class WGSLCompiler(Compiler):
    """Checks a shader by creating its module; returns the source, the only form WebGPU takes."""

    def __init__(self, device):
        self.device = device

    def compile(self, source: str) -> bytes:
        try:
            self.device.create_shader_module(code=source)
        except wgpu.GPUError as error:
            raise CompileError("the WGSL shader was rejected (the source is in .source)",
                               source, str(error)) from None
        return source.encode()


class WGSLProgram(Program):
    """One compute pipeline; each launch binds the buffers and a uniform of the scalars."""

    def __init__(self, device, name: str, binary: bytes):
        self.device = device
        source = binary.decode()
        buffers = source.count("var<storage")
        storage = {"type": wgpu.BufferBindingType.storage}
        entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": storage}
                   for i in range(buffers)]
        if "var<uniform>" in source:
            entries.append({"binding": buffers, "visibility": wgpu.ShaderStage.COMPUTE,
                            "buffer": {"type": wgpu.BufferBindingType.uniform}})
        self.layout = device.create_bind_group_layout(entries=entries)
        self.pipeline = device.create_compute_pipeline(
            layout=device.create_pipeline_layout(bind_group_layouts=[self.layout]),
            compute={"module": device.create_shader_module(code=source),
                     "entry_point": function_name(name)})

    def __call__(self, buffers, scalars, grid, block, wait: bool = False) -> float | None:
        resources = list(buffers)
        if scalars:
            data = np.zeros(-(-len(scalars) // 4) * 4, np.int32)   # uniforms: 16-byte blocks
            data[:len(scalars)] = scalars
            resources.append(self.device.create_buffer_with_data(
                data=data.tobytes(), usage=wgpu.BufferUsage.UNIFORM))
        group = self.device.create_bind_group(layout=self.layout, entries=[
            {"binding": i, "resource": {"buffer": b}} for i, b in enumerate(resources)])
        encoder = self.device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(self.pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(*grid)
        compute.end()
        start = time.perf_counter()
        self.device.queue.submit([encoder.finish()])
        if not wait:
            return None
        synchronize(self.device)
        return time.perf_counter() - start


class WGPUAllocator(Allocator):
    """Storage buffers; WebGPU copies whole 4-byte words, so sizes are rounded up to them."""

    def __init__(self, device):
        self.device = device

    def alloc(self, nbytes: int):
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        return self.device.create_buffer(size=max(4, -(-nbytes // 4) * 4), usage=usage)

    def free(self, buffer, nbytes: int) -> None:
        buffer.destroy()

    def copyin(self, buffer, source: memoryview) -> None:
        data = np.frombuffer(source, np.uint8)
        if data.size % 4:
            data = np.concatenate([data, np.zeros(4 - data.size % 4, np.uint8)])
        if data.size:
            self.device.queue.write_buffer(buffer, 0, data)

    def copyout(self, destination: memoryview, buffer) -> None:
        out = np.frombuffer(destination, np.uint8)
        if out.size:
            out[:] = np.frombuffer(self.device.queue.read_buffer(buffer), np.uint8)[:out.size]


def synchronize(device) -> None:
    """Waits for all submitted work: reading a buffer back waits for the queue before it."""
    # queue.on_submitted_work_done_sync fails inside wgpu-py 0.32 (a cffi signature mismatch).
    if not hasattr(device, "_pk_fence"):
        device._pk_fence = device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
    device.queue.read_buffer(device._pk_fence)


def capabilities(adapter) -> Capabilities:
    """What the adapter can do, from its features and limits."""
    limits, info = adapter.limits, adapter.info
    max_block = tuple(limits[f"max-compute-workgroup-size-{axis}"] for axis in "xyz")
    return Capabilities(
        dtypes=DTYPES if "shader-f16" in adapter.features else DTYPES - {dtypes.float16},
        ops=frozenset(COMPUTE) - INACCURATE,
        max_block_threads=limits["max-compute-invocations-per-workgroup"], max_block=max_block,
        max_grid=(limits["max-compute-workgroups-per-dimension"],) * 3,
        local_memory_bytes=limits["max-compute-workgroup-storage-size"],
        max_buffers=limits["max-storage-buffers-per-shader-stage"],
        fixed_block=True, device_name=f"{info['device']} ({info['backend_type']})")


# Builtins that miss the ABI's budget on lavapipe (exp2 and log2 flush denormals, sin loses
# its range reduction on large arguments): codegen decomposes them into exact ops.
INACCURATE = frozenset({Op.EXP2, Op.LOG2, Op.SIN})


def find_adapter():
    """The system's WebGPU adapter; BackendUnavailable naming the fix when there is none."""
    if wgpu is None:
        raise BackendUnavailable("wgpu is not installed",
                                 "pip install portkit[webgpu]")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as error:  # noqa: BLE001 - wgpu-native raises a plain RuntimeError
        adapter, reason = None, f" ({error})"
    else:
        reason = ""
    if adapter is None:
        raise BackendUnavailable(f"no WebGPU adapter: no Vulkan, Metal or D3D12 driver{reason}",
                                 "apt-get install mesa-vulkan-drivers")
    return adapter


def _load() -> Device:
    adapter = find_adapter()
    caps = capabilities(adapter)
    # The adapter's own limits: without them a device gets WebGPU's portable minimum.
    device = adapter.request_device_sync(
        required_features=["shader-f16"] if dtypes.float16 in caps.dtypes else [],
        required_limits=dict(adapter.limits))
    return Device("webgpu", caps, WGPUAllocator(device), WGSLRenderer(), WGSLCompiler(device),
                  lambda name, binary: WGSLProgram(device, name, binary),
                  lambda: synchronize(device))


backend = Backend("webgpu", _load, "WGSL through wgpu-py (Vulkan, Metal or D3D12)")
