"""A workgroup per output (portkit/codegen/groups.py) for reduces of few long rows on a device
whose threads are lanes and that states its compute units; and matmul tiles that fill those units
(codegen/tiles.py `choose`)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import schedule
from portkit.abi.interpreter import run as interpret
from portkit.abi.ops import Op
from portkit.codegen import tiles
from portkit.codegen.lower import lower
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

GPU = dataclasses.replace(capabilities(), compute_units=132)   # an H200's multiprocessors
RNG = np.random.default_rng(0)


def _run(fn, *arrays, caps=GPU):
    tensors = [Tensor(a, device="interpreter").realize() for a in arrays]
    item, = schedule.create_schedule([fn(*tensors).lazy])
    kernel = lower(item.root, item.inputs, caps)
    by_id = {id(t.lazy.base): a for t, a in zip(tensors, arrays)}
    inputs = [np.ascontiguousarray(by_id[id(x.base)]).ravel() for x in item.inputs]
    out = np.zeros(int(np.prod(item.root.shape)), item.root.dtype.np)
    interpret(kernel, [out, *inputs])
    return kernel, out.reshape(item.root.shape)


CASES = [
    ("mean of 128 rows of 768", lambda x: x.mean(-1), (1, 128, 768), np.float32),
    ("max of rows of 1,000, then an epilogue", lambda x: x.amax(-1) * 2 + 1, (3, 1000),
     np.float32),
    ("sum over two axes", lambda x: x.sum((1, 2)), (5, 30, 40), np.float32),
    ("float16 rows", lambda x: x.sum(-1), (4, 600), np.float16),
    ("one row of 768", lambda x: (x * x).sum(-1), (1, 1, 768), np.float32),
    ("12 rows of 129", lambda x: x.exp().sum(-1), (12, 129), np.float32),
]


@pytest.mark.parametrize("name, fn, shape, dtype", CASES, ids=[c[0] for c in CASES])
def test_a_reduce_of_few_long_rows_takes_a_group_per_output(name, fn, shape, dtype):
    x = RNG.standard_normal(shape).astype(dtype)
    kernel, got = _run(fn, x)
    ops = [n.op for n in kernel.nodes]
    outputs = int(np.prod(got.shape))
    assert kernel.grid == (outputs, 1, 1) and kernel.block[0] >= 32
    assert Op.BARRIER in ops and Op.LOCAL in ops
    want = fn(Tensor(x.astype(np.float32), device="cpu")).numpy()
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3 if dtype == np.float16
                               else 2e-6, atol=1e-5)


@pytest.mark.parametrize("change", [{"compute_units": None}, {"threads_are_loops": True}])
def test_devices_that_state_no_units_or_run_threads_as_loops_keep_a_thread_per_output(change):
    kernel, _ = _run(lambda x: x.mean(-1), RNG.standard_normal((128, 768)).astype(np.float32),
                       caps=dataclasses.replace(GPU, **change))
    assert Op.BARRIER not in [n.op for n in kernel.nodes]


def test_many_outputs_and_short_rows_keep_a_thread_per_output():
    for shape in ((GPU.compute_units * 128, 300), (64, 40)):
        kernel, _ = _run(lambda x: x.sum(-1), np.ones(shape, np.float32))
        assert Op.BARRIER not in [n.op for n in kernel.nodes], shape


def test_an_epilogue_reading_another_input_is_computed_once_per_output():
    x = RNG.standard_normal((1, 128, 768)).astype(np.float32)
    w = RNG.standard_normal((1, 128)).astype(np.float32)
    kernel, got = _run(lambda a, b: a.sum(-1) * b + 3, x, w)
    assert kernel.grid == (128, 1, 1)
    np.testing.assert_allclose(got, x.sum(-1) * w + 3, rtol=1e-5, atol=1e-4)


def _tiling(m: int, k: int, n: int, caps) -> tiles.Tiling | None:
    a = Tensor(np.ones((m, k), np.float32), device="interpreter")
    b = Tensor(np.ones((k, n), np.float32), device="interpreter")
    item, = schedule.create_schedule([(a @ b).lazy])
    found = tiles.match(item.root, item.inputs)
    return tiles.choose(found, caps)


def test_a_matmul_of_few_default_tiles_takes_tiles_that_fill_the_units():
    # BERT's 3072-to-768 projection: the default 32 x 64 tile makes 48 groups
    default = _tiling(128, 3072, 768, dataclasses.replace(GPU, compute_units=None))
    assert default == tiles.CANDIDATES[0]
    chosen = _tiling(128, 3072, 768, GPU)
    groups = (128 // chosen.block_m) * (768 // chosen.block_n)
    assert groups >= tiles.FILL * GPU.compute_units > (128 // 32) * (768 // 64)
    # a matmul the default already fills keeps it
    assert _tiling(2048, 256, 2048, GPU) == tiles.CANDIDATES[0]
