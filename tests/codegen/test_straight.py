"""A written-out row's lanes as vectors (portkit/codegen/straight.py and the CPU renderer):
which runs of stores qualify, that the C computes them with vector loads and one masked store,
and that the results are the scalar code's, bit for bit."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import portkit.nn.functional as F
from portkit import runtime, schedule
from portkit.abi import KernelBuilder, Op, dtypes
from portkit.codegen import straight
from portkit.codegen.lower import lower
from portkit.reference_backends.cpu.renderer import CPURenderer
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

F32 = dtypes.float32
WIDTHS = {F32: 16}


def _row(lanes=14, step=1, change=None):
    """out[16 g + j] = x[16 g + step j] * w[0] + x[16 g + step j + 1] * w[1] - w[2], for j <
    `lanes`: a row of a two-tap window with weights, written out. `change` breaks one lane:
    "op" (its sum a product), "gate" (a gated load), "alias" (lane 3 loads from out), "in
    place" (every lane does), "fence" (a loop between two stores), "far" (lane 5's load three
    elements on)."""
    k = KernelBuilder("row")
    out, x, w = k.param(F32), k.param(F32), k.param(F32)
    base = k.alu(Op.MUL, k.special("group", 0), k.const(16 * step))
    weights = [k.load(w, k.const(t)) for t in range(3)]
    values = []
    for j in range(lanes):
        source = out if change == "alias" and j == 3 or change == "in place" else x
        at = [k.alu(Op.ADD, base, k.const(step * j + t + 3 * (change == "far" and j == 5)))
              for t in range(2)]
        taps = [k.load(source, a) for a in at]
        if change == "gate" and j == 2:
            taps[0] = k.load(x, at[0], k.alu(Op.CMPLT, at[0], k.const(1000)))
        sum_op = Op.MUL if change == "op" and j == 7 else Op.ADD
        value = k.alu(sum_op, k.alu(Op.MUL, taps[0], weights[0]),
                      k.alu(Op.MUL, taps[1], weights[1]))
        values.append(k.alu(Op.SUB, value, weights[2]))
    out_base = k.alu(Op.MUL, k.special("group", 0), k.const(16))
    for j, value in enumerate(values):
        if change == "fence" and j == 8:
            with k.loop(k.const(0), k.const(1)):
                pass
        k.store(out, k.alu(Op.ADD, out_base, k.const(j)) if j else out_base, value)
    return k.build(grid=(2, 1, 1))


def test_a_row_of_stores_computed_alike_is_one_strip():
    strip, = straight.find(_row(), WIDTHS)
    assert len(strip.stores) == 14 and strip.offset == 0
    loads = [s for s in strip.steps if isinstance(s, straight.Load)]
    assert [(s.offset, s.step) for s in loads] == [(0, 1), (1, 1)]
    assert [s.op for s in strip.steps if isinstance(s, straight.Apply)] == [
        Op.MUL, Op.MUL, Op.ADD, Op.SUB]
    strided, = straight.find(_row(step=2), WIDTHS)
    assert {s.step for s in strided.steps if isinstance(s, straight.Load)} == {2}
    assert straight.find(_row(), {}) == []           # a dtype without vectors stays scalar


@pytest.mark.parametrize("change", ["op", "gate", "alias", "in place", "far"])
def test_rows_the_pattern_does_not_fit_stay_scalar(change):
    assert straight.find(_row(change=change), WIDTHS) == []


def test_a_row_is_cut_where_a_block_ends_and_short_pieces_stay_scalar():
    assert [len(s.stores) for s in straight.find(_row(change="fence"), WIDTHS)] == [8, 6]
    assert straight.find(_row(lanes=3), WIDTHS) == []


@pytest.mark.parametrize("lanes, step, change", [
    (14, 1, None), (7, 1, None), (16, 1, None), (14, 2, None), (5, 2, None), (14, 1, "op"),
    (14, 1, "far")])
def test_the_cpu_computes_what_the_interpreter_does_bit_for_bit(lanes, step, change):
    kernel = _row(lanes, step, change)
    rng = np.random.default_rng(0)
    # denormals and NaN beside ordinary values: the vector lanes must round as the scalars do
    x = rng.standard_normal(2 * 16 * step + 8).astype(np.float32)
    x[[3, 9]] = np.float32(1e-39), np.nan
    arrays = (np.full(32, 7, np.float32), x, np.float32([0.3, -1.7, 1e-38]))
    expected, *_ = runtime.get("interpreter").run(kernel, *arrays)
    actual, *_ = runtime.get("cpu").run(kernel, *arrays)
    np.testing.assert_array_equal(actual.view(np.uint32), expected.view(np.uint32))
    assert (actual[lanes:16] == 7).all()        # the masked store wrote the row's lanes only


def test_the_c_loads_vectors_and_stores_the_row_once():
    source = CPURenderer().render(_row())
    assert source.count("pk_f32x16_load_lanes(&data1[") == 2
    assert source.count("pk_f32x16_store_lanes(&data0[") == 1
    assert "data0[" not in source.split("static inline void k_row")[1].replace(
        "pk_f32x16_store_lanes(&data0[", "")       # no scalar store left
    assert "pk_f32x16_load_even(&data1[" in CPURenderer().render(_row(step=2))
    assert "pk_f32x16" not in CPURenderer().render(_row(change="op"))   # scalar: no helpers


@pytest.mark.parametrize("stride", [1, 2])
def test_a_depthwise_conv_on_a_short_row_is_written_as_vectors(stride):
    # MobileNetV3's 5 x 5 depthwise convs on 14 x 14 maps (stride 1) and from 28 x 28 (stride 2)
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((1, 8, 14 * stride, 14 * stride), dtype=np.float32))
    w = Tensor(rng.standard_normal((8, 1, 5, 5), dtype=np.float32))
    *_, item = schedule.create_schedule([F.conv2d(x, w, padding=2, stride=stride,
                                                  groups=8).lazy])
    caps = dataclasses.replace(capabilities(), threads_are_loops=True)
    source = CPURenderer().render(lower(item.root, item.inputs, caps))
    loaded = "pk_f32x16_load_lanes(&" if stride == 1 else "pk_f32x16_load_even(&"
    assert source.count(loaded) == 25 and source.count("pk_f32x16_store_lanes(&") == 1


def test_a_depthwise_conv_on_a_row_of_28_is_written_out_as_two_vectors():
    # EfficientNet's 5 x 5 conv on 28 x 28: as a loop, clang vectorized 16 of the 28 outputs
    # and computed the other 12 one by one
    rng = np.random.default_rng(2)
    x = Tensor(rng.standard_normal((1, 4, 28, 28), dtype=np.float32))
    w = Tensor(rng.standard_normal((4, 1, 5, 5), dtype=np.float32))
    y = F.conv2d(x, w, padding=2, groups=4)
    *_, item = schedule.create_schedule([y.lazy])
    caps = dataclasses.replace(capabilities(), threads_are_loops=True)
    kernel = lower(item.root, item.inputs, caps)
    strips = straight.find(kernel, WIDTHS)
    assert [len(s.stores) for s in strips] == [16, 12]
    import torch
    expected = torch.nn.functional.conv2d(torch.tensor(x.numpy()), torch.tensor(w.numpy()),
                                          padding=2, groups=4).numpy()
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)
