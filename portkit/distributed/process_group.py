"""Data parallelism across processes and hosts through a torch.distributed process group: each
process (a rank) holds one replica and trains on its share of the batch; before each optimizer
step, `ProcessGroupReducer` averages the gradients across the ranks.

    torch.distributed.init_process_group("gloo")        # torchrun sets rank and world size
    reducer = ProcessGroupReducer(model)
    reducer.broadcast_parameters()                       # every rank starts from rank 0's values
    for x, y in my_shares:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        reducer.all_reduce_gradients()                   # one all-reduce per dtype per step
        optimizer.step()

Values cross through host memory: each tensor is realized and read into numpy, the tensors of
one dtype are flattened into one bucket, the bucket (as a torch CPU tensor sharing the numpy
memory) goes through the group's collective, and the result is uploaded back to each tensor's
device. The transport is the process group's backend: gloo on CPU, or a vendor's collective
library registered with `torch.distributed.Backend.register_backend` (as HCCL and oneCCL are).
torch is imported only here, when a collective runs: `import portkit.distributed` works without it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from portkit.nn import Module
from portkit.tensor import Tensor, realize

REDUCTIONS = ("sum", "mean")


class ProcessGroupUnavailable(RuntimeError):
    """torch.distributed is not installed, not available, or has no process group to use."""


def _torch_distributed(group: Any) -> tuple[Any, Any]:
    """torch and torch.distributed, checked to hold a group to run collectives on."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        raise ProcessGroupUnavailable(
            "collectives across processes run through torch.distributed, and torch is not "
            "installed; pip install torch") from error
    if not dist.is_available():
        raise ProcessGroupUnavailable("this torch build has no torch.distributed; install a "
                                      "build that has it (pip install torch)")
    if group is None and not dist.is_initialized():
        raise ProcessGroupUnavailable(
            "no process group: call torch.distributed.init_process_group('gloo') in each "
            "process first (torchrun sets RANK, WORLD_SIZE and MASTER_ADDR), or pass group=")
    return torch, dist


def _in_buckets(arrays: Sequence[np.ndarray],
               collective: Callable[[np.ndarray], None]) -> list[np.ndarray]:
    """`arrays` after `collective` ran in place on one flat bucket per dtype (so one call per
    dtype, not one per array), each result a view of its bucket."""
    results: list[np.ndarray] = list(arrays)
    for dtype in dict.fromkeys(a.dtype for a in arrays):
        members = [i for i, a in enumerate(arrays) if a.dtype == dtype]
        bucket = np.concatenate([arrays[i].reshape(-1) for i in members])
        collective(bucket)
        offsets = np.cumsum([0] + [arrays[i].size for i in members])
        for i, start, stop in zip(members, offsets[:-1], offsets[1:]):
            results[i] = bucket[start:stop].reshape(arrays[i].shape)
    return results


def _host_arrays(tensors: Sequence[Tensor]) -> list[np.ndarray]:
    """The values of `tensors`, realized in one schedule, as contiguous numpy arrays."""
    realize(*tensors)
    return [np.ascontiguousarray(t.numpy()) for t in tensors]


def all_reduce(tensors: Sequence[Tensor], op: str = "mean", group: Any = None) -> list[Tensor]:
    """The sum (or, with op="mean", the mean) of each of `tensors` across the ranks of `group`
    (default: torch.distributed's default group), as new tensors on the tensors' devices. The
    tensors of one dtype cross in one flattened bucket: one collective per dtype, not per
    tensor. Every rank must pass tensors of the same shapes and dtypes, in the same order."""
    if op not in REDUCTIONS:
        raise ValueError(f"all_reduce: op {op!r} is not one of {REDUCTIONS}")
    torch, dist = _torch_distributed(group)
    arrays = _host_arrays(tensors)
    if op == "mean" and any(not np.issubdtype(a.dtype, np.floating) for a in arrays):
        raise ValueError("all_reduce: the mean of an integer tensor is not an integer; "
                         "use op='sum' and divide")
    world = dist.get_world_size(group)

    def reduce(bucket: np.ndarray) -> None:
        dist.all_reduce(torch.from_numpy(bucket), op=dist.ReduceOp.SUM, group=group)
        if op == "mean":
            bucket /= world     # gloo has no average: sum, then divide on each rank alike

    reduced = _in_buckets(arrays, reduce)
    return [Tensor(array, device=t.device) for t, array in zip(tensors, reduced)]


class ProcessGroupReducer:
    """Keeps the replicas of `model`, one per rank of `group` (default: torch.distributed's
    default group), equal: the same starting values and the mean gradient of every rank."""

    def __init__(self, model: Module, group: Any = None):
        self.model = model
        self.group = group

    def broadcast_parameters(self, source: int = 0) -> None:
        """Sets every parameter and buffer to rank `source`'s values, in one bucket per dtype."""
        torch, dist = _torch_distributed(self.group)
        tensors = list(self.model.state_dict().values())

        def broadcast(bucket: np.ndarray) -> None:
            dist.broadcast(torch.from_numpy(bucket), src=source, group=self.group)

        for tensor, array in zip(tensors, _in_buckets(_host_arrays(tensors), broadcast)):
            tensor.assign(Tensor(array, device=tensor.device))
        realize(*tensors)

    def all_reduce_gradients(self) -> None:
        """Sets each parameter's gradient to its mean across the ranks (`all_reduce`, one
        bucket per dtype). Parameters without a gradient are left out: every rank must compute
        its loss from the same parameters."""
        # Any: Tensor declares no type for .grad, which mypy then reads as always None
        parameters: list[Any] = [p for p in self.model.parameters() if p.grad is not None]
        if not parameters:
            return
        grads = all_reduce([p.grad.detach() for p in parameters], "mean", self.group)
        for parameter, grad in zip(parameters, grads):
            parameter.grad = grad
        realize(*grads)
