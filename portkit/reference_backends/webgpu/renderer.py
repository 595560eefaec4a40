"""ABI kernels as WGSL: the C-style base, with WGSL's knobs and packed buffers.

WGSL differs from C in these ways; all but the packed buffers are knobs of the base:
- declarations read `let vN: T = e;` and `var accN: T = e;`; `c ? a : b` is `select(b, a, c)`;
  casts are `T(x)`; integers wrap and never trap;
- 8- and 16-bit integers and bool have no type: values live in i32 / u32 (narrowed after each
  op, which the base does for a dtype whose type is the 32-bit one) and buffers hold them packed
  in `array<atomic<u32>>` words; a store clears and sets its own bits with atomicAnd +
  atomicOr, so neighbours stored by other threads are kept (`render_load`, `render_store`);
- bfloat16 is held in f32 and packed like the 16-bit integers; float16 is native (`enable f16`);
- NaN: the driver may fold `x != x` to false, so NaN is tested on the bits;
- the block size is part of the shader (`@workgroup_size`), scalars come in a uniform struct
  and workgroup memory is declared at module scope.
"""
from __future__ import annotations

from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.dtypes import DType
from portkit.abi.ops import Op
from portkit.codegen.cstyle import CStyleRenderer, Emulated, Spelling

_TYPES = {
    dtypes.bool_: "bool", dtypes.int8: "i32", dtypes.int16: "i32", dtypes.int32: "i32",
    dtypes.uint8: "u32", dtypes.uint16: "u32", dtypes.uint32: "u32", dtypes.float16: "f16",
    dtypes.float32: "f32",
}
# Stored as bits packed into u32 words: dtype -> bits per element.
PACKED = {dtypes.bool_: 8, dtypes.int8: 8, dtypes.uint8: 8, dtypes.int16: 16,
          dtypes.uint16: 16, dtypes.bfloat16: 16}

_TEMPLATE = """\
{% if "float16" in dtypes %}
enable f16;
{% endif %}
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

{% for p in kernel.params %}
{% set element = r.storage_type(p.value_dtype) %}
@group(0) @binding({{ p.arg }}) var<storage, read_write> data{{ p.arg }}: array<{{ element }}>;
{% endfor %}
{% if kernel.vars %}
struct PkVars {
{%- for v in kernel.vars %} s{{ loop.index0 }}: i32{{ "," if not loop.last }}{% endfor %} }
@group(0) @binding({{ kernel.params | length }}) var<uniform> pk_vars: PkVars;
{% endif %}
{% for line in module_locals %}
{{ line }}
{% endfor %}

@compute @workgroup_size({{ kernel.block | join(", ") }})
fn {{ name }}(@builtin(workgroup_id) pk_group: vec3<u32>,
    @builtin(local_invocation_id) pk_local: vec3<u32>) {
{% for line in body %}
{{ line }}
{% endfor %}
}
"""


def _is_nan(x: str, dtype: DType) -> str:
    return f"pk_isnan({x if dtype != dtypes.float16 else f'f32({x})'})"


class WebGPURenderer(CStyleRenderer):
    """WGSL for WebGPU compute shaders; one bind group: buffers, then the scalars' uniform."""

    buffer_param = None           # buffers and scalars are bound at module scope (_TEMPLATE)
    scalar_param = None
    scalar_read = "pk_vars.s{index}"
    const_declaration = "let {name}: {type} = {expr};"
    var_declaration = "var {name}: {type} = {expr};"
    gated_store = "if ({gate}) {{ {statement} }}"
    local_declaration = "var<workgroup> {name}: array<{type}, {size}>;"
    cast_format = "{type}({expr})"
    bitcast_format = "bitcast<{dst}>({expr})"
    widest_float = "f32"
    wrapping_ints = True
    guard_division = False
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
    # inf and NaN cannot be WGSL literals; a bit pattern can. lavapipe reads `-0.0f` as +0.
    float_specials: ClassVar[dict[str, str]] = {
        "inf": "bitcast<f32>(0x7f800000u)", "-inf": "bitcast<f32>(0xff800000u)",
        "nan": "bitcast<f32>(0x7fc00000u)", "-0.0": "bitcast<f32>(0x80000000u)"}
    typed_specials = frozenset({"f32", "f16"})
    storage_types: ClassVar[dict[DType, str]] = {dtype: "atomic<u32>" for dtype in PACKED}
    locals_at_module_scope = True
    template = _TEMPLATE
    code_for_op: ClassVar[dict[Op, Spelling]] = {
        **CStyleRenderer.code_for_op,
        # lavapipe drops the store of `x / 0.0` when the zero is a constant
        Op.FDIV: lambda a, b, dtype: (f"f16(pk_fdiv(f32({a}), f32({b})))"
                                      if dtype == dtypes.float16 else f"pk_fdiv({a}, {b})"),
        Op.NEG: lambda a, dtype: f"(0u - {a})" if dtype.kind == "uint" else f"(-{a})",
        Op.MAX: lambda a, b, dtype: (
            f"select({b}, {a}, {a} > {b} || {_is_nan(a, dtype)})" if dtype.is_float
            else f"max({a}, {b})"),
        Op.CMPNE: lambda a, b, dtype: (
            f"({a} != {b} || {_is_nan(a, dtype)} || {_is_nan(b, dtype)})" if dtype.is_float
            else f"({a} != {b})"),
        Op.SHL: "({0} << u32({1}))",
        Op.SHR: "({0} >> u32({1}))",
        Op.WHERE: "select({2}, {1}, {0})",
    }
    bool_ops: ClassVar[dict[Op, Spelling]] = {Op.CMPLT: "(!{0} && {1})", Op.XOR: "({0} != {1})"}

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

    def _word(self, buffer: str, index: str, bits: int) -> tuple[str, str]:
        per_word = 32 // bits
        return (f"&{buffer}[u32({index}) / {per_word}u]",
                f"(u32({index}) % {per_word}u * {bits}u)")

    def render_load(self, dtype: DType, buffer: str, index: str, gate: str | None = None) -> str:
        # select() reads both sides; a read out of bounds is clamped by WebGPU, never a fault.
        if dtype not in PACKED:
            return super().render_load(dtype, buffer, index, gate)
        word, shift = self._word(buffer, index, PACKED[dtype])
        mask = (1 << PACKED[dtype]) - 1
        value = self.from_bits(f"((atomicLoad({word}) >> {shift}) & {mask:#x}u)", dtype)
        return value if gate is None else self.spell(
            Op.WHERE, [gate, value, self.render_const(0, dtype)], dtype)

    def render_store(self, dtype: DType, buffer: str, index: str, value: str,
                     gate: str | None = None) -> str:
        if dtype not in PACKED:
            return super().render_store(dtype, buffer, index, value, gate)
        word, shift = self._word(buffer, index, PACKED[dtype])
        mask = (1 << PACKED[dtype]) - 1
        statement = (f"atomicAnd({word}, ~({mask:#x}u << {shift})); "
                     f"atomicOr({word}, {self.to_bits(value, dtype)} << {shift});")
        return statement if gate is None else self.gated_store.format(gate=gate,
                                                                      statement=statement)

    def render_local(self, name: str, dtype: DType, size: int, offset: int) -> str:
        words = -(-size * PACKED[dtype] // 32) if dtype in PACKED else size   # 32-bit words
        return super().render_local(name, dtype, words, offset)

    # ---- values ---------------------------------------------------------------------------

    def render_cast(self, expr: str, src: DType, dst: DType) -> str:
        if dst == dtypes.bool_ and src.is_float:   # NaN is true; `x != 0` may be folded for it
            return f"({expr} != 0 || {_is_nan(expr, src)})"
        return super().render_cast(expr, src, dst)
