"""Invalid input raises a typed error where it is written (issue 11 item 9), with PyTorch's error
types, instead of a wrong answer or a failure at realize."""
import threading

import numpy as np
import pytest

import portkit as pk
from portkit import nn, optim
from portkit.nn import functional as F
from portkit.tensor import Tensor

pytestmark = pytest.mark.usefixtures("backend")

X = np.arange(6, dtype=np.float32).reshape(3, 2)

CASES = {
    "list index past the rows": (IndexError, lambda: Tensor(X)[[0, 5]]),
    "list index wrapping twice": (IndexError, lambda: Tensor(X)[[-4]]),
    "float index": (IndexError, lambda: Tensor(X)[1.7]),
    "int too large for int32": (OverflowError, lambda: Tensor([2 ** 40, 1])),
    "int too large for int8": (OverflowError, lambda: Tensor([300], dtype=pk.int8)),
    "negative size": (RuntimeError, lambda: Tensor.ones(-4)),
    "negative size in full": (RuntimeError, lambda: Tensor.full((-3,), 2)),
    "negative size in zeros": (RuntimeError, lambda: Tensor.zeros(-1, 3)),
    "float size": (TypeError, lambda: Tensor.zeros(2.7, 3)),
    "unsqueeze past the dims": (IndexError, lambda: Tensor(X).unsqueeze(10)),
    "unsqueeze(77) on 3-d": (IndexError, lambda: Tensor.ones(2, 2, 2).unsqueeze(77)),
    "flatten past the dims": (IndexError, lambda: Tensor(X).flatten(3)),
    "cat past the dims": (IndexError, lambda: pk.cat([Tensor(X), Tensor(X)], dim=5)),
    "sum past the dims": (IndexError, lambda: Tensor(X).sum(5)),
    "chunk(0)": (RuntimeError, lambda: Tensor(X).chunk(0)),
    "split(0)": (RuntimeError, lambda: Tensor(X).split(0)),
    "arange step 0": (RuntimeError, lambda: Tensor.arange(0, 5, 0)),
    "arange past int32": (OverflowError, lambda: Tensor.arange(2 ** 31, 2 ** 31 + 3)),
    "eye(-3, 3)": (RuntimeError, lambda: Tensor.eye(-3, 3)),
    "clip(None, None)": (RuntimeError, lambda: Tensor(X).clip(None, None)),
    "one_hot(-1)": (RuntimeError, lambda: F.one_hot(Tensor([-1]), 3)),
    "one_hot(-2)": (ValueError, lambda: F.one_hot(Tensor([1]), -2)),
    "float <<": (TypeError, lambda: Tensor([1.0]) << 1),
    "conv2d stride 0": (RuntimeError, lambda: F.conv2d(Tensor.ones(1, 1, 3, 3),
                                                       Tensor.ones(1, 1, 1, 1), stride=0)),
    "max_pool2d stride 0": (RuntimeError, lambda: F.max_pool2d(Tensor.ones(1, 1, 4, 4), 2, 0)),
    "dropout p=1.5": (ValueError, lambda: F.dropout(Tensor(X), 1.5, training=True)),
    "SGD lr=-1": (ValueError, lambda: optim.SGD([Tensor(X, requires_grad=True)], lr=-1)),
    "Adam beta 1": (ValueError, lambda: optim.Adam([Tensor(X, requires_grad=True)],
                                                   betas=(1.0, 0.9))),
    "cross_entropy class 9 of 3": (IndexError, lambda: F.cross_entropy(
        Tensor(X.T.copy()), Tensor([9, 0]))),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_invalid_input_raises_a_typed_error_at_the_call(case):
    error, call = CASES[case]
    with pytest.raises(error):
        call()


def test_backward_twice_raises():
    x = Tensor(X, requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="second time"):
        loss.backward()
    (x * x).sum().backward()            # a new graph is fine, and accumulates
    np.testing.assert_allclose(x.grad.numpy(), 4 * X)


def test_backward_through_a_freed_intermediate_raises():
    # the freed node sits inside the new graph: its gradient used to vanish without a word
    x = Tensor(X, requires_grad=True)
    y = x * 2
    (y * 3).sum().backward()
    with pytest.raises(RuntimeError, match="freed"):
        (y * 4).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full_like(X, 6))


def test_dropout_p_1_zeroes_everything():
    assert F.dropout(Tensor(X), 1.0, training=True).numpy().tolist() == np.zeros_like(X).tolist()


def test_no_grad_is_per_thread():
    inside, done = threading.Event(), threading.Event()

    def hold_no_grad():
        with pk.no_grad():
            inside.set()
            done.wait(10)

    thread = threading.Thread(target=hold_no_grad)
    thread.start()
    try:
        assert inside.wait(10)
        x = Tensor(X, requires_grad=True)
        y = (x * 2).sum()               # recorded here, though the other thread is in no_grad
        assert y.requires_grad
        y.backward()
        np.testing.assert_allclose(x.grad.numpy(), np.full_like(X, 2))
    finally:
        done.set()
        thread.join()
    with pk.no_grad():
        assert not (Tensor(X, requires_grad=True) * 2).requires_grad


def test_nn_layers_still_build():
    assert nn.Linear(2, 3)(Tensor(X)).shape == (3, 3)
