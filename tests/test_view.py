"""portkit/view.py: a ShapeTracker built by any chain of movement ops indexes the same elements
as numpy does with the same ops (padding reads zero), for every element, symbolically."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from portkit.symbolic import Div, Mod, var
from portkit.view import ShapeTracker, View, strides_for
from tests.test_symbolic import evaluate


def apply(tracker: ShapeTracker, array: np.ndarray, move: tuple, data) -> tuple:
    """One movement op, drawn for the current shape, on both the tracker and the numpy array."""
    shape = array.shape
    kind = move
    if kind == "permute":
        order = tuple(data.draw(st.permutations(range(len(shape)))))
        return tracker.permute(order), array.transpose(order)
    if kind == "shrink":
        arg = tuple(sorted(data.draw(st.lists(st.integers(0, s), min_size=2, max_size=2)))
                    for s in shape)
        arg = tuple((b, e) if e > b else (0, s) for (b, e), s in zip(arg, shape))
        return tracker.shrink(arg), array[tuple(slice(b, e) for b, e in arg)]
    if kind == "pad":
        arg = tuple(tuple(data.draw(st.lists(st.integers(0, 2), min_size=2, max_size=2)))
                    for _ in shape)
        return tracker.pad(arg), np.pad(array, arg)
    if kind == "flip":
        axes = tuple(a for a in range(len(shape)) if data.draw(st.booleans()))
        return tracker.flip(axes), np.flip(array, axes)
    if kind == "expand":
        ones = [a for a, s in enumerate(shape) if s == 1]
        new = tuple(data.draw(st.integers(1, 3)) if a in ones else s for a, s in enumerate(shape))
        return tracker.expand(new), np.broadcast_to(array, new)
    size = array.size      # reshape: to any factorisation of the size into 1-3 dims
    first = data.draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
    rest = size // first
    second = data.draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
    new = data.draw(st.sampled_from([(size,), (first, rest), (first, second, rest // second)]))
    return tracker.reshape(new), array.reshape(new)


def read(tracker: ShapeTracker, base: np.ndarray) -> np.ndarray:
    """Every element through the tracker's symbolic index, as codegen would compute it."""
    shape = tracker.shape
    idx = [var(f"i{k}", 0, s - 1) for k, s in enumerate(shape)]
    flat, conds = tracker.index(idx)
    out = np.zeros(shape, base.dtype)
    for point in itertools.product(*(range(s) for s in shape)):
        env = {f"i{k}": p for k, p in enumerate(point)}
        if all(c.lo <= evaluate(c.expr, env) < c.hi for c in conds):
            out[point] = base[evaluate(flat, env)]
    return out


def moved(shape: list[int], moves: list[str], data) -> tuple[np.ndarray, ShapeTracker,
                                                                np.ndarray]:
    """The source 1..n (0 only where padding reads) in `shape`, and a tracker and numpy's
    array after `moves` (stopping at an empty shape)."""
    base = np.arange(1, np.prod(shape) + 1).reshape(shape)
    tracker, array = ShapeTracker.contiguous(tuple(shape)), base
    for move in moves:
        if 0 in array.shape:
            break
        tracker, array = apply(tracker, array, move, data)
    return base, tracker, array


def movement_chains(test):
    """`test(shape, moves, data)` run on 150 random shapes and chains of movement ops."""
    return settings(max_examples=150, deadline=None)(given(
        st.lists(st.integers(1, 4), min_size=1, max_size=3),
        st.lists(st.sampled_from(["permute", "shrink", "pad", "flip", "expand", "reshape"]),
                 max_size=5),
        st.data())(test))


@movement_chains
def test_any_chain_of_movement_ops_indexes_like_numpy(shape, moves, data):
    base, tracker, array = moved(shape, moves, data)
    base = base.reshape(-1)
    assert tracker.shape == array.shape
    np.testing.assert_array_equal(read(tracker, base), array)


def test_views_stay_single_when_strides_can_say_it():
    contiguous = View.contiguous((2, 3, 4))
    assert contiguous.strides == strides_for((2, 3, 4)) == (12, 4, 1)
    assert contiguous.reshape((6, 4)) == View.contiguous((6, 4))
    assert contiguous.permute((2, 0, 1)).reshape((4, 6)).strides == (1, 4)   # dims 0, 1 chain
    assert contiguous.permute((1, 0, 2)).reshape((6, 4)) is None    # needs a second view
    tracker = ShapeTracker.contiguous((2, 3, 4)).permute((1, 0, 2)).reshape((6, 4))
    assert len(tracker.views) == 2 and not tracker.is_contiguous
    padded = View.contiguous((3,)).pad(((1, 1),))
    assert padded.shape == (5,) and padded.mask == ((1, 4),) and padded.offset == -1


@movement_chains
def test_split_index_reads_what_the_flat_index_reads(shape, moves, data):
    base, tracker, _ = moved(shape, moves, data)
    if len(tracker.views) > 1 or 0 in tracker.shape:
        return
    view = tracker.views[0]
    idx = [var(f"i{k}", 0, s - 1) for k, s in enumerate(view.shape)]
    split = view.split(idx, tuple(shape))
    if split is None:
        return
    flat, conds = view.index(idx)
    for point in itertools.product(*(range(s) for s in view.shape)):
        env = {f"i{k}": p for k, p in enumerate(point)}
        if all(c.lo <= evaluate(c.expr, env) < c.hi for c in conds):
            position = tuple(evaluate(i, env) for i in split)
            assert base[position] == base.reshape(-1)[evaluate(flat, env)], (point, position)


def test_a_padded_view_splits_into_one_shifted_index_per_axis():
    padded = View.contiguous((1, 72, 56, 56)).pad(((0, 0), (0, 0), (1, 1), (1, 1)))
    idx = [var(f"i{k}", 0, s - 1) for k, s in enumerate(padded.shape)]
    split = padded.split(idx, (1, 72, 56, 56))
    assert split is not None
    assert [evaluate(i, {"i0": 0, "i1": 5, "i2": 1, "i3": 1}) for i in split] == [0, 5, 0, 0]
    assert all(not isinstance(atom, (Div, Mod)) for i in split for atom, _ in i.terms)
    # a view that merges two axes into one is no movement of each axis
    merged = View((6,), (1,), 0, None)
    assert merged.split([var("i", 0, 5)], (2, 3)) is None
