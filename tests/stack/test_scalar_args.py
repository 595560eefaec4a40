"""Numbers as data: a Python number in the graph reaches its kernel as a scalar argument (VAR), so
a loop whose numbers change compiles its kernels once."""
import math
import sys
import threading

import numpy as np
import pytest

from portkit import nn, optim, runtime, schedule
from portkit.abi import dtypes
from portkit.abi.ops import Op
from portkit.schedule import fusion, keys
from portkit.tensor import Tensor
from portkit.tensor.core import realize


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
    monkeypatch.setattr(keys, "MAX_SCALARS", 0)
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
    monkeypatch.setattr(keys, "MAX_SCALARS", 0)     # every number written into the code
    runtime.clear()
    builds, as_code = _adam_run(4, cosine=True, seed=1)
    assert sum(builds[2:]) > 0      # the folded loop does compile new kernels
    for folded, passed in zip(as_code, as_arguments):
        np.testing.assert_array_equal(folded, passed)


def _fails(*args, **kwargs):
    raise AssertionError("scheduled again: the replay was not used")


def test_a_graph_of_a_seen_structure_replays_without_scheduling(monkeypatch):
    rng = np.random.default_rng(3)

    def run(scale: float):
        a = rng.standard_normal((64, 200)).astype(np.float32)
        b = rng.standard_normal((200,)).astype(np.float32)
        out = ((Tensor(a) * scale + Tensor(b)).relu().sum(axis=1), Tensor(a).max())
        realize(*out)
        got = [t.numpy() for t in out]
        expected = [np.maximum(a * np.float32(scale) + b, 0).sum(1), a.max()]
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-4)
        assert got[1] == expected[1]

    run(0.5)
    monkeypatch.setattr(fusion, "create_schedule", _fails)
    run(-1.25)
    run(3.0)


def test_a_split_reduce_replays_with_new_data(monkeypatch):
    def total(n: int) -> None:
        x = np.random.default_rng(n).random(1 << 17).astype(np.float32)
        got = (Tensor(x) * 2.0).sum().numpy()
        np.testing.assert_allclose(got, (x.astype(np.float64) * 2).sum(), rtol=1e-5)

    total(1)
    monkeypatch.setattr(fusion, "create_schedule", _fails)
    total(2)


def test_numbers_written_as_code_are_not_replayed_with_old_values():
    x = Tensor(np.ones(3, np.float32)).realize()
    for shift in (0.0, 100.0):
        out = x
        for k in range(schedule.MAX_SCALARS + 2):
            out = out + (float(k) + shift)
        expected = 1 + sum(float(k) + shift for k in range(schedule.MAX_SCALARS + 2))
        np.testing.assert_array_equal(out.numpy(), np.full(3, expected, np.float32))


def test_a_first_realize_compiles_its_kernels_ahead_on_a_pool(monkeypatch):
    threads = []     # (thread, kernels) of each batch the cpu compiler is handed
    build_now = runtime.Runtime._build_batch

    def build_and_note(self, kernels):
        threads.append((threading.get_ident(), len(kernels)))
        return build_now(self, kernels)

    monkeypatch.setattr(runtime.Runtime, "_build_batch", build_and_note)
    runtime.clear()
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    outs = [x.sum(axis=0), x.amax(axis=1), (x * 2).exp()]
    realize(*outs)
    realize(*outs)
    assert sum(count for _, count in threads) == 3
    assert threading.get_ident() not in {thread for thread, _ in threads}
    np.testing.assert_allclose(outs[0].numpy(), np.arange(12).reshape(3, 4).sum(0))
    np.testing.assert_allclose(outs[2].numpy(), np.exp(np.arange(12).reshape(3, 4) * 2.0),
                               rtol=1e-6)


def test_equal_numbers_share_a_var_and_a_new_coincidence_stays_right():
    x = Tensor(np.arange(4, dtype=np.float32)).realize()
    kernel, = (x * 2.0 + 2.0).schedule()
    assert len(kernel.vars) == 1
    for a, b in ((2.0, 3.0), (2.0, 2.0), (5.0, 3.0), (-0.0, 0.0)):
        np.testing.assert_array_equal((x * a + b).numpy(),
                                      np.arange(4, dtype=np.float32) * np.float32(a) + b)


@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.10 recursion uses the C stack")
def test_a_chain_of_6600_lazy_ops_realizes_without_recursion_error():
    x = Tensor(np.ones(4, np.float32)).realize()
    expected = np.float32(1)
    for _ in range(6600):
        x = x * 1.0001 + 0.5
        expected = np.float32(expected * np.float32(1.0001)) + np.float32(0.5)
    np.testing.assert_array_equal(x.numpy(), np.full(4, expected, np.float32))


def test_a_split_reduce_padding_never_takes_a_number_of_the_graph():
    # The padding identity of a split max (-inf) equals the first scale and shares its VAR;
    # the second realize must not replay that kernel with the new scale as its padding.
    x = -np.random.default_rng(0).random((1 << 17) + 3).astype(np.float32) - 1
    for scale in (-np.inf, 1.0, 2.0):
        got = (Tensor(x) * scale).max().numpy()
        assert got == (x * np.float32(scale)).max(), scale


def test_a_graph_with_numbers_as_code_replays_while_they_keep_their_values(monkeypatch):
    x = Tensor(np.ones(3, np.float32)).realize()

    def run(shift: float) -> np.ndarray:
        out = x
        for k in range(schedule.MAX_SCALARS + 2):
            out = out + (float(k) + shift)
        return out.numpy()

    first = run(0.0)
    moved = run(100.0)       # other values as code: scheduled again, not replayed wrongly
    np.testing.assert_array_equal(moved, first + 100 * (schedule.MAX_SCALARS + 2))
    monkeypatch.setattr(fusion, "create_schedule", _fails)
    np.testing.assert_array_equal(run(0.0), first)      # (a training step's backward kernels)
    np.testing.assert_array_equal(run(100.0), moved)


def test_a_replay_of_numbers_as_code_looks_its_graph_up_once(monkeypatch):
    # the graph's key (20,000 entries in a training step) is hashed and compared once
    from portkit.schedule import runner
    looked: list[object] = []

    class Counting(runtime.LRU):
        def get(self, key, default=None):
            looked.append(key)
            return super().get(key, default)
    monkeypatch.setattr(runner, "_replays", Counting(8))
    x = Tensor(np.ones(3, np.float32)).realize()

    def run() -> np.ndarray:
        out = x
        for k in range(schedule.MAX_SCALARS + 2):
            out = out + float(k)
        return out.numpy()
    first = run()
    looked.clear()
    monkeypatch.setattr(fusion, "create_schedule", _fails)
    np.testing.assert_array_equal(run(), first)
    assert len(looked) == 1
