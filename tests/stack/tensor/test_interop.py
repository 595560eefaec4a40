"""numpy and DLPack interop and repr with values (portkit/tensor/interop.py)."""
import gc

import numpy as np
import pytest

import portkit as pk
from portkit.abi.errors import UnsupportedDType
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


def test_from_dlpack_shares_host_memory_and_reads_it_when_realized(backend):
    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = pk.from_dlpack(source)
    lazy, done = t * 2, (t * 3).realize()
    source[0, 0] = 42.0                                 # write through torch ...
    host = backend in ("cpu", "interpreter")
    seen = 42.0 if host else 0.0                        # ... read through portkit
    assert t.numpy()[0, 0] == seen
    assert lazy.numpy()[0, 0] == 2 * seen               # a graph reads it when realized
    assert done.numpy()[0, 0] == 0.0                    # a realized result is its own buffer
    assert (torch.from_dlpack(t).data_ptr() == source.data_ptr()) == host   # round trip


def test_from_dlpack_of_numpy_keeps_dtype_and_outlives_the_source(backend):
    array = np.arange(5, dtype=np.int16)
    t = pk.from_dlpack(array)
    assert t.dtype == pk.int16 and t.shape == (5,)
    array[4] = -7
    assert t.numpy()[4] == (-7 if backend in ("cpu", "interpreter") else 4)
    del array
    gc.collect()
    np.testing.assert_array_equal((t + 1).numpy()[:4], [1, 2, 3, 4])
    assert pk.from_dlpack(torch.tensor(2.5)).item() == 2.5    # 0-d


def test_from_dlpack_copies_a_strided_source_and_never_pools_borrowed_memory(backend):
    source = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    t = pk.from_dlpack(source.T)                        # not C-contiguous: copied
    source[0, 1] = -1.0
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3).T)
    kept = torch.zeros(6)
    borrowed = pk.from_dlpack(kept)
    np.testing.assert_array_equal((borrowed + 1).numpy(), np.ones(6))
    del borrowed
    gc.collect()
    for _ in range(4):                                  # same byte size: a pool would reuse it
        (Tensor(np.ones(6, np.float32)) * 5).realize()
    assert not kept.any()


def test_from_dlpack_keeps_int64_or_refuses_it_when_written(capabilities):
    if pk.int64 in capabilities.dtypes:
        assert pk.from_dlpack(torch.arange(3)).dtype == pk.int64
    else:
        with pytest.raises(UnsupportedDType, match="int32"):
            pk.from_dlpack(torch.arange(3))


def test_bfloat16_crosses_dlpack_both_ways_and_prints_as_torch(backend):
    """numpy has no bfloat16 DLPack code: both directions raised numpy's errors, np.asarray
    gave void ("|V2") values, and repr printed [1, 2.5]."""
    from portkit import runtime
    from portkit.abi import dtypes
    if dtypes.bfloat16 not in runtime.get(backend).capabilities.dtypes:
        with pytest.raises(UnsupportedDType):
            Tensor([1.0], dtype="bfloat16")
        return
    values = [1.0, 2.5, -3.0]
    t = Tensor(values, dtype="bfloat16")
    out = torch.from_dlpack(t)
    assert out.dtype == torch.bfloat16 and out.tolist() == values
    assert np.asarray(t).dtype.name == "bfloat16"
    back = pk.from_dlpack(torch.tensor(values, dtype=torch.bfloat16))
    assert back.dtype.name == "bfloat16" and back.tolist() == values
    assert "[ 1. ,  2.5, -3. ], dtype=bfloat16" in repr(t)


def test_a_numpy_scalar_keeps_its_dtype_as_in_torch():
    assert Tensor(np.float64(3.5), device="cpu").dtype == pk.float64      # was float32
    assert Tensor(np.float16(1.5), device="cpu").dtype == pk.float16
