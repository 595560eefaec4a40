"""Random programs of Tensor ops against PyTorch: hypothesis draws a shape, a dtype and a chain of
ops (elementwise, reductions, movement, indexing), runs it in portkit and in torch, and compares.

A few hundred examples a run on cpu and the interpreter; opencl and webgpu in the slow run. The
run's seed is printed (FUZZ_SEED=N in the environment replays it) and a failure prints its
program and hypothesis's reproduction blob.
"""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from portkit import backends
from portkit.tensor import Tensor

# name -> (arity, the op on a portkit Tensor or a torch tensor: both spell it the same)
UNARY = {
    "neg": lambda x: -x, "abs": lambda x: x.abs(), "relu": lambda x: x.relu(),
    "exp": lambda x: (x * 0.25).exp(), "tanh": lambda x: x.tanh(),
    "sigmoid": lambda x: x.sigmoid(), "square": lambda x: x * x,
    "sqrt_abs": lambda x: x.abs().sqrt(), "floor": lambda x: x.floor(),
    "sum_last": lambda x: x.sum(-1, keepdim=True), "amax_first": lambda x: x.amax(0, keepdim=True),
    "mean_all": lambda x: x.mean().reshape(1), "cumsum": lambda x: x.cumsum(-1),
    "softmax": lambda x: x.softmax(-1), "flip": lambda x: x.flip(0),
    "transpose": lambda x: x.transpose(0, -1), "pad": lambda x: _pad(x),
    "clamp": lambda x: x.clamp(-0.5, 0.5), "where": lambda x: _where(x > 0, x, x * 0.1),
    "index": lambda x: x[[0, -1]], "slice": lambda x: x[..., ::2],
}
BINARY = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "maximum": lambda x, y: x.maximum(y), "div": lambda x, y: x / (y.abs() + 1),
    "lt": lambda x, y: (x < y).float(),
}
CHECKED = [name for name, reason in backends.available().items()
           if reason is None and name in ("cpu", "interpreter")]
SLOW = [name for name, reason in backends.available().items()
        if reason is None and name in ("opencl", "webgpu")]


def _where(cond, a, b):
    return a.where(cond, b)          # torch's Tensor.where, in both libraries


def _pad(x):
    if isinstance(x, torch.Tensor):
        return torch.nn.functional.pad(x, (1, 2))
    return x.pad(((0, 0),) * (x.ndim - 1) + ((1, 2),))


@st.composite
def programs(draw):
    """A (shape, data seed, ops) program: 1 to 4 ops applied in turn, a binary op's second
    operand a fresh array of the running shape."""
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    names = draw(st.lists(st.sampled_from(sorted(UNARY) + sorted(BINARY)), min_size=1,
                          max_size=4))
    return shape, draw(st.integers(0, 2**31 - 1)), names


def _run(shape, seed, names, device):
    rng = np.random.default_rng(seed)
    start = rng.standard_normal(shape).astype(np.float32)
    mine, theirs = Tensor(start, device=device), torch.tensor(start)
    for name in names:
        if name in BINARY:
            other = rng.standard_normal(tuple(theirs.shape)).astype(np.float32)
            mine = BINARY[name](mine, Tensor(other, device=device))
            theirs = BINARY[name](theirs, torch.tensor(other))
        else:
            mine, theirs = UNARY[name](mine), UNARY[name](theirs)
    got = mine.numpy()
    want = theirs.numpy()
    assert got.shape == want.shape, (names, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{names} on {shape}")


SEED = int(os.environ.get("FUZZ_SEED") or random.SystemRandom().randrange(2**32))


@pytest.fixture(scope="module", autouse=True)
def _say_the_seed(request):
    with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
        print(f"\nfuzz against torch: seed {SEED} (FUZZ_SEED={SEED} replays this run)")


FUZZ = settings(max_examples=150, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("device", CHECKED)
@FUZZ
@seed(SEED)
@given(programs())
def test_random_programs_agree_with_torch(device, program):
    _run(*program, device)


@pytest.mark.slow
@pytest.mark.parametrize("device", SLOW)
@settings(max_examples=60, deadline=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow])
@seed(SEED)
@given(programs())
def test_random_programs_agree_with_torch_on_gpu_class_backends(device, program):
    _run(*program, device)
