"""The datasheet: what the {{ cookiecutter.name }} device can do. portkit assumes nothing else.

Starter: blank, so it declares the least the ABI accepts. Raise each number to your chip's
real limits as its parts start to pass conformance (docs/porting.md, "Capabilities").
Codegen rewrites the compute ops missing from `ops` into ones that are listed; conformance
reports cases on dtypes missing from `dtypes` as "unsupported". Be honest: a wrong "yes"
fails conformance, a "no" only costs coverage or speed.
"""
from portkit.abi import Capabilities, dtypes
from portkit.abi.ops import REQUIRED


def capabilities() -> Capabilities:
    """This device's capabilities."""
    return Capabilities(
        dtypes=frozenset({dtypes.bool_, dtypes.int32, dtypes.float32}),  # the ABI's minimum
        ops=frozenset(REQUIRED),   # portkit decomposes the OPTIONAL ops into these
        max_block_threads=64, max_block=(64, 64, 64),   # threads per workgroup
        max_grid=(65535, 65535, 65535),                 # workgroups per axis
        local_memory_bytes=0,      # no workgroup memory (LOCAL) yet
        max_buffers=8,
        threads_are_loops=False,   # True if a workgroup's threads run one after another
        max_loop_trips=None,       # iterations a thread's loops may run in all, if limited
        max_name_length=62,        # longest kernel name your compiler and driver take
        max_scalars=None,          # scalar arguments one launch takes, if limited (Vulkan: 32)
        compute_units=None,        # workgroups run at once (cores, SMs): codegen fills them
        device_name="{{ cookiecutter.name }} (blank starter: nothing implemented yet)")
