"""The training zoo's workloads (benchmarks/train_models.py) at tiny widths: portkit's first
loss is torch's from the same weights, and portkit.jit captures each training step and its
replays give the eager steps' losses and parameters."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="the workloads start from torch's weights")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import train_models as tm  # benchmarks/ is no package

# each workload compiles its forward, backward and optimizer kernels: 30-144 s per workload
# (455 s in all) on the 2-core host at load 9-19, the LSTM's and GPT's the longest
pytestmark = pytest.mark.slow
STEPS = 6       # portkit.jit captures up to 3 calls; the rest are replays


def _parameters(run: tm.Training) -> dict[str, np.ndarray]:
    return {name: t.numpy() for name, t in run.model.named_parameters()}


@pytest.mark.parametrize("name", tm.WORKLOADS)
def test_jit_replays_the_eager_steps_and_the_first_loss_is_torchs(name):
    shapes = tm.workload(name, "tiny")
    torch_run = tm.build_torch(name, shapes)
    eager = tm.build_portkit(name, shapes, source=torch_run.model)
    jitted = tm.build_portkit(name, shapes, jit=True, source=torch_run.model)
    expected = float(torch_run.step().item())

    eager_losses = [float(eager.step().item()) for _ in range(STEPS)]
    jit_losses = [float(jitted.step().item()) for _ in range(STEPS)]

    assert abs(eager_losses[0] - expected) <= 1e-4, (name, eager_losses[0], expected)
    assert jitted.jitted.plan is not None, f"{name}: portkit.jit never replayed the step"
    np.testing.assert_allclose(jit_losses, eager_losses, rtol=0, atol=1e-6, err_msg=name)
    ours, theirs = _parameters(jitted), _parameters(eager)
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        np.testing.assert_allclose(value, theirs[key], rtol=0, atol=1e-6,
                                   err_msg=f"{name}: parameter {key}")
