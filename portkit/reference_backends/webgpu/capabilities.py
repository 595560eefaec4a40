"""The datasheet: what a WebGPU adapter can do, read from its features and limits.

WGSL has no 64-bit types; the rest is native, packed (8/16-bit, bool) or emulated (bfloat16).
"""
from __future__ import annotations

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.ops import COMPUTE, Op

DTYPES = frozenset(d for d in dtypes.ALL if d.bits < 64)

# Builtins that miss the ABI's budget on lavapipe (exp2 and log2 flush denormals, sin loses
# its range reduction on large arguments): codegen decomposes them into exact ops.
INACCURATE = frozenset({Op.EXP2, Op.LOG2, Op.SIN})


def capabilities(adapter) -> Capabilities:
    """What `adapter` (a wgpu GPUAdapter) can do."""
    limits, info = adapter.limits, adapter.info
    max_block = tuple(limits[f"max-compute-workgroup-size-{axis}"] for axis in "xyz")
    return Capabilities(
        dtypes=DTYPES if "shader-f16" in adapter.features else DTYPES - {dtypes.float16},
        ops=frozenset(COMPUTE) - INACCURATE,
        max_block_threads=limits["max-compute-invocations-per-workgroup"], max_block=max_block,
        max_grid=(limits["max-compute-workgroups-per-dimension"],) * 3,
        local_memory_bytes=limits["max-compute-workgroup-storage-size"],
        max_buffers=limits["max-storage-buffers-per-shader-stage"],
        max_buffer_bytes=min(limits["max-storage-buffer-binding-size"],
                             limits["max-buffer-size"]),
        threads_are_loops=False,   # invocations are lanes (lavapipe vectorizes them itself)
        # llvmpipe (lavapipe) stops a shader after 65,535 loop iterations in all, silently;
        # names of 100,000 characters ran.
        max_loop_trips=65535 if "llvmpipe" in info["device"] else None,
        device_name=f"{info['device']} ({info['backend_type']})")
