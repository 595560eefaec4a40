"""Pools (portkit/tensor/pools.py): windows that tile the input as reshapes into blocks,
max pools' gradients given (in blocks, or in phases of the stride), torch's tie rule, and a
block gradient kernel with no div or mod per element."""
import numpy as np
import pytest

import portkit as pk
from portkit import runtime, schedule
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.codegen.plan import plan
from portkit.nn import functional as F
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
TF = torch.nn.functional


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("name,args,kwargs,shape", [
    ("max_pool2d", (2,), {}, (2, 3, 9, 7)),
    ("max_pool2d", (3,), {}, (2, 3, 9, 7)),
    ("max_pool2d", ((2, 3),), {}, (2, 3, 8, 9)),
    ("max_pool2d", (2, 2, 1), {}, (2, 3, 7, 6)),
    ("max_pool2d", (2,), {"ceil_mode": True}, (2, 3, 7, 5)),
    ("max_pool1d", (3,), {}, (2, 3, 10)),
    ("max_pool3d", (2,), {}, (1, 2, 4, 5, 6)),
    ("avg_pool2d", (2,), {}, (2, 3, 9, 7)),
    ("avg_pool1d", (3,), {}, (2, 3, 10)),
    ("avg_pool3d", (2,), {}, (1, 2, 4, 5, 6)),
    # overlapping windows: the gradient laid out in phases of the stride
    ("max_pool2d", (3, 2, 1), {}, (2, 3, 9, 8)),
    ("max_pool2d", (3, 1, 1), {}, (1, 2, 6, 7)),
    ("max_pool2d", ((3, 2), (2, 1), (1, 0)), {"ceil_mode": True}, (1, 2, 7, 6)),
    ("max_pool1d", (3, 2, 1), {}, (2, 3, 9)),
    ("max_pool3d", (3, 2, 1), {}, (1, 2, 5, 4, 6)),
])
def test_pools_match_torch_with_ties(name, args, kwargs, shape, check, same_call):
    # small integers: most windows hold their maximum twice or more, and torch's gradient goes
    # to the first in row-major order
    ties = np.random.default_rng(3).integers(0, 3, shape).astype(np.float32)
    check(same_call(name, *args, **kwargs), ties)


def test_a_tie_sends_the_gradient_to_the_first_maximum():
    x = Tensor(np.array([[[[1, 2], [2, 1]], [[5, 5], [5, 5]]]], np.float32),
               requires_grad=True)
    (F.max_pool2d(x, 2) * Tensor(np.array([3, 7], np.float32).reshape(1, 2, 1, 1))).sum() \
        .backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[[[0, 3], [0, 0]], [[7, 0], [0, 0]]]])


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("name,args,kwargs,shape", [
    ("max_pool2d", (2,), {}, (2, 3, 8, 6)),
    ("max_pool2d", (2, 2, 1), {}, (2, 3, 7, 6)),
    ("max_pool2d", (2,), {"ceil_mode": True}, (2, 3, 7, 5)),
    ("max_pool2d", (3, 2, 1), {}, (2, 3, 9, 8)),
    ("max_pool1d", (3, 2, 1), {}, (2, 3, 9)),
    ("max_pool3d", (2,), {}, (1, 2, 4, 4, 6)),
])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_max_pool_gradient_is_torchs_with_nan_and_infinities(name, args, kwargs, shape, dtype,
                                                                capabilities, same_call):
    # torch's kernels keep the first maximum and move on a greater value or a NaN: a window
    # with NaNs sends its gradient to the last one, a window whose real elements are all -inf
    # to the first of them (never to padding); small integers make ties and exact sums
    if getattr(pk, dtype) not in capabilities.dtypes:
        pytest.skip(f"no {dtype} here")
    rng = np.random.default_rng(5)
    x = rng.integers(0, 3, shape).astype(np.float32)
    x[rng.random(shape) < 0.1] = np.nan
    x[rng.random(shape) < 0.2] = -np.inf
    x[..., 0, :] = -np.inf
    expected = torch.tensor(x, dtype=getattr(torch, dtype), requires_grad=True)
    want = same_call(name, *args, **kwargs)(expected)
    g = rng.integers(1, 4, want.shape).astype(np.float32)
    (want * torch.tensor(g, dtype=want.dtype)).sum().backward()
    ours = Tensor(x, dtype=dtype, requires_grad=True)
    got = same_call(name, *args, **kwargs)(ours)
    (got * Tensor(g, dtype=dtype)).sum().backward()
    np.testing.assert_array_equal(got.numpy().astype(np.float32), want.detach().float().numpy())
    np.testing.assert_array_equal(ours.grad.numpy().astype(np.float32),
                                  expected.grad.float().numpy())


def test_a_max_pool_gradient_in_blocks_reads_the_input_in_one_reduce():
    # the gradient kernel reads each window's first maximum (one int per window, found once by
    # a reduce over the window) and g: the old one reloaded the window for each of its terms
    x = Tensor(np.random.default_rng(0).standard_normal((2, 4, 16, 32)).astype(np.float32),
               requires_grad=True, device="cpu")
    y = F.max_pool2d(x, 2)
    (y * Tensor(np.ones(y.shape, np.float32), device="cpu")).sum().backward()
    items = schedule.create_schedule([x.grad.lazy])
    blocks, = (it for it in items if it.root.shape == (2, 4, 8, 2, 16, 2, 1))
    first, = (it for it in items if it.root.dtype == pk.int32)
    assert any(i is x.lazy for i in first.inputs)
    # written out along the output row as the forward's max is, though it also reads the
    # window's maximum, one value per output: as a loop over each window it decoded its
    # position with a div and a mod per window and ran at a third of the speed
    assert plan(first.root, first.inputs).inline is not None
    assert not any(i is x.lazy for i in blocks.inputs)
    kernel = lower(blocks.root, blocks.inputs, runtime.get("cpu").capabilities)
    assert sum(node.op is Op.LOAD for node in kernel.nodes) == 2


def _range_dependent_divisions(kernel) -> list:
    """IDIV and MOD nodes that depend on a loop other than the first (the thread's loop over
    rows): a div or a mod per element rather than per row."""
    depends: list[set[int]] = []
    first = next(i for i, n in enumerate(kernel.nodes) if n.op is Op.RANGE)
    found = []
    for i, node in enumerate(kernel.nodes):
        ranges = set().union(*(depends[s] for s in node.src if isinstance(s, int)
                               and s < len(depends))) if node.src else set()
        if node.op is Op.RANGE and i != first:
            ranges = ranges | {i}
        depends.append(ranges)
        if node.op in (Op.IDIV, Op.MOD) and ranges:
            found.append(node)
    return found


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_a_pool_gradient_in_blocks_has_no_div_or_mod_per_element(pool):
    # the old gradient, derived from sliding windows, gathered a 3x3 neighbourhood with about
    # a hundred div/mod per term
    x = Tensor(np.random.default_rng(0).standard_normal((2, 4, 16, 32)).astype(np.float32),
               requires_grad=True, device="cpu")
    y = F.max_pool2d(x, 2) if pool == "max" else F.avg_pool2d(x, 2)
    (y * Tensor(np.ones(y.shape, np.float32), device="cpu")).sum().backward()
    items = schedule.create_schedule([x.grad.lazy])
    blocks = [it for it in items if it.root.shape == (2, 4, 8, 2, 16, 2, 1)]
    assert len(blocks) == 1, [it.root.shape for it in items]
    kernel = lower(blocks[0].root, blocks[0].inputs, runtime.get("cpu").capabilities)
    assert not _range_dependent_divisions(kernel)
    expected = torch.tensor(x.numpy(), requires_grad=True)
    (TF.max_pool2d if pool == "max" else TF.avg_pool2d)(expected, 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), expected.grad.numpy(), atol=1e-6)


@pytest.mark.parametrize("size", [16, 24])
def test_a_max_pool_row_of_strided_windows_is_a_loop(size):
    # rows of 8 and 12 outputs, each reading a stride-2 window: written out whole (as a
    # depthwise conv's short rows are) clang left the lanes scalar, at 4-5x the loop's time
    x = Tensor(np.random.default_rng(0).standard_normal((2, 4, size, size)).astype(np.float32),
               device="cpu")
    item = schedule.create_schedule([F.max_pool2d(x, 2).lazy])[-1]
    tiling = plan(item.root, item.inputs)
    assert tiling.inline is not None and tiling.upcast == ()
