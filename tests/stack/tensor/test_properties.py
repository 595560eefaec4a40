"""Property tests on the CPU backend: Tensor ops agree with numpy on shapes hypothesis picks.

Shapes include 0-d tensors, zero-size dimensions and broadcasting; dtypes include small and
unsigned integers, bool and float16. Every new shape compiles new kernels, so the example counts
stay small; the on-disk compile cache makes reruns cheap.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import portkit.tensor as pt
from portkit.tensor import Tensor


@pytest.fixture(autouse=True, scope="module")
def on_cpu():
    """Tensors made without device= live on the CPU backend."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PORTKIT_DEVICE", "cpu")
        yield


BOUNDED = settings(max_examples=15, deadline=None)
NUMERIC = [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.float16, np.float32]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def arrays(dtype, shape):
    """Values that keep float results finite and exact enough to compare closely."""
    if np.dtype(dtype).kind == "f":
        elements = st.floats(-8, 8, width=np.dtype(dtype).itemsize * 8)
    elif np.dtype(dtype).kind == "b":
        elements = st.booleans()
    else:
        info = np.iinfo(dtype)
        elements = st.integers(max(info.min, -100), min(info.max, 100))
    return hnp.arrays(dtype, shape, elements=elements)


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-3 if want.dtype == np.float16 else 1e-6)
    else:
        np.testing.assert_array_equal(got, want)


@BOUNDED
@given(st.sampled_from(NUMERIC), hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3,
                                                                  min_side=0, max_side=3),
       st.sampled_from(["add", "sub", "mul", "maximum", "lt", "ne"]), st.data())
def test_binary_ops_broadcast_like_numpy(dtype, shapes, name, data):
    a = data.draw(arrays(dtype, shapes.input_shapes[0]))
    b = data.draw(arrays(dtype, shapes.input_shapes[1]))
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "lt": lambda x, y: x < y, "ne": lambda x, y: x != y}.get(name)
    got = fn(Tensor(a), Tensor(b)) if fn else Tensor(a).maximum(Tensor(b))
    with np.errstate(over="ignore"):      # integers wrap, as in numpy
        want = fn(a, b) if fn else np.maximum(a, b)
    same(got.numpy(), np.asarray(want))


@BOUNDED
@given(st.sampled_from([np.int8, np.uint8, np.int32, np.float16, np.float32]), SHAPES,
       st.data())
def test_unary_and_where(dtype, shape, data):
    a = data.draw(arrays(dtype, shape))
    x = Tensor(a)
    same((-x).numpy(), -a)
    same(x.abs().numpy(), np.abs(a))
    same(x.where(x > 0, x * 2).numpy(), np.where(a > 0, a, a * 2))
    if a.dtype.kind == "f":
        same(x.floor().numpy(), np.floor(a))
        same(x.round().numpy(), np.round(a))
        same(x.relu().numpy(), np.maximum(a, 0))


@BOUNDED
@given(st.sampled_from([np.uint8, np.int32, np.float32, np.bool_]), SHAPES, st.data())
def test_casts(dtype, shape, data):
    a = data.draw(arrays(dtype, shape))
    for target in (pt.float32, pt.int32, pt.bool_):
        same(Tensor(a).cast(target).numpy(), a.astype(target.np))


@BOUNDED
@given(st.sampled_from([np.int8, np.int32, np.uint32, np.float32, np.bool_]),
       hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4), st.data(),
       st.booleans())
def test_sum_over_an_axis(dtype, shape, data, keepdim):
    a = data.draw(arrays(dtype, shape))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    # floats and 32-bit ints keep their dtype; bool and small ints widen to int32 (numpy
    # widens every int to 64 bits, torch too, but int32 is portkit's default integer)
    keep = a.dtype.kind == "f" or a.dtype.itemsize == 4
    want = a.sum(axis, keepdims=keepdim, dtype=a.dtype if keep else np.int32)
    same(Tensor(a).sum(axis, keepdim=keepdim).numpy(), want)


@BOUNDED
@given(st.sampled_from([np.int8, np.uint8, np.int32, np.float32]),
       hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4), st.data())
def test_max_min_prod_over_all_and_one_axis(dtype, shape, data):
    a = data.draw(arrays(dtype, shape))
    x = Tensor(a)
    same(x.max().numpy(), np.asarray(a.max()))
    same(x.min().numpy(), np.asarray(a.min()))
    if a.ndim:
        axis = data.draw(st.integers(0, a.ndim - 1))
        same(x.max(axis).values.numpy(), a.max(axis))
        same(x.argmax(axis).numpy(), a.argmax(axis).astype(np.int32))
    if a.dtype == np.float32:
        small = np.clip(a, -2, 2)
        same(Tensor(small).prod().numpy(), np.asarray(small.prod(), np.float32))


@BOUNDED
@given(st.sampled_from([np.int16, np.float32, np.bool_]), SHAPES, st.data())
def test_movement_ops(dtype, shape, data):
    a = data.draw(arrays(dtype, shape))
    x = Tensor(a)
    order = data.draw(st.permutations(range(a.ndim)))
    same(x.permute(*order).numpy(), a.transpose(order))
    same(x.reshape(-1).numpy(), a.reshape(-1))
    if a.ndim:
        axes = data.draw(st.lists(st.integers(0, a.ndim - 1), unique=True, min_size=1))
        same(x.flip(axes).numpy(), np.flip(a, axes))
        padding = data.draw(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)),
                                     min_size=a.ndim, max_size=a.ndim))
        same(x.pad(padding).numpy(), np.pad(a, padding))
        same(x.unsqueeze(0).expand(2, *a.shape).numpy(), np.broadcast_to(a, (2, *a.shape)))


@BOUNDED
@given(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5), st.data())
def test_basic_indexing(shape, data):
    a = data.draw(arrays(np.float32, shape))
    index = data.draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True))
    same(Tensor(a)[index].numpy(), np.asarray(a[index]))
