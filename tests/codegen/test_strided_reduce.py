"""A reduce over a strided axis whose outputs are contiguous only within part of an output axis
(codegen/plan.py `split`): a detection head's max over classes of a channel-major map permuted to
(pixels x anchors, classes) runs its lanes along the pixels, one output per lane, loads at
consecutive addresses; contiguous reduces keep their lowering; values against numpy."""
from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pytest

from portkit import schedule
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.codegen.plan import split
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)


def _head(scores: np.ndarray, anchors: int) -> Tensor:
    """(1, anchors * classes, H, W) -> (1, H * W * anchors, classes), its sigmoid's max."""
    _, channels, height, width = scores.shape
    classes = channels // anchors
    x = Tensor(scores, device="cpu").reshape(1, anchors, classes, height, width)
    return x.permute(0, 3, 4, 1, 2).reshape(1, height * width * anchors, classes)


def _expected(scores: np.ndarray, anchors: int) -> np.ndarray:
    _, channels, height, width = scores.shape
    x = scores.astype(np.float64).reshape(1, anchors, channels // anchors, height, width)
    return x.transpose(0, 3, 4, 1, 2).reshape(1, height * width * anchors, -1)


def _reduce_loads(kernel, trips: int) -> list[int]:
    """The LOAD nodes inside the loops of `trips` iterations."""
    nodes, loads, open_loops = kernel.nodes, [], []
    for i, node in enumerate(nodes):
        if node.op is Op.RANGE:
            end = nodes[node.src[1]]
            open_loops.append(end.op is Op.CONST and end.arg == trips)
        elif node.op is Op.END and nodes[node.src[0]].op is Op.RANGE:
            open_loops.pop()
        elif node.op is Op.LOAD and any(open_loops):
            loads.append(i)
    return loads


def _longest_run(kernel, loads: list[int]) -> int:
    """The most loads at base + 0, base + 1, ... (one base node) among `loads`."""
    nodes = kernel.nodes
    offsets: dict[int, set[int]] = defaultdict(set)
    for load in loads:
        index = nodes[nodes[load].src[1]]
        constants = [s for s in index.src if nodes[s].op is Op.CONST]
        if index.op is Op.ADD and len(constants) == 1:
            base, = (s for s in index.src if s != constants[0])
            offsets[base].add(nodes[constants[0]].arg)
        else:
            offsets[nodes[load].src[1]].add(0)
    longest = 0
    for found in offsets.values():
        run = 0
        while run in found:
            run += 1
        longest = max(longest, run)
    return longest


def test_a_max_over_strided_classes_runs_lanes_along_the_pixels():
    scores = np.random.default_rng(0).standard_normal((1, 3 * 8, 8, 8)).astype(np.float32)
    out = _head(scores, 3).sigmoid().amax(-1)
    item, = schedule.create_schedule([out.lazy])
    kernel = lower(item.root, item.inputs, LOOPS)
    assert sum(n.op is Op.ACC for n in kernel.nodes) >= 16, "one accumulator per tile"
    loads = _reduce_loads(kernel, 8)
    assert _longest_run(kernel, loads) >= 16, "the reduce loop's loads are not consecutive"
    assert not [n for n in loads if kernel.nodes[kernel.nodes[n].src[1]].op in
                (Op.IDIV, Op.MOD)], "a division per load"


@pytest.mark.parametrize("reduce", ["sum", "softmax"])
def test_a_contiguous_reduce_is_not_split(reduce):
    x = Tensor(np.ones((4, 64, 80), np.float32), device="cpu")
    out = x.sum(-1) if reduce == "sum" else x.softmax(-1)
    for item in schedule.create_schedule([out.lazy]):
        assert split(item.root, item.inputs) is item.root


@pytest.mark.parametrize(("anchors", "classes", "height", "width"),
                         [(3, 80, 8, 8), (3, 5, 5, 7), (2, 9, 3, 3), (3, 7, 16, 4)])
def test_strided_reduces_match_numpy(anchors, classes, height, width):
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((1, anchors * classes, height, width)).astype(np.float32)
    scores[0, classes + 1, 1, 2] = np.nan          # anchor 1's class 1 at one pixel
    terms = _expected(scores, anchors)
    expected = 1 / (1 + np.exp(-terms))
    ours = _head(scores, anchors).sigmoid().amax(-1).numpy()
    nan = np.isnan(expected).any(-1)
    assert nan.sum() == 1
    np.testing.assert_array_equal(np.isnan(ours), nan, err_msg="NaN not propagated by max")
    np.testing.assert_allclose(ours[~nan], expected.max(-1)[~nan], rtol=1e-5)
    finite = np.nan_to_num(scores)
    np.testing.assert_allclose(_head(finite, anchors).mean(-1).numpy(),
                               _expected(finite, anchors).mean(-1), rtol=1e-4, atol=1e-5)
