"""portkit.amp.GradScaler against torch.amp.GradScaler: the same scales, skipped steps and
parameters through a run with an overflowing iteration, and torch's errors for misuse."""
import numpy as np
import pytest
import torch

import portkit
from portkit import amp, optim
from portkit.tensor import Tensor

START = np.array([[0.5, -0.25, 1.0]], np.float32)
# the input of each iteration; an inf makes that iteration's gradient inf
INPUTS = [[1.0, 2.0, 3.0], [1.0, np.inf, 3.0], [0.5, 1.0, -1.0], [2.0, 1.0, 0.5],
          [1.0, 1.0, 1.0], [np.nan, 0.0, 1.0], [1.0, -2.0, 0.5]]


def _portkit_run() -> tuple[list[float], list[np.ndarray], list[bool]]:
    w = Tensor(START.copy(), requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    scaler = amp.GradScaler(init_scale=2.0 ** 10, growth_interval=2)
    scales, weights, stepped = [], [], []
    for values in INPUTS:
        with portkit.autocast("cpu", dtype=portkit.float16):
            loss = (w * Tensor(np.array([values], np.float32))).sum()
        opt.zero_grad()
        scaler.scale(loss).backward()
        before = w.numpy().copy()
        scaler.step(opt)
        stepped.append(not np.array_equal(w.numpy(), before))
        scaler.update()
        scales.append(scaler.get_scale())
        weights.append(w.numpy().copy())
    return scales, weights, stepped


def _torch_run() -> tuple[list[float], list[np.ndarray]]:
    w = torch.tensor(START.copy(), requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    scales, weights = [], []
    for values in INPUTS:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = (w * torch.tensor([values])).sum()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        weights.append(w.detach().numpy().copy())
    return scales, weights


def test_grad_scaler_skips_overflowing_steps_and_adapts_the_scale_as_torch():
    scales, weights, stepped = _portkit_run()
    torch_scales, torch_weights = _torch_run()
    # inf at iteration 1 and NaN at 5: skipped, the scale halves; two good ones double it
    assert stepped == [True, False, True, True, True, False, True]
    assert scales == torch_scales == [2.0 ** 10, 2.0 ** 9, 2.0 ** 9, 2.0 ** 10, 2.0 ** 10,
                                      2.0 ** 9, 2.0 ** 9]
    for i, (ours, theirs) in enumerate(zip(weights, torch_weights)):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, err_msg=f"weights after step {i}")
    assert np.array_equal(weights[1], weights[0]) and np.array_equal(weights[5], weights[4])


def test_grad_scaler_refuses_misuse_as_torch():
    w = Tensor(START.copy(), requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    scaler = amp.GradScaler()
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.unscale_(opt)
    scaler.scale((w * 2).sum()).backward()
    with pytest.raises(RuntimeError, match="no inf checks"):
        scaler.update()
    scaler.unscale_(opt)
    np.testing.assert_allclose(w.grad.numpy(), np.full((1, 3), 2.0, np.float32))
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.step(opt)
    scaler.update()
    assert scaler.state_dict()["scale"] == 2.0 ** 16 and scaler.state_dict()["_growth_tracker"] == 1
    half = Tensor(START.copy(), dtype=portkit.float16, requires_grad=True)
    half_opt = optim.SGD([half], lr=0.1)
    scaler.scale((half * 2).sum()).backward()
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.step(half_opt)
    off = amp.GradScaler(enabled=False)
    loss = (w * 2).sum()
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}
