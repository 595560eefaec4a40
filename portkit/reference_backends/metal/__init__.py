"""The Metal reference backend (macOS): MSL from the C-style renderer, run through pyobjc.

`newLibraryWithSource` compiles a kernel's MSL (fast math off: the ABI's accuracy), compute
pipelines are made once per kernel, and each launch is one command buffer that dispatches the
ABI's grid of threadgroups. Buffers are shared-storage MTLBuffers, so copies are memcpy. On any
other system `load()` says "Metal needs macOS". Nothing here has run on a Mac yet: see
docs/backends/metal.md for what is and is not verified.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import replace

import numpy as np

from portkit.abi import dtypes
from portkit.abi.backend import Allocator, Backend, Capabilities, Compiler, Device, Program
from portkit.abi.errors import BackendUnavailable, CompileError
from portkit.abi.ops import COMPUTE
from portkit.codegen.cstyle import function_name
from portkit.reference_backends.metal.renderer import MetalRenderer

__all__ = ["METAL_CAPABILITIES", "MetalRenderer", "backend"]

# What every Apple GPU since the A11 offers; `load` reads the device's own limits over these.
METAL_CAPABILITIES = Capabilities(
    dtypes=frozenset(dtypes.ALL) - {dtypes.float64},    # MSL has no double
    ops=frozenset(COMPUTE), max_block_threads=1024, max_block=(1024, 1024, 1024),
    max_grid=(2**31 - 1, 65535, 65535), local_memory_bytes=32 * 1024,
    max_buffers=31,              # [[buffer(0..30)]], scalars included: see `check_launch`
    denormals="flush",           # MSL lets float32 denormals be flushed to zero
    device_name="Metal")


class MetalAllocator(Allocator):
    """MTLBuffers in shared storage: the CPU reads and writes them in place."""

    def __init__(self, device):
        self.device = device

    def alloc(self, nbytes: int):
        import Metal

        return self.device.newBufferWithLength_options_(max(nbytes, 1),
                                                        Metal.MTLResourceStorageModeShared)

    def free(self, buffer, nbytes: int) -> None:
        pass   # released with the last Python reference

    def _view(self, buffer, nbytes: int) -> np.ndarray:
        memory = buffer.contents().as_buffer(buffer.length())
        return np.frombuffer(memory, np.uint8, count=nbytes)

    def copyin(self, buffer, source: memoryview) -> None:
        data = np.frombuffer(source, np.uint8)
        self._view(buffer, data.size)[:] = data

    def copyout(self, destination: memoryview, buffer) -> None:
        out = np.frombuffer(destination, np.uint8)
        out[:] = self._view(buffer, out.size)


class MetalCompiler(Compiler):
    """Checks that MSL compiles; the binary is the source itself.

    Metal keeps compiled libraries in its own shader cache, and pyobjc cannot serialize an
    MTLLibrary, so what portkit caches on disk is the (verified) source text.
    """

    def __init__(self, device):
        import Metal

        self.device = device
        self.options = Metal.MTLCompileOptions.new()
        self.options.setFastMathEnabled_(False)    # fast math flushes and approximates
        self.cache_key = f"metal|{device.name()}|fast-math off"

    def library(self, source: str):
        library, error = self.device.newLibraryWithSource_options_error_(source, self.options,
                                                                         None)
        if library is None:
            raise CompileError("the Metal compiler rejected the kernel (the MSL is in .source)",
                               source, str(error.localizedDescription()) if error else "")
        return library

    def compile(self, source: str) -> bytes:
        self.library(source)
        return source.encode()


class MetalProgram(Program):
    """A compute pipeline; a launch is one command buffer with one dispatch."""

    def __init__(self, device, queue, compiler: MetalCompiler, name: str, binary: bytes):
        library = compiler.library(binary.decode())
        function = library.newFunctionWithName_(function_name(name))
        self.pipeline, error = device.newComputePipelineStateWithFunction_error_(function, None)
        if self.pipeline is None:
            raise CompileError(f"no compute pipeline for {name}: {error}")
        self.queue = queue

    def __call__(self, buffers: list, scalars: list[int], grid, block,
                 wait: bool = False) -> float | None:
        import Metal

        commands = self.queue.commandBuffer()
        encoder = commands.computeCommandEncoder()
        encoder.setComputePipelineState_(self.pipeline)
        for index, buffer in enumerate(buffers):
            encoder.setBuffer_offset_atIndex_(buffer, 0, index)
        for index, value in enumerate(scalars, len(buffers)):
            encoder.setBytes_length_atIndex_(ctypes.c_int32(value), 4, index)
        encoder.dispatchThreadgroups_threadsPerThreadgroup_(Metal.MTLSizeMake(*grid),
                                                            Metal.MTLSizeMake(*block))
        encoder.endEncoding()
        commands.commit()
        if not wait:
            return None
        commands.waitUntilCompleted()
        return commands.GPUEndTime() - commands.GPUStartTime()


def _load() -> Device:
    if sys.platform != "darwin":
        raise BackendUnavailable("Metal needs macOS", "run on a Mac (Apple silicon or a "
                                 "Metal-capable GPU); elsewhere use cpu, opencl or webgpu")
    try:
        import Metal
    except ImportError as error:
        raise BackendUnavailable(f"pyobjc-framework-Metal is not installed ({error})",
                                 "pip install 'portkit[metal]'") from None
    device = Metal.MTLCreateSystemDefaultDevice()
    if device is None:
        raise BackendUnavailable("macOS reports no Metal device",
                                 "Metal needs a Metal-capable GPU (not a virtual machine "
                                 "without GPU passthrough)")
    limits = device.maxThreadsPerThreadgroup()
    caps = replace(METAL_CAPABILITIES,
                   max_block=(limits.width, limits.height, limits.depth),
                   max_block_threads=max(limits.width, limits.height, limits.depth),
                   local_memory_bytes=device.maxThreadgroupMemoryLength(),
                   device_name=f"{device.name()} (Metal)")
    queue = device.newCommandQueue()
    compiler = MetalCompiler(device)
    pipelines: dict[bytes, MetalProgram] = {}

    def program(name: str, binary: bytes) -> MetalProgram:
        # A pipeline is made once per kernel source and reused by every launch.
        if binary not in pipelines:
            pipelines[binary] = MetalProgram(device, queue, compiler, name, binary)
        return pipelines[binary]

    def synchronize() -> None:
        commands = queue.commandBuffer()
        commands.commit()
        commands.waitUntilCompleted()   # a queue runs its command buffers in order

    return Device("metal", caps, MetalAllocator(device), MetalRenderer(), compiler, program,
                  synchronize)


backend = Backend("metal", _load, "Metal Shading Language through pyobjc (macOS only)")
