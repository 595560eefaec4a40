"""The C-style renderer: golden lines for the ABI's semantics, structure, and subclass knobs.

What the lines compute is tested by running them (tests/reference_backends/test_cpu.py); here we
pin down the shapes a vendor reads and the rules every C-like target inherits.
"""
from __future__ import annotations

from typing import ClassVar

import pytest

from portkit.abi import KernelBuilder, Op, dtypes
from portkit.codegen.cstyle import CStyleRenderer, Emulated, function_name, local_bytes
from portkit.reference_backends.cpu.renderer import CRenderer


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
    (Op.MAX, dtypes.float32, "((v2 > v5 || v2 != v2) ? v2 : v5)"),
    (Op.MAX, dtypes.int32, "(v2 > v5 ? v2 : v5)"),
    (Op.CMPLT, dtypes.int8, "(v2 < v5)"),
    (Op.ADD, dtypes.bfloat16, "pk_bf16((v2 + v5))"),
])
def test_binary_op_lines(op, dtype, expected):
    assert value_of(CRenderer(), op, dtype, 2) == expected


def test_unary_and_composed_ops():
    r = CRenderer()
    assert value_of(r, Op.NEG, dtypes.int8) == "(int8_t)(-(uint32_t)v2)"
    assert value_of(r, Op.SQRT, dtypes.float64) == "sqrt(v2)"
    assert value_of(r, Op.RECIP, dtypes.float32) == "(1.0f / v2)"
    # MULACC rounds after the product (unfused), so float16 needs the rounding inside too
    assert value_of(r, Op.MULACC, dtypes.float16, 3) == "pk_f16((pk_f16((v2 * v5)) + v8))"
    assert value_of(r, Op.MULACC, dtypes.float32, 3) == "((v2 * v5) + v8)"


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
    assert CRenderer().render_const(value, dtype) == literal


def test_casts_and_bitcasts():
    r = CRenderer()
    assert r.render_cast("x", dtypes.float32, dtypes.bool_) == "(x != 0)"
    assert r.render_cast("x", dtypes.float32, dtypes.int8) == "(int8_t)x"
    assert r.render_cast("x", dtypes.int64, dtypes.bfloat16) == "pk_bf16((double)x)"
    assert (r.render_bitcast_value("x", dtypes.float32, dtypes.int32)
            == "((union { float from; int32_t to; }){x}).to")
    assert r.render_bitcast_value("x", dtypes.float16, dtypes.uint16) == "pk_f16_store(x)"
    assert (r.render_bitcast_value("x", dtypes.int16, dtypes.bfloat16)
            == "pk_bf16_load(((union { int16_t from; uint16_t to; }){x}).to)")


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
    buffer_prefix = "__global "
    local_prefix = "__local "
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    workitem: ClassVar = {"group": "get_group_id({})", "local": "get_local_id({})"}
    type_map: ClassVar = {**CStyleRenderer.type_map, dtypes.int8: "char", dtypes.uint32: "uint"}
    emulated: ClassVar = {dtypes.bfloat16: Emulated("float", "ushort", "bf16_load({})",
                                                    "bf16_store({})", "bf16_round({})")}

    def render_bitcast(self, expr, src, dst):
        return f"as_{self.type_map[dst]}({expr})"


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
    source = CRenderer().render(kernel)
    assert "double *const local0 = (double *)(pk_local + 0);" in source
    assert "int8_t *const local1 = (int8_t *)(pk_local + 32);" in source   # 24 rounded to 16s
    assert local_bytes(kernel) == 48 and "char pk_local[48];" in source


def test_names_are_identifiers():
    assert function_name("double") == "k_double"
    assert function_name("r_4.sum-x") == "k_r_4_sum_x"
