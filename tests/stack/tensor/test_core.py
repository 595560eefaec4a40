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
