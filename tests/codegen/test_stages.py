"""Staged vectors (portkit/codegen/stages.py): a matrix-vector product x @ W.T whose x is more
than a load evaluates x once per workgroup into a LOCAL, on a device whose threads are loops,
and its partial sums along k are then runs of lanes as a plain matvec's are; the results match
numpy."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import schedule
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.codegen import lanes
from portkit.codegen.lower import lower
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor
from portkit.tensor import functional as F

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
WIDTHS = {dtypes.float32: 8}
RNG = np.random.default_rng(0)


def _kernel(rows: int, k: int, n: int, vector=F.hardswish):
    x, b, w = (Tensor(np.zeros(s, np.float32), device="interpreter")
               for s in ((rows, k), (k,), (n, k)))
    item, = schedule.create_schedule([(vector(x + b) @ w.transpose(0, 1)).lazy])
    return lower(item.root, item.inputs, LOOPS)


def _loads_by_loop(kernel) -> dict[int, list[int]]:
    """Per PARAM buffer, the trip counts of the innermost constant loop around each of its
    loads (0 where it is outside every loop or the loop's bounds are not constants)."""
    nodes = kernel.nodes
    found: dict[int, list[int]] = {}
    loops: list[int] = []
    for i, node in enumerate(nodes):
        if node.op is Op.RANGE:
            loops.append(i)
        elif node.op is Op.END and nodes[node.src[0]].op is Op.RANGE:
            loops.pop()
        elif node.op is Op.LOAD and nodes[node.src[0]].op is Op.PARAM:
            trips = 0
            if loops:
                first, end = (nodes[s] for s in nodes[loops[-1]].src)
                if first.op is Op.CONST and end.op is Op.CONST:
                    trips = end.arg - first.arg
            found.setdefault(nodes[node.src[0]].arg, []).append(trips)
    return found


def test_a_costly_vector_is_evaluated_once_per_group_then_summed_in_lanes():
    kernel = _kernel(1, 256, 512)
    loads = _loads_by_loop(kernel)
    # x and b (PARAMs 1, 2) are loaded once each, in a loop over k that stores into a LOCAL,
    # not once per chunk of k inside each block of W's rows
    assert loads[1] == [256] and loads[2] == [256]
    locals_ = [i for i, node in enumerate(kernel.nodes) if node.op is Op.LOCAL]
    assert len(locals_) == 1 and kernel.nodes[locals_[0]].arg == 256
    runs = lanes.find(kernel, WIDTHS)
    assert runs and all(run.paired is not None for run in runs)
    assert {kernel.nodes[run.paired[0]].op for run in runs} == {Op.LOCAL}
    assert {kernel.nodes[run.buffer].arg for run in runs} == {3}           # W's rows


def test_a_vector_that_differs_per_output_row_is_not_staged():
    # x has 3 rows: each output row has its own vector, which one LOCAL cannot hold
    kernel = _kernel(3, 256, 512)
    assert not any(node.op is Op.LOCAL for node in kernel.nodes)


def test_a_factor_that_loads_nothing_is_not_staged():
    # x * 2 summed along rows: the 2 is the same for every output, but a scalar already
    x = Tensor(np.zeros((64, 256), np.float32), device="interpreter")
    item, = schedule.create_schedule([(x * 2.0).sum(-1).lazy])
    kernel = lower(item.root, item.inputs, LOOPS)
    assert not any(node.op is Op.LOCAL for node in kernel.nodes)


@pytest.mark.parametrize("rows, k, n, vector", [
    (1, 1024, 1000, F.hardswish), (1, 576, 1024, F.hardswish), (1, 768, 2304, F.gelu),
    (1, 100, 37, F.relu6), (3, 256, 64, F.hardswish)])
def test_matches_numpy(rows, k, n, vector):
    x, b, w = (RNG.standard_normal(s).astype(np.float32) for s in ((rows, k), (k,), (n, k)))
    tx, tb, tw = (Tensor(a, device="cpu") for a in (x, b, w))
    actual = (vector(tx + tb) @ tw.transpose(0, 1)).numpy()
    h = vector(Tensor(x + b, device="cpu")).numpy().astype(np.float64)
    expected = h @ w.T.astype(np.float64)
    scale = np.abs(h) @ np.abs(w.T.astype(np.float64))
    worst = np.max(np.abs(actual - expected) / scale)
    assert worst <= 1e-5, f"largest error {worst:.2e} of the terms' magnitudes"
