"""The module forms of the spatial and norm functions (portkit/nn/layers.py): torch's names,
parameter shapes and initialization bounds, and the same outputs as torch's modules given
torch's parameters."""
import numpy as np
import pytest

import portkit as pk
from portkit import nn

torch = pytest.importorskip("torch")


def _pair(build):
    """(ours, torch's) of `build(module namespace)`, ours holding torch's parameters."""
    theirs = build(torch.nn)
    ours = build(nn)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return ours, theirs


@pytest.mark.parametrize("build,shape", [
    (lambda m: m.Sequential(m.Conv1d(3, 4, 3, padding=1), m.GroupNorm(2, 4), m.PReLU(4),
                            m.MaxPool1d(2), m.Upsample(scale_factor=2)), (2, 3, 6)),
    (lambda m: m.Sequential(m.ConvTranspose2d(3, 4, 3, stride=2, groups=1),
                            m.AvgPool2d(2, ceil_mode=True), m.RMSNorm([4])), (2, 3, 4, 3)),
    (lambda m: m.Sequential(m.Conv3d(2, 2, (1, 2, 2)), m.MaxPool3d(1), m.AvgPool3d(1),
                            m.ConvTranspose3d(2, 1, 2), m.Softmin(1)), (1, 2, 3, 3, 3)),
    (lambda m: m.Sequential(m.ConvTranspose1d(2, 2, 2), m.AvgPool1d(2), m.PReLU()),
     (3, 2, 5)),
])
def test_modules_compute_what_torchs_do(build, shape):
    ours, theirs = _pair(build)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(ours(pk.Tensor(x)).numpy(), theirs(torch.tensor(x)).detach(),
                               atol=1e-5)


@pytest.mark.parametrize("name,args", [("Conv1d", (4, 6, 3)), ("Conv3d", (2, 4, (1, 2, 3))),
                                       ("ConvTranspose2d", (4, 6, 3, 1, 0, 0, 2))])
def test_convolution_parameters_have_torchs_shapes_and_bounds(name, args):
    ours, theirs = getattr(nn, name)(*args), getattr(torch.nn, name)(*args)
    for a, b in ((ours.weight, theirs.weight), (ours.bias, theirs.bias)):
        assert a.shape == tuple(b.shape)
        bound = theirs.weight[0].numel() ** -0.5 if "Transpose" not in name else \
            (theirs.weight.shape[1] * theirs.weight[0, 0].numel()) ** -0.5
        assert np.abs(a.numpy()).max() <= bound and np.abs(b.detach().numpy()).max() <= bound


def test_bad_module_arguments_raise_at_construction():
    with pytest.raises(ValueError, match="divisible by groups 2"):
        nn.Conv1d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="divisible by num_groups 3"):
        nn.GroupNorm(3, 4)


@pytest.mark.parametrize("kind, width", [("LSTM", 4 * 8), ("GRU", 2 * 8)])
def test_a_recurrent_step_takes_one_sigmoid_over_its_gates(kind, width, monkeypatch):
    # a sigmoid per gate made three (two) copies of its recorded formula in every step's graph
    shapes = []
    sigmoid = pk.Tensor.sigmoid
    monkeypatch.setattr(pk.Tensor, "sigmoid", lambda t: shapes.append(t.shape) or sigmoid(t))
    ours, theirs = _pair(lambda m: getattr(m, kind)(4, 8))
    x = np.random.default_rng(5).standard_normal((3, 2, 4)).astype(np.float32)
    out, _ = ours(pk.Tensor(x))
    assert shapes == [(2, width)] * 3
    np.testing.assert_allclose(out.numpy(), theirs(torch.tensor(x))[0].detach().numpy(),
                               rtol=1e-5, atol=1e-6)
