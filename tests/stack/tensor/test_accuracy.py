"""exp, cos, tan and pow against float64/long double references and PyTorch's gradients (issue
15): each test fails on the formulas they replace, on every backend that loads here."""
import numpy as np
import pytest

from portkit.tensor import Tensor, float64

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")

RNG = np.random.default_rng(15)


def _ulps(got: np.ndarray, want: np.ndarray, dtype) -> np.ndarray:
    """|got - want| in units of the last place of want in `dtype`; specials must match."""
    with np.errstate(over="ignore"):
        specials = ~np.isfinite(want.astype(dtype))     # past the largest float: inf
    np.testing.assert_array_equal(got[specials], want[specials].astype(dtype))
    finite = np.where(specials, 1, want)
    spacing = np.spacing(np.abs(finite).astype(dtype)).astype(np.longdouble)
    return np.where(specials, 0, np.abs(got.astype(np.longdouble) - finite) / spacing)


def _dtypes(capabilities):
    return [np.float32] + ([np.float64] if float64 in capabilities.dtypes else [])


def test_exp_is_within_two_ulp(capabilities):
    # exp2(x * log2(e)) rounded the product first: 59 ulp near 76 in float32, 399 in float64
    for dtype in _dtypes(capabilities):
        top = float(np.log(np.finfo(dtype).max))
        x = np.concatenate([RNG.uniform(-top, top, 4000), RNG.uniform(-2, 2, 1000),
                            [76.3, -87.5, -103.9, top, 0, np.inf, -np.inf]]).astype(dtype)
        got = Tensor(x).exp().numpy()
        ulps = _ulps(got, np.exp(x.astype(np.longdouble)), dtype)
        assert ulps.max() <= 2, (dtype, x[ulps.argmax()], ulps.max())
    assert np.isnan(Tensor(np.float32("nan")).exp().item())


def test_cos_and_tan_are_accurate_near_the_zeros_of_cos_and_far_out(capabilities):
    for dtype in _dtypes(capabilities):
        # cos(x) was sin(pi/2 - x): cos(1e4) gave -0.95200 for -0.95216
        x = np.concatenate([RNG.uniform(-1e4, 1e4, 3000), RNG.uniform(-4, 4, 1000),
                            np.pi / 2 + np.arange(-40, 40) * np.pi, [0.0, 1e4]]).astype(dtype)
        wide = x.astype(np.longdouble)
        for name, want, budget in (("cos", np.cos(wide), 4), ("tan", np.tan(wide), 5)):
            ulps = _ulps(getattr(Tensor(x), name)().numpy(), want, dtype)
            assert ulps.max() <= budget, (name, dtype, x[ulps.argmax()], ulps.max())


def test_cos_far_out_is_accurate_where_the_devices_sin_is():
    # cos(1e8) gave -0.93 (numpy -0.363): cos now reduces its argument where sin does
    x = np.array([1e8, -3.3e9, 1e20, 7e37, 3e38], np.float32)
    wide = x.astype(np.float64)         # float64's sin and cos reduce exactly (glibc)
    for check_x in (x, 2 * x[:-1], x / 2):
        sin_ulps = _ulps(Tensor(check_x).sin().numpy(), np.sin(check_x.astype(np.float64)),
                         np.float32)
        if not (sin_ulps <= 2).all():
            return      # the device's SIN is not accurate this far out; nothing to compare
    cos_ulps = _ulps(Tensor(x).cos().numpy(), np.cos(wide), np.float32)
    assert cos_ulps.max() <= 4, (x, cos_ulps)


@pytest.mark.parametrize("name", ["exp", "cos", "tan"])
def test_gradients_follow_pytorch(name, check, data):
    check(lambda t: getattr(t, name)(), data(4, 5))
    check(lambda t: getattr(t, name)(), np.array([0.0, 1.5707964, 40.0, -3.0], np.float32))


@pytest.mark.parametrize("exponent", [0.3, -0.7, 2.5, 0.0, 1.0, 0, 2, 3.0])
def test_pow_gradient_at_zero_follows_pytorch(exponent):
    # through exp2 and log2 the gradient of x ** 0.3 at 0 was NaN (PyTorch: inf)
    x = np.array([0.0, 1e-20, 0.5, 2.0, -2.0, np.inf], np.float32)
    ours, theirs = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    value, want = ours ** exponent, theirs ** exponent
    np.testing.assert_allclose(value.numpy(), want.detach().numpy(), rtol=1e-5)
    value.sum().backward()
    want.sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5)


def test_pow_of_two_tensors_gradients_follow_pytorch():
    base = np.array([0.0, 0.0, 2.0, 3.0, 1.0], np.float32)
    exponent = np.array([0.5, 0.0, -1.0, 2.0, np.inf], np.float32)
    ours = [Tensor(a, requires_grad=True) for a in (base, exponent)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (base, exponent)]
    value, want = ours[0] ** ours[1], theirs[0] ** theirs[1]
    np.testing.assert_allclose(value.numpy(), want.detach().numpy(), rtol=1e-5)
    value.sum().backward()
    want.sum().backward()
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), rtol=1e-5)


SPECIAL_BASES = np.array([0.0, -0.0, 1e-30, -2.5, 3.0, np.inf, -np.inf, np.nan], np.float32)


def _assert_like_torch(what: str, got: np.ndarray, want: np.ndarray) -> None:
    """got == want to 1e-5 relative, with NaN where want has NaN and the sign of every zero
    and infinity; the message names the first base that differs."""
    close = np.isclose(got, want, rtol=1e-5, atol=0, equal_nan=True)
    same_sign = np.isnan(want) | (np.signbit(got) == np.signbit(want))
    wrong = np.flatnonzero(~(close & same_sign))
    assert not wrong.size, (f"{what} at x = {SPECIAL_BASES[wrong].tolist()}: "
                            f"{got[wrong].tolist()}, torch {want[wrong].tolist()}")


@pytest.mark.parametrize("tensor_exponent", [False, True], ids=["number", "tensor"])
@pytest.mark.parametrize("exponent", [-3, -2, -1, -0.5, 0, 0.5, 1, 2, 3, 2.0, -2.0, 1.5])
def test_pow_at_zeros_infinities_and_nan_follows_pytorch(exponent, tensor_exponent):
    # the gradient of x ** -2 at 0 was NaN (the reciprocal's -inf times 0 from x * x; torch
    # -inf), x ** -2.0 and x ** tensor(y) lost the sign of (-0) ** odd, and torch's x ** -0.5
    # is 1 / sqrt(x): -inf at -0
    y = np.full(SPECIAL_BASES.shape, exponent, np.float32)
    ours = [Tensor(a, requires_grad=True) for a in (SPECIAL_BASES, y)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (SPECIAL_BASES, y)]
    value = ours[0] ** (ours[1] if tensor_exponent else exponent)
    want = theirs[0] ** (theirs[1] if tensor_exponent else exponent)
    _assert_like_torch("value", value.numpy(), want.detach().numpy())
    value.sum().backward()
    want.sum().backward()
    for name, o, t in zip(("d/dx", "d/dy"), ours, theirs[:1 + tensor_exponent]):
        _assert_like_torch(name, o.grad.numpy(), t.grad.numpy())


def test_float32_exp_reduces_its_argument_once(capabilities):
    # after Cody-Waite, 2^f with |f| <= 1/2 is the polynomial EXP2 would evaluate after
    # reducing f again (a third of a SiLU's arithmetic); float64 keeps EXP2
    from portkit.abi.ops import Op
    from portkit.graph import walk
    x = RNG.uniform(-100, 80, 4096).astype(np.float32)
    out = Tensor(x).exp()
    assert Op.EXP2 not in {n.op for n in walk([out.lazy]).order}
    if float64 in capabilities.dtypes:
        assert Op.EXP2 in {n.op for n in walk([Tensor(x, dtype=float64).exp().lazy]).order}
    assert _ulps(out.numpy(), np.exp(x.astype(np.longdouble)), np.float32).max() <= 2
