"""The datasheet: what the {{ cookiecutter.name }} device can do. portkit assumes nothing else.

Codegen rewrites the compute ops missing from `ops` into ones that are listed; conformance
reports cases on dtypes missing from `dtypes` as "unsupported" and checks every limit. Be
honest: a wrong "yes" fails conformance, a "no" only costs coverage or speed.
"""
from portkit.abi import Capabilities, dtypes
from portkit.abi.ops import COMPUTE


def capabilities(device_name: str) -> Capabilities:
    """This device's capabilities."""
    return Capabilities(
        # C has no arithmetic type for float16 and bfloat16; the CPU reference backend shows
        # how to emulate them. Left out here, their conformance cases read "unsupported".
        dtypes=frozenset(d for d in dtypes.ALL if d not in (dtypes.float16, dtypes.bfloat16)),
        # C has every compute op. List only REQUIRED ops (portkit.abi.ops) and portkit
        # decomposes the rest, e.g. MAX into CMPLT and WHERE.
        ops=frozenset(COMPUTE),
        max_block_threads=1024, max_block=(1024, 1024, 64),   # threads per workgroup
        max_grid=(2**31 - 1, 65535, 65535),                   # workgroups per axis
        # Threads run one after another (see renderer.py), so they cannot wait for each other
        # at a BARRIER: no workgroup memory. Kernels that use it report "unsupported".
        local_memory_bytes=0,
        max_buffers=32,
        device_name=device_name)
