"""ABI kernels as WGSL: the C-style base, with WGSL's declarations, calls and packed buffers.

WGSL differs from C in ways the base cannot express with knobs alone:
- declarations read `let vN: T = e;` and `var accN: T = e;` (see `declare`); `c ? a : b` is
  `select(b, a, c)`;
- 8- and 16-bit integers and bool have no type: values live in i32 / u32 (narrowed after each
  op) and buffers hold them packed in `array<atomic<u32>>` words; a store clears and sets its
  own bits with atomicAnd + atomicOr, so neighbours stored by other threads are kept;
- bfloat16 is held in f32 and packed like the 16-bit integers; float16 is native (`enable f16`);
- NaN: the driver may fold `x != x` to false, so NaN is tested on the bits;
- the block size is part of the shader (`@workgroup_size`), scalars come in a uniform struct
  and workgroup memory is declared at module scope.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.kernel import Kernel
from portkit.abi.ops import COMPARISON, Op
from portkit.codegen.cstyle import CStyleRenderer, Emulated

_TYPES = {
    dtypes.bool_: "bool", dtypes.int8: "i32", dtypes.int16: "i32", dtypes.int32: "i32",
    dtypes.uint8: "u32", dtypes.uint16: "u32", dtypes.uint32: "u32", dtypes.float16: "f16",
    dtypes.float32: "f32", dtypes.float64: "f32",   # float64: only the base's cast path names it
}
# Stored as bits packed into u32 words: dtype -> bits per element.
PACKED = {dtypes.bool_: 8, dtypes.int8: 8, dtypes.uint8: 8, dtypes.int16: 16,
          dtypes.uint16: 16, dtypes.bfloat16: 16}

_PRELUDE = """\
fn pk_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn pk_bf16(x: f32) -> f32 {  // round to nearest-even bfloat16, NaN kept
  let u = bitcast<u32>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) { return bitcast<f32>((u | 0x00400000u) & 0xffff0000u); }
  return bitcast<f32>((u + 0x7fffu + ((u >> 16u) & 1u)) & 0xffff0000u);
}
fn pk_fdiv(a: f32, b: f32) -> f32 {  // WGSL leaves x / 0 undefined: spell out IEEE's answer
  if ((bitcast<u32>(b) & 0x7fffffffu) != 0u) { return a / b; }   // NaN too: IEEE
  let inf = bitcast<f32>(((bitcast<u32>(a) ^ bitcast<u32>(b)) & 0x80000000u) | 0x7f800000u);
  return select(inf, bitcast<f32>(0x7fc00000u), a == 0.0f || pk_isnan(a));
}
"""

_TEMPLATE = """\
{% if f16 %}
enable f16;
{% endif %}
{{ prelude }}
{% for line in declarations + module_locals %}
{{ line }}
{% endfor %}

@compute @workgroup_size({{ kernel.block | join(", ") }})
fn {{ name }}(@builtin(workgroup_id) pk_group: vec3<u32>,
    @builtin(local_invocation_id) pk_local: vec3<u32>) {
{% for v in kernel.vars %}
  let var_{{ v }}: i32 = pk_vars.s{{ loop.index0 }};
{% endfor %}
{% for line in body %}
{{ line }}
{% endfor %}
}
"""


def _is_nan(x: str, dtype: DType) -> str:
    return f"pk_isnan({x if dtype != dtypes.float16 else f'f32({x})'})"


class WebGPURenderer(CStyleRenderer):
    """WGSL for WebGPU compute shaders; one bind group: buffers, then the scalars' uniform."""

    barrier = "workgroupBarrier();"
    workitem: ClassVar[dict[str, str]] = {"group": "i32(pk_group[{}])",
                                          "local": "i32(pk_local[{}])"}
    type_map: ClassVar[dict[DType, str]] = _TYPES
    emulated: ClassVar[dict[DType, Emulated]] = {
        dtypes.bfloat16: Emulated("f32", "u32", "", "", "pk_bf16({})")}
    int_suffix: ClassVar[dict[DType, str]] = {
        dtypes.int8: "i", dtypes.int16: "i", dtypes.int32: "i",
        dtypes.uint8: "u", dtypes.uint16: "u", dtypes.uint32: "u"}
    float_suffix: ClassVar[dict[str, str]] = {"f32": "f", "f16": "h"}
    locals_at_module_scope = True
    template = _TEMPLATE
    code_for_op: ClassVar[dict[Op, Callable[..., str]]] = {
        **CStyleRenderer.code_for_op,
        # lavapipe drops the store of `x / 0.0` when the zero is a constant
        Op.FDIV: lambda a, b, dtype: (f"f16(pk_fdiv(f32({a}), f32({b})))"
                                      if dtype == dtypes.float16 else f"pk_fdiv({a}, {b})"),
        Op.NEG: lambda a, dtype: f"(0u - {a})" if dtype.kind == "uint" else f"(-{a})",
        Op.MAX: lambda a, b, dtype: (
            f"select({b}, {a}, {a} > {b} || {_is_nan(a, dtype)})" if dtype.is_float
            else f"max({a}, {b})"),
        Op.CMPLT: lambda a, b, dtype: (f"(!{a} && {b})" if dtype == dtypes.bool_
                                       else f"({a} < {b})"),
        Op.CMPNE: lambda a, b, dtype: (
            f"({a} != {b} || {_is_nan(a, dtype)} || {_is_nan(b, dtype)})" if dtype.is_float
            else f"({a} != {b})"),
        Op.XOR: lambda a, b, dtype: f"({a} != {b})" if dtype == dtypes.bool_ else f"({a} ^ {b})",
        Op.SHL: lambda a, b, dtype: f"({a} << u32({b}))",
        Op.SHR: lambda a, b, dtype: f"({a} >> u32({b}))",
        Op.WHERE: lambda c, a, b, dtype: f"select({b}, {a}, {c})",
    }

    def cast(self, expr: str, type_name: str) -> str:
        return f"{type_name}({expr})"

    def declare(self, name: str, type_name: str, expr: str, mutable: bool = False) -> str:
        return f"{'var' if mutable else 'let'} {name}: {type_name} = {expr};"

    def render_const(self, value: float, dtype: DType) -> str:
        # inf and NaN cannot be WGSL literals; a bit pattern can. lavapipe reads `-0.0f` as +0.
        if dtype.is_float and (
                not math.isfinite(value) or (value == 0 and math.copysign(1, value) < 0)
        ):
            bits = (0x7fc00000 if math.isnan(value) else 0x80000000 if value == 0
                    else 0x7f800000 | (value < 0) << 31)
            return self.cast(f"bitcast<f32>({bits:#x}u)", self.value_type(dtype))
        return super().render_const(value, dtype)

    # ---- packed storage -------------------------------------------------------------------

    def to_bits(self, expr: str, dtype: DType) -> str:
        """A u32 holding `dtype`'s bits in its low `dtype.bits` bits (the rest zero)."""
        if dtype == dtypes.float16:
            return f"pack2x16float(vec2<f32>(f32({expr}), 0.0f))"
        if dtype == dtypes.bfloat16:
            return f"(bitcast<u32>({expr}) >> 16u)"
        if dtype == dtypes.bool_:
            return f"u32({expr})"
        if dtype.bits < 32 and dtype.kind == "int":
            return f"(bitcast<u32>({expr}) & {(1 << dtype.bits) - 1:#x}u)"
        return expr if dtype.kind == "uint" else f"bitcast<u32>({expr})"

    def from_bits(self, bits: str, dtype: DType) -> str:
        """The `dtype` value of the low bits of a u32 (inverse of to_bits)."""
        if dtype == dtypes.float16:
            return f"f16(unpack2x16float({bits}).x)"
        if dtype == dtypes.bfloat16:
            return f"bitcast<f32>({bits} << 16u)"
        if dtype == dtypes.bool_:
            return f"({bits} != 0u)"
        if dtype.kind == "int":
            shift = 32 - dtype.bits
            return f"bitcast<i32>({bits})" if not shift else \
                f"((bitcast<i32>({bits}) << {shift}u) >> {shift}u)"
        return f"bitcast<f32>({bits})" if dtype.is_float else bits

    def storage_type(self, dtype: DType) -> str:
        return "atomic<u32>" if dtype in PACKED else self.type_map[dtype]

    def _word(self, buffer: str, index: str, bits: int) -> tuple[str, str]:
        per_word = 32 // bits
        return (f"&{buffer}[u32({index}) / {per_word}u]",
                f"(u32({index}) % {per_word}u * {bits}u)")

    def render_load(self, dtype: DType, buffer: str, index: str, gate: str | None = None) -> str:
        if dtype in PACKED:
            word, shift = self._word(buffer, index, PACKED[dtype])
            mask = (1 << PACKED[dtype]) - 1
            value = self.from_bits(f"((atomicLoad({word}) >> {shift}) & {mask:#x}u)", dtype)
        else:
            value = f"{buffer}[{index}]"
        # select() reads both sides; a read out of bounds is clamped by WebGPU, never a fault.
        return value if gate is None else f"select({self.render_const(0, dtype)}, {value}, {gate})"

    def render_store(self, dtype: DType, buffer: str, index: str, value: str,
                     gate: str | None = None) -> str:
        if dtype in PACKED:
            word, shift = self._word(buffer, index, PACKED[dtype])
            mask = (1 << PACKED[dtype]) - 1
            statement = (f"atomicAnd({word}, ~({mask:#x}u << {shift})); "
                         f"atomicOr({word}, {self.to_bits(value, dtype)} << {shift});")
        else:
            statement = f"{buffer}[{index}] = {value};"
        return statement if gate is None else f"if ({gate}) {{ {statement} }}"

    def render_local(self, name: str, dtype: DType, size: int, offset: int) -> str:
        words = -(-size * PACKED[dtype] // 32) if dtype in PACKED else size
        return f"var<workgroup> {name}: array<{self.storage_type(dtype)}, {words}>;"

    # ---- values ---------------------------------------------------------------------------

    def render_alu(self, op: Op, operands: list[str], dtype: DType) -> str:
        # WGSL integers wrap and never trap, so the base's widening and divisor guard are not
        # needed; 8- and 16-bit results are narrowed back to their width.
        if not dtype.is_int or op is Op.MULACC:
            return super().render_alu(op, operands, dtype)
        expr = self.code_for_op[op](*operands, self._wide(dtype))
        return expr if op in COMPARISON else self.narrow(expr, dtype)

    def _wide(self, dtype: DType) -> DType:
        return dtypes.int32 if dtype.kind == "int" else dtypes.uint32

    def narrow(self, expr: str, dtype: DType) -> str:
        """An i32 / u32 value wrapped to the range of the 8- or 16-bit `dtype`."""
        if dtype.bits == 32:
            return expr
        bits = f"({self.to_bits(expr, self._wide(dtype))} & {(1 << dtype.bits) - 1:#x}u)"
        return self.from_bits(bits, dtype)

    def render_cast(self, expr: str, src: DType, dst: DType) -> str:
        if dst == dtypes.bool_ and src.is_float:   # NaN is true; `x != 0` may be folded for it
            return f"({expr} != 0 || {_is_nan(expr, src)})"
        if dst.is_int:
            return self.narrow(self.cast(expr, self.value_type(dst)), dst)
        return super().render_cast(expr, src, dst)

    def render_bitcast(self, expr: str, src: DType, dst: DType) -> str:
        return self.from_bits(self.to_bits(expr, src), dst)

    def template_context(self, kernel: Kernel, body: list[str]) -> dict:
        declarations = [f"@group(0) @binding({p.arg}) var<storage, read_write> data{p.arg}: "
                        f"array<{self.storage_type(p.value_dtype)}>;" for p in kernel.params]
        if kernel.vars:
            members = ", ".join(f"s{i}: i32" for i in range(len(kernel.vars)))
            binding = len(kernel.params)
            declarations += [f"struct PkVars {{ {members} }}",
                             f"@group(0) @binding({binding}) var<uniform> pk_vars: PkVars;"]
        used = {n.dtype for n in kernel.nodes}
        return {**super().template_context(kernel, body), "declarations": declarations,
                "f16": dtypes.float16 in used, "prelude": _PRELUDE}
