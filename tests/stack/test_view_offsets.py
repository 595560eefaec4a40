"""A view's offset reaches its kernel as a scalar argument (schedule/keys.py `moves`): the
steps of a loop over `x[:, t]` are one kernel and one replayed plan, and read the right
elements at every offset."""
import numpy as np
import pytest

import portkit
from portkit.graph import GraphOp
from portkit.schedule import runner
from portkit.schedule.fusion import schedule as items_of
from portkit.schedule.keys import structure
from portkit.tensor import Tensor

RNG = np.random.default_rng(7)


def _distinct_kernels(step, steps: int) -> int:
    """How many kernels the scheduler's cache gained while `step(t)` ran for each t."""
    runner._kernels.clear()
    for t in range(steps):
        step(t)
    return len(runner._kernels)


@pytest.mark.parametrize("device", ["cpu", "interpreter"])
def test_a_loop_over_time_steps_compiles_one_kernel_with_right_values(device):
    x_np = RNG.standard_normal((3, 8, 5)).astype(np.float32)
    w_np = RNG.standard_normal(5).astype(np.float32)
    x, w = Tensor(x_np, device=device).realize(), Tensor(w_np, device=device).realize()

    def step(t: int) -> None:
        np.testing.assert_array_equal((x[:, t] * w).numpy(), x_np[:, t] * w_np)
    assert _distinct_kernels(step, 8) == 1


@pytest.mark.parametrize("device", ["cpu", "interpreter"])
def test_a_step_of_a_value_the_kernel_computes_is_one_kernel_with_right_values(device):
    # an LSTM's gates_in = x @ W + b, its sum fused into each step's kernel: the step's offset
    # moves along the time axis the view does not step along, and whatever of the offset lies
    # along the axes it does step along (here 1 row and 1 column) stays code
    x_np = RNG.standard_normal((3, 8, 5)).astype(np.float32)
    w_np = RNG.standard_normal(5).astype(np.float32)
    x, w = Tensor(x_np, device=device).realize(), Tensor(w_np, device=device).realize()

    def step(t: int) -> None:
        np.testing.assert_allclose(((x + 1.0)[:, t] * w).numpy(), (x_np[:, t] + 1) * w_np,
                                   rtol=1e-6)
        np.testing.assert_array_equal((x * w)[1:, t, 1:4].numpy(), (x_np * w_np)[1:, t, 1:4])
    assert _distinct_kernels(step, 8) == 2


def test_a_graph_that_differs_only_in_offsets_replays_one_plan(monkeypatch):
    x_np = RNG.standard_normal((4, 8, 6)).astype(np.float32)
    x, w = Tensor(x_np).realize(), Tensor(RNG.standard_normal(6).astype(np.float32)).realize()
    np.testing.assert_array_equal((x[:, 0] * w).numpy(), x_np[:, 0] * w.numpy())
    scheduled = []
    monkeypatch.setattr(runner, "schedule", lambda outs: scheduled.append(outs))
    for t in range(1, 8):
        np.testing.assert_array_equal((x[:, t] * w).numpy(), x_np[:, t] * w.numpy())
    assert not scheduled


def test_a_sum_of_a_slice_split_by_the_scheduler_replays_with_each_slices_values():
    # the scheduler pads the slice of a long sum (schedule/stages.py split_reduce): a view of
    # its own, whose offset is code, comes from x[t], which graph_key keys without its offset
    x_np = RNG.standard_normal((3, 100_003)).astype(np.float32)
    x = Tensor(x_np).realize()
    for t in range(3):
        np.testing.assert_allclose(x[t].sum().numpy(), x_np[t].astype(np.float64).sum(),
                                   rtol=1e-4, atol=1e-3)


def test_a_view_that_is_the_whole_kernel_takes_its_offset_when_its_rows_merge():
    # x[:, t] realized on its own: a kernel whose root is the view, and whose short trailing
    # axes merge into one row (codegen/rows.py), read through a reshape of that view
    x_np = RNG.standard_normal((2, 6, 3, 4)).astype(np.float32)
    x = Tensor(x_np).realize()

    def step(t: int) -> None:
        np.testing.assert_array_equal(x[:, t].numpy(), x_np[:, t])
    assert _distinct_kernels(step, 6) == 1


def test_a_jitted_loop_over_time_steps_replays_with_new_data():
    def f(x, w):
        total = x[:, 0] * w
        for t in range(1, 8):
            total = (total + x[:, t] * w).realize()
        return total
    calls = [[Tensor(RNG.standard_normal(shape).astype(np.float32)).realize()
              for shape in ((3, 8, 5), (5,))] for _ in range(5)]
    jitted = portkit.jit(f)
    runner._kernels.clear()
    for x, w in calls:
        expected = (x.numpy() * w.numpy()).sum(axis=1)
        np.testing.assert_allclose(jitted(x, w).numpy(), expected, rtol=1e-5, atol=1e-6)
    assert jitted.plan is not None
    assert len(runner._kernels) <= 2       # x[:, 0] * w, and one step for every t


def _key(view: Tensor, max_scalars: int | None = None) -> tuple:
    item, = [i for i in items_of([view.lazy]) if not i.is_copy]
    return structure(item.root, item.inputs, max_scalars)[0]


def test_keys_of_views_differing_only_in_offset_are_equal_and_others_not():
    x = Tensor(RNG.standard_normal((4, 8, 6)).astype(np.float32)).realize()
    w = Tensor(RNG.standard_normal(6).astype(np.float32)).realize()
    assert _key(x[:, 1] * w) == _key(x[:, 5] * w) == _key(x[:, 0] * w)
    assert _key(x[:, 1] * w) != _key(x[:, :, 1] * w[:4].reshape(4, 1))    # strides
    assert _key(x[:, 1] * w) != _key(x[1:3, 1] * w)                      # shape
    # with no scalar arguments on the device, the offset is code
    assert _key(x[:, 1] * w, max_scalars=0) != _key(x[:, 5] * w, max_scalars=0)
    # of a value the kernel computes: the part along the axes the view steps along is code
    assert _key((x + w)[:, 1]) == _key((x + w)[:, 6])
    assert _key((x + w)[1:3, 1]) == _key((x + w)[1:3, 6]) != _key((x + w)[2:4, 6])


def test_a_view_spanning_its_whole_buffer_keeps_its_one_offset_as_code():
    w = Tensor(RNG.standard_normal((6, 4)).astype(np.float32)).realize()
    item, = [i for i in items_of([(w.T * 2.0).lazy]) if not i.is_copy]
    _, scalars = structure(item.root, item.inputs)
    assert [node.op for node in scalars.nodes] == [GraphOp.CONST]
