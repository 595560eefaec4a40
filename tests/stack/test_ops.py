"""Tensor ops against numpy and PyTorch (CPU), forward and backward, on every backend.

Each test runs once per backend that loads here (the `backend` fixture in conftest.py sets the
default device), so the same assertions hold for cpu, opencl, webgpu and the interpreter.
"""
import math

import numpy as np
import pytest

import portkit.tensor as pt
from portkit.abi import dtypes
from portkit.abi.errors import UnsupportedDType
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")

RNG = np.random.default_rng(0)


def data(*shape, positive=False):
    x = RNG.standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


def check(fn, *arrays, torch_fn=None, atol=1e-5, rtol=1e-4, grad=True):
    """fn on portkit tensors and torch_fn (default fn) on torch tensors agree, with grads."""
    ours = [Tensor(a, requires_grad=grad) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=grad) for a in arrays]
    out, ref = fn(*ours), (torch_fn or fn)(*theirs)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=atol, rtol=rtol)
    if grad:
        weights = RNG.standard_normal(ref.shape).astype(np.float32)
        if out.requires_grad:     # ops with zero gradient everywhere (sign) record nothing
            (out * Tensor(weights)).sum().backward()
        if ref.requires_grad:
            (ref * torch.tensor(weights)).sum().backward()
        for o, t in zip(ours, theirs):
            expected = t.grad.numpy() if t.grad is not None else np.zeros_like(o.numpy())
            got = o.grad.numpy() if o.grad is not None else np.zeros_like(expected)
            np.testing.assert_allclose(got, expected, atol=atol * 10, rtol=rtol * 10)


UNARY = {
    "exp": (lambda x: x.exp(), False), "log": (lambda x: x.log(), True),
    "sqrt": (lambda x: x.sqrt(), True), "rsqrt": (lambda x: x.rsqrt(), True),
    "sin": (lambda x: x.sin(), False), "cos": (lambda x: x.cos(), False),
    "tan": (lambda x: x.tan(), False), "tanh": (lambda x: x.tanh(), False),
    "sigmoid": (lambda x: x.sigmoid(), False), "relu": (lambda x: x.relu(), False),
    "abs": (lambda x: x.abs(), False), "neg": (lambda x: -x, False),
    "reciprocal": (lambda x: x.reciprocal(), True), "silu": (lambda x: x.silu() if isinstance(x, Tensor) else torch.nn.functional.silu(x),
             False),
    "square": (lambda x: x ** 2, False), "pow_float": (lambda x: x ** 1.7, True),
    "sign": (lambda x: x.sign(), False), "floor": (lambda x: x.floor(), False),
    "ceil": (lambda x: x.ceil(), False), "trunc": (lambda x: x.trunc(), False),
    "round": (lambda x: x.round(), False),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name):
    fn, positive = UNARY[name]
    check(fn, data(3, 5, positive=positive))


def test_activations_with_torch_names():
    F = torch.nn.functional
    check(lambda x: x.leaky_relu(0.1), data(4, 4), torch_fn=lambda x: F.leaky_relu(x, 0.1))
    check(lambda x: x.gelu(), data(4, 4), torch_fn=F.gelu)
    check(lambda x: x.gelu(approximate="tanh"), data(4, 4),
          torch_fn=lambda x: F.gelu(x, approximate="tanh"))
    check(lambda x: x.softplus(), data(4, 4), torch_fn=F.softplus)
    check(lambda x: x.clip(-0.5, 0.5), data(4, 4), torch_fn=lambda x: x.clamp(-0.5, 0.5))


def test_gelu_and_erf_are_exact_to_float32():
    """Within 1e-6 of torch's float64 values (torch's own float32 gelu is about 1e-6 off)."""
    x = np.concatenate([np.linspace(-10, 10, 2001), np.linspace(-0.6, 0.6, 121)]
                       ).astype(np.float32)
    exact = torch.tensor(x, dtype=torch.float64)
    F = torch.nn.functional
    for ours, theirs in ((Tensor(x).gelu(), F.gelu(exact)), (Tensor(x).erf(), exact.erf()),
                         (Tensor(x).erfc(), exact.erfc())):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=1e-6)
    # erfc keeps its relative accuracy where it is tiny, so gelu does for negative x (where
    # torch's 1 + erf cancels to 0: the reference is math.erfc)
    tail = x[x < -3].astype(np.float64)
    want = [0.5 * v * math.erfc(-v / math.sqrt(2)) for v in tail]
    np.testing.assert_allclose(Tensor(tail.astype(np.float32)).gelu().numpy(), want, rtol=5e-5)


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((4,), (2, 3, 4)),
                                    ((), (2, 3)), ((2, 0), (1, 0))])
def test_binary_broadcast(shapes):
    a, b = data(*shapes[0]), data(*shapes[1], positive=True)
    for fn in (lambda x, y: x + y, lambda x, y: x - y, lambda x, y: x * y,
               lambda x, y: x / y, lambda x, y: x.maximum(y), lambda x, y: x.minimum(y)):
        check(fn, a, b)


def test_reflected_and_scalar_forms():
    check(lambda x: 2 - x, data(3))
    check(lambda x: 2 / (x * x + 1), data(3))
    check(lambda x: (x + 1) * 3.0 - x / 2, data(3))


def test_comparisons_and_where():
    a, b = data(4, 3), data(4, 3)
    for fn in (lambda x, y: x < y, lambda x, y: x <= y, lambda x, y: x > y,
               lambda x, y: x >= y, lambda x, y: x == y, lambda x, y: x != y):
        check(fn, a, b, grad=False)
    check(lambda x, y: (x > 0).where(x, y) if isinstance(x, Tensor) else torch.where(x > 0, x, y),
          a, b)


def test_integer_division_and_mod_follow_python():
    a = np.array([7, -7, 7, -7, 0], np.int32)
    b = np.array([2, 2, -2, -2, 3], np.int32)
    x, y = Tensor(a), Tensor(b)
    np.testing.assert_array_equal((x // y).numpy(), a // b)
    np.testing.assert_array_equal((x % y).numpy(), a % b)
    np.testing.assert_array_equal((Tensor(a.astype(np.float32)) % 3).numpy(),
                                  a.astype(np.float32) % 3)


# all axes, one axis kept, two axes: each compiles its own kernels on every backend, so three
# (test_properties.py tries single axes of many shapes on the CPU)
@pytest.mark.parametrize("axis,keepdim", [(None, False), (-2, True), ((0, 2), False)])
def test_reductions(axis, keepdim):
    x = data(2, 3, 4)
    tdim = axis if axis is not None else (0, 1, 2)
    check(lambda t: t.sum(axis, keepdim=keepdim) if isinstance(t, Tensor)
          else t.sum(tdim, keepdim=keepdim), x)
    check(lambda t: t.mean(axis, keepdim=keepdim) if isinstance(t, Tensor)
          else t.mean(tdim, keepdim=keepdim), x)
    check(lambda t: t.var(axis, keepdim=keepdim) if isinstance(t, Tensor)
          else t.var(tdim, keepdim=keepdim), x)
    check(lambda t: t.std(axis, keepdim=keepdim) if isinstance(t, Tensor)
          else t.std(tdim, keepdim=keepdim), x)
    check(lambda t: t.logsumexp(axis, keepdim=keepdim) if isinstance(t, Tensor)
          else t.logsumexp(tdim, keepdim=keepdim), x)
    check(lambda t: t.max(axis, keepdim=keepdim) if isinstance(t, Tensor)
          else t.amax(tdim, keepdim=keepdim), x)
    check(lambda t: t.min(axis, keepdim=keepdim) if isinstance(t, Tensor)
          else t.amin(tdim, keepdim=keepdim), x)


def test_prod_argmax_argmin():
    x = data(3, 4)
    np.testing.assert_allclose(Tensor(x).prod(1).numpy(), x.prod(1), rtol=1e-5)
    np.testing.assert_array_equal(Tensor(x).argmax(1).numpy(), x.argmax(1))
    np.testing.assert_array_equal(Tensor(x).argmin(0).numpy(), x.argmin(0))
    np.testing.assert_array_equal(Tensor(x).argmax().numpy(), x.argmax())
    ties = np.array([1.0, 3.0, 3.0, 0.0], np.float32)
    assert Tensor(ties).argmax().item() == 1


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.uint32, np.int32])
def test_min_argmin_minimum_invert_on_integers(dtype):
    """Negation wraps on integers: min, minimum and argmin must not be -max(-x) there."""
    info = np.iinfo(dtype) if dtype != np.bool_ else None
    a = np.array([True, False, True, False]) if info is None else np.array(
        [info.min, 1, info.max, 0], dtype)
    x = Tensor(a)
    np.testing.assert_array_equal(x.min().numpy(), a.min())
    assert x.argmin().item() == a.argmin()
    np.testing.assert_array_equal(x.minimum(x.flip(0)).numpy(), np.minimum(a, a[::-1]))
    np.testing.assert_array_equal(x.maximum(x.flip(0)).numpy(), np.maximum(a, a[::-1]))
    np.testing.assert_array_equal((~x).numpy(), ~a)


def test_prod_gradient_with_zeros():
    x = np.array([[1, 2, 0, 3], [0, 2, 0, 1], [1.5, 2, -1, 3]], np.float32)
    check(lambda t: t.prod(1), x)
    check(lambda t: t.prod(0), x)
    check(lambda t: t.prod(), x)


def test_movement():
    x = data(2, 3, 4)
    check(lambda t: t.reshape(6, 4), x)
    check(lambda t: t.permute(2, 0, 1), x)
    check(lambda t: t.transpose(0, 2), x)
    check(lambda t: t.flatten(1), x)
    check(lambda t: t.unsqueeze(1).squeeze(1), x)
    check(lambda t: t[:, None].expand(2, 5, 3, 4), x)
    check(lambda t: t.flip(1), x)
    check(lambda t: t.repeat(2, 1, 3), x)
    check(lambda t: t.pad(((1, 0), (0, 2), (1, 1))) if isinstance(t, Tensor)
          else torch.nn.functional.pad(t, (1, 1, 0, 2, 1, 0)), x)
    check(lambda t: t.pad((1, 1, 0, 2)) if isinstance(t, Tensor)
          else torch.nn.functional.pad(t, (1, 1, 0, 2)), x)
    check(lambda t: t.pad((2, -1), 7.0) if isinstance(t, Tensor)
          else torch.nn.functional.pad(t, (2, -1), value=7.0), x)
    check(lambda t: t.T, data(3, 5))


def test_indexing():
    x = data(4, 5, 6)
    for index in [(1,), (slice(1, 3),), (Ellipsis, 2), (slice(None, None, 2), None, 3),
                  (slice(1, None, 3), -1)]:
        check(lambda t, i=index: t[i], x)
    for index in [(slice(None, None, -1), slice(1, None, 3)), (-1, slice(4, 0, -2), 0)]:
        np.testing.assert_array_equal(Tensor(x)[index].numpy(), x[index])  # torch: no step < 0
    idx = np.array([[0, 3], [-1, 2]], np.int32)
    check(lambda t: t[:, Tensor(idx)] if isinstance(t, Tensor)
          else t[:, torch.tensor(idx, dtype=torch.long)], x)


@pytest.mark.parametrize("index", [
    ("i", "j"), (slice(None), "i", "j"), ("i", slice(None), "j"), ("i", 0, "j"),
    (slice(None), "j", 2), (Ellipsis, "k", "j"), ("i", None, "j"), ([1, 2], slice(1, 4), [0, 1]),
], ids=str)
def test_several_integer_tensor_indices_broadcast_like_numpy(index):
    x = data(4, 5, 6)
    arrays = {"i": np.array([[0, 3], [-1, 2]], np.int32), "j": np.array([1, -2], np.int32),
              "k": np.array([[0], [4]], np.int32)}
    ours = tuple(Tensor(arrays[i]) if isinstance(i, str) else i for i in index)
    want = x[tuple(arrays[i] if isinstance(i, str) else i for i in index)]
    np.testing.assert_array_equal(Tensor(x)[ours].numpy(), want)
    theirs = tuple(torch.tensor(arrays[i], dtype=torch.long) if isinstance(i, str)
                   else torch.tensor(i) if isinstance(i, list) else i for i in index)
    check(lambda t: t[ours] if isinstance(t, Tensor) else t[theirs], x)


def test_cat_stack_split_chunk():
    a, b = data(2, 3), data(4, 3)
    check(lambda x, y: pt.cat([x, y]) if isinstance(x, Tensor) else torch.cat([x, y]), a, b)
    check(lambda x, y: pt.stack([x, y[:2]], 1) if isinstance(x, Tensor)
          else torch.stack([x, y[:2]], 1), a, b)
    parts = Tensor(b).split([1, 3])
    assert [p.shape for p in parts] == [(1, 3), (3, 3)]
    assert [c.numpy().tolist() for c in Tensor(b).chunk(2)] == [c.tolist() for c in
                                                               np.array_split(b, 2)]


def test_matmul_and_dot():
    check(lambda x, y: x @ y, data(3, 4), data(4, 5))
    check(lambda x, y: x @ y, data(2, 3, 4), data(4, 2))
    check(lambda x, y: x @ y, data(4), data(4, 3))
    check(lambda x, y: x.dot(y), data(5), data(5))


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1),
                                                            (1, 1, 2, 2)])
def test_conv2d(stride, padding, dilation, groups):
    x, w, b = data(2, 4, 7, 6), data(6, 4 // groups, 3, 3), data(6)
    check(lambda x, w, b: x.conv2d(w, b, stride, padding, dilation, groups)
          if isinstance(x, Tensor)
          else torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups),
          x, w, b, atol=1e-4)


def test_pools():
    x = data(2, 3, 6, 5)
    F = torch.nn.functional
    check(lambda t: t.max_pool2d(2) if isinstance(t, Tensor) else F.max_pool2d(t, 2), x)
    check(lambda t: t.max_pool2d(3, 2, 1) if isinstance(t, Tensor)
          else F.max_pool2d(t, 3, 2, 1), x)
    check(lambda t: t.avg_pool2d(2) if isinstance(t, Tensor) else F.avg_pool2d(t, 2), x)


def test_softmax_losses_norms():
    F = torch.nn.functional
    x = data(4, 5)
    target = np.array([1, 0, 4, 2], np.int32)
    check(lambda t: t.softmax(-1), x)
    check(lambda t: t.log_softmax(-1), x)
    check(lambda t: t.cross_entropy(Tensor(target)) if isinstance(t, Tensor)
          else F.cross_entropy(t, torch.tensor(target, dtype=torch.long)), x)
    check(lambda t: t.layernorm(-1) if isinstance(t, Tensor) else F.layer_norm(t, (5,)), x)


def test_attention_causal():
    q, k, v = data(2, 4, 8), data(2, 4, 8), data(2, 4, 8)
    F = torch.nn.functional
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True)
          if isinstance(q, Tensor) else F.scaled_dot_product_attention(q, k, v, is_causal=True),
          q, k, v, atol=1e-4)


def test_embedding_and_one_hot():
    w = data(10, 3)
    idx = np.array([[1, 9], [0, 1]], np.int32)
    check(lambda t: Tensor(idx).embedding(t) if isinstance(t, Tensor)
          else torch.nn.functional.embedding(torch.tensor(idx, dtype=torch.long), t), w)
    np.testing.assert_array_equal(Tensor(idx).one_hot(10).numpy(), np.eye(10)[idx])


def test_zero_d_and_zero_size():
    s = Tensor(3.0, requires_grad=True)
    y = s * s + 1
    assert y.shape == () and y.item() == 10.0
    y.backward()
    assert s.grad.item() == 6.0
    e = Tensor(np.zeros((0, 3), np.float32))
    assert (e + 1).numpy().shape == (0, 3)
    np.testing.assert_array_equal(e.sum(0).numpy(), np.zeros(3))


def test_constructors_and_random():
    np.testing.assert_array_equal(Tensor.arange(2, 11, 3).numpy(), np.arange(2, 11, 3))
    np.testing.assert_allclose(Tensor.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5))
    np.testing.assert_array_equal(Tensor.eye(3, 4).numpy(), np.eye(3, 4))
    np.testing.assert_array_equal(Tensor.full((2, 2), 7).numpy(), np.full((2, 2), 7))
    pt.seed(1)
    a = Tensor.rand(1000).numpy()
    pt.seed(1)
    assert (Tensor.rand(1000).numpy() == a).all()
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.05
    n = Tensor.randn(20000).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    r = Tensor.randint(3, 7, (500,)).numpy()
    assert set(np.unique(r)) == {3, 4, 5, 6}


def test_dtypes_and_cast(capabilities):
    x = Tensor([1, 2, 3])
    assert x.dtype == pt.int32 and (x + 0.5).dtype == pt.float32
    assert (x.cast(pt.float16) + Tensor([1.0])).dtype == pt.float32
    np.testing.assert_array_equal(Tensor([1.7, -1.7]).cast(pt.int32).numpy(), [1, -1])
    if pt.float64 in capabilities.dtypes:
        assert Tensor(np.ones(2, np.float64)).dtype == pt.float64


@pytest.mark.parametrize("dtype", dtypes.ALL, ids=lambda d: d.name)
def test_every_dtype_runs_or_is_unsupported(dtype, capabilities, backend):
    """Arithmetic, a reduction and casts per dtype; a dtype the device lacks is a typed error."""
    a = np.array([0, 1, 2, 3, 5, 7]).astype(dtype.np)
    if dtype not in capabilities.dtypes:
        with pytest.raises(UnsupportedDType, match=f"{backend}.*{dtype.name}"):
            Tensor(a, dtype)
        with pytest.raises(UnsupportedDType, match=dtype.name):
            Tensor(a.astype(np.float32)).cast(dtype)
        return
    x = Tensor(a, dtype)
    if dtype == pt.bool_:
        np.testing.assert_array_equal((x | x.flip(0)).numpy(), a | a[::-1])
        np.testing.assert_array_equal(x.max().numpy(), a.max())
    else:
        want = a * a[::-1] + a
        np.testing.assert_allclose((x * x.flip(0) + x).numpy().astype(np.float64),
                                   want.astype(np.float64), rtol=1e-2)
        np.testing.assert_array_equal(x.max().numpy(), a.max())
        assert (x.sum().numpy() == a.sum(dtype=np.float64))
    np.testing.assert_array_equal(x.cast(pt.float32).numpy(), a.astype(np.float32))
    np.testing.assert_array_equal((x < 3).numpy(), a < 3)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4,\)"):
        Tensor(data(2, 3)) + Tensor(data(4))
    with pytest.raises(RuntimeError, match="non-scalar"):
        (Tensor(data(3), requires_grad=True) * 2).backward()
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 5\)"):
        Tensor(data(2, 3)) @ Tensor(data(4, 5))
    with pytest.raises(TypeError, match="int32"):
        Tensor([1, 2]).requires_grad_()
