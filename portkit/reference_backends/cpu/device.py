"""The device: the host CPU and its C compiler, found, probed and joined into one `Device`.

The compiler is $PORTKIT_CC, else clang, else gcc. It is probed with a small OpenMP program: a
compiler without OpenMP (clang without libomp) still builds kernels, on one core. The probe's
build goes through the disk cache like a kernel's (same compiler, flags and CPU in the key), so
only a process that finds no earlier build pays the compiler's 0.3-0.5 s.

The CPU is PORTKIT_CPU_DEVICES logical devices ("cpu", "cpu:1", ...), each with its own memory
pool, so that work across devices runs on one machine.
"""
from __future__ import annotations

import functools
import shlex

from portkit import cache, settings
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
    find_compiler,
)

_PROBE = "int pk_probe(void) {\n  int n = 0;\n  #pragma omp parallel\n  n = 1;\n  return n;\n}\n"


def find_device() -> CPUCompiler:
    """A compiler that builds shared objects here, with OpenMP if it can; BackendUnavailable
    naming the fix if there is none."""
    command = find_compiler()
    for openmp in (True, False):
        try:
            compiler = CPUCompiler(command, openmp)
            cache.compile_cached("cpu", compiler, _PROBE)
            return compiler
        except CompileError as error:
            log = error.log.strip()
        except OSError as error:
            raise BackendUnavailable(f"no C compiler found: {shlex.join(command)} failed to "
                                     f"run ({error})", FIX) from None
    raise BackendUnavailable(f"{shlex.join(command)} cannot build shared objects: {log[:300]}",
                             FIX)


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
                  compiler, CPUProgram, peer_copy=host_peer_copy,
                  batch=functools.partial(CPUBatch, compiler))
