"""The datasheet: the interpreter runs every dtype and op of the spec, exactly as the spec says,
within limits generous enough for any kernel the stack writes. It declares matrix units only when
asked (`capabilities(matrix_units=True)`), so the stack's MMA path can be tested end to end here
while the plain interpreter keeps checking the scalar path."""
from __future__ import annotations

from portkit.abi import dtypes
from portkit.abi.backend import Capabilities
from portkit.abi.matrix import MatrixUnit, row_per_thread
from portkit.abi.ops import COMPUTE

# 8×8×8 tiles on 8 threads, float32 and float16 inputs, float32 sums.
MATRIX_UNITS: tuple[MatrixUnit, ...] = (
    row_per_thread(8, dtypes.float32, dtypes.float32),
    row_per_thread(8, dtypes.float16, dtypes.float32),
)


def capabilities(matrix_units: bool = False) -> Capabilities:
    """What the interpreter runs; with `matrix_units`, MATRIX_UNITS too."""
    return Capabilities(
        dtypes=frozenset(dtypes.ALL), ops=frozenset(COMPUTE), max_block_threads=1024,
        max_block=(1024, 1024, 64), max_grid=(2**31 - 1, 65535, 65535),
        local_memory_bytes=64 * 1024, max_buffers=64,
        matrix_units=MATRIX_UNITS if matrix_units else (), device_name="numpy")
