"""The Tensor core (portkit/tensor/core.py): 0-d and empty tensors, backward, errors."""
import numpy as np
import pytest

from portkit.tensor import Tensor

pytestmark = pytest.mark.usefixtures("backend")


def test_zero_d_and_zero_size():
    s = Tensor(3.0, requires_grad=True)
    y = s * s + 1
    assert y.shape == () and y.item() == 10.0
    y.backward()
    assert s.grad.item() == 6.0
    e = Tensor(np.zeros((0, 3), np.float32))
    assert (e + 1).numpy().shape == (0, 3)
    np.testing.assert_array_equal(e.sum(0).numpy(), np.zeros(3))


def test_errors_name_the_problem(data):
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4,\)"):
        Tensor(data(2, 3)) + Tensor(data(4))
    with pytest.raises(RuntimeError, match="non-scalar"):
        (Tensor(data(3), requires_grad=True) * 2).backward()
    with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 5\)"):
        Tensor(data(2, 3)) @ Tensor(data(4, 5))
    with pytest.raises(TypeError, match="int32"):
        Tensor([1, 2]).requires_grad_()



def test_backward_and_realize_pause_the_garbage_collector(data, monkeypatch):
    # the graph lives until they return, so a collection there walks every live object for
    # nothing (about a third of an eager LSTM step's CPU time)
    import gc

    from portkit import graph
    from portkit.schedule import runner
    enabled = []

    def spy(function):
        def record(*args, **kwargs):
            enabled.append(gc.isenabled())
            return function(*args, **kwargs)
        return record
    monkeypatch.setattr(graph, "walk", spy(graph.walk))              # inside backward
    monkeypatch.setattr(runner, "graph_key", spy(runner.graph_key))  # inside realize
    a = data(4, 8)
    x = Tensor(a, requires_grad=True)
    (x * x).tanh().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * a / np.cosh(a * a) ** 2, rtol=1e-5)
    assert len(enabled) >= 2 and not any(enabled)
    assert gc.isenabled()


def test_movement_gradients_skip_the_tensor_methods(data, monkeypatch):
    # a movement's gradient is the inverse movement, whose argument the forward op checked:
    # backward makes it as a primitive, not through the methods' parsing and checks; a square
    # transpose is still transposed back, though its gradient already has the input's shape
    a = data(3, 3)
    x = Tensor(a, requires_grad=True)
    y = (x.T * Tensor(np.arange(9, dtype=np.float32).reshape(3, 3))).reshape(9)
    z = y[2:7].pad(((1, 2),)).reshape(2, 4)
    ones = Tensor(np.ones((2, 4), np.float32))
    called = []
    for name in ("reshape", "permute", "pad", "shrink"):
        method = getattr(Tensor, name)
        monkeypatch.setattr(Tensor, name, lambda self, *args, method=method, name=name, **kw: (
            called.append(name), method(self, *args, **kw))[1])
    z.backward(ones)
    want = np.zeros(9, np.float32)
    want[2:7] = np.arange(9, dtype=np.float32)[2:7]
    np.testing.assert_array_equal(x.grad.numpy(), want.reshape(3, 3).T)
    assert called == []


def test_a_repeated_movement_is_worked_out_once(data, monkeypatch):
    # a training step moves the same views the same way at every step: the second time, the
    # view comes from graph's look-up, not from View's arithmetic again
    from portkit.view import View
    calls = []
    shrink = View.shrink
    monkeypatch.setattr(View, "shrink", lambda self, arg: (calls.append(arg), shrink(self, arg))[1])
    a = data(7, 13)
    x = Tensor(a)
    first = x[:, 5]
    seen = len(calls)
    second = x[:, 5]
    assert len(calls) == seen
    np.testing.assert_array_equal(first.numpy(), a[:, 5])
    np.testing.assert_array_equal(second.numpy(), a[:, 5])
