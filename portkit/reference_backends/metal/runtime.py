"""Runtime: shared-storage buffers (Allocator), the Metal compiler (Compiler) and command-buffer
launches (Program, Batch), through pyobjc.

`newLibraryWithSource` compiles a kernel's MSL (fast math off: the ABI's accuracy), a compute
pipeline is made once per kernel, and each launch is one command buffer that dispatches the
ABI's grid of threadgroups. A Batch encodes all its launches as the dispatches of one compute
encoder in one command buffer, committed once. Buffers are shared-storage MTLBuffers, so copies
are memcpy. pyobjc's `Metal` is imported inside each call: this module imports on any system.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import cast

import numpy as np

from portkit.abi.backend import Allocator, Compiler, Launch, OneByOne, Program
from portkit.abi.errors import CompileError
from portkit.codegen.cstyle import function_name


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
        """The MTLLibrary of `source`; CompileError with Metal's message if it is rejected."""
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
        commands = self.queue.commandBuffer()
        encoder = commands.computeCommandEncoder()
        self.encode(encoder, buffers, scalars, grid, block)
        encoder.endEncoding()
        return submit(commands, wait)

    def encode(self, encoder, buffers: list, scalars: list[int], grid, block) -> None:
        """Encodes one dispatch of this pipeline, with its arguments, on a compute `encoder`."""
        import Metal

        encoder.setComputePipelineState_(self.pipeline)
        for index, buffer in enumerate(buffers):
            encoder.setBuffer_offset_atIndex_(buffer, 0, index)
        if scalars:     # one slot for all of them (see MetalRenderer.render_args)
            words = (ctypes.c_int32 * len(scalars))(*scalars)
            encoder.setBytes_length_atIndex_(words, ctypes.sizeof(words), len(buffers))
        encoder.dispatchThreadgroups_threadsPerThreadgroup_(Metal.MTLSizeMake(*grid),
                                                            Metal.MTLSizeMake(*block))


def submit(commands, wait: bool) -> float | None:
    """Commits a command buffer; with `wait`, waits for it and returns its seconds on the GPU."""
    commands.commit()
    if not wait:
        return None
    commands.waitUntilCompleted()
    return commands.GPUEndTime() - commands.GPUStartTime()


class MetalBatch(OneByOne):
    """Launches as the dispatches of one serial compute encoder, whose dispatches run one
    after another, each seeing the writes of those before it, in one command buffer committed
    once. A command buffer is used once, so each replay encodes a new one from the launches'
    arguments, as last replaced (kept and replaced as `OneByOne` keeps them: `_substitute`)."""

    def __init__(self, queue, launches: list[Launch]):
        super().__init__(launches)
        self.queue = queue

    def __call__(self, buffers: Sequence[tuple[int, int, object]] = (),
                 scalars: Sequence[tuple[int, list[int]]] = (), wait: bool = False
                 ) -> float | None:
        import Metal

        self._substitute(buffers, scalars)
        commands = self.queue.commandBuffer()
        encoder = commands.computeCommandEncoderWithDispatchType_(Metal.MTLDispatchTypeSerial)
        for launch in self.launches:
            cast(MetalProgram, launch.program).encode(encoder, launch.buffers, launch.scalars,
                                                      launch.grid, launch.block)
        encoder.endEncoding()
        return submit(commands, wait)


def synchronize(queue) -> None:
    """Waits for all work on `queue`: an empty command buffer completes after the ones before
    it, since a queue runs its command buffers in order."""
    commands = queue.commandBuffer()
    commands.commit()
    commands.waitUntilCompleted()
