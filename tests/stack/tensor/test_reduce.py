"""Reductions and matmul (portkit/tensor/reduce.py)."""
import numpy as np
import pytest

from portkit.tensor import Tensor

pytestmark = pytest.mark.usefixtures("backend")


# all axes, one axis kept, two axes: each compiles its own kernels on every backend, so three
# (test_properties.py tries single axes of many shapes on the CPU)
@pytest.mark.parametrize("axis,keepdim", [(None, False), (-2, True), ((0, 2), False)])
def test_reductions(axis, keepdim, check, data):
    x = data(2, 3, 4)
    tdim = axis if axis is not None else (0, 1, 2)
    # torch names max and min over axes amax and amin
    for ours, theirs in (("sum", "sum"), ("mean", "mean"), ("var", "var"), ("std", "std"),
                         ("logsumexp", "logsumexp"), ("amax", "amax"), ("amin", "amin")):
        check(lambda t, ours=ours, theirs=theirs: getattr(t, ours)(axis, keepdim=keepdim)
              if isinstance(t, Tensor) else getattr(t, theirs)(tdim, keepdim=keepdim), x)


def test_prod_argmax_argmin(data):
    x = data(3, 4)
    np.testing.assert_allclose(Tensor(x).prod(1).numpy(), x.prod(1), rtol=1e-5)
    np.testing.assert_array_equal(Tensor(x).argmax(1).numpy(), x.argmax(1))
    np.testing.assert_array_equal(Tensor(x).argmin(0).numpy(), x.argmin(0))
    np.testing.assert_array_equal(Tensor(x).argmax().numpy(), x.argmax())
    ties = np.array([1.0, 3.0, 3.0, 0.0], np.float32)
    assert Tensor(ties).argmax().item() == 1


def test_prod_gradient_with_zeros(check):
    x = np.array([[1, 2, 0, 3], [0, 2, 0, 1], [1.5, 2, -1, 3]], np.float32)
    check(lambda t: t.prod(1), x)
    check(lambda t: t.prod(0), x)
    check(lambda t: t.prod(), x)


def test_matmul_and_dot(check, data):
    check(lambda x, y: x @ y, data(3, 4), data(4, 5))
    check(lambda x, y: x @ y, data(2, 3, 4), data(4, 2))
    check(lambda x, y: x @ y, data(4), data(4, 3))
    check(lambda x, y: x.dot(y), data(5), data(5))


def test_softmax_log_softmax(check, data):
    x = data(4, 5)
    check(lambda t: t.softmax(-1), x)
    check(lambda t: t.log_softmax(-1), x)


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dim,keepdim", [(1, False), (-1, True), (0, False)])
def test_max_and_min_over_a_dim_return_values_and_indices(name, dim, keepdim, check):
    torch = pytest.importorskip("torch")
    # ties and a NaN: torch gives the NaN, else the first extreme, and its gradient only
    x = np.array([[1, 3, 3, np.nan], [2, 0, 5, 5], [-1, -1, 4, 0]], np.float32)
    values, indices = getattr(Tensor(x), name)(dim, keepdim)
    want = getattr(torch.tensor(x), name)(dim, keepdim)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    check(lambda t: getattr(t, name)(dim=dim, keepdim=keepdim)[0], np.nan_to_num(x))


def test_max_and_min_of_a_tensor_are_maximum_and_minimum_and_all_dims_give_a_tensor():
    a, b = Tensor([1.0, 5.0, -2.0]), Tensor([3.0, 0.0, -2.0])
    assert a.max(b).tolist() == [3.0, 5.0, -2.0]
    assert a.min(b).tolist() == [1.0, 0.0, -2.0]
    assert a.max().item() == 5.0 and a.min(dim=None).item() == -2.0
    assert Tensor([[1, 7], [4, 2]]).max((0, 1)).item() == 7


@pytest.mark.parametrize("dtype,base,ulp", [("float16", 600.0, 0.5), ("bfloat16", 576.0, 4.0)])
def test_a_long_16_bit_sum_rounds_once_as_torch(dtype, base, ulp, capabilities):
    # 2**17 elements: the scheduler sums 32 slices of 4096, then the 32 partial sums. Each
    # slice sums to base + 0.47 ulp (rounded down, were partials 16-bit; the last slice's base
    # is 15 ulp higher), so 16-bit partials lose 15 ulp and the total falls below a rounding
    # midpoint it lies above: 19215 rounds to 19216 (torch on one thread: it sums in float32
    # and rounds once; on several, each thread's partial sum is rounded too), not 19200.
    torch = pytest.importorskip("torch")
    if dtype not in {d.name for d in capabilities.dtypes}:
        pytest.skip(f"the backend has no {dtype}")
    x = np.zeros(1 << 17, np.float32)
    x[::4096] = base
    x[-4096] += 15 * ulp
    for i, share in enumerate((0.25, 0.125, 0.0625, 0.03125), start=1):
        x[i::4096] = share * ulp
    want = torch.tensor(x).sum().to(getattr(torch, dtype)).float().item()   # exact, rounded
    got = Tensor(x).cast(dtype).sum().float().item()
    assert got == want, f"{dtype} sum {got}, torch {want}"


EMPTY_AND_SCALAR = {   # (input, function of it)
    "softmax of empty": (np.zeros(0), lambda x: x.softmax(0)),
    "softmax of (0, 3) over 0": (np.zeros((0, 3)), lambda x: x.softmax(0)),
    "log_softmax of empty": (np.zeros(0), lambda x: x.log_softmax(0)),
    "logsumexp of empty": (np.zeros(0), lambda x: x.logsumexp(0)),
    "logsumexp of empty, keepdim": (np.zeros(0), lambda x: x.logsumexp(0, keepdim=True)),
    "logsumexp over an empty dim": (np.zeros((2, 0)), lambda x: x.logsumexp(1)),
    "argmax(0) of 0-d": (np.array(3.0), lambda x: x.argmax(0)),
    "argmin(-1) of 0-d": (np.array(3.0), lambda x: x.argmin(-1)),
    "max(0) of 0-d, indices": (np.array(3.0), lambda x: x.max(0)[1]),
}


@pytest.mark.parametrize("case", EMPTY_AND_SCALAR)
def test_empty_and_0d_reductions_match_pytorch_forward_and_backward(case):
    torch = pytest.importorskip("torch")
    array, fn = EMPTY_AND_SCALAR[case]
    ours, theirs = Tensor(array.astype(np.float32), requires_grad=True), torch.tensor(
        array.astype(np.float32), requires_grad=True)
    got, want = fn(ours), fn(theirs)
    assert got.shape == tuple(want.shape)
    assert got.dtype.is_float == want.dtype.is_floating_point
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    if want.dtype.is_floating_point:
        got.sum().backward()
        want.sum().backward()
        np.testing.assert_array_equal(ours.grad.numpy(), theirs.grad.numpy())


def test_argmax_of_0d_refuses_a_dim_past_0_like_pytorch():
    with pytest.raises(IndexError, match="range of \\[-1, 0\\], but got 1"):
        Tensor(3.0).argmax(1)
