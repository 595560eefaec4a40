"""A model's initial values are computed together, in one schedule, at its first use."""
import numpy as np

from portkit import Tensor, nn, optim, schedule
from portkit.graph import GraphOp
from portkit.tensor import random


def _count_realizes(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = schedule.realize

    def counting(outs):
        calls.append(len([o for o in outs if o.op is not GraphOp.LOAD]))
        return original(outs)

    monkeypatch.setattr(schedule, "realize", counting)
    return calls


def test_layers_initial_values_realize_in_one_schedule(monkeypatch):
    nn.module.realize_deferred()
    calls = _count_realizes(monkeypatch)
    layers = [nn.Linear(6, 5), nn.Linear(5, 4), nn.LayerNorm(4), nn.BatchNorm1d(4),
              nn.Embedding(7, 3)]
    assert calls == []
    params = [p for layer in layers for p in layer.parameters()]
    assert calls == [4 + 2 + 4 + 1]     # every layer's values, running statistics included
    assert all(p.lazy.op is GraphOp.LOAD for p in params)
    optim.SGD(params, lr=0.1)
    layers[0](Tensor(np.ones((2, 6), np.float32))).numpy()
    assert calls[1:] == [1]                 # the call itself, nothing left over


def test_deferred_values_are_the_draws_made_at_construction():
    nn.module.realize_deferred()
    random.seed(3)
    layer = nn.Linear(8, 4)
    Tensor.rand(4, 8).numpy()               # a later draw does not change the layer's
    bound = 1 / np.sqrt(8)
    random.seed(3)
    expected = (Tensor.rand(4, 8) * (2 * bound) - bound).numpy()
    np.testing.assert_array_equal(layer.weight.numpy(), expected)
    assert np.abs(layer.bias.numpy()).max() <= bound


def test_a_deferred_value_on_a_device_gone_since_does_not_fail_another_model(monkeypatch):
    from portkit import runtime
    from portkit.reference_backends.cpu import backend

    nn.module.realize_deferred()
    monkeypatch.setitem(runtime.registry._runtimes, "cpu.gone",
                        runtime.Runtime("cpu.gone", backend.load()))
    orphan = nn.module.deferred(Tensor.ones(3, device="cpu.gone").contiguous())
    monkeypatch.delitem(runtime.registry._runtimes, "cpu.gone")
    layer = nn.Linear(3, 2)
    out = layer(Tensor(np.ones((1, 3), np.float32))).numpy()
    assert out.shape == (1, 2) and orphan.lazy.op is not GraphOp.LOAD
