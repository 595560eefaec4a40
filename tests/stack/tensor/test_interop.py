"""numpy and DLPack interop and repr with values (portkit/tensor/interop.py)."""
import gc

import numpy as np
import pytest

import portkit as pk
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")

X = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_numpy_sees_values_and_operators_mix():
    t = Tensor(X)
    np.testing.assert_array_equal(np.asarray(t), X)
    assert np.asarray(t).dtype == np.float32
    np.testing.assert_array_equal((t + np.ones(3, np.float32)).numpy(), X + 1)
    out = np.ones(3, np.float32) * t          # numpy defers to Tensor
    assert isinstance(out, Tensor)
    np.testing.assert_array_equal(out.numpy(), X)
    np.testing.assert_array_equal(torch.tensor(t).numpy(), X)


def test_dlpack_round_trip():
    t = Tensor(X) * 2
    np.testing.assert_array_equal(torch.from_dlpack(t).numpy(), X * 2)
    back = pk.from_dlpack(torch.arange(4, dtype=torch.float32))
    np.testing.assert_array_equal(back.numpy(), [0, 1, 2, 3])
    assert t.__dlpack_device__() == (1, 0)


def test_dlpack_shares_memory_on_host_backends_and_copies_elsewhere(backend):
    t = Tensor(X).realize()
    shared = torch.from_dlpack(t)
    shared[0, 0] = 42.0                                  # write through torch ...
    host = backend in ("cpu", "interpreter")             # buffers in host memory
    assert t.numpy()[0, 0] == (42.0 if host else 0.0)    # ... read through portkit
    kept = torch.from_dlpack((t * 2).realize())
    gc.collect()
    (t * 3).realize()                                    # would reuse a freed pool buffer
    np.testing.assert_array_equal(kept.numpy()[1], X[1] * 2)


def test_repr_shows_values_like_pytorch():
    assert repr(Tensor(X)) == (
        f"Tensor([[0., 1., 2.],\n        [3., 4., 5.]], dtype=float32, "
        f"device={Tensor(X).device!r})")
    assert "requires_grad=True" in repr(Tensor(1.5, requires_grad=True))
    assert "[1, 2]" in repr(Tensor([1, 2]))
