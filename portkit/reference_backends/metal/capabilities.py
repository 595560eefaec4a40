"""The datasheet: what a Metal GPU can do. portkit reads this and assumes nothing else.

The defaults are what every Apple GPU since the A11 offers; `device.load` passes the device's
own limits, and the conformance shims use the defaults as a typical Metal GPU.
"""
from __future__ import annotations

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.kernel import Dim3
from portkit.abi.ops import COMPUTE


def capabilities(max_block: Dim3 = (1024, 1024, 1024), local_memory_bytes: int = 32 * 1024,
                 device_name: str = "Metal") -> Capabilities:
    """A Metal GPU with these threadgroup limits."""
    return Capabilities(
        dtypes=frozenset(dtypes.ALL) - {dtypes.float64},    # MSL has no double
        ops=frozenset(COMPUTE), max_block_threads=max(max_block), max_block=max_block,
        max_grid=(2**31 - 1, 65535, 65535), local_memory_bytes=local_memory_bytes,
        max_buffers=30,              # [[buffer(0..29)]]; slot 30 at most holds the scalars
        denormals="flush",           # MSL lets float32 denormals be flushed to zero
        threads_are_loops=False,     # threads are hardware lanes
        max_name_length=62,          # not measured: the 64-character function names known to load
        device_name=device_name)
