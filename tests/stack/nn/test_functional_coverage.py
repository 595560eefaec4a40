"""The activations, regression losses, distances, adaptive pools, shuffles, instance_norm and
channel dropouts of portkit.nn.functional, against PyTorch CPU on every backend (forward and
backward), with torch's keyword arguments, edge cases and error types; and the list of
torch.nn.functional names portkit still lacks."""
import inspect

import numpy as np
import pytest

from portkit.nn import functional as F
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RNG = np.random.default_rng(21)


def _f(t):
    return F if isinstance(t, Tensor) else TF


def _as(t, array):
    return Tensor(array) if isinstance(t, Tensor) else torch.tensor(array)


def _normal(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("name, kwargs", [
    ("relu", {}), ("relu", {"inplace": True}), ("sigmoid", {}), ("tanh", {}),
    ("threshold", {"threshold": 0.5, "value": -2.0}), ("hardshrink", {}),
    ("hardshrink", {"lambd": 1.5}), ("softshrink", {}), ("softshrink", {"lambd": 1.0}),
    ("tanhshrink", {}), ("relu6", {"inplace": True}), ("hardtanh", {"inplace": True}),
    ("silu", {"inplace": True}), ("elu", {"alpha": 0.5, "inplace": True}),
    ("leaky_relu", {"negative_slope": 0.2, "inplace": True}),
], ids=str)
def test_activations_match_torch_and_keep_nan(name, kwargs, check):
    x = _normal(4, 6, scale=3)
    x[0, :4] = [0.5, -0.5, 1.5, -1.5]      # at the bounds of threshold and the shrinks
    theirs = {k: v for k, v in kwargs.items() if k != "inplace"}    # torch's would write x
    check(lambda t: getattr(F, name)(t, **kwargs), x,
          torch_fn=lambda t: getattr(TF, name)(t, **theirs))
    x[1, 0] = np.nan
    check(lambda t: getattr(F, name)(t, **kwargs), x, grad=False,
          torch_fn=lambda t: getattr(TF, name)(t, **theirs))
    assert np.isnan(getattr(F, name)(Tensor(x), **kwargs).numpy()[1, 0])


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("name, kinks", [
    ("relu", [0.0, -0.0]), ("relu6", [0.0, 6.0]), ("hardtanh", [-1.0, 1.0]),
    ("hardsigmoid", [-3.0, 3.0]), ("hardswish", [-3.0, 3.0]), ("softplus", [0.0, 20.0]),
    ("leaky_relu", [0.0]), ("elu", [0.0]), ("silu", [0.0]),
], ids=str)
def test_gradients_at_the_kinks_match_torch(name, kinks, check):
    # relu's gradient at 0 was 1, hardtanh's (relu6's, the hard sigmoid's) 1 at its bounds and
    # softplus's 1 at 0; torch's are 0, 0 and 1/2
    x = np.array([*kinks, -2.5, 2.5], np.float32)
    check(lambda t: getattr(_f(t), name)(t), x, atol=1e-6)
    assert np.signbit(getattr(F, name)(Tensor(x)).numpy()).tolist() == \
        np.signbit(getattr(TF, name)(torch.tensor(x)).numpy()).tolist()


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
def test_softmax_family_dims_and_dtype(name, check):
    for shape in [(5,), (3, 4), (2, 3, 4), (2, 3, 2, 2)]:
        check(lambda t: getattr(_f(t), name)(t), _normal(*shape))       # torch's legacy dim
    x = _normal(3, 4, 5)
    check(lambda t: getattr(_f(t), name)(t, dim=-1), x)
    check(lambda t: getattr(_f(t), name)(t, 0), x)
    check(lambda t: getattr(_f(t), name)(t, dim=2, dtype=torch.float32 if not isinstance(
        t, Tensor) else "float32"), x)


@pytest.mark.usefixtures("backend")
def test_glu(check):
    x = _normal(4, 6, 2)
    check(lambda t: _f(t).glu(t), x)
    check(lambda t: _f(t).glu(t, dim=1), x)
    check(lambda t: _f(t).glu(t, 0), x)
    with pytest.raises(RuntimeError, match="Halving dimension must be even"):
        F.glu(Tensor(_normal(3, 3)))
    with pytest.raises(RuntimeError, match="scalars"):
        F.glu(Tensor(np.float32(1.0)))


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name, kwargs", [
    ("mse_loss", {}), ("l1_loss", {}), ("smooth_l1_loss", {}), ("smooth_l1_loss", {"beta": 0.5}),
    ("smooth_l1_loss", {"beta": 0.0}), ("huber_loss", {}), ("huber_loss", {"delta": 0.3}),
], ids=str)
def test_regression_losses(name, kwargs, reduction, check):
    x, y = _normal(3, 5, scale=2), _normal(3, 5)
    y[0, 0] = x[0, 0]                                # no difference: |d|'s kink
    check(lambda a, b: getattr(_f(a), name)(a, b, reduction=reduction, **kwargs), x, y)
    check(lambda a: getattr(_f(a), name)(a, _as(a, y[0]), reduction=reduction, **kwargs), x)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss", "huber_loss"])
def test_weighted_regression_losses(name, reduction, check):
    x, y, w = _normal(4, 3), _normal(4, 3), np.abs(_normal(4, 3))
    check(lambda a, b: getattr(_f(a), name)(a, b, reduction=reduction, weight=_as(a, w)), x, y)


@pytest.mark.usefixtures("backend")
def test_legacy_size_average_and_reduce(check):
    x, y = _normal(3, 4), _normal(3, 4)
    for size_average, reduce in [(False, None), (None, False), (True, True), (False, True)]:
        for name in ["mse_loss", "l1_loss", "smooth_l1_loss", "kl_div"]:
            check(lambda a, b, name=name, size_average=size_average, reduce=reduce: getattr(
                _f(a), name)(a, b.abs() if name == "kl_div" else b, size_average=size_average,
                             reduce=reduce), x, y)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none", "batchmean"])
def test_kl_div(reduction, check):
    logp = np.log(np.abs(_normal(3, 4)) + 0.1).astype(np.float32)
    q = np.abs(_normal(3, 4)) + 0.1
    check(lambda a, b: _f(a).kl_div(a, b, reduction=reduction), logp, q)
    check(lambda a, b: _f(a).kl_div(a, b, reduction=reduction, log_target=True), logp,
          np.log(q))
    q[0, :2] = 0                                     # 0 log 0 counts for 0, as torch's
    check(lambda a: _f(a).kl_div(a, _as(a, q), reduction=reduction), logp)


def test_loss_errors():
    x = Tensor(_normal(3))
    for name in ["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div"]:
        with pytest.raises(ValueError, match="not a valid value for reduction"):
            getattr(F, name)(x, x, reduction="average")
    with pytest.raises(RuntimeError, match="cannot be broadcast"):
        F.mse_loss(x, Tensor(_normal(2)))
    with pytest.raises(RuntimeError, match="negative values for beta"):
        F.smooth_l1_loss(x, x, beta=-1.0)
    with pytest.raises(RuntimeError, match="non-positive values for delta"):
        F.huber_loss(x, x, delta=0.0)
    with pytest.raises(ValueError, match="same size"):
        F.mse_loss(x, x, weight=Tensor(_normal(1)))
    with pytest.raises(RuntimeError, match="lambda must be"):
        F.softshrink(x, -1.0)


@pytest.mark.usefixtures("backend")
def test_cosine_similarity(check):
    a, b = _normal(4, 5, 3), _normal(4, 5, 3)
    check(lambda x, y: _f(x).cosine_similarity(x, y), a, b)
    check(lambda x, y: _f(x).cosine_similarity(x, y, dim=-1, eps=1e-3), a, b)
    check(lambda x, y: _f(x).cosine_similarity(x, y, 0), a, b[:1])          # broadcast
    a[0, :, 0] = 0                                   # a zero vector: similarity 0, no NaN
    check(lambda x, y: _f(x).cosine_similarity(x, y, dim=1), a, b)
    with pytest.raises(RuntimeError):
        F.cosine_similarity(Tensor(_normal(2, 3)), Tensor(_normal(2, 4)))


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, float("inf")])
def test_pairwise_distance(p, check):
    a, b = _normal(6, 4), _normal(6, 4)
    check(lambda x, y: _f(x).pairwise_distance(x, y, p=p), a, b)
    check(lambda x, y: _f(x).pairwise_distance(x, y, p, 1e-3, True), a, b)
    check(lambda x, y: _f(x).pairwise_distance(x, y, p=p), a[0], b[0])


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("d, shape, size", [
    (1, (2, 3, 12), 4), (1, (2, 3, 10), 3), (1, (3, 7), 5),
    (2, (2, 3, 8, 6), (4, 3)), (2, (2, 3, 7, 5), (3, 2)), (2, (2, 3, 7, 5), 1),
    (2, (2, 3, 7, 5), (None, 4)), (2, (3, 5, 9), (2, 4)), (2, (1, 2, 5, 5), 5),
    (3, (1, 2, 6, 5, 4), (3, 2, 3)), (3, (2, 4, 4, 6), 2),
], ids=str)
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_adaptive_pools(kind, d, shape, size, check):
    name = f"adaptive_{kind}_pool{d}d"
    check(lambda t: getattr(_f(t), name)(t, size), _normal(*shape))


@pytest.mark.usefixtures("backend")
def test_adaptive_pools_nan_indices_and_errors(check):
    x = _normal(1, 2, 7, 6)
    x[0, 0, 3, 2] = np.nan
    for name in ["adaptive_avg_pool2d", "adaptive_max_pool2d"]:
        check(lambda t, name=name: getattr(_f(t), name)(t, (3, 4)), x, grad=False)
    out, index = F.adaptive_max_pool2d(Tensor(x[:, :, :6]), 3, return_indices=True)
    ref, ref_index = TF.adaptive_max_pool2d(torch.tensor(x[:, :, :6]), 3, return_indices=True)
    np.testing.assert_allclose(out.numpy(), ref.numpy())
    np.testing.assert_array_equal(index.numpy(), ref_index.numpy())
    with pytest.raises(RuntimeError, match="Expected 3D or 4D"):
        F.adaptive_avg_pool2d(Tensor(_normal(3)), 2)
    with pytest.raises(RuntimeError, match="output_size must be 2"):
        F.adaptive_avg_pool2d(Tensor(x), (2,))


@pytest.mark.usefixtures("backend")
def test_pixel_and_channel_shuffles(check):
    x = _normal(2, 12, 3, 2)
    check(lambda t: _f(t).pixel_shuffle(t, 2), x)
    check(lambda t: _f(t).pixel_shuffle(t, 1), x)
    check(lambda t: _f(t).pixel_unshuffle(t, 3), _normal(2, 2, 6, 3))
    check(lambda t: _f(t).pixel_unshuffle(t, 2), _normal(3, 4, 4))         # unbatched
    check(lambda t: _f(t).pixel_shuffle(_f(t).pixel_unshuffle(t, 2), 2), _normal(1, 2, 4, 6))
    check(lambda t: _f(t).channel_shuffle(t, 3), _normal(2, 6, 2, 2), grad=False)
    with pytest.raises(RuntimeError, match="divisible by the square"):
        F.pixel_shuffle(Tensor(x), 3)
    with pytest.raises(RuntimeError, match="height to be divisible"):
        F.pixel_unshuffle(Tensor(x), 2)
    with pytest.raises(RuntimeError, match="at least 3 dimensions"):
        F.pixel_shuffle(Tensor(_normal(4, 4)), 2)


@pytest.mark.usefixtures("backend")
def test_instance_norm(check):
    x, w, b = _normal(2, 3, 5, 4), _normal(3), _normal(3)
    check(lambda t: _f(t).instance_norm(t), x)
    check(lambda t, w, b: _f(t).instance_norm(t, weight=w, bias=b, eps=1e-3), x, w, b)
    check(lambda t: _f(t).instance_norm(t), _normal(2, 3, 6))
    mean, var = _normal(3), np.abs(_normal(3)) + 0.5
    check(lambda t: _f(t).instance_norm(t, _as(t, mean), _as(t, var), use_input_stats=False), x)
    ours_mean, ours_var = Tensor(mean.copy()), Tensor(var.copy())
    theirs_mean, theirs_var = torch.tensor(mean), torch.tensor(var)
    F.instance_norm(Tensor(x), ours_mean, ours_var, momentum=0.3).numpy()
    TF.instance_norm(torch.tensor(x), theirs_mean, theirs_var, momentum=0.3)
    np.testing.assert_allclose(ours_mean.numpy(), theirs_mean.numpy(), atol=1e-6)
    np.testing.assert_allclose(ours_var.numpy(), theirs_var.numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="more than 1 spatial element"):
        F.instance_norm(Tensor(_normal(2, 3, 1)))


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("name, shape, drawn", [
    ("dropout1d", (4, 6, 5), 2), ("dropout1d", (6, 5), 1), ("dropout2d", (4, 6, 3, 2), 2),
    ("dropout2d", (4, 6, 5), 2), ("dropout3d", (2, 6, 2, 3, 2), 2), ("dropout3d", (6, 2, 3, 2), 1),
], ids=str)
def test_channel_dropouts(name, shape, drawn):
    x = np.abs(_normal(*shape)) + 1
    t = Tensor(x, requires_grad=True)
    out = getattr(F, name)(t, 0.5, training=True)
    out.sum().backward()
    kept = out.numpy() != 0
    per_channel = kept.reshape(*shape[:drawn], -1)
    assert (per_channel.all(-1) | ~per_channel.any(-1)).all()          # whole channels
    np.testing.assert_allclose(out.numpy()[kept], 2 * x[kept], rtol=1e-6)
    np.testing.assert_allclose(t.grad.numpy(), 2 * kept, rtol=1e-6)
    assert getattr(F, name)(t, 0.5, training=False) is t
    assert getattr(F, name)(t, 0.0, training=True) is t


def test_channel_dropout_errors():
    with pytest.raises(RuntimeError, match="Expected 2D or 3D input"):
        F.dropout1d(Tensor(_normal(2, 3, 4, 5)), training=True)
    with pytest.raises(RuntimeError, match="Expected 3D or 4D input"):
        F.dropout2d(Tensor(_normal(2, 3)), training=True)
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout3d(Tensor(_normal(2, 3, 2, 2, 2)), 1.5)


SIGNS = np.sign(RNG.standard_normal((4, 6))).astype(np.float32)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_margin_and_embedding_losses(reduction, check):
    x, y, z = _normal(4, 6), _normal(4, 6), _normal(4, 6)
    check(lambda a: _f(a).soft_margin_loss(a, _as(a, SIGNS), reduction=reduction), x)
    check(lambda a: _f(a).hinge_embedding_loss(a, _as(a, SIGNS), 0.5, reduction=reduction), x)
    check(lambda a, b: _f(a).margin_ranking_loss(a, b, _as(a, SIGNS), margin=0.3,
                                                 reduction=reduction), x, y)
    check(lambda a, b: _f(a).cosine_embedding_loss(a, b, _as(a, SIGNS[:, 0]), 0.1,
                                                   reduction=reduction), x, y)
    for swap in (False, True):
        check(lambda a, b, c, swap=swap: _f(a).triplet_margin_loss(
            a, b, c, margin=0.5, p=1.5, swap=swap, reduction=reduction), x, y, z)
    labels, weight = (SIGNS > 0).astype(np.float32), np.abs(_normal(6))
    check(lambda a: _f(a).multilabel_soft_margin_loss(a, _as(a, labels), weight=_as(a, weight),
                                                      reduction=reduction), x * 5)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_poisson_and_gaussian_nll(reduction, check):
    x, counts = _normal(4, 5), np.floor(np.abs(_normal(4, 5)) * 3).astype(np.float32)
    for full in (False, True):
        check(lambda a, full=full: _f(a).poisson_nll_loss(a, _as(a, counts), full=full,
                                                           reduction=reduction), x)
    check(lambda a: _f(a).poisson_nll_loss(a, _as(a, counts), log_input=False, eps=1e-3,
                                           reduction=reduction), np.abs(x) + 0.1)
    variance = np.abs(_normal(4, 5)) + 0.05
    variance[0, 0] = 1e-9                          # below eps: clamped, gradient as if not
    for var in (variance, variance[:, :1], variance[:, 0]):
        check(lambda a, b, v, full=var.ndim == 1: _f(a).gaussian_nll_loss(
            a, b, v, full=full, reduction=reduction), x, _normal(4, 5), var)
    check(lambda a, b: _f(a).gaussian_nll_loss(a, b, 0.5, reduction=reduction), x, _normal(4, 5))
    with pytest.raises(ValueError, match="incorrect size"):
        F.gaussian_nll_loss(Tensor(x), Tensor(x), Tensor(variance[:2]))
    with pytest.raises(ValueError, match="negative"):
        F.gaussian_nll_loss(Tensor(x), Tensor(x), Tensor(-variance))


@pytest.mark.usefixtures("backend")
def test_pdist_bilinear_lp_pools_local_response_norm_and_upsample(check):
    check(lambda t: _f(t).pdist(t), _normal(5, 3))
    check(lambda t: _f(t).pdist(t, p=1), _normal(4, 3))
    check(lambda a, b, w, c: _f(a).bilinear(a, b, w, c), _normal(2, 3, 4), _normal(2, 3, 5),
          _normal(6, 4, 5), _normal(6))
    x = np.abs(_normal(2, 3, 6, 5)) + 0.1
    check(lambda t: _f(t).lp_pool2d(t, 2, 2), x)
    check(lambda t: _f(t).lp_pool2d(t, 3.0, (3, 2), stride=1, ceil_mode=True), x)
    check(lambda t: _f(t).lp_pool1d(t, 2, 3, 2), x[0])
    check(lambda t: _f(t).lp_pool3d(t, 1.5, 2), x[None])
    for size, kwargs in [(3, {}), (4, {"alpha": 0.1, "beta": 0.5, "k": 2.0}), (1, {})]:
        check(lambda t, size=size, kwargs=kwargs: _f(t).local_response_norm(t, size, **kwargs),
              _normal(2, 5, 4, 3))
    check(lambda t: _f(t).local_response_norm(t, 2), _normal(2, 5, 4))
    z = _normal(1, 2, 3, 4)
    check(lambda t: _f(t).upsample_nearest(t, scale_factor=2), z)
    check(lambda t: _f(t).upsample_bilinear(t, size=(5, 7)), z)
    check(lambda t: _f(t).upsample(t, scale_factor=2, mode="bilinear", align_corners=False), z)


# torch.nn.functional's public functions portkit does not have yet: adding one removes it here
MISSING = set(str.split("""adaptive_max_pool1d_with_indices adaptive_max_pool2d_with_indices
adaptive_max_pool3d_with_indices affine_grid alpha_dropout celu_ conv_tbc ctc_loss elu_
embedding_bag feature_alpha_dropout fold fractional_max_pool2d fractional_max_pool2d_with_indices
fractional_max_pool3d fractional_max_pool3d_with_indices grouped_mm gumbel_softmax hardtanh_
leaky_relu_ linear_cross_entropy max_pool1d_with_indices max_pool2d_with_indices
max_pool3d_with_indices max_unpool1d max_unpool3d multi_head_attention_forward multi_margin_loss
multilabel_margin_loss native_channel_shuffle relu_ rrelu rrelu_ scaled_grouped_mm scaled_mm selu_
threshold_ triplet_margin_with_distance_loss unfold"""))
# torch's dispatch machinery, not functions of the API
NOT_API = {"assert_int_or_pair", "boolean_dispatch", "handle_torch_function",
           "has_torch_function", "has_torch_function_unary", "has_torch_function_variadic"}


def test_the_missing_torch_functions_are_the_listed_ones():
    theirs = {name for name in dir(TF) if not name.startswith("_") and name not in NOT_API
              and inspect.isroutine(getattr(TF, name))}
    assert sorted(theirs - set(F.__all__)) == sorted(MISSING)
