"""Numbers as data: a Python number in the graph reaches its kernel as a scalar argument (VAR), so
a loop whose numbers change compiles its kernels once."""
import math

import numpy as np
import pytest

from portkit import nn, optim, runtime, schedule
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.tensor import Tensor


def test_a_changing_multiplier_compiles_one_kernel(backend):
    rt = runtime.get(backend)
    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    (x * 0.5).numpy()
    builds = rt.builds
    for i in range(1, 6):
        np.testing.assert_array_equal((x * float(i)).numpy(),
                                      np.arange(8, dtype=np.float32) * np.float32(i))
    assert rt.builds == builds


def test_the_kernel_takes_the_number_as_a_float32_var():
    x = Tensor(np.ones(4, np.float32))
    kernel, = (x * 0.37).schedule()
    var = [n for n in kernel.nodes if n.op is Op.VAR]
    assert [n.dtype for n in var] == [dtypes.float32]
    assert not any(n.op is Op.CONST and n.arg == 0.37 for n in kernel.nodes)


@pytest.mark.parametrize(("dtype", "value"), [
    (np.float16, 0.1), (np.float16, 70000.0), (np.int8, -7), (np.uint8, 200), (np.int32, 2**30)])
def test_a_narrow_number_gives_what_the_constant_gave(dtype, value, monkeypatch):
    start = np.arange(4).astype(dtype)
    passed = (Tensor(start) * value).numpy()
    monkeypatch.setattr(schedule, "MAX_SCALARS", 0)
    np.testing.assert_array_equal(passed, (Tensor(start) * value).numpy())


def test_constants_past_the_limit_stay_code_and_stay_right():
    x = Tensor(np.ones(3, np.float32))
    out = x
    for k in range(schedule.MAX_SCALARS + 4):
        out = out + float(k)
    kernel, = out.schedule()
    assert len(kernel.vars) == schedule.MAX_SCALARS
    np.testing.assert_array_equal(out.numpy(), np.full(3, 1 + sum(range(
        schedule.MAX_SCALARS + 4)), np.float32))


def _adam_run(steps: int, cosine: bool, seed: int = 0) -> tuple[list[int], list[np.ndarray]]:
    """Builds per step of a small Adam loop, and the weights after each step."""
    rng = np.random.default_rng(seed)
    layers = [nn.Linear(6, 8), nn.Linear(8, 3)]
    for layer in layers:
        for p in layer.parameters():
            p.assign(Tensor(rng.standard_normal(p.shape).astype(np.float32))).realize()
    opt = optim.Adam([p for layer in layers for p in layer.parameters()], lr=1e-2)
    x = Tensor(rng.standard_normal((5, 6)).astype(np.float32))
    y = Tensor(np.array([0, 1, 2, 1, 0], np.int32))
    rt = runtime.get()
    builds, weights = [], []
    for step in range(steps):
        if cosine:
            opt.lr = 1e-2 * 0.5 * (1 + math.cos(math.pi * step / steps))
        before = rt.builds
        opt.zero_grad()
        layers[1](layers[0](x).relu()).cross_entropy(y).backward()
        opt.step()
        weights.append(layers[0].weight.numpy())
        builds.append(rt.builds - before)
    return builds, weights


def test_adam_with_a_cosine_learning_rate_compiles_nothing_after_step_two():
    builds, _ = _adam_run(100, cosine=True)
    assert sum(builds[2:]) == 0, builds


def test_scalar_arguments_give_the_constant_folded_results(monkeypatch):
    _, as_arguments = _adam_run(4, cosine=True, seed=1)
    monkeypatch.setattr(schedule, "MAX_SCALARS", 0)     # every number written into the code
    runtime.clear()
    builds, as_code = _adam_run(4, cosine=True, seed=1)
    assert sum(builds[2:]) > 0      # the folded loop does compile new kernels
    for folded, passed in zip(as_code, as_arguments):
        np.testing.assert_array_equal(folded, passed)

