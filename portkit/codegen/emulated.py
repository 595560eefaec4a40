"""Dtypes without an arithmetic type in a language: how `CStyleRenderer` holds them (`Emulated`),
and the C that C, CUDA C and MSL share for float16 and bfloat16 held in a float.
"""
from __future__ import annotations

from dataclasses import dataclass

from portkit.abi import dtypes


@dataclass(frozen=True)
class Emulated:
    """How a dtype with no arithmetic type in the language is held and computed.

    Values live in `value_type` (e.g. float) holding exact values of the dtype; each op computes
    in it and `round` brings the result back to the dtype. Buffers hold `storage_type` (its raw
    bits); `load` and `store` convert. All three are format strings with one `{}`.
    """

    value_type: str
    storage_type: str
    load: str
    store: str
    round: str


# bfloat16 held in a float, in the C that C, CUDA C and MSL share: buffers hold its top 16 bits
# and pk_bf16_nearest rounds a float to it. A float's bits are read with pk_bits / pk_float,
# which each language defines (memcpy in C, as_type in MSL).
BFLOAT16_HELPERS = """\
static inline float pk_bf16_load(uint16_t h) { return pk_float((uint32_t)h << 16); }
static inline uint16_t pk_bf16_store(float f) { return (uint16_t)(pk_bits(f) >> 16); }
static inline float pk_bf16_nearest(float f) {   /* nearest-even; a NaN stays NaN */
  const uint32_t u = pk_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return pk_float((u | 0x00400000u) & 0xffff0000u);
  return pk_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}
"""

# float16 and bfloat16 held in a float, for C and CUDA C (see EMULATED_FLOATS): any double is
# rounded once to either, through a float rounded to odd. Buffers hold the 16 bits.
FLOAT16_HELPERS = """\
static inline uint32_t pk_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float pk_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
""" + BFLOAT16_HELPERS + """
/* x rounded to float toward zero, with the lowest bit set when inexact ("round to odd"):
   rounding that once more to 16 bits gives the same result as rounding x directly. */
static inline float pk_round_odd(double x) {
  const float f = (float)x;
  if ((double)f == x || x != x) return f;
  const uint32_t u = pk_bits(f) - (fabs((double)f) > fabs(x));
  return pk_float(u | 1u);
}
static inline float pk_bf16(double x) { return pk_bf16_nearest(pk_round_odd(x)); }

static inline float pk_f16(double x) {
  const float f = pk_round_odd(x);
  const uint32_t u = pk_bits(f), sign = u & 0x80000000u, a = u ^ sign;
  if (a > 0x7f800000u) return pk_float(u | 0x00400000u);               /* NaN */
  if (a >= 0x477ff000u) return pk_float(sign | 0x7f800000u);           /* >= 65520: inf */
  if (a < 0x38800000u) {                       /* below 2^-14: a multiple of 2^-24 */
    const float r = (fabsf(f) + 0x1p-1f) - 0x1p-1f;
    return pk_float(sign | pk_bits(r));
  }
  return pk_float(sign | ((a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u));
}
static inline float pk_f16_load(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) return pk_float(sign | pk_bits((float)m * 0x1p-24f));   /* zero, subnormal */
  return pk_float(sign | (e == 31 ? 0x7f800000u : (e + 112u) << 23) | (m << 13));
}
static inline uint16_t pk_f16_store(float f) {
  const uint32_t u = pk_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) {                                   /* NaN: keep the payload */
    const uint32_t m = (a >> 13) & 0x3ffu;
    return (uint16_t)(sign | 0x7c00u | (m ? m : 0x200u));
  }
  if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) return (uint16_t)(sign | (uint32_t)(pk_float(a) * 0x1p24f));
  return (uint16_t)(sign | ((a - 0x38000000u) >> 13));
}
"""


# float16 and bfloat16 in C and CUDA C, through FLOAT16_HELPERS (which the prelude must hold).
EMULATED_FLOATS = {
    dtypes.float16: Emulated("float", "uint16_t", "pk_f16_load({})", "pk_f16_store({})",
                             "pk_f16({})"),
    dtypes.bfloat16: Emulated("float", "uint16_t", "pk_bf16_load({})", "pk_bf16_store({})",
                              "pk_bf16({})"),
}
