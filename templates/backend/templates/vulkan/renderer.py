"""The instruction set: how an ABI kernel becomes {{ cookiecutter.name }} code, as a GLSL 450 compute shader.

Starter: vulkan. portkit's C-style base (portkit/codegen/cstyle.py) walks the kernel and keeps
the ABI's exact semantics (wrapping integers, guarded divisors, NaN-propagating MAX); GLSL is
its knobs and op spellings below: type names (8-, 16- and 64-bit ones through
GL_EXT_shader_explicit_arithmetic_types), constructor casts, typed literals, `&&`/`||`/`^^` on
bools, bit casts through the `pk_as_T` overloads of the template. Buffers are storage-buffer
bindings 0..n-1 of set 0 and the scalars one push-constant block, in argument order, as
runtime.py lays out the pipeline. A bool is stored as a uint8_t.
"""
from typing import ClassVar

from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen.cstyle import CStyleRenderer

TYPES = {
    dtypes.bool_: "bool", dtypes.int8: "int8_t", dtypes.int16: "int16_t", dtypes.int32: "int",
    dtypes.int64: "int64_t", dtypes.uint8: "uint8_t", dtypes.uint16: "uint16_t",
    dtypes.uint32: "uint", dtypes.uint64: "uint64_t", dtypes.float16: "float16_t",
    dtypes.float32: "float", dtypes.float64: "double",
}
# (a, b, GLSL's function reading a's bits as b, and back): the template's pk_as_T overloads
PAIRS = [("float", "int", "floatBitsToInt", "intBitsToFloat"),
         ("float", "uint", "floatBitsToUint", "uintBitsToFloat"),
         ("double", "int64_t", "doubleBitsToInt64", "int64BitsToDouble"),
         ("double", "uint64_t", "doubleBitsToUint64", "uint64BitsToDouble"),
         ("float16_t", "int16_t", "float16BitsToInt16", "int16BitsToFloat16"),
         ("float16_t", "uint16_t", "float16BitsToUint16", "uint16BitsToFloat16"),
         *((t, "u" + t, "u" + t, t) for t in ("int8_t", "int16_t", "int", "int64_t"))]
BITCASTS = {(a, b): f for a, b, f, _ in PAIRS} | {(b, a): g for a, b, _, g in PAIRS}


# lavapipe's float64 lowering: trunc (and an int64 round trip, which becomes trunc) leaves
# some non-integral values unchanged, and x / 0 is garbage
# (docs/backends/drivers.md); exact versions, with the zero's and the infinity's signs kept.
FLOAT64_HELPERS = """\
double pk_trunc(double x) {
  precise double a = abs(x), t = (a + 4503599627370496.0lf) - 4503599627370496.0lf;
  if (!(a < 4503599627370496.0lf)) return x;   // integral already, inf or NaN; else t is a
  t = t > a ? t - 1.0lf : t;                    // rounded (precise: not folded back to a)
  return t == 0.0lf ? x * 0.0lf : (x < 0.0lf ? -t : t);   // x * 0: a zero of x's sign
}
double pk_div(double a, double b) {
  if (b != 0.0lf) return a / b;
  if (a == 0.0lf || isnan(a)) return uint64BitsToDouble(0x7ff8000000000000ul);
  uint64_t sign = (doubleBitsToUint64(a) ^ doubleBitsToUint64(b)) & 0x8000000000000000ul;
  return uint64BitsToDouble(sign | 0x7ff0000000000000ul);
}
"""


{% raw %}TEMPLATE = """\
#version 450
#extension GL_EXT_shader_explicit_arithmetic_types : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
""" + FLOAT64_HELPERS + """\
{% for (src, dst), name in r.bitcasts.items() %}
{{ dst }} pk_as_{{ dst }}({{ src }} x) { return {{ name }}(x); }
{% endfor %}
layout(local_size_x = {{ kernel.block[0] }}, local_size_y = {{ kernel.block[1] }}, local_size_z = {{ kernel.block[2] }}) in;
{% for line in args %}
{{ line }}
{% endfor %}
{% if kernel.vars %}
layout(push_constant) uniform Scalars { {% for v in kernel.vars %}int var_{{ v }}; {% endfor %}};
{% endif %}
{% for line in module_locals %}
{{ line }}
{% endfor %}
void main() {
{% for line in body %}
{{ line }}
{% endfor %}
}
"""{% endraw %}


class {{ cookiecutter.__title }}Renderer(CStyleRenderer):
    """Kernel -> GLSL 450 compute shader source (`main` is the entry point)."""{% raw %}

    locals_at_module_scope = True          # `shared` arrays live outside main
    local_declaration = "shared {type} {name}[{size}];"
    # buffers: module-scope blocks the template lists; scalars: its push-constant block
    buffer_param = ("layout(std430, set = 0, binding = {slot}) buffer Data{slot} "
                    "{{ {type} {name}[]; }};")
    scalar_param = None
    const_declaration = "{type} {name} = {expr};"      # GLSL's const needs a constant
    cast_format = "{type}({expr})"
    bitcast_format = "pk_as_{dst}({expr})"
    bitcasts: ClassVar = BITCASTS
    barrier = "memoryBarrierShared(); barrier();"
    workitem: ClassVar = {"group": "int(gl_WorkGroupID.{xyz})",
                          "local": "int(gl_LocalInvocationID.{xyz})"}
    type_map: ClassVar = TYPES
    storage_types: ClassVar = {dtypes.bool_: "uint8_t"}
    stored_as: ClassVar = {dtypes.bool_: ("({} != uint8_t(0))", "uint8_t({})")}
    int_suffix: ClassVar = {dtypes.uint32: "u", dtypes.int64: "l", dtypes.uint64: "ul"}
    float_suffix: ClassVar = {"float": "f", "double": "lf", "float16_t": "hf"}
    float_specials: ClassVar = {"inf": "uintBitsToFloat(0x7f800000u)",
                                "-inf": "(-uintBitsToFloat(0x7f800000u))",
                                "nan": "uintBitsToFloat(0x7fc00000u)"}
    typed_specials = frozenset({"float", "double"})
    # no literal of these types: a literal is cast to them
    cast_literals = frozenset({dtypes.int8, dtypes.int16, dtypes.uint8, dtypes.uint16,
                               dtypes.float16})
    typed_literals = True            # no implicit narrowing: a divisor guard's literals are typed
    template = TEMPLATE
    code_for_op: ClassVar = {
        **CStyleRenderer.code_for_op,
        Op.MAX: lambda a, b, dtype: (f"(({a} > {b} || isnan({a})) ? {a} : {b})"
                                     if dtype.is_float else f"({a} > {b} ? {a} : {b})"),
        Op.TRUNC: lambda a, dtype: f"{'pk_trunc' if dtype == dtypes.float64 else 'trunc'}({a})",
        Op.FDIV: lambda a, b, dtype: f"pk_div({a}, {b})" if dtype == dtypes.float64 else
        f"({a} / {b})",
    }
    bool_ops: ClassVar = {Op.AND: "({0} && {1})", Op.OR: "({0} || {1})", Op.XOR: "({0} ^^ {1})",
                          Op.CMPLT: "(!{0} && {1})"}
{% endraw %}
