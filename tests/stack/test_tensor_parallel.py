"""Tensor parallelism: an MLP whose two linear layers are split across cpu and cpu:1 computes,
differentiates and trains as the unsplit MLP on one device."""
import numpy as np
import pytest

from portkit import Tensor, nn, optim
from portkit.distributed import (
    ColumnParallelLinear,
    RowParallelLinear,
    Shard,
    Shardwise,
    distribute_tensor,
)

DEVICES = ["cpu", "cpu:1"]
RNG = np.random.default_rng(1)
X = RNG.standard_normal((8, 6)).astype(np.float32)
Y = RNG.standard_normal((8, 3)).astype(np.float32)


def mse(output: Tensor, target: Tensor) -> Tensor:
    return ((output - target) ** 2).mean()


def mlp_and_its_shards() -> tuple[nn.Sequential, nn.Sequential]:
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    first, activation, second = model.items
    sharded = nn.Sequential(ColumnParallelLinear(first, DEVICES, gather_output=False),
                            Shardwise(activation), RowParallelLinear(second, DEVICES))
    return model, sharded


def joined(layer, name: str, dim: int) -> np.ndarray:
    return np.concatenate([p.grad.numpy() for p in getattr(layer, name)], dim)


def test_distribute_tensor_splits_onto_each_device_and_joins_back():
    values = np.arange(24, dtype=np.float32).reshape(2, 12)
    sharded = distribute_tensor(Tensor(values), DEVICES, Shard(-1))
    assert sharded.devices == DEVICES and sharded.dim == 1 and sharded.shape == (2, 12)
    np.testing.assert_array_equal(sharded.shards[1].numpy(), values[:, 6:])
    whole = sharded.map(lambda t: t * 2).full_tensor("cpu:1")
    assert whole.device == "cpu:1"
    np.testing.assert_array_equal(whole.numpy(), values * 2)
    with pytest.raises(ValueError, match="multiple of 2"):
        distribute_tensor(Tensor(values[:, :5]), DEVICES, Shard(1))
    with pytest.raises(ValueError, match="each named once"):
        distribute_tensor(Tensor(values), ["cpu", "cpu:0"], Shard(0))


def test_a_sharded_mlp_computes_and_differentiates_as_the_whole_one():
    model, sharded = mlp_and_its_shards()
    column, _, row = sharded.items
    assert {w.device for w in column.weight} == set(DEVICES)
    assert [tuple(w.shape) for w in row.weight] == [(3, 8), (3, 8)]
    expected = mse(model(Tensor(X)), Tensor(Y))
    expected.backward()
    found = mse(sharded(Tensor(X)), Tensor(Y))
    found.backward()
    assert found.device == "cpu"
    np.testing.assert_allclose(found.item(), expected.item(), rtol=1e-5)
    first, _, second = model.items
    assert [p.grad.device for p in column.weight] == DEVICES
    np.testing.assert_allclose(joined(column, "weight", 0), first.weight.grad.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(joined(column, "bias", 0), first.bias.grad.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(joined(row, "weight", 1), second.weight.grad.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(row.bias.grad.numpy(), second.bias.grad.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_a_sharded_mlp_trains_as_the_whole_one():
    model, sharded = mlp_and_its_shards()
    curves = []
    for net in (model, sharded):
        opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        curve = []
        for _ in range(20):
            opt.zero_grad()
            loss = mse(net(Tensor(X)), Tensor(Y))
            loss.backward()
            opt.step()
            curve.append(loss.item())
        curves.append(curve)
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-5)
    assert curves[0][-1] < curves[0][0] / 2
    column = sharded.items[0]
    np.testing.assert_allclose(np.concatenate([w.numpy() for w in column.weight]),
                               model.items[0].weight.numpy(), rtol=1e-5, atol=1e-6)


def test_a_row_parallel_layer_refuses_pieces_on_other_devices():
    _, sharded = mlp_and_its_shards()
    pieces = distribute_tensor(Tensor(np.ones((2, 16), np.float32)), ["cpu:1", "cpu"], Shard(1))
    with pytest.raises(ValueError, match="split along its last dim"):
        sharded.items[2](pieces)
