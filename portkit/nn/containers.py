"""Modules that hold other modules or tensors (Sequential, ModuleList, ModuleDict,
ParameterList, ParameterDict) and the parameterless layers (Identity, the dropouts, the
activations, pools, pads, shuffles, LocalResponseNorm, the upsampling layers, Flatten and
Unflatten), as torch.nn has them."""
from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, Generic, TypeVar

from portkit.nn import functional as F
from portkit.nn.module import Module
from portkit.tensor import Tensor
from portkit.tensor.spatial import PadMode

V = TypeVar("V")


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


class _Named(Module, Generic[V]):
    """Values by name, in the order they were added, as a dict."""

    def __init__(self, values: Mapping[str, V] | Iterable[tuple[str, V]] | None = None):
        self.items_: dict[str, V] = {}
        self.update(values or {})

    def update(self, values: Mapping[str, V] | Iterable[tuple[str, V]]) -> None:
        """Adds (or replaces) the values of a mapping or of (key, value) pairs."""
        for key, value in (values.items() if isinstance(values, Mapping) else values):
            self[key] = value

    def __setitem__(self, key: str, value: V) -> None:
        self.items_[key] = value

    def __getitem__(self, key: str) -> V:
        return self.items_[key]

    def __delitem__(self, key: str) -> None:
        del self.items_[key]

    def pop(self, key: str) -> V:
        """Removes the value under key and returns it."""
        return self.items_.pop(key)

    def keys(self) -> KeysView[str]:
        """The keys, in order."""
        return self.items_.keys()

    def values(self) -> ValuesView[V]:
        """The values, in order."""
        return self.items_.values()

    def items(self) -> ItemsView[str, V]:
        """(key, value) pairs, in order."""
        return self.items_.items()

    def __contains__(self, key: str) -> bool:
        return key in self.items_

    def __len__(self) -> int:
        return len(self.items_)

    def __iter__(self) -> Iterator[str]:
        return iter(self.items_)


class ModuleDict(_Named[Module]):
    """Modules by name, whose parameters are found under "name." as torch's."""

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """Every tensor of the held modules, by key then name."""
        out: dict[str, Tensor] = {}
        for key, module in self.items_.items():
            out.update(module.state_dict(f"{prefix}{key}."))
        return out

    def named_children(self) -> list[tuple[str, Module]]:
        """(key, module) of each held module, in the order they were added."""
        return list(self.items_.items())


class ParameterDict(_Named[Tensor]):
    """Tensors by name, each made a parameter (requires_grad), as torch's."""

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """The tensors, by key."""
        return {f"{prefix}{key}": t for key, t in self.items_.items()}

    def __setitem__(self, key: str, value: Tensor) -> None:
        self.items_[key] = value if value.requires_grad else value.requires_grad_()

    def extra_repr(self) -> str:
        return _parameters_repr(self.items_.items())


class ParameterList(Module):
    """A list of tensors, each made a parameter (requires_grad), named "0", "1", ... as
    torch's."""

    def __init__(self, values: Iterable[Tensor] = ()):
        self.items: list[Tensor] = []
        for value in values:
            self.append(value)

    def state_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """The tensors, by index."""
        return {f"{prefix}{i}": t for i, t in enumerate(self.items)}

    def append(self, value: Tensor) -> ParameterList:
        """Adds a tensor at the end, as a parameter."""
        self.items.append(value if value.requires_grad else value.requires_grad_())
        return self

    def __getitem__(self, i: int) -> Tensor:
        return self.items[i]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.items)

    def extra_repr(self) -> str:
        return _parameters_repr((str(i), t) for i, t in enumerate(self.items))


def _parameters_repr(named: Iterable[tuple[str, Tensor]]) -> str:
    """A line per tensor, as torch prints a parameter container."""
    return "\n".join(f"({key}): Parameter containing: [{t.dtype.name} of size "
                     f"{'x'.join(map(str, t.shape))}]" for key, t in named)


class Dropout(Module):
    """F.dropout with this module's p, active only in training mode (model.train())."""

    function = staticmethod(F.dropout)

    def __init__(self, p: float = 0.5, inplace: bool = False):
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        """x with elements zeroed (and the rest scaled) when training; else x itself."""
        return self.function(x, self.p, training=self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Dropout1d(Dropout):
    """F.dropout1d (whole channels of (N, C, L) input) when training."""

    function = staticmethod(F.dropout1d)


class Dropout2d(Dropout):
    """F.dropout2d (whole channels of (N, C, H, W) input) when training."""

    function = staticmethod(F.dropout2d)


class Dropout3d(Dropout):
    """F.dropout3d (whole channels of (N, C, D, H, W) input) when training."""

    function = staticmethod(F.dropout3d)


class Identity(Module):
    """Returns its input; the arguments it is made with are ignored, as torch's."""

    def __init__(self, *args, **kwargs):
        pass

    def forward(self, input: Tensor) -> Tensor:
        return input


def functional_module(name: str, fn: Callable[..., Any]) -> type[Module]:
    """A module class calling fn(*inputs, *args, **kwargs) with the arguments it was made
    with."""
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def forward(self, *inputs: Tensor) -> Tensor:
        return fn(*inputs, *self.args, **self.kwargs)

    def extra_repr(self) -> str:        # the arguments as given (torch lists every default)
        return ", ".join([repr(a) for a in self.args] +
                         [f"{k}={v!r}" for k, v in self.kwargs.items()])
    return type(name, (Module,), {"__init__": __init__, "forward": forward,
                                  "extra_repr": extra_repr,
                                  "__doc__": f"Module form of {fn.__name__} (torch.nn.{name})."})


ReLU = functional_module("ReLU", F.relu)
Sigmoid = functional_module("Sigmoid", F.sigmoid)
Tanh = functional_module("Tanh", F.tanh)
GELU = functional_module("GELU", F.gelu)
SiLU = functional_module("SiLU", F.silu)
LeakyReLU = functional_module("LeakyReLU", F.leaky_relu)
ELU = functional_module("ELU", F.elu)
ReLU6 = functional_module("ReLU6", F.relu6)
Hardswish = functional_module("Hardswish", F.hardswish)
Mish = functional_module("Mish", F.mish)
Softplus = functional_module("Softplus", F.softplus)
Softmax = functional_module("Softmax", F.softmax)
LogSoftmax = functional_module("LogSoftmax", F.log_softmax)
Hardsigmoid = functional_module("Hardsigmoid", F.hardsigmoid)
Hardtanh = functional_module("Hardtanh", F.hardtanh)
SELU = functional_module("SELU", F.selu)
CELU = functional_module("CELU", F.celu)
Softsign = functional_module("Softsign", F.softsign)
LogSigmoid = functional_module("LogSigmoid", F.logsigmoid)
GLU = functional_module("GLU", F.glu)
Threshold = functional_module("Threshold", F.threshold)
Hardshrink = functional_module("Hardshrink", F.hardshrink)
Softshrink = functional_module("Softshrink", F.softshrink)
Tanhshrink = functional_module("Tanhshrink", F.tanhshrink)
CosineSimilarity = functional_module("CosineSimilarity", F.cosine_similarity)
PairwiseDistance = functional_module("PairwiseDistance", F.pairwise_distance)
Unflatten = functional_module("Unflatten", lambda x, dim, unflattened_size: x.unflatten(
    dim, unflattened_size))
PixelShuffle = functional_module("PixelShuffle", F.pixel_shuffle)
PixelUnshuffle = functional_module("PixelUnshuffle", F.pixel_unshuffle)
ChannelShuffle = functional_module("ChannelShuffle", F.channel_shuffle)
Flatten = functional_module("Flatten",
                            lambda x, start_dim=1, end_dim=-1: x.flatten(start_dim, end_dim))

MaxPool1d = functional_module("MaxPool1d", F.max_pool1d)
MaxPool2d = functional_module("MaxPool2d", F.max_pool2d)
MaxPool3d = functional_module("MaxPool3d", F.max_pool3d)
AvgPool1d = functional_module("AvgPool1d", F.avg_pool1d)
AvgPool2d = functional_module("AvgPool2d", F.avg_pool2d)
AvgPool3d = functional_module("AvgPool3d", F.avg_pool3d)
Upsample = functional_module("Upsample", F.interpolate)
Softmin = functional_module("Softmin", F.softmin)
LPPool1d = functional_module("LPPool1d", F.lp_pool1d)
LPPool2d = functional_module("LPPool2d", F.lp_pool2d)
LPPool3d = functional_module("LPPool3d", F.lp_pool3d)
LocalResponseNorm = functional_module("LocalResponseNorm", F.local_response_norm)
UpsamplingNearest2d = functional_module("UpsamplingNearest2d", F.upsample_nearest)
UpsamplingBilinear2d = functional_module("UpsamplingBilinear2d", F.upsample_bilinear)
AdaptiveAvgPool1d = functional_module("AdaptiveAvgPool1d", F.adaptive_avg_pool1d)
AdaptiveAvgPool2d = functional_module("AdaptiveAvgPool2d", F.adaptive_avg_pool2d)
AdaptiveAvgPool3d = functional_module("AdaptiveAvgPool3d", F.adaptive_avg_pool3d)
AdaptiveMaxPool1d = functional_module("AdaptiveMaxPool1d", F.adaptive_max_pool1d)
AdaptiveMaxPool2d = functional_module("AdaptiveMaxPool2d", F.adaptive_max_pool2d)
AdaptiveMaxPool3d = functional_module("AdaptiveMaxPool3d", F.adaptive_max_pool3d)


def _pad(name: str, dims: int, mode: PadMode) -> type[Module]:
    """A module class padding the last `dims` dims by F.pad in `mode` (torch.nn's padding
    layers): `padding` is one size for every side, or (left, right, top, bottom, ...)."""
    def __init__(self, padding, *value: float):
        self.padding = (padding,) * (2 * dims) if isinstance(padding, int) else tuple(padding)
        if len(self.padding) != 2 * dims:
            raise ValueError(f"{name}: padding needs {2 * dims} sizes, got {self.padding}")
        self.value = value[0] if value else 0.0

    def forward(self, x: Tensor) -> Tensor:
        return F.pad(x, self.padding, mode, self.value if mode == "constant" else None)

    def extra_repr(self) -> str:
        return (f"padding={self.padding}, value={self.value}"
                if name.startswith("Constant") else f"{self.padding}")
    return type(name, (Module,), {"__init__": __init__, "forward": forward,
                                  "extra_repr": extra_repr,
                                  "__doc__": f"F.pad in mode {mode!r} (torch.nn.{name})."})


ZeroPad1d, ZeroPad2d, ZeroPad3d = (_pad(f"ZeroPad{d}d", d, "constant") for d in (1, 2, 3))
ConstantPad1d, ConstantPad2d, ConstantPad3d = (_pad(f"ConstantPad{d}d", d, "constant")
                                               for d in (1, 2, 3))
ReflectionPad1d, ReflectionPad2d, ReflectionPad3d = (_pad(f"ReflectionPad{d}d", d, "reflect")
                                                     for d in (1, 2, 3))
ReplicationPad1d, ReplicationPad2d, ReplicationPad3d = (
    _pad(f"ReplicationPad{d}d", d, "replicate") for d in (1, 2, 3))
CircularPad1d, CircularPad2d, CircularPad3d = (_pad(f"CircularPad{d}d", d, "circular")
                                               for d in (1, 2, 3))


__all__ = [
    "CELU",
    "ELU",
    "GELU",
    "GLU",
    "SELU",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "ChannelShuffle",
    "CircularPad1d",
    "CircularPad2d",
    "CircularPad3d",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "CosineSimilarity",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
    "Dropout3d",
    "Flatten",
    "Hardshrink",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "Identity",
    "LPPool1d",
    "LPPool2d",
    "LPPool3d",
    "LeakyReLU",
    "LocalResponseNorm",
    "LogSigmoid",
    "LogSoftmax",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "Mish",
    "ModuleDict",
    "ModuleList",
    "PairwiseDistance",
    "ParameterDict",
    "ParameterList",
    "PixelShuffle",
    "PixelUnshuffle",
    "ReLU",
    "ReLU6",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReflectionPad3d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ReplicationPad3d",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmax",
    "Softmin",
    "Softplus",
    "Softshrink",
    "Softsign",
    "Tanh",
    "Tanhshrink",
    "Threshold",
    "Unflatten",
    "Upsample",
    "UpsamplingBilinear2d",
    "UpsamplingNearest2d",
    "ZeroPad1d",
    "ZeroPad2d",
    "ZeroPad3d",
]
