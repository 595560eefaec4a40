"""nll_loss (class weights, ignore_index, N-d targets), cross_entropy through it, and the
binary cross entropies, against PyTorch CPU on every backend (forward and backward)."""
import numpy as np
import pytest

from portkit.nn import functional as F
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
TF = torch.nn.functional
pytestmark = pytest.mark.usefixtures("backend")

RNG = np.random.default_rng(11)


def _pick(t):
    return F if isinstance(t, Tensor) else TF


def _as(t, array):
    return Tensor(array) if isinstance(t, Tensor) else torch.tensor(array)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_and_cross_entropy_with_weights_and_ignore_index(reduction, check):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    target = np.array([[0, 1, 2, 1], [2, 2, -100, 0]], np.int32)
    weight = np.array([1.0, 2.0, 0.5], np.float32)
    check(lambda t: _pick(t).nll_loss(t.log_softmax(1), _as(t, target).long()
                                      if not isinstance(t, Tensor) else _as(t, target),
                                      weight=_as(t, weight), reduction=reduction), x)
    check(lambda t: _pick(t).cross_entropy(t, _as(t, target).long()
                                           if not isinstance(t, Tensor) else _as(t, target),
                                           reduction=reduction, ignore_index=-100), x)
    flat = RNG.standard_normal((5, 3)).astype(np.float32)
    labels = np.array([0, 2, 1, 1, 7], np.int32)
    check(lambda t: _pick(t).cross_entropy(t, _as(t, labels).long() if not isinstance(
        t, Tensor) else _as(t, labels), ignore_index=7, reduction=reduction), flat)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_cross_entropies(reduction, check):
    p = RNG.random((3, 4)).astype(np.float32) * 0.98 + 0.01
    y = (RNG.random((3, 4)) > 0.5).astype(np.float32)
    w = RNG.random((4,)).astype(np.float32)
    check(lambda t: _pick(t).binary_cross_entropy(t, _as(t, y), weight=_as(t, w),
                                                  reduction=reduction), p)
    logits = (RNG.standard_normal((3, 4)) * 30).astype(np.float32)
    pos = np.array([1.0, 2.0, 3.0, 0.5], np.float32)
    check(lambda t: _pick(t).binary_cross_entropy_with_logits(
        t, _as(t, y), reduction=reduction, pos_weight=_as(t, pos)), logits, atol=1e-4)
