"""sin, cos and tan of large arguments on every backend: accurate against numpy for |x| up to
1e6 (WebGPU's come from the Cody-Waite rewrite in portkit/codegen/decompose.py), finite and
in range up to 3e38, NaN for inf and NaN."""
import numpy as np
import pytest

from portkit.tensor import Tensor

pytestmark = pytest.mark.usefixtures("backend")

RNG = np.random.default_rng(11)
# uniform up to 1e6, and floats next to multiples of pi/2 (where reduction error shows most)
X = np.concatenate([RNG.uniform(-1e6, 1e6, 4000),
                    (RNG.integers(-630_000, 630_000, 2000) * (np.pi / 2))]).astype(np.float32)


@pytest.mark.parametrize("name", ["sin", "cos"])
def test_sin_and_cos_of_large_arguments_match_numpy(name):
    got = getattr(Tensor(X), name)().numpy().astype(np.float64)
    want = getattr(np, name)(X.astype(np.float64))
    # float32's 4-ulp budget for sin and cos, with the spec's absolute fallback near zero
    tolerance = np.maximum(4 * np.spacing(np.abs(want).astype(np.float32)), 4 * 2.0 ** -23)
    worst = int(np.argmax(np.abs(got - want) - tolerance))
    assert (np.abs(got - want) <= tolerance).all(), (
        f"{name}({X[worst]!r}) = {got[worst]}, numpy {want[worst]}")


def test_tan_of_large_arguments_matches_numpy():
    x = X[np.abs(np.cos(X.astype(np.float64))) > 0.1]       # away from tan's poles
    np.testing.assert_allclose(Tensor(x).tan().numpy(), np.tan(x.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)


def test_huge_arguments_give_finite_values_in_range_and_inf_gives_nan():
    huge = np.array([3e6, -7.5e8, 2.0 ** 31, 1e20, -1e30, 3e38], np.float32)
    for name in ("sin", "cos"):
        out = getattr(Tensor(huge), name)().numpy()
        assert np.isfinite(out).all() and (np.abs(out) <= 1).all(), (name, out)
    special = Tensor(np.array([np.inf, -np.inf, np.nan], np.float32))
    assert np.isnan(special.sin().numpy()).all() and np.isnan(special.cos().numpy()).all()
