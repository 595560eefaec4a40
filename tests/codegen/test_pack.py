"""Packed panels for devices whose threads are loops (portkit/codegen/pack.py): when the pass
applies, what its kernel holds, and that it computes what numpy does at odd sizes, for
transposed, broadcast and batched operands and 16-bit floats, on the CPU and in the interpreter
(the executable definition of the ABI)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import runtime, schedule
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.codegen.plan import register_block
from portkit.graph import GraphOp
from portkit.nn import functional as F
from portkit.reference_backends.cpu.renderer import CPURenderer
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor


def _vector() -> str:
    """The cpu backend's vector type for float32 (codegen/lanes.py): one host register."""
    renderer = runtime.get("cpu").device.renderer
    return f"{renderer.vector_types[dtypes.float32]}x{renderer.vector_bytes // 4}"


CAPABILITIES = capabilities()

RNG = np.random.default_rng(0)
# a device whose threads are loops, as the CPU backend declares, on the interpreter's datasheet;
# its large kernels run on the cpu backend, which takes any such kernel (the interpreter runs a
# loop's ops one element at a time: minutes for a 512 x 784 x 64 matmul)
LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)


def _item(a: np.ndarray, b: np.ndarray, device: str = "interpreter", transposed: bool = False):
    x, w = Tensor(a, device=device), Tensor(b, device=device)
    item, = schedule.create_schedule([(x @ (w.T if transposed else w)).lazy])
    return item


def _ops(kernel) -> list[Op]:
    return [n.op for n in kernel.nodes]


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _close(actual: np.ndarray, expected: np.ndarray, k: int) -> None:
    """Within the gamma_k bound of a float32 dot product of length k (with margin)."""
    bound = 2 * k * np.finfo(np.float32).eps * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=bound)


def test_a_matmul_on_a_device_whose_threads_are_loops_is_packed():
    item = _item(_floats(64, 300), _floats(300, 70))
    kernel = lower(item.root, item.inputs, LOOPS)
    ops = _ops(kernel)
    assert ops.count(Op.LOCAL) == 2 and Op.BARRIER not in ops     # the panel and the sums
    assert Op.MULACC in ops and kernel.block == (1, 1, 1)
    LOOPS.check_launch(kernel)


def test_the_running_sums_are_stored_by_a_loop_not_one_store_per_output():
    item = _item(_floats(64, 600), _floats(600, 64))       # three depth blocks: sums in LOCAL
    kernel = lower(item.root, item.inputs, LOOPS)
    out = next(i for i, n in enumerate(kernel.nodes) if n.op is Op.PARAM and n.arg == 0)
    stores = [n for n in kernel.nodes if n.op is Op.STORE and n.src[0] == out]
    assert len(stores) == 1                 # not one per element of the 8 x 32 register block


def test_a_reduce_of_one_depth_block_keeps_no_running_sums():
    item = _item(_floats(512, 64), _floats(64, 784))        # the MLP's weight gradient
    _, packing = pack.find(item.root, item.inputs, LOOPS)
    ops = _ops(lower(item.root, item.inputs, LOOPS))
    # the B panel, A's block when it is staged, and one register block's sums (which a loop
    # stores); no running sums of every block
    assert ops.count(Op.LOCAL) == 2 + packing.packed_a and Op.MULACC in ops


@pytest.mark.parametrize("staged", [False, True])
def test_one_depth_block_stores_its_registers_as_vectors(staged):
    a, b = _floats(64, 48), _floats(48, 96)                 # a 1x1 conv's shape: k = 48
    x, w = Tensor(a, device="interpreter"), Tensor(b, device="interpreter")
    # an A that is more than a load (a residual sum) is staged, its group spanning panels
    item, = schedule.create_schedule([(((x + x) if staged else x) @ w).lazy])
    _, packing = pack.find(item.root, item.inputs, LOOPS)
    assert packing.depth == 48 and packing.packed_a == staged
    kernel = lower(item.root, item.inputs, LOOPS)
    # no LOCAL for the sums: the B panel, and A's block when it is staged
    assert [n.op for n in kernel.nodes].count(Op.LOCAL) == 1 + staged
    # the registers go to the output as vectors (lanes.Flush), not lane by lane
    source = CPURenderer().render(kernel)
    assert source.count("pk_f32x16_store(&data0[") == packing.rows * packing.width // 16
    assert "pk_f32x16_add_into(&" not in source
    out, *_ = runtime.get("cpu").run(kernel, np.zeros(64 * 96, np.float32), a, b)
    _close(out.reshape(64, 96), (a * (2 if staged else 1)).astype(np.float64) @ b, 48)


def test_a_device_with_less_workgroup_memory_gets_shallower_panels():
    item = _item(_floats(64, 300), _floats(300, 70))
    caps = dataclasses.replace(LOOPS, local_memory_bytes=32 * 1024)   # the LLVM starter's
    _, packing = pack.find(item.root, item.inputs, caps)
    assert packing.depth < pack.DEPTH and packing.local_bytes(4) <= 32 * 1024


@pytest.mark.parametrize("change", [{"threads_are_loops": False}, {"local_memory_bytes": 0},
                                    {"local_memory_bytes": 4096}])
def test_devices_with_lanes_or_without_room_for_the_panels_are_not_packed(change):
    caps = dataclasses.replace(LOOPS, **change)
    item = _item(_floats(64, 300), _floats(300, 70))
    assert pack.find(item.root, item.inputs, caps) is None


def test_small_matmuls_and_plain_sums_are_not_packed():
    small = _item(_floats(7, 13), _floats(13, 5))
    assert pack.find(small.root, small.inputs, LOOPS) is None
    x = Tensor(_floats(64, 64), device="interpreter")
    item, = schedule.create_schedule([(x * x).sum(axis=1).lazy])
    assert pack.find(item.root, item.inputs, LOOPS) is None


def test_without_mulacc_the_products_are_added():
    caps = dataclasses.replace(LOOPS, ops=LOOPS.ops - {Op.MULACC})
    item = _item(_floats(64, 300), _floats(300, 70))
    ops = _ops(lower(item.root, item.inputs, caps))
    assert Op.MULACC not in ops and Op.LOCAL in ops


def test_blocking_follows_the_shape():
    m_by_8 = _item(_floats(64, 784), _floats(512, 784), transposed=True)
    _, packing = pack.find(m_by_8.root, m_by_8.inputs, LOOPS)
    assert (packing.rows, packing.width) == (8, 32)        # an 8 x 32 register block
    assert packing.depth <= pack.DEPTH and 784 % packing.depth == 0
    # m = 64 is one block of 8 x 8 rows, so 16 panels along n are the workgroups
    assert 64 // (packing.rows * packing.blocks) * 16 >= 16
    odd = _item(_floats(33, 65), _floats(65, 50))
    _, packing = pack.find(odd.root, odd.inputs, LOOPS)
    assert packing.rows == 8                # 3 divide m: 8 with a remainder block
    even = _item(_floats(42, 65), _floats(65, 50))
    _, packing = pack.find(even.root, even.inputs, LOOPS)
    assert packing.rows == 7                # the most register rows, up to 8, that divide m


# (m, k, n): an edge in each of m (a register block), n (a panel) and k (a depth block)
SHAPES = [(64, 300, 70), (40, 301, 33), (33, 65, 50), (8, 520, 16), (96, 128, 128)]


@pytest.mark.parametrize("m, k, n", SHAPES)
def test_packed_kernels_compute_the_matmul_in_the_interpreter(m, k, n):
    a, b = _floats(m, k), _floats(k, n)
    item = _item(a, b)
    kernel = lower(item.root, item.inputs, LOOPS)
    assert Op.LOCAL in _ops(kernel)
    out, *_ = runtime.get("interpreter").run(kernel, np.zeros(m * n, np.float32), a, b)
    _close(out.reshape(m, n), a.astype(np.float64) @ b, k)


@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 13, 5), (33, 65, 17), *SHAPES,
                                     (512, 512, 512)])
def test_cpu_matmuls_match_numpy(m, k, n):
    a, b = _floats(m, k), _floats(k, n)
    out = (Tensor(a) @ Tensor(b)).numpy()
    _close(out, a.astype(np.float64) @ b, k)


def test_an_elementwise_epilogue_is_computed_from_the_registers():
    # an SGD update of a weight by its gradient, one kernel: W - (dy.T @ x) * lr
    w, dy, x = _floats(512, 784), _floats(64, 512), _floats(64, 784)
    tw, tdy, tx = (Tensor(v, device="interpreter") for v in (w, dy, x))
    item, = schedule.create_schedule([(tw - (tdy.T @ tx) * 0.01).lazy])
    kernel = lower(item.root, item.inputs, LOOPS)
    assert Op.LOCAL in _ops(kernel) and Op.MULACC in _ops(kernel)
    arrays = {id(t.lazy): v for t, v in ((tw, w), (tdy, dy), (tx, x))}
    out, *_ = runtime.get("cpu").run(kernel, np.zeros(w.size, np.float32),
                                     *(arrays[id(node)] for node in item.inputs))
    _close(out.reshape(w.shape), w - (dy.T.astype(np.float64) @ x) * np.float32(0.01), 64)


def test_an_epilogue_on_the_cpu_with_a_bias_and_relu():
    a, b, c = _floats(70, 300), _floats(300, 50), _floats(50)
    out = ((Tensor(a) @ Tensor(b)) + Tensor(c)).relu().numpy()
    _close(out, np.maximum(a.astype(np.float64) @ b + c, 0), 300)


def test_x_at_w_transposed_reads_the_weight_along_k():
    x, w = _floats(64, 784), _floats(512, 784)
    item = _item(x, w, transposed=True)
    assert pack.find(item.root, item.inputs, LOOPS) is not None
    _close((Tensor(x) @ Tensor(w).T).numpy(), x.astype(np.float64) @ w.T, 784)


def test_transposed_broadcast_and_batched_operands():
    a, b = _floats(300, 40), _floats(70, 300)          # a.T @ b.T: both operands strided
    _close((Tensor(a).T @ Tensor(b).T).numpy(), a.T.astype(np.float64) @ b.T, 300)
    batched, shared = _floats(3, 40, 64), _floats(64, 48)   # B broadcast over the batch
    _close((Tensor(batched) @ Tensor(shared)).numpy(), batched.astype(np.float64) @ shared, 64)
    left, right = _floats(2, 3, 24, 64), _floats(2, 3, 64, 40)
    _close((Tensor(left) @ Tensor(right)).numpy(), left.astype(np.float64) @ right, 64)


def test_a_fused_operand_is_computed_at_the_panel_positions():
    a, b = _floats(64, 96), _floats(96, 64)
    out = ((Tensor(a) * 2).relu() @ (Tensor(b) + 1)).numpy()
    _close(out, np.maximum(a.astype(np.float64) * 2, 0) @ (b + 1.0), 96)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_matmuls_accumulate_in_float32(dtype):
    import portkit
    a = RNG.random((64, 512)).astype(np.float32)
    b = RNG.random((512, 64)).astype(np.float32)
    wide = getattr(portkit, dtype)
    x, w = Tensor(a).cast(wide), Tensor(b).cast(wide)
    item, = schedule.create_schedule([(x @ w).lazy])
    kernel = lower(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert Op.LOCAL in _ops(kernel)
    exact = x.cast(portkit.float32).numpy().astype(np.float64) @ w.cast(
        portkit.float32).numpy().astype(np.float64)
    out = (x @ w).cast(portkit.float32).numpy()
    tolerance = 1e-3 if dtype == "float16" else 8e-3     # one rounding of the result
    np.testing.assert_allclose(out, exact, rtol=tolerance)


def test_a_long_sum_of_products_is_blocked():
    # each depth block sums into fresh registers, then into the total: the error grows with
    # depth + k / depth additions, not with k (one running sum is off by 2e-3 here)
    k = 1 << 16
    a, b = np.full((8, k), 0.1, np.float32), np.ones((k, 32), np.float32)
    out = (Tensor(a) @ Tensor(b)).numpy()
    exact = k * np.float64(np.float32(0.1))
    bound = (pack.DEPTH + k / pack.DEPTH) * np.finfo(np.float32).eps
    np.testing.assert_allclose(out, exact, rtol=bound)


def test_float64_matmuls_are_packed_and_exact_to_their_bound():
    import portkit
    a, b = RNG.standard_normal((100, 520)), RNG.standard_normal((520, 96))
    x, w = Tensor(a, dtype=portkit.float64), Tensor(b, dtype=portkit.float64)
    item, = schedule.create_schedule([(x @ w).lazy])
    assert pack.find(item.root, item.inputs, runtime.get("cpu").capabilities) is not None
    bound = 2 * 520 * np.finfo(np.float64).eps * (np.abs(a) @ np.abs(b)).max()
    np.testing.assert_allclose((x @ w).numpy(), a @ b, rtol=0, atol=bound)


def _relu_gradient(h: np.ndarray, dy: np.ndarray, x: np.ndarray, device: str):
    """The MLP's weight gradient with its relu mask fused into A: (dy * (h > 0)).T @ x."""
    th, tdy, tx = (Tensor(v, device=device) for v in (h, dy, x))
    return th, tdy, tx, (tdy * (th > 0).cast(tdy.dtype)).T @ tx


def test_a_fused_a_of_one_depth_block_is_staged_once_for_several_panels():
    h, dy, x = _floats(64, 512), _floats(64, 512), _floats(64, 784)
    th, tdy, tx, grad = _relu_gradient(h, dy, x, "interpreter")
    item, = schedule.create_schedule([grad.lazy])
    _, packing = pack.find(item.root, item.inputs, LOOPS)
    # each A element (three loads, a compare, a select) is computed by fewer groups than
    # there are panels along n, so the block is staged and a group spans several panels
    assert packing.packed_a and packing.spans > 1
    kernel = lower(item.root, item.inputs, LOOPS)
    # the panel, A's staged block and one register block's sums
    assert _ops(kernel).count(Op.LOCAL) == 3 and kernel.grid[0] >= 16
    source = runtime.get("cpu").compile(lower(item.root, item.inputs,
                                              runtime.get("cpu").capabilities)).source
    # the register block is still held in vectors (as wide as the host's registers)
    assert f"= {_vector()}_fma(" in source
    arrays = {id(t.lazy): v for t, v in ((th, h), (tdy, dy), (tx, x))}
    out, *_ = runtime.get("cpu").run(kernel, np.zeros(512 * 784, np.float32),
                                     *(arrays[id(node)] for node in item.inputs))
    expected = (dy * (h > 0)).T.astype(np.float64) @ x
    _close(out.reshape(512, 784), expected, 64)


@pytest.mark.parametrize("m, k, n", [(40, 33, 70), (24, 64, 100), (512, 64, 784)])
def test_staged_a_on_the_cpu_at_odd_sizes_and_with_an_epilogue(m, k, n):
    h, dy, x, w = _floats(k, m), _floats(k, m), _floats(k, n), _floats(m, n)
    *_, grad = _relu_gradient(h, dy, x, "cpu")
    out = (Tensor(w) - grad * 0.01).numpy()            # an SGD update from the registers
    expected = w - ((dy * (h > 0)).T.astype(np.float64) @ x) * np.float32(0.01)
    _close(out, expected, k)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("k", [64, 520])        # one depth block, and three with an edge
def test_a_staged_16_bit_a_is_summed_in_float32(dtype, k):
    import portkit
    h, dy = RNG.random((k, 96)).astype(np.float32) - 0.5, RNG.random((k, 96)).astype(
        np.float32)
    x = RNG.random((k, 80)).astype(np.float32)
    wide = getattr(portkit, dtype)
    th, tdy, tx = (Tensor(v).cast(wide) for v in (h, dy, x))
    grad = (tdy * (th > 0).cast(wide)).T @ tx
    item, = schedule.create_schedule([grad.lazy])
    _, packing = pack.find(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert packing.packed_a

    def f32(t):
        return t.cast(portkit.float32).numpy().astype(np.float64)

    exact = (f32(tdy) * (f32(th) > 0)).T @ f32(tx)
    out = grad.cast(portkit.float32).numpy()
    tolerance = 1e-3 if dtype == "float16" else 8e-3     # one rounding of the result
    np.testing.assert_allclose(out, exact, rtol=tolerance, atol=tolerance)


def test_a_narrow_output_takes_one_vector_and_few_groups():
    # the MLP's logits: 10 columns, a half-width (one float32 vector) block, and 64 x 10 x 512
    # multiply-adds are not worth 16 workgroups
    a, b = _floats(64, 512), _floats(10, 512)
    x, w = Tensor(a, device="interpreter"), Tensor(b, device="interpreter")
    item, = schedule.create_schedule([(x @ w.T).lazy])
    _, packing = pack.find(item.root, item.inputs, LOOPS)
    assert packing.width == 16
    kernel = lower(item.root, item.inputs, LOOPS)
    assert kernel.grid[0] < 16
    arrays = {id(x.lazy): a, id(w.lazy): b}
    out, *_ = runtime.get("interpreter").run(kernel, np.zeros(640, np.float32),
                                             *(arrays[id(node)] for node in item.inputs))
    _close(out.reshape(64, 10), a.astype(np.float64) @ b.T, 512)
    _close((Tensor(a) @ Tensor(b).T).numpy(), a.astype(np.float64) @ b.T, 512)


def test_staged_a_with_a_batch_and_a_transposed_b():
    # a batched weight-gradient shape (K = 48 fits one depth block) whose A is relu'd and
    # whose B is read transposed: the staged block and the spanned panels follow the batch
    a, b = _floats(2, 3, 40, 48), _floats(2, 3, 72, 48)
    grad = Tensor(a).relu() @ Tensor(b).transpose(-1, -2)
    item, = schedule.create_schedule([grad.lazy])
    _, packing = pack.find(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert packing.packed_a and packing.spans > 1
    expected = np.maximum(a, 0).astype(np.float64) @ np.swapaxes(b, -1, -2)
    _close(grad.numpy(), expected, 48)


def test_a_fused_a_of_several_depth_blocks_is_staged_out_of_the_multiply_adds():
    # layer 2's input relu(h + b) @ W.T: K = 600 is three depth blocks, the last one short
    h, bias, w = _floats(40, 600), _floats(600), _floats(70, 600)
    th, tb, tw = (Tensor(v, device="interpreter") for v in (h, bias, w))
    item, = schedule.create_schedule([((th + tb).relu() @ tw.T).lazy])
    _, packing = pack.find(item.root, item.inputs, LOOPS)
    assert packing.packed_a and packing.along_k and packing.depth < 600
    kernel = lower(item.root, item.inputs, LOOPS)
    assert _ops(kernel).count(Op.LOCAL) == 3          # the panel, the staged A, the sums
    arrays = {id(t.lazy): v for t, v in ((th, h), (tb, bias), (tw, w))}
    out, *_ = runtime.get("cpu").run(kernel, np.zeros(40 * 70, np.float32),
                                     *(arrays[id(node)] for node in item.inputs))
    expected = np.maximum(h.astype(np.float64) + bias, 0) @ w.T
    _close(out.reshape(40, 70), expected, 600)
    _close(((Tensor(h) + Tensor(bias)).relu() @ Tensor(w).T).numpy(), expected, 600)


def test_a_staged_a_read_across_k_on_the_cpu():
    # A = relu(x).T steps by 1 along m: staged [k][row]; 24 rows, K = 300 (an edge)
    x, b = _floats(300, 24), _floats(300, 50)
    product = Tensor(x).relu().T @ Tensor(b)
    item, = schedule.create_schedule([product.lazy])
    _, packing = pack.find(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert packing.packed_a and not packing.along_k
    out = product.numpy()
    _close(out, np.maximum(x, 0).T.astype(np.float64) @ b, 300)


@pytest.mark.parametrize("kwargs", [{}, {"padding": 1, "output_padding": 1}])
def test_a_transposed_conv_of_stride_kernel_is_a_packed_matmul_and_a_permute(kwargs):
    # a U-Net decoder's 2x2 stride-2 upsampling: its windows do not overlap, so it is a matmul
    # whose output a permute spreads over the taps; fused into that permute, the sum lost its
    # panels (0.3 GFLOP/s: the spread input's zeros read through a gate)
    torch = pytest.importorskip("torch")
    x, w, b = _floats(2, 64, 5, 6), _floats(64, 40, 2, 2), _floats(40)
    y = F.conv_transpose2d(Tensor(x), Tensor(w), Tensor(b), stride=2, **kwargs)
    matmul, permute = schedule.create_schedule([y.lazy])
    assert matmul.root.op is GraphOp.REDUCE and matmul.root in permute.inputs
    assert pack.find(matmul.root, matmul.inputs, LOOPS) is not None
    expected = torch.nn.functional.conv_transpose2d(
        *map(torch.from_numpy, (x, w, b)), stride=2, **kwargs).numpy()
    _close(y.numpy(), expected, 64)


@pytest.mark.parametrize("steps", [6, 70])      # one depth block, and two
def test_a_weight_gradient_over_batch_and_time_stages_a_k_by_k(steps):
    # dy [b, t, m] steps by 1 along m and by m along the flat k = (b, t): staged [k][row],
    # its copy streams dy's rows, where row by row it read each row's k terms m floats apart
    x, w, r = _floats(4, steps, 48), _floats(64, 48), _floats(4, steps, 64)
    tw = Tensor(w, device="cpu", requires_grad=True)
    (F.linear(Tensor(x, device="cpu"), tw) * Tensor(r, device="cpu")).sum().backward()
    item = schedule.create_schedule([tw.grad.lazy])[-1]
    found, packing = pack.find(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert found.k_fold and packing.packed_a and not packing.along_k
    expected = r.reshape(-1, 64).T.astype(np.float64) @ x.reshape(-1, 48)
    _close(tw.grad.numpy(), expected, 4 * steps)


@pytest.mark.parametrize("rows", [16, 12])
def test_few_rows_times_w_transposed_trade_places(rows):
    # h @ W.T with a recurrent step's 16 rows: W's rows are m, read in place, and the few rows
    # are n, one vector of lanes, so no group copies a panel of W.T (a gather of W's rows)
    x, w = _floats(rows, 256), _floats(1024, 256)
    item = _item(x, w, "cpu", transposed=True)
    found, packing = pack.find(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert found.sizes == (1024, rows, 256)
    assert found.reduce.src[0].shape[found.m] == 1024
    block = register_block(runtime.get("cpu").capabilities)
    assert packing.width == block.vector // 2
    assert packing.rows * packing.width == block.accumulators
    out = (Tensor(x, device="cpu") @ Tensor(w, device="cpu").T).numpy()
    _close(out, x.astype(np.float64) @ w.T, 256)


@pytest.mark.parametrize("rows", [(560,), (16, 35)])
def test_a_plain_matmul_of_one_depth_block_takes_more_blocks_per_group(rows):
    # one register block's sums in LOCAL whatever the blocks: the LSTM's head (560 x 256 by
    # 2000 x 256, its rows batch by time) copies each panel of W.T in two groups along m, not
    # five
    x, w = _floats(*rows, 256), _floats(2000, 256)
    item = _item(x, w, "cpu", transposed=True)
    _, packing = pack.find(item.root, item.inputs, runtime.get("cpu").capabilities)
    assert packing.rows * packing.blocks >= 280 and not packing.summed
    out = (Tensor(x, device="cpu") @ Tensor(w, device="cpu").T).numpy()
    _close(out, x.astype(np.float64) @ w.T, 256)
