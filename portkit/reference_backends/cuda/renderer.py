"""ABI kernels as CUDA C for NVRTC: the C-style base with CUDA's knobs, and nothing else.

float16 and bfloat16 are held in float and rounded after every op with the same helpers as the
CPU backend (cstyle.FLOAT16_HELPERS; buffers hold their 16 bits). That is exactly the ABI's
rounding on every GPU and needs no `cuda_fp16.h`, which NVRTC does not ship before 13.5. The helpers are plain functions;
NVRTC's `-default-device` makes them device functions.
"""
from __future__ import annotations

from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
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
