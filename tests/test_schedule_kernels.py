"""portkit.schedule.kernels: exactly the kernels a realize launches, in the same order."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from portkit import backends, graph, runtime, schedule
from portkit.schedule import fusion, runner
from portkit.tensor import Tensor

SMALL = "interpreter.max-buffers-4"


@pytest.fixture(scope="module", autouse=True)
def small_device():
    """The interpreter, declaring 4 buffers per kernel: wide sums must split."""
    device = backends.load("interpreter")
    caps = dataclasses.replace(device.capabilities, max_buffers=4)
    try:
        runtime.register(runtime.Runtime(SMALL, dataclasses.replace(device, capabilities=caps)))
    except ValueError:      # registered by an earlier run in this process
        pass


def _launched(monkeypatch, outs: list[Tensor]) -> list[runtime.Compiled]:
    found: list[runtime.Compiled] = []
    # A graph whose structure an earlier test in this process realized twice replays as one
    # device batch (run_batch), without a launch to record: an empty table of replays makes
    # this realize schedule and launch. launch_again may still hand over to launch
    # (PORTKIT_CHECK): both count.
    monkeypatch.setattr(runner, "_replays", runtime.LRU(runtime.kernel_cache_size()))
    inside: list = []
    for method in ("launch", "launch_again"):
        monkeypatch.setattr(runtime.Runtime, method, _recording(getattr(runtime.Runtime, method),
                                                                found, inside))
    schedule.realize([t.lazy for t in outs])
    return found


def _recording(launch, found: list, inside: list):
    # `inside`: launch_again may hand over to launch (PORTKIT_CHECK): one launch, counted once
    def record(self, compiled, *args, **kwargs):
        if not inside:
            found.append(compiled)
        inside.append(True)
        try:
            return launch(self, compiled, *args, **kwargs)
        finally:
            inside.pop()
    return record


def _rand(device: str, *shape: int, seed: int = 0) -> Tensor:
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return Tensor(values, device=device)


GRAPHS = {
    "elementwise-chain": lambda d: ((_rand(d, 5, 7) * 2 + 1).exp() - _rand(d, 5, 7, seed=1),),
    "reduce": lambda d: ((_rand(d, 6, 9) * 3).sum(1).sqrt(),),
    "matmul": lambda d: (_rand(d, 8, 5) @ _rand(d, 5, 3),),
    "split-reduce": lambda d: (_rand(d, 1 << 17).sum(),),
    "two-outputs": lambda d: ((x := _rand(d, 4, 4)).amax(0), (x * x).sum()),
    "wide-sum": lambda d: (sum((_rand(d, 3, seed=k) for k in range(1, 9)), _rand(d, 3)),),
}


@pytest.mark.parametrize("device", ["cpu", "interpreter", SMALL])
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_kernels_are_the_kernels_realize_launches(monkeypatch, device, graph):
    outs = GRAPHS[graph](device)
    planned = schedule.kernels([t.lazy for t in outs])
    launched = _launched(monkeypatch, outs)
    rt = runtime.get(device)
    assert planned, "every graph here runs at least one kernel"
    # the runtime compiles a kernel once, by its JSON: the same object means the same kernel
    assert [id(rt.compile(k)) for k in planned] == [id(c) for c in launched]
    assert [c.kernel.name for c in launched] == [k.name for k in planned]


def test_a_wide_sum_splits_to_fit_the_device():
    out = sum((_rand(SMALL, 3, seed=k) for k in range(1, 9)), _rand(SMALL, 3))
    planned = schedule.kernels([out.lazy])
    assert len(planned) > 1
    assert all(len(k.params) <= 4 for k in planned)


def _walks(monkeypatch, pieces: int) -> int:
    """The graph walks create_schedule makes for a sum of `pieces` buffers on SMALL, which
    splits it one piece per round (4 buffers per kernel: the sum so far, a piece, the output)."""
    out = sum((_rand(SMALL, 3, seed=k) for k in range(1, pieces)), _rand(SMALL, 3))
    calls: list[int] = []
    walk = graph.walk
    with monkeypatch.context() as patched:
        patched.setattr(graph, "walk", lambda *args, **kw: calls.append(1) or walk(*args, **kw))
        items = schedule.create_schedule([out.lazy], *fusion.device_limits([out.lazy]))
    assert len(items) == pieces - 2 and all(len(it.inputs) <= 3 for it in items)
    return len(calls)


def test_the_buffer_limit_walks_only_the_kernels_a_round_changed(monkeypatch):
    """Walking every kernel in every round of the buffer limit cost O(rounds x graph): an
    LSTM's output, a cat of 200 steps on a device of 64 buffers, took 139 rounds and 88 s."""
    short, long = _walks(monkeypatch, 32), _walks(monkeypatch, 64)
    assert long - short <= 3 * 32, (short, long)
