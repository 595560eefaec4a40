"""Indexing (portkit/tensor/indexing.py): basic, advanced and several integer-tensor indices."""
import numpy as np
import pytest

from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")


def test_indexing(check, data):
    x = data(4, 5, 6)
    for index in [(1,), (slice(1, 3),), (Ellipsis, 2), (slice(None, None, 2), None, 3),
                  (slice(1, None, 3), -1)]:
        check(lambda t, i=index: t[i], x)
    for index in [(slice(None, None, -1), slice(1, None, 3)), (-1, slice(4, 0, -2), 0)]:
        np.testing.assert_array_equal(Tensor(x)[index].numpy(), x[index])  # torch: no step < 0
    idx = np.array([[0, 3], [-1, 2]], np.int32)
    check(lambda t: t[:, Tensor(idx)] if isinstance(t, Tensor)
          else t[:, torch.tensor(idx, dtype=torch.long)], x)


@pytest.mark.parametrize("index", [
    ("i", "j"), (slice(None), "i", "j"), ("i", slice(None), "j"), ("i", 0, "j"),
    (slice(None), "j", 2), (Ellipsis, "k", "j"), ("i", None, "j"), ([1, 2], slice(1, 4), [0, 1]),
], ids=str)
def test_several_integer_tensor_indices_broadcast_like_numpy(index, check, data):
    x = data(4, 5, 6)
    arrays = {"i": np.array([[0, 3], [-1, 2]], np.int32), "j": np.array([1, -2], np.int32),
              "k": np.array([[0], [4]], np.int32)}
    ours = tuple(Tensor(arrays[i]) if isinstance(i, str) else i for i in index)
    want = x[tuple(arrays[i] if isinstance(i, str) else i for i in index)]
    np.testing.assert_array_equal(Tensor(x)[ours].numpy(), want)
    theirs = tuple(torch.tensor(arrays[i], dtype=torch.long) if isinstance(i, str)
                   else torch.tensor(i) if isinstance(i, list) else i for i in index)
    check(lambda t: t[ours] if isinstance(t, Tensor) else t[theirs], x)
