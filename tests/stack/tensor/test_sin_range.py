"""sin, cos and tan of large arguments on every backend: accurate against numpy over the whole
float32 range (WebGPU's come from the rewrite in portkit/codegen/decompose.py: Cody-Waite below
2^20, Payne-Hanek above), NaN for inf and NaN."""
import numpy as np
import pytest

from portkit.tensor import Tensor

pytestmark = pytest.mark.usefixtures("backend")

RNG = np.random.default_rng(11)
# uniform up to 1e6; magnitudes log-uniform up to the largest float32, both signs; floats next
# to multiples of pi/2 and pi (where reduction error shows most); beyond half the largest float
# (where cos cannot take sin 2x); the named points
X = np.concatenate([
    RNG.uniform(-1e6, 1e6, 2000),
    10.0 ** RNG.uniform(6, 38.5, 2000) * RNG.choice([-1.0, 1.0], 2000),
    RNG.integers(-630_000, 630_000, 1000) * (np.pi / 2),
    RNG.integers(-2 ** 40, 2 ** 40, 1000) * np.pi,
    RNG.uniform(1.7e38, 3.4e38, 2000) * RNG.choice([-1.0, 1.0], 2000),
    [1e6, 1e7, 1e10, 1e20, 3e38, -1e6, -1e7, -1e10, -1e20, -3e38, 2.0 ** 20, 1.7e38]])
with np.errstate(over="ignore"):
    X = X.astype(np.float32)
X = X[np.isfinite(X)]


def _tolerance(want: np.ndarray) -> np.ndarray:
    """float32's 4-ulp budget for sin and cos, with the spec's absolute fallback near zero."""
    return np.maximum(4 * np.spacing(np.abs(want).astype(np.float32)), 4 * 2.0 ** -23)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_and_cos_of_large_arguments_match_numpy(name):
    got = getattr(Tensor(X), name)().numpy().astype(np.float64)
    want = getattr(np, name)(X.astype(np.float64))
    tolerance = _tolerance(want)
    worst = int(np.argmax(np.abs(got - want) - tolerance))
    assert (np.abs(got - want) <= tolerance).all(), (
        f"{name}({X[worst]!r}) = {got[worst]}, numpy {want[worst]}")


def test_tan_of_large_arguments_matches_numpy():
    x = X[np.abs(np.cos(X.astype(np.float64))) > 0.1]       # away from tan's poles
    np.testing.assert_allclose(Tensor(x).tan().numpy(), np.tan(x.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)


def test_inf_and_nan_give_nan():
    special = Tensor(np.array([np.inf, -np.inf, np.nan], np.float32))
    for name in ("sin", "cos", "tan"):
        assert np.isnan(getattr(special, name)().numpy()).all(), name
