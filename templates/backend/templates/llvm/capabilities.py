"""The datasheet: what the {{ cookiecutter.name }} device can do. portkit assumes nothing else.

Starter: llvm, which runs on the host CPU through LLVM's JIT, so these are host facts: every
integer dtype, float32 and float64; the required ops plus the optional ones LLVM IR has one
instruction for (codegen decomposes EXP2, LOG2, SIN and MULACC into these). A workgroup's
threads are loops (portkit.codegen.loops), so LOCAL memory is a stack array. One matrix unit,
an example (renderer.DOT2), which float32 matmuls run on. float16 and bfloat16 are left out:
on x86 LLVM turns their conversions into compiler-rt calls (__truncsfhf2, __truncsfbf2, ...)
that MCJIT cannot resolve in a Python process, and a call to an unresolved one is a segfault
(float16 works only where the CPU has F16C). Change each line
to your chip's facts as its parts pass conformance (docs/porting.md, "Capabilities").
"""
from portkit.abi import Capabilities, dtypes
from portkit.abi.ops import REQUIRED, Op
from {{ cookiecutter.__module }}.renderer import DOT2

DTYPES = {dtypes.bool_, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8,
          dtypes.uint16, dtypes.uint32, dtypes.uint64, dtypes.float32, dtypes.float64}


def capabilities(cpu: str) -> Capabilities:
    """This device's capabilities; `cpu` is the host CPU that LLVM compiles for."""
    return Capabilities(
        dtypes=frozenset(DTYPES),
        ops=frozenset(REQUIRED | {Op.NEG, Op.SUB, Op.MAX, Op.RECIP, Op.TRUNC}),
        max_block_threads=256, max_block=(256, 256, 64),   # threads per workgroup
        max_grid=(2**31 - 1, 65535, 65535),                 # workgroups per axis
        local_memory_bytes=32 * 1024,   # LOCAL arrays live on the stack
        max_buffers=32,
        threads_are_loops=True,         # codegen gives it one thread per group, long chunks
        max_loop_trips=None,            # no loop budget on the host
        max_name_length=None,           # LLVM symbols take names of any length
        matrix_units=(DOT2,),           # an example unit, rendered as vector ops (renderer.py)
        device_name=f"{{ cookiecutter.name }} (llvm starter: LLVM JIT on the host CPU, {cpu})")
