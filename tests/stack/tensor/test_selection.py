"""nonzero, masked_select, unique, unfold, scatter_reduce, cummax/cummin and the bitwise and
logical names against PyTorch, on every backend; hypothesis properties of the new reductions
and indexing."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from portkit.tensor import Tensor

torch = pytest.importorskip("torch")


@pytest.mark.usefixtures("backend")
def test_nonzero_masked_select_and_unique_follow_torch(check):
    x = np.array([[0, 1.5, 0], [2, 0, -3]], np.float32)
    assert Tensor(x).nonzero().tolist() == torch.tensor(x).nonzero().tolist()
    assert [t.tolist() for t in Tensor(x).nonzero(as_tuple=True)] == [
        t.tolist() for t in torch.tensor(x).nonzero(as_tuple=True)]
    mask = np.array([True, False, True])
    check(lambda t: t.masked_select(Tensor(mask) if isinstance(t, Tensor)
                                    else torch.tensor(mask)), x)
    values = np.array([3, 1, 3, 2, 1, 7], np.int32)
    ours = Tensor(values).unique(return_inverse=True, return_counts=True)
    theirs = torch.tensor(values).unique(return_inverse=True, return_counts=True)
    assert [t.tolist() for t in ours] == [t.tolist() for t in theirs]
    rows = np.array([[1, 2], [0, 5], [1, 2]], np.int32)
    assert Tensor(rows).unique(dim=0).tolist() == torch.tensor(rows).unique(dim=0).tolist()


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("dim,size,step", [(2, 2, 1), (1, 2, 1), (-1, 3, 2), (0, 1, 1)])
def test_unfold_follows_torch(dim, size, step, check, data):
    check(lambda t: t.unfold(dim, size, step), data(2, 3, 5))


@pytest.mark.usefixtures("backend")
def test_bitwise_and_logical_names():
    a, b = np.array([5, 3, -1], np.int32), np.array([6, 0, 2], np.int32)
    x, y, ta, tb = Tensor(a), Tensor(b), torch.tensor(a), torch.tensor(b)
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "logical_and", "logical_or",
                 "logical_xor"):
        assert getattr(x, name)(y).tolist() == getattr(ta, name)(tb).tolist(), name
    assert x.bitwise_not().tolist() == ta.bitwise_not().tolist()


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_follows_torch(reduce, include_self, check, data):
    index = np.array([[0, 4, 4, 1], [2, 2, 2, 2], [3, 0, 1, 3]], np.int32)

    def call(x, src):
        i = Tensor(index) if isinstance(x, Tensor) else torch.tensor(index, dtype=torch.long)
        return x.scatter_reduce(1, i, src, reduce, include_self=include_self)
    check(call, data(3, 5), data(3, 4))


def test_bad_arguments_raise_at_the_call():
    x = Tensor.ones(2, 3)
    with pytest.raises(RuntimeError, match=r"size 4 must be in \[0, 3\]"):
        x.unfold(1, 4, 1)
    with pytest.raises(RuntimeError, match="step 0 >= 1"):
        x.unfold(1, 2, 0)
    with pytest.raises(TypeError, match="mask must be bool"):
        x.masked_select(Tensor.ones(3))
    with pytest.raises(TypeError, match="cast with .int"):
        x.bitwise_not()
    with pytest.raises(ValueError, match="reduce must be one of sum, prod"):
        x.scatter_reduce(1, Tensor([[0]]), x, "max")


BOUNDED = settings(max_examples=15, deadline=None)


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setenv("PORTKIT_DEVICE", "cpu")


@pytest.mark.usefixtures("on_cpu")
@BOUNDED
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5),
                  elements=st.sampled_from([-2.0, 0.0, 1.0, 3.0, np.nan])), st.data())
def test_cummax_and_cummin_match_running_extremes(a, data):
    dim = data.draw(st.integers(0, a.ndim - 1))
    for name in ("cummax", "cummin"):
        values, indices = getattr(Tensor(a), name)(dim)
        want = getattr(torch.tensor(a), name)(dim)
        np.testing.assert_array_equal(values.numpy(), want.values.numpy())
        np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())


@pytest.mark.usefixtures("on_cpu")
@BOUNDED
@given(hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=6),
                  elements=st.integers(-3, 3)), st.data())
def test_unfold_masked_select_and_max_indices_match_torch(a, data):
    dim = data.draw(st.integers(0, a.ndim - 1))
    size = data.draw(st.integers(0, a.shape[dim]))
    step = data.draw(st.integers(1, 3))
    np.testing.assert_array_equal(Tensor(a).unfold(dim, size, step).numpy(),
                                  torch.tensor(a).unfold(dim, size, step).numpy())
    mask = a > 0
    np.testing.assert_array_equal(Tensor(a).masked_select(Tensor(mask)).numpy(), a[mask])
    if a.shape[dim]:
        values, indices = Tensor(a).max(dim)
        np.testing.assert_array_equal(values.numpy(), a.max(dim))
        np.testing.assert_array_equal(indices.numpy(), a.argmax(dim))


@pytest.mark.usefixtures("on_cpu")
@BOUNDED
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5),
                  elements=st.sampled_from([-2.0, -0.5, 0.0, 1.0, 1.5, 3.0])), st.data())
def test_scans_sorts_and_any_all_match_torch(a, data):
    dim = data.draw(st.integers(-a.ndim, a.ndim - 1))
    x, t = Tensor(a), torch.tensor(a)
    for scan in ("cumsum", "cumprod", "logcumsumexp"):
        np.testing.assert_allclose(getattr(x, scan)(dim).numpy(),
                                   getattr(t, scan)(dim).numpy(), rtol=1e-5, atol=1e-6)
    descending = data.draw(st.booleans())
    values, indices = x.sort(dim=dim, descending=descending, stable=True)
    want = t.sort(dim=dim, descending=descending, stable=True)
    np.testing.assert_array_equal(values.numpy(), want.values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want.indices.numpy())
    k = data.draw(st.integers(0, a.shape[dim]))
    values, indices = x.topk(k, dim, largest=not descending)
    np.testing.assert_array_equal(values.numpy(), t.topk(k, dim, largest=not descending)
                                  .values.numpy())
    # ties may pick other indices than torch's: each must point at its value
    np.testing.assert_array_equal(x.gather(dim, indices).numpy(), values.numpy())
    for reduce in ("any", "all"):
        np.testing.assert_array_equal(getattr(x > 0, reduce)(dim).numpy(),
                                      getattr(t > 0, reduce)(dim).numpy())


@pytest.mark.usefixtures("on_cpu")
@BOUNDED
@given(hnp.arrays(np.int32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5),
                  elements=st.integers(-9, 9)), st.data())
def test_gather_scatter_select_roll_and_triangles_match_torch(a, data):
    dim = data.draw(st.integers(-a.ndim, a.ndim - 1))
    shape = tuple(data.draw(st.integers(1, n)) for n in a.shape)
    index = data.draw(hnp.arrays(np.int64, shape, elements=st.integers(0, a.shape[dim] - 1)))
    src = data.draw(hnp.arrays(np.int32, shape, elements=st.integers(-9, 9)))
    x, t, i, ti = Tensor(a), torch.tensor(a), Tensor(index), torch.tensor(index)
    np.testing.assert_array_equal(x.gather(dim, i).numpy(), t.gather(dim, ti).numpy())
    try:
        want = t.take_along_dim(ti, dim).numpy()
    except RuntimeError:     # shapes that do not broadcast outside dim
        with pytest.raises(ValueError, match="do not broadcast"):
            x.take_along_dim(i, dim)
    else:
        np.testing.assert_array_equal(x.take_along_dim(i, dim).numpy(), want)
    np.testing.assert_array_equal(x.scatter_add(dim, i, Tensor(src)).numpy(),
                                  t.scatter_add(dim, ti, torch.tensor(src)).numpy())
    rows = index.reshape(-1)[:4]
    np.testing.assert_array_equal(x.index_select(dim, Tensor(rows)).numpy(),
                                  t.index_select(dim, torch.tensor(rows)).numpy())
    shift = data.draw(st.integers(-7, 7))
    np.testing.assert_array_equal(x.roll(shift, dim).numpy(), t.roll(shift, dim).numpy())
    if a.ndim >= 2:
        diagonal = data.draw(st.integers(-4, 4))
        np.testing.assert_array_equal(x.tril(diagonal).numpy(), t.tril(diagonal).numpy())
        np.testing.assert_array_equal(x.triu(diagonal).numpy(), t.triu(diagonal).numpy())
