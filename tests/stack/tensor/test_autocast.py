"""portkit.autocast against torch.autocast: which ops run in the low dtype and which in float32,
float32 gradients for float32 parameters, and a short bfloat16 training run that tracks the
float32 one and torch's CPU autocast run."""
from pathlib import Path

import numpy as np
import pytest
import torch

import portkit
from portkit import amp, nn, optim
from portkit.abi.errors import UnsupportedDType
from portkit.backends import UnknownBackend
from portkit.nn import functional as F
from portkit.tensor import Tensor
from portkit.tensor.autocast_mode import POLICIES

RNG = np.random.default_rng(0)
# bfloat16 keeps 8 significant bits: a rounding moves a value by at most 2^-9 of it
BF16_ROUNDING = 2.0 ** -9


def _x(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def test_low_precision_ops_give_bfloat16_and_float32_ops_float32():
    x, w = Tensor(_x(4, 8)), Tensor(_x(6, 8), requires_grad=True)
    image, kernel = Tensor(_x(1, 2, 5, 5)), Tensor(_x(3, 2, 3, 3))
    q = Tensor(_x(1, 2, 4, 8))
    with portkit.autocast("cpu", dtype=portkit.bfloat16):
        y = nn.Linear(8, 6)(x)
        low = {"Linear": y, "F.linear": F.linear(x, w), "matmul": x @ x.T,
               "conv2d": F.conv2d(image, kernel), "conv_transpose2d":
               F.conv_transpose2d(image, kernel.transpose(0, 1)),
               "scaled_dot_product_attention": F.scaled_dot_product_attention(q, q, q)}
        full = {"softmax": y.softmax(-1), "log_softmax": y.log_softmax(-1),
                "layer_norm": nn.LayerNorm(6)(y), "sum": y.sum(), "mean": y.mean(),
                "cross_entropy": F.cross_entropy(y, Tensor([0, 1, 2, 3])),
                "relu then float32 add": y.relu() + x[:, :6]}
        assert amp.is_autocast_enabled("cpu") and not amp.is_autocast_enabled("cuda")
    assert {k: v.dtype for k, v in low.items()} == {k: portkit.bfloat16 for k in low}
    assert {k: v.dtype for k, v in full.items()} == {k: portkit.float32 for k in full}
    assert y.relu().dtype == portkit.bfloat16    # other ops keep their input's dtype
    assert not amp.is_autocast_enabled("cpu")


def test_torch_cpu_autocast_gives_the_same_dtypes_for_the_ops_it_lists():
    """torch's CPU lists put linear, matmul, conv and attention in bfloat16 and the losses in
    float32; softmax, layer_norm and sum it leaves in bfloat16 (only its CUDA list has them in
    float32), where portkit runs them in float32 on every device (docs/mixed-precision.md)."""
    x = _x(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(torch.tensor(x), torch.tensor(_x(6, 8)))
        seen = {"linear": y.dtype, "matmul": (torch.tensor(x) @ torch.tensor(x).T).dtype,
                "cross_entropy": torch.nn.functional.cross_entropy(
                    y, torch.tensor([0, 1, 2, 3])).dtype, "softmax": y.softmax(-1).dtype}
    with portkit.autocast("cpu", dtype=portkit.bfloat16):
        y = F.linear(Tensor(x), Tensor(_x(6, 8)))
        ours = {"linear": y.dtype, "matmul": (Tensor(x) @ Tensor(x).T).dtype,
                "cross_entropy": F.cross_entropy(y, Tensor([0, 1, 2, 3])).dtype,
                "softmax": y.softmax(-1).dtype}
    names = {torch.bfloat16: "bfloat16", torch.float32: "float32"}
    expected = {k: names[v] for k, v in seen.items()} | {"softmax": "float32"}
    assert {k: v.name for k, v in ours.items()} == expected


def test_float32_parameters_get_float32_gradients_through_the_casts():
    layer = nn.Linear(8, 3)
    x = Tensor(_x(4, 8))
    with portkit.autocast("cpu", dtype=portkit.float16):
        out = layer(x)
        loss = F.cross_entropy(out, Tensor([0, 1, 2, 0]))
        loss.backward()        # inside autocast too: the backward pass keeps the forward's dtypes
    assert out.dtype == portkit.float16 and loss.dtype == portkit.float32
    assert layer.weight.dtype == layer.weight.grad.dtype == portkit.float32
    reference = torch.nn.Linear(8, 3)
    reference.load_state_dict({k: torch.tensor(v.numpy()) for k, v in
                               layer.state_dict().items()})
    with torch.autocast("cpu", dtype=torch.float16):
        torch.nn.functional.cross_entropy(reference(torch.tensor(x.numpy())),
                                          torch.tensor([0, 1, 2, 0])).backward()
    # the gradient of float16 logits: a few float16 roundings (2^-11 each) of values below 1
    np.testing.assert_allclose(layer.weight.grad.numpy(), reference.weight.grad.numpy(),
                               atol=4e-3, err_msg="weight gradient under float16 autocast")


def test_disabled_nested_decorated_and_other_device_types():
    x = Tensor(_x(2, 8))

    @portkit.autocast("cpu")
    def forward(t: Tensor) -> Tensor:
        return t @ t.T

    assert forward(x).dtype == portkit.bfloat16        # cpu's default low dtype
    assert (x @ x.T).dtype == portkit.float32          # off again after the call
    with portkit.autocast("cpu", dtype="bfloat16"):
        with portkit.autocast("cpu", enabled=False):
            assert (x @ x.T).dtype == portkit.float32
        assert (x @ x.T).dtype == portkit.bfloat16
    with portkit.autocast("cuda"):                     # tensors on other devices are left alone
        assert (x @ x.T).dtype == portkit.float32
        assert amp.get_autocast_dtype("cuda") == portkit.float16
    assert (x.cast(portkit.float64) @ x.cast(portkit.float64).T).dtype == portkit.float64


def test_bad_arguments_name_what_is_accepted():
    with pytest.raises(UnsupportedDType, match="bfloat16 or portkit.float16"):
        portkit.autocast("cpu", dtype=portkit.float32)
    with pytest.raises(UnknownBackend, match="use one of .*cpu"):
        portkit.autocast("tpu")


def test_every_marked_op_is_in_the_docs():
    page = (Path(__file__).parents[3] / "docs" / "mixed-precision.md").read_text()
    missing = [f"{name} ({policy})" for name, policy in POLICIES.items() if f"`{name}`" not in page]
    assert not missing, f"docs/mixed-precision.md does not list: {missing}"


# -- a short training run -------------------------------------------------------------------

X, Y = _x(32, 16), RNG.integers(0, 4, 32)
START = [_x(32, 16) / 4, np.zeros(32, np.float32), _x(4, 32) / 6, np.zeros(4, np.float32)]
STEPS = 20


def _portkit_losses(dtype) -> tuple[np.ndarray, list[Tensor]]:
    params = [Tensor(a.copy(), requires_grad=True) for a in START]
    opt = optim.Adam(params, lr=1e-2)
    x, y = Tensor(X), Tensor(Y.astype(np.int32))
    losses = []
    for _ in range(STEPS):
        with portkit.autocast("cpu", dtype=dtype or portkit.bfloat16, enabled=dtype is not None):
            hidden = F.linear(x, params[0], params[1]).relu()
            loss = F.cross_entropy(F.linear(hidden, params[2], params[3]), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses), params


def _torch_losses() -> np.ndarray:
    params = [torch.tensor(a.copy(), requires_grad=True) for a in START]
    opt = torch.optim.Adam(params, lr=1e-2)
    x, y = torch.tensor(X), torch.tensor(Y)
    losses = []
    for _ in range(STEPS):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = torch.nn.functional.linear(x, params[0], params[1]).relu()
            loss = torch.nn.functional.cross_entropy(
                torch.nn.functional.linear(hidden, params[2], params[3]), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses)


@pytest.fixture(scope="module")
def bfloat16_run() -> tuple[np.ndarray, list[Tensor]]:
    return _portkit_losses(portkit.bfloat16)


def test_bfloat16_training_tracks_float32_and_keeps_float32_master_weights(bfloat16_run):
    """The forward pass rounds the input, the weights, the hidden layer and the logits to
    bfloat16, about one rounding (2^-9) each on the way to the loss; Adam's step size is set by
    lr, not by the gradient's size, so 20 steps do not amplify it. Four roundings (2^-7) of the
    loss bound the distance to the float32 run (it is 1.3e-3 here), which must not be zero."""
    low, params = bfloat16_run
    full, _ = _portkit_losses(None)
    assert full[-1] < 0.5 * full[0]          # it learns
    worst = np.argmax(np.abs(low - full) / full)
    assert abs(low[worst] - full[worst]) <= 4 * BF16_ROUNDING * full[worst], (
        f"step {worst}: bfloat16 loss {low[worst]} vs float32 {full[worst]}")
    assert low[0] != full[0], "the bfloat16 run computed the float32 one: autocast did nothing"
    assert [p.dtype for p in params] == [portkit.float32] * 4
    assert [p.grad.dtype for p in params] == [portkit.float32] * 4


def test_bfloat16_training_tracks_torch_cpu_autocast(bfloat16_run):
    """The first loss rounds in the same places as torch's, so it agrees to half a rounding;
    after that the runs drift apart as each does from float32: four roundings, as above."""
    low, _ = bfloat16_run
    theirs = _torch_losses()
    assert abs(low[0] - theirs[0]) <= BF16_ROUNDING / 2 * theirs[0], (low[0], theirs[0])
    worst = np.argmax(np.abs(low - theirs) / theirs)
    assert abs(low[worst] - theirs[worst]) <= 4 * BF16_ROUNDING * theirs[worst], (
        f"step {worst}: portkit {low[worst]} vs torch {theirs[worst]}")
