"""ABI kernels as CUDA C for NVRTC: the C-style base with CUDA's knobs, and nothing else.

float16 and bfloat16 are held in float and rounded after every op with the same helpers as the
CPU backend (emulated.FLOAT16_HELPERS; buffers hold their 16 bits). That is exactly the ABI's
rounding on every GPU and needs no `cuda_fp16.h`, which NVRTC does not ship before 13.5. The helpers are plain functions;
NVRTC's `-default-device` makes them device functions.

Tensor cores: an MMA node on one of MMA_UNITS (m16n8k16, float16 or bfloat16 inputs, float32
sums; sm_80 and newer) is one `mma.sync` in inline PTX. The layout tables are the PTX ISA's
("Matrix Fragments for mma.m16n8k16"): lane = 4·group + thread_in_group; each pair of 16-bit
inputs is packed into one 32-bit register, the lower-numbered element in the low half. The
instruction sits in a helper, `pk_mma_<type>`; compiled as host C++ (the conformance shim, no
__CUDA_ARCH__) the helper computes the same tile from the warp's registers, gathered through
shared memory between two barriers, so the packing and layout are tested without a GPU.
"""
from __future__ import annotations

from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.kernel import Kernel
from portkit.abi.matrix import MatrixUnit, fragment
from portkit.abi.ops import Op
from portkit.codegen.cstyle import CStyleRenderer
from portkit.codegen.emulated import EMULATED_FLOATS, FLOAT16_HELPERS

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
{% set threads = kernel.block[0] * kernel.block[1] * kernel.block[2] %}
extern "C" __global__ void __launch_bounds__({{ threads }}) {{ name }}({{ args | join(", ") }}) {
{% for line in body %}
{{ line }}
{% endfor %}
}
"""


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

# mma.sync m16n8k16 with float32 sums; on the host (the shim), the tile the PTX ISA defines,
# summed in float32 in k order from exact products. {kind}: f16 or bf16; {load}: 16 bits ->
# float.
_MMA_HELPER = """\
#ifndef PK_ONCE_MMA_{kind}
#define PK_ONCE_MMA_{kind}
__device__ __forceinline__ void pk_mma_{kind}(float *c, uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {{
#ifdef __CUDA_ARCH__
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 {{%0, %1, %2, %3}}, "
               "{{%4, %5, %6, %7}}, {{%8, %9}}, {{%0, %1, %2, %3}};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __shared__ uint32_t regs[32][32][6];      /* [warp][lane]: a0..a3, b0, b1 */
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const uint32_t mine[6] = {{a0, a1, a2, a3, b0, b1}};
  for (int r = 0; r < 6; r++) regs[warp][lane][r] = mine[r];
  __syncthreads();
  for (int i = 0; i < 4; i++) {{
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float sum = c[i];
    for (int k = 0; k < 16; k++) {{
      /* A[row][k]: lane 4 * (row % 8) + k % 8 / 2, element 2 * (k / 8 * 2 + row / 8) + k % 2 */
      const uint32_t a = regs[warp][4 * (row % 8) + k % 8 / 2][k / 8 * 2 + row / 8];
      /* B[k][col]: lane 4 * col + k % 8 / 2, register k / 8, half k % 2 */
      const uint32_t b = regs[warp][4 * col + k % 8 / 2][4 + k / 8];
      sum += {load}((uint16_t)(a >> 16 * (k % 2))) * {load}((uint16_t)(b >> 16 * (k % 2)));
    }}
    c[i] = sum;
  }}
  __syncthreads();
#endif
}}
#endif
"""


class CUDARenderer(CStyleRenderer):
    """CUDA C: one `extern "C" __global__` function per kernel, named like the kernel."""

    local_declaration = "__shared__ {type} {name}[{size}];"
    barrier = "__syncthreads();"
    workitem: ClassVar[dict[str, str]] = {"group": "((int)blockIdx.{xyz})",
                                          "local": "((int)threadIdx.{xyz})"}
    emulated = EMULATED_FLOATS
    fma_dtypes = (dtypes.float32, dtypes.float64)   # one rounding, one instruction
    bitcast_format = "pk_bitcast<{dst}>({expr})"
    template = _TEMPLATE

    def render_mma(self, unit: MatrixUnit, src: list[str]) -> str:
        if unit not in MMA_UNITS:
            return super().render_mma(unit, src)
        store = self.emulated[unit.a_dtype].store      # a float holding a 16-bit value: its bits

        def pairs(values: list[str]) -> list[str]:
            return [f"(uint32_t){store.format(lo)} | ((uint32_t){store.format(hi)} << 16)"
                    for lo, hi in zip(values[::2], values[1::2])]

        a, b, c = src[:8], src[8:12], src[12:]
        # the helper takes C as one array; the registers are copied in and back out
        return ("{ float c[4] = {" + ", ".join(c) + "}; "
                f"pk_mma_{_PTX_TYPE[unit.a_dtype]}(c, " + ", ".join(pairs(a) + pairs(b))
                + "); " + " ".join(f"{x} = c[{i}];" for i, x in enumerate(c)) + " }")

    def prelude(self, kernel: Kernel) -> str:
        used = {n.dtype for n in kernel.nodes}
        # guarded: a batch (cstyle.compile_joined) is many kernels in one program
        helpers = ("#ifndef PK_ONCE_FLOAT16_HELPERS\n#define PK_ONCE_FLOAT16_HELPERS\n"
                   f"{FLOAT16_HELPERS}#endif\n") if used & set(self.emulated) else ""
        units = {n.arg for n in kernel.nodes if n.op is Op.MMA} & set(MMA_UNITS)
        for unit in sorted(units, key=lambda u: u.name):
            emulated = self.emulated[unit.a_dtype]
            helpers += _MMA_HELPER.format(kind=_PTX_TYPE[unit.a_dtype],
                                          load=emulated.load.removesuffix("({})"))
        return _PRELUDE + helpers
