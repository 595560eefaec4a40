"""The datasheet: what the host CPU runs, as portkit reads it. portkit assumes nothing else.

C has every compute op, and float16 and bfloat16 are emulated in float (renderer.py), so every
dtype and op is native. The limits are generous rather than hardware facts: a workgroup's
threads are a loop (split at each barrier), and workgroup memory is a stack array of up to
1 MiB (an L2's worth: codegen keeps its hot blocks within 64 KiB of it, and only the running
sums of a staged operand's several panels take more; codegen/plan.py HOT_BYTES). The vector
registers are the host's, read from its feature flags: codegen sizes its register blocks to them.
So are the matrix units: a CPU with AVX-512 BF16 declares vdpbf16ps (renderer.DPBF16), which
codegen/pack.py runs bfloat16 matmuls on, and one with AVX-512 VNNI vpdpbusd (renderer.DPBUSD,
uint8 x int8 -> int32); elsewhere the CPU declares none.
"""
from __future__ import annotations

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.matrix import MatrixUnit
from portkit.abi.ops import COMPUTE
from portkit.reference_backends.cpu.renderer import DPBF16, DPBUSD
from portkit.reference_backends.cpu.runtime import CPUCompiler, cpu_flags, cpu_model, threads


def capabilities(compiler: CPUCompiler, index: int = 0) -> Capabilities:
    """What the host CPU runs with `compiler`, as logical device `index`; the name says how
    many threads a launch runs on (runtime.threads) and, past the first, which logical device
    it is."""
    count = threads()
    cores = f"{count} thread{'s' if count > 1 else ''}"
    logical = f", logical device {index}" if index else ""
    flags = cpu_flags()
    return Capabilities(
        dtypes=frozenset(dtypes.ALL), ops=frozenset(COMPUTE), max_block_threads=1024,
        max_block=(1024, 1024, 64), max_grid=(2**31 - 1, 65535, 65535),
        local_memory_bytes=1024 * 1024, max_buffers=64, denormals="preserve",
        threads_are_loops=True,
        max_loop_trips=None, max_name_length=None,   # C compilers limit neither
        vector_registers=vector_registers(flags), matrix_units=matrix_units(flags),
        compute_units=count,     # each launch's workgroups are shared among these threads
        # No peak_gflops / peak_bandwidth_gbs: the peaks are the host's, and tier 6's plain
        # kernels reach a small fraction of them here (docs/conformance.md, Performance).
        device_name=f"{cpu_model()} ({cores}; {compiler.version}){logical}")


# (flag, registers, bytes each), widest first: x86-64's AVX-512 (zmm0-31), AVX (ymm0-15), SSE
# (xmm0-15, in every x86-64), and Arm's Advanced SIMD (v0-31), as /proc/cpuinfo names them.
_REGISTER_FILES = (("avx512f", 32, 64), ("avx", 16, 32), ("sse2", 16, 16), ("asimd", 32, 16))


def vector_registers(flags: set[str]) -> tuple[int, int] | None:
    """(registers, bytes each) of the widest vector register file the CPU `flags` name; None
    where they name none of them (codegen then assumes AVX-512's)."""
    for flag, count, size in _REGISTER_FILES:
        if flag in flags:
            return count, size
    return None


# (flag, unit): the instructions renderer.py writes as matrix units, by the flag that has them
_MATRIX_UNITS = (("avx512_bf16", DPBF16), ("avx512_vnni", DPBUSD))


def matrix_units(flags: set[str]) -> tuple[MatrixUnit, ...]:
    """The matrix units the CPU `flags` name (the compiler's -march=native then has them too):
    vdpbf16ps with AVX-512 BF16, vpdpbusd with AVX-512 VNNI."""
    return tuple(unit for flag, unit in _MATRIX_UNITS if flag in flags)
