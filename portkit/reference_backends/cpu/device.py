"""The device: the host CPU and its C compiler, found, probed and joined into one `Device`.

The compiler is $PORTKIT_CC, else clang, else gcc. It is probed by building the runtime's own
library (its thread pool and batch loop, runtime.py), which needs only C11 and pthreads. The
build goes through the disk cache like a kernel's (same compiler, flags and CPU in the key), so
only a process that finds no earlier build pays the compiler's 0.3-0.5 s.

The CPU is PORTKIT_CPU_DEVICES logical devices ("cpu", "cpu:1", ...), each with its own memory
pool, so that work across devices runs on one machine.
"""
from __future__ import annotations

import functools
import shlex

from portkit import settings
from portkit.abi.backend import Device, host_peer_copy
from portkit.abi.errors import BackendUnavailable, CompileError
from portkit.reference_backends.cpu.capabilities import capabilities
from portkit.reference_backends.cpu.renderer import CPURenderer
from portkit.reference_backends.cpu.runtime import (
    FIX,
    CPUAllocator,
    CPUBatch,
    CPUCompiler,
    CPUProgram,
    build_native,
    find_compiler,
)


def find_device() -> CPUCompiler:
    """A compiler that builds shared objects here; BackendUnavailable naming the fix if there
    is none."""
    command = find_compiler()
    try:
        compiler = CPUCompiler(command)
        build_native(compiler)
        return compiler
    except CompileError as error:
        raise BackendUnavailable(f"{shlex.join(command)} cannot build shared objects: "
                                 f"{error.log.strip()[:300]}", FIX) from None
    except OSError as error:
        raise BackendUnavailable(f"no C compiler found: {shlex.join(command)} failed to run "
                                 f"({error})", FIX) from None


def devices() -> int:
    """How many logical devices the host CPU is: PORTKIT_CPU_DEVICES (default 2). Each has its
    own buffers and runtime, so work across devices (copies, data parallelism) runs and is
    tested on one machine; they share the cores."""
    return settings.read("PORTKIT_CPU_DEVICES")


def load(index: int = 0) -> Device:
    """Logical device `index` of the host CPU; BackendUnavailable (with the fix) without a C
    compiler. Its buffers copy to another host-memory device's in one memcpy (peer_copy)."""
    compiler = find_device()
    caps = capabilities(compiler, index)
    renderer = CPURenderer() if caps.vector_registers is None else CPURenderer(
        caps.vector_registers[1])
    return Device("cpu", caps, CPUAllocator(), renderer,
                  compiler, functools.partial(CPUProgram, compiler=compiler),
                  peer_copy=host_peer_copy,
                  batch=functools.partial(CPUBatch, compiler))
