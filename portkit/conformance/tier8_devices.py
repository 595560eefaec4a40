"""Tier 8, devices: a backend's second device works with its first (docs/devices.md).

- copies both ways between device 0 and device 1 keep every bit, of float32 and int32 values,
  and a value copied over computes there;
- `distributed.all_reduce` of values on both devices gives numpy's float32 sum and mean, the
  same on each device;
- one data-parallel step of an MLP on two replicas, each on half a batch, gives the loss and
  the weights of one replica stepping on the whole batch (relative 1e-5);
- an MLP whose two linear layers are split across both devices (a column- then a row-parallel
  layer) gives the loss and the gradients of the whole MLP on one device (relative 1e-5).

A backend with one device here (no `Backend.devices`, or it counts one) is unsupported, with
the reason; so is a device handed in directly rather than loaded from its entry point.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from portkit import backends, runtime
from portkit.abi import PortkitError
from portkit.conformance.case import Case, CaseFailed, Context, Outcome, Status, Unsupported
from portkit.conformance.target import Target
from portkit.conformance.tier1_runtime import ESSENTIAL
from portkit.conformance.tier4_tensor import stack_device

TIER = 8
NAME = "devices"
RELATIVE = 1e-5


def pair(target: Target) -> tuple[str, str]:
    """The stack's name of the target's device and another device of its backend, loaded by
    name; Unsupported if there is no other one here."""
    base, index = backends.split(target.name)
    try:
        named = target.origin is not None or runtime.get(target.name).device is target.device
        count = backends.device_count(base) if named else 1
    except PortkitError:
        count = 1
    if count < 2:
        raise Unsupported(f"backend {base!r} has one device here; tier 8 needs two (a "
                          "backend with several declares Backend.devices)")
    return stack_device(target), backends.canonical(f"{base}:{1 if index == 0 else 0}")


def _copies(target: Target) -> Outcome:
    from portkit.tensor import Tensor

    first, second = pair(target)
    rng = np.random.default_rng(8)
    floats = rng.standard_normal(1000).astype(np.float32)
    floats[:4] = [np.inf, -np.inf, -0.0, np.float32(1e-40)]
    ints = rng.integers(-2**31, 2**31 - 1, 777, dtype=np.int64).astype(np.int32)
    for values in (floats, ints):
        there = Tensor(values, device=first).to(second)
        back = there.to(first)
        for what, found in ((f"{first} -> {second}", there), (f"and back to {first}", back)):
            if not np.array_equal(found.numpy().view(np.uint8), values.view(np.uint8)):
                raise CaseFailed(f"a copy of {values.dtype} values {what} changed bits")
    doubled = (Tensor(floats[4:], device=first).to(second) * 2).numpy()
    if not np.array_equal(doubled, floats[4:] * 2):
        raise CaseFailed(f"values copied to {second} and doubled there differ from numpy's")
    return Outcome(Status.PASSED)


def _all_reduce(target: Target) -> Outcome:
    from portkit import distributed
    from portkit.tensor import Tensor

    first, second = pair(target)
    rng = np.random.default_rng(88)
    a, b = rng.standard_normal((2, 5, 7)).astype(np.float32)
    for op, expected in (("sum", a + b), ("mean", (a + b) / np.float32(2))):
        found = distributed.all_reduce([Tensor(a, device=first), Tensor(b, device=second)], op)
        for tensor, device in zip(found, (first, second)):
            if tensor.device != device:
                raise CaseFailed(f"all_reduce {op}: a result is on {tensor.device}, not {device}")
            if not np.array_equal(tensor.numpy(), expected):
                worst = np.abs(tensor.numpy() - expected).max()
                raise CaseFailed(f"all_reduce {op} on {device} differs from numpy's float32 "
                                 f"result by up to {worst:g}")
    return Outcome(Status.PASSED)


def _data_parallel_step(target: Target) -> Outcome:
    from portkit import distributed, nn, optim
    from portkit.tensor import Tensor

    first, second = pair(target)
    rng = np.random.default_rng(888)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = rng.standard_normal((8, 3)).astype(np.float32)

    def mlp() -> nn.Module:
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).to(first)

    def mse(output: Tensor, target: Tensor) -> Tensor:
        return ((output - target) ** 2).mean()

    single = mlp()
    state = {name: t.numpy() for name, t in single.state_dict().items()}
    opt = optim.SGD(single.parameters(), lr=0.1)
    loss = mse(single(Tensor(x, device=first)), Tensor(y, device=first))
    loss.backward()
    opt.step()
    twin = mlp()
    twin.load_state_dict(state)
    parallel = distributed.DataParallel(twin, [first, second], lambda p: optim.SGD(p, lr=0.1))
    losses = [mse(replica(xs), ys) for replica, xs, ys in zip(
        parallel.replicas, parallel.scatter(Tensor(x, device=first)),
        parallel.scatter(Tensor(y, device=first)))]
    both = parallel.backward(losses)
    parallel.step()
    if not np.allclose(both.item(), loss.item(), rtol=RELATIVE, atol=0):
        raise CaseFailed(f"two replicas' loss {both.item()} differs from one device's "
                         f"{loss.item()} on the whole batch")
    for replica in parallel.replicas:
        for name, weight in replica.state_dict().items():
            expected = single.state_dict()[name].numpy()
            if not np.allclose(weight.numpy(), expected, rtol=RELATIVE, atol=1e-6):
                raise CaseFailed(f"after one step, {name} on {weight.device} differs from one "
                                 "device's on the whole batch by up to "
                                 f"{np.abs(weight.numpy() - expected).max():g}")
    return Outcome(Status.PASSED)


def _tensor_parallel(target: Target) -> Outcome:
    from portkit import distributed, nn
    from portkit.tensor import Tensor

    first, second = pair(target)
    rng = np.random.default_rng(8888)
    x = Tensor(rng.standard_normal((8, 6)).astype(np.float32), device=first)
    y = Tensor(rng.standard_normal((8, 3)).astype(np.float32), device=first)
    column, row = nn.Linear(6, 16), nn.Linear(16, 3)
    model = nn.Sequential(column, nn.Tanh(), row).to(first)
    split = distributed.ColumnParallelLinear(column, [first, second], gather_output=False)
    joined = distributed.RowParallelLinear(row, [first, second])
    sharded = nn.Sequential(split, distributed.Shardwise(nn.Tanh()), joined)
    expected = ((model(x) - y) ** 2).mean()
    expected.backward()
    found = ((sharded(x) - y) ** 2).mean()
    found.backward()
    if not np.allclose(found.item(), expected.item(), rtol=RELATIVE, atol=0):
        raise CaseFailed(f"the MLP split across {first} and {second} gives the loss "
                         f"{found.item()}, the whole MLP {expected.item()}")
    # Any: Tensor declares no type for .grad, which mypy then reads as always None
    gradients: list[tuple[str, list[Any], int, Any]] = [
        ("first layer's weight", [w.grad for w in split.weight], 0, column.weight),
        ("second layer's weight", [w.grad for w in joined.weight], 1, row.weight)]
    for what, pieces, dim, whole in gradients:
        if {g.device for g in pieces} != {first, second}:
            raise CaseFailed(f"the {what} pieces' gradients are on "
                             f"{sorted(g.device for g in pieces)}, not one on each device")
        got = np.concatenate([g.numpy() for g in pieces], dim)
        want = whole.grad.numpy()
        if not np.allclose(got, want, rtol=RELATIVE, atol=1e-6):
            raise CaseFailed(f"the gradient of the {what}, split across the devices, differs "
                             f"from the whole MLP's by up to {np.abs(got - want).max():g}")
    return Outcome(Status.PASSED)


def cases(ctx: Context) -> list[Case]:
    """The devices cases (unsupported, with the reason, on a backend with one device)."""
    return [Case("devices/copies", TIER, requires=ESSENTIAL, fn=_copies),
            Case("devices/all-reduce", TIER, requires=ESSENTIAL, fn=_all_reduce),
            Case("devices/data-parallel-step", TIER, requires=ESSENTIAL,
                 fn=_data_parallel_step),
            Case("devices/tensor-parallel", TIER, requires=ESSENTIAL, fn=_tensor_parallel)]
