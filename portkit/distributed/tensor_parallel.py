"""Tensor parallelism: one tensor split across devices, and a linear layer whose matmul runs
as one piece per device, as Megatron-LM splits a transformer's MLP.

    first, second = model[0], model[2]                   # nn.Linear(6, 16), nn.Linear(16, 3)
    sharded = nn.Sequential(
        ColumnParallelLinear(first, ["cpu", "cpu:1"], gather_output=False),
        Shardwise(nn.Tanh()),                             # on each device's 8 features
        RowParallelLinear(second, ["cpu", "cpu:1"]))      # partial sums, added on "cpu"

`distribute_tensor(tensor, devices, Shard(dim))` splits a tensor along `dim` into one equal
piece per device (a `Sharded` value, torch.distributed.tensor's names); `full_tensor()` joins
the pieces on one device. The layers are built from an `nn.Linear` and hold its weight split
across the devices: a column-parallel layer splits the output features (each device computes
its part of every output row), a row-parallel layer splits the input features (each device
computes a partial sum, and the partial sums are added on the first device). Between the two,
the activations stay split: the only crossing of the pair is the input, copied to each device,
and the partial sums. Gradients flow back through the copies (`Tensor.to` is differentiable),
so each device's weight pieces get their gradients on their own device.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from portkit import runtime
from portkit.nn import Linear, Module
from portkit.nn import functional as F
from portkit.tensor import Tensor, cat, realize


@dataclass(frozen=True)
class Shard:
    """Placement of a tensor split along `dim` into equal pieces, one per device, in the
    devices' order (torch.distributed.tensor.Shard)."""

    dim: int


@dataclass
class Sharded:
    """A tensor held as one piece per device, split along `dim`: `shards[i]` on the i-th
    device, the pieces of equal size."""

    shards: list[Tensor]
    dim: int

    @property
    def devices(self) -> list[str]:
        """The device of each piece, in order."""
        return [shard.device for shard in self.shards]

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the whole tensor."""
        shape = list(self.shards[0].shape)
        shape[self.dim] = sum(shard.shape[self.dim] for shard in self.shards)
        return tuple(shape)

    def full_tensor(self, device: str | None = None) -> Tensor:
        """The whole tensor on `device` (default: the first piece's), its pieces copied
        there and joined."""
        device = runtime.device_name(device or self.shards[0].device)
        return cat([shard.to(device) for shard in self.shards], self.dim)

    def map(self, fn: Callable[[Tensor], Tensor]) -> Sharded:
        """`fn` of each piece, on the piece's device: the pieces of `fn` of the whole tensor
        where `fn` works elementwise or along dims other than `dim`."""
        return Sharded([fn(shard) for shard in self.shards], self.dim)


def _devices(devices: Sequence[str]) -> list[str]:
    names = [runtime.device_name(d) for d in devices]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"shard across distinct devices, each named once; got {list(devices)}")
    return names


def distribute_tensor(tensor: Tensor, devices: Sequence[str], placement: Shard) -> Sharded:
    """`tensor` split along `placement.dim` into one equal piece per device, each copied to
    its device (lazily and differentiably; ValueError if the dim does not split evenly)."""
    devices = _devices(devices)
    dim = placement.dim % tensor.ndim if tensor.ndim else 0
    if not tensor.ndim or tensor.shape[dim] % len(devices):
        raise ValueError(f"a tensor of shape {tensor.shape} does not split into "
                         f"{len(devices)} equal pieces along dim {placement.dim}; shard a dim "
                         f"whose size is a multiple of {len(devices)}")
    pieces = tensor.split(tensor.shape[dim] // len(devices), dim)
    return Sharded([piece.to(device) for piece, device in zip(pieces, devices)], dim)


def _parameter_shards(parameter: Tensor, devices: list[str], dim: int) -> list[Tensor]:
    """`parameter`'s pieces along `dim`, each a parameter of its own on its device, realized:
    the leaves an optimizer updates in place."""
    shards = distribute_tensor(parameter.detach(), devices, Shard(dim)).shards
    for shard in shards:
        shard.requires_grad_()
    realize(*shards)
    return shards


class ColumnParallelLinear(Module):
    """`linear` with its output features split across `devices`: the i-th device holds rows
    of the weight and entries of the bias, and computes those features of the output from a
    copy of the input. The result is the whole output on the first device, or with
    `gather_output=False` the pieces (a `Sharded` along the last dim) for a
    `RowParallelLinear` to take."""

    def __init__(self, linear: Linear, devices: Sequence[str], gather_output: bool = True):
        self.devices = _devices(devices)
        self.gather_output = gather_output
        self.weight = _parameter_shards(linear.weight, self.devices, 0)
        self.bias = (None if linear.bias is None
                     else _parameter_shards(linear.bias, self.devices, 0))

    def forward(self, x: Tensor) -> Tensor | Sharded:
        biases: Sequence[Tensor | None] = self.bias or [None] * len(self.devices)
        pieces = [F.linear(x.to(device), weight, bias)
                  for device, weight, bias in zip(self.devices, self.weight, biases)]
        output = Sharded(pieces, x.ndim - 1)
        return output.full_tensor() if self.gather_output else output

    def extra_repr(self) -> str:
        return (f"in_features={self.weight[0].shape[1]}, "
                f"out_features={sum(w.shape[0] for w in self.weight)}, "
                f"devices={self.devices}, gather_output={self.gather_output}")


class RowParallelLinear(Module):
    """`linear` with its input features split across `devices`: the i-th device holds
    columns of the weight and multiplies its piece of the input by them; the partial sums are
    added on the first device, which holds the bias. The input is a `Sharded` along its last
    dim (a `ColumnParallelLinear`'s with gather_output=False), or a tensor, split here."""

    def __init__(self, linear: Linear, devices: Sequence[str]):
        self.devices = _devices(devices)
        self.weight = _parameter_shards(linear.weight, self.devices, 1)
        self.bias = None if linear.bias is None else _parameter_shards(
            linear.bias, self.devices[:1], 0)[0]

    def forward(self, x: Tensor | Sharded) -> Tensor:
        if isinstance(x, Tensor):
            x = distribute_tensor(x, self.devices, Shard(-1))
        if x.devices != self.devices or x.dim != len(x.shape) - 1:
            raise ValueError(f"RowParallelLinear on {self.devices} takes its input split along "
                             f"its last dim across those devices; got pieces on {x.devices} "
                             f"split along dim {x.dim}")
        partial = [F.linear(piece, weight) for piece, weight in zip(x.shards, self.weight)]
        total = partial[0]
        for other in partial[1:]:
            total = total + other.to(self.devices[0])
        return total if self.bias is None else total + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={sum(w.shape[1] for w in self.weight)}, "
                f"out_features={self.weight[0].shape[0]}, devices={self.devices}, "
                f"bias={self.bias is not None}")


class Shardwise(Module):
    """`module` (one without parameters: an activation, dropout) applied to each piece of a
    `Sharded` on the piece's device, as between a column- and a row-parallel layer."""

    def __init__(self, module: Module):
        self.module = module

    def forward(self, x: Sharded) -> Sharded:
        return x.map(self.module)
