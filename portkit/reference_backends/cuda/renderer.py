"""ABI kernels as CUDA C for NVRTC: the C-style base with CUDA's knobs, and nothing else.

float16 and bfloat16 are held in float and rounded after every op with the same helpers as the
CPU backend (cstyle.FLOAT16_HELPERS; buffers hold their 16 bits). That is exactly the ABI's
rounding on every GPU and needs no `cuda_fp16.h`, which NVRTC does not ship before 13.5. The helpers are plain functions;
NVRTC's `-default-device` makes them device functions.

Tensor cores: an MMA node on one of MMA_UNITS (m16n8k16, float16 or bfloat16 inputs, float32
sums; sm_80 and newer) is one `mma.sync` in inline PTX. The layout tables are the PTX ISA's
("Matrix Fragments for mma.m16n8k16"): lane = 4·group + thread_in_group; each pair of 16-bit
inputs is packed into one 32-bit register, the lower-numbered element in the low half.
"""
from __future__ import annotations

from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
from portkit.abi.matrix import MatrixUnit, fragment
from portkit.abi.ops import Op
from portkit.codegen.cstyle import EMULATED_FLOATS, FLOAT16_HELPERS, CStyleRenderer

# NVRTC compiles without the C library's headers: the few names the kernels use.
_PRELUDE = """\
#ifndef PK_ONCE_PRELUDE
#define PK_ONCE_PRELUDE
#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
#endif
template <class To, class From> To pk_bitcast(From x) { To y; memcpy(&y, &x, sizeof(y)); return y; }
#endif
"""

_TEMPLATE = """\
{{ prelude }}
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}({{ args | join(", ") }}) {
{% for line in body %}
{{ line }}
{% endfor %}
}
"""

_FLOAT_MULACC = (dtypes.float32, dtypes.float64)


def _m16n8k16(inputs: dtypes.DType) -> MatrixUnit:
    # lane = 4 * g + t; A: rows g, g + 8 and column pairs 2t, 2t + 8; B: row pairs 2t, 2t + 8
    # of column g; C: rows g, g + 8 and columns 2t, 2t + 1
    a = fragment(32, 8, lambda lane, i: (lane // 4 + 8 * (i // 2 % 2),
                                         lane % 4 * 2 + i % 2 + 8 * (i // 4)))
    b = fragment(32, 4, lambda lane, i: (lane % 4 * 2 + i % 2 + 8 * (i // 2), lane // 4))
    c = fragment(32, 4, lambda lane, i: (lane // 4 + 8 * (i // 2), lane % 4 * 2 + i % 2))
    return MatrixUnit(16, 8, 16, 32, inputs, inputs, dtypes.float32, a, b, c)


# The tensor-core shapes this renderer writes, and their PTX type names.
MMA_UNITS = (_m16n8k16(dtypes.float16), _m16n8k16(dtypes.bfloat16))
_PTX_TYPE = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}


class CUDARenderer(CStyleRenderer):
    """CUDA C: one `extern "C" __global__` function per kernel, named like the kernel."""

    local_prefix = "__shared__ "
    barrier = "__syncthreads();"
    workitem: ClassVar[dict[str, str]] = {"group": "((int)blockIdx.{xyz})",
                                          "local": "((int)threadIdx.{xyz})"}
    emulated = EMULATED_FLOATS
    template = _TEMPLATE

    def render_alu(self, op: Op, operands: list[str], dtype: DType) -> str:
        if op is Op.MULACC and dtype in _FLOAT_MULACC:   # one rounding, one instruction
            return f"fma({', '.join(operands)})"
        return super().render_alu(op, operands, dtype)

    def render_mma(self, unit: MatrixUnit, src: list[str]) -> str:
        if unit not in MMA_UNITS:
            return super().render_mma(unit, src)
        store = self.emulated[unit.a_dtype].store      # a float holding a 16-bit value: its bits

        def pairs(values: list[str]) -> list[str]:
            return [f"(uint32_t){store.format(lo)} | ((uint32_t){store.format(hi)} << 16)"
                    for lo, hi in zip(values[::2], values[1::2])]

        a, b, c = src[:8], src[8:12], src[12:]
        kind = _PTX_TYPE[unit.a_dtype]
        return (f'asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 '
                '{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};" : '
                + ", ".join(f'"+f"({x})' for x in c) + " : "
                + ", ".join(f'"r"({x})' for x in pairs(a) + pairs(b)) + ");")

    def render_bitcast(self, expr: str, src: DType, dst: DType) -> str:
        return f"pk_bitcast<{self.value_type(dst)}>({expr})"

    def prelude(self, kernel: Kernel) -> str:
        used = {n.dtype for n in kernel.nodes}
        # guarded: a batch (cstyle.compile_joined) is many kernels in one program
        helpers = ("#ifndef PK_ONCE_FLOAT16_HELPERS\n#define PK_ONCE_FLOAT16_HELPERS\n"
                   f"{FLOAT16_HELPERS}#endif\n") if used & set(self.emulated) else ""
        return _PRELUDE + helpers

    def template_context(self, kernel: Kernel, body: list[str]) -> dict:
        x, y, z = kernel.block
        return {**super().template_context(kernel, body), "threads": x * y * z}
