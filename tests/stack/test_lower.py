"""Lowering tiles reduce kernels (outputs per thread, partial sums) and keeps results right."""
import dataclasses

import numpy as np
import pytest

from portkit import runtime, schedule
from portkit.abi.kernel import validate
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.codegen.plan import launch_shape, plan
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

CAPABILITIES = capabilities()


def _only_item(t: Tensor) -> schedule.ScheduleItem:
    items = schedule.create_schedule([t.lazy])
    assert len(items) == 1, items
    return items[0]


def _accumulators(kernel) -> int:
    return sum(n.op is Op.ACC for n in kernel.nodes)


def test_matmul_tile_spans_the_contiguous_axis_and_a_reused_one():
    a, b = Tensor(np.ones((64, 48), np.float32)), Tensor(np.ones((48, 96), np.float32))
    item = _only_item(a @ b)
    tiling = plan(item.root, item.inputs)
    # columns: B is contiguous along them and A ignores them; rows: B ignores them
    assert dict(tiling.upcast) == {1: 32, 0: 8}
    kernel = lower(item.root, item.inputs,
                   dataclasses.replace(CAPABILITIES, threads_are_loops=True))
    assert _accumulators(kernel) == 256
    assert kernel.grid[0] * 256 <= 64 * 96


@pytest.mark.parametrize("m, k, n", [(8, 5, 3), (33, 70, 48), (64, 256, 96), (1, 40, 1)])
def test_tiled_matmul_matches_numpy(m, k, n):
    rng = np.random.default_rng(m * n)
    x, y = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
    got = (Tensor(x, device="cpu") @ Tensor(y, device="cpu")).numpy()
    np.testing.assert_allclose(got, x @ y, rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_linear_layer_shape_matmul_is_tiled_along_a_strided_output_axis():
    # x @ W.T: both operands contiguous along the reduce, no output axis contiguous. 16 partial
    # sums per output stayed scalar in clang (2-6 GFLOP/s); 16 x 16 outputs along the strided
    # axes vectorize with gathers (6x faster)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((16, 96), np.float32), rng.standard_normal((64, 96), np.float32)
    out = Tensor(x, device="cpu") @ Tensor(w, device="cpu").T
    tiling = plan(_only_item(out).root, _only_item(out).inputs)
    assert dict(tiling.upcast) == {1: 16, 0: 16} and tiling.unroll is None
    np.testing.assert_allclose(out.numpy(), x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m, k, n", [(64, 784, 512), (33, 70, 48), (16, 40, 10), (1, 33, 16)])
def test_linear_layer_shapes_match_numpy(m, k, n):
    rng = np.random.default_rng(m + k + n)
    x, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
    got = (Tensor(x, device="cpu") @ Tensor(w, device="cpu").T).numpy()
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-4, atol=1e-4 * np.sqrt(k))


@pytest.mark.parametrize("device", ["cpu", "interpreter"])
@pytest.mark.parametrize("n", [101, 37])
def test_a_row_without_a_divisor_takes_full_tiles_the_last_one_shifted_back(device, n):
    # a language-model head, x @ W with W stored (k, n), n = 50257 (odd): no power of two
    # divides the row, and its one-lane tiles left GPT-2's logits scalar (1.6 GB/s)
    rng = np.random.default_rng(n)
    x, w = rng.standard_normal((1, 96), np.float32), rng.standard_normal((96, n), np.float32)
    out = Tensor(x, device=device) @ Tensor(w, device=device)
    item = _only_item(out)
    tiling = plan(item.root, item.inputs)
    assert dict(tiling.upcast) == {1: 32} and tiling.shifted == 1
    kernel = lower(item.root, item.inputs,
                   dataclasses.replace(CAPABILITIES, threads_are_loops=True))
    # 32 lanes: one ungated load of W per lane, and per lane a running sum and a block's sum
    loads = [node for node in kernel.nodes if node.op is Op.LOAD and node.src[0] == 2]
    assert len(loads) == 32 and all(len(node.src) == 2 for node in loads)
    assert _accumulators(kernel) == 2 * 32
    # the last tile stores only the outputs that the tile before it did not
    stores = [node for node in kernel.nodes if node.op is Op.STORE]
    assert len(stores) == 32 and all(len(node.src) == 4 for node in stores)
    np.testing.assert_allclose(out.numpy(), x @ w, rtol=1e-5, atol=1e-5 * np.sqrt(96))


def test_partial_sums_stay_within_the_reordering_bound():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 1000), np.float32)
    item = _only_item(Tensor(x, device="cpu").sum(axis=1))
    # 1000 = 62 * 16 + 8: sixteen partial sums, and a tail loop adds the last 8 terms
    assert plan(item.root, item.inputs).unroll == (1, 16)
    got = Tensor(x, device="cpu").sum(axis=1).numpy()
    exact = x.astype(np.float64).sum(1)
    bound = 1000 * np.finfo(np.float32).eps * np.abs(x).astype(np.float64).sum(1)
    assert np.all(np.abs(got - exact) <= bound)


def test_tiled_kernels_run_on_a_device_with_many_threads_per_group():
    # the interpreter path: threads in blocks, one tile each, no MOD hint
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((12, 40), np.float32), rng.standard_normal((40, 64), np.float32)
    item = _only_item(Tensor(x) @ Tensor(y))
    kernel = validate(lower(item.root, item.inputs, CAPABILITIES))
    CAPABILITIES.check_launch(kernel)
    assert kernel.block[0] > 1
    out, *_ = runtime.get("interpreter").run(kernel, np.zeros(12 * 64, np.float32), x, y)
    np.testing.assert_allclose(out.reshape(12, 64), x @ y, rtol=1e-4, atol=1e-4)


def test_small_block_limit_is_respected():
    caps = dataclasses.replace(CAPABILITIES, max_block_threads=8, max_block=(8, 8, 8))
    item = _only_item(Tensor(np.ones((16, 32), np.float32)).sum(axis=0))
    kernel = lower(item.root, item.inputs, caps)
    caps.check_launch(kernel)
    assert kernel.block[0] <= 8


def test_serial_launch_gives_every_core_several_chunks_of_groups():
    caps = runtime.get("cpu").capabilities
    groups, block, per_thread = launch_shape(1 << 24, caps)
    # the CPU backend hands groups to cores 64 at a time: 1024 groups = 16 chunks
    assert block == 1 and groups >= 256 and groups * per_thread >= 1 << 24
    assert launch_shape(10, caps) == (1, 1, 10)
    assert launch_shape(64, caps, work=1 << 20)[0] == 64


def test_a_padded_expression_reads_its_sources_without_unravelling():
    # a depthwise conv's padded copy of bias + relu: each element of the computed source is
    # found axis by axis, as a padded realized buffer's is, not by a div and mod per axis
    a = Tensor(np.arange(3 * 40 * 40, dtype=np.float32).reshape(1, 3, 40, 40)).realize()
    b = Tensor(np.ones((1, 3, 1, 1), np.float32)).realize()
    pads = ((0, 0), (0, 0), (1, 1), (1, 1))
    computed = (a + b).relu().pad(pads)
    stored = (a + b).relu().realize().pad(pads)

    def divisions(t: Tensor) -> int:
        kernel = schedule.lower_item(schedule.create_schedule([t.lazy])[-1])
        return sum(n.op in (Op.IDIV, Op.MOD) for n in kernel.nodes)

    assert divisions(computed) == divisions(stored)
    np.testing.assert_array_equal(computed.numpy(), np.pad(np.maximum(a.numpy() + 1, 0), pads))


@pytest.mark.parametrize("device", ["cpu", "interpreter"])
@pytest.mark.parametrize("m, k, n, transposed", [(16, 40, 24, True), (1, 96, 101, False)])
def test_a_tiles_epilogue_is_written_once_in_a_loop_over_its_sums(device, m, k, n, transposed):
    # (x @ W + b) * 2 + r with its tile of outputs in registers: the sums pass through LOCAL
    # and one loop computes the epilogue and stores, where each output had its own copy of
    # the epilogue (16 x 8 outputs: 128 stores, a load of the bias per column); the shifted
    # last tile of an odd row still stores only its own outputs
    rng = np.random.default_rng(m + n)
    x = rng.standard_normal((m, k), np.float32)
    w = rng.standard_normal((n, k) if transposed else (k, n), np.float32)
    bias, res = rng.standard_normal(n, np.float32), rng.standard_normal((m, n), np.float32)
    xs, ws, bs, rs = (Tensor(a, device=device) for a in (x, w, bias, res))
    out = ((xs @ (ws.T if transposed else ws)) + bs) * 2 + rs
    item = _only_item(out)
    kernel = lower(item.root, item.inputs,
                   dataclasses.replace(CAPABILITIES, threads_are_loops=True))
    assert len(dict(plan(item.root, item.inputs).upcast)) >= 1
    outputs = [node for node in kernel.nodes if node.op is Op.STORE and node.src[0] == 0]
    bias_param = 1 + [tuple(i.shape) for i in item.inputs].index((n,))   # PARAM 0: output
    bias_loads = [node for node in kernel.nodes
                  if node.op is Op.LOAD and node.src[0] == bias_param]
    assert (len(outputs), len(bias_loads)) == (1, 1)
    assert sum(node.op is Op.LOCAL for node in kernel.nodes) == 1
    w_ = w.T if transposed else w
    np.testing.assert_allclose(out.numpy(), (x @ w_ + bias) * 2 + res, rtol=1e-5,
                               atol=1e-5 * np.sqrt(k))
