"""A packed contraction whose N ends part way into its last panel (a conv's 240 output channels
in 32-wide panels, a 1x1 conv's 14 x 14 positions, a matmul's 1000 columns): the panel copies
the columns before N, whose positions cost no modulo and no gate, and zeros the rest."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from portkit import schedule
from portkit.abi.ops import Op
from portkit.codegen import pack, tiles
from portkit.codegen.lower import lower
from portkit.tensor import Tensor
from tests.codegen.test_conv_tiles import loop_bodies
from tests.codegen.test_pack_pointwise import LOOPS, TF, _data

# (x's shape, w's shape, conv padding): a 3x3 conv's n is its 40 channels, a 1x1 conv's its
# 14 x 14 positions; else a matmul x @ w, or x @ w.T where w's rows lie 4 KiB apart (its copy
# walks the panel's columns outermost)
CASES = [((1, 16, 12, 12), (40, 16, 3, 3), 1), ((1, 64, 14, 14), (40, 64, 1, 1), 0),
         ((64, 300), (300, 100), None), ((20, 1024), (40, 1024), None)]


def _ours(x: np.ndarray, w: np.ndarray, padding: int | None) -> Tensor:
    px, pw = Tensor(x, device="cpu"), Tensor(w, device="cpu")
    if padding is not None:
        return px.conv2d(pw, padding=padding)
    return px @ (pw.T if x.shape[1] == w.shape[1] else pw)


def _theirs(x: np.ndarray, w: np.ndarray, padding: int | None) -> np.ndarray:
    tx, tw = torch.from_numpy(x).double(), torch.from_numpy(w).double()
    if padding is not None:
        return TF.conv2d(tx, tw, padding=padding).numpy()
    return (tx @ (tw.T if x.shape[1] == w.shape[1] else tw)).numpy()


@pytest.mark.parametrize("x, w, padding", CASES)
def test_a_partial_panel_is_copied_without_modulo_or_gate(x, w, padding):
    item = schedule.create_schedule([_ours(_data(*x), _data(*w, seed=1), padding).lazy])[-1]
    found = pack.find(item.root, item.inputs, LOOPS)
    assert found is not None, "the contraction is not packed"
    contraction, packing = found
    assert contraction.sizes[1] % packing.width != 0, "N fills its panels"
    kernel = lower(item.root, item.inputs, LOOPS)
    nodes = kernel.nodes

    def copies(body) -> bool:
        ops = [n.op for n in body]
        return Op.MULACC not in ops and any(
            n.op is Op.LOAD and nodes[n.src[0]].op is Op.PARAM for n in body) and any(
            n.op is Op.STORE and nodes[n.src[0]].op is Op.LOCAL for n in body)
    bodies = [body for body in loop_bodies(kernel) if copies(body)]
    assert bodies, "no loop copies B into its panel"
    for body in bodies:
        costly = [n.op.name for n in body if n.op in (Op.MOD, Op.IDIV, Op.CMPLT, Op.WHERE)]
        assert not costly, f"the panel copy works out {costly} per element"


@pytest.mark.parametrize("x, w, padding", CASES)
def test_a_partial_panel_matches_torch(x, w, padding):
    xs, ws = _data(*x), _data(*w, seed=1)
    expected = _theirs(xs, ws, padding)
    depth = x[1] * int(np.prod(w[2:]))
    bound = 4 * depth * np.finfo(np.float32).eps * (np.abs(expected).max() + 1)
    np.testing.assert_allclose(_ours(xs, ws, padding).numpy(), expected, rtol=1e-5, atol=bound)


@pytest.mark.parametrize("x, w, padding", CASES[2:])
def test_a_partial_panel_stores_without_modulo(x, w, padding):
    # the last panel's columns past N are not stored (a gate): those stored lie before N, so
    # their positions need no modulo by N (with one per output, the LSTM's head, 560 x 256
    # by 2000 x 256, ran 1.1x slower)
    item = schedule.create_schedule([_ours(_data(*x), _data(*w, seed=1), padding).lazy])[-1]
    nodes = lower(item.root, item.inputs, LOOPS).nodes
    stores = [body for body in loop_bodies(lower(item.root, item.inputs, LOOPS)) if any(
        n.op is Op.STORE and nodes[n.src[0]].op is Op.PARAM for n in body)]
    assert stores, "no loop stores the output"
    n = w[1] if x[1] == w[0] else w[0]
    for body in stores:
        by_n = [node for node in body if node.op is Op.MOD and nodes[node.src[1]].arg == n]
        assert not by_n, "a modulo by N per output"

def test_a_sum_of_a_stored_product_is_no_contraction(monkeypatch):
    # a buffer computed as a product (a SiLU, x * sigmoid(x), stored for two readers) and summed
    # by the next kernel: packing took the product behind the buffer for a matmul's and walked
    # the whole graph that computed it (EfficientNet-B0's first call 4 s -> 41-75 s)
    from portkit import runtime
    rng = np.random.default_rng(0)
    a, b = (Tensor(rng.standard_normal((64, 1, 64), dtype=np.float32)) for _ in range(2))
    product = a * b.reshape(1, 64, 64)
    total = product.sum(axis=2)
    analysed = []
    real = tiles.load_steps
    monkeypatch.setattr(tiles, "load_steps", lambda node, *args: analysed.append(node) or real(
        node, *args))
    caps = runtime.get("cpu").capabilities
    assert pack.find(total.lazy, [product.lazy], caps) is None
    assert not set(map(id, analysed)) & set(map(id, product.lazy.src)), analysed
