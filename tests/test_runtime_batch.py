"""Batches (ABI 0.7, `Device.batch`): a recorded list of launches replayed in one submission
gives bit for bit what the launches give one by one, a launch sees the writes of the launches
before it, and replaced buffers and scalars take effect; the replay engine runs plans through
them."""
from __future__ import annotations

import numpy as np
import pytest

import portkit
from portkit import runtime
from portkit.abi import KernelBuilder, Op, dtypes
from portkit.abi.backend import Launch, OneByOne
from portkit.tensor import Tensor

BACKENDS = ["interpreter", "cpu", "opencl", "webgpu"]
N = 8


def _axpb(name: str):
    """out[i] = x[i] * a + b, with a float32 and b an int32 scalar argument."""
    k = KernelBuilder(name)
    out, x = k.param(dtypes.float32), k.param(dtypes.float32)
    i = k.alu(Op.ADD, k.alu(Op.MUL, k.special("group", 0), k.const(4)), k.special("local", 0))
    a, b = k.var("a", dtypes.float32), k.cast(k.var("b"), dtypes.float32)
    k.store(out, i, k.alu(Op.ADD, k.alu(Op.MUL, k.load(x, i), a), b))
    return k.build(grid=(N // 4, 1, 1), block=(4, 1, 1))


def _buffers(rt, count: int) -> list:
    return [rt.alloc(dtypes.float32, N).copyin(np.zeros(N, np.float32)) for _ in range(count)]


@pytest.mark.parametrize("device", BACKENDS)
def test_a_batch_gives_what_its_launches_give_one_by_one(device):
    rt = runtime.get(device)
    first, second = rt.compile(_axpb("batch_first")), rt.compile(_axpb("batch_second"))
    x = np.linspace(-3, 3, N, dtype=np.float32)
    scale = first.words((1.5, 0))

    def launches(buffers: list) -> list:
        a, b, c, _ = buffers    # b = a * 1.5 + 0, then c = b * -2 + 7 (b written just before)
        return [(first, [b.handle, a.handle], scale),
                (second, [c.handle, b.handle], second.words((-2.0, 7)))]

    expected = _buffers(rt, 4)
    expected[0].copyin(x)
    for compiled, handles, words in launches(expected):
        rt.run_program(compiled, handles, words)
    got = _buffers(rt, 4)
    got[0].copyin(x)
    batch = rt.batch(launches(got))
    rt.run_batch(batch, [], [], [first.kernel, second.kernel])
    assert got[2].numpy().tobytes() == expected[2].numpy().tobytes()
    np.testing.assert_array_equal(got[2].numpy(), (x * 1.5) * -2 + 7)
    # a read-back between replays, then the second launch's output and words replaced
    got[0].copyin(x + 1)
    rt.run_batch(batch, [(1, 0, got[3].handle)], [(1, second.words((3.0, -1)))],
                 [first.kernel, second.kernel])
    np.testing.assert_array_equal(got[3].numpy(), ((x + 1) * 1.5) * 3 - 1)
    np.testing.assert_array_equal(got[2].numpy(), (x * 1.5) * -2 + 7)   # left as it was


def test_the_default_batch_launches_one_by_one_with_its_replacements():
    rt = runtime.get("interpreter")
    compiled = rt.compile(_axpb("batch_default"))
    x, y, out = _buffers(rt, 3)
    x.copyin(np.arange(N, dtype=np.float32))
    y.copyin(np.full(N, 2, np.float32))
    batch = OneByOne([Launch(compiled.program, [out.handle, x.handle], compiled.words((2.0, 1)),
                             compiled.kernel.grid, compiled.kernel.block)])
    assert batch(wait=True) is not None
    np.testing.assert_array_equal(out.numpy(), np.arange(N) * 2 + 1)
    assert batch([(0, 1, y.handle)], [(0, compiled.words((0.5, -4)))]) is None
    np.testing.assert_array_equal(out.numpy(), np.full(N, 2 * 0.5 - 4))


@pytest.mark.parametrize("device", BACKENDS)
def test_a_jitted_chain_replays_through_one_batch(device, monkeypatch):
    monkeypatch.delenv("PORTKIT_DEBUG", raising=False)
    monkeypatch.delenv("PORTKIT_CHECK", raising=False)
    made = []
    original = runtime.Runtime.batch

    def counting(self, launches):
        made.append(len(launches))
        return original(self, launches)

    monkeypatch.setattr(runtime.Runtime, "batch", counting)

    @portkit.jit
    def step(x, s):
        y = (x * s + 1.0).realize()      # one kernel's output read by the next
        return (y * y - x).realize() + s

    values = [np.linspace(-1, 1, 16, dtype=np.float32) * k for k in range(1, 6)]
    results = [step(Tensor(v, device=device), 0.5 * k).numpy() for k, v in enumerate(values)]
    assert made == [3]      # one batch of the plan's three launches, made at the first replay
    for k, (v, got) in enumerate(zip(values, results)):
        s = np.float32(0.5 * k)
        y = v * s + np.float32(1)
        np.testing.assert_array_equal(got, (y * y - v) + s)


def test_a_profiled_replay_records_one_span_per_batch(tmp_path):
    @portkit.jit
    def step(x):
        return ((x + 1.0).realize() * 2.0).realize() - x

    x = Tensor(np.arange(8, dtype=np.float32), device="cpu")
    for _ in range(3):
        step(x)
    with portkit.profile() as found:
        got = step(x).numpy()
    spans = [e for e in found.events if e["cat"] == "kernel"]
    assert [s["name"] for s in spans] == ["batch of 3 launches"]
    assert len(spans[0]["args"]["kernels"]) == 3 and len(spans[0]["args"]["grid"]) == 3
    np.testing.assert_array_equal(got, (np.arange(8) + 1) * 2 - np.arange(8))


def test_a_realize_seen_before_replays_through_a_batch(monkeypatch):
    made = []
    original = runtime.Runtime.batch
    monkeypatch.setattr(runtime.Runtime, "batch",
                        lambda self, launches: made.append(len(launches)) or original(self,
                                                                                      launches))
    values = [np.full(7, k + 1, np.float32) for k in range(4)]
    got = [(Tensor(v, device="cpu") * 3.0 - 1.0).sqrt().numpy() for v in values]
    assert made == [1]      # the second realize of the structure made it, the later reused it
    for v, g in zip(values, got):
        np.testing.assert_array_equal(g, np.sqrt(v * np.float32(3) - np.float32(1)))


@pytest.mark.parametrize("device", ["cpu", "opencl"])
def test_the_timer_times_a_launch_inside_a_batch(device):
    # out[0] += 1: a warm-up replay and 3 timed ones of a batch of 4 launches add 16
    k = KernelBuilder("batch_count")
    out = k.param(dtypes.int32)
    k.store(out, k.const(0), k.alu(Op.ADD, k.load(out, k.const(0)), k.const(1)))
    rt = runtime.get(device)
    compiled = rt.compile(k.build())
    counter = rt.alloc(dtypes.int32, 1).copyin(np.zeros(1, np.int32))
    times = rt.time(compiled, [counter.handle], [], repeats=3, batched=4)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert counter.numpy().tolist() == [16]
