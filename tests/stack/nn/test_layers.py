"""nn layers and optimizers against PyTorch CPU: same weights, same inputs, same steps."""
import numpy as np
import pytest

from portkit import Tensor, nn, optim

torch = pytest.importorskip("torch")


def _pair(shape, seed=0):
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return Tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)


def _copy_weights(ours, theirs) -> None:
    with torch.no_grad():
        for name, value in ours.state_dict().items():
            getattr(theirs, name.split(".")[-1]).copy_(torch.tensor(value.numpy()))


def _check_layer(ours, theirs, x_shape, seed=1) -> None:
    _copy_weights(ours, theirs)
    x, tx = _pair(x_shape, seed)
    w = np.random.default_rng(seed + 1).standard_normal(theirs(tx).shape).astype(np.float32)
    (ours(x) * Tensor(w)).sum().backward()
    (theirs(tx) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(ours(x).numpy(), theirs(tx).detach().numpy(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    for name, param in theirs.named_parameters():
        ours_grad = getattr(ours, name).grad.numpy()
        np.testing.assert_allclose(ours_grad, param.grad.numpy(), rtol=1e-4, atol=1e-4,
                                   err_msg=name)


def test_linear_conv_layernorm_match_torch():
    _check_layer(nn.Linear(5, 3), torch.nn.Linear(5, 3), (4, 5))
    _check_layer(nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(3, 4, 3, padding=1),
                 (2, 3, 6, 6))
    _check_layer(nn.LayerNorm(6), torch.nn.LayerNorm(6), (2, 3, 6))


def test_batchnorm2d_training_step_and_running_statistics_match_torch():
    _check_layer(nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3), (4, 3, 5, 5))
    ours, theirs = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    for seed in (2, 3):
        x = np.random.default_rng(seed).standard_normal((4, 3, 5, 5)).astype(np.float32) + seed
        ours(Tensor(x)).realize()
        theirs(torch.tensor(x))
    np.testing.assert_allclose(ours.running_mean.numpy(), theirs.running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.running_var.numpy(), theirs.running_var.numpy(),
                               rtol=1e-5, atol=1e-6)
    ours.training = False
    theirs.eval()
    x = np.random.default_rng(4).standard_normal((2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ours, theirs, kwargs", [
    (optim.SGD, torch.optim.SGD,
     {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (optim.Adam, torch.optim.Adam, {"lr": 0.05, "weight_decay": 0.01}),
    (optim.AdamW, torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}),
], ids=["sgd", "adam", "adamw"])
def test_optimizer_trajectories_match_torch(ours, theirs, kwargs):
    w, tw = _pair((3, 4), seed=5)
    x = np.random.default_rng(6).standard_normal((8, 3)).astype(np.float32)
    opt, topt = ours([w], **kwargs), theirs([tw], **kwargs)
    for _ in range(4):
        opt.zero_grad()
        topt.zero_grad()
        ((Tensor(x) @ w).tanh() ** 2).mean().backward()
        ((torch.tensor(x) @ tw).tanh() ** 2).mean().backward()
        opt.step()
        topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("x_shape", [(5, 7), (2, 3, 7), (7,)])
def test_linear_is_matmul_by_the_transposed_weight_bit_for_bit(x_shape):
    # linear skips matmul's transpose of weight.T; values and gradients must not move a bit
    from portkit.nn import functional as F
    data = np.random.default_rng(4).standard_normal(x_shape).astype(np.float32)
    grads = []
    for fast in (True, False):
        x = Tensor(data, requires_grad=True)
        w = Tensor(np.linspace(-1, 1, 28, dtype=np.float32).reshape(4, 7), requires_grad=True)
        b = Tensor(np.array([0.5, -1, 2, 0], np.float32), requires_grad=True)
        out = F.linear(x, w, b) if fast else x.matmul(w.T) + b
        (out * out).sum().backward()
        grads.append([t.view(np.uint32) for t in (out.numpy(), x.grad.numpy(),
                                                   w.grad.numpy(), b.grad.numpy())])
    for got, want in zip(*grads):
        np.testing.assert_array_equal(got, want)
