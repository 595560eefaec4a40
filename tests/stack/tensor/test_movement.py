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


BAD_SHAPES = {
    "expand(-2, 3)": lambda t: t.zeros(1, 3).expand(-2, 3),
    "expand(-1, 3) with -1 for a new dim": lambda t: t.zeros(3).expand(-1, 3),
    "expand to fewer dims": lambda t: t.zeros(1, 3).expand(3),
    "expand a size-2 dim": lambda t: t.zeros(2, 3).expand(4, 3),
    "reshape(-1, 0) of 0 elements": lambda t: t.zeros(0, 3).reshape(-1, 0),
    "reshape(0, -1) of 0 elements": lambda t: t.zeros(0, 3).reshape(0, -1),
    "reshape(-2, 3)": lambda t: t.zeros(6).reshape(-2, 3),
    "reshape(-2, -3)": lambda t: t.zeros(6).reshape(-2, -3),
    "reshape(-1, -1)": lambda t: t.zeros(6).reshape(-1, -1),
    "view(-1, 0) of 6 elements": lambda t: t.zeros(6).view(-1, 0),
    "reshape(-1, 4) of 6 elements": lambda t: t.zeros(6).reshape(-1, 4),
    "repeat(-1, 2)": lambda t: t.zeros(2, 3).repeat(-1, 2),
    "repeat(2) of 2-d": lambda t: t.zeros(2, 3).repeat(2),
    "unflatten(0, (-1, -2))": lambda t: t.zeros(6).unflatten(0, (-1, -2)),
}


@pytest.mark.parametrize("case", BAD_SHAPES)
def test_a_bad_shape_raises_as_in_pytorch(case):
    with pytest.raises(RuntimeError):
        BAD_SHAPES[case](torch)
    with pytest.raises(pt.ShapeError, match="shape|expand|repeat"):
        BAD_SHAPES[case](Tensor)


GOOD_SHAPES = {
    "expand(2, -1)": lambda t: t.zeros(1, 3).expand(2, -1),
    "expand(0, 3)": lambda t: t.zeros(1, 3).expand(0, 3),
    "expand(2, 1, -1)": lambda t: t.zeros(1, 3).expand(2, 1, -1),
    "reshape(-1) of 0 elements": lambda t: t.zeros(0, 3).reshape(-1),
    "reshape(-1, 5) of 0 elements": lambda t: t.zeros(2, 0).reshape(-1, 5),
    "reshape(3, -1)": lambda t: t.ones(2, 3).reshape(3, -1),
    "repeat(2, 0, 1)": lambda t: t.ones(2, 3).repeat(2, 0, 1),
}


@pytest.mark.parametrize("case", GOOD_SHAPES)
def test_edge_shapes_give_pytorchs_shape_and_values(case):
    want = GOOD_SHAPES[case](torch)
    got = GOOD_SHAPES[case](Tensor)
    assert got.shape == tuple(want.shape)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
