"""Register blocks of a packed matmul whose M has no divisor near 8 (ViT's 197 tokens, 51 =
3 x 17): 8-row blocks and a remainder block shifted back to end at M (portkit/codegen/pack.py
`_rows`), which stores only the rows the block before it did not; checked on the blocking, in
the interpreter and on the CPU against numpy, with staged and fused A operands, batches,
epilogues and edges along n and k."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import runtime, schedule
from portkit.codegen import pack
from portkit.codegen.lower import lower
from portkit.reference_backends.interpreter.capabilities import capabilities
from portkit.tensor import Tensor

LOOPS = dataclasses.replace(capabilities(), threads_are_loops=True)
RNG = np.random.default_rng(0)


def _floats(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _close(actual: np.ndarray, expected: np.ndarray, k: int) -> None:
    """Within the gamma_k bound of a float32 dot product of length k (with margin)."""
    bound = 2 * k * np.finfo(np.float32).eps * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=bound)


@pytest.mark.parametrize("m", [197, 51, 29])
def test_an_m_without_a_divisor_near_8_takes_8_row_blocks(m):
    x, w = Tensor(_floats(m, 300), device="interpreter"), Tensor(_floats(300, 64),
                                                                  device="interpreter")
    item, = schedule.create_schedule([(x @ w).lazy])
    _, packing = pack.find(item.root, item.inputs, LOOPS)
    # before: the most rows up to 8 that divide m, 1 for 197 and 29, 3 for 51
    assert packing.rows == 8 and -(-m // 8) % packing.blocks == 0


def test_an_m_with_a_divisor_over_half_of_8_keeps_whole_blocks():
    x, w = Tensor(_floats(50, 300), device="interpreter"), Tensor(_floats(300, 64),
                                                                   device="interpreter")
    item, = schedule.create_schedule([(x @ w).lazy])
    assert pack.find(item.root, item.inputs, LOOPS)[1].rows == 5


# (m, k, n): one depth block and several, an edge along n, a fused (staged) A
@pytest.mark.parametrize("m, k, n, fused", [(29, 300, 33, False), (37, 64, 40, False),
                                            (29, 300, 40, True), (23, 64, 48, True)])
def test_remainder_blocks_compute_the_matmul_in_the_interpreter(m, k, n, fused):
    a, b = _floats(m, k), _floats(k, n)
    x, w = Tensor(a, device="interpreter"), Tensor(b, device="interpreter")
    item, = schedule.create_schedule([((x.relu() if fused else x) @ w).lazy])
    assert pack.find(item.root, item.inputs, LOOPS)[1].rows == 8
    kernel = lower(item.root, item.inputs, LOOPS)
    by_size = {a.size: a, b.size: b}
    out, *_ = runtime.get("interpreter").run(kernel, np.zeros(m * n, np.float32),
                                             *(by_size[node.size] for node in item.inputs))
    left = np.maximum(a, 0) if fused else a
    _close(out.reshape(m, n), left.astype(np.float64) @ b, k)


@pytest.mark.parametrize("shape", [(1, 197, 768, 96), (3, 197, 64, 197), (2, 50, 300, 72)])
def test_remainder_blocks_on_the_cpu_match_numpy(shape):
    batch, m, k, n = shape
    a, b = _floats(batch, m, k), _floats(batch, k, n)
    expected = a.astype(np.float64) @ b
    _close((Tensor(a) @ Tensor(b)).numpy(), expected, k)
    # a staged A (relu) and an epilogue (x 2 + 1) over the same blocks
    out = ((Tensor(a).relu() @ Tensor(b)) * 2 + 1).numpy()
    _close(out, (np.maximum(a, 0).astype(np.float64) @ b) * 2 + 1, 2 * k)
