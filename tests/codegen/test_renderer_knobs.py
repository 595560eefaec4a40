"""A C-like language from knobs alone: GLSL 4.50 compute shaders as a CStyleRenderer subclass
that sets class attributes and op spellings and overrides no method.

The kernels are checked for the spellings GLSL needs (no `const` for computed values,
constructor casts, `&&`/`||`/`^^` on bool, typed literals in divisor guards, inf and NaN from
bits, emulated casts through double) and, where glslangValidator is installed, compiled by it.
"""
from __future__ import annotations

import math
import shutil
import subprocess
from typing import ClassVar

import pytest

from portkit.abi import KernelBuilder, Op, dtypes
from portkit.abi.dtypes import DType
from portkit.codegen.cstyle import CStyleRenderer, Emulated, Spelling
from portkit.reference_backends.cpu.renderer import CPURenderer
from portkit.reference_backends.cuda.renderer import CUDARenderer
from portkit.reference_backends.metal.renderer import MetalRenderer
from portkit.reference_backends.opencl.renderer import OpenCLRenderer
from portkit.reference_backends.webgpu.renderer import WebGPURenderer

_GLSL_TEMPLATE = """\
#version 450
layout(local_size_x = {{ kernel.block[0] }}, local_size_y = {{ kernel.block[1] }}, \
local_size_z = {{ kernel.block[2] }}) in;
float pk_f16(double x) { return unpackHalf2x16(packHalf2x16(vec2(float(x), 0.0))).x; }
int pk_as_int(float x) { return floatBitsToInt(x); }
float pk_as_float(int x) { return intBitsToFloat(x); }
{% for p in kernel.params %}
layout(std430, binding = {{ p.arg }}) buffer Buffer{{ p.arg }} \
{ {{ r.storage_type(p.value_dtype) }} data{{ p.arg }}[]; };
{% endfor %}
{% if kernel.vars %}
layout(std430, binding = {{ kernel.params | length }}) readonly buffer Scalars \
{ int pk_vars[]; };
{% endif %}
{% for line in module_locals %}
{{ line }}
{% endfor %}
void main() {
{% for line in body %}
{{ line }}
{% endfor %}
}
"""


class GLSL450Renderer(CStyleRenderer):
    """GLSL 4.50 for Vulkan compute: buffers and scalars bound at module scope, knobs only."""

    template = _GLSL_TEMPLATE
    buffer_param = None
    scalar_param = None
    scalar_read = "pk_vars[{index}]"
    const_declaration = "{type} {name} = {expr};"    # GLSL's const wants a constant expression
    cast_format = "{type}({expr})"
    bitcast_format = "pk_as_{dst}({expr})"
    local_declaration = "shared {type} {name}[{size}];"
    locals_at_module_scope = True
    barrier = "memoryBarrierShared(); barrier();"
    workitem: ClassVar[dict[str, str]] = {"group": "int(gl_WorkGroupID.{xyz})",
                                          "local": "int(gl_LocalInvocationID.{xyz})"}
    type_map: ClassVar[dict[DType, str]] = {
        dtypes.bool_: "bool", dtypes.int32: "int", dtypes.uint32: "uint",
        dtypes.float32: "float", dtypes.float64: "double"}
    # float16 held in a float, one per 32-bit word (a test's simplification of the layout)
    emulated: ClassVar[dict[DType, Emulated]] = {dtypes.float16: Emulated(
        "float", "uint", "unpackHalf2x16({}).x", "packHalf2x16(vec2({}, 0.0))", "pk_f16({})")}
    int_suffix: ClassVar[dict[DType, str]] = {dtypes.uint32: "u"}
    float_suffix: ClassVar[dict[str, str]] = {"float": "f", "double": "lf"}
    float_specials: ClassVar[dict[str, str]] = {
        "inf": "uintBitsToFloat(0x7f800000u)", "-inf": "uintBitsToFloat(0xff800000u)",
        "nan": "uintBitsToFloat(0x7fc00000u)"}
    typed_specials = frozenset({"double"})
    typed_literals = True
    bool_ops: ClassVar[dict[Op, Spelling]] = {
        Op.AND: "({0} && {1})", Op.OR: "({0} || {1})", Op.XOR: "({0} ^^ {1})",
        Op.CMPLT: "(!{0} && {1})"}


def elementwise():
    """Casts both ways, bool ops, and integer division with guarded divisors."""
    k = KernelBuilder("elementwise")
    x, n, u = k.param(dtypes.float32), k.param(dtypes.int32), k.param(dtypes.uint32)
    flags, halves, out = k.param(dtypes.bool_), k.param(dtypes.float16), k.param(dtypes.int32)
    i = k.special("group", 0)
    xv, nv, uv = k.load(x, i), k.load(n, i), k.load(u, i)
    small = k.alu(Op.CMPLT, xv, k.cast(nv, dtypes.float32))
    odd = k.cast(k.alu(Op.AND, nv, k.const(1)), dtypes.bool_)
    mixed = k.alu(Op.XOR, k.alu(Op.AND, small, odd), k.alu(Op.OR, small, k.load(flags, i)))
    k.store(flags, i, k.alu(Op.CMPLT, mixed, odd))
    k.store(halves, i, k.cast(nv, dtypes.float16))
    k.store(u, i, k.alu(Op.MOD, uv, k.const(3, dtypes.uint32)))
    quotient = k.alu(Op.IDIV, k.cast(xv, dtypes.int32), nv)
    k.store(out, i, k.alu(Op.ADD, quotient, k.cast(k.cast(xv, dtypes.int32, bitcast=True),
                                                     dtypes.int32)))
    return k.build()


def reduce():
    """A row sum over a scalar length, shared through workgroup memory and a barrier."""
    k = KernelBuilder("row_sum")
    x, out = k.param(dtypes.float32), k.param(dtypes.float32)
    n = k.var("n")
    row, lane = k.special("group", 0), k.special("local", 0)
    acc = k.acc(k.const(0.0, dtypes.float32))
    with k.loop(lane, n) as j:
        k.assign(acc, k.alu(Op.ADD, acc, k.load(x, k.alu(Op.ADD, k.alu(Op.MUL, row, n), j))))
    tile = k.local(dtypes.float32, 4)
    k.store(tile, lane, acc)
    k.barrier()
    with k.branch(k.alu(Op.CMPLT, lane, k.const(1))):
        total = k.alu(Op.ADD, k.load(tile, k.const(0)), k.load(tile, k.const(1)))
        k.store(out, row, total)
    return k.build(block=(4, 1, 1))


def where_inf():
    """NaN becomes -inf, then the max with +inf, in float and in double."""
    k = KernelBuilder("where_inf")
    x, wide = k.param(dtypes.float32), k.param(dtypes.float64)
    i = k.special("group", 0)
    xv = k.load(x, i, k.alu(Op.CMPLT, i, k.const(8)))
    nan = k.alu(Op.CMPNE, xv, xv)
    clean = k.alu(Op.WHERE, nan, k.const(-math.inf, dtypes.float32), xv)
    k.store(x, i, k.alu(Op.MAX, clean, k.const(math.inf, dtypes.float32)))
    w = k.load(wide, i)
    k.store(wide, i, k.alu(Op.WHERE, k.alu(Op.CMPNE, w, w), k.const(math.nan, dtypes.float64), w))
    return k.build()


def _validate(source: str, tmp_path) -> None:
    """glslangValidator compiles `source` where it is installed; else the text checks stand."""
    if shutil.which("glslangValidator") is None:
        return
    path = tmp_path / "kernel.comp"
    path.write_text(source)
    result = subprocess.run(["glslangValidator", str(path)], check=False, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr + source


def test_the_glsl_renderer_is_knobs_only():
    methods = [name for name, value in vars(GLSL450Renderer).items()
               if callable(value) or isinstance(value, staticmethod | classmethod | property)]
    assert methods == []


@pytest.mark.parametrize("renderer", [CPURenderer, CUDARenderer, MetalRenderer, OpenCLRenderer,
                                      WebGPURenderer])
def test_no_reference_renderer_overrides_the_walk(renderer):
    walk = {"render", "render_body", "render_value", "render_alu", "render_bitcast", "declare",
            "cast", "render_const", "render_args", "template_context"} - {
        # what the CPU entry point's template needs beyond the base's context
        "template_context" if renderer is CPURenderer else ""}
    assert walk.isdisjoint(vars(renderer)), walk & set(vars(renderer))


def test_elementwise_casts_and_bool_ops(tmp_path):
    source = GLSL450Renderer().render(elementwise())
    for spelling in [
        "void main() {",
        "layout(std430, binding = 0) buffer Buffer0 { float data0[]; };",
        "int v6 = int(gl_WorkGroupID.x);",
        "float v10 = float(v8);",                                # constructor casts, no const
        "int v13 = (v8 & 1);",
        "bool v18 = (v15 ^^ v17);",                              # && || ^^ on bool
        "bool v15 = (v11 && v14);",
        "bool v17 = (v11 || v16);",
        "bool v19 = (!v18 && v14);",                             # < on bool
        "float v21 = pk_f16(double(v8));",                       # emulated: through double
        "data4[v6] = packHalf2x16(vec2(v21, 0.0));",
        "uint v24 = (v9 % ((3u == 0u) ? 1u : 3u));",             # typed divisor literals
        "((v8 == 0 || (v8 == (-1) && v26 == (-2147483647 - 1))) ? 1 : v8)",
        "int v28 = pk_as_int(v7);",
        "int v30 = int((uint(v27) + uint(v29)));",
    ]:
        assert spelling in source, spelling
    assert "const " not in source
    _validate(source, tmp_path)


def test_reduce_with_scalars_locals_and_a_barrier(tmp_path):
    source = GLSL450Renderer().render(reduce())
    before, function = source.split("void main() {")
    assert "shared float local14[4];" in before and "local_size_x = 4," in before
    for spelling in ["int var_n = pk_vars[0];",
                     "float acc6 = 0.0f;",
                     "for (int ridx7 = v4; ridx7 < var_n; ridx7++) {",
                     "acc6 = v11;",
                     "memoryBarrierShared(); barrier();",
                     "if (v18) {"]:
        assert spelling in function, spelling
    _validate(source, tmp_path)


def test_where_and_special_values(tmp_path):
    source = GLSL450Renderer().render(where_inf())
    for spelling in ["float v5 = (v4 ? data0[v2] : 0.0f);",
                     "float v8 = (v6 ? uintBitsToFloat(0xff800000u) : v5);",
                     ("float v10 = (v8 != v8 ? v8 : (v8 > uintBitsToFloat(0x7f800000u) ? v8 : "
                      "uintBitsToFloat(0x7f800000u)));"),
                     "double v15 = (v13 ? double(uintBitsToFloat(0x7fc00000u)) : v12);"]:
        assert spelling in source, spelling
    _validate(source, tmp_path)
