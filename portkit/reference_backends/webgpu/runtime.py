"""Runtime: storage buffers (Allocator), shader validation (Compiler) and compute passes
(Program), through wgpu-py.

WGSL has no binary form a program could be rebuilt from, so the Compiler only validates (the
driver parses the shader) and hands the source on; the Program builds the compute pipeline once
per kernel. A Batch encodes all its launches as dispatches of one compute pass, one command
buffer and one submit; WebGPU makes each dispatch see the writes of the ones before it.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from typing import cast

import numpy as np

# Mesa warns on every start without it; set before wgpu loads the driver. Made only when
# missing, and removed at exit, so that processes leave no empty folders behind.
if not os.environ.get("XDG_RUNTIME_DIR"):
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="portkit-xdg-")
    atexit.register(shutil.rmtree, os.environ["XDG_RUNTIME_DIR"], ignore_errors=True)
try:
    import wgpu
except ImportError:   # device.find_device reports the backend unavailable, with the fix
    wgpu = None

from portkit.abi.backend import Allocator, Batch, Compiler, Launch, Program
from portkit.abi.errors import CompileError
from portkit.codegen.cstyle import function_name


class WebGPUAllocator(Allocator):
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


class WebGPUCompiler(Compiler):
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


class WebGPUProgram(Program):
    """One compute pipeline; each launch binds the buffers and a uniform of the scalars."""

    def __init__(self, device, fence, name: str, binary: bytes):
        self.device, self.fence = device, fence
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
            resources.append(self.device.create_buffer_with_data(
                data=_uniform(scalars), usage=wgpu.BufferUsage.UNIFORM))
        group = self.bind(resources)
        encoder = self.device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(self.pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(*grid)
        compute.end()
        return _submit(self.device, self.fence, encoder, wait)


    def bind(self, resources: list):
        """A bind group of `resources`: the buffers, then the scalars' uniform if any."""
        return self.device.create_bind_group(layout=self.layout, entries=[
            {"binding": i, "resource": {"buffer": b}} for i, b in enumerate(resources)])


def _submit(device, fence, encoder, wait: bool) -> float | None:
    """Submits `encoder`'s work; with `wait`, waits for it and returns its seconds."""
    start = time.perf_counter()
    device.queue.submit([encoder.finish()])
    if not wait:
        return None
    synchronize(device, fence)
    return time.perf_counter() - start


def _uniform(scalars: list[int]) -> bytes:
    data = np.zeros(-(-len(scalars) // 4) * 4, np.int32)   # uniforms: 16-byte blocks
    data[:len(scalars)] = scalars
    return data.tobytes()


class WebGPUBatch(Batch):
    """Launches as the dispatches of one compute pass, submitted at once. Each launch keeps its
    bind group, made again only when a buffer is replaced, and a uniform buffer of its scalars
    that a replacement rewrites."""

    def __init__(self, device, fence, launches: list[Launch]):
        self.device, self.fence = device, fence
        self.launches: list[list] = []    # program, resources (uniform last), group, grid
        for launch in launches:
            resources = list(launch.buffers)
            if launch.scalars:
                resources.append(device.create_buffer_with_data(
                    data=_uniform(launch.scalars),
                    usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST))
            program = cast(WebGPUProgram, launch.program)
            self.launches.append([program, resources, program.bind(resources), launch.grid])

    def __call__(self, buffers=(), scalars=(), wait: bool = False) -> float | None:
        changed = set()
        for launch, position, buffer in buffers:
            resources = self.launches[launch][1]
            if resources[position] is not buffer:
                resources[position] = buffer
                changed.add(launch)
        for launch in changed:
            entry = self.launches[launch]
            entry[2] = entry[0].bind(entry[1])
        for launch, words in scalars:
            self.device.queue.write_buffer(self.launches[launch][1][-1], 0, _uniform(words))
        encoder = self.device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        pipeline = None
        for program, _, group, grid in self.launches:
            if program.pipeline is not pipeline:    # one kernel launched again keeps it
                pipeline = program.pipeline
                compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(*grid)
        compute.end()
        return _submit(self.device, self.fence, encoder, wait)


def fence(device):
    """A 4-byte buffer whose read-back waits for all submitted work (see `synchronize`)."""
    return device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)


def synchronize(device, fence) -> None:
    """Waits for all submitted work: reading a buffer back waits for the queue before it."""
    # queue.on_submitted_work_done_sync fails inside wgpu-py 0.32 (a cffi signature mismatch).
    device.queue.read_buffer(fence)
