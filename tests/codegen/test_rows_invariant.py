"""An elementwise kernel on a device whose threads are loops walks each row in an inner loop
(codegen/rows.py); the loads that stay put along the row (a BatchNorm gradient's per-channel
statistics) are made before that loop, not again per column."""
from __future__ import annotations

import numpy as np
import torch

from portkit import runtime, schedule
from portkit.abi.ops import Op
from portkit.codegen.lower import lower
from portkit.nn import functional as F
from portkit.tensor import Tensor
from tests.codegen.test_rows_merged import _innermost


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _batch_norm_grad(x, g, weight):
    px = Tensor(x, device="cpu", requires_grad=True)
    y = F.batch_norm(px, None, None, Tensor(weight, device="cpu"), None, training=True)
    (y * Tensor(g, device="cpu")).sum().backward()
    return px


def test_a_batch_norm_gradient_loads_its_statistics_outside_the_row_loop():
    x, g, weight = _data(4, 16, 8, 16), _data(4, 16, 8, 16, seed=1), _data(16, seed=2)
    px = _batch_norm_grad(x, g, weight)
    item = schedule.create_schedule([px.grad.lazy])[-1]
    kernel = lower(item.root, item.inputs, runtime.get("cpu").capabilities)
    per_channel = {k + 1 for k, node in enumerate(item.inputs) if node.shape[-1] == 1}
    assert per_channel, "no per-channel input: the gradient's last kernel changed shape"
    inner = [kernel.nodes[n.src[0]].arg for _, body in _innermost(kernel) for n in body
             if n.op is Op.LOAD]
    assert inner and not per_channel & set(inner), (per_channel, inner)
    tx = torch.from_numpy(x).double().requires_grad_()
    ty = torch.nn.functional.batch_norm(tx, None, None, torch.from_numpy(weight).double(),
                                        None, training=True)
    (ty * torch.from_numpy(g).double()).sum().backward()
    np.testing.assert_allclose(px.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
