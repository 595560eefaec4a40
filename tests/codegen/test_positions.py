"""Element positions rendered as signed int on the CPU (portkit/codegen/positions.py): index math
only, so a wrapping ADD of data keeps its uint32 form, and a convolution's loads have signed
positions throughout (clang then loads its lanes as one vector)."""
from __future__ import annotations

import re

import numpy as np

from portkit import schedule
from portkit.abi import dtypes
from portkit.abi.kernel import KernelBuilder
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.codegen.positions import OFFSET_VAR, positions
from portkit.reference_backends.cpu.renderer import CPURenderer
from portkit.runtime import get
from portkit.tensor import Tensor


def _kernel():
    """out[4g + 1] = in[4g + 1] + 3g (int32): one position, one value."""
    b = KernelBuilder("mixed")
    out, src = b.param(dtypes.int32), b.param(dtypes.int32)
    gid = b.special("group", 0)
    at = b.alu(Op.ADD, b.alu(Op.MUL, gid, b.const(4)), b.const(1))
    value = b.alu(Op.ADD, b.load(src, at), b.alu(Op.MUL, gid, b.const(3)))
    b.store(out, at, value)
    return b.build(grid=(4, 1, 1)), at, value


def test_positions_are_index_math_only():
    kernel, at, value = _kernel()
    signed = positions(kernel)
    assert at in signed and kernel.nodes[at].src[0] in signed
    # the stored value and the 3g inside it reach data: they wrap as the ABI says
    assert value not in signed and kernel.nodes[value].src[1] not in signed


def test_a_position_that_is_also_data_keeps_wrapping():
    b = KernelBuilder("both")
    out = b.param(dtypes.int32)
    gid = b.special("group", 0)
    at = b.alu(Op.MUL, gid, b.const(2))
    b.store(out, at, at)                       # written as a value too
    assert positions(b.build(grid=(4, 1, 1))) == set()


def test_the_cpu_renders_positions_signed_and_data_wrapping():
    kernel, at, value = _kernel()
    source = CPURenderer().render(kernel)
    assert re.search(rf"v{at} = \(v\d+ \+ 1\);", source), source
    assert re.search(rf"v{value} = \(int32_t\)\(\(uint32_t\)", source), source
    data = np.arange(16, dtype=np.int32) * 10
    out, _ = get("cpu").run(kernel, np.zeros(16, np.int32), data)
    expected = np.zeros(16, np.int32)
    expected[1::4] = data[1::4] + 3 * np.arange(4)
    np.testing.assert_array_equal(out, expected)


def test_int32_data_still_wraps_on_the_cpu():
    big = Tensor(np.array([2**31 - 1, -2**31], np.int32), device="cpu")
    np.testing.assert_array_equal((big + np.int32(1)).numpy(), [-2**31, -2**31 + 1])


def test_every_load_of_a_convolution_has_a_signed_position():
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 8, 12, 16), np.float32), device="cpu")
    w = Tensor(rng.standard_normal((8, 8, 3, 3), np.float32), device="cpu")
    item = schedule.create_schedule([x.conv2d(w, padding=1).lazy])[-1]
    kernel = lower(item.root, item.inputs, get("cpu").capabilities)
    signed = positions(kernel)
    index_ops = [kernel.nodes[n.src[1]] for n in kernel.nodes if n.op is Op.LOAD]
    math = [i for i, n in enumerate(kernel.nodes) if n.op in (Op.ADD, Op.MUL)
            and n.dtype == dtypes.int32]
    assert index_ops and math and set(math) <= signed


def test_a_view_whose_offset_is_an_argument_has_signed_positions():
    # x[:, t] * w: the offset is a VAR (schedule/keys.py), itself a position, so every load's
    # position stays signed, as with the offset written as a constant
    x = Tensor(np.zeros((4, 8, 64), np.float32), device="cpu").realize()
    w = Tensor(np.zeros(64, np.float32), device="cpu").realize()
    item, = schedule.create_schedule([((x + 1.0)[:, 3] * x[:, 5] * w).lazy])
    _, scalars = schedule.structure(item.root, item.inputs)
    kernel = lower(item.root, item.inputs, get("cpu").capabilities, scalars=scalars.nodes,
                   slots=scalars.slots)
    offsets = [n for n in kernel.nodes if n.op is Op.VAR and n.arg.startswith(OFFSET_VAR)]
    assert len(offsets) == 2
    math = [i for i, n in enumerate(kernel.nodes) if n.op in (Op.ADD, Op.MUL)
            and n.dtype == dtypes.int32]
    assert math and set(math) <= positions(kernel)
