"""The datasheet: what an OpenCL device can do, read from its properties and extensions.

portkit reads this and assumes nothing else. Codegen rewrites the compute ops missing from
`ops` into ones that are listed; conformance reports cases on dtypes missing from `dtypes` as
"unsupported" and checks every limit. A wrong "yes" fails conformance, a "no" only costs
coverage or speed.
"""
from __future__ import annotations

try:
    import pyopencl as cl
except ImportError:   # device.find_device reports the backend unavailable, with the fix
    cl = None

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.ops import COMPUTE


def capabilities(device) -> Capabilities:
    """What `device` (a pyopencl Device) can do."""
    extensions = device.extensions.split()
    fp64 = "cl_khr_fp64" in extensions or bool(device.double_fp_config)
    threads = device.max_work_group_size
    denormal = device.single_fp_config & cl.device_fp_config.DENORM
    return Capabilities(
        # float16 and bfloat16 compute in float where the device lacks cl_khr_fp16
        # (renderer.py); float64 only where the device has it.
        dtypes=frozenset(d for d in dtypes.ALL if d != dtypes.float64 or fp64),
        # OpenCL C has every compute op. List only REQUIRED ops (portkit.abi.ops) and portkit
        # decomposes the rest, e.g. MAX into CMPLT and WHERE.
        ops=frozenset(COMPUTE),
        max_block_threads=threads,
        max_block=tuple(min(s, threads) for s in device.max_work_item_sizes[:3]),
        max_grid=(2**31 - 1, 65535, 65535),   # grid * block must stay an int32 thread index
        local_memory_bytes=device.local_mem_size,
        # half the argument space for buffer pointers, the rest for scalars
        max_buffers=device.max_parameter_size // (device.address_bits // 8) // 2,
        max_buffer_bytes=device.max_mem_alloc_size,
        denormals="preserve" if denormal else "flush",
        # A CPU device (PoCL's) runs a workgroup's work-items as loops: codegen then lays out
        # work as for the cpu backend (one work-item per group, packed matmuls in LOCAL).
        threads_are_loops=bool(device.type & cl.device_type.CPU),
        compute_units=device.max_compute_units,
        # PoCL 3.1 aborts the process (SIGABRT in its kernel cache) on a function name of
        # more than 252 characters; the C-style renderer puts "k_" before the kernel's name.
        max_name_length=250,
        device_name=f"{device.name} ({device.platform.name})")
