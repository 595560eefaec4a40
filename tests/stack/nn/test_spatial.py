"""pad modes, 1-d/3-d and transposed convolution, 1-d/3-d pools, max_pool return_indices with
max_unpool2d, interpolate and grid_sample (portkit/tensor/spatial.py) against PyTorch, forward and
backward."""
import numpy as np
import pytest

from portkit.nn import functional as F
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")
TF = torch.nn.functional



@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_pad_modes(mode, check, data, same_call):
    check(same_call("pad", (2, 1, 1, 3), mode=mode), data(2, 3, 6, 5))
    check(same_call("pad", (3, 0), mode=mode), data(2, 4))


@pytest.mark.parametrize("name,x_shape,w_shape,kwargs", [
    ("conv1d", (2, 3, 9), (4, 3, 3), {"stride": 2, "padding": 1}),
    ("conv1d", (3, 9), (2, 3, 4), {"padding": "same", "dilation": 2}),
    ("conv3d", (1, 2, 4, 5, 3), (4, 1, 2, 3, 2), {"padding": 1, "groups": 2}),
    ("conv_transpose1d", (2, 3, 5), (3, 2, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ("conv_transpose2d", (2, 3, 4, 3), (3, 2, 3, 2),
     {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 0), "groups": 3,
      "dilation": (1, 2)}),
])
def test_convolutions(name, x_shape, w_shape, kwargs, check, data):
    bias = data(w_shape[0] if "transpose" not in name else
                w_shape[1] * kwargs.get("groups", 1))
    check(lambda x, w, b: (F if isinstance(x, Tensor) else TF).__dict__[name](
        x, w, b, **kwargs), data(*x_shape), data(*w_shape), bias, atol=1e-4)


@pytest.mark.parametrize("name,args,kwargs,shape", [
    ("max_pool1d", (3, 2, 1), {}, (2, 3, 9)),
    ("max_pool3d", (2, 1), {"ceil_mode": True}, (1, 2, 4, 5, 3)),
    ("avg_pool1d", (3, 2, 1), {"count_include_pad": False}, (2, 3, 8)),
    ("avg_pool3d", ((2, 3, 2),), {"ceil_mode": True}, (1, 2, 4, 5, 3)),
])
def test_pools_in_1d_and_3d(name, args, kwargs, shape, check, data, same_call):
    check(same_call(name, *args, **kwargs), data(*shape))


def test_max_pool_return_indices_and_max_unpool2d(check, data):
    x = data(2, 3, 6, 5)
    values, indices = F.max_pool2d(Tensor(x), 3, 2, 1, return_indices=True)
    want_values, want_indices = TF.max_pool2d(torch.tensor(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(values.numpy(), want_values.numpy())
    np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())
    # the gradient reaches the element picked, as torch's
    check(lambda t: (F if isinstance(t, Tensor) else TF).max_pool2d(
        t, 2, return_indices=True)[0], np.round(x, 1))
    index = TF.max_pool2d(torch.tensor(x), 2, return_indices=True)[1]
    pooled = TF.max_pool2d(torch.tensor(x), 2).numpy()
    check(lambda v: F.max_unpool2d(v, Tensor(index.numpy().astype(np.int32)), 2, None, 0,
                                   (6, 5)) if isinstance(v, Tensor)
          else TF.max_unpool2d(v, index, 2, output_size=(6, 5)), pooled)


@pytest.mark.parametrize("size,scale,mode,align_corners", [
    ((12, 10), None, "nearest", None), ((4, 7), None, "nearest", None),
    (None, 1.7, "nearest", None), ((9, 4), None, "bilinear", False),
    ((9, 4), None, "bilinear", True), (None, 2.0, "bilinear", False)])
def test_interpolate(size, scale, mode, align_corners, check, data, same_call):
    check(same_call("interpolate", size, scale, mode, align_corners), data(2, 3, 6, 5))


def test_interpolate_linear_in_1d(check, data, same_call):
    check(same_call("interpolate", size=11, mode="linear"), data(2, 3, 7))


@pytest.mark.parametrize("mode,padding_mode,align_corners", [
    ("bilinear", "zeros", False), ("bilinear", "border", True), ("nearest", "zeros", True),
    ("nearest", "border", False)])
def test_grid_sample(mode, padding_mode, align_corners, check, data, same_call):
    grid = np.random.default_rng(1).uniform(-1.2, 1.2, (2, 3, 6, 2)).astype(np.float32)
    check(same_call("grid_sample", mode=mode, padding_mode=padding_mode,
                     align_corners=align_corners), data(2, 3, 4, 5), grid, atol=1e-4)


def test_bad_arguments_raise_at_the_call():
    x = Tensor.ones(1, 2, 4, 4)
    with pytest.raises(RuntimeError, match="reflect padding .* at most 3"):
        F.pad(x, (4, 0), mode="reflect")
    with pytest.raises(ValueError, match="mode must be 'constant', 'reflect'"):
        F.pad(x, (1, 1), mode="mirror")
    with pytest.raises(ValueError, match="padding='same' needs stride 1"):
        F.conv1d(Tensor.ones(1, 2, 5), Tensor.ones(3, 2, 3), stride=2, padding="same")
    with pytest.raises(ValueError, match="conv3d needs 5-d input"):
        F.conv3d(x, Tensor.ones(1, 2, 1, 1))
    with pytest.raises(ValueError, match="output_padding .* must be smaller"):
        F.conv_transpose2d(x, Tensor.ones(2, 1, 3, 3), stride=1, output_padding=1)
    with pytest.raises(ValueError, match=r"'bilinear' needs 2 spatial dims .* \(4-d\)"):
        F.interpolate(Tensor.ones(1, 2, 4), size=8, mode="bilinear")
    with pytest.raises(ValueError, match="exactly one of size and scale_factor"):
        F.interpolate(x)
    with pytest.raises(ValueError, match="padding_mode 'zeros' or 'border'"):
        F.grid_sample(x, Tensor.zeros(1, 2, 2, 2), padding_mode="reflection")
    with pytest.raises(RuntimeError, match="3-d pooling needs at least 4 dims"):
        F.max_pool3d(Tensor.ones(2, 3, 4), 2)


@pytest.mark.parametrize("x_shape,w_shape,kwargs", [
    ((2, 4, 8, 8), (6, 4, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 4, 9, 7), (6, 4, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 4, 9, 9), (6, 4, 1, 1), {"stride": 2}),
    ((1, 3, 10, 11), (4, 3, 3, 3), {"stride": 3, "padding": 1}),
    ((1, 4, 11, 10), (6, 2, 5, 5), {"stride": 3, "padding": 2, "groups": 2}),
    ((1, 2, 7, 9), (3, 2, 2, 3), {"stride": (2, 3), "padding": (0, 1)}),
    ((1, 8, 12, 12), (8, 2, 4, 4), {"stride": 2, "padding": 1, "groups": 4}),
    ((1, 3, 9, 9), (3, 3, 3, 3), {"stride": 2, "padding": 1, "dilation": 2}),
    ((1, 3, 8, 8), (3, 3, 3, 3), {"stride": 1, "padding": 1}),
])
def test_strided_conv_gradients_in_phases(x_shape, w_shape, kwargs, check, data, same_call):
    # a strided conv's input gradient is s^2 stride-1 convolutions of the output gradient with
    # the taps of each phase (portkit/tensor/spatial.py, _phase_input_grad). atol 5e-6: a
    # gradient near 0 is a sum of ~25 terms near 2, whose float32 rounding (in any order) is
    # a few 1e-6 (opencl gave 1.2e-6 off at -3.07e-3)
    check(same_call("conv2d", **kwargs), data(*x_shape), data(*w_shape), atol=5e-6,
          rtol=1e-5)


def test_a_1x1_stride_2_input_gradient_is_zero_between_its_taps(check, data, same_call):
    check(same_call("conv1d", stride=2), data(2, 3, 9), data(4, 3, 1), atol=1e-6, rtol=1e-5)


def test_a_strided_conv_input_gradient_multiplies_no_spread_zeros():
    # as a transposed convolution through the zero-spread gradient, 3 of every 4 terms of a
    # stride-2 conv's input gradient multiplied a zero
    from portkit import graph, schedule
    from portkit.graph import GraphOp

    x = Tensor(np.ones((2, 4, 8, 8), np.float32), requires_grad=True)
    w = Tensor(np.ones((6, 4, 3, 3), np.float32))
    F.conv2d(x, w, stride=2, padding=1).sum().backward()
    terms = 0
    for item in schedule.create_schedule([x.grad.lazy]):
        inputs = {id(n) for n in item.inputs}
        for node in graph.toposort([item.root], stop=lambda n, ids=inputs: id(n) in ids):
            if node.op is GraphOp.REDUCE:
                terms += int(np.prod(node.src[0].shape))
    # each input element reads (3 / 2)^2 taps on average of each of 6 output channels (2 * 4 *
    # 64 * 6 * 9 / 4 terms: per dim, the 4 even positions 1 tap, the 4 odd ones 2), and the
    # interleave one term per element; through the spread gradient it was 4x, and phases taken
    # in the padded input's positions (5 x 5 blocks for 4 x 4, then cut) 1.6x
    assert terms == 2 * 4 * 6 * 12 * 12 + 2 * 4 * 8 * 8, terms
