"""EXP2 on float32 as inline C with no call and no branch, which C and OpenCL C share.

A compiler keeps a loop scalar around a call to the math library's exp2: clang around libm's
exp2f on the cpu backend, and PoCL around OpenCL's exp2 (a GELU over 1.2 million floats, its
erf one exponential each, took 76 ms on PoCL with `exp2` and 2.6 ms with this). `pk_exp2f` has
neither, so loops over it vectorize. 1 ulp at most on every float32 (checked against exp2 in
double): a = n + f with n = rint(a), |f| <= 1/2; a minimax polynomial for 2^f; 2^n in two
halves built from exponent bits (a union, which both languages define), each a normal float,
so that a subnormal result rounds once. Past -151 the result is 0, past 128 inf. It relies on
each operation rounding on its own (no contraction into fma, no fast-math): both renderers
turn contraction off.
"""
from __future__ import annotations

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op


def spelling(a: str, dtype: DType) -> str:
    """EXP2 of `a`: pk_exp2f on float (and the small floats, computed in float); double keeps
    the language's exp2."""
    return f"pk_exp2f({a})" if dtype == dtypes.float32 else f"exp2({a})"


def needed(kernel: Kernel) -> bool:
    """Whether `kernel` computes an EXP2 in float, so its source needs EXP2F."""
    return any(n.op is Op.EXP2 and n.dtype != dtypes.float64 for n in kernel.nodes)


# 2^f on |f| <= 1/2, highest power first (a minimax polynomial; Tensor.exp evaluates it too)
POLYNOMIAL = (1.5353362e-4, 1.3398874e-3, 9.618437e-3, 5.5503324e-2, 2.4022648e-1, 6.931472e-1,
              1.0)
# guarded: a batch (codegen.cstyle.compile_joined) is many kernels in one file
EXP2F = """\
#ifndef PK_ONCE_EXP2F
#define PK_ONCE_EXP2F
static inline float pk_exp2f(float a) {
  float x = a > -151.0f ? a : -151.0f;  /* NaN too: the conversion to int must be defined */
  x = x < 128.0f ? x : 128.0f;
  const float n = (x + 0x1.8p23f) - 0x1.8p23f;  /* rounds to nearest even: |x| < 2^22 */
  const float f = x - n;
""" + f"  float p = {POLYNOMIAL[0]!r}f;\n" + "".join(
    f"  p = p * f + {c!r}f;\n" for c in POLYNOMIAL[1:]) + """\
  const int k = (int)n, low = k >> 1;
  const union { int bits; float value; } two_low = {(low + 127) << 23},
                                         two_rest = {(k - low + 127) << 23};
  const float y = p * two_low.value * two_rest.value;
  return a != a ? a : y;
}
#endif
"""
