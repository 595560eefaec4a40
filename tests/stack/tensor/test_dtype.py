"""Dtypes (portkit/tensor/dtype.py): promotion, casts, and every dtype on every backend."""
import numpy as np
import pytest

import portkit.tensor as pt
from portkit.abi import dtypes
from portkit.abi.errors import UnsupportedDType
from portkit.tensor import Tensor

pytestmark = pytest.mark.usefixtures("backend")


def test_dtypes_and_cast(capabilities):
    x = Tensor([1, 2, 3])
    assert x.dtype == pt.int32 and (x + 0.5).dtype == pt.float32
    assert (x.cast(pt.float16) + Tensor([1.0])).dtype == pt.float32
    np.testing.assert_array_equal(Tensor([1.7, -1.7]).cast(pt.int32).numpy(), [1, -1])
    if pt.float64 in capabilities.dtypes:
        assert Tensor(np.ones(2, np.float64)).dtype == pt.float64


@pytest.mark.parametrize("dtype", dtypes.ALL, ids=lambda d: d.name)
def test_every_dtype_runs_or_is_unsupported(dtype, capabilities, backend):
    """Arithmetic, a reduction and casts per dtype; a dtype the device lacks is a typed error."""
    a = np.array([0, 1, 2, 3, 5, 7]).astype(dtype.np)
    if dtype not in capabilities.dtypes:
        with pytest.raises(UnsupportedDType, match=f"{backend}.*{dtype.name}"):
            Tensor(a, dtype)
        with pytest.raises(UnsupportedDType, match=dtype.name):
            Tensor(a.astype(np.float32)).cast(dtype)
        return
    x = Tensor(a, dtype)
    if dtype == pt.bool_:
        np.testing.assert_array_equal((x | x.flip(0)).numpy(), a | a[::-1])
        np.testing.assert_array_equal(x.max().numpy(), a.max())
    else:
        want = a * a[::-1] + a
        np.testing.assert_allclose((x * x.flip(0) + x).numpy().astype(np.float64),
                                   want.astype(np.float64), rtol=1e-2)
        np.testing.assert_array_equal(x.max().numpy(), a.max())
        assert (x.sum().numpy() == a.sum(dtype=np.float64))
    np.testing.assert_array_equal(x.cast(pt.float32).numpy(), a.astype(np.float32))
    np.testing.assert_array_equal((x < 3).numpy(), a < 3)


def test_a_dtype_argument_is_a_dtype_a_numpy_dtype_or_a_name():
    for like in (pt.float16, np.float16, np.dtype("float16"), "float16"):
        assert Tensor([1, 2], like, device="interpreter").dtype == pt.float16
        assert Tensor([1, 2], device="interpreter").cast(like).dtype == pt.float16


def test_a_0d_tensor_promotes_as_in_torch(capabilities):
    # A 0-d tensor beside a tensor with dimensions sets the dtype only when its category
    # (bool < integer < float) is higher: float16 * tensor(2.0) stays float16 (was float32).
    torch = pytest.importorskip("torch")
    names = [d.name for d in dtypes.ALL if d in capabilities.dtypes
             and d.name not in ("uint16", "uint32", "uint64")]    # torch's arithmetic lacks these
    for a, b in ((a, b) for a in names for b in names):
        for a_dims, b_dims in ((1, 0), (0, 1), (1, 1), (0, 0)):
            want = torch.ones((2,) * a_dims, dtype=getattr(torch, a)) + torch.ones(
                (2,) * b_dims, dtype=getattr(torch, b))
            got = Tensor.ones(*(2,) * a_dims, dtype=a) + Tensor.ones(*(2,) * b_dims, dtype=b)
            assert got.dtype.name == str(want.dtype).removeprefix("torch."), (a, a_dims, b, b_dims)
