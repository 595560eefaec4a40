"""What calling a Module does around its forward: the garbage collector is paused while the
graph is built."""
import gc

import numpy as np
import pytest

from portkit import Tensor, nn


class Unrolled(nn.Module):
    """A recurrence of many small ops: thousands of graph objects, as an unrolled RNN's."""

    def __init__(self) -> None:
        self.weight = Tensor(np.full((4,), 0.5, np.float32), requires_grad=True)

    def forward(self, x: Tensor) -> Tensor:
        for _ in range(100):
            x = (x * self.weight).tanh() + 1
        return x


def test_forward_runs_no_garbage_collection():
    # the objects a forward allocates live until backward: a collection there walks every
    # live object and frees nothing
    collections: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])
    model, x = Unrolled(), Tensor(np.zeros(4, np.float32))
    gc.callbacks.append(count)
    try:
        model(x)
    finally:
        gc.callbacks.remove(count)
    assert collections == []
    assert gc.isenabled()


def test_forward_that_raises_leaves_the_collector_on():
    class Failing(nn.Module):
        def forward(self, x: Tensor) -> Tensor:
            raise ValueError("bad input")
    with pytest.raises(ValueError, match="bad input"):
        Failing()(Tensor(np.zeros(2, np.float32)))
    assert gc.isenabled()
