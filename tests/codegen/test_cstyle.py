"""The C-style renderer: golden lines for the ABI's semantics, structure, and subclass knobs.

What the lines compute is tested by running them (tests/reference_backends/test_cpu.py); here we
pin down the shapes a vendor reads and the rules every C-like target inherits.
"""
from __future__ import annotations

import shutil
import subprocess
from typing import ClassVar

import numpy as np
import pytest

from portkit.abi import KernelBuilder, Op, dtypes
from portkit.codegen.cstyle import CStyleRenderer, function_name, local_bytes
from portkit.codegen.emulated import FLOAT16_HELPERS, Emulated
from portkit.reference_backends.cpu.renderer import CPURenderer


def body(renderer, build) -> list[str]:
    """The rendered lines of a kernel that `build(k)` fills in, without indentation."""
    k = KernelBuilder("test")
    build(k)
    return [line.strip() for line in renderer.render_body(k.build())]


def value_of(renderer, op, dtype, arity=1) -> str:
    """The expression `renderer` gives `op` on `arity` loads from buffers of `dtype`."""
    k = KernelBuilder("test")
    loads = [k.load(k.param(dtype), k.const(0)) for _ in range(arity)]
    result = k.alu(op, *loads)
    k.store(k.param(k.dtype(result)), k.const(0), result)
    line = next(x for x in renderer.render_body(k.build()) if f" v{result} = " in x)
    return line.split(" = ", 1)[1].rstrip(";")


@pytest.mark.parametrize("op, dtype, expected", [
    (Op.ADD, dtypes.int32, "(int32_t)((uint32_t)v2 + (uint32_t)v5)"),
    (Op.MUL, dtypes.uint8, "(uint8_t)((uint32_t)v2 * (uint32_t)v5)"),
    (Op.ADD, dtypes.uint32, "(v2 + v5)"),
    (Op.SHL, dtypes.int64, "(int64_t)((uint64_t)v2 << v5)"),
    (Op.SHR, dtypes.int16, "(int16_t)(v2 >> v5)"),
    (Op.MOD, dtypes.uint16, "(uint16_t)(v2 % ((v5 == 0) ? 1 : v5))"),
    (Op.IDIV, dtypes.int64,
     "(v2 / ((v5 == 0 || (v5 == -1 && v2 == (-9223372036854775807ll - 1))) ? 1 : v5))"),
    (Op.MAX, dtypes.float32, "(v2 != v2 ? v2 : (v2 > v5 ? v2 : v5))"),
    (Op.MAX, dtypes.int32, "(v2 > v5 ? v2 : v5)"),
    (Op.CMPLT, dtypes.int8, "(v2 < v5)"),
    (Op.ADD, dtypes.bfloat16, "pk_bf16((v2 + v5))"),
])
def test_binary_op_lines(op, dtype, expected):
    assert value_of(CPURenderer(), op, dtype, 2) == expected


def test_unary_and_composed_ops():
    r = CPURenderer()
    assert value_of(r, Op.NEG, dtypes.int8) == "(int8_t)(-(uint32_t)v2)"
    assert value_of(r, Op.SQRT, dtypes.float64) == "sqrt(v2)"
    assert value_of(r, Op.RECIP, dtypes.float32) == "(1.0f / v2)"
    # MULACC on an emulated float rounds after the product (unfused), so float16 needs the
    # rounding inside too; float and double round once (fma, which the ABI allows), integers
    # multiply and add, each wrapping
    assert value_of(r, Op.MULACC, dtypes.float16, 3) == "pk_f16((pk_f16((v2 * v5)) + v8))"
    assert value_of(r, Op.MULACC, dtypes.float32, 3) == "fma(v2, v5, v8)"
    assert value_of(r, Op.MULACC, dtypes.float64, 3) == "fma(v2, v5, v8)"
    assert value_of(r, Op.MULACC, dtypes.int32, 3) == (
        "(int32_t)((uint32_t)(int32_t)((uint32_t)v2 * (uint32_t)v5) + (uint32_t)v8)")


@pytest.mark.parametrize("value, dtype, literal", [
    (0.1, dtypes.float32, "0.10000000149011612f"),     # the float32 nearest 0.1, exactly
    (0.1, dtypes.float64, "0.1"),
    (-2.5, dtypes.bfloat16, "(-2.5f)"),
    (-0.0, dtypes.float32, "(-0.0f)"),
    (float("inf"), dtypes.float64, "INFINITY"),
    (float("-inf"), dtypes.float32, "(-INFINITY)"),
    (float("nan"), dtypes.float16, "NAN"),
    (-2**31, dtypes.int32, "(-2147483647 - 1)"),
    (2**64 - 1, dtypes.uint64, "18446744073709551615ull"),
    (7, dtypes.uint32, "7u"),
    (-3, dtypes.int8, "(-3)"),
    (True, dtypes.bool_, "true"),
])
def test_literals_are_exact(value, dtype, literal):
    assert CPURenderer().render_const(value, dtype) == literal


def test_casts_and_bitcasts():
    r = CPURenderer()
    assert r.render_cast("x", dtypes.float32, dtypes.bool_) == "(x != 0)"
    assert r.render_cast("x", dtypes.float32, dtypes.int8) == "(int8_t)x"
    assert r.render_cast("x", dtypes.int64, dtypes.bfloat16) == "pk_bf16((double)x)"
    assert (r.render_bitcast_value("x", dtypes.float32, dtypes.int32)
            == "((union { float from; int32_t to; }){x}).to")
    assert r.render_bitcast_value("x", dtypes.float16, dtypes.uint16) == "pk_f16_store(x)"
    assert (r.render_bitcast_value("x", dtypes.int16, dtypes.bfloat16)
            == "pk_bf16_load(((union { int16_t from; uint16_t to; }){x}).to)")
    assert r.render_cast("b", dtypes.bool_, dtypes.bool_) == "b"
    assert r.render_bitcast_value("b", dtypes.bool_, dtypes.bool_) == "b"


class Float32InDouble(CStyleRenderer):
    """A language whose float32 is emulated: bitcasts go through the 32 raw bits."""

    emulated: ClassVar = {dtypes.float32: Emulated("double", "uint32_t", "f32_load({})",
                                                   "f32_store({})", "f32_round({})")}


def test_bitcast_of_an_emulated_dtype_uses_its_own_width():
    r = Float32InDouble()
    assert (r.render_bitcast_value("x", dtypes.float32, dtypes.int32)
            == "((union { uint32_t from; int32_t to; }){f32_store(x)}).to")
    assert r.render_bitcast_value("x", dtypes.uint32, dtypes.float32) == "f32_load(x)"
    assert r.render_load(dtypes.float32, "data0", "i", "g") == "f32_load((g ? data0[i] : 0u))"


def test_structure_one_line_per_node():
    def build(k):
        x, out = k.param(dtypes.float32), k.param(dtypes.float32)
        n = k.var("n")
        i = k.special("group", 0)
        acc = k.acc(k.const(0.0, dtypes.float32))
        with k.loop(k.const(0), n) as j:
            k.assign(acc, k.alu(Op.ADD, acc, k.load(x, j, k.alu(Op.CMPLT, j, i))))
        with k.branch(k.alu(Op.CMPLT, i, n)):
            k.store(out, i, acc, k.alu(Op.CMPNE, i, k.const(3)))
    assert body(CStyleRenderer(), build) == [
        "const int32_t v3 = group_id(0);",
        "float acc5 = 0.0f;",
        "for (int32_t ridx7 = 0; ridx7 < var_n; ridx7++) {",
        "const bool v8 = (ridx7 < v3);",
        "const float v9 = (v8 ? data0[ridx7] : 0.0f);",
        "const float v10 = (acc5 + v9);",
        "acc5 = v10;",
        "}",
        "const bool v13 = (v3 < var_n);",
        "if (v13) {",
        "const bool v16 = (v3 != 3);",
        "if (v16) data1[v3] = acc5;",
        "}",
    ]


def test_indentation_follows_nesting():
    k = KernelBuilder("nest")
    out = k.param(dtypes.int32)
    with k.loop(k.const(0), k.const(2)) as i, k.branch(k.alu(Op.CMPLT, i, k.const(1))):
        k.store(out, i, i)
    lines = CStyleRenderer().render_body(k.build())
    assert [len(line) - len(line.lstrip()) for line in lines] == [2, 4, 4, 6, 4, 2]


def test_whole_function_from_the_base_template():
    k = KernelBuilder("scale.by-2")
    x = k.param(dtypes.int16)
    k.var("n")
    k.store(x, k.const(0), k.const(2, dtypes.int16))
    source = CStyleRenderer().render(k.build())
    assert "void k_scale_by_2(int16_t *data0, const int32_t var_n) {\n  data0[0] = 2;\n}\n" \
        in source


class ToyOpenCL(CStyleRenderer):
    """What an OpenCL subclass looks like: knobs only."""

    kernel_prefix = "__kernel "
    buffer_param = "__global {type} *{name}"
    local_declaration = "__local {type} {name}[{size}];"
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    workitem: ClassVar = {"group": "get_group_id({})", "local": "get_local_id({})"}
    type_map: ClassVar = {**CStyleRenderer.type_map, dtypes.int8: "char", dtypes.uint32: "uint"}
    emulated: ClassVar = {dtypes.bfloat16: Emulated("float", "ushort", "bf16_load({})",
                                                    "bf16_store({})", "bf16_round({})")}
    bitcast_format = "as_{dst}({expr})"


def test_a_subclass_changes_only_its_knobs():
    k = KernelBuilder("toy")
    x, y = k.param(dtypes.bfloat16), k.param(dtypes.int8)
    lane = k.special("local", 0)
    tile = k.local(dtypes.bfloat16, 32)
    k.store(tile, lane, k.load(x, lane))
    k.barrier()
    value = k.alu(Op.ADD, k.load(tile, lane), k.load(tile, k.const(0)))
    k.store(x, lane, value)
    k.store(y, lane, k.alu(Op.ADD, k.load(y, lane), k.const(1, dtypes.int8)))
    source = ToyOpenCL().render(k.build(block=(32, 1, 1)))
    for expected in ["__kernel void k_toy(__global ushort *data0, __global char *data1) {",
                     "const int32_t v2 = get_local_id(0);",
                     "__local ushort local3[32];",
                     "local3[v2] = bf16_store(v4);",
                     "barrier(CLK_LOCAL_MEM_FENCE);",
                     "const float v10 = bf16_round((v7 + v9));",
                     "const char v14 = (char)((uint)v12 + (uint)1);"]:
        assert expected in source


def test_cpu_local_memory_is_a_slice_of_one_block():
    k = KernelBuilder("two_tiles")
    a, b = k.local(dtypes.float64, 3), k.local(dtypes.int8, 5)
    k.store(a, k.const(0), k.const(1.0, dtypes.float64))
    k.store(b, k.const(0), k.const(1, dtypes.int8))
    kernel = k.build()
    source = CPURenderer().render(kernel)
    assert "double *const local0 = (double *)(pk_local + 0);" in source
    assert "int8_t *const local1 = (int8_t *)(pk_local + 32);" in source   # 24 rounded to 16s
    assert local_bytes(kernel) == 48 and "char pk_local[48];" in source


class LetLanguage(CStyleRenderer):
    """Declarations spelled like WGSL: three knobs, no other change."""

    locals_at_module_scope = True
    const_declaration = "let {name}: {type} = {expr};"
    var_declaration = "var {name}: {type} = {expr};"
    local_declaration = "var<workgroup> {name}: array<{type}, {size}>;"


def test_declarations_and_loops_are_knobs():
    def build(k):
        out = k.param(dtypes.int32)
        acc = k.acc(k.const(0))
        with k.loop(k.const(0), k.const(4)) as i:
            k.assign(acc, k.alu(Op.ADD, acc, i))
        k.store(out, k.const(0), acc)
    lines = body(LetLanguage(), build)
    assert lines[:3] == ["var acc2: int32_t = 0;",
                         "for (var ridx5: int32_t = 0; ridx5 < 4; ridx5++) {",
                         "let v6: int32_t = (int32_t)((uint32_t)acc2 + (uint32_t)ridx5);"]


def tiles_in_a_loop():
    """A kernel whose LOCAL nodes sit inside a loop and after a branch."""
    k = KernelBuilder("tiles")
    out = k.param(dtypes.float32)
    lane = k.special("local", 0)
    with k.loop(k.const(0), k.const(2)):
        tile = k.local(dtypes.float32, 8)
        k.store(tile, lane, k.const(1.0, dtypes.float32))
        with k.branch(k.alu(Op.CMPLT, lane, k.const(4))):
            flags = k.local(dtypes.int8, 5)
            k.store(flags, lane, k.const(1, dtypes.int8))
        k.store(out, lane, k.load(tile, lane))
    return k.build(block=(8, 1, 1))


def test_locals_are_declared_at_function_scope_first():
    lines = ToyOpenCL().render_body(tiles_in_a_loop())
    assert lines[:2] == ["  __local float local5[8];", "  __local char local11[5];"]
    assert not any("__local" in line for line in lines[2:])


def test_locals_at_module_scope_come_before_the_function():
    source = LetLanguage().render(tiles_in_a_loop())
    before, function = source.split("void k_tiles(")
    assert "var<workgroup> local5: array<float, 8>;\nvar<workgroup> local11: array<int8_t, 5>;" \
        in before
    assert "var<workgroup>" not in function and "local11[" in function


def test_workitems_may_name_the_axis_by_letter():
    class Letters(CStyleRenderer):
        workitem: ClassVar = {"group": "blockIdx.{xyz}", "local": "threadIdx.{xyz}"}
    lines = body(Letters(), lambda k: k.store(k.param(dtypes.int32), k.special("group", 2),
                                              k.special("local", 1)))
    assert lines[:2] == ["const int32_t v1 = blockIdx.z;", "const int32_t v2 = threadIdx.y;"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_float16_helpers_round_subnormals_without_tgmath(tmp_path):
    # Only <math.h>: a helper that relied on tgmath's float fabs would compute in double here
    # and not round small values to float16's subnormal step.
    values = [2.0**-25 * 3, 1e-6, -3e-7, 6e-5, 65519.0, 65520.0, 0.1]
    calls = "".join(f'  printf("%a\\n", pk_f16({v!r}));\n' for v in values)
    source = tmp_path / "f16.c"
    source.write_text("#include <math.h>\n#include <stdint.h>\n#include <stdio.h>\n"
                      "#include <string.h>\n" + FLOAT16_HELPERS
                      + "int main(void) {\n" + calls + "  return 0;\n}\n")
    subprocess.run(["cc", "-O1", "-o", tmp_path / "f16", source, "-lm"], check=True)
    printed = subprocess.run([tmp_path / "f16"], check=True, capture_output=True, text=True)
    got = [float.fromhex(line) for line in printed.stdout.split()]
    with np.errstate(over="ignore"):
        assert got == np.array(values).astype(np.float16).astype(float).tolist()


def test_names_are_identifiers():
    assert function_name("double") == "k_double"
    assert function_name("r_4.sum-x") == "k_r_4_sum_x"


def test_function_names_are_ascii_identifiers_two_longer_than_the_name():
    # The runtime shortens a name past the device's Capabilities.max_name_length.
    assert function_name("e_3") == "k_e_3"
    assert len(function_name("x" * 300)) == 302
    assert function_name("caf\u00e9-1") == "k_caf__1"
    assert function_name("caf\u00e9-1").isidentifier()
