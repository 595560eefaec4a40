"""The datasheet: the interpreter runs every dtype and op of the spec, exactly as the spec says,
within limits generous enough for any kernel the stack writes."""
from __future__ import annotations

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.ops import COMPUTE


def capabilities() -> Capabilities:
    """What the interpreter runs."""
    return Capabilities(
        dtypes=frozenset(dtypes.ALL), ops=frozenset(COMPUTE), max_block_threads=1024,
        max_block=(1024, 1024, 64), max_grid=(2**31 - 1, 65535, 65535),
        local_memory_bytes=64 * 1024, max_buffers=64, device_name="numpy")
