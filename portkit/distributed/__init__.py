"""Data parallelism across the devices of this process: a replica of one model on each device,
each training on its share of the batch, every gradient averaged across the replicas before the
replicas' optimizers step, so that they stay equal and train as one model on the whole batch.

    parallel = DataParallel(model, ["cpu", "cpu:1"], lambda p: optim.SGD(p, lr=0.1))
    for x, y in batches:
        losses = [F.cross_entropy(replica(xs), ys) for replica, xs, ys in
                  zip(parallel.replicas, parallel.scatter(x), parallel.scatter(y))]
        loss = parallel.backward(losses)    # the mean loss, on the first device
        parallel.step()

Values move between devices as `Tensor.to` moves them (a backend's peer copy where it declares
one, else through the host), lazily: a reduction is part of the next realize's schedule. Across
processes and hosts, `process_group` averages gradients through a torch.distributed process
group. Tensor parallelism (one tensor split across devices: `distribute_tensor` and the sharded
linear layers) is in `tensor_parallel`; docs/devices.md says what there is.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from portkit import runtime
from portkit.distributed.process_group import ProcessGroupReducer as ProcessGroupReducer
from portkit.distributed.process_group import ProcessGroupUnavailable as ProcessGroupUnavailable
from portkit.distributed.tensor_parallel import ColumnParallelLinear as ColumnParallelLinear
from portkit.distributed.tensor_parallel import RowParallelLinear as RowParallelLinear
from portkit.distributed.tensor_parallel import Shard as Shard
from portkit.distributed.tensor_parallel import Sharded as Sharded
from portkit.distributed.tensor_parallel import Shardwise as Shardwise
from portkit.distributed.tensor_parallel import distribute_tensor as distribute_tensor
from portkit.nn import Module
from portkit.optim import Optimizer
from portkit.tensor import Tensor, realize

REDUCTIONS = ("sum", "mean")


def all_reduce(tensors: Sequence[Tensor], op: str = "sum") -> list[Tensor]:
    """The sum (or, with op="mean", the mean) of `tensors`, one per device and of one shape,
    as a tensor on each of their devices: summed on the first device from copies of the others,
    then copied back, so every device holds the same bits. Lazy, like any op."""
    if op not in REDUCTIONS:
        raise ValueError(f"all_reduce: op {op!r} is not one of {REDUCTIONS}")
    if not tensors:
        raise ValueError("all_reduce needs at least one tensor")
    first = tensors[0]
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise ValueError(f"all_reduce: the tensors' shapes differ, {sorted(shapes)}; reduce "
                         "tensors of one shape")
    total = first
    for other in tensors[1:]:
        total = total + other.to(first.device)
    if op == "mean":
        total = total / len(tensors)
    return [total.to(t.device) for t in tensors]


def replicate(model: Module, device: str) -> Module:
    """A copy of `model` whose every tensor (parameters, buffers) is a copy on `device`;
    parameters stay parameters. The copies are realized: the replica owns its memory."""
    device = runtime.device_name(device)
    memo: dict[int, object] = {}
    for tensor in model.state_dict().values():
        moved = tensor.detach().to(device)
        moved.requires_grad = tensor.requires_grad
        memo[id(tensor)] = moved
    replica = copy.deepcopy(model, memo)
    realize(*[t for t in memo.values() if isinstance(t, Tensor)])
    return replica


class DataParallel:
    """`model` on the first of `devices` and a replica of it on each of the others; with
    `optimizer` (a function of a parameter list, e.g. `lambda p: optim.SGD(p, lr=0.1)`), an
    optimizer for each replica. `model` itself is moved to the first device (Module.to)."""

    def __init__(self, model: Module, devices: Sequence[str],
                 optimizer: Callable[[list[Tensor]], Optimizer] | None = None):
        if not devices:
            raise ValueError("DataParallel needs at least one device")
        self.devices = [runtime.device_name(d) for d in devices]
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"DataParallel got a device twice: {list(devices)}; name each "
                             "device once")
        self.replicas = [model.to(self.devices[0])]
        self.replicas += [replicate(model, device) for device in self.devices[1:]]
        self.optimizers = ([optimizer(r.parameters()) for r in self.replicas]
                           if optimizer is not None else [])

    def scatter(self, batch: Tensor) -> list[Tensor]:
        """`batch` split along its first dimension into one equal share per device, each share
        on its device (ValueError if the batch does not split evenly)."""
        count = len(self.devices)
        if not batch.shape or batch.shape[0] % count:
            raise ValueError(f"a batch of shape {batch.shape} does not split into {count} equal "
                             f"shares along its first dimension; use a batch size that is a "
                             f"multiple of {count}")
        share = batch.shape[0] // count
        return [batch[i * share:(i + 1) * share].to(device)
                for i, device in enumerate(self.devices)]

    def backward(self, losses: Sequence[Tensor]) -> Tensor:
        """Backward of each replica's loss (one per device, in `devices`' order, each a mean
        over its equal share), then every parameter's gradient and every buffer averaged
        across the replicas (`all_reduce_gradients`, `all_reduce_buffers`), in one schedule.
        Returns the mean of the losses, on the first device: the
        loss of the whole batch."""
        if len(losses) != len(self.replicas):
            raise ValueError(f"backward got {len(losses)} losses for {len(self.replicas)} "
                             "replicas; pass one loss per device")
        for loss, device in zip(losses, self.devices):
            if loss.device != device:
                raise ValueError(f"the loss on {loss.device} is not the replica's on {device}; "
                                 "pass the losses in the order of the devices")
            loss.backward()
        realize(*self._average_gradients(), *self._average_buffers())
        return all_reduce([loss.detach() for loss in losses], "mean")[0]

    def all_reduce_gradients(self) -> None:
        """Sets every replica's gradient of each parameter to their mean across the replicas,
        computed in one schedule; a parameter with no gradient on any replica is left alone."""
        realize(*self._average_gradients())

    def all_reduce_buffers(self) -> None:
        """Sets every buffer (a tensor that is not a parameter, as BatchNorm's running
        statistics) of every replica to its mean across the replicas, so that the replicas
        stay equal in eval mode too; a buffer that is not float takes the first replica's
        value (as torch's DDP broadcasts rank 0's buffers). `backward` calls it."""
        realize(*self._average_buffers())

    def _average_buffers(self) -> list[Tensor]:
        states = [replica.state_dict() for replica in self.replicas]
        averaged: list[Tensor] = []
        for name, first in states[0].items():
            if first.requires_grad:
                continue
            group = [state[name] for state in states]
            values = (all_reduce([b.detach() for b in group], "mean") if first.dtype.is_float
                      else [first.detach().to(b.device) for b in group])
            for buffer, value in zip(group, values):
                averaged.append(buffer.assign(value))
        return averaged

    def _average_gradients(self) -> list[Tensor]:
        averaged: list[Tensor] = []
        for group in zip(*(replica.parameters() for replica in self.replicas)):
            grads = [p.grad for p in group]
            if all(g is None for g in grads):
                continue
            if any(g is None for g in grads):
                raise ValueError("a parameter has a gradient on some replicas only; compute "
                                 "every replica's loss from the whole model")
            for parameter, grad in zip(group, all_reduce([g.detach() for g in grads], "mean")):
                parameter.grad = grad
                averaged.append(grad)
        return averaged

    def step(self) -> None:
        """Steps each replica's optimizer; they apply equal gradients, so replicas stay equal."""
        if not self.optimizers:
            raise ValueError("DataParallel was made without an optimizer; pass optimizer="
                             "lambda params: optim.SGD(params, lr=...)")
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self) -> None:
        """Drops every replica's gradients."""
        for replica in self.replicas:
            replica.zero_grad()
