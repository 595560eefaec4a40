"""The datasheet: what the host CPU runs, as portkit reads it. portkit assumes nothing else.

C has every compute op, and float16 and bfloat16 are emulated in float (renderer.py), so every
dtype and op is native. The limits are generous rather than hardware facts: a workgroup's
threads are a loop (split at each barrier), and workgroup memory is a stack array.
"""
from __future__ import annotations

import os

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.ops import COMPUTE
from portkit.reference_backends.cpu.runtime import CPUCompiler, cpu_model


def capabilities(compiler: CPUCompiler, index: int = 0) -> Capabilities:
    """What the host CPU runs with `compiler`, as logical device `index`; the name says how
    many cores it uses and, past the first, which logical device it is."""
    cores = (f"{os.cpu_count()} cores, OpenMP" if compiler.openmp
             else "1 core: no OpenMP in the compiler")
    logical = f", logical device {index}" if index else ""
    return Capabilities(
        dtypes=frozenset(dtypes.ALL), ops=frozenset(COMPUTE), max_block_threads=1024,
        max_block=(1024, 1024, 64), max_grid=(2**31 - 1, 65535, 65535),
        local_memory_bytes=64 * 1024, max_buffers=64, denormals="preserve",
        threads_are_loops=True,
        max_loop_trips=None, max_name_length=None,   # C compilers limit neither
        # No peak_gflops / peak_bandwidth_gbs: the peaks are the host's, and tier 6's plain
        # kernels reach a small fraction of them here (docs/conformance.md, Performance).
        device_name=f"{cpu_model()} ({cores}; {compiler.version}){logical}")
