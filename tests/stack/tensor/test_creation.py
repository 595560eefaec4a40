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
