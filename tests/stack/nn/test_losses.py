"""nll_loss (class weights, ignore_index, N-d targets), cross_entropy through it, and the
binary cross entropies, against PyTorch CPU on every backend (forward and backward)."""
import numpy as np
import pytest

import portkit as pk
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


def test_cross_entropy_copies_a_checked_target_to_the_host_once(monkeypatch):
    logits, target = Tensor(np.zeros((4, 3), np.float32)), Tensor([0, 1, 2, 1])
    target.realize()
    copies = []
    read = Tensor.numpy
    monkeypatch.setattr(Tensor, "numpy", lambda t: copies.append(t) or read(t))
    for _ in range(3):
        loss = F.cross_entropy(logits, target)
    assert [t for t in copies if t is target] == [target]
    np.testing.assert_allclose(read(loss), np.log(3), rtol=1e-6)


def test_cross_entropy_checks_every_new_target_and_each_class_count():
    logits = Tensor(np.zeros((2, 3), np.float32))
    good = Tensor([0, 2])
    F.cross_entropy(logits, good)
    F.cross_entropy(logits, Tensor([1, 1]))
    with pytest.raises(IndexError, match="class 3 is out of bounds for 3 classes"):
        F.cross_entropy(logits, Tensor([0, 3]))     # a new buffer after good ones: checked
    with pytest.raises(IndexError, match="class 2 is out of bounds for 2 classes"):
        F.cross_entropy(Tensor(np.zeros((2, 2), np.float32)), good)   # checked for 3 only
    with pytest.raises(IndexError, match="class -1"):
        F.nll_loss(logits, Tensor([-1, 0]), ignore_index=-100)
    F.nll_loss(logits, Tensor([-1, 0]), ignore_index=-1)


def test_cross_entropy_checks_borrowed_host_memory_every_call(monkeypatch):
    monkeypatch.setenv("PORTKIT_DEVICE", "cpu")     # where from_dlpack borrows host memory
    classes = np.array([0, 1], np.int32)
    target = pk.from_dlpack(classes)        # shares the array's memory on the CPU
    assert not target.lazy.buffer.owned
    logits = Tensor(np.zeros((2, 3), np.float32))
    F.cross_entropy(logits, target)
    classes[1] = 7
    with pytest.raises(IndexError, match="class 7 is out of bounds"):
        F.cross_entropy(logits, target)
