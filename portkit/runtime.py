"""One device, ready to use: buffers, compiled kernels (cached in memory and on disk), launches.

    rt = runtime.get("cpu")
    out, = rt.run(kernel, np.zeros(16, np.float32))

PORTKIT_DEBUG=2 prints one line per launch (name, grid, block, time); 3 adds the kernel's JSON
and 4 its rendered source, both at a kernel's first launch.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from portkit import backends, cache
from portkit.abi.backend import Capabilities, Device, Program
from portkit.abi.dtypes import DType
from portkit.abi.errors import PortkitError
from portkit.abi.kernel import Kernel, validate
from portkit.abi.ops import COMPUTE


class LaunchError(PortkitError, ValueError):
    """Buffers or scalars that do not match the kernel's arguments."""


class Buffer:
    """Device memory holding `size` elements of `dtype`."""

    def __init__(self, device: Device, dtype: DType, size: int):
        self.dtype, self.size, self.nbytes = dtype, size, size * dtype.itemsize
        self._allocator = device.allocator
        self.handle: Any = device.allocator.alloc(self.nbytes)

    def copyin(self, array: np.ndarray) -> Buffer:
        """Copies a host array of the same dtype and size into the buffer; returns the buffer."""
        array = np.ascontiguousarray(array)
        if array.dtype != self.dtype.np or array.size != self.size:
            raise LaunchError(f"cannot copy a {array.dtype} array of {array.size} elements into "
                              f"a {self.dtype.name} buffer of {self.size}; pass "
                              f"array.astype({self.dtype.np.name!r}) of that size")
        self._allocator.copyin(self.handle, memoryview(array.reshape(-1).view(np.uint8)))
        return self

    def numpy(self) -> np.ndarray:
        """The buffer's contents as a new 1-D host array (waits for the device)."""
        out = np.empty(self.size, self.dtype.np)
        self._allocator.copyout(memoryview(out.view(np.uint8)), self.handle)
        return out

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        # At interpreter exit a backend's modules may be gone, and the driver frees the memory.
        if handle is not None and not sys.is_finalizing():
            self._allocator.free(handle, self.nbytes)


@dataclass
class Compiled:
    """A kernel ready to launch: the kernel as run (after decomposition), its source, program."""

    kernel: Kernel
    source: str
    program: Program
    launched: bool = field(default=False, compare=False)


class Runtime:
    """A loaded device with its caches. Get one with `get(name)`."""

    def __init__(self, name: str, device: Device):
        self.name, self.device = name, device
        self._compiled: dict[str, Compiled] = {}

    @property
    def capabilities(self) -> Capabilities:
        return self.device.capabilities

    def alloc(self, dtype: DType, size: int) -> Buffer:
        """A buffer of `size` elements of `dtype` (contents undefined until written)."""
        return Buffer(self.device, dtype, size)

    def compile(self, kernel: Kernel) -> Compiled:
        """Decomposes ops the device lacks, checks, renders and compiles `kernel`, once."""
        # Keyed by the JSON form, not the Kernel: Kernel equality holds -0.0 == 0.0 and
        # NaN != NaN for CONST values, which would share or miss programs wrongly.
        key = kernel.to_json()
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._build(kernel)
        return compiled

    def _build(self, kernel: Kernel) -> Compiled:
        capabilities = self.capabilities
        if {n.op for n in kernel.nodes if n.op in COMPUTE} - capabilities.ops:
            from portkit.codegen.decompose import decompose

            kernel = decompose(kernel, capabilities.ops)
        validate(kernel)
        capabilities.check_launch(kernel)
        source = self.device.renderer.render(kernel)
        binary = cache.compile_cached(self.name, self.device.compiler, source)
        return Compiled(kernel, source, self.device.program(kernel.name, binary))

    def launch(self, compiled: Compiled, buffers: list[Buffer], scalars: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
        """Runs `compiled` on its own grid and block; with `wait`, returns the seconds it took."""
        kernel = compiled.kernel
        _check_arguments(kernel, buffers, scalars)
        level = debug_level()
        seconds = compiled.program([b.handle for b in buffers], list(scalars), kernel.grid,
                                   kernel.block, wait=wait or level >= 2)
        if level >= 2:
            _print_launch(compiled, seconds, level)
        compiled.launched = True
        return seconds if wait else None

    def run(self, kernel: Kernel, *arrays: np.ndarray, scalars: tuple[int, ...] = ()
            ) -> list[np.ndarray]:
        """Uploads `arrays` (one per PARAM, in order), launches, returns every param's array."""
        compiled = self.compile(kernel)
        params = compiled.kernel.params
        if len(arrays) != len(params):
            raise LaunchError(f"kernel {kernel.name!r} takes {len(params)} buffers, "
                              f"got {len(arrays)} arrays")
        arrays = tuple(np.asarray(a) for a in arrays)
        buffers = [self.alloc(p.dtype, a.size).copyin(a) for p, a in zip(params, arrays)]
        self.launch(compiled, buffers, scalars, wait=True)
        return [b.numpy().reshape(a.shape) for b, a in zip(buffers, arrays)]

    def synchronize(self) -> None:
        """Waits until every launched kernel has finished."""
        self.device.synchronize()


def get(name: str | None = None) -> Runtime:
    """The runtime of backend `name` (default: $PORTKIT_DEVICE, else "cpu"), made once."""
    return _get(name or os.environ.get("PORTKIT_DEVICE") or "cpu")


@functools.cache
def _get(name: str) -> Runtime:
    return Runtime(name, backends.load(name))


def debug_level() -> int:
    """PORTKIT_DEBUG as an int (0 when unset)."""
    value = os.environ.get("PORTKIT_DEBUG", "")
    return int(value) if value.isdigit() else 0


def _check_arguments(kernel: Kernel, buffers: list[Buffer], scalars: tuple[int, ...]) -> None:
    params = kernel.params
    if len(buffers) != len(params) or len(scalars) != len(kernel.vars):
        raise LaunchError(f"kernel {kernel.name!r} takes {len(params)} buffers and scalars "
                          f"{kernel.vars}, got {len(buffers)} buffers and {len(scalars)} scalars")
    for param, buffer in zip(params, buffers):
        if buffer.dtype != param.dtype:
            raise LaunchError(f"kernel {kernel.name!r}: buffer {param.arg} must hold "
                              f"{param.dtype.name}, got {buffer.dtype.name}")


def _print_launch(compiled: Compiled, seconds: float | None, level: int) -> None:
    kernel = compiled.kernel
    print(f"portkit: {kernel.name:<28} grid {kernel.grid} block {kernel.block} "
          f"{(seconds or 0.0) * 1e3:9.3f} ms", file=sys.stderr)
    if not compiled.launched and level >= 3:
        print(kernel.to_json(), file=sys.stderr)
        if level >= 4:
            print(compiled.source, file=sys.stderr)
