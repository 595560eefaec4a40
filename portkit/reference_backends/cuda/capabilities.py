"""The datasheet: what an NVIDIA GPU can do, read from its attributes, and what it is compiled
for. portkit reads this and assumes nothing else."""
from __future__ import annotations

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.ops import COMPUTE
from portkit.reference_backends.cuda.renderer import MMA_UNITS
from portkit.reference_backends.cuda.runtime import CUDACompiler, CUDAContext, check, driver


def capabilities(context: CUDAContext, compiler: CUDACompiler) -> Capabilities:
    """What the device reports: limits, shared memory, name; and what it is compiled for."""
    a = context.attribute
    major, minor = context.compute_capability()
    name = check(driver().cuDeviceGetName(256, context.device), "cuDeviceGetName")
    name = name.split(b"\0", 1)[0].decode()
    return Capabilities(
        # float16/bfloat16 compute in float (see renderer.py), so every GPU runs every dtype.
        dtypes=frozenset(dtypes.ALL), ops=frozenset(COMPUTE),
        max_block_threads=a("MAX_THREADS_PER_BLOCK"),
        max_block=(a("MAX_BLOCK_DIM_X"), a("MAX_BLOCK_DIM_Y"), a("MAX_BLOCK_DIM_Z")),
        max_grid=(a("MAX_GRID_DIM_X"), a("MAX_GRID_DIM_Y"), a("MAX_GRID_DIM_Z")),
        local_memory_bytes=a("MAX_SHARED_MEMORY_PER_BLOCK"),
        max_buffers=256,   # 8-byte pointers in the 4 KiB of kernel parameters, with room
        denormals="preserve",   # -ftz=false
        threads_are_loops=False,   # threads are hardware lanes
        compute_units=a("MULTIPROCESSOR_COUNT"),
        # NVRTC compiles names of 100,000 characters; the driver's limit is not measured yet,
        # so names stay at the 64-character function names ("k_" + 62) known to load.
        max_name_length=62,
        # mma.sync m16n8k16 with float16 and bfloat16 inputs needs sm_80 (Ampere) or newer
        matrix_units=MMA_UNITS if major >= 8 else (),
        peak_bandwidth_gbs=a("GLOBAL_MEMORY_BUS_WIDTH") / 8 * a("MEMORY_CLOCK_RATE") * 2 / 1e6,
        device_name=f"{name} (compute capability {major}.{minor}; {compiler.version} "
                    f"-arch={compiler.arch})")
