"""Seeded random numbers come from a counter-based generator in ABI ops, run on the device.

So every backend yields the same numbers: the bits and integers exactly, uniform floats
exactly too (they are scaled integers), normals within float rounding of log, sqrt and cos.
The interpreter, which computes the ABI spec itself, is the reference.
"""
import numpy as np
import pytest

import portkit.tensor as pt
from portkit import backends
from portkit.schedule import runner
from portkit.tensor import Tensor

BACKENDS = [name for name, reason in backends.available().items() if reason is None]


def draws(device: str) -> dict[str, np.ndarray]:
    """One fixed sequence of draws after seed(1234), on `device`."""
    pt.seed(1234)
    return {
        "bits": Tensor.randint(0, 1 << 32, (257,), pt.uint32, device).numpy(),
        "randint": Tensor.randint(-5, 1 << 20, (7, 9), device=device).numpy(),
        "rand": Tensor.rand(3, 50, device=device).numpy(),
        "rand16": Tensor.rand(64, dtype=pt.float16, device=device).numpy(),
        "randn": Tensor.randn(300, device=device).numpy(),
    }


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    return draws("interpreter")


@pytest.mark.parametrize("device", [b for b in BACKENDS if b != "interpreter"])
def test_every_backend_yields_the_same_numbers(device, reference):
    got = draws(device)
    for name in ("bits", "randint", "rand", "rand16"):
        assert got[name].dtype == reference[name].dtype, name
        np.testing.assert_array_equal(got[name], reference[name], err_msg=f"{name} on {device}")
    np.testing.assert_allclose(got["randn"], reference["randn"], rtol=1e-5, atol=1e-5,
                               err_msg=f"randn on {device}")


def test_seed_reproduces_and_draws_differ():
    a, b = draws("cpu"), draws("cpu")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    pt.seed(1234)
    first, second = Tensor.rand(100).numpy(), Tensor.rand(100).numpy()
    assert (first != second).mean() > 0.95
    pt.seed(1235)
    assert (Tensor.rand(100).numpy() != first).mean() > 0.95
    # a longer draw does not start with a shorter one's numbers shifted
    pt.seed(9)
    short = Tensor.rand(1000).numpy()
    longer = Tensor.rand(2000).numpy()
    assert len(np.intersect1d(short, longer)) < 10


def test_distributions():
    pt.seed(0)
    bits = Tensor.randint(0, 1 << 32, (20000,), pt.uint32).numpy()
    ones = (bits[:, None] >> np.arange(32, dtype=np.uint32) & 1).mean(0)
    assert np.all(np.abs(ones - 0.5) < 0.02), ones       # every bit is a fair coin
    u = Tensor.rand(20000).numpy()
    assert u.dtype == np.float32 and 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    # float16 keeps its 11 significant bits: never rounded up to 1.0
    h = Tensor.rand(20000, dtype=pt.float16).numpy()
    assert h.dtype == np.float16 and h.max() < 1
    n = Tensor.randn(20000).numpy()
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    assert abs((np.abs(n) < 1).mean() - 0.6827) < 0.02
    r = Tensor.randint(3, 7, (4000,)).numpy()
    assert r.dtype == np.int32
    counts = np.bincount(r - 3, minlength=4)
    assert counts.sum() == 4000 and np.all(np.abs(counts - 1000) < 120), counts


def test_generated_on_the_device_and_compiled_once_per_shape():
    pt.seed(5)
    sample = Tensor.rand(4096)
    kernels = sample.schedule()
    # one kernel, and its only input is the two key words: no host-made array of numbers
    assert len(kernels) == 1
    assert len(kernels[0].params) == 2
    sample.numpy()
    compiled = len(runner._kernels)
    for _ in range(3):
        Tensor.rand(4096).numpy()
    assert len(runner._kernels) == compiled


def test_randint_and_rand_reject_bad_arguments():
    with pytest.raises(ValueError, match="low < high"):
        Tensor.randint(5, 5, (3,))
    with pytest.raises(TypeError, match="randint"):
        Tensor.rand(3, dtype=pt.int32)


@pytest.mark.usefixtures("backend")
def test_seeded_draws_on_every_backend():
    pt.seed(1)
    a = Tensor.rand(1000).numpy()
    pt.seed(1)
    assert (Tensor.rand(1000).numpy() == a).all()
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.05
    n = Tensor.randn(20000).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    r = Tensor.randint(3, 7, (500,)).numpy()
    assert set(np.unique(r)) == {3, 4, 5, 6}
