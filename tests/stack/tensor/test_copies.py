"""Copies between devices: lazy, differentiable, direct where the backend declares a peer copy,
and an op mixing two devices refused when it is written."""
import numpy as np
import pytest

from portkit import Tensor, graph, runtime

X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5


def test_to_is_lazy_and_the_gradient_flows_back_to_the_source_device():
    a = Tensor(X, requires_grad=True)
    moved = a.to("cpu:1")
    assert moved.device == "cpu:1" and moved.lazy.op is graph.GraphOp.COPY
    assert a.to("cpu:0") is a
    loss = (moved * moved).sum().to("cpu") + (a * 3).sum()
    loss.backward()
    assert loss.device == "cpu" and a.grad.device == "cpu"
    np.testing.assert_allclose(a.grad.numpy(), 2 * X + 3)
    np.testing.assert_array_equal(moved.numpy(), X)


def test_a_copy_uses_the_peer_copy_the_backend_declares(monkeypatch):
    device = runtime.get("cpu:1").device
    calls = []

    def counted(destination, source_device, source, nbytes):
        calls.append(nbytes)
        return device.peer_copy.__wrapped__(destination, source_device, source, nbytes)

    counted.__wrapped__ = device.peer_copy
    monkeypatch.setattr(device, "peer_copy", counted)
    np.testing.assert_array_equal((Tensor(X) + 1).to("cpu:1").numpy(), X + 1)
    assert calls == [X.nbytes]


def test_a_copy_goes_through_the_host_where_no_peer_copy_applies(monkeypatch):
    monkeypatch.setattr(runtime.get("cpu:1").device, "peer_copy", lambda *args: False)
    np.testing.assert_array_equal(Tensor(X).to("cpu:1").numpy(), X)
    # the interpreter declares none: both ways through the host
    there = Tensor(X).to("interpreter")
    np.testing.assert_array_equal((there * 2).to("cpu").numpy(), 2 * X)


@pytest.mark.parametrize("op", [
    lambda a, b: a + b,
    lambda a, b: a @ b.T,
    lambda a, b: a.where(a > 0, b),
    lambda a, b: a.cat(b),
    lambda a, b: a[Tensor([0, 2], device=b.device)],
])
def test_an_op_mixing_devices_raises_when_written_naming_both(op):
    a, b = Tensor(X), Tensor(X, device="cpu:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but "
                       "found at least two devices, cpu and cpu:1") as raised:
        op(a, b)
    assert isinstance(raised.value, graph.DeviceMismatch)


def test_assign_copies_a_value_from_another_device():
    a = Tensor(np.zeros((3, 4), np.float32))
    a.assign(Tensor(X, device="cpu:1"))
    assert a.device == "cpu"
    np.testing.assert_array_equal(a.numpy(), X)
