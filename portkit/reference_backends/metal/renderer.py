"""ABI kernels as Metal Shading Language: the C-style base with Metal's knobs.

MSL has no double, so float64 is not offered. half is native. bfloat16 is held in float and
rounded after every op (MSL's own `bfloat` needs MSL 3.1, macOS 14); buffers hold its 16 bits.
Rounding an op's float result to bfloat16 rounds once in effect (float has more than twice the
bits), but integers wider than 24 bits would round twice: they are first rounded to odd.
"""
from __future__ import annotations

from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
from portkit.abi.ops import Op
from portkit.codegen.cstyle import CStyleRenderer
from portkit.codegen.emulated import BFLOAT16_HELPERS, Emulated

# The C-style base's bfloat16 helpers, reading bits with as_type; pk_odd for wide integers.
_HELPERS = """\
static inline uint32_t pk_bits(float f) { return as_type<uint32_t>(f); }
static inline float pk_float(uint32_t u) { return as_type<float>(u); }
""" + BFLOAT16_HELPERS + """
/* |x| as a float rounded to odd: the bits past the 24 kept set the last kept bit, so rounding
   the result to bfloat16 (or half) rounds x itself, once. */
static inline float pk_odd(ulong a) {
  const int drop = max(0, 40 - (int)clz(a));
  const ulong lost = a & ((1ul << drop) - 1ul);
  return (float)(((a >> drop) | (lost != 0ul ? 1ul : 0ul)) << drop);
}
static inline float pk_odd(long x) { return x < 0l ? -pk_odd(0ul - (ulong)x) : pk_odd((ulong)x); }
"""

_TEMPLATE = """\
#include <metal_stdlib>
using namespace metal;
{{ prelude }}
kernel void {{ name }}({{ args | join(", ") }},
    uint3 pk_group [[threadgroup_position_in_grid]],
    uint3 pk_thread [[thread_position_in_threadgroup]]) {
{% for line in body %}
{{ line }}
{% endfor %}
}
"""

_TYPES = {
    dtypes.bool_: "bool", dtypes.int8: "char", dtypes.int16: "short", dtypes.int32: "int",
    dtypes.int64: "long", dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint",
    dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.float32: "float",
}


class MetalRenderer(CStyleRenderer):
    """MSL: one `kernel` function; buffers bound at [[buffer(i)]] in ABI order, then every int32
    scalar in one `constant int *pk_vars` at the next slot."""

    buffer_param = "device {type} *{name} [[buffer({slot})]]"
    # All scalars share one slot after the buffers: Metal has 31 slots, and a kernel may take
    # as many buffers as capabilities allow plus codegen's scalars.
    scalar_param = None
    scalars_param = "constant int *pk_vars [[buffer({slot})]]"
    scalar_read = "pk_vars[{index}]"
    local_declaration = "threadgroup {type} {name}[{size}];"
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    workitem: ClassVar[dict[str, str]] = {"group": "((int)pk_group.{xyz})",
                                          "local": "((int)pk_thread.{xyz})"}
    type_map: ClassVar[dict[DType, str]] = _TYPES
    emulated: ClassVar[dict[DType, Emulated]] = {
        dtypes.bfloat16: Emulated("float", "ushort", "pk_bf16_load({})", "pk_bf16_store({})",
                                  "pk_bf16_nearest({})"),
    }
    int_suffix: ClassVar[dict[DType, str]] = {dtypes.int64: "l", dtypes.uint32: "u",
                                              dtypes.uint64: "ul"}
    float_suffix: ClassVar[dict[str, str]] = {"float": "f", "half": "h"}
    # INFINITY and NAN are float in MSL; a half constant must stay half in `c ? k : h`.
    typed_specials = frozenset({"half"})
    bitcast_format = "as_type<{dst}>({expr})"
    fma_dtypes = (dtypes.float16, dtypes.float32)
    # No double to round through: integers wider than float's 24 bits are rounded to odd
    # first (pk_odd), for bfloat16 and half alike.
    widest_float = "float"
    rounded_to_odd: ClassVar[dict[DType, str]] = {
        dtypes.int32: "pk_odd((long){})", dtypes.int64: "pk_odd((long){})",
        dtypes.uint32: "pk_odd((ulong){})", dtypes.uint64: "pk_odd((ulong){})"}
    template = _TEMPLATE

    def prelude(self, kernel: Kernel) -> str:
        wide_to_half = any(n.op is Op.CAST and n.dtype == dtypes.float16
                           and kernel.nodes[n.src[0]].dtype in self.rounded_to_odd
                           for n in kernel.nodes)
        uses_bfloat16 = any(n.dtype == dtypes.bfloat16 for n in kernel.nodes)
        return _HELPERS if uses_bfloat16 or wide_to_half else ""
