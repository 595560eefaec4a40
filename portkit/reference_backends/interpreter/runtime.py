"""Memory, toolchain and launch: host memory, the JSON as the binary, and a program that runs
the kernel in the ABI interpreter, every thread a lane of one numpy vector."""
from __future__ import annotations

from portkit.abi.backend import Compiler, HostAllocator, Program
from portkit.abi.interpreter import run
from portkit.abi.kernel import Kernel, validate


class InterpreterAllocator(HostAllocator):
    """Host memory: a buffer is a numpy byte array."""


class InterpreterCompiler(Compiler):
    """Nothing to compile: the source (JSON) is the binary."""

    cache_key = "interpreter"

    def compile(self, source: str) -> bytes:
        return source.encode()


class InterpreterProgram(Program):
    """A kernel read back from its JSON, run by `abi.interpreter.run` at each launch."""

    def __init__(self, name: str, binary: bytes):
        self.kernel = validate(Kernel.from_json(binary.decode()))

    def __call__(self, buffers, scalars, grid, block, wait=False):
        params = self.kernel.params
        typed = [b[:b.size - b.size % p.dtype.itemsize].view(p.dtype.np)
                 for b, p in zip(buffers, params)]
        run(self.kernel, typed, scalars, grid, block)
        return 0.0 if wait else None
