"""Activations, pooling keyword arguments and the container modules of issue 15, against
PyTorch CPU on every backend (forward and backward)."""
import numpy as np
import pytest

from portkit import nn
from portkit.nn import functional as F
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
TF = torch.nn.functional
pytestmark = pytest.mark.usefixtures("backend")

RNG = np.random.default_rng(6)


@pytest.mark.parametrize("name", ["elu", "selu", "celu", "mish", "hardswish", "hardsigmoid",
                                  "hardtanh", "relu6", "softsign", "logsigmoid", "softplus"])
def test_activations_match_torch(name, check):
    x = (RNG.standard_normal((4, 8)) * 4).astype(np.float32)
    x[0, :4] = [-40.0, 40.0, 0.5, -0.5]
    check(lambda t: (getattr(F, name) if isinstance(t, Tensor) else getattr(TF, name))(t), x)


def test_activation_keywords(check):
    x = (RNG.standard_normal((3, 5)) * 3).astype(np.float32)
    check(lambda t: (F if isinstance(t, Tensor) else TF).softplus(t, beta=2.0, threshold=3.0), x)
    check(lambda t: (F if isinstance(t, Tensor) else TF).elu(t, alpha=0.5), x)
    check(lambda t: (F if isinstance(t, Tensor) else TF).celu(t, alpha=2.0), x)
    check(lambda t: (F if isinstance(t, Tensor) else TF).hardtanh(t, -2.0, 0.5), x)
    check(lambda t: t.softplus(beta=0.5) if isinstance(t, Tensor) else TF.softplus(t, beta=0.5), x)


@pytest.mark.parametrize("kwargs", [
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True},
    {"kernel_size": 2, "stride": 3},
    {"kernel_size": 3, "stride": 1, "padding": 1, "count_include_pad": False},
    {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False},
], ids=str)
def test_pool_keywords(kwargs, check):
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    check(lambda t: (F if isinstance(t, Tensor) else TF).avg_pool2d(t, **kwargs), x)
    kwargs = {k: v for k, v in kwargs.items() if k != "count_include_pad"}
    check(lambda t: (F if isinstance(t, Tensor) else TF).max_pool2d(t, **kwargs), x)


def test_sequential_module_list_dropout_and_module_methods():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Dropout(0.5), nn.Linear(3, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                                    torch.nn.Dropout(0.5), torch.nn.Linear(3, 2))
    assert [n for n, _ in model.named_parameters()] == [
        n for n, _ in reference.named_parameters()]
    model.load_state_dict({n: p.detach().numpy() for n, p in reference.state_dict().items()})
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    model.eval()
    reference.eval()
    assert not model[2].training
    np.testing.assert_allclose(model(Tensor(x)).numpy(),
                               reference(torch.tensor(x)).detach().numpy(), atol=1e-5)
    model.train()
    assert model[2].training
    dropped = model[2](Tensor(np.ones((200,), np.float32))).numpy()
    assert set(np.unique(dropped)) <= {0.0, 2.0} and 0 < (dropped == 0).sum() < 200
    model(Tensor(x)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 1)]).append(nn.Tanh())
    assert len(layers) == 3 and [n for n, _ in layers.named_parameters()] == [
        "0.weight", "0.bias", "1.weight", "1.bias"]
    with pytest.raises(ValueError):
        nn.Dropout(1.5)


def test_conv2d_takes_unbatched_input(check):
    x = RNG.standard_normal((2, 5, 5)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    check(lambda a, b: (F if isinstance(a, Tensor) else TF).conv2d(a, b, padding=1), x, w)
