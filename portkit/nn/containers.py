"""Modules that hold other modules (Sequential, ModuleList) and the parameterless layers
(Dropout, the activations, pools and Upsample), as torch.nn has them."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from portkit.nn import functional as F
from portkit.nn.module import Module
from portkit.tensor import Tensor


class ModuleList(Module):
    """A list of modules whose parameters are found under "0.", "1.", ... as torch's."""

    def __init__(self, modules: Iterable[Module] = ()):
        self.items = list(modules)

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Every tensor of the held modules, by index then name."""
        out: dict[str, Tensor] = {}
        for i, module in enumerate(self.items):
            out.update(module.state_dict(f"{prefix}{i}."))
        return out

    def append(self, module: Module) -> ModuleList:
        """Adds a module at the end."""
        self.items.append(module)
        return self

    def named_children(self) -> list[tuple[str, Module]]:
        """(index, module) of each held module, as torch names them."""
        return [(str(i), module) for i, module in enumerate(self.items)]

    def __getitem__(self, i: int) -> Module:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Module]:
        return iter(self.items)


class Sequential(ModuleList):
    """Modules called in order, each on the output of the one before."""

    def __init__(self, *modules: Module):
        super().__init__(modules)

    def forward(self, x: Tensor) -> Tensor:
        """x through every module in turn."""
        for module in self.items:
            x = module(x)
        return x


class Dropout(Module):
    """F.dropout with this module's p, active only in training mode (model.train())."""

    def __init__(self, p: float = 0.5):
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """x with elements zeroed (and the rest scaled) when training; else x itself."""
        return F.dropout(x, self.p, training=self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def _activation(name: str, fn: Callable[..., Tensor]) -> type[Module]:
    """A module class calling fn(x, *args, **kwargs) with the arguments it was made with."""
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def forward(self, x: Tensor) -> Tensor:
        return fn(x, *self.args, **self.kwargs)

    def extra_repr(self) -> str:        # the arguments as given (torch lists every default)
        return ", ".join([repr(a) for a in self.args] +
                         [f"{k}={v!r}" for k, v in self.kwargs.items()])
    return type(name, (Module,), {"__init__": __init__, "forward": forward,
                                  "extra_repr": extra_repr,
                                  "__doc__": f"Module form of {fn.__name__} (torch.nn.{name})."})


ReLU = _activation("ReLU", Tensor.relu)
Sigmoid = _activation("Sigmoid", Tensor.sigmoid)
Tanh = _activation("Tanh", Tensor.tanh)
GELU = _activation("GELU", F.gelu)
SiLU = _activation("SiLU", F.silu)
LeakyReLU = _activation("LeakyReLU", F.leaky_relu)
ELU = _activation("ELU", F.elu)
ReLU6 = _activation("ReLU6", F.relu6)
Hardswish = _activation("Hardswish", F.hardswish)
Mish = _activation("Mish", F.mish)
Softplus = _activation("Softplus", F.softplus)
Softmax = _activation("Softmax", Tensor.softmax)
Flatten = _activation("Flatten", lambda x, start_dim=1, end_dim=-1: x.flatten(start_dim, end_dim))

MaxPool1d = _activation("MaxPool1d", F.max_pool1d)
MaxPool2d = _activation("MaxPool2d", F.max_pool2d)
MaxPool3d = _activation("MaxPool3d", F.max_pool3d)
AvgPool1d = _activation("AvgPool1d", F.avg_pool1d)
AvgPool2d = _activation("AvgPool2d", F.avg_pool2d)
AvgPool3d = _activation("AvgPool3d", F.avg_pool3d)
Upsample = _activation("Upsample", F.interpolate)
Softmin = _activation("Softmin", F.softmin)

__all__ = ["ELU", "GELU", "AvgPool1d", "AvgPool2d", "AvgPool3d", "Dropout", "Flatten", "Hardswish",
           "LeakyReLU", "MaxPool1d", "MaxPool2d", "MaxPool3d", "Mish", "ModuleList", "ReLU",
           "ReLU6", "Sequential", "SiLU", "Sigmoid", "Softmax", "Softmin", "Softplus", "Tanh",
           "Upsample"]
