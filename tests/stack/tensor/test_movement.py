"""Movement ops, cat and stack (portkit/tensor/movement.py)."""
import numpy as np
import pytest

import portkit.tensor as pt
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")


def test_movement(check, data):
    x = data(2, 3, 4)
    check(lambda t: t.reshape(6, 4), x)
    check(lambda t: t.permute(2, 0, 1), x)
    check(lambda t: t.transpose(0, 2), x)
    check(lambda t: t.flatten(1), x)
    check(lambda t: t.unsqueeze(1).squeeze(1), x)
    check(lambda t: t[:, None].expand(2, 5, 3, 4), x)
    check(lambda t: t.flip(1), x)
    check(lambda t: t.repeat(2, 1, 3), x)
    check(lambda t: t.pad(((1, 0), (0, 2), (1, 1))) if isinstance(t, Tensor)
          else torch.nn.functional.pad(t, (1, 1, 0, 2, 1, 0)), x)
    check(lambda t: t.pad((1, 1, 0, 2)) if isinstance(t, Tensor)
          else torch.nn.functional.pad(t, (1, 1, 0, 2)), x)
    check(lambda t: t.pad((2, -1), 7.0) if isinstance(t, Tensor)
          else torch.nn.functional.pad(t, (2, -1), value=7.0), x)
    check(lambda t: t.T, data(3, 5))


def test_cat_stack_split_chunk(check, data):
    a, b = data(2, 3), data(4, 3)
    check(lambda x, y: pt.cat([x, y]) if isinstance(x, Tensor) else torch.cat([x, y]), a, b)
    check(lambda x, y: pt.stack([x, y[:2]], 1) if isinstance(x, Tensor)
          else torch.stack([x, y[:2]], 1), a, b)
    parts = Tensor(b).split([1, 3])
    assert [p.shape for p in parts] == [(1, 3), (3, 3)]
    assert [c.numpy().tolist() for c in Tensor(b).chunk(2)] == [c.tolist() for c in
                                                               np.array_split(b, 2)]
