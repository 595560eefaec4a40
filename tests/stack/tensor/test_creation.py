"""Constructors (portkit/tensor/creation.py) against numpy, on every backend."""
import numpy as np
import pytest

from portkit.tensor import Tensor

pytestmark = pytest.mark.usefixtures("backend")


def test_constructors():
    np.testing.assert_array_equal(Tensor.arange(2, 11, 3).numpy(), np.arange(2, 11, 3))
    np.testing.assert_allclose(Tensor.linspace(0, 1, 5).numpy(), np.linspace(0, 1, 5))
    np.testing.assert_array_equal(Tensor.eye(3, 4).numpy(), np.eye(3, 4))
    np.testing.assert_array_equal(Tensor.full((2, 2), 7).numpy(), np.full((2, 2), 7))


@pytest.mark.parametrize("make", [
    lambda: Tensor.zeros(2**16, 2**16, dtype="uint8"),
    lambda: Tensor.ones(2**31 + 8),
    lambda: Tensor.zeros(2**20, 2**20),
    lambda: Tensor.full((2**31,), 1.5),
    lambda: Tensor.rand(2**16, 2**16),
])
def test_a_tensor_past_the_int32_index_range_is_refused_when_written(make):
    """These segfaulted in the cpu and opencl kernels (a 32-bit index overflowed), failed IR
    validation, or ran for minutes; the error comes before any allocation."""
    from portkit.graph import TooLarge

    with pytest.raises(TooLarge, match=r"at most 2,147,483,647 \(2\^31 - 1\)"):
        make()
    with pytest.raises(RuntimeError):     # what torch raises for a tensor it cannot make
        make()


def test_the_largest_indexable_tensor_can_still_be_written():
    x = Tensor.zeros(2**31 - 1, dtype="uint8")      # lazy: nothing is allocated
    assert x.shape == (2**31 - 1,) and x[:3].numpy().tolist() == [0, 0, 0]
